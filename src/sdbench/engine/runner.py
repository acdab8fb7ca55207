"""Run one benchmark cell on a real vLLM engine and record tidy tables.

One process = one cell: start ``vllm.LLM`` with the cell's speculative config,
``max_num_seqs`` = batch size, greedy decoding (or the dataset's temperature with fixed
per-sequence seeds, :mod:`sdbench.engine.sampling`) and prefix caching off; warm up;
then time each ``generate`` call, in repeated trials, and diff the engine's SD
counters around it, while the quiet-machine guard watches the node.

Tables written (schema in docs/schema.md): ``requests.parquet`` (one row per
sequence), ``calls.parquet`` (one row per timed generate call) and
``summary.parquet`` (one row for the cell). An engine group's cells share one engine
(:mod:`sdbench.engine.groups`); the commands are in :mod:`sdbench.engine.commands`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from sdbench.engine.hardware import job_env, provenance
from sdbench.engine.versions import apply_env, engine_env, engine_memory, quirks_for, speculative_config

log = logging.getLogger(__name__)

SD_COUNTERS = {
    "num_drafts": "vllm:spec_decode_num_drafts",
    "num_draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}
SD_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
# Requests the scheduler preempted (KV cache full: their blocks freed, recomputed later). A
# timed call with preemptions ran a smaller batch than the cell names for part of its steps.
PREEMPTIONS = "vllm:num_preemptions"
# Keyword arguments build_llm_kwargs() may write (engine.llm_kwargs adds the config's own;
# sdbench.engine.conformance checks those).
LLM_KWARGS = (
    "model", "tokenizer", "dtype", "tensor_parallel_size", "max_num_seqs", "enable_prefix_caching",
    "disable_log_stats", "seed", "max_model_len", "speculative_config", "async_scheduling",
)  # fmt: skip
# The engine's per-request SD counters (vLLM >= 0.32, EngineQuirks.per_request_spec_metrics).
PER_REQUEST_KWARG = "per_request_spec_decode_metrics"
# Summary columns of a cell timed in pairs with a no-SD engine (sdbench.engine.paired).
PAIRED_COLUMNS = (
    "paired_baseline_tokens_per_s",
    "paired_speedup",
    "paired_speedup_ci_low",
    "paired_speedup_ci_high",
)


@dataclass
class SDCounters:
    """Cumulative SD counters of the engine at one instant (summed over label sets)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: tuple[int, ...] = ()
    num_preemptions: int = 0

    def __sub__(self, other: SDCounters) -> SDCounters:
        width = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        a = np.zeros(width, dtype=np.int64)
        b = np.zeros(width, dtype=np.int64)
        a[: len(self.accepted_per_pos)] = self.accepted_per_pos
        b[: len(other.accepted_per_pos)] = other.accepted_per_pos
        return SDCounters(
            self.num_drafts - other.num_drafts,
            self.num_draft_tokens - other.num_draft_tokens,
            self.num_accepted_tokens - other.num_accepted_tokens,
            tuple(int(x) for x in a - b),
            self.num_preemptions - other.num_preemptions,
        )


def read_counters(metrics: list[Any]) -> SDCounters:
    """Extract SD counters and preemptions from ``LLM.get_metrics()`` (Counter / Vector objects)."""
    totals = {field: 0 for field in SD_COUNTERS}
    preemptions = 0
    per_pos = np.zeros(0, dtype=np.int64)
    for metric in metrics:
        for field, name in SD_COUNTERS.items():
            if metric.name == name:
                totals[field] += int(metric.value)
        if metric.name == PREEMPTIONS:
            preemptions += int(metric.value)
        if metric.name == SD_PER_POS:
            values = np.asarray(metric.values, dtype=np.int64)
            if len(values) > len(per_pos):
                per_pos = np.pad(per_pos, (0, len(values) - len(per_pos)))
            per_pos[: len(values)] += values
    return SDCounters(**totals, accepted_per_pos=tuple(int(x) for x in per_pos), num_preemptions=preemptions)


def acceptance_stats(delta: SDCounters) -> dict[str, Any]:
    """Mean acceptance length (1 + accepted/drafts), rate, and rate per draft position."""
    if delta.num_drafts == 0:
        return {"mean_acceptance_length": np.nan, "acceptance_rate": np.nan, "acceptance_rate_per_pos": []}
    return {
        "mean_acceptance_length": 1.0 + delta.num_accepted_tokens / delta.num_drafts,
        "acceptance_rate": delta.num_accepted_tokens / max(delta.num_draft_tokens, 1),
        "acceptance_rate_per_pos": [x / delta.num_drafts for x in delta.accepted_per_pos],
    }


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


def request_sd_metrics(completion: Any) -> dict[str, Any]:
    """The engine's per-request SD counters of one completed output (``sd_*`` columns).

    Values are missing (None) where the engine offers none: no SD, or a vLLM before 0.32.
    ``sd_mean_acceptance_length`` counts the bonus token, as the aggregate counters do.
    """
    metrics = getattr(completion, "spec_decode_metrics", None)
    d = metrics.to_dict() if metrics is not None else {}
    return {
        "sd_num_steps": d.get("num_spec_steps"),
        "sd_num_draft_tokens": d.get("num_draft_tokens"),
        "sd_num_accepted_tokens": d.get("num_accepted_draft_tokens"),
        "sd_mean_acceptance_length": d.get("mean_acceptance_length") if d.get("num_spec_steps") else None,
    }


def _select_prompts(prompts: pd.DataFrame, spec: dict[str, Any]) -> pd.DataFrame:
    n = spec["run"].get("num_requests") or len(prompts)
    if n > len(prompts):
        raise ValueError(f"run.num_requests={n} but the prompt set has only {len(prompts)} prompts")
    return prompts.iloc[:n].reset_index(drop=True)


def _calls(prompts: pd.DataFrame, batch_mode: str, batch_size: int) -> list[list[int]]:
    """Row indices of ``prompts`` per timed generate call (replicated or distinct)."""
    if batch_mode == "replicate":
        return [[i] * batch_size for i in range(len(prompts))]
    return [list(range(len(prompts)))]


def _trial_plan(run: dict[str, Any]) -> tuple[int, float, int, float | None]:
    """(minimum trials, minimum timed seconds, maximum trials, target relative half-width) of a cell."""
    repeats = int(run.get("repeats", 1))
    target = run.get("target_half_width")
    return (
        repeats,
        float(run.get("min_measured_s", 0.0)),
        max(repeats, int(run.get("max_repeats", 50))),
        None if target is None else float(target),
    )


def _precise_enough(arms: list[CellRun], target: float | None, seed: int) -> bool:
    """Whether the cell's interval is narrow enough: the paired speedup's with two arms
    (baseline first), the throughput's with one (sdbench.analysis.stats.relative_half_width)."""
    if target is None:
        return True
    from sdbench.analysis import stats

    calls = [pd.DataFrame(arm.call_rows)[["call_index", "trial", "tokens_per_s"]] for arm in arms]
    return stats.relative_half_width(calls, seed) <= target


def cell_seed(spec: dict[str, Any]) -> int:
    """Seed of a cell's bootstrap: the config seed and the cell's keys (stable across runs)."""
    import hashlib

    key = json.dumps([spec["seed"], spec["cell"]], sort_keys=True).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "little")


@dataclass
class Engine:
    """A started ``vllm.LLM`` and how it was built; one or more cells are measured on it."""

    llm: Any
    kwargs: dict[str, Any]
    startup_s: float
    shared_by: int = 1  # cells measured on this engine (engine groups)
    layout: str = ""  # engine core in this process or not (engine_layout_of)


def engine_layout_of(llm: Any, env: dict[str, str | None]) -> str:
    """Where a started engine's core runs: ``inprocess`` (vLLM's in-process client) or
    ``multiprocess``; from the client vLLM built, else from the environment it was given."""
    from sdbench.engine.versions import layout_of_env

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
) -> Engine:
    """Start the engine of a cell spec (``max_num_seqs`` defaults to the cell's batch size)."""
    if steps_dir is not None:
        from sdbench.engine.steptiming import ENV_STEP_TIMING_DIR

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
    return Engine(llm, kwargs, time.perf_counter() - t_start, layout=engine_layout_of(llm, env))


def run_cell(
    spec: dict[str, Any],
    prompts: pd.DataFrame,
    model_dir: str,
    drafter_dir: str | None,
    steps_dir: str | None = None,
    guard_mode: str = "flag",
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    """Run one cell on its own engine; returns (requests, calls, summary, steps) tables.

    See :func:`measure_cell`. With ``steps_dir`` the run is in breakdown mode
    (sdbench.engine.steptiming): every engine step of the timed calls is timed by stage,
    with device synchronisation; ``steps`` is then one row per step, else ``None``.
    """
    engine = start_engine(spec, model_dir, drafter_dir, steps_dir)
    return measure_cell(engine, spec, prompts, steps_dir, guard_mode)


def measure_cell(
    engine: Engine,
    spec: dict[str, Any],
    prompts: pd.DataFrame,
    steps_dir: str | None = None,
    guard_mode: str = "flag",
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    """Measure one cell on a started engine; returns (requests, calls, summary, steps).

    The timed workload (every prompt once, one ``generate`` call each, replicated
    batch-size times in replicate mode) runs in repeated trials (``run.repeats``,
    ``run.min_measured_s``), watched by the quiet-machine guard (``guard_mode``,
    sdbench.engine.quietguard): ``calls`` has one row per call and trial, ``requests`` the
    first trial's sequences (outputs, greedy or sampled with fixed seeds, are checked to be
    identical in every trial). Warm-up (``run.warmup_requests`` calls at the cell's batch size) stays
    outside the timed part. A forced-acceptance cell is forced from its warm-up to its last call
    (sdbench.engine.forcing).
    """
    from sdbench.engine.forcing import forced_acceptance, forced_length_of

    with forced_acceptance(engine.llm, forced_length_of(spec)):
        run = CellRun(engine, spec, prompts, steps_dir)
        run.warm_up()
        return run.tables(timed_part([run], spec["run"], guard_mode))


def timed_part(arms: list[CellRun], run: dict[str, Any], guard_mode: str) -> Any:
    """Time the arms' calls in trials under one quiet-machine guard; returns the guard's report.

    Several arms (an SD cell and its paired no-SD arm, sdbench.engine.paired) time each call
    one after the other, the order alternating call by call so that no arm always goes
    second. Trials follow ``run.repeats`` / ``run.min_measured_s`` (the slowest arm decides),
    then continue while the interval is wider than ``run.target_half_width`` (relative; of
    ``arms[1] / arms[0]`` with two arms), all within ``run.max_repeats``.
    """
    from sdbench.engine.quietguard import QuietGuard

    check_layouts(arms)
    min_trials, min_seconds, max_trials, target = _trial_plan(run)
    seed = cell_seed(arms[-1].spec)
    guard = QuietGuard(guard_mode)
    guard.start()
    log.info(
        "timed part: %d to %d trial(s), at least %.1f s, half-width target %s, %d arm(s)",
        min_trials,
        max_trials,
        min_seconds,
        target,
        len(arms),
    )
    for trial in range(max_trials):
        for call_index in range(arms[0].num_calls):
            order = arms if (trial + call_index) % 2 == 0 else arms[::-1]
            for arm in order:
                arm.time_call(trial, call_index)
        if (
            trial + 1 >= min_trials
            and min(arm.timed_s for arm in arms) >= min_seconds
            and _precise_enough(arms, target, seed)
        ):
            break
    log.info("timed part: %d trial(s)", trial + 1)
    return guard.stop()  # raises Contaminated in refuse mode


def check_layouts(arms: list[CellRun]) -> None:
    """Refuse to time arms of one speedup whose engines run in different process layouts."""
    layouts = {arm.engine.layout for arm in arms}
    if len(layouts) > 1:
        cell = arms[-1].spec["cell"]
        name = "/".join(str(cell[k]) for k in ("engine", "model", "dataset", "method")) + f"/bs{cell['batch_size']}"
        described = ", ".join(f"{arm.spec['cell']['method']}: {arm.engine.layout}" for arm in arms)
        raise RuntimeError(f"cell {name}: the arms of its speedup run in different process layouts ({described})")


class CellRun:
    """One cell's timed workload on a started engine, one ``generate`` call at a time.

    Calls are timed one by one so that two engines (an SD engine and its paired no-SD
    baseline, :mod:`sdbench.engine.paired`) can interleave theirs.
    """

    def __init__(self, engine: Engine, spec: dict[str, Any], prompts: pd.DataFrame, steps_dir: str | None = None):
        from sdbench.engine.sampling import call_sampling_params, temperature

        self.engine, self.spec, self.steps_dir = engine, spec, steps_dir
        self.prompts = _select_prompts(prompts, spec)
        run = spec["run"]
        self.batch_size = int(spec["cell"]["batch_size"])
        # Greedy with one budget: one SamplingParams for every call. Sampled, or per-request
        # budgets (the prompt table's max_tokens): built per call.
        self.budgets = [int(b) for b in self.prompts["max_tokens"]] if "max_tokens" in self.prompts else None
        self.greedy = temperature(spec) == 0
        uniform = self.budgets is None or len(set(self.budgets)) == 1
        self.sampling = call_sampling_params(spec, [], self.budgets[:1] if self.budgets else None) \
            if self.greedy and uniform else None
        self.plan = _calls(self.prompts, run.get("batch_mode", "replicate"), self.batch_size)
        self.num_calls = len(self.plan)
        self.request_rows: list[dict[str, Any]] = []
        self.call_rows: list[dict[str, Any]] = []
        self.first_outputs: dict[tuple[int, int], list[int]] = {}
        self.outputs_stable = True
        self.timed_s = 0.0
        self.warmup_s = 0.0
        self.warmup_steps = 0

    def _sampling_for(self, rows: list[int]) -> Any:
        """Sampling parameters of a call over prompt rows ``rows`` (sdbench.engine.sampling)."""
        if self.sampling is not None:
            return self.sampling
        from sdbench.engine.sampling import call_sampling_params

        budgets = [self.budgets[i] for i in rows] if self.budgets else None
        return call_sampling_params(self.spec, [str(self.prompts.at[i, "request_id"]) for i in rows], budgets)

    def _prompt(self, i: int) -> Any:
        from vllm.inputs import TokensPrompt

        return TokensPrompt(prompt_token_ids=[int(t) for t in self.prompts.at[i, "prompt_token_ids"]])

    def warm_up(self) -> None:
        """``run.warmup_requests`` untimed calls at the cell's batch size."""
        warmup = min(int(self.spec["run"].get("warmup_requests", 1)), len(self.prompts))
        t_warm = time.perf_counter()
        for i in range(warmup):
            rows = [i] * self.batch_size
            self.engine.llm.generate([self._prompt(r) for r in rows], self._sampling_for(rows), use_tqdm=False)
        self.warmup_s = time.perf_counter() - t_warm
        self.warmup_steps = _steps_so_far(self.steps_dir)

    def time_call(self, trial: int, call_index: int) -> float:
        """Time one generate call of the plan; record its row (and, in trial 0, its sequences)."""
        llm, prompts = self.engine.llm, self.prompts
        rows = self.plan[call_index]
        sampling = self._sampling_for(rows)
        before = read_counters(llm.get_metrics())
        t0 = time.perf_counter()
        outputs = llm.generate([self._prompt(i) for i in rows], sampling, use_tqdm=False)
        duration = time.perf_counter() - t0
        delta = read_counters(llm.get_metrics()) - before
        self.timed_s += duration
        n_out = 0
        for slot, (row, out) in enumerate(zip(rows, outputs, strict=True)):
            completion = out.outputs[0]
            tokens = [int(t) for t in completion.token_ids]
            n_out += len(tokens)
            if (call_index, slot) in self.first_outputs:
                self.outputs_stable &= self.first_outputs[(call_index, slot)] == tokens
                continue
            self.first_outputs[(call_index, slot)] = tokens
            self.request_rows.append(
                {
                    "call_index": call_index,
                    "slot": slot,
                    "request_id": str(prompts.at[row, "request_id"]),
                    "prompt_token_ids": [int(t) for t in prompts.at[row, "prompt_token_ids"]],
                    "output_token_ids": tokens,
                    "output_text": completion.text or "",
                    "num_prompt_tokens": len(prompts.at[row, "prompt_token_ids"]),
                    "num_output_tokens": len(tokens),
                    "finish_reason": str(completion.finish_reason),
                    **request_sd_metrics(completion),
                }
            )
        self.call_rows.append(
            {
                "trial": trial,
                "call_index": call_index,
                "request_id": str(prompts.at[rows[0], "request_id"]) if len(set(rows)) == 1 else "*",
                "num_seqs": len(rows),
                "duration_s": duration,
                "num_output_tokens": n_out,
                "tokens_per_s": n_out / duration,
                "num_drafts": delta.num_drafts,
                "num_draft_tokens": delta.num_draft_tokens,
                "num_accepted_tokens": delta.num_accepted_tokens,
                "accepted_per_pos": list(delta.accepted_per_pos),
                "num_preemptions": delta.num_preemptions,
            }
        )
        return duration

    def tables(
        self, guard_report: Any
    ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
        """(requests, calls, summary, steps) of the calls timed so far."""
        spec, engine = self.spec, self.engine
        keys = {k: spec["cell"][k] for k in ("engine", "model", "dataset", "method", "batch_size")}
        steps = None
        if self.steps_dir is not None:
            from sdbench.engine.steptiming import read_step_dir

            steps = read_step_dir(self.steps_dir).iloc[self.warmup_steps :].reset_index(drop=True)
            for i, (k, v) in enumerate(keys.items()):
                steps.insert(i, k, v)
            steps.insert(len(keys), "sd_method", spec["method"]["method"])
        requests = pd.DataFrame(self.request_rows).sort_values(["call_index", "slot"], kind="stable")
        requests = requests.reset_index(drop=True)
        calls = pd.DataFrame(self.call_rows)
        for frame in (requests, calls):
            for i, (k, v) in enumerate(keys.items()):
                frame.insert(i, k, v)
        calls = calls.assign(contaminated=guard_report.contaminated)
        summary = summarise(keys, spec, calls, requests)
        summary = summary.assign(
            engine_shared_by=engine.shared_by,
            engine_layout=engine.layout,
            outputs_stable=self.outputs_stable,
            **guard_report.columns(),
            drafter=spec.get("drafter") or "",
            startup_s=engine.startup_s,
            warmup_s=self.warmup_s,
            **engine_memory(engine.llm),
            speculative_config=json.dumps(engine.kwargs.get("speculative_config"), sort_keys=True),
            **provenance(),
            **{c: np.nan for c in PAIRED_COLUMNS},  # set by sdbench.engine.paired when paired
            paired_baseline_num_preemptions=0,
            # The paired no-SD arm's engine start and warm-up (sdbench.bench.timeline's breakdown).
            paired_baseline_startup_s=np.nan,
            paired_baseline_warmup_s=np.nan,
        )
        return requests, calls, summary, steps


def _steps_so_far(steps_dir: str | None) -> int:
    if steps_dir is None:
        return 0
    from sdbench.engine.steptiming import read_step_dir

    return len(read_step_dir(steps_dir))


def summarise(
    keys: dict[str, Any], spec: dict[str, Any], calls: pd.DataFrame, requests: pd.DataFrame
) -> pd.DataFrame:
    """One summary row: throughput (paper style and pooled), acceptance, lengths."""
    total = SDCounters(
        int(calls["num_drafts"].sum()),
        int(calls["num_draft_tokens"].sum()),
        int(calls["num_accepted_tokens"].sum()),
        tuple(int(x) for x in _sum_lists(calls["accepted_per_pos"])),
    )
    acc = acceptance_stats(total)
    from sdbench.analysis import stats

    draws = stats.bootstrap(calls, cell_seed(spec))
    low, high = stats.interval(draws)
    row = {
        **keys,
        "sd_method": spec["method"]["method"],
        "num_speculative_tokens": spec["method"].get("num_speculative_tokens", 0),
        # Set on forced-acceptance cells (sdbench.sweeps): their outputs are not the greedy ones.
        "forced_acceptance_length": float(spec["method"].get("forced_acceptance_length", math.nan)),
        "batch_mode": spec["run"].get("batch_mode", "replicate"),
        "temperature": float(spec.get("dataset", {}).get("temperature", 0.0)),
        "num_engine_starts": int(calls["engine_start"].nunique()) if "engine_start" in calls else 1,
        "num_trials": len(calls[[c for c in ("engine_start", "trial") if c in calls]].drop_duplicates())
        if "trial" in calls
        else 1,
        "num_calls": len(calls),
        "num_sequences": len(requests),
        # Paper's metric (mean over calls of output tokens / wall time of the call),
        # with each prompt's median over trials; 95% bootstrap interval (sdbench.analysis.stats).
        "tokens_per_s": stats.point_estimate(calls),
        "tokens_per_s_ci_low": low,
        "tokens_per_s_ci_high": high,
        "tokens_per_s_boot": [float(x) for x in draws],
        "tokens_per_s_mean_calls": float(calls["tokens_per_s"].mean()),
        "tokens_per_s_pooled": float(calls["num_output_tokens"].sum() / calls["duration_s"].sum()),
        "generate_s": float(calls["duration_s"].sum()),
        "output_len_mean": float(requests["num_output_tokens"].mean()),
        "output_len_std": float(requests["num_output_tokens"].std(ddof=0)),
        "share_finished_stop": float((requests["finish_reason"] == "stop").mean()),
        "num_drafts": total.num_drafts,
        "num_draft_tokens": total.num_draft_tokens,
        "num_accepted_tokens": total.num_accepted_tokens,
        # Timed calls during which the scheduler preempted requests (the KV cache was full).
        "num_preemptions": int(calls["num_preemptions"].sum()) if "num_preemptions" in calls else 0,
        **acc,
    }
    return pd.DataFrame([row])


def _sum_lists(series: pd.Series) -> np.ndarray:
    width = max((len(x) for x in series), default=0)
    total = np.zeros(width, dtype=np.int64)
    for values in series:
        total[: len(values)] += np.asarray(values, dtype=np.int64)
    return total


def _match_trace_ids(output_ids: list[str], traced: dict[str, Any]) -> dict[str, str]:
    """Output request id -> engine-internal id (vLLM >= 0.32 appends ``-<random>`` internally)."""
    mapping: dict[str, str] = {}
    for out_id in output_ids:
        hits = [k for k in traced if k == out_id or k.startswith(f"{out_id}-")]
        if len(hits) != 1:
            raise RuntimeError(f"trace mode: request {out_id!r} matched {len(hits)} traced ids")
        mapping[out_id] = hits[0]
    return mapping


def trace_group(
    specs: list[dict[str, Any]],
    prompts: dict[str, pd.DataFrame],
    model_dir: str,
    drafter_dir: str | None,
    num_speculative_tokens: int,
    max_num_seqs: int,
    trace_dir: str,
) -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
    """In-engine acceptance traces of one method on several prompt sets, on one engine
    (see sdbench.engine.acceptancetrace).

    ``specs`` are the method's resolved cells, one per dataset, and ``prompts`` their prompt
    tables by dataset. The engine proposes up to ``num_speculative_tokens`` per step but
    commits one token per step, so outputs equal plain greedy decoding. Returns, per
    dataset, (trace table, requests). The cells must need the same engine (``ValueError``
    naming the first dataset that does not): only the prompts and output lengths differ.
    """
    from sdbench.engine.acceptancetrace import ENV_TRACE_DIR, read_trace_dir
    from sdbench.traces.table import MethodTrace, make_trace_table

    specs = [json.loads(json.dumps(s)) for s in specs]  # private copies
    for spec in specs:
        spec["method"]["num_speculative_tokens"] = num_speculative_tokens
        spec["cell"]["batch_size"] = max_num_seqs
    first = specs[0]
    engine_kwargs = build_llm_kwargs(first, model_dir, drafter_dir)
    for spec in specs[1:]:
        if build_llm_kwargs(spec, model_dir, drafter_dir) != engine_kwargs:
            raise ValueError(
                f"trace group of {first['cell']['method']}: dataset {spec['cell']['dataset']!r} needs "
                f"other engine arguments than {first['cell']['dataset']!r}"
            )
    os.environ[ENV_TRACE_DIR] = trace_dir
    apply_env(job_env(first["engine"], int(first["model"].get("tensor_parallel_size", 1))))
    apply_env(engine_env(first["engine"], first["method"]))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    # Synchronous steps: with async scheduling the runner hands back the committed rows a step
    # later (empty in _bookkeeping_sync), and the trace would have no rows to record.
    llm = LLM(**{**engine_kwargs, "seed": first["seed"], "async_scheduling": False})
    method = first["method"]["method"]
    out: dict[str, tuple[pd.DataFrame, pd.DataFrame]] = {}
    for spec in specs:
        dataset = spec["cell"]["dataset"]
        selected = _select_prompts(prompts[dataset], spec)
        default = int(spec["dataset"]["max_tokens"])
        budgets = selected["max_tokens"] if "max_tokens" in selected else [default] * len(selected)
        sampling = [SamplingParams(temperature=0.0, max_tokens=int(b), seed=spec["seed"]) for b in budgets]
        outputs = llm.generate(
            [TokensPrompt(prompt_token_ids=[int(t) for t in ids]) for ids in selected["prompt_token_ids"]],
            sampling,
            use_tqdm=False,
        )
        # Request ids are unique per engine: earlier datasets' records never match these.
        traced = read_trace_dir(trace_dir)
        ids = _match_trace_ids([o.request_id for o in outputs], traced)
        traces: list[MethodTrace] = []
        request_rows: list[dict[str, Any]] = []
        for row, completion in zip(selected.itertuples(), outputs, strict=True):
            steps = np.asarray(traced[ids[completion.request_id]], dtype=np.int32).reshape(-1, 2)
            tokens = [int(t) for t in completion.outputs[0].token_ids]
            if len(steps) != len(tokens):
                raise RuntimeError(f"trace mode: {len(steps)} steps for {len(tokens)} tokens of {row.request_id}")
            traces.append(MethodTrace(str(row.request_id), method, steps[:, 0], steps[:, 1]))
            request_rows.append(
                {
                    "request_id": str(row.request_id),
                    "prompt_token_ids": [int(t) for t in row.prompt_token_ids],
                    "output_token_ids": tokens,
                    "finish_reason": str(completion.outputs[0].finish_reason),
                }
            )
        out[dataset] = (make_trace_table(traces), pd.DataFrame(request_rows))
    return out


DRAFTER_ROLES = {"eagle": "eagle", "eagle3": "eagle3", "draft_model": "draft", "mtp": "mtp"}


def preflight(spec: dict[str, Any], prompts_path: str, model_dir: str, drafter_dir: str | None) -> pd.DataFrame:
    """Check the prompt table and model directories before an engine starts; returns the prompts.

    vLLM leaves a tensor a checkpoint lacks uninitialized without an error, so the
    weights are checked here (sdbench.models.check), not discovered as garbage output.
    """
    from sdbench.datasets.prompts import read_prompt_table
    from sdbench.models.check import check_model_dir

    prompts = read_prompt_table(prompts_path)
    check_model_dir(model_dir, "target")
    role = DRAFTER_ROLES.get(spec["method"]["method"])
    if drafter_dir and role:
        check_model_dir(drafter_dir, role)
    if drafter_dir and spec["method"]["method"] == "medusa":
        from sdbench.models.medusa import check_medusa_dir

        check_medusa_dir(drafter_dir, int(spec["method"]["num_speculative_tokens"]))
    return prompts


# ----------------------------------------------------------------------------- touchpoints
from sdbench.engine import touchpoints as tp  # noqa: E402 - standard library only


def _check_llm_kwargs(src: tp.SourceTree) -> str | None:
    """``LLM(**kwargs)`` hands every keyword to ``EngineArgs``: each must be one of its fields."""
    accepted = src.class_fields("vllm.engine.arg_utils:EngineArgs") | set(src.params("vllm:LLM.__init__") or ())
    wanted = list(LLM_KWARGS)
    if quirks_for(src.version).per_request_spec_metrics:
        wanted.append(PER_REQUEST_KWARG)
    missing = [k for k in wanted if k not in accepted]
    return f"EngineArgs has no field {', '.join(missing)}" if missing else None


def _row_truncations(src: tp.SourceTree, target: str) -> list[int]:
    """Lines of ``target`` that cut the rows parse_output returned (``rows[i] = row[:1]``, ...)."""
    import ast

    fn = src.find(target)
    if fn is None:
        return []
    rows: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                tp.call_name(node.value).endswith("parse_output"):
            for t in node.targets:
                elts = t.elts if isinstance(t, ast.Tuple) else [t]
                if elts and isinstance(elts[0], ast.Name):
                    rows.add(elts[0].id)
    lines = []
    for node in ast.walk(fn):
        if not isinstance(node, ast.Assign):
            continue
        cut = any(isinstance(v, ast.Subscript) and isinstance(v.slice, ast.Slice) for v in ast.walk(node.value))
        for t in node.targets:
            name = t.value if isinstance(t, ast.Subscript) else t
            if cut and isinstance(name, ast.Name) and name.id in rows:
                lines.append(node.lineno)
    return sorted(lines)


def _check_commits_accepted(src: tp.SourceTree) -> str | None:
    """Timed cells measure SD only if the runner commits every accepted token of a step: no
    method that reads the rejection sampler's rows may cut them (a tracing build does)."""
    runner = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
    cls = src.find(runner)
    if cls is None:
        return f"{runner} not found"
    for method in [n.name for n in getattr(cls, "body", []) if hasattr(n, "args")]:
        lines = _row_truncations(src, f"{runner}.{method}")
        if lines:
            return (f"GPUModelRunner.{method} cuts the accepted rows at line {lines[0]}: one token per step "
                    "(a tracing build), timed SD cells would show no speedup")
    return None


def _per_request_versions() -> list[str]:
    from sdbench.engine.versions import _KNOWN

    return [q.version for q in _KNOWN.values() if q.per_request_spec_metrics]


TOUCHPOINTS = tp.declare(
    __name__,
    tp.custom("timing.commits_accepted", _check_commits_accepted,
              ["vllm.v1.worker.gpu_model_runner:GPUModelRunner"]),
    tp.custom("llm.kwargs", _check_llm_kwargs, ["vllm:LLM", "vllm.engine.arg_utils:EngineArgs"]),
    tp.defined("llm.generate", "vllm:LLM.generate", ["prompts", "sampling_params", "use_tqdm"]),
    tp.defined("llm.get_metrics", "vllm:LLM.get_metrics"),
    tp.fields("llm.metric_counter", "vllm.v1.metrics.reader:Counter", ["name", "value"]),
    tp.fields("llm.metric_vector", "vllm.v1.metrics.reader:Vector", ["name", "values"]),
    tp.strings("llm.metric_names", "vllm.v1.spec_decode.metrics", [*SD_COUNTERS.values(), SD_PER_POS, "position"]),
    tp.strings("llm.metric_preemptions", "vllm.v1.metrics.loggers", [PREEMPTIONS]),
    # engine_layout_of: the in-process client's class name.
    tp.defined("llm.inprocess_client", "vllm.v1.engine.core_client:InprocClient"),
    tp.self_attributes("llm.engine_core_client", "vllm.v1.engine.llm_engine:LLMEngine", ["engine_core"]),
    tp.self_attributes("llm.llm_engine", "vllm:LLM", ["llm_engine"]),
    tp.fields("llm.tokens_prompt", "vllm.inputs:TokensPrompt", ["prompt_token_ids"]),
    tp.fields("llm.request_output", "vllm.outputs:RequestOutput.__init__", ["request_id", "outputs"]),
    tp.fields("llm.completion_output", "vllm.outputs:CompletionOutput", ["token_ids", "text", "finish_reason"]),
    tp.fields("llm.per_request_metrics", "vllm.outputs:CompletionOutput", ["spec_decode_metrics"],
              versions=_per_request_versions()),
    tp.strings("llm.per_request_metrics_keys", "vllm.v1.metrics.stats",
               ["num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens", "mean_acceptance_length"],
               versions=_per_request_versions()),
)
