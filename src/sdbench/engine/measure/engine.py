"""What a cell's engine is: the ``vllm.LLM`` keyword arguments built from its spec, and starting it.

Apart from the trial loop because engine groups, server mode and ``sdbench bench parity`` build
or start the same engine without timing a cell on it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from sdbench.engine.measure.energy import REHEARSAL_NOT_METERED, Meter, NoMeter, engine_meter
from sdbench.engine.site.hardware import job_env
from sdbench.engine.release.versions import apply_env, engine_env, quirks_for, speculative_config

log = logging.getLogger(__name__)

# Keyword arguments build_llm_kwargs() may write (engine.llm_kwargs adds the config's own;
# sdbench.engine.release.conformance checks those).
LLM_KWARGS = (
    "model", "tokenizer", "dtype", "tensor_parallel_size", "max_num_seqs", "enable_prefix_caching",
    "disable_log_stats", "seed", "max_model_len", "speculative_config", "async_scheduling",
)  # fmt: skip
# The engine's per-request SD counters (vLLM >= 0.32, EngineQuirks.per_request_spec_metrics).
PER_REQUEST_KWARG = "per_request_spec_decode_metrics"


def build_llm_kwargs(
    spec: dict[str, Any], model_dir: str, drafter_dir: str | None
) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` for this cell."""
    engine, model, run = spec["engine"], spec["model"], spec["run"]
    kwargs: dict[str, Any] = {
        "model": model_dir,
        "tokenizer": model_dir,
        "dtype": model.get("dtype", "auto"),
        "tensor_parallel_size": model.get("tensor_parallel_size", 1),
        "max_num_seqs": spec["cell"]["batch_size"],
        "enable_prefix_caching": run.get("enable_prefix_caching", False),
        # LLM() forces disable_log_stats=True by default, and then get_metrics() asserts.
        "disable_log_stats": False,
        "seed": spec["seed"],
    }
    if "max_model_len" in model:
        kwargs["max_model_len"] = model["max_model_len"]
    sc = speculative_config(engine, spec["method"], drafter_dir)
    if sc is not None:
        kwargs["speculative_config"] = sc
        if quirks_for(engine["vllm_version"]).per_request_spec_metrics:
            # Per-request acceptance counters on each output (requests.parquet `sd_*` columns).
            kwargs[PER_REQUEST_KWARG] = "summary"
    kwargs.update(engine.get("llm_kwargs", {}))
    return kwargs


@dataclass
class Engine:
    """A started ``vllm.LLM`` and how it was built; one or more cells are measured on it."""

    llm: Any
    kwargs: dict[str, Any]
    startup_s: float
    shared_by: int = 1  # cells measured on this engine (engine groups)
    layout: str = ""  # engine core in this process or not (engine_layout_of)
    # What times a call: the wall clock on a real engine; a stand-in engine (a test's fake, the
    # rehearsal engine) brings its own, so the code that times and counts is the same.
    clock: Callable[[], float] = time.perf_counter
    # What a timed call's joules are read from (sdbench.engine.measure.energy): NVML, RAPL or none.
    meter: Meter = field(default_factory=NoMeter)
    # False for a stand-in whose times are modelled, not measured (the rehearsal engine): every
    # table of its cells says so (``measured`` columns).
    measured: bool = True

    def prompt(self, token_ids: Any) -> Any:
        """One prompt as the engine takes it (vLLM's ``TokensPrompt``; a stand-in's own)."""
        from vllm.inputs import TokensPrompt

        return TokensPrompt(prompt_token_ids=[int(t) for t in token_ids])


def engine_layout_of(llm: Any, env: dict[str, str | None]) -> str:
    """Where a started engine's core runs: ``inprocess`` (vLLM's in-process client) or
    ``multiprocess``; from the client vLLM built, else from the environment it was given."""
    from sdbench.engine.release.versions import layout_of_env

    client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if client is None:
        return layout_of_env(env)
    return "inprocess" if type(client).__name__ == "InprocClient" else "multiprocess"


def start_engine(
    spec: dict[str, Any],
    model_dir: str,
    drafter_dir: str | None,
    steps_dir: str | None = None,
    max_num_seqs: int | None = None,
    prompts: dict[str, Any] | None = None,
) -> Engine:
    """Start the engine of a cell spec (``max_num_seqs`` defaults to the cell's batch size).

    A spec in rehearsal mode (``engine_mode: rehearsal``) starts the rehearsal engine instead
    (:mod:`sdbench.rehearsal.llm`: no vLLM), which needs the job's prompt tables (``prompts``,
    by dataset) to know its requests.
    """
    from sdbench.rehearsal import is_rehearsal

    if is_rehearsal(spec):
        if prompts is None:
            raise ValueError("rehearsal engine: start_engine needs the job's prompt tables")
        return start_rehearsal_engine(spec, model_dir, drafter_dir, prompts, steps_dir, max_num_seqs)
    if steps_dir is not None:
        from sdbench.engine.measure.steptiming import ENV_STEP_TIMING_DIR

        os.environ[ENV_STEP_TIMING_DIR] = steps_dir
    apply_env(job_env(spec["engine"], int(spec["model"].get("tensor_parallel_size", 1))))
    env = engine_env(spec["engine"], spec["method"])
    apply_env(env)

    from vllm import LLM  # imported late: env vars must be set first

    quirks_for(spec["engine"]["vllm_version"])  # fail early on an unknown engine
    kwargs = build_llm_kwargs(spec, model_dir, drafter_dir)
    if max_num_seqs is not None:
        kwargs["max_num_seqs"] = max_num_seqs
    if steps_dir is not None:
        kwargs["async_scheduling"] = False  # breakdown needs steps that do not overlap
    log.info("LLM kwargs: %s", json.dumps(kwargs, sort_keys=True))
    t_start = time.perf_counter()
    llm = LLM(**kwargs)
    startup = time.perf_counter() - t_start
    return Engine(llm, kwargs, startup, layout=engine_layout_of(llm, env), meter=engine_meter(spec))


class RehearsalEngine(Engine):
    """A started rehearsal engine (:mod:`sdbench.rehearsal.llm`): prompts are token ids, no ``vllm.inputs``."""

    def prompt(self, token_ids: Any) -> Any:
        return {"prompt_token_ids": token_ids}


def start_rehearsal_engine(
    spec: dict[str, Any],
    model_dir: str,
    drafter_dir: str | None,
    prompts: dict[str, Any],
    steps_dir: str | None = None,
    max_num_seqs: int | None = None,
    trace_dir: str | None = None,
) -> Engine:
    """The rehearsal engine of a cell spec: ``llm`` a :class:`sdbench.rehearsal.llm.RehearsalLLM`
    on the job's prompt tables (``prompts``, by dataset), its virtual clock the engine's clock,
    ``measured`` False. ``steps_dir`` / ``trace_dir``: breakdown / trace mode (the plugins' records)."""
    from sdbench import rehearsal
    from sdbench.engine.release.versions import engine_layout

    llm_module = rehearsal.module("llm")

    quirks_for(spec["engine"]["vllm_version"])  # fail early on an unknown engine, as a real start does
    kwargs = build_llm_kwargs(spec, model_dir, drafter_dir)
    if max_num_seqs is not None:
        kwargs["max_num_seqs"] = max_num_seqs
    workload = llm_module.workload_for(spec, model_dir, prompts)
    llm = llm_module.RehearsalLLM(spec, model_dir, drafter_dir, workload, kwargs["max_num_seqs"], steps_dir=steps_dir,
                                  trace_dir=trace_dir)  # fmt: skip
    return RehearsalEngine(llm, kwargs, llm.memory["startup_s"], layout=engine_layout(spec["engine"]),
                           clock=llm.clock, measured=False, meter=NoMeter(REHEARSAL_NOT_METERED))  # fmt: skip


# ----------------------------------------------------------------------------- touchpoints
from sdbench.engine.release import touchpoints as tp  # noqa: E402 - standard library only


def _check_llm_kwargs(src: tp.SourceTree) -> str | None:
    """``LLM(**kwargs)`` hands every keyword to ``EngineArgs``: each must be one of its fields."""
    accepted = src.class_fields("vllm.engine.arg_utils:EngineArgs") | set(src.params("vllm:LLM.__init__") or ())
    wanted = list(LLM_KWARGS)
    if quirks_for(src.version).per_request_spec_metrics:
        wanted.append(PER_REQUEST_KWARG)
    missing = [k for k in wanted if k not in accepted]
    return f"EngineArgs has no field {', '.join(missing)}" if missing else None


TOUCHPOINTS = tp.declare(
    __name__,
    tp.custom("llm.kwargs", _check_llm_kwargs, ["vllm:LLM", "vllm.engine.arg_utils:EngineArgs"]),
    # engine_layout_of: the in-process client's class name.
    tp.defined("llm.inprocess_client", "vllm.v1.engine.core_client:InprocClient"),
    tp.self_attributes("llm.engine_core_client", "vllm.v1.engine.llm_engine:LLMEngine", ["engine_core"]),
    tp.self_attributes("llm.llm_engine", "vllm:LLM", ["llm_engine"]),
)
