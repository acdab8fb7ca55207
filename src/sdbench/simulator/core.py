"""Trace-replay simulator of speculative-decoding speedup (paper Sec. 8, Fig. 9 and 11).

Requests replay per-position acceptance traces (published JSONL or trace tables) under a proposal
policy (:mod:`sdbench.simulator.policies`); steps are priced with a cost model
(:mod:`sdbench.simulator.costmodel`, :mod:`sdbench.simulator.pricing`).

Modes:

- ``compat`` reproduces the published simulator (SpecDecode-Bench/simulator ``main.py`` and
  ``simulator.py``) number for number: 300 requests drawn with Python's ``random`` seeded 42, each
  batch one request replicated batch-size times, prefill then lock-step decode, batch throughput
  = tokens / mean request latency, speedup = mean SD throughput / mean baseline throughput, its
  random n-gram "no match" model (Mersenne Twister draws consumed in its order) and its quirks
  (see :class:`sdbench.simulator.policytypes.Fidelity`, :mod:`sdbench.simulator.compat`);
- ``exact`` (default) corrects those quirks: true n-gram proposal lengths from the offline
  tracer, trace positions aligned with the tokens generated, each step charged the drafter it
  used, drafting priced per batch step. It also offers continuous batching of distinct requests.

This module runs a simulation (:func:`simulate`); the modules beside it hold the pieces: trace
sets (:mod:`~sdbench.simulator.tracesets`), pricing, the reports and figures built on
simulations (:mod:`~sdbench.simulator.reports`, :mod:`~sdbench.simulator.figures`) and the
commands (:mod:`~sdbench.simulator.commands`).
"""


from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sdbench import provenance
from sdbench.io import atomic_path
from sdbench.simulator.causal import CausalPolicy
from sdbench.simulator.compat import COMPAT_NGRAM_MATCH_PROBABILITY, COMPAT_NUM_REQUESTS, COMPAT_SEED, sample_requests
from sdbench.simulator.costmodel import CostModel
from sdbench.simulator.policies import make_policy
from sdbench.simulator.policytypes import (
    COMPAT,
    DRAFT,
    EXACT,
    NGRAM,
    PROPOSERS,
    Fidelity,
    PolicyContext,
    TraceArrays,
    Trajectories,
)
from sdbench.simulator.powermodel import NO_POWER_MODEL_GIVEN, PowerModel
from sdbench.simulator.pricing import (
    baseline_trajectories,
    continuous_energy,
    continuous_makespan,
    replicated_energy,
    replicated_latency,
)
from sdbench.simulator.tracesets import NGRAM_METHOD, TraceSet, draft_method_of, trace_arrays, with_ngram_proposals

DEFAULT_BATCH_SIZES: tuple[int, ...] = (1, 8, 16, 32, 64, 128)
PAPER_POLICIES: tuple[str, ...] = ("fixed-1", "fixed-3", "fixed-5", "oracle")
MODES: dict[str, Fidelity] = {"compat": COMPAT, "exact": EXACT}
BATCHING = ("replicated", "continuous")
RESULT_COLUMNS: tuple[str, ...] = (
    "dataset",
    "proposer",
    "policy",
    "batch_size",
    "mode",
    "batching",
    "cost_model",
    "cost_model_sha256",
    "num_requests",
    "speedup",
    "baseline_tokens_per_s",
    "sd_tokens_per_s",
    "tokens_per_step",
    "ngram_step_share",
    "draft_step_share",
    "baseline_tokens_per_j",
    "sd_tokens_per_j",
    "energy_ratio",
    "power_model",
)
# A simulate CSV: RESULT_COLUMNS with the replayed drafter after the proposer, and for the grid's
# own traces the engine and model first (sdbench simulate --engine --model).
WRITTEN_COLUMNS: tuple[str, ...] = ("engine", "model", *RESULT_COLUMNS[:2], "drafter", *RESULT_COLUMNS[2:])


@dataclass(frozen=True)
class Prepared:
    """A trace set prepared for one proposer: the sampled requests and their arrays."""

    dataset: str
    proposer: str
    draft_method: str
    arrays: TraceArrays
    rng_state: tuple


def prepare(
    ts: TraceSet,
    proposer: str,
    *,
    drafter: str | None = None,
    num_requests: int = COMPAT_NUM_REQUESTS,
    seed: int = COMPAT_SEED,
    ngram_proposals: bool = True,
) -> Prepared:
    """Sample the requests of ``ts`` and build their arrays (tracing n-gram drafts if asked)."""
    if proposer not in PROPOSERS:
        raise ValueError(f"unknown proposer {proposer!r} (choose from {', '.join(PROPOSERS)})")
    draft_method = draft_method_of(ts, drafter) if proposer != NGRAM_METHOD else (drafter or "eagle")
    indices, state = sample_requests(ts, proposer, draft_method, num_requests, seed)
    if ngram_proposals and proposer != "eagle":
        ts = with_ngram_proposals(ts)
    return Prepared(ts.dataset, proposer, draft_method, trace_arrays(ts, indices, proposer, draft_method), state)


def simulate_prepared(
    prep: Prepared,
    policies: Sequence[str],
    batch_sizes: Sequence[int],
    cm: CostModel,
    fidelity: Fidelity,
    *,
    batching: str = "replicated",
    mode: str = "",
    train: Sequence[TraceArrays] = (),
    match_probability: float | None = None,
    power: PowerModel | None = None,
    no_power: str = NO_POWER_MODEL_GIVEN,
) -> pd.DataFrame:
    """Speedup of each policy at each batch size (one row each, :data:`RESULT_COLUMNS`).

    With a ``power`` model, the energy bound beside it: output tokens per joule with and without
    SD (averaged as tokens/s are: over the requests of a replicated batch, all tokens over the
    whole energy with continuous batching), each step's seconds as the time bound prices them
    times the power of the tokens it batches; ``energy_ratio`` = SD's joules per output token over
    no SD's. Without one they are NaN and ``power_model`` says why (``no_power``).
    """
    if batching not in BATCHING:
        raise ValueError(f"unknown batching {batching!r} (choose from {', '.join(BATCHING)})")
    if batching == "continuous" and fidelity != EXACT:
        raise ValueError("continuous batching is only simulated in exact mode")
    if any(int(b) < 1 for b in batch_sizes):
        raise ValueError(f"batch sizes must be >= 1, got {list(batch_sizes)}")
    arrays = prep.arrays
    digest = cm.digest()  # which cost model priced the rows (its name alone can be shared by two files)
    if match_probability is None:
        match_probability = COMPAT_NGRAM_MATCH_PROBABILITY.get(prep.dataset)
    tokens = arrays.length.astype(float)
    base = baseline_trajectories(arrays)

    def price(traj: Trajectories, bs: Sequence[int], proposer: str | None = prep.proposer) -> np.ndarray:
        """Throughput (tokens/s) at each batch size in ``bs``."""
        if batching == "continuous":
            return np.array(
                [tokens.sum() / continuous_makespan(traj, arrays, cm, prep.draft_method, int(b)) for b in bs]
            )
        lat = replicated_latency(
            traj, arrays, proposer, cm, fidelity, prep.draft_method, bs, prep.rng_state, match_probability
        )
        return (tokens[:, None] * np.asarray(bs, float)[None, :] / lat).mean(axis=0)

    def energy(traj: Trajectories, bs: Sequence[int], proposer: str | None = prep.proposer) -> np.ndarray:
        """Output tokens per joule at each batch size in ``bs`` (NaN without a power model)."""
        if power is None:
            return np.full(len(bs), np.nan)
        if batching == "continuous":
            return np.array(
                [tokens.sum() / continuous_energy(traj, arrays, cm, prep.draft_method, int(b), power) for b in bs]
            )
        joules = replicated_energy(
            traj, arrays, proposer, cm, fidelity, prep.draft_method, bs, power, prep.rng_state, match_probability
        )
        return (tokens[:, None] * np.asarray(bs, float)[None, :] / joules).mean(axis=0)

    base_tpt = price(base, batch_sizes, None)
    base_tpj = energy(base, batch_sizes, None)
    rows = []
    for name in policies:
        policy = make_policy(name, prep.proposer, fidelity)
        if isinstance(policy, CausalPolicy):
            policy.train(train, PolicyContext(prep.proposer, 1, cm, prep.draft_method))
        if policy.batch_dependent:
            trajs = [
                policy.trajectories(arrays, PolicyContext(prep.proposer, int(b), cm, prep.draft_method), fidelity)
                for b in batch_sizes
            ]
            sd_tpt = np.array([price(tr, [b])[0] for tr, b in zip(trajs, batch_sizes)])
            sd_tpj = np.array([energy(tr, [b])[0] for tr, b in zip(trajs, batch_sizes)])
        else:
            traj = policy.trajectories(arrays, PolicyContext(prep.proposer, 1, cm, prep.draft_method), fidelity)
            if traj.rng is not None and traj.rng.any() and match_probability is None:
                raise ValueError(
                    f"dataset {prep.dataset!r} has no compat n-gram match probability "
                    f"(known: {', '.join(COMPAT_NGRAM_MATCH_PROBABILITY)}); pass --compat-match-probability"
                )
            trajs = [traj] * len(batch_sizes)
            sd_tpt = price(traj, batch_sizes)
            sd_tpj = energy(traj, batch_sizes)
        for j, b in enumerate(batch_sizes):
            tr = trajs[j]
            steps = max(tr.num_steps, 1)
            rows.append(
                {
                    "dataset": prep.dataset,
                    "proposer": prep.proposer,
                    "policy": name,
                    "batch_size": int(b),
                    "mode": mode,
                    "batching": batching,
                    "cost_model": cm.name,
                    "cost_model_sha256": digest,
                    "num_requests": arrays.num_requests,
                    "speedup": sd_tpt[j] / base_tpt[j],
                    "baseline_tokens_per_s": base_tpt[j],
                    "sd_tokens_per_s": sd_tpt[j],
                    "tokens_per_step": float(tr.emitted.sum()) / steps,
                    "ngram_step_share": float((tr.drafter == NGRAM).sum()) / steps,
                    "draft_step_share": float((tr.drafter == DRAFT).sum()) / steps,
                    "baseline_tokens_per_j": base_tpj[j],
                    "sd_tokens_per_j": sd_tpj[j],
                    "energy_ratio": base_tpj[j] / sd_tpj[j],
                    "power_model": no_power if power is None else power.label(),
                }
            )
    from sdbench.columns import conform

    return conform(pd.DataFrame(rows), RESULT_COLUMNS, "simulation")


def sort_results(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in a deterministic order: dataset, proposer, policy, batch size (then the rest)."""
    keys = [c for c in ("dataset", "proposer", "policy", "batch_size", "mode", "batching") if c in df]
    return df.sort_values(keys, kind="stable").reset_index(drop=True)


def simulate(
    trace_sets: Sequence[TraceSet],
    proposer: str,
    policies: Sequence[str],
    batch_sizes: Sequence[int],
    cost_model: CostModel,
    mode: str = "exact",
    *,
    batching: str = "replicated",
    num_requests: int = COMPAT_NUM_REQUESTS,
    seed: int = COMPAT_SEED,
    drafter: str | None = None,
    train_sets: Sequence[TraceSet] | None = None,
    match_probability: float | None = None,
    power: PowerModel | None = None,
    no_power: str = NO_POWER_MODEL_GIVEN,
) -> pd.DataFrame:
    """Simulate ``policies`` of ``proposer`` on every trace set; sorted result rows (with the
    energy bound where a ``power`` model is given, see :func:`simulate_prepared`).

    Trained policies (``learned``) train on ``train_sets`` if given, else on the other trace
    sets (never on the one evaluated).
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} (choose from {', '.join(MODES)})")
    fidelity = MODES[mode]
    for name in policies:  # fail before any work on a bad policy name
        make_policy(name, proposer, fidelity)
    if fidelity.true_ngram_proposals and proposer != "eagle":  # trace n-gram drafts once per set
        trace_sets = [with_ngram_proposals(ts) for ts in trace_sets]
        train_sets = None if train_sets is None else [with_ngram_proposals(ts) for ts in train_sets]
    frames = []
    for ts in trace_sets:
        prep = prepare(
            ts,
            proposer,
            drafter=drafter,
            num_requests=num_requests,
            seed=seed,
            ngram_proposals=fidelity.true_ngram_proposals,
        )
        train = _training_arrays(ts, trace_sets, train_sets, proposer, drafter, policies, fidelity, num_requests)
        frames.append(
            simulate_prepared(
                prep,
                policies,
                batch_sizes,
                cost_model,
                fidelity,
                batching=batching,
                mode=mode,
                train=train,
                match_probability=match_probability,
                power=power,
                no_power=no_power,
            )
        )
    return sort_results(pd.concat(frames, ignore_index=True))


def _training_arrays(
    ts: TraceSet,
    all_sets: Sequence[TraceSet],
    train_sets: Sequence[TraceSet] | None,
    proposer: str,
    drafter: str | None,
    policies: Sequence[str],
    fidelity: Fidelity,
    num_requests: int = 0,
) -> list[TraceArrays]:
    """Training arrays for trained policies: ``train_sets``, else the trace sets other than ``ts``."""
    needs = [p for p in policies if getattr(make_policy(p, proposer, fidelity), "needs_training", False)]
    if not needs:
        return []
    pool = list(train_sets) if train_sets is not None else [o for o in all_sets if o.dataset != ts.dataset]
    if not pool:
        raise ValueError(f"policy {needs[0]!r} trains on other datasets: pass --train-traces or several --traces")
    return [prepare(o, proposer, drafter=drafter, num_requests=num_requests).arrays for o in pool]


def write_results(df: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """Write result rows as CSV atomically (fixed float format, so reruns are byte-identical),
    with their ``measured`` column in an analysis command (:func:`sdbench.provenance.stamp`)."""
    df = provenance.stamp(df)
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False, float_format="%.6f")
