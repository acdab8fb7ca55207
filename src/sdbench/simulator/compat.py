"""What the compat mode reproduces of the published simulator's randomness.

Its request sampling (Python's ``random`` seeded 42, :func:`sample_requests`, used in every mode
so that compat and exact simulate the same requests) and its random n-gram "match" model
(:func:`compat_random_steps`): where nothing gets accepted, each copy of a batch draws whether
n-gram matched, with a per-dataset probability (:data:`COMPAT_NGRAM_MATCH_PROBABILITY`).
"""

from __future__ import annotations

import random

import numpy as np

from sdbench.simulator.costmodel import CostModel
from sdbench.simulator.policytypes import Fidelity, TraceArrays, Trajectories
from sdbench.simulator.powermodel import PowerModel
from sdbench.simulator.tracesets import NGRAM_METHOD, TraceSet, _gen_len

COMPAT_NUM_REQUESTS = 300
COMPAT_SEED = 42
# The published simulator's probability that n-gram "matches" where nothing gets accepted.
COMPAT_NGRAM_MATCH_PROBABILITY: dict[str, float] = {"sharegpt": 0.2, "cnn": 0.4, "gsm8k": 0.2, "instructcoder": 0.8}


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


def compat_random_steps(
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
    req, step, _ = _random_steps(traj, arrays, cm, fidelity, batch_size, rng_state, match_probability)
    return np.bincount(req, step, minlength=arrays.num_requests)


def compat_random_energy(
    traj: Trajectories,
    arrays: TraceArrays,
    cm: CostModel,
    fidelity: Fidelity,
    batch_size: int,
    rng_state: tuple,
    match_probability: float,
    power: PowerModel,
) -> np.ndarray:
    """Per-request joules of the steps :func:`compat_random_steps` prices: each step's seconds
    times the power of the tokens it batches (the batch plus the matched copies' drafts)."""
    from sdbench.simulator.powermodel import step_watts

    req, step, batched = _random_steps(traj, arrays, cm, fidelity, batch_size, rng_state, match_probability)
    kv = batch_size * (arrays.prompt_len[traj.req] + traj.gen)[traj.rng].astype(float)  # as _random_steps' verify
    return np.bincount(req, step_watts(power, cm.target, batched, kv) * step, minlength=arrays.num_requests)


def _random_steps(
    traj: Trajectories,
    arrays: TraceArrays,
    cm: CostModel,
    fidelity: Fidelity,
    batch_size: int,
    rng_state: tuple,
    match_probability: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(request, seconds, batched tokens) of each random-match step (:func:`compat_random_steps`)."""
    t = cm.target
    m = traj.rng
    req, kv, k = traj.req[m], (arrays.prompt_len[traj.req] + traj.gen)[m], traj.k[m]
    rs = np.random.RandomState()
    # Python's random and numpy's legacy RandomState share MT19937 and the 53-bit double recipe.
    rs.set_state(("MT19937", np.asarray(rng_state[1][:624], np.uint32), rng_state[1][624]))
    draws = rs.random_sample(len(req) * batch_size).reshape(len(req), batch_size)
    matched = (draws < match_probability).sum(axis=1)
    verify = t.c_kv * batch_size * kv + t.c_compute * (batch_size + matched * k) + t.c_fixed
    verify = verify + t.hinge(batch_size + matched * k)  # 0.0 without a knee: the published numbers stay
    d = cm.drafter(NGRAM_METHOD)
    if fidelity.batch_draft_cost:
        draft = np.where(matched > 0, d.time(verify, batch_size * kv, matched * k), 0.0)
    else:  # mean over copies of each copy's own draft time
        draft = d.time(verify, batch_size * kv, k + 1) * matched / batch_size
    step = verify + draft + cm.overhead_per_step
    return req, step, batch_size + matched * k
