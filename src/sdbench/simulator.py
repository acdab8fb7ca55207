"""Trace-replay simulator of speculative-decoding speedup (paper Sec. 8, Fig. 9 and 11).

Requests replay per-position acceptance traces (published JSONL or trace tables) under a proposal
policy (:mod:`sdbench.policies`); steps are priced with a cost model (:mod:`sdbench.costmodel`).

Modes:

- ``compat`` reproduces the published simulator (SpecDecode-Bench/simulator ``main.py`` and
  ``simulator.py``) number for number: 300 requests drawn with Python's ``random`` seeded 42, each
  batch one request replicated batch-size times, prefill then lock-step decode, batch throughput
  = tokens / mean request latency, speedup = mean SD throughput / mean baseline throughput, its
  random n-gram "no match" model (Mersenne Twister draws consumed in its order) and its quirks
  (see :class:`sdbench.policies.Fidelity`);
- ``exact`` (default) corrects those quirks: true n-gram proposal lengths from the offline
  tracer, trace positions aligned with the tokens generated, each step charged the drafter it
  used, drafting priced per batch step. It also offers continuous batching of distinct requests.

A replicated batch is simulated once (its copies are identical, or for the random n-gram model
differ only in how many tokens they verify), and a request's latency is linear in the batch size
for a batch-independent policy, so all batch sizes are priced from per-request sums at once.
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from sdbench import published
from sdbench.costmodel import CostModel, load_cost_model
from sdbench.io import atomic_path, write_text
from sdbench.policies import (
    COMPAT,
    DRAFT,
    EXACT,
    NGRAM,
    NONE,
    PROPOSERS,
    CausalPolicy,
    Fidelity,
    PolicyContext,
    TraceArrays,
    Trajectories,
    make_policy,
)

NGRAM_METHOD = "ngram"
DEFAULT_BATCH_SIZES: tuple[int, ...] = (1, 8, 16, 32, 64, 128)
COMPAT_NUM_REQUESTS = 300
COMPAT_SEED = 42
# The published simulator's probability that n-gram "matches" where nothing gets accepted.
COMPAT_NGRAM_MATCH_PROBABILITY: dict[str, float] = {"sharegpt": 0.2, "cnn": 0.4, "gsm8k": 0.2, "instructcoder": 0.8}
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
    "num_requests",
    "speedup",
    "baseline_tokens_per_s",
    "sd_tokens_per_s",
    "tokens_per_step",
    "ngram_step_share",
    "draft_step_share",
)


# ----------------------------------------------------------------------------- traces
@dataclass(frozen=True)
class RequestTrace:
    """One request: prompt length and, per method, ``acc_len`` (and n-gram draft lengths when
    known) per output position; token ids when the source has them (to trace n-gram)."""

    request_id: str
    prompt_len: int
    acc: dict[str, np.ndarray]
    proposed: dict[str, np.ndarray]
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] | None = None


@dataclass(frozen=True)
class TraceSet:
    """The requests of one dataset, in source order."""

    dataset: str
    source: str
    requests: tuple[RequestTrace, ...]

    @property
    def methods(self) -> tuple[str, ...]:
        """Methods present, in order of first appearance."""
        return tuple(dict.fromkeys(m for r in self.requests for m in r.acc))


def _load_published(path: Path) -> TraceSet:
    reqs = tuple(
        RequestTrace(
            r.request_id,
            len(r.prompt_token_ids),
            {NGRAM_METHOD: np.asarray(r.acc_ngram, np.int64), "eagle": np.asarray(r.acc_eagle, np.int64)},
            {},
            r.prompt_token_ids,
            r.generated_token_ids,
        )
        for r in published.read_published_jsonl(path)
    )
    return TraceSet(published.dataset_name(path), str(path), reqs)


def _load_trace_table(path: Path, token_requests: dict[str, tuple[list[int], list[int]]]) -> TraceSet:
    """A trace table (``sdbench trace ...``); prompt lengths from a ``prompt_len`` column or from
    ``token_requests`` (request id -> (prompt ids, output ids))."""
    import pyarrow.parquet as pq

    from sdbench.trace_cli import read_trace_table

    df = read_trace_table(path)
    extra_cols = [c for c in ("prompt_len", "dataset") if c in pq.read_schema(path).names]
    extra = pd.read_parquet(path, columns=extra_cols) if extra_cols else pd.DataFrame(index=df.index)
    dataset = published.dataset_name(path)
    if "dataset" in extra and extra["dataset"].nunique() == 1:
        dataset = str(extra["dataset"].iloc[0])
    order = {rid: i for i, rid in enumerate(dict.fromkeys(df["request_id"]))}
    df = df.assign(_r=df["request_id"].map(order), _pl=extra["prompt_len"] if "prompt_len" in extra else -1)
    df = df.sort_values(["_r", "method", "position"], kind="stable")
    acc: dict[str, dict[str, np.ndarray]] = {}
    proposed: dict[str, dict[str, np.ndarray]] = {}
    prompt_len: dict[str, int] = {}
    for (rid, method), g in df.groupby(["request_id", "method"], sort=False):
        pos = g["position"].to_numpy()
        if not np.array_equal(pos, np.arange(len(pos))):
            raise ValueError(f"{path}: request {rid!r} method {method!r}: positions are not 0..{len(pos) - 1}")
        acc.setdefault(rid, {})[method] = g["acc_len"].to_numpy(np.int64)
        if g["proposed_len"].notna().all():
            proposed.setdefault(rid, {})[method] = g["proposed_len"].to_numpy(np.int64)
        if int(g["_pl"].iloc[0]) >= 0:
            prompt_len[rid] = int(g["_pl"].iloc[0])
    reqs = []
    for rid in order:
        tokens = token_requests.get(rid)
        if rid not in prompt_len:
            if tokens is None:
                raise ValueError(
                    f"{path}: no prompt length for request {rid!r}: add a prompt_len column or pass "
                    "its requests table (--requests)"
                )
            prompt_len[rid] = len(tokens[0])
        reqs.append(
            RequestTrace(
                rid, prompt_len[rid], acc[rid], proposed.get(rid, {}), *(tokens if tokens is not None else (None, None))
            )
        )
    return TraceSet(dataset, str(path), tuple(reqs))


def _token_requests(paths: Sequence[str | os.PathLike[str]]) -> dict[str, tuple[list[int], list[int]]]:
    from sdbench.trace_cli import read_token_requests

    return {r.request_id: (r.prompt_token_ids, r.output_token_ids) for p in paths for r in read_token_requests(p)}


def load_traces(path: str | os.PathLike[str], requests: Sequence[str | os.PathLike[str]] = ()) -> TraceSet:
    """Read a published-trace ``.jsonl`` or a trace-table ``.parquet`` (token ids of its requests,
    for prompt lengths and n-gram tracing, from ``requests`` tables if it lacks them)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace file {path} does not exist")
    if path.suffix == ".jsonl":
        return _load_published(path)
    if path.suffix == ".parquet":
        return _load_trace_table(path, _token_requests(requests))
    raise ValueError(f"{path}: expected a published-trace .jsonl or a trace-table .parquet")


def with_ngram_proposals(ts: TraceSet) -> TraceSet:
    """``ts`` with n-gram draft lengths at every position, traced from token ids where missing
    (:func:`sdbench.ngram.trace_ngram`, 20 speculative tokens, lookup 3..7)."""
    if all(NGRAM_METHOD in r.proposed for r in ts.requests if NGRAM_METHOD in r.acc):
        return ts
    from sdbench.ngram import trace_ngram

    out = []
    for r in ts.requests:
        if NGRAM_METHOD in r.acc and NGRAM_METHOD not in r.proposed:
            if r.prompt_token_ids is None or r.output_token_ids is None:
                raise ValueError(
                    f"{ts.source}: request {r.request_id!r} has no n-gram proposal lengths and no token ids "
                    "to trace them (pass its requests table with --requests)"
                )
            tr = trace_ngram(r.prompt_token_ids, r.output_token_ids)
            prop = tr.proposed_len.astype(np.int64)
            n = len(r.acc[NGRAM_METHOD])
            prop = np.concatenate([prop, np.zeros(max(0, n - len(prop)), np.int64)])[:n]
            r = replace(r, proposed={**r.proposed, NGRAM_METHOD: prop})
        out.append(r)
    return replace(ts, requests=tuple(out))


def draft_method_of(ts: TraceSet, drafter: str | None = None) -> str:
    """The learned drafter standing for proposer ``eagle``: ``drafter`` if given, else ``eagle``
    if present, else the only non-n-gram method."""
    learned = [m for m in ts.methods if m != NGRAM_METHOD]
    if drafter is not None:
        if drafter not in learned:
            raise ValueError(f"{ts.source}: no method {drafter!r} (learned drafters: {', '.join(learned) or 'none'})")
        return drafter
    if "eagle" in learned:
        return "eagle"
    if len(learned) == 1:
        return learned[0]
    raise ValueError(
        f"{ts.source}: {'no learned drafter' if not learned else 'several learned drafters: ' + ', '.join(learned)}"
        " (choose one with --drafter)"
    )


def _gen_len(r: RequestTrace, proposer: str, draft_method: str) -> int:
    if proposer == NGRAM_METHOD:
        return len(r.acc.get(NGRAM_METHOD, ()))
    if proposer == "eagle":
        return len(r.acc.get(draft_method, ()))
    # Outputs of the two runs can differ; the published simulator cuts to the shorter one.
    return min(len(r.acc.get(NGRAM_METHOD, ())), len(r.acc.get(draft_method, ())))


def sample_requests(
    ts: TraceSet, proposer: str, draft_method: str, num_requests: int = COMPAT_NUM_REQUESTS, seed: int = COMPAT_SEED
) -> tuple[list[int], tuple]:
    """Indices of the simulated requests and the ``random`` state after drawing them.

    As the published simulator: requests with an empty trace are dropped, then
    ``random.seed(seed); random.sample(requests, k)`` (which depends only on the count, so
    sampling indices draws the same requests). ``num_requests <= 0``: all, in source order.
    """
    eligible = [i for i, r in enumerate(ts.requests) if _gen_len(r, proposer, draft_method) > 0]
    if not eligible:
        raise ValueError(f"{ts.source}: no request has a {proposer} trace")
    rnd = random.Random(seed)
    if num_requests <= 0:
        return eligible, rnd.getstate()
    picked = rnd.sample(eligible, k=min(num_requests, len(eligible)))
    return picked, rnd.getstate()


def trace_arrays(ts: TraceSet, indices: Sequence[int], proposer: str, draft_method: str) -> TraceArrays:
    """Flat per-position arrays of the requests ``indices`` (see :class:`TraceArrays`)."""
    reqs = [ts.requests[i] for i in indices]
    length = np.array([_gen_len(r, proposer, draft_method) for r in reqs], np.int64)
    start = np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64)

    def cat(get: Callable[[RequestTrace], np.ndarray | None]) -> np.ndarray | None:
        parts = [get(r) for r in reqs]
        if any(p is None for p in parts):
            return None
        return np.concatenate([np.asarray(p[:n], np.int64) for p, n in zip(parts, length)])

    use_ngram = proposer in (NGRAM_METHOD, "combined")
    use_draft = proposer in ("eagle", "combined")
    return TraceArrays(
        start=start,
        length=length,
        prompt_len=np.array([r.prompt_len for r in reqs], np.int64),
        acc_ngram=cat(lambda r: r.acc.get(NGRAM_METHOD)) if use_ngram else None,
        proposed_ngram=cat(lambda r: r.proposed.get(NGRAM_METHOD)) if use_ngram else None,
        acc_draft=cat(lambda r: r.acc.get(draft_method)) if use_draft else None,
    )


# ----------------------------------------------------------------------------- pricing
def baseline_trajectories(arrays: TraceArrays) -> Trajectories:
    """Plain decoding: after the prefill, one token per step until the output is complete."""
    n = np.maximum(arrays.length - 1, 0)
    req = np.repeat(np.arange(arrays.num_requests), n)
    first = np.concatenate([[0], np.cumsum(n)[:-1]])
    gen = np.arange(len(req)) - first[req] + 1
    zeros = np.zeros(len(req), np.int64)
    return Trajectories(req, gen, zeros.astype(np.int8), zeros, zeros + 1)


def _charged_drafter(traj: Trajectories, proposer: str | None, fidelity: Fidelity) -> np.ndarray:
    """Which drafter's cost each step pays (``proposer`` None: plain decoding, none)."""
    if proposer is None:
        return np.full(traj.num_steps, NONE, np.int8)
    if fidelity.drafter_cost:
        return np.where(traj.k > 0, traj.drafter, NONE)
    n = traj.num_steps
    if proposer == "combined":  # published: n-gram cost on every step of the combined oracle
        return np.full(n, NGRAM, np.int8)
    if proposer == "eagle":  # published: EAGLE cost on every step, even proposing nothing
        return np.full(n, DRAFT, np.int8)
    return np.where(traj.k > 0, NGRAM, NONE)


def _step_coefficients(
    traj: Trajectories, arrays: TraceArrays, proposer: str | None, cm: CostModel, fidelity: Fidelity, draft_method: str
) -> tuple[np.ndarray, np.ndarray]:
    """Per step, ``(A, C)`` with step time = ``A + C * batch_size`` for a replicated batch."""
    t = cm.target
    kv = (arrays.prompt_len[traj.req] + traj.gen).astype(float)  # per copy
    k = traj.k.astype(float)
    v_c = t.c_kv * kv + t.c_compute * (1.0 + k)
    a = np.full(traj.num_steps, t.c_fixed + cm.overhead_per_step)
    c = v_c.copy()
    charged = _charged_drafter(traj, proposer, fidelity)
    for code, method in ((NGRAM, NGRAM_METHOD), (DRAFT, draft_method)):
        m = charged == code
        if not m.any():
            continue
        d = cm.drafter(method)
        if d.kind == "fraction_of_verify":
            a[m] += d.fraction * t.c_fixed
            c[m] += d.fraction * v_c[m]
        elif fidelity.batch_draft_cost:
            a[m] += d.c_fixed
            c[m] += d.c_kv * kv[m] + d.c_spec * k[m]
        else:
            # Published: each copy pays its own draft with k + 1 "spec tokens" and the KV count as
            # it drifts while looping over the batch: + emitted per copy already processed, and at
            # the last step - (prompt + generated) as copies finish (mean copy index (B-1)/2).
            last = np.append(traj.req[1:] != traj.req[:-1], True)
            drift = np.where(last, -kv, traj.emitted)[m]
            a[m] += d.c_fixed + d.c_spec * (k[m] + 1) - d.c_kv * drift / 2
            c[m] += d.c_kv * (kv[m] + drift / 2)
    if cm.switching_overhead > 0:
        used = traj.drafter
        prev = np.concatenate([[NONE], used[:-1]])
        same_req = np.concatenate([[False], traj.req[1:] == traj.req[:-1]])
        a += cm.switching_overhead * (same_req & (used != NONE) & (prev != NONE) & (used != prev))
    return a, c


def _compat_random_steps(
    traj: Trajectories,
    arrays: TraceArrays,
    cm: CostModel,
    fidelity: Fidelity,
    batch_size: int,
    rng_state: tuple,
    match_probability: float,
) -> np.ndarray:
    """Per-request seconds of the steps where the published n-gram model draws a random match.

    At such a step every copy of the batch draws ``random.random()`` in copy order; a copy that
    "matches" verifies ``k`` drafts (paying the n-gram draft), the others none. Draws run over
    the batches in sample order, which is the order of ``traj``.
    """
    t = cm.target
    m = traj.rng
    req, kv, k = traj.req[m], (arrays.prompt_len[traj.req] + traj.gen)[m], traj.k[m]
    rs = np.random.RandomState()
    # Python's random and numpy's legacy RandomState share MT19937 and the 53-bit double recipe.
    rs.set_state(("MT19937", np.asarray(rng_state[1][:624], np.uint32), rng_state[1][624]))
    draws = rs.random_sample(len(req) * batch_size).reshape(len(req), batch_size)
    matched = (draws < match_probability).sum(axis=1)
    verify = t.c_kv * batch_size * kv + t.c_compute * (batch_size + matched * k) + t.c_fixed
    d = cm.drafter(NGRAM_METHOD)
    if fidelity.batch_draft_cost:
        draft = np.where(matched > 0, d.time(verify, batch_size * kv, matched * k), 0.0)
    else:  # mean over copies of each copy's own draft time
        draft = d.time(verify, batch_size * kv, k + 1) * matched / batch_size
    step = verify + draft + cm.overhead_per_step
    return np.bincount(req, step, minlength=arrays.num_requests)


def replicated_latency(
    traj: Trajectories,
    arrays: TraceArrays,
    proposer: str | None,
    cm: CostModel,
    fidelity: Fidelity,
    draft_method: str,
    batch_sizes: Sequence[int],
    rng_state: tuple | None = None,
    match_probability: float | None = None,
) -> np.ndarray:
    """Mean request latency (s) of each request's replicated batch: shape (requests, batch sizes).

    ``proposer`` None prices plain decoding (no drafting).
    """
    b = np.asarray(batch_sizes, float)
    n = arrays.num_requests
    lin = np.ones(traj.num_steps, bool) if traj.rng is None else ~traj.rng
    a, c = _step_coefficients(traj, arrays, proposer, cm, fidelity, draft_method)
    a_sum = np.bincount(traj.req[lin], a[lin], minlength=n)
    c_sum = np.bincount(traj.req[lin], c[lin], minlength=n)
    prompt = arrays.prompt_len.astype(float)
    # Prefill of the whole batch (empty KV cache), then its per-step overhead.
    fixed = cm.target.c_fixed + cm.overhead_per_step + a_sum
    lat = fixed[:, None] + (cm.target.c_compute * prompt + c_sum)[:, None] * b[None, :]
    if traj.rng is not None and traj.rng.any():
        if rng_state is None or match_probability is None:
            raise ValueError("the random n-gram match model needs the sampling RNG state and a match probability")
        for j, bs in enumerate(batch_sizes):
            lat[:, j] += _compat_random_steps(traj, arrays, cm, fidelity, int(bs), rng_state, match_probability)
    return lat


def continuous_makespan(
    traj: Trajectories, arrays: TraceArrays, cm: CostModel, draft_method: str, batch_size: int
) -> float:
    """Seconds to serve all requests with at most ``batch_size`` running (continuous batching).

    Requests start in order as slots free up; a request's prefill joins the step after a slot
    frees (batched with the others' decode steps), then it takes one step per trajectory step.
    Each step pays the target pass over the batch's KV and batched tokens, each drafter used in
    it once (over its requests' KV and drafts), and the per-step overhead.
    """
    n = arrays.num_requests
    steps = np.bincount(traj.req, minlength=n)
    start = np.empty(n, np.int64)
    free = [0] * min(batch_size, n)
    for r in range(n):
        t0 = heapq.heappop(free)
        start[r] = t0
        heapq.heappush(free, t0 + int(steps[r]) + 1)
    horizon = int((start + steps + 1).max())
    first = np.concatenate([[0], np.cumsum(steps)[:-1]])
    when = start[traj.req] + 1 + (np.arange(traj.num_steps) - first[traj.req])
    kv = (arrays.prompt_len[traj.req] + traj.gen).astype(float)
    k = traj.k.astype(float)
    batched = np.bincount(when, 1.0 + k, horizon) + np.bincount(start, arrays.prompt_len.astype(float), horizon)
    kv_t = np.bincount(when, kv, horizon)
    verify = cm.target.time(kv_t, batched)
    total = verify + cm.overhead_per_step
    charged = np.where(traj.k > 0, traj.drafter, NONE)
    for code, method in ((NGRAM, NGRAM_METHOD), (DRAFT, draft_method)):
        m = charged == code
        if m.any():
            used = np.bincount(when[m], minlength=horizon) > 0
            draft = cm.drafter(method).time(
                verify, np.bincount(when[m], kv[m], horizon), np.bincount(when[m], k[m], horizon)
            )
            total += np.where(used, draft, 0.0)
    if cm.switching_overhead > 0:
        prev = np.concatenate([[NONE], traj.drafter[:-1]])
        same = np.concatenate([[False], traj.req[1:] == traj.req[:-1]])
        sw = same & (traj.drafter != NONE) & (prev != NONE) & (traj.drafter != prev)
        total += cm.switching_overhead * (np.bincount(when[sw], minlength=horizon) > 0)
    return float(total.sum())


# ----------------------------------------------------------------------------- simulation
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
) -> pd.DataFrame:
    """Speedup of each policy at each batch size (one row each, :data:`RESULT_COLUMNS`)."""
    if batching not in BATCHING:
        raise ValueError(f"unknown batching {batching!r} (choose from {', '.join(BATCHING)})")
    if batching == "continuous" and fidelity != EXACT:
        raise ValueError("continuous batching is only simulated in exact mode")
    if any(int(b) < 1 for b in batch_sizes):
        raise ValueError(f"batch sizes must be >= 1, got {list(batch_sizes)}")
    arrays = prep.arrays
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

    base_tpt = price(base, batch_sizes, None)
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
        else:
            traj = policy.trajectories(arrays, PolicyContext(prep.proposer, 1, cm, prep.draft_method), fidelity)
            if traj.rng is not None and traj.rng.any() and match_probability is None:
                raise ValueError(
                    f"dataset {prep.dataset!r} has no compat n-gram match probability "
                    f"(known: {', '.join(COMPAT_NGRAM_MATCH_PROBABILITY)}); pass --compat-match-probability"
                )
            trajs = [traj] * len(batch_sizes)
            sd_tpt = price(traj, batch_sizes)
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
                    "num_requests": arrays.num_requests,
                    "speedup": sd_tpt[j] / base_tpt[j],
                    "baseline_tokens_per_s": base_tpt[j],
                    "sd_tokens_per_s": sd_tpt[j],
                    "tokens_per_step": float(tr.emitted.sum()) / steps,
                    "ngram_step_share": float((tr.drafter == NGRAM).sum()) / steps,
                    "draft_step_share": float((tr.drafter == DRAFT).sum()) / steps,
                }
            )
    return pd.DataFrame(rows, columns=list(RESULT_COLUMNS))


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
) -> pd.DataFrame:
    """Simulate ``policies`` of ``proposer`` on every trace set; sorted result rows.

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
    """Write result rows as CSV atomically (fixed float format, so reruns are byte-identical)."""
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False, float_format="%.6f")


# ----------------------------------------------------------------------------- compat vs exact
# Each correction of exact mode alone on top of compat, then all of them (exact).
COMPARE_VARIANTS: dict[str, Fidelity] = {
    "compat": COMPAT,
    "+ngram_proposals": replace(COMPAT, true_ngram_proposals=True),
    "+aligned_positions": replace(COMPAT, aligned_positions=True),
    "+drafter_cost": replace(COMPAT, drafter_cost=True),
    "+batch_draft_cost": replace(COMPAT, batch_draft_cost=True),
    "exact": EXACT,
}
# The published simulator's grid: fixed-1/3/5 and oracle for EAGLE and n-gram, the combined oracle.
PAPER_GRID: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("eagle", PAPER_POLICIES),
    ("ngram", PAPER_POLICIES),
    ("combined", ("oracle",)),
)


def compare_modes(
    trace_sets: Sequence[TraceSet],
    cm: CostModel,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    *,
    continuous: bool = True,
    num_requests: int = COMPAT_NUM_REQUESTS,
    seed: int = COMPAT_SEED,
) -> pd.DataFrame:
    """Speedup of the paper's grid under each :data:`COMPARE_VARIANTS` fidelity (one column each),
    plus exact mode with continuous batching (``exact_continuous``)."""
    frames = []
    for ts in trace_sets:
        ts = with_ngram_proposals(ts)
        for proposer, policies in PAPER_GRID:
            prep = prepare(ts, proposer, num_requests=num_requests, seed=seed)
            for variant, fidelity in COMPARE_VARIANTS.items():
                frames.append(simulate_prepared(prep, policies, batch_sizes, cm, fidelity, mode=variant))
            if continuous:
                frames.append(
                    simulate_prepared(
                        prep, policies, batch_sizes, cm, EXACT, mode="exact_continuous", batching="continuous"
                    )
                )
    long = pd.concat(frames, ignore_index=True)
    keys = ["dataset", "proposer", "policy", "batch_size"]
    wide = long.pivot_table(index=keys, columns="mode", values="speedup", sort=False).reset_index()
    order = [*COMPARE_VARIANTS, *(["exact_continuous"] if continuous else [])]
    wide.columns.name = None
    return sort_results(wide[keys + order])


# ----------------------------------------------------------------------------- adaptive policies
ADAPTIVE_SPECS: tuple[str, ...] = (
    "combined:adaptive",
    "combined:learned",
    "combined:trust",
    "combined:ngram-else-eagle",
    "eagle:adaptive",
    "eagle:dynamic-k",
)
FIXED_GRID: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("eagle", ("fixed-1", "fixed-3", "fixed-5")),
    ("ngram", ("fixed-1", "fixed-3", "fixed-5")),
)


def _parse_spec(spec: str) -> tuple[str, str]:
    proposer, sep, policy = spec.partition(":")
    if not sep or proposer not in PROPOSERS:
        raise ValueError(f"policy spec {spec!r} is not <proposer>:<policy> with proposer in {', '.join(PROPOSERS)}")
    return proposer, policy


def adaptive_report(
    trace_sets: Sequence[TraceSet],
    cm: CostModel,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    specs: Sequence[str] = ADAPTIVE_SPECS,
    *,
    batching: str = "replicated",
    train_sets: Sequence[TraceSet] | None = None,
    num_requests: int = COMPAT_NUM_REQUESTS,
    seed: int = COMPAT_SEED,
) -> pd.DataFrame:
    """Causal policies against the best fixed policy (EAGLE or n-gram, fixed-1/3/5) and
    oracle-combine, exact mode: one row per (dataset, batch size, policy) with ``gap_closed`` =
    (policy - best fixed) / (oracle-combine - best fixed). Trained policies train on the other
    trace sets (or ``train_sets``)."""
    parsed = [_parse_spec(s) for s in specs]
    trace_sets = [with_ngram_proposals(ts) for ts in trace_sets]
    train_sets = None if train_sets is None else [with_ngram_proposals(ts) for ts in train_sets]
    rows = []
    for ts in trace_sets:
        preps = {p: prepare(ts, p, num_requests=num_requests, seed=seed) for p in PROPOSERS}
        run = lambda proposer, policies, train=(): simulate_prepared(  # noqa: E731
            preps[proposer], policies, batch_sizes, cm, EXACT, batching=batching, mode="exact", train=train
        )
        fixed = pd.concat([run(p, pols) for p, pols in FIXED_GRID], ignore_index=True)
        best = fixed.loc[fixed.groupby("batch_size")["speedup"].idxmax()].set_index("batch_size")
        oracle = run("combined", ["oracle-combine"]).set_index("batch_size")["speedup"]
        for proposer, policy in parsed:
            train = _training_arrays(ts, trace_sets, train_sets, proposer, None, [policy], EXACT, num_requests)
            res = run(proposer, [policy], train).set_index("batch_size")
            for b in batch_sizes:
                bf, oc, sp = best.loc[b, "speedup"], oracle.loc[b], res.loc[b, "speedup"]
                rows.append(
                    {
                        "dataset": ts.dataset,
                        "batch_size": int(b),
                        "policy": f"{proposer}:{policy}",
                        "speedup": sp,
                        "best_fixed": bf,
                        "best_fixed_policy": f"{best.loc[b, 'proposer']}:{best.loc[b, 'policy']}",
                        "oracle_combine": oc,
                        "vs_best_fixed": sp / bf,
                        "gap_closed": (sp - bf) / (oc - bf) if oc > bf else float("nan"),
                    }
                )
    return pd.DataFrame(rows).sort_values(["dataset", "policy", "batch_size"], kind="stable").reset_index(drop=True)


def adaptive_summary(report: pd.DataFrame) -> pd.DataFrame:
    """Gap closed per (dataset, batch size) for each policy (columns), with a per-dataset mean row
    and the worst ratio to the best fixed policy."""
    wide = report.pivot_table(index=["dataset", "batch_size"], columns="policy", values="gap_closed", sort=False)
    means = report.groupby(["dataset", "policy"])["gap_closed"].mean().unstack("policy")
    means.index = pd.MultiIndex.from_tuples([(d, "mean") for d in means.index], names=["dataset", "batch_size"])
    worst = report.groupby(["dataset", "policy"])["vs_best_fixed"].min().unstack("policy")
    worst.index = pd.MultiIndex.from_tuples(
        [(d, "min vs best fixed") for d in worst.index], names=["dataset", "batch_size"]
    )
    # Three decimals for the worst ratio: "1.00" must not hide a 0.4% loss.
    worst = worst.map(lambda v: f"{v:.3f}")
    out = pd.concat([wide.astype(object), means.astype(object), worst.astype(object)])
    out = out.reset_index()
    out["_o"] = out["batch_size"].map(lambda b: (0, b) if isinstance(b, (int, np.integer)) else (1, str(b)))
    out = out.sort_values(["dataset", "_o"], kind="stable").drop(columns="_o").reset_index(drop=True)
    out.columns.name = None
    return out


# ----------------------------------------------------------------------------- figures
def _save_figure(fig: object, path: str | os.PathLike[str]) -> None:
    """Save a matplotlib figure as PNG atomically and close it."""
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=130, bbox_inches="tight")  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]


def _axes_grid(nrows: int, ncols: int) -> tuple[object, np.ndarray]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows), squeeze=False, sharex=True)
    for ax in axes.flat:
        ax.set_xscale("log", base=2)
        ax.set_xticks(DEFAULT_BATCH_SIZES, [str(b) for b in DEFAULT_BATCH_SIZES])
        ax.axhline(1.0, color="0.7", lw=0.8)
        ax.grid(alpha=0.3)
    return fig, axes


def figure_fixed_vs_oracle(results: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """Fig. 9: speedup of fixed-k and oracle proposal lengths vs batch size, per dataset (rows)
    and proposer (columns: EAGLE, n-gram)."""
    datasets = sorted(results["dataset"].unique())
    proposers = [p for p in ("eagle", "ngram") if p in set(results["proposer"])]
    if not datasets or not proposers:
        raise ValueError("Fig. 9 needs simulate results of proposer eagle or ngram")
    fig, axes = _axes_grid(len(datasets), len(proposers))
    for i, d in enumerate(datasets):
        for j, p in enumerate(proposers):
            ax = axes[i, j]
            sub = results[(results["dataset"] == d) & (results["proposer"] == p)]
            for policy, g in sub.groupby("policy", sort=True):
                g = g.sort_values("batch_size")
                style = dict(color="k", lw=2) if policy.startswith("oracle") else dict(marker="o", ms=3)
                ax.plot(g["batch_size"], g["speedup"], label=policy, **style)
            ax.set_title(f"{d} / {'EAGLE' if p == 'eagle' else 'n-gram'}")
            if i == len(datasets) - 1:
                ax.set_xlabel("batch size")
            ax.set_ylabel("speedup")
            ax.legend(fontsize=7)
    _save_figure(fig, path)


def figure_combining(results: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """Fig. 11: oracle of EAGLE, of n-gram and of their per-position combination, with the best
    fixed policy of each, vs batch size per dataset."""
    datasets = sorted(results["dataset"].unique())
    fig, axes = _axes_grid(1, len(datasets))
    for j, d in enumerate(datasets):
        ax = axes[0, j]
        sub = results[results["dataset"] == d]
        lines = {
            "Oracle_Combine": sub[(sub["proposer"] == "combined") & sub["policy"].isin(["oracle", "oracle-combine"])],
            "Oracle_EAGLE": sub[(sub["proposer"] == "eagle") & (sub["policy"] == "oracle")],
            "Oracle_n-gram": sub[(sub["proposer"] == "ngram") & (sub["policy"] == "oracle")],
        }
        for p, label in (("eagle", "best fixed EAGLE"), ("ngram", "best fixed n-gram")):
            fx = sub[(sub["proposer"] == p) & sub["policy"].str.startswith("fixed-")]
            if len(fx):
                lines[label] = fx.loc[fx.groupby("batch_size")["speedup"].idxmax()]
        for label, g in lines.items():
            if len(g):
                g = g.sort_values("batch_size")
                ls = "-" if label.startswith("Oracle") else "--"
                ax.plot(g["batch_size"], g["speedup"], ls, marker="o", ms=3, label=label)
        ax.set_title(d)
        ax.set_xlabel("batch size")
        ax.set_ylabel("speedup")
        ax.legend(fontsize=7)
    _save_figure(fig, path)


def figure_compare(table: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """Compat (dashed) vs exact (solid) speedup per dataset (rows) and proposer (columns)."""
    datasets = sorted(table["dataset"].unique())
    proposers = [p for p, _ in PAPER_GRID if p in set(table["proposer"])]
    fig, axes = _axes_grid(len(datasets), len(proposers))
    for i, d in enumerate(datasets):
        for j, p in enumerate(proposers):
            ax = axes[i, j]
            sub = table[(table["dataset"] == d) & (table["proposer"] == p)]
            for n, (policy, g) in enumerate(sub.groupby("policy", sort=True)):
                g = g.sort_values("batch_size")
                color = f"C{n}"
                ax.plot(g["batch_size"], g["compat"], "--", color=color, lw=1)
                ax.plot(g["batch_size"], g["exact"], "-", marker="o", ms=3, color=color, label=policy)
            ax.set_title(f"{d} / {p} (dashed: compat, solid: exact)", fontsize=9)
            if i == len(datasets) - 1:
                ax.set_xlabel("batch size")
            ax.set_ylabel("speedup")
            ax.legend(fontsize=7)
    _save_figure(fig, path)


def figure_adaptive(report: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """Causal policies between the best fixed policy and oracle-combine, per dataset."""
    datasets = sorted(report["dataset"].unique())
    fig, axes = _axes_grid(1, len(datasets))
    for j, d in enumerate(datasets):
        ax = axes[0, j]
        sub = report[report["dataset"] == d]
        ref = sub.drop_duplicates("batch_size").sort_values("batch_size")
        ax.fill_between(ref["batch_size"], ref["best_fixed"], ref["oracle_combine"], color="0.9", label="gap")
        ax.plot(ref["batch_size"], ref["best_fixed"], "k-", lw=2, label="best fixed")
        ax.plot(ref["batch_size"], ref["oracle_combine"], "k--", lw=2, label="oracle-combine")
        for policy, g in sub.groupby("policy", sort=True):
            g = g.sort_values("batch_size")
            ax.plot(g["batch_size"], g["speedup"], marker="o", ms=3, label=policy)
        ax.set_title(d)
        ax.set_xlabel("batch size")
        ax.set_ylabel("speedup")
        ax.legend(fontsize=6)
    _save_figure(fig, path)


# ----------------------------------------------------------------------------- benchmark
PUBLISHED_PROPOSERS = {"eagle": "eagle3", "ngram": "ngram", "combined": "combined"}


def run_paper_grid(
    paths: Sequence[str | os.PathLike[str]], cm: CostModel, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES
) -> pd.DataFrame:
    """The published simulator's full grid in compat mode, loading the traces (what is timed)."""
    sets = [load_traces(p) for p in paths]
    return pd.concat(
        [simulate(sets, proposer, policies, batch_sizes, cm, "compat") for proposer, policies in PAPER_GRID],
        ignore_index=True,
    )


def run_published_simulator(
    directory: Path, datasets: Sequence[str], batch_sizes: Sequence[int], python: str = sys.executable
) -> tuple[float, pd.DataFrame]:
    """Run the published simulator's ``main.py`` (in ``directory``) for the paper grid; returns
    wall seconds and its results (dataset, proposer, policy, batch_size, speedup)."""
    if not (directory / "main.py").is_file():
        raise FileNotFoundError(f"{directory}/main.py not found: not a checkout of SpecDecode-Bench/simulator")
    for d in datasets:
        data = directory / "data" / "llama3.1-8B" / f"combined_{d}.jsonl"
        if not data.is_file():
            raise FileNotFoundError(f"the published simulator reads {data}, which does not exist")
    frames = []
    with tempfile.TemporaryDirectory(prefix="pubsim-") as out:
        start = time.perf_counter()
        for proposer in PUBLISHED_PROPOSERS.values():
            cmd = [
                python,
                "main.py",
                "--proposer",
                proposer,
                "--datasets",
                *datasets,
                "--batch-sizes",
                *map(str, batch_sizes),
                "--output-dir",
                out,
            ]
            subprocess.run(cmd, cwd=directory, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seconds = time.perf_counter() - start
        names = {v: k for k, v in PUBLISHED_PROPOSERS.items()}
        for proposer in PUBLISHED_PROPOSERS.values():
            for d in datasets:
                df = pd.read_csv(Path(out) / f"{proposer}_{d}_speedup.csv")
                frames.append(
                    pd.DataFrame(
                        {
                            "dataset": d,
                            "proposer": names[proposer],
                            "policy": df["predict_method"].str.lower().str.replace("_", "-"),
                            "batch_size": df["batch_size"],
                            "speedup": df["speedup"],
                        }
                    )
                )
    return seconds, pd.concat(frames, ignore_index=True)


# ----------------------------------------------------------------------------- CLI
def _markdown(df: pd.DataFrame, digits: int = 2) -> str:
    from sdbench.acceptance import markdown_table

    return markdown_table(df, digits)


def _load_sets(paths: Sequence[str], requests: Sequence[str] = ()) -> list[TraceSet]:
    sets = [load_traces(p, requests) for p in paths]
    seen: dict[str, str] = {}
    for ts in sets:
        if ts.dataset in seen:
            raise ValueError(f"{ts.source}: dataset {ts.dataset!r} already read from {seen[ts.dataset]}")
        seen[ts.dataset] = ts.source
    return sets


def _cmd_simulate(args: argparse.Namespace) -> int:
    missing = [f"--{k.replace('_', '-')}" for k in ("traces", "proposer", "output") if not getattr(args, k)]
    if missing:
        raise ValueError(
            f"sdbench simulate: the following arguments are required: {', '.join(missing)} "
            "(see sdbench simulate --help)"
        )
    cm = load_cost_model(args.cost_model)
    train = _load_sets(args.train_traces, args.requests) if args.train_traces else None
    df = simulate(
        _load_sets(args.traces, args.requests),
        args.proposer,
        args.policy,
        args.batch_sizes,
        cm,
        args.mode,
        batching=args.batching,
        num_requests=args.num_requests,
        seed=args.seed,
        drafter=args.drafter,
        train_sets=train,
        match_probability=args.compat_match_probability,
    )
    write_results(df, args.output)
    print(f"wrote {len(df)} rows to {args.output}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    cm = load_cost_model(args.cost_model)
    table = compare_modes(_load_sets(args.traces), cm, args.batch_sizes, continuous=not args.no_continuous)
    out = Path(args.output_dir)
    write_results(table, out / "compat_vs_exact.csv")
    write_text(_markdown(table), out / "compat_vs_exact.md")
    figure_compare(table, out / "compat_vs_exact.png")
    print(_markdown(table))
    print(f"wrote {out}/compat_vs_exact.{{csv,md,png}}")
    return 0


def _cmd_adaptive(args: argparse.Namespace) -> int:
    cm = load_cost_model(args.cost_model)
    train = _load_sets(args.train_traces, args.requests) if args.train_traces else None
    report = adaptive_report(
        _load_sets(args.traces, args.requests),
        cm,
        args.batch_sizes,
        args.policies,
        batching=args.batching,
        train_sets=train,
    )
    summary = adaptive_summary(report)
    out = Path(args.output_dir)
    write_results(report, out / "adaptive_policies.csv")
    write_text(_markdown(summary), out / "adaptive_gap_closed.md")
    figure_adaptive(report, out / "adaptive_policies.png")
    print(_markdown(summary))
    print(f"wrote {out}/adaptive_policies.{{csv,png}} and {out}/adaptive_gap_closed.md")
    return 0


def _cmd_figures(args: argparse.Namespace) -> int:
    results = pd.concat([pd.read_csv(p) for p in args.results], ignore_index=True)
    out = Path(args.output_dir)
    figure_fixed_vs_oracle(results, out / "fig9_fixed_vs_oracle.png")
    figure_combining(results, out / "fig11_combining.png")
    print(f"wrote {out}/fig9_fixed_vs_oracle.png and {out}/fig11_combining.png")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    cm = load_cost_model(args.cost_model)
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        ours = run_paper_grid(args.traces, cm, args.batch_sizes)
        times.append(time.perf_counter() - start)
    ours_s = min(times)
    configs = len(ours)
    print(
        f"sdbench compat: {configs} configurations (dataset x proposer x policy x batch size) "
        f"in {ours_s:.3f} s (best of {args.repeat}, traces loading included)"
    )
    if args.published_simulator is None:
        return 0
    datasets = sorted(ours["dataset"].unique())
    pub_s, pub = run_published_simulator(Path(args.published_simulator), datasets, args.batch_sizes, args.python)
    merged = ours.merge(pub, on=["dataset", "proposer", "policy", "batch_size"], suffixes=("", "_published"))
    same = int((merged["speedup"].round(2) == merged["speedup_published"].round(2)).sum())
    print(f"published simulator: {pub_s:.1f} s; results equal to 2 decimals on {same}/{len(merged)} configurations")
    print(f"ratio (published / sdbench): {pub_s / ours_s:.0f}x")
    return 0


def _bench_subparsers(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """The ``bench`` command's sub-command registry, shared with other modules' benchmarks."""
    bench = subparsers.choices.get("bench")
    if bench is None:
        bench = subparsers.add_parser("bench", help="micro-benchmarks of pipeline components")
        return bench.add_subparsers(dest="bench_command", required=True)
    for action in bench._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise RuntimeError("the registered 'bench' command has no sub-commands")


def _add_common(p: argparse.ArgumentParser, traces_required: bool = True) -> None:
    p.add_argument(
        "--traces",
        nargs="+",
        required=traces_required,
        metavar="PATH",
        help="published-trace combined_<dataset>.jsonl or trace-table .parquet files",
    )
    p.add_argument("--batch-sizes", nargs="+", type=int, default=list(DEFAULT_BATCH_SIZES), metavar="N")
    p.add_argument(
        "--cost-model",
        default="llama3.1-8b-h100",
        help="cost model name (shipped or in $SDBENCH_DATA_DIR/cost_models) or a YAML path "
        "(default: llama3.1-8b-h100)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``simulate`` (with ``compare``, ``adaptive-report``, ``figures``) and ``bench simulator``."""
    sim = subparsers.add_parser(
        "simulate",
        help="trace-replay simulation of speculative-decoding speedup",
        description="Simulate speedup from acceptance traces. Sub-actions: compare, adaptive-report, figures.",
    )
    _add_common(sim, traces_required=False)
    sim.add_argument("--proposer", choices=PROPOSERS)
    sim.add_argument(
        "--policy",
        nargs="+",
        default=list(PAPER_POLICIES),
        metavar="POLICY",
        help="fixed-K, oracle, oracle-combine, adaptive, goodput, learned, trust, ngram-else-eagle, "
        "dynamic-k (default: fixed-1 fixed-3 fixed-5 oracle)",
    )
    sim.add_argument("--mode", choices=list(MODES), default="exact")
    sim.add_argument("--batching", choices=BATCHING, default="replicated")
    sim.add_argument("--output", metavar="OUT.csv")
    sim.add_argument(
        "--num-requests",
        type=int,
        default=COMPAT_NUM_REQUESTS,
        help="requests sampled per dataset (default 300; <= 0: all, in file order)",
    )
    sim.add_argument("--seed", type=int, default=COMPAT_SEED, help="sampling seed (default 42)")
    sim.add_argument(
        "--requests",
        nargs="+",
        default=[],
        metavar="PATH",
        help="requests tables (token ids) for trace tables lacking prompt lengths / n-gram drafts",
    )
    sim.add_argument("--drafter", help="learned-drafter method standing for proposer eagle (default: eagle)")
    sim.add_argument(
        "--train-traces",
        nargs="+",
        metavar="PATH",
        help="training traces of the learned policy (default: the other --traces)",
    )
    sim.add_argument(
        "--compat-match-probability",
        type=float,
        help="compat n-gram match probability for datasets the published simulator does not know",
    )
    sim.set_defaults(func=_cmd_simulate)
    actions = sim.add_subparsers(dest="simulate_action", required=False, metavar="{compare,adaptive-report,figures}")

    cmp_ = actions.add_parser("compare", help="compat vs exact: each correction alone, table + figure")
    _add_common(cmp_)
    cmp_.add_argument("--output-dir", required=True)
    cmp_.add_argument("--no-continuous", action="store_true", help="skip the continuous-batching column")
    cmp_.set_defaults(func=_cmd_compare)

    ada = actions.add_parser("adaptive-report", help="causal policies vs best fixed vs oracle-combine")
    _add_common(ada)
    ada.add_argument("--output-dir", required=True)
    ada.add_argument("--policies", nargs="+", default=list(ADAPTIVE_SPECS), metavar="PROPOSER:POLICY")
    ada.add_argument("--batching", choices=BATCHING, default="replicated")
    ada.add_argument(
        "--train-traces",
        nargs="+",
        metavar="PATH",
        help="training traces of the learned policy (default: the other --traces)",
    )
    ada.add_argument(
        "--requests",
        nargs="+",
        default=[],
        metavar="PATH",
        help="requests tables (token ids) for trace tables lacking prompt lengths / n-gram drafts",
    )
    ada.set_defaults(func=_cmd_adaptive)

    fig = actions.add_parser("figures", help="Fig. 9 and Fig. 11 from simulate results")
    fig.add_argument("--results", nargs="+", required=True, metavar="CSV", help="sdbench simulate outputs")
    fig.add_argument("--output-dir", required=True)
    fig.set_defaults(func=_cmd_figures)

    bench = _bench_subparsers(subparsers).add_parser(
        "simulator", help="time the paper grid in compat mode vs the published simulator"
    )
    _add_common(bench)
    bench.add_argument(
        "--published-simulator",
        metavar="DIR",
        help="checkout of SpecDecode-Bench/simulator to run and time (else only ours is timed)",
    )
    bench.add_argument("--python", default=sys.executable, help="interpreter for the published simulator")
    bench.add_argument("--repeat", type=int, default=3, help="timed repetitions of ours (best is reported)")
    bench.set_defaults(func=_cmd_bench)
