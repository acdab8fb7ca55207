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
request, and :func:`sdbench.schedulingsite.split_to_fit` splits engine groups until each fits.

Two rooms beside this one use its estimates: :mod:`sdbench.schedulingsite` splits engine groups to
fit a site and lists a plan's engine jobs (``sdbench plan --jobs``); :mod:`sdbench.schedulinganalysis`
sizes **analysis jobs** from the rows and token ids their inputs hold, which the plan knows before
any of them exists. This module keeps every constant of the estimates.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

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
# vLLM 0.10.1.1; tests/workflow/test_scheduling.py checks these against the shipped YAML): c_fixed,
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
    """Trials (in units of one trial of every arm) the stopping rule (``sdbench.engine.measure.trials``) can
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
    """A server job (sdbench.servermode) whose largest cell is ``cell``: per arm (``cell``'s method,
    or with ``server.interleave`` every method of the section) ``starts`` server starts (the job's
    first its ``startup_timeout_s`` if longer than the device's usual start), then per dataset and
    concurrency level c, ``warmup_requests`` per start + ``rounds x requests_per_level`` requests (and a
    ``stream_control`` level one round more per start), c in flight, each its own call decoding the
    dataset's expected output."""
    from sdbench.servermode import server_settings

    section = config["server"]
    rounds, starts, interleave, control = server_settings(section)
    arms = list(section["methods"]) if interleave else [cell.method]
    per_round = int(section.get("requests_per_level", 16))
    work = Work()
    for method in arms:
        for name in section["datasets"]:
            for level in section["concurrency"]:
                requests = starts * int(section.get("warmup_requests", 2)) + (
                    rounds + starts * (int(level) in control)) * per_round  # fmt: skip
                served = _generate(config, cell.engine, cell.model, method, sequences=requests, running=int(level),
                                   prompt=prompt_tokens(config, name), output=output_tokens(config, name))  # fmt: skip
                work += replace(served, call_s=requests * _costs(config, cell.engine).call_s)  # a call per request
    usual = _costs(config, cell.engine).startup_min * 60
    servers = starts * len(arms)
    # The first start may take its whole timeout (cold caches); the others start as the device usually does.
    startup = max(usual, float(section.get("startup_timeout_s", 0))) + (servers - 1) * usual
    return JobEstimate("server", servers, startup, 0.0, work.prefill_s, work.decode_s, work.call_s, 1.0)


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
        arms = len(section["methods"]) if section.get("interleave") else 1  # an interleaved job holds every arm's
        return _mem_mb(arms * held, base)
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
        resumes from its progress, :mod:`sdbench.engine.measure.progress`)."""
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
