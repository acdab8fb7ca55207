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

Two hooks, chosen by what the build has (:func:`select_hooks`, the same predicate the
conformance check evaluates on the release sources):

* the cut, ``RejectionSampler.forward`` (every release): records each row's valid tokens and
  overwrites all but the first with the placeholder id, in place. Everything after it in the step
  sees one committed token -- the bookkeeping and, what matters, the drafter: from vLLM 0.11 an
  EAGLE-style or draft-model drafter proposes from the sampler's output *before* bookkeeping
  (the padded drafter batch), so a cut made later (at ``parse_output``, as this module did before)
  let it propose after the whole accepted run while the sequence advanced one token, and every
  later draft was offset;
* the runner method that knows the request ids of the committed rows: ``_bookkeeping_sync``
  where it exists (a tuple; positions read from its own ``return`` in the installed source), else
  ``execute_model`` (a ``ModelRunnerOutput``, vLLM 0.10).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdbench.engine.release import touchpoints as tp

ENV_TRACE_DIR = "SDBENCH_TRACE_DIR"

_RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
_SAMPLER = "vllm.v1.sample.rejection_sampler:RejectionSampler"
CUT = f"{_SAMPLER}.forward"
# Names in _bookkeeping_sync's return tuple: request ids and committed rows.
TUPLE_NAMES = ("req_ids_output_copy", "valid_sampled_token_ids")


@dataclass(frozen=True)
class Hooks:
    """Where trace mode reads the committed rows and their request ids."""

    runner_method: str  # "_bookkeeping_sync" (returns a tuple) or "execute_model" (a ModelRunnerOutput)

    @property
    def returns_tuple(self) -> bool:
        """Whether ``runner_method`` returns a tuple (else a ``ModelRunnerOutput``)."""
        return self.runner_method == "_bookkeeping_sync"


def select_hooks(has: Callable[[str], bool]) -> Hooks:
    """The hooks of a build, from what it defines (``has``: :meth:`SourceTree.has` or :func:`live_has`)."""
    return Hooks("_bookkeeping_sync" if has(f"{_RUNNER}._bookkeeping_sync") else "execute_model")


_state: dict[str, Any] = {"installed": False, "lengths": None, "fh": None}


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


def cut_rows(token_ids: Any, placeholder: int) -> list[int]:
    """Valid tokens per row of the rejection sampler's output; keeps only column 0, in place."""
    lengths = (token_ids != placeholder).sum(dim=1).tolist()
    token_ids[:, 1:] = placeholder
    return [int(n) for n in lengths]


def install() -> None:
    """Patch vLLM for trace mode (idempotent)."""
    if _state["installed"]:
        return
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    hooks = select_hooks(tp.live_has)
    sampler = rejection_sampler.RejectionSampler
    placeholder = int(rejection_sampler.PLACEHOLDER_TOKEN_ID)
    original_forward = sampler.forward

    @functools.wraps(original_forward)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original_forward(self, *args, **kwargs)
        # vLLM 0.10 returns the token tensor, later releases a SamplerOutput holding it.
        _state["lengths"] = cut_rows(getattr(out, "sampled_token_ids", out), placeholder)
        return out

    sampler.forward = forward

    original_method = getattr(GPUModelRunner, hooks.runner_method)
    if hooks.returns_tuple:
        layout = tp.live_layout(original_method, TUPLE_NAMES)
        ids_at, rows_at = (layout[name] for name in TUPLE_NAMES)

        def extract(out: Any) -> tuple[Sequence[str], Sequence[Sequence[int]]] | None:
            return out[ids_at], out[rows_at]
    else:

        def extract(out: Any) -> tuple[Sequence[str], Sequence[Sequence[int]]] | None:
            if not hasattr(out, "sampled_token_ids"):  # IntermediateTensors (pipeline parallel)
                return None
            return out.req_ids, out.sampled_token_ids

    @functools.wraps(original_method)
    def traced(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        result = original_method(self, scheduler_output, *args, **kwargs)
        extracted = extract(result)
        if extracted is not None and _is_rank0():
            _record(scheduler_output, *extracted)
        _state["lengths"] = None
        return result

    setattr(GPUModelRunner, hooks.runner_method, traced)
    # A step starts in execute_model: lengths of an earlier forward (vLLM's dummy sampler run
    # at start-up) must not reach a step whose rows were never cut (no drafts scheduled).
    original_execute = GPUModelRunner.execute_model

    @functools.wraps(original_execute)
    def execute_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        _state["lengths"] = None
        return original_execute(self, *args, **kwargs)

    GPUModelRunner.execute_model = execute_model
    _state["installed"] = True


def _record(scheduler_output: Any, req_ids: Sequence[str], rows: Sequence[Sequence[int]]) -> None:
    lengths = _state["lengths"]
    if lengths is not None and len(lengths) != len(rows):
        raise RuntimeError(f"sdbench trace mode: the rejection sampler cut {len(lengths)} rows, the step committed {len(rows)}")
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
    install()


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
# The runner methods that drive one step (0.11+ splits it: execute_model, then sample_tokens).
STEP_METHODS = ("execute_model", "sample_tokens")


def _check_cut(src: tp.SourceTree) -> str | None:
    """The rejection sampler's forward returns the padded token rows the cut overwrites."""
    if not src.has(CUT):
        return f"{CUT} not found"
    if not src.has("vllm.v1.sample.rejection_sampler:PLACEHOLDER_TOKEN_ID"):
        return "no PLACEHOLDER_TOKEN_ID"
    text = src.source_of(CUT)
    if "return output_token_ids" in text or "sampled_token_ids=" in text:
        return None
    return "RejectionSampler.forward returns neither the token rows nor a SamplerOutput(sampled_token_ids=...)"


def _check_runner_result(src: tp.SourceTree) -> str | None:
    """The runner method the hook wraps returns request ids and committed rows."""
    hooks = select_hooks(src.has)
    target = f"{_RUNNER}.{hooks.runner_method}"
    if not src.has(target):
        return f"{target} not found"
    if not hooks.returns_tuple:
        missing = {"req_ids", "sampled_token_ids"} - src.class_fields("vllm.v1.outputs:ModelRunnerOutput")
        return f"ModelRunnerOutput lacks {', '.join(sorted(missing))}" if missing else None
    try:
        tp.tuple_layout(tp.return_names(src, target), TUPLE_NAMES)
    except ValueError as exc:
        return f"{hooks.runner_method}: {exc}"
    return None


def _cuts(name: str) -> bool:
    # A call of the rejection sampler module (``self.rejection_sampler(...)``) runs its forward.
    return name.endswith("rejection_sampler")


def _check_drafts_aligned(src: tp.SourceTree) -> str | None:
    """Every drafter call of a step comes after the cut, so the next drafts start at the one
    committed token (else they continue from the whole accepted run and the trace is offset)."""
    for method in STEP_METHODS:
        target = f"{_RUNNER}.{method}"
        if not src.has(target):
            continue
        order = tp.call_order(src, target, {"cut": _cuts, "draft": lambda n: n.endswith("propose_draft_token_ids")})
        if order["draft"] and not order["cut"]:
            return f"{method} drafts (line {order['draft'][0]}) but never reaches the trace hook's cut"
        early = [line for line in order["draft"] if line < order["cut"][0]] if order["cut"] else []
        if early:
            return (f"{method} drafts at line {early[0]} before the trace hook cuts the step (line "
                    f"{order['cut'][0]}): the drafter proposes from the whole accepted run, the next drafts are offset")
    return None


TOUCHPOINTS = tp.declare(
    __name__,
    tp.custom("trace.cut", _check_cut, [CUT, "vllm.v1.sample.rejection_sampler:PLACEHOLDER_TOKEN_ID"]),
    tp.custom("trace.runner_result", _check_runner_result,
              [f"{_RUNNER}.execute_model", f"{_RUNNER}._bookkeeping_sync", "vllm.v1.outputs:ModelRunnerOutput"]),
    tp.custom("trace.drafts_aligned", _check_drafts_aligned, [f"{_RUNNER}.sample_tokens"]),
    tp.fields("trace.scheduled_drafts", "vllm.v1.core.sched.output:SchedulerOutput", ["scheduled_spec_decode_tokens"]),
    tp.defined("trace.tp_rank", "vllm.distributed.parallel_state:get_tensor_model_parallel_rank"),
)
