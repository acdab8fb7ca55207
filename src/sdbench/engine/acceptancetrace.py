"""In-engine acceptance tracing: a vLLM general plugin.

In trace mode, after each verification step the plugin records, per request,
how many tokens the target would emit (accepted drafts + 1, the trace's
``acc_len``) and how many draft tokens were scheduled (``proposed_len``), then
commits only the first token. The sequence therefore advances exactly as plain
greedy decoding while the trace shows what the proposer *would* have achieved at
every position -- the method of the paper's Sec. 6 (the authors' fork did this
in ``gpu_model_runner.py``).

Enabled per process by the environment variable ``SDBENCH_TRACE_DIR``; vLLM
loads the plugin (entry point ``vllm.general_plugins``) in every engine process,
and only tensor-parallel rank 0 writes ``trace-<pid>.jsonl`` there.

Hook points differ by vLLM version and are isolated in :data:`HOOKS`:

* ``RejectionSampler.parse_output`` (all versions): turns the rejection sampler's
  padded output into per-request token lists -> record lengths, keep ``row[:1]``.
* the runner method that calls it and knows the request ids: 0.10.1.1
  ``GPUModelRunner.execute_model`` (returns ``ModelRunnerOutput``); 0.11.1 and
  0.32 ``GPUModelRunner._bookkeeping_sync`` (returns a tuple whose layout differs).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_TRACE_DIR = "SDBENCH_TRACE_DIR"


@dataclass(frozen=True)
class Hooks:
    """Where trace mode hooks into one vLLM version."""

    runner_method: str
    # runner_method returns a tuple: positions of the request ids and of the committed token rows
    # (row i <-> request i); None: it returns a ModelRunnerOutput (req_ids, sampled_token_ids).
    tuple_items: tuple[int, int] | None
    # parse_output returns (rows, logprobs) instead of rows.
    parse_returns_tuple: bool

    def extract(self, out: Any) -> tuple[Sequence[str], Sequence[Sequence[int]]] | None:
        """(request ids, committed token rows) of one result of ``runner_method``."""
        if self.tuple_items is not None:
            ids, rows = self.tuple_items
            return out[ids], out[rows]
        if not hasattr(out, "sampled_token_ids"):  # IntermediateTensors (pipeline parallel)
            return None
        return out.req_ids, out.sampled_token_ids


HOOKS: dict[str, Hooks] = {
    "0.10.1.1": Hooks("execute_model", None, parse_returns_tuple=False),
    # _bookkeeping_sync -> (nans, logprobs, valid_sampled_token_ids, prompt_logprobs, req_ids, ...)
    "0.11.1": Hooks("_bookkeeping_sync", (4, 2), parse_returns_tuple=False),
    # _bookkeeping_sync -> (nans, num_nans, logprobs, valid_sampled_token_ids, prompt_logprobs, req_ids, ...)
    "0.32.0": Hooks("_bookkeeping_sync", (5, 3), parse_returns_tuple=True),
}

_state: dict[str, Any] = {"installed": False, "lengths": None, "fh": None}


def hooks_for(version: str) -> Hooks:
    """The hook points of a vLLM version (``ValueError`` if unknown)."""
    base = version.split("+")[0]
    if base not in HOOKS:
        raise ValueError(f"sdbench trace mode: no hook points known for vLLM {version} (known: {sorted(HOOKS)})")
    return HOOKS[base]


def _is_rank0() -> bool:
    try:
        from vllm.distributed import parallel_state

        return parallel_state.get_tensor_model_parallel_rank() == 0
    except Exception:  # noqa: BLE001 - not initialised: single process
        return True


def _writer() -> Any:
    if _state["fh"] is None:
        directory = Path(os.environ[ENV_TRACE_DIR])
        directory.mkdir(parents=True, exist_ok=True)
        _state["fh"] = open(directory / f"trace-{os.getpid()}.jsonl", "a", buffering=1, encoding="utf-8")
    return _state["fh"]


def install(version: str) -> None:
    """Patch vLLM for trace mode (idempotent)."""
    if _state["installed"]:
        return
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    hooks = hooks_for(version)
    original_parse = RejectionSampler.parse_output

    def parse_output(*args: Any, **kwargs: Any) -> Any:
        result = original_parse(*args, **kwargs)
        rows = result[0] if hooks.parse_returns_tuple else result
        _state["lengths"] = [len(row) for row in rows]
        truncated = [row[:1] for row in rows]
        return (truncated, *result[1:]) if hooks.parse_returns_tuple else truncated

    RejectionSampler.parse_output = staticmethod(parse_output)

    original_method = getattr(GPUModelRunner, hooks.runner_method)

    @functools.wraps(original_method)
    def traced(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        _state["lengths"] = None
        result = original_method(self, scheduler_output, *args, **kwargs)
        extracted = hooks.extract(result)
        if extracted is not None and _is_rank0():
            _record(scheduler_output, *extracted)
        return result

    setattr(GPUModelRunner, hooks.runner_method, traced)
    _state["installed"] = True


def _record(scheduler_output: Any, req_ids: Sequence[str], rows: Sequence[Sequence[int]]) -> None:
    lengths = _state["lengths"]
    spec = getattr(scheduler_output, "scheduled_spec_decode_tokens", {}) or {}
    fh = _writer()
    for i, (req_id, row) in enumerate(zip(req_ids, rows)):
        if len(row) == 0:  # partial prefill or discarded: no token committed this step
            continue
        acc_len = lengths[i] if lengths is not None else len(row)
        proposed = len(spec.get(req_id, ()))
        fh.write(json.dumps({"req_id": req_id, "acc_len": int(acc_len), "proposed_len": proposed}) + "\n")


def register() -> None:
    """vLLM general-plugin entry point: install the hooks when trace mode is requested."""
    if not os.environ.get(ENV_TRACE_DIR):
        return
    import vllm

    install(vllm.__version__)


def read_trace_dir(directory: str | os.PathLike[str]) -> dict[str, list[tuple[int, int]]]:
    """Collect the plugin's records: request id -> [(acc_len, proposed_len) per step], in step order."""
    out: dict[str, list[tuple[int, int]]] = {}
    for path in sorted(Path(directory).glob("trace-*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                rec = json.loads(line)
                out.setdefault(rec["req_id"], []).append((rec["acc_len"], rec["proposed_len"]))
    return out


# ----------------------------------------------------------------------------- touchpoints
from sdbench.engine import touchpoints as tp  # noqa: E402 - standard library only

_RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
_SAMPLER = "vllm.v1.sample.rejection_sampler:RejectionSampler"
# The runner methods that drive one step (0.11+ splits it: execute_model, then sample_tokens).
STEP_METHODS = ("execute_model", "sample_tokens")


def _check_parse_output(src: tp.SourceTree) -> str | None:
    hooks = hooks_for(src.version)
    params = src.params(f"{_SAMPLER}.parse_output")
    if params is None:
        return f"{_SAMPLER}.parse_output not found"
    if params[:2] != ["output_token_ids", "vocab_size"]:
        return f"parse_output takes ({', '.join(params)})"
    returns_tuple = bool(tp.return_names(src, f"{_SAMPLER}.parse_output"))
    if returns_tuple != hooks.parse_returns_tuple:
        return f"parse_output returns {'a tuple' if returns_tuple else 'rows'}, the hook expects the other"
    return None


def _check_runner_result(src: tp.SourceTree) -> str | None:
    """The runner method the hook wraps returns request ids and committed rows where it reads them."""
    hooks = hooks_for(src.version)
    target = f"{_RUNNER}.{hooks.runner_method}"
    if not src.has(target):
        return f"{target} not found"
    if hooks.tuple_items is None:
        missing = {"req_ids", "sampled_token_ids"} - src.class_fields("vllm.v1.outputs:ModelRunnerOutput")
        return f"ModelRunnerOutput lacks {', '.join(sorted(missing))}" if missing else None
    try:
        layout = tp.tuple_layout(tp.return_names(src, target), ["req_ids_output_copy", "valid_sampled_token_ids"])
    except ValueError as exc:
        return f"{hooks.runner_method}: {exc}"
    read = dict(zip(("req_ids_output_copy", "valid_sampled_token_ids"), hooks.tuple_items))
    if layout != read:
        return f"{hooks.runner_method} returns request ids / rows at {layout}, the hook reads {read}"
    return None


def _truncates(name: str) -> bool:
    # Where the hook cuts a step to one committed token.
    return name.endswith("parse_output")


def _check_drafts_aligned(src: tp.SourceTree) -> str | None:
    """Every drafter call of a step comes after the truncation, so the next drafts start at the
    one committed token (else they continue from the whole accepted run and the trace is offset)."""
    for method in STEP_METHODS:
        target = f"{_RUNNER}.{method}"
        if not src.has(target):
            continue
        order = tp.call_order(
            src, target, {"cut": _truncates, "draft": lambda n: n.endswith("propose_draft_token_ids")}
        )
        if order["draft"] and not order["cut"]:
            return f"{method} drafts (line {order['draft'][0]}) but never reaches the trace hook's truncation"
        early = [line for line in order["draft"] if order["cut"] and line < order["cut"][0]]
        if early:
            return (f"{method} drafts at line {early[0]} before the trace hook truncates the step (line "
                    f"{order['cut'][0]}): the drafter proposes from the whole accepted run, the next drafts are offset")
    return None


TOUCHPOINTS = tp.declare(
    __name__,
    tp.custom("trace.parse_output", _check_parse_output, [f"{_SAMPLER}.parse_output"]),
    tp.custom("trace.runner_result", _check_runner_result,
              [f"{_RUNNER}.execute_model", f"{_RUNNER}._bookkeeping_sync", "vllm.v1.outputs:ModelRunnerOutput"]),
    tp.custom("trace.drafts_aligned", _check_drafts_aligned, [f"{_RUNNER}.sample_tokens"]),
    tp.fields("trace.scheduled_drafts", "vllm.v1.core.sched.output:SchedulerOutput", ["scheduled_spec_decode_tokens"]),
    tp.defined("trace.tp_rank", "vllm.distributed.parallel_state:get_tensor_model_parallel_rank"),
)
