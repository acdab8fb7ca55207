"""Pricing trajectories with a cost model: request latency of replicated batches, makespan of
continuous batching; with a power model (:mod:`sdbench.simulator.powermodel`) their energy, each
step's seconds as priced here times the power of the tokens it batches.

A replicated batch is simulated once (its copies are identical, or for the random n-gram model
differ only in how many tokens they verify), and a request's latency is linear in the batch size
for a batch-independent policy, so all batch sizes are priced from per-request sums at once.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from sdbench.simulator.compat import compat_random_energy, compat_random_steps
from sdbench.simulator.costmodel import CostModel
from sdbench.simulator.policytypes import DRAFT, NGRAM, NONE, Fidelity, TraceArrays, Trajectories
from sdbench.simulator.powermodel import PowerModel, step_watts
from sdbench.simulator.stepenergy import StepEnergyModel
from sdbench.simulator.tracesets import NGRAM_METHOD


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


def _verify_weights(
    traj: Trajectories, proposer: str | None, cm: CostModel, fidelity: Fidelity, draft_method: str
) -> np.ndarray:
    """Per step, how many times it pays its verify pass: 1, plus the fraction of a
    ``fraction_of_verify`` drafter it is charged (as :func:`_step_coefficients` charges it)."""
    w = np.ones(traj.num_steps)
    charged = _charged_drafter(traj, proposer, fidelity)
    for code, method in ((NGRAM, NGRAM_METHOD), (DRAFT, draft_method)):
        m = charged == code
        if m.any() and cm.drafter(method).kind == "fraction_of_verify":
            w[m] += cm.drafter(method).fraction
    return w


def _hinge_per_k(
    traj: Trajectories, arrays: TraceArrays, proposer: str | None, cm: CostModel, fidelity: Fidelity,
    draft_method: str, lin: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """Verify passes per request and drafts ``k`` (shape (requests, max k + 1)) of the steps priced
    linearly: a hinged target's extra seconds are not linear in the batch size, but a step's depend
    on it only through ``k`` (it batches ``batch * (k + 1)`` tokens), so they are priced per k."""
    n = arrays.num_requests
    width = int(traj.k.max()) + 1 if traj.num_steps else 1
    w = _verify_weights(traj, proposer, cm, fidelity, draft_method)
    cell = traj.req[lin].astype(np.int64) * width + traj.k[lin]
    return np.bincount(cell, w[lin], minlength=n * width).reshape(n, width)


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
    if cm.target.c_above_knee > 0:  # the hinge: the prefill's batch * prompt tokens, each step's per k
        passes = _hinge_per_k(traj, arrays, proposer, cm, fidelity, draft_method, lin)
        tokens = 1.0 + np.arange(passes.shape[1])
        for j, bs in enumerate(b):
            lat[:, j] += cm.target.hinge(bs * prompt) + passes @ cm.target.hinge(bs * tokens)
    if traj.rng is not None and traj.rng.any():
        if rng_state is None or match_probability is None:
            raise ValueError("the random n-gram match model needs the sampling RNG state and a match probability")
        for j, bs in enumerate(batch_sizes):
            lat[:, j] += compat_random_steps(traj, arrays, cm, fidelity, int(bs), rng_state, match_probability)
    return lat


def replicated_energy(
    traj: Trajectories,
    arrays: TraceArrays,
    proposer: str | None,
    cm: CostModel,
    fidelity: Fidelity,
    draft_method: str,
    batch_sizes: Sequence[int],
    power: PowerModel | StepEnergyModel,
    rng_state: tuple | None = None,
    match_probability: float | None = None,
) -> np.ndarray:
    """Joules of each request's replicated batch: shape (requests, batch sizes).

    The steps :func:`replicated_latency` prices, each its seconds there (``A + C * batch``)
    times ``P(batched tokens)``: the prefill batches ``batch * prompt`` tokens, a decode step
    ``batch * (k + 1)`` (each copy verifies its ``k`` drafts and one more token). With a step
    energy model the power depends on the step's KV tokens too (:func:`step_watts`): priced step by step.
    """
    n = arrays.num_requests
    lin = np.ones(traj.num_steps, bool) if traj.rng is None else ~traj.rng
    a, c = _step_coefficients(traj, arrays, proposer, cm, fidelity, draft_method)
    if not isinstance(power, PowerModel):
        out = _replicated_step_energy(traj, arrays, proposer, cm, fidelity, draft_method, batch_sizes, power, a, c, lin)
        if traj.rng is not None and traj.rng.any():
            if rng_state is None or match_probability is None:
                raise ValueError("the random n-gram match model needs the sampling RNG state and a match probability")
            for j, bs in enumerate(batch_sizes):
                out[:, j] += compat_random_energy(traj, arrays, cm, fidelity, int(bs), rng_state, match_probability,
                                                  power)  # fmt: skip
        return out
    width = int(traj.k.max()) + 1 if traj.num_steps else 1
    # A and C summed per request and k: a step's power depends on the batch only through k.
    cell = traj.req[lin].astype(np.int64) * width + traj.k[lin]
    a_k = np.bincount(cell, a[lin], minlength=n * width).reshape(n, width)
    c_k = np.bincount(cell, c[lin], minlength=n * width).reshape(n, width)
    prompt = arrays.prompt_len.astype(float)
    out = np.empty((n, len(batch_sizes)))
    hinged = cm.target.c_above_knee > 0
    passes = _hinge_per_k(traj, arrays, proposer, cm, fidelity, draft_method, lin) if hinged else None
    for j, bs in enumerate(batch_sizes):
        b = float(bs)
        prefill_s = cm.target.c_fixed + cm.overhead_per_step + cm.target.c_compute * prompt * b
        watts = power.watts(b * (1.0 + np.arange(width)))
        out[:, j] = prefill_s * power.watts(b * prompt) + (a_k + c_k * b) @ watts
        if passes is not None:  # the hinge's seconds (replicated_latency), at the same steps' power
            hinge_s = cm.target.hinge(b * (1.0 + np.arange(width)))
            out[:, j] += cm.target.hinge(b * prompt) * power.watts(b * prompt) + passes @ (hinge_s * watts)
    if traj.rng is not None and traj.rng.any():
        if rng_state is None or match_probability is None:
            raise ValueError("the random n-gram match model needs the sampling RNG state and a match probability")
        for j, bs in enumerate(batch_sizes):
            out[:, j] += compat_random_energy(traj, arrays, cm, fidelity, int(bs), rng_state, match_probability, power)
    return out


def _replicated_step_energy(
    traj: Trajectories, arrays: TraceArrays, proposer: str | None, cm: CostModel, fidelity: Fidelity,
    draft_method: str, batch_sizes: Sequence[int], power: StepEnergyModel, a: np.ndarray, c: np.ndarray,
    lin: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """:func:`replicated_energy` of the linearly priced steps under a step energy model: each step's
    seconds (``A + C * batch`` plus its hinge) at the power of its batched and KV tokens."""
    n = arrays.num_requests
    kv = (arrays.prompt_len[traj.req] + traj.gen).astype(float)[lin]
    tokens = 1.0 + traj.k[lin].astype(float)
    w = _verify_weights(traj, proposer, cm, fidelity, draft_method)[lin]
    prompt = arrays.prompt_len.astype(float)
    out = np.empty((n, len(batch_sizes)))
    for j, bs in enumerate(batch_sizes):
        b = float(bs)
        seconds = a[lin] + c[lin] * b + w * cm.target.hinge(b * tokens)
        steps = np.bincount(traj.req[lin], seconds * step_watts(power, cm.target, b * tokens, b * kv), minlength=n)
        prefill_s = (cm.target.c_fixed + cm.overhead_per_step + cm.target.c_compute * prompt * b
                     + cm.target.hinge(b * prompt))  # fmt: skip
        out[:, j] = prefill_s * step_watts(power, cm.target, b * prompt, 0.0) + steps
    return out


def continuous_makespan(
    traj: Trajectories, arrays: TraceArrays, cm: CostModel, draft_method: str, batch_size: int
) -> float:
    """Seconds to serve all requests with at most ``batch_size`` running (continuous batching).

    Requests start in order as slots free up; a request's prefill joins the step after a slot
    frees (batched with the others' decode steps), then it takes one step per trajectory step.
    Each step pays the target pass over the batch's KV and batched tokens, each drafter used in
    it once (over its requests' KV and drafts), and the per-step overhead.
    """
    return float(_continuous_steps(traj, arrays, cm, draft_method, batch_size)[0].sum())


def continuous_energy(
    traj: Trajectories, arrays: TraceArrays, cm: CostModel, draft_method: str, batch_size: int, power: PowerModel
) -> float:
    """Joules to serve all requests as :func:`continuous_makespan` does: each engine step's
    seconds times the power of the tokens it batches (prefills and ``k + 1`` per decoding request)."""
    seconds, batched, kv = _continuous_steps(traj, arrays, cm, draft_method, batch_size)
    return float((step_watts(power, cm.target, batched, kv) * seconds).sum())


def _continuous_steps(
    traj: Trajectories, arrays: TraceArrays, cm: CostModel, draft_method: str, batch_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, batched tokens, KV tokens) of each engine step of :func:`continuous_makespan`."""
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
    return total, batched, kv_t
