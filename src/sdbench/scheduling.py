"""What a job asks of a batch scheduler: GPUs, host memory and wall time.

Snakemake rules call these as resource functions; the SLURM executor plugin turns
``gpu`` into ``--gpus``, ``mem_mb`` into ``--mem`` and ``runtime`` (minutes) into
``-t``. CPUs are a site setting (``cpus_per_gpu`` / ``set-threads`` in the profile).

**Engine jobs** (run, breakdown, trace and server groups) are estimated by
:func:`estimate_breakdown` from what they do: engine start-ups, warm-up calls, prefill and decode
steps of every call, in every trial the stopping rule can take, on every arm and engine start.
A step's time is the published simulator's cost model of Llama-3.1-8B on one H100
(``sdbench/data/cost_models/llama3.1-8b-h100.yaml``: :data:`DEVICE_COSTS`), scaled to the model
by its architecture config (:func:`model_scale`: weight bytes, active parameters, KV bytes per
token, tensor-parallel size). The estimate is then doubled (:data:`SAFETY`; a job killed at its
limit loses the cell it was measuring, one that asked for too much only waits longer in the
queue) and grows with each retry. A site's limits (``site`` in the config, which the SLURM
profiles pass: the longest runtime of the engine jobs' partition, its GPUs per node) cap every
request, and :func:`split_to_fit` splits engine groups until each fits.

**Analysis jobs** ask for memory and time from the rows and token ids their inputs hold, which
the plan knows before any of them exists (:func:`input_reads`, :func:`analysis_mem_mb`,
:func:`analysis_runtime_minutes`).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Iterable

from sdbench.expectedlengths import DEFAULT_PROMPT_TOKENS, SIZING_KEYS, output_tokens, prompt_tokens  # noqa: F401
from sdbench.grid import Cell

# ----------------------------------------------------------------------------- constants
# Every time and size constant of the estimates, in one place.


@dataclass(frozen=True)
class DeviceCosts:
    """Seconds of one engine step of the reference model on a device, and per job and call."""

    step_fixed_s: float  # per step, any batch: reading the weights (scales with the model's weight bytes)
    step_overhead_s: float  # per step: scheduling, sampling, bookkeeping (does not scale with the model)
    token_s: float  # per token a step computes (prefill or verified): dense compute, x active parameters
    kv_token_s: float  # per token in the KV cache a decode step attends over: KV reads, x KV bytes per token
    startup_min: float  # one engine start: load, torch.compile, CUDA graph capture
    call_s: float  # per generate call or served request: entry, metrics reads, row bookkeeping


# CUDA: the published cost model of the paper's simulator (Llama-3.1-8B-Instruct on one H100,
# vLLM 0.10.1.1; tests/test_scheduling.py checks these against the shipped YAML): c_fixed,
# overhead_per_step, c_compute, c_kv. Start-up: 20 minutes, an allowance (minutes per start on
# a GPU node: load, compile, graph capture). Per call: 0.2 s, an allowance.
# CPU: the project's small models on vLLM's CPU build. Measured (docs/results/2026-11-26-default-in-
# minutes.md, 2 AMD EPYC cores): a trial of 8 calls of up to 128 tokens took a median 3.6 s, about
# 3.5 ms a step. Allowances for slower hosts: 20 ms a step, 1/32 of that per token computed (a
# batch-32 step costs twice a batch-1 step), 3 minutes per engine start (measured: about 15 s with
# the job's process start), 0.1 s per call.
DEVICE_COSTS = {
    "cuda": DeviceCosts(
        step_fixed_s=5.88590713e-03,
        step_overhead_s=1.20683946e-03,
        token_s=2.10103129e-05,
        kv_token_s=3.92645679e-08,
        startup_min=20.0,
        call_s=0.2,
    ),
    "cpu": DeviceCosts(
        step_fixed_s=0.02, step_overhead_s=0.0, token_s=0.02 / 32, kv_token_s=0.0, startup_min=3.0, call_s=0.1
    ),
}
# The model DEVICE_COSTS["cuda"] was fitted on (its architecture config scales other models).
REFERENCE_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# Drafting per step, from the same cost model: n-gram (and suffix) lookup is a fraction of the
# verify pass; a learned head (EAGLE, EAGLE-3, MTP, Medusa: every other method) costs c_fixed +
# c_spec per proposed token + c_kv per KV token (its EAGLE fit), its token terms scaled as the
# target's. A draft model runs k passes of its own steps. On CPU a head's pass is an allowance of
# 1/32 of a step per drafted token.
LOOKUP_DRAFT_FRACTION = 0.005875
HEAD_DRAFT = {"fixed_s": 2.13526175e-03, "spec_token_s": 8.41429603e-07, "kv_token_s": 2.37768493e-09}
LOOKUP_METHODS = frozenset({"ngram", "suffix"})
CPU_HEAD_PASS_STEPS = 1 / 32
# A tensor-parallel engine's step splits weights, compute and KV over its GPUs, at this efficiency
# (all-reduce and imbalance; an allowance): a TP4 step takes 1 / (4 x 0.8) of one GPU's.
TP_EFFICIENCY = 0.8
# Prefill runs in chunks of at most this many tokens (vLLM's max_num_batched_tokens; 8,192, the
# smallest of its defaults): each chunk is one step.
PREFILL_CHUNK_TOKENS = 8192
# An SD step commits at least one token: the estimate assumes the worst, one token per step (as
# without SD), each step verifying 1 + k tokens per sequence and paying the drafter. An upper
# bound whatever the acceptance.
SD_TOKENS_PER_STEP = 1
SAFETY = 2.0
MIN_MINUTES = 10
MAX_MINUTES = 7 * 24 * 60
# An engine group is split until its estimate is at most this share of the site's limit: a
# job up to 25% slower than its (already doubled) estimate still ends before SLURM kills it.
SITE_MARGIN = 0.8

# Host memory. An engine process on a GPU node: weights staged through host memory while loading,
# the CUDA context, vLLM's CPU-side structures (64 GB per GPU, an allowance). On CPU: the process
# and its KV cache. Then the cell's tables while it is measured (:func:`job_mem_mb`).
HOST_MEM_MB_PER_GPU = 64_000
CPU_ENGINE_MEM_MB = 16_000
# A token id held by Python: an int object (28 B; only -5..256 are shared) and its list slot (8 B),
# plus its Arrow int64 (8 B) while the table is written.
PY_TOKEN_BYTES = 44
# A token id an analysis reads from parquet: the Arrow buffer and the NumPy copy pandas makes (2 x 8 B).
ARROW_TOKEN_BYTES = 16
# A table row's scalar columns in pandas: key strings (Python objects) and a few dozen numbers.
ROW_BYTES = 512
# A trace table's row (one output position): request id and method strings (Python objects, about
# 60 B each with their slot) and four small numbers.
TRACE_ROW_BYTES = 200
# Tables held while a job reads them and while it concatenates them: two copies at the peak.
CONCAT_COPIES = 2
# A token id of a requests table (sdbench.requesttable): int32, in one buffer per cell, as held
# while measured and as stored; its rows refer to their prompt by request id (no prompt ids).
STORED_TOKEN_BYTES = 4
# An analysis job before its data: the interpreter with pandas, pyarrow, matplotlib and the analysis
# modules imported (155 MB peak RSS measured here), and room for drawing a figure (an allowance).
ANALYSIS_BASE_MB = 1_000
ANALYSIS_BASE_S = 60.0
# Work rates of an analysis, allowances for its slowest part: 50 us of Python per table row, 1 us
# per token id (a Python loop's simple per-token work: comparing, counting n-grams).
ANALYSIS_ROWS_PER_S = 2e4
ANALYSIS_TOKENS_PER_S = 1e6
MEM_STEP_MB = 100


# ----------------------------------------------------------------------------- config lookups
def _device(config: dict[str, Any], engine: str) -> str:
    return "cpu" if config["engines"][engine]["device"] == "cpu" else "cuda"


def _costs(config: dict[str, Any], engine: str) -> DeviceCosts:
    return DEVICE_COSTS[_device(config, engine)]


def cell_gpus(config: dict[str, Any], cell: Cell) -> int:
    """GPUs of a cell: the target's tensor-parallel size on CUDA engines, 0 on CPU."""
    if config["engines"][cell.engine]["device"] != "cuda":
        return 0
    return int(config["models"][cell.model].get("tensor_parallel_size", 1))


def _cell_run(config: dict[str, Any], cell: Cell) -> dict[str, Any]:
    """The run settings a cell is measured under (a forced-acceptance point's overrides included)."""
    from sdbench import sweeps

    return {**config.get("run", {}), **(sweeps.forced_run(config, cell.method) or {})}


def _num_prompts(config: dict[str, Any], dataset: str, run: dict[str, Any]) -> int:
    n = int(config["datasets"][dataset]["num_prompts"])
    return min(n, int(run["num_requests"])) if run.get("num_requests") else n


def _speculative_tokens(config: dict[str, Any], method: str) -> int:
    entry = config["methods"][method]
    return 0 if entry["method"] == "none" else int(entry.get("num_speculative_tokens", 1))


# ----------------------------------------------------------------------------- model scaling
@dataclass(frozen=True)
class ModelScale:
    """A model's step-time factors against the reference model (1.0 each for the reference on one GPU).

    ``weights``: weight bytes read per step (MoE: every expert, as at large batches);
    ``compute``: FLOPs per token (active parameters); ``kv``: KV bytes per token;
    ``attention``: prefill attention's extra compute per squared prompt token, in token-equivalents
    (``layers x query width / reference parameters``: causal attention over P tokens costs
    ``2 x layers x width x P**2`` FLOPs, a token ``2 x parameters``). All per GPU: divided by
    ``tensor_parallel_size x`` :data:`TP_EFFICIENCY` when sharded.
    """

    weights: float = 1.0
    compute: float = 1.0
    kv: float = 1.0
    attention: float = 0.0
    source: str = "reference"


@functools.lru_cache(maxsize=None)
def _architecture(hf_id: str) -> tuple[float, float, float, float] | None:
    """(weight bytes, active parameters, KV bytes per token, layers x query width) of a hub model
    with a shipped architecture config, else ``None``."""
    from sdbench.analysis.memory import count_full_model, memory_report
    from sdbench.models.spec import load_model_spec

    try:
        spec = load_model_spec(hf_id)
        report = memory_report(spec)
    except (ValueError, FileNotFoundError):
        return None
    params = count_full_model(spec)
    active = float(params.total)
    if spec.n_routed_experts and spec.num_experts_per_tok:
        routed = params.components.get("moe_routed_experts", 0)
        active -= routed * (1 - spec.num_experts_per_tok / spec.n_routed_experts)
    width = spec.num_hidden_layers * spec.num_attention_heads * spec.head_dim
    return report["static_gib"] * 2**30, active, report["per_token_kib"] * 2**10, float(width)


def model_scale(config: dict[str, Any], model: str, engine: str) -> ModelScale:
    """Step-time factors of ``model`` on ``engine`` (see :class:`ModelScale`). On CPU engines
    none (the CPU costs are allowances for the project's small models); a model without a shipped
    architecture config (a built model, an unknown hub id) counts as the reference model."""
    if _device(config, engine) == "cpu":
        return ModelScale(source="cpu")
    entry = config["models"][model]
    tp = int(entry.get("tensor_parallel_size", 1))
    share = 1.0 if tp == 1 else 1.0 / (tp * TP_EFFICIENCY)
    ref = _architecture(REFERENCE_MODEL)
    assert ref is not None, f"the reference model's architecture config ({REFERENCE_MODEL}) ships with sdbench"
    arch = _architecture(entry["hf_id"]) if entry.get("hf_id") else None
    weights, active, kv, width = arch or ref
    return ModelScale(weights / ref[0] * share, active / ref[1] * share, kv / ref[2] * share,
                      width / ref[1] * share, entry["hf_id"] if arch else "reference")  # fmt: skip


# ----------------------------------------------------------------------------- step times
def _draft_s(config: dict[str, Any], engine: str, model: str, method: str, batch: int, context: float,
             verify_s: float) -> float:  # fmt: skip
    """Drafting seconds of one SD step of ``batch`` sequences at ``context`` tokens each."""
    entry = config["methods"][method]
    kind, k = entry["method"], _speculative_tokens(config, method)
    if kind == "none" or k == 0:
        return 0.0
    if kind in LOOKUP_METHODS:
        return LOOKUP_DRAFT_FRACTION * verify_s
    scale = model_scale(config, model, engine)
    if kind == "draft_model":
        drafter = (entry.get("drafter") or {}).get(model)
        dscale = model_scale(config, drafter, engine) if drafter in config["models"] else scale
        return k * _step_s(_costs(config, engine), dscale, batch, 1, context)
    if _device(config, engine) == "cpu":
        return _costs(config, engine).step_fixed_s * CPU_HEAD_PASS_STEPS * k
    return HEAD_DRAFT["fixed_s"] + scale.compute * HEAD_DRAFT["spec_token_s"] * batch * k + \
        scale.kv * HEAD_DRAFT["kv_token_s"] * batch * context  # fmt: skip


def _step_s(costs: DeviceCosts, scale: ModelScale, batch: int, tokens_per_seq: int, context: float) -> float:
    """One decode (or verify) step: ``batch`` sequences, ``tokens_per_seq`` new tokens each,
    attending over ``context`` tokens each."""
    return (
        costs.step_fixed_s * scale.weights
        + costs.step_overhead_s
        + costs.token_s * scale.compute * batch * tokens_per_seq
        + costs.kv_token_s * scale.kv * batch * context
    )


@dataclass(frozen=True)
class Work:
    """Seconds of some engine work, by part (:func:`estimate_breakdown` adds them up)."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    call_s: float = 0.0

    @property
    def seconds(self) -> float:
        return self.prefill_s + self.decode_s + self.call_s

    def __add__(self, other: Work) -> Work:
        return Work(self.prefill_s + other.prefill_s, self.decode_s + other.decode_s, self.call_s + other.call_s)

    def __mul__(self, times: float) -> Work:
        return Work(self.prefill_s * times, self.decode_s * times, self.call_s * times)


def _generate(config: dict[str, Any], engine: str, model: str, method: str, *, sequences: int, running: int,
              prompt: int, output: int, calls: int = 1, draft_tokens: int | None = None) -> Work:  # fmt: skip
    """``calls`` generate calls of ``sequences`` sequences each, at most ``running`` decoding at
    once, each prefilling ``prompt`` tokens (no prefix caching: every copy prefills) and decoding
    ``output`` tokens (:data:`SD_TOKENS_PER_STEP` per step)."""
    costs, scale = _costs(config, engine), model_scale(config, model, engine)
    k = _speculative_tokens(config, method) if draft_tokens is None else draft_tokens
    running = max(1, min(running, sequences))
    prefill_tokens = sequences * prompt
    prefill = (
        costs.token_s * scale.compute * prefill_tokens
        + costs.token_s * scale.attention * sequences * prompt**2
        + math.ceil(prefill_tokens / PREFILL_CHUNK_TOKENS)
        * (costs.step_fixed_s * scale.weights + costs.step_overhead_s)
    )
    context = prompt + output / 2  # a decode step's mean context
    verify = _step_s(costs, scale, running, 1 + k, context)
    step = verify + _draft_s(config, engine, model, method, running, context, verify)
    steps = math.ceil(sequences / running) * math.ceil(output / SD_TOKENS_PER_STEP)
    return Work(prefill, steps * step, costs.call_s) * calls


# ----------------------------------------------------------------------------- engine jobs
@dataclass(frozen=True)
class CellEstimate:
    """One cell of a run or breakdown job: its work on every arm (``arms``: 2 when timed in
    pairs with a no-SD engine), per trial, and the trials the stopping rule can take."""

    cell: Cell
    arms: int
    warmup: Work  # the warm-up calls, every arm
    trial: Work  # one trial: every timed call once, every arm
    trials: float  # trials bounded by the stopping rule (:func:`trial_bound`), fractional for min_measured_s

    @property
    def seconds(self) -> float:
        return self.warmup.seconds + self.trial.seconds * self.trials


def trial_bound(run: dict[str, Any], trial_s: float, fastest_arm_s: float) -> float:
    """Trials (in units of one trial of every arm) the stopping rule (``sdbench.engine.trials``) can
    take at most: ``repeats``; with ``target_half_width`` the worst case, ``max(repeats, max_repeats)``;
    with ``min_measured_s``, trials until the fastest arm has that many seconds plus the trial that
    crosses it (``min_measured_s / fastest arm's trial + 1``: a bound even when the real trial is
    faster than estimated), within ``max(repeats, max_repeats)``."""
    repeats = int(run.get("repeats", 1))
    most = max(repeats, int(run.get("max_repeats", 50)))
    if run.get("target_half_width") is not None:
        return float(most)
    min_s = float(run.get("min_measured_s", 0) or 0)
    if min_s <= 0 or fastest_arm_s <= 0:
        return float(repeats)
    return min(float(most), max(float(repeats), min_s / fastest_arm_s + 1))


def cell_estimate(config: dict[str, Any], cell: Cell, run: dict[str, Any] | None = None) -> CellEstimate:
    """A cell's work on its engine (see :class:`CellEstimate`); ``run`` overrides its run settings
    (a breakdown cell's)."""
    from sdbench.grid import baseline_method

    run = run if run is not None else _cell_run(config, cell)
    n = _num_prompts(config, cell.dataset, run)
    prompt, output = prompt_tokens(config, cell.dataset), output_tokens(config, cell.dataset, run)
    warmups = min(int(run.get("warmup_requests", 1)), n)
    methods = [cell.method]
    if run.get("paired_baseline") and config["methods"][cell.method]["method"] != "none":
        methods.append(baseline_method(config))  # timed call by call beside a no-SD engine
    warmup, trial, fastest = Work(), Work(), math.inf
    for method in methods:
        common = dict(prompt=prompt, output=output)
        if run.get("batch_mode", "replicate") == "distinct":  # every prompt in one call, batch-size running
            arm = _generate(config, cell.engine, cell.model, method, sequences=n, running=cell.batch_size, **common)
        else:  # each prompt replicated batch-size times, one call each
            arm = _generate(config, cell.engine, cell.model, method, sequences=cell.batch_size,
                            running=cell.batch_size, calls=n, **common)  # fmt: skip
        warm = _generate(config, cell.engine, cell.model, method, sequences=cell.batch_size,
                         running=cell.batch_size, calls=warmups, **common)  # fmt: skip
        warmup, trial, fastest = warmup + warm, trial + arm, min(fastest, arm.seconds)
    return CellEstimate(cell, len(methods), warmup, trial, trial_bound(run, trial.seconds, fastest))


@dataclass(frozen=True)
class JobEstimate:
    """An engine job's estimate by part, in seconds of expected work (all trials, arms and engine
    starts), and its first-attempt request ``minutes`` = :data:`SAFETY` x their sum, at least
    :data:`MIN_MINUTES`, before any site cap."""

    kind: str  # run | breakdown | trace | server
    startups: int  # engine (or server) starts, each DeviceCosts.startup_min (a server: its timeout if longer)
    startup_s: float
    warmup_s: float
    prefill_s: float  # timed (or traced / served) prefill
    decode_s: float
    call_s: float
    trials: float  # the largest trial bound of its cells (1 for traces and servers)
    cells: tuple[CellEstimate, ...] = field(default=(), repr=False)

    @property
    def expected_s(self) -> float:
        return self.startup_s + self.warmup_s + self.prefill_s + self.decode_s + self.call_s

    @property
    def minutes(self) -> int:
        return max(MIN_MINUTES, math.ceil(SAFETY * self.expected_s / 60))

    def parts_minutes(self) -> dict[str, float]:
        """The parts in minutes (expected, before :data:`SAFETY`), and the request."""
        parts = {f.name.removesuffix("_s"): getattr(self, f.name) / 60 for f in fields(self) if f.name.endswith("_s")}
        return {**parts, "trials": self.trials, "expected": self.expected_s / 60, "minutes": self.minutes}


def _run_job(config: dict[str, Any], cells_: list[Cell], kind: str) -> JobEstimate:
    """A run (``kind`` run) or breakdown group: its cells one after the other on one engine (two
    with pairing), every engine start measuring every cell."""
    from sdbench.grid import resolve_breakdown_cell

    def run_of(c: Cell) -> dict[str, Any]:
        return resolve_breakdown_cell(config, c)["run"] if kind == "breakdown" else _cell_run(config, c)

    estimates = tuple(cell_estimate(config, c, run_of(c)) for c in cells_)
    starts = 1 if kind == "breakdown" else max(1, int(config.get("run", {}).get("engine_starts", 1)))
    engines = max(e.arms for e in estimates)  # the paired no-SD engine starts in the same process
    warmup = sum((e.warmup for e in estimates), Work())
    timed = sum((e.trial * e.trials for e in estimates), Work())
    startup = _costs(config, cells_[0].engine).startup_min * 60
    return JobEstimate(
        kind, starts * engines, starts * engines * startup, starts * warmup.seconds, starts * timed.prefill_s,
        starts * timed.decode_s, starts * timed.call_s, max(e.trials for e in estimates), estimates,
    )  # fmt: skip


def _trace_job(config: dict[str, Any], cells_: list[Cell]) -> JobEstimate:
    """A trace group: per dataset one greedy, untimed generate call over every prompt, at most
    ``traces.max_num_seqs`` running, each step verifying ``traces.num_speculative_tokens`` drafts
    (``cells_`` are its traces as cells at the trace batch size, as the plan gives them)."""
    traces = config.get("traces", {})
    k = int(traces.get("num_speculative_tokens", 20))
    work = Work()
    for c in cells_:  # greedy to EOS whatever run.ignore_eos says (sdbench.engine.tracegroup)
        prompts = _num_prompts(config, c.dataset, _cell_run(config, c))
        work += _generate(config, c.engine, c.model, c.method, sequences=prompts, running=c.batch_size,
                          prompt=prompt_tokens(config, c.dataset), output=output_tokens(config, c.dataset, {}),
                          draft_tokens=k)  # fmt: skip
    startup = _costs(config, cells_[0].engine).startup_min * 60
    return JobEstimate("trace", 1, startup, 0.0, work.prefill_s, work.decode_s, work.call_s, 1.0)


def _server_job(config: dict[str, Any], cell: Cell) -> JobEstimate:
    """A server group (sdbench.servermode) whose largest cell is ``cell``: one server start (its
    ``startup_timeout_s`` if longer than the device's usual start), then per dataset and concurrency
    level c, ``warmup_requests + rounds x requests_per_level`` requests, c in flight, each its own
    call decoding the dataset's expected output."""
    section = config["server"]
    requests = int(section.get("warmup_requests", 2)) + int(section.get("rounds", 2)) * int(
        section.get("requests_per_level", 16)
    )
    work = Work()
    for name in section["datasets"]:
        for level in section["concurrency"]:
            served = _generate(config, cell.engine, cell.model, cell.method, sequences=requests, running=int(level),
                               prompt=prompt_tokens(config, name), output=output_tokens(config, name))  # fmt: skip
            work += replace(served, call_s=requests * _costs(config, cell.engine).call_s)  # a call per request
    startup = max(_costs(config, cell.engine).startup_min * 60, float(section.get("startup_timeout_s", 0)))
    return JobEstimate("server", 1, startup, 0.0, work.prefill_s, work.decode_s, work.call_s, 1.0)


def estimate_breakdown(config: dict[str, Any], kind: str, cells_: list[Cell]) -> JobEstimate:
    """An engine job's estimate with its parts (:class:`JobEstimate`), uncapped.

    ``kind``: ``run`` (a run group's cells), ``breakdown`` (a breakdown group's cells, under
    ``breakdown.repeats``, unpaired), ``trace`` (a trace group's traces as cells at
    ``traces.max_num_seqs``) or ``server`` (a server group's largest cell, one).
    """
    if kind == "server":
        return _server_job(config, cells_[0])
    if kind == "trace":
        return _trace_job(config, cells_)
    if kind in ("run", "breakdown"):
        return _run_job(config, cells_, kind)
    raise ValueError(f"estimate_breakdown: kind {kind!r} is not run, breakdown, trace or server")


def _capped(config: dict[str, Any], first: int, attempt: int) -> int:
    """A job's request: its first-attempt limit times the attempt, within MAX_MINUTES and the
    site's limit (a retry cannot ask for more than the partition allows)."""
    limits = site_limits(config)
    cap = MAX_MINUTES if limits is None or limits.max_runtime is None else min(MAX_MINUTES, limits.max_runtime)
    return int(min(cap, first * max(1, attempt)))


def group_estimate_minutes(config: dict[str, Any], cells: list[Cell]) -> int:
    """First-attempt estimate of a run group in minutes, uncapped (:func:`estimate_breakdown`)."""
    return estimate_breakdown(config, "run", cells).minutes


def group_runtime_minutes(config: dict[str, Any], cells: list[Cell], attempt: int = 1) -> int:
    """Wall-time limit of a run group: its estimate times the attempt, within the site's limit."""
    return _capped(config, group_estimate_minutes(config, cells), attempt)


def cell_runtime_minutes(config: dict[str, Any], cell: Cell, attempt: int = 1) -> int:
    """Wall-time limit of one cell run alone (a group of one)."""
    return group_runtime_minutes(config, [cell], attempt)


def breakdown_estimate_minutes(config: dict[str, Any], cells: list[Cell]) -> int:
    """First-attempt estimate of a breakdown group in minutes, uncapped."""
    return estimate_breakdown(config, "breakdown", cells).minutes


def breakdown_runtime_minutes(config: dict[str, Any], cells: list[Cell], attempt: int = 1) -> int:
    """Wall-time limit of a breakdown group."""
    return _capped(config, breakdown_estimate_minutes(config, cells), attempt)


def trace_estimate_minutes(config: dict[str, Any], cells: list[Cell]) -> int:
    """First-attempt estimate of a trace group (its traces as cells) in minutes, uncapped."""
    return estimate_breakdown(config, "trace", cells).minutes


def trace_runtime_minutes(config: dict[str, Any], cells: list[Cell], attempt: int = 1) -> int:
    """Wall-time limit of a trace group."""
    return _capped(config, trace_estimate_minutes(config, cells), attempt)


def server_estimate_minutes(config: dict[str, Any], cell: Cell) -> int:
    """First-attempt estimate of a server group whose largest cell is ``cell``, uncapped."""
    return estimate_breakdown(config, "server", [cell]).minutes


def server_runtime_minutes(config: dict[str, Any], cell: Cell, attempt: int = 1) -> int:
    """Wall-time limit of a server group whose largest cell is ``cell``."""
    return _capped(config, server_estimate_minutes(config, cell), attempt)


# ----------------------------------------------------------------------------- engine memory
def _mem_mb(nbytes: float, base_mb: float = 0) -> int:
    """``base_mb`` plus ``nbytes``, rounded up to :data:`MEM_STEP_MB`."""
    return int(math.ceil((base_mb + nbytes / 2**20) / MEM_STEP_MB) * MEM_STEP_MB)


def engine_base_mb(config: dict[str, Any], cell: Cell, engines: int = 1) -> int:
    """Host memory of a job's engine processes before any table: :data:`HOST_MEM_MB_PER_GPU` per
    GPU (``engines`` load one after the other: the staging is not held twice); on CPU,
    :data:`CPU_ENGINE_MEM_MB` and each engine's KV cache."""
    gpus = cell_gpus(config, cell)
    if gpus:
        return HOST_MEM_MB_PER_GPU * gpus
    kv = config["engines"][cell.engine].get("llm_kwargs", {}).get("kv_cache_memory_bytes", 0)
    return CPU_ENGINE_MEM_MB + engines * math.ceil(kv / 2**20)


def request_rows(config: dict[str, Any], cell: Cell) -> int:
    """Rows of a cell's requests table: one per sequence of the first trial (every copy in
    replicate mode)."""
    run = _cell_run(config, cell)
    n = _num_prompts(config, cell.dataset, run)
    return n if run.get("batch_mode", "replicate") == "distinct" else n * cell.batch_size


def stored_output_tokens(config: dict[str, Any], cell: Cell) -> int:
    """Output token ids a cell's requests table stores (sdbench.requesttable): a call's equal
    outputs once, so one output per greedy replicated call; every sequence's when sampled or
    in distinct mode. Prompt ids are not stored (a row refers to its prompt by request id)."""
    run = _cell_run(config, cell)
    n = _num_prompts(config, cell.dataset, run)
    greedy = float(config["datasets"][cell.dataset].get("temperature", 0.0)) == 0.0
    replicated = run.get("batch_mode", "replicate") == "replicate"
    outputs = n if greedy and replicated else request_rows(config, cell)
    return outputs * output_tokens(config, cell.dataset, run)


def _paired(config: dict[str, Any], cell: Cell) -> bool:
    """Whether a cell is timed in pairs with a no-SD engine (two arms, two engines)."""
    return bool(_cell_run(config, cell).get("paired_baseline")) and config["methods"][cell.method]["method"] != "none"


def cell_tables_bytes(config: dict[str, Any], cell: Cell, arms: int = 1) -> int:
    """Host bytes of a cell's tables while it is measured: every request row of its ``arms``
    (:data:`ROW_BYTES`) and the output ids they store (:func:`stored_output_tokens`, int32), twice
    (the table is built from them at the end), and the dataset's prompt table."""
    stored = arms * (request_rows(config, cell) * ROW_BYTES + stored_output_tokens(config, cell) * STORED_TOKEN_BYTES)
    prompts = _num_prompts(config, cell.dataset, _cell_run(config, cell)) * prompt_tokens(config, cell.dataset)
    return CONCAT_COPIES * stored + prompts * ARROW_TOKEN_BYTES


def job_mem_mb(config: dict[str, Any], kind: str, cells_: list[Cell]) -> int:
    """Host memory (MB) of an engine job: its engine processes (:func:`engine_base_mb`; a paired
    SD group starts two), plus what it holds of its cells at once. A run or breakdown group writes
    each cell when it finishes: its largest cell's tables (:func:`cell_tables_bytes`). A trace
    group keeps every dataset's requests and trace until it ends: prompt and output token ids and
    two trace arrays per output position. A server group keeps per request its output's token
    times."""
    first = max(cells_, key=lambda c: c.batch_size)
    arms = {c: 2 if kind == "run" and _paired(config, c) else 1 for c in cells_}  # breakdown cells run unpaired
    base = engine_base_mb(config, first, max(arms.values()))
    if kind in ("run", "breakdown"):
        return _mem_mb(max(cell_tables_bytes(config, c, arms[c]) for c in cells_), base)
    if kind == "trace":
        held = sum(
            _num_prompts(config, c.dataset, _cell_run(config, c))
            * (prompt_tokens(config, c.dataset) + 3 * output_tokens(config, c.dataset, {}))
            for c in cells_
        )
        return _mem_mb(held * PY_TOKEN_BYTES, base)
    if kind == "server":
        section = config["server"]
        per_level = int(section.get("warmup_requests", 2)) + int(section.get("rounds", 2)) * int(
            section.get("requests_per_level", 16)
        )
        held = sum(per_level * len(section["concurrency"]) * (ROW_BYTES + output_tokens(config, d) * PY_TOKEN_BYTES)
                   for d in section["datasets"])  # fmt: skip
        return _mem_mb(held, base)
    raise ValueError(f"job_mem_mb: kind {kind!r} is not run, breakdown, trace or server")


def cell_mem_mb(config: dict[str, Any], cell: Cell) -> int:
    """Host memory of one cell run alone (a run group of one, :func:`job_mem_mb`)."""
    return job_mem_mb(config, "run", [cell])


# ----------------------------------------------------------------------------- a site's limits
@dataclass(frozen=True)
class SiteLimits:
    """What a site allows an engine job (``site`` in the config; ``None`` fields: no limit)."""

    partition: str
    max_runtime: int | None
    gpus_per_node: int | None
    attempts: int = 1  # how many times a job may run (the profile's retries + 1)

    @property
    def budget(self) -> int | None:
        """The estimate (minutes) an engine job may have: :data:`SITE_MARGIN` of the limit."""
        return None if self.max_runtime is None else int(SITE_MARGIN * self.max_runtime)

    @property
    def reach(self) -> int | None:
        """The most minutes a resumable job can get: the limit times its attempts (a killed cell
        resumes from its progress, :mod:`sdbench.engine.progress`)."""
        return None if self.max_runtime is None else self.max_runtime * self.attempts


def _partition_number(entry: dict[str, Any], key: str) -> int | None:
    # Values may be strings: ``--config site={...}`` parses nested YAML without types.
    return int(entry[key]) if entry.get(key) not in (None, "") else None


def site_limits(config: dict[str, Any]) -> SiteLimits | None:
    """The engine partition's limits of ``config["site"]`` (``None`` without a site block)."""
    from sdbench.config import ConfigError

    site = config.get("site")
    if not site:
        return None
    name = str(site["engine_partition"])
    partitions = site.get("partitions") or {}
    if name not in partitions:
        raise ConfigError(
            f"site.engine_partition: partition {name!r} has no entry in site.partitions "
            f"(defined: {', '.join(sorted(partitions)) or 'none'})"
        )
    entry = partitions[name] or {}
    return SiteLimits(name, _partition_number(entry, "max_runtime"), _partition_number(entry, "gpus_per_node"),
                      _partition_number(site, "attempts") or 1)  # fmt: skip


@dataclass(frozen=True)
class Split:
    """How one engine group was split to fit the site's limit (:func:`split_to_fit`)."""

    group: str  # engine/model/method/share of the unsplit group
    estimate: int  # its estimate, minutes
    parts: tuple[tuple[str, int], ...]  # (share, estimate) of each part
    oversized: tuple[tuple[str, int], ...]  # (cell, estimate) of single cells beyond the limit

    def describe(self, limits: SiteLimits) -> str:
        """One line: the split, its parts' estimates, and which parts are single cells that cannot
        fit even alone (marked ``*``: each runs in a job of its own that asks for the limit)."""
        parts = ", ".join(f"{share} ({minutes:,}{'*' if minutes > limits.budget else ''})" for share, minutes in self.parts)
        line = (
            f"site: engine group {self.group} (estimated {self.estimate:,} min > {limits.budget:,} = "
            f"{SITE_MARGIN:.0%} of partition {limits.partition}'s {limits.max_runtime:,}) split into "
            f"{len(self.parts)} jobs: {parts}"
        )
        if self.oversized:
            line += (
                f"; * {len(self.oversized)} single cell(s) estimated beyond {limits.budget:,} min: each runs "
                f"alone in a job asking for the limit, {limits.max_runtime:,} min"
            )
        return line


def split_to_fit(
    config: dict[str, Any],
    groups: dict[Any, list[Cell]],
    estimate: Callable[[dict[str, Any], list[Cell]], int],
) -> tuple[dict[Any, list[Cell]], list[Split]]:
    """Engine groups split until each one's ``estimate`` fits the site's budget.

    A group over the budget (:attr:`SiteLimits.budget`) becomes one group per dataset
    (share ``<share>.<dataset>``); a dataset still over it is cut into runs of consecutive
    batch sizes, each as long as fits (``<share>.<dataset>.bs<lo>-<hi>``, ``.bs<n>`` for one).
    A cell over the budget on its own gets a group of its own and is named in the split's
    ``oversized``. Without a site limit the groups are returned unchanged.
    """
    limits = site_limits(config)
    if limits is None or limits.budget is None:
        return groups, []
    budget = limits.budget
    out: dict[Any, list[Cell]] = {}
    splits: list[Split] = []
    for group, cells_ in groups.items():
        total = estimate(config, cells_)
        if total <= budget:
            out[group] = cells_
            continue
        parts: list[tuple[str, list[Cell]]] = []
        oversized: list[tuple[str, int]] = []
        for dataset in sorted({c.dataset for c in cells_}):
            mine = sorted((c for c in cells_ if c.dataset == dataset), key=lambda c: c.batch_size)
            name = f"{group.share}.{dataset}"
            if estimate(config, mine) <= budget:
                parts.append((name, mine))
                continue
            runs: list[list[Cell]] = []
            for cell in mine:
                if runs and estimate(config, [*runs[-1], cell]) <= budget:
                    runs[-1].append(cell)
                else:
                    runs.append([cell])
            for run in runs:
                lo, hi = run[0].batch_size, run[-1].batch_size
                parts.append((f"{name}.bs{lo}" + (f"-{hi}" if hi != lo else ""), run))
                alone = estimate(config, run)
                if len(run) == 1 and alone > budget:
                    c = run[0]
                    oversized.append((f"{c.engine}/{c.model}/{c.dataset}/{c.method}/bs{c.batch_size}", alone))
        for share, part in parts:
            out[type(group)(group.engine, group.model, group.method, share)] = part
        key = f"{group.engine}/{group.model}/{group.method}/{group.share}"
        splits.append(
            Split(key, total, tuple((s, estimate(config, p)) for s, p in parts), tuple(oversized))
        )
    return dict(sorted(out.items())), splits


def unfinishable(limits: SiteLimits, splits: list[Split], unsplit: list[tuple[str, int]]) -> list[str]:
    """What cannot finish at the site, one line each: a single cell whose estimate is past the limit
    times the attempts (it resumes from its progress after each kill), and a trace or server group
    (``unsplit``: (name, estimate); neither resumes) past one limit."""
    if limits.max_runtime is None:
        return []
    out = [f"cell {cell} (estimated {minutes:,} min) cannot finish in {limits.attempts} attempt(s) of "
           f"{limits.max_runtime:,} min (site.attempts x partition {limits.partition}'s max_runtime)"
           for split in splits for cell, minutes in split.oversized if minutes > (limits.reach or 0)]  # fmt: skip
    out += [f"{name} (estimated {minutes:,} min) cannot finish in one job of {limits.max_runtime:,} min: it does "
            "not resume" for name, minutes in unsplit if minutes > limits.max_runtime]  # fmt: skip
    return out


def site_problems(config: dict[str, Any], cells: list[Cell]) -> list[str]:
    """Cells a site cannot run: a CUDA target sharded over more GPUs than a node of the engine
    partition has (one engine stays on one node)."""
    limits = site_limits(config)
    if limits is None or limits.gpus_per_node is None:
        return []
    wide = sorted({(c.model, cell_gpus(config, c)) for c in cells if cell_gpus(config, c) > limits.gpus_per_node})
    return [
        f"site: model {model!r} needs {gpus} GPUs (tensor_parallel_size) but a node of partition "
        f"{limits.partition} has {limits.gpus_per_node} (site.partitions.{limits.partition}.gpus_per_node)"
        for model, gpus in wide
    ]


# ----------------------------------------------------------------------------- every engine job of a plan
@dataclass(frozen=True)
class EngineJob:
    """One engine job of a plan: its rule and wildcards, GPUs, host memory, estimate and request."""

    rule: str
    wildcards: dict[str, str]
    gpus: int
    mem_mb: int
    estimate: JobEstimate
    runtime: int  # first attempt, within the site's limit

    def row(self) -> dict[str, Any]:
        """A flat row: rule, wildcards, gpus, mem_mb, each part in minutes, runtime."""
        parts = {f"{k}_min" if k not in ("trials", "minutes") else k: v
                 for k, v in self.estimate.parts_minutes().items()}  # fmt: skip
        return {"rule": self.rule, **self.wildcards, "gpus": self.gpus, "mem_mb": self.mem_mb, **parts,
                "runtime": self.runtime}  # fmt: skip


def engine_jobs(plan: Any) -> list[EngineJob]:
    """Every engine job of a plan (:class:`sdbench.workflow.plan.Plan`) with what it asks, as the
    workflow's resource functions compute it: run, breakdown, trace and server groups."""
    config = plan.config
    kinds: list[tuple[str, str, Any, list[Cell]]] = [
        *(("run_engine", "run", g, cs) for g, cs in plan.groups.items()),
        *(("breakdown_group", "breakdown", g, cs) for g, cs in plan.breakdown_groups.items()),
        *(("trace_group", "trace", g, plan.trace_cells(g)) for g in plan.trace_groups),
        *(("serve_group", "server", g, [plan.server_cell(g)]) for g in plan.server_groups),
    ]
    jobs = []
    for rule, kind, group, cells_ in kinds:
        est = estimate_breakdown(config, kind, cells_)
        sizing = max(cells_, key=lambda c: c.batch_size)
        jobs.append(EngineJob(rule, dict(group.as_dict()), cell_gpus(config, sizing), job_mem_mb(config, kind, cells_),
                              est, _capped(config, est.minutes, 1)))  # fmt: skip
    return jobs


def engine_jobs_table(jobs: list[EngineJob], limit: int | None) -> list[str]:
    """:func:`engine_jobs` as a tab-separated table (header first) and a totals line: jobs,
    how many ask the site's full limit, GPU-hours asked at the first attempt."""
    header = ["rule", "job", "gpus", "mem_mb", "startup", "warmup", "prefill", "decode", "calls", "trials",
              "expected", "estimate", "runtime"]  # fmt: skip
    lines = ["\t".join(header)]
    for job in jobs:
        p = job.estimate.parts_minutes()
        name = "/".join(job.wildcards.values())
        lines.append("\t".join([job.rule, name, str(job.gpus), str(job.mem_mb),
                                *(f"{p[k]:.1f}" for k in ("startup", "warmup", "prefill", "decode", "call")),
                                f"{p['trials']:.1f}", f"{p['expected']:.1f}", str(job.estimate.minutes),
                                str(job.runtime)]))  # fmt: skip
    full = sum(limit is not None and j.runtime >= limit for j in jobs)
    hours = sum(j.runtime * max(j.gpus, 1) for j in jobs) / 60
    device = "GPU" if any(j.gpus for j in jobs) else "device"
    cap = f"the full limit ({limit} min)" if limit is not None else "the full limit (no site limit)"
    lines.append(f"engine jobs: {len(jobs)}; asking {cap}: {full}; "
                 f"{device}-hours asked at the first attempt: {hours:,.0f}")  # fmt: skip
    return lines


# ----------------------------------------------------------------------------- analysis jobs
@dataclass(frozen=True)
class Reads:
    """What an analysis job reads from its inputs: table rows and token ids, and the bytes each
    takes in memory (rows x :data:`ROW_BYTES` or :data:`TRACE_ROW_BYTES`; token ids x
    :data:`ARROW_TOKEN_BYTES` or, parsed from JSON, x :data:`PY_TOKEN_BYTES`)."""

    rows: int = 0
    tokens: int = 0
    row_bytes: int = 0
    token_bytes: int = 0

    @property
    def nbytes(self) -> int:
        return self.row_bytes + self.token_bytes

    def __add__(self, other: Reads) -> Reads:
        return Reads(self.rows + other.rows, self.tokens + other.tokens, self.row_bytes + other.row_bytes,
                     self.token_bytes + other.token_bytes)  # fmt: skip


def _reads(rows: float, tokens: float = 0, token_bytes: int = ARROW_TOKEN_BYTES, row_bytes: int = ROW_BYTES) -> Reads:
    rows, tokens = int(math.ceil(rows)), int(math.ceil(tokens))
    return Reads(rows, tokens, rows * row_bytes, tokens * token_bytes)


def _trace_rows(rows: float) -> Reads:
    return _reads(rows, row_bytes=TRACE_ROW_BYTES)


def _regex(template: str) -> re.Pattern[str]:
    """A path template of :mod:`sdbench.workflow.paths` as a regex of its wildcards."""
    parts = re.split(r"\{(\w+)\}", template)
    body = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+?)" for i, p in enumerate(parts))
    return re.compile(body + "$")


@functools.lru_cache(maxsize=1)
def _input_patterns() -> tuple[tuple[str, re.Pattern[str]], ...]:
    from sdbench.workflow import paths as P

    named = {
        "cell": P.CELL_TABLE, "breakdown": P.BREAKDOWN_DIR + "/{name}.parquet", "engine_trace": P.ENGINE_TRACE,
        "engine_requests": P.ENGINE_REQUESTS, "offline": P.TRACE_DIR + "/offline_{tracer}.parquet",
        "published_jsonl": P.PUBLISHED_JSONL, "published_trace": P.PUBLISHED_TRACE, "prompts": P.PROMPTS,
        "stacked": P.SIM_STACKED, "server": P.SERVER_GROUP_DIR, "cells": P.CELLS_TABLE,
        "grid_cells": P.GRID_CELLS_TABLE, "buckets": P.BLEU_BUCKETS,
    }  # fmt: skip
    return tuple((name, _regex(t)) for name, t in named.items())


# The published traces (sdbench fetch published-traces): requests, mean prompt and output tokens.
# gsm8k and instructcoder counted in the published files; sharegpt and cnn
# are held out here: config/paper.yaml's request counts and allowances, outputs at the 8K cap.
PUBLISHED_TRACES = {"gsm8k": (300, 95, 167), "instructcoder": (500, 172, 262), "sharegpt": (500, 1024, 8192),
                    "cnn": (500, 1100, 8192)}  # fmt: skip


def _dataset_shape(config: dict[str, Any], dataset: str) -> tuple[int, int, int]:
    """(requests, prompt tokens, output tokens) a dataset's tables have per cell or trace."""
    return (_num_prompts(config, dataset, config.get("run", {})), prompt_tokens(config, dataset),
            output_tokens(config, dataset))  # fmt: skip


def _cell_of(config: dict[str, Any], w: dict[str, str]) -> Cell | None:
    try:
        cell = Cell(w["engine"], w["model"], w["dataset"], w["method"], int(w["batch_size"]))
    except (KeyError, ValueError):
        return None
    return cell if cell.dataset in config["datasets"] and cell.method in config["methods"] else None


def input_reads(config: dict[str, Any], path: str, num_cells: int = 0) -> Reads:
    """What an analysis job reads from ``path`` (an input of the plan), from the config alone:

    - a cell's ``requests``: :func:`request_rows` rows and the output ids it stores
      (:func:`stored_output_tokens`);
      ``calls`` / ``baseline_calls``: one row per call and trial (the trial bound); ``summary``: one;
      a breakdown cell's ``steps``: one row per engine step of every trial;
    - an in-engine trace / offline trace: one row per request and output position; a trace
      group's requests: one row per request with its prompt and output token ids;
    - a published JSONL (parsed into Python ints): prompt, output and two acceptance arrays per request
      (:data:`PUBLISHED_TRACES`); its trace table: a row per position of both methods;
    - a prompt table: one row per prompt with its token ids; a stacked simulator trace: four traces
      of the dataset; a server group: one row per served request;
    - ``cells.parquet`` / ``grid_cells.parquet``: ``num_cells`` rows;
    - anything else (figures' small tables, cost models, simulator results): nothing counted.
    """
    for name, pattern in _input_patterns():
        m = pattern.match(str(path))
        if m is None:
            continue
        w = m.groupdict()
        if name in ("cells", "grid_cells"):
            return _reads(num_cells)
        if name == "server":
            return _server_reads(config)
        if name in ("published_jsonl", "published_trace"):
            n, p, o = PUBLISHED_TRACES.get(w["published"], (500, DEFAULT_PROMPT_TOKENS, 8192))
            if name == "published_jsonl":  # parsed into Python ints
                return _reads(n, n * (p + 3 * o), PY_TOKEN_BYTES)
            return _trace_rows(2 * n * (o + 1))
        if w.get("dataset") not in config["datasets"]:
            return Reads()
        n, p, o = _dataset_shape(config, w["dataset"])
        if name in ("engine_trace", "offline"):
            return _trace_rows(n * (o + 1))
        if name == "stacked":
            return _trace_rows(4 * n * (o + 1))
        if name == "engine_requests":
            return _reads(n, n * (p + o))
        if name == "prompts":
            return _reads(n, n * p)
        if name == "buckets":
            return _reads(n)
        cell = _cell_of(config, w)
        if cell is None:
            return Reads()
        table = w.get("name")
        if table == "requests":
            return _reads(request_rows(config, cell), stored_output_tokens(config, cell))
        if table in ("calls", "baseline_calls", "steps"):
            run = _cell_run(config, cell)
            if name == "breakdown":
                from sdbench.grid import resolve_breakdown_cell

                run = resolve_breakdown_cell(config, cell)["run"]
            est = cell_estimate(config, cell, run)
            calls = n if run.get("batch_mode", "replicate") == "replicate" else 1
            per_call = math.ceil(o / SD_TOKENS_PER_STEP) if table == "steps" else 1
            return _reads(calls * per_call * est.trials)
        return _reads(1)
    return Reads()


def _server_reads(config: dict[str, Any]) -> Reads:
    """A server group's tables: one row per served request of every dataset and level."""
    section = config["server"]
    per_level = int(section.get("warmup_requests", 2)) + int(section.get("rounds", 2)) * int(
        section.get("requests_per_level", 16)
    )
    return _reads(per_level * len(section["concurrency"]) * len(section["datasets"]))


def total_reads(config: dict[str, Any], paths: Iterable[str], num_cells: int = 0, streamed: bool = False) -> Reads:
    """:func:`input_reads` of every path, added up: what a job holds that reads every input into
    memory. ``streamed``: a job that reads its inputs one at a time and keeps their rows but not
    their token ids holds every row and the largest input's token ids."""
    reads = [input_reads(config, p, num_cells) for p in paths]
    total = sum(reads, Reads())
    if streamed and reads:
        return replace(total, token_bytes=max(r.token_bytes for r in reads))
    return total


def parsed(reads: Reads) -> Reads:
    """``reads`` held as Python ints (:data:`PY_TOKEN_BYTES` a token id): a job that lists them."""
    return replace(reads, token_bytes=reads.tokens * PY_TOKEN_BYTES)


def _analysis_cap(config: dict[str, Any]) -> int:
    """The longest runtime any partition of the site allows (an analysis job may go to any of them;
    the shortest limit), else :data:`MAX_MINUTES`."""
    site = config.get("site") or {}
    limits = [_partition_number(entry or {}, "max_runtime") for entry in (site.get("partitions") or {}).values()]
    return min([MAX_MINUTES, *(x for x in limits if x is not None)])


def analysis_mem_mb(reads: Reads) -> int:
    """Host memory (MB) of an analysis job reading ``reads``: :data:`ANALYSIS_BASE_MB` and
    :data:`CONCAT_COPIES` copies of what it reads."""
    return _mem_mb(CONCAT_COPIES * reads.nbytes, ANALYSIS_BASE_MB)


# A job that streams its inputs file by file (sdbench aggregate): per cell it keeps its keys and
# lengths (50 KB, an allowance over the 0.15 GiB + 50 KB per cell measured on the paper grid's
# 786 cells: docs/results/2026-11-27-aggregate-memory.md), and at most this many copies of one file.
STREAMED_CELL_BYTES = 50_000
STREAMED_FILE_COPIES = 5


def streamed_mem_mb(config: dict[str, Any], paths: Iterable[str], num_cells: int) -> int:
    """Host memory (MB) of a job that reads its inputs one at a time (``aggregate``): what it keeps
    per cell (:data:`STREAMED_CELL_BYTES`) and :data:`STREAMED_FILE_COPIES` copies of its largest input."""
    largest = max((input_reads(config, p, num_cells).nbytes for p in paths), default=0)
    return _mem_mb(num_cells * STREAMED_CELL_BYTES + STREAMED_FILE_COPIES * largest, ANALYSIS_BASE_MB)


def analysis_runtime_minutes(config: dict[str, Any], reads: Reads, attempt: int = 1, passes: int = 1) -> int:
    """Wall time (minutes) of an analysis job reading ``reads``, ``passes`` times over (a simulation:
    one pass per policy and batch size): :data:`ANALYSIS_BASE_S` plus its rows and token ids at
    :data:`ANALYSIS_ROWS_PER_S` / :data:`ANALYSIS_TOKENS_PER_S`, :data:`SAFETY` times, at least
    :data:`MIN_MINUTES`, times the attempt, within the shortest partition limit of the site."""
    seconds = ANALYSIS_BASE_S + passes * (reads.rows / ANALYSIS_ROWS_PER_S + reads.tokens / ANALYSIS_TOKENS_PER_S)
    first = max(MIN_MINUTES, math.ceil(SAFETY * seconds / 60))
    return int(min(_analysis_cap(config), first * max(1, attempt)))
