"""Proposal policies: trajectories, oracles, and causality of the deployable policies."""

from __future__ import annotations

import numpy as np
import pytest

from sdbench.simulator.costmodel import load_cost_model
from sdbench.simulator.causal import CausalPolicy, Learned, run_causal
from sdbench.simulator.policies import make_policy, walk
from sdbench.simulator.policytypes import COMPAT, DRAFT, EXACT, NGRAM, NONE, PolicyContext, TraceArrays

CM = load_cost_model("llama3.1-8b-h100")
CAUSAL = [
    ("combined", "adaptive"),
    ("combined", "goodput"),
    ("combined", "trust"),
    ("combined", "ngram-else-eagle"),
    ("combined", "learned"),
    ("eagle", "dynamic-k"),
    ("ngram", "dynamic-k"),
    ("eagle", "goodput"),
    ("ngram", "goodput"),
]


def synthetic(rng: np.random.Generator, n: int = 300, prompt: int = 80) -> TraceArrays:
    """One request with copy-like n-gram runs and geometric-ish learned-drafter acceptance."""
    prop = np.where(rng.random(n) < 0.5, rng.integers(1, 21, n), 0)
    prop[0] = 0
    acc_n = np.where(prop > 0, 1 + np.minimum(prop, rng.geometric(0.3, n) - 1), 1)
    acc_d = np.minimum(rng.geometric(0.3, n), 21)
    acc_d[0] = acc_n[0] = 1
    return TraceArrays(np.array([0]), np.array([n]), np.array([prompt]), acc_n, prop, acc_d)


def concat(parts: list[TraceArrays]) -> TraceArrays:
    length = np.concatenate([p.length for p in parts])
    return TraceArrays(
        np.concatenate([[0], np.cumsum(length)[:-1]]),
        length,
        np.concatenate([p.prompt_len for p in parts]),
        *(np.concatenate([getattr(p, f) for p in parts]) for f in ("acc_ngram", "proposed_ngram", "acc_draft")),
    )


def test_walk_jumps_by_emitted_tokens() -> None:
    emitted = np.array([1, 2, 1, 3, 1, 1, 1, 1])
    assert walk(emitted, np.array([1]), np.array([8])).tolist() == [1, 3, 6, 7]
    assert walk(emitted, np.array([0, 5]), np.array([4, 8])).tolist() == [0, 1, 3, 5, 6, 7]


@pytest.mark.parametrize("proposer", ["ngram", "eagle", "combined"])
def test_oracles_propose_exactly_what_is_accepted(proposer: str) -> None:
    arrays = concat([synthetic(np.random.default_rng(i)) for i in range(3)])
    ctx = PolicyContext(proposer, 1, CM)
    tr = make_policy("oracle", proposer).trajectories(arrays, ctx, EXACT)
    assert np.array_equal(tr.emitted, tr.k + 1)
    assert np.all((tr.k == 0) == (tr.drafter == NONE))
    # Every request is replayed to its end and the steps tile its output.
    for r in range(arrays.num_requests):
        m = tr.req == r
        assert tr.gen[m][0] == 1 and tr.gen[m][-1] + tr.emitted[m][-1] >= arrays.length[r]
        assert np.array_equal(tr.gen[m][1:], (tr.gen + tr.emitted)[m][:-1])


def test_oracle_combine_takes_the_better_drafter() -> None:
    arrays = synthetic(np.random.default_rng(5))
    ctx = PolicyContext("combined", 1, CM)
    tr = make_policy("oracle-combine", "combined").trajectories(arrays, ctx, EXACT)
    best = np.maximum(arrays.acc_ngram, arrays.acc_draft)[tr.gen]
    assert np.array_equal(tr.emitted, best)
    ngram_better = arrays.acc_ngram[tr.gen] >= arrays.acc_draft[tr.gen]
    assert np.all(tr.drafter[(tr.k > 0) & ngram_better] == NGRAM)
    assert np.all(tr.drafter[(tr.k > 0) & ~ngram_better] == DRAFT)


def test_fixed_k_ngram_proposes_at_most_its_draft() -> None:
    arrays = synthetic(np.random.default_rng(6))
    tr = make_policy("fixed-5", "ngram").trajectories(arrays, PolicyContext("ngram", 1, CM), EXACT)
    prop = arrays.proposed_ngram[tr.gen]
    assert np.array_equal(tr.k, np.minimum(5, prop))
    assert np.all(tr.drafter[prop == 0] == NONE)
    # Compat reads trace position g - 1 and proposes k everywhere, flagging random "no match" steps.
    tc = make_policy("fixed-5", "ngram", COMPAT).trajectories(arrays, PolicyContext("ngram", 1, CM), COMPAT)
    assert tc.gen[0] == 1 and np.all(tc.k == 5)
    assert np.array_equal(tc.rng, arrays.acc_ngram[tc.gen - 1] == 1)


@pytest.mark.parametrize(
    "name, proposer, fidelity, match",
    [
        ("fixed-0", "eagle", EXACT, "1 <= k"),
        ("fixed-21", "eagle", EXACT, "1 <= k"),
        ("fixed-3", "combined", EXACT, "does not apply"),
        ("oracle-combine", "eagle", EXACT, "does not apply"),
        ("adaptive", "combined", COMPAT, "exact mode"),
        ("bogus", "eagle", EXACT, "unknown policy"),
        ("oracle", "medusa", EXACT, "unknown proposer"),
    ],
)
def test_bad_policies_fail_early(name: str, proposer: str, fidelity, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_policy(name, proposer, fidelity)


def _trained(policy: CausalPolicy, proposer: str) -> CausalPolicy:
    if isinstance(policy, Learned):
        train = concat([synthetic(np.random.default_rng(100 + i)) for i in range(4)])
        policy.train([train], PolicyContext(proposer, 1, CM))
        assert len(policy.weights) == 4
    return policy


def future_leaks(
    policy: CausalPolicy, ctx: PolicyContext, seeds: range = range(3), earlier: TraceArrays | None = None
) -> list[str]:
    """Steps whose decision (or an earlier one) changed when the trace was altered at and after
    the step's position (acceptance) and after it (n-gram draft lengths, which the engine only
    knows once there). Each replay starts from a fresh engine that first served ``earlier``."""
    rng = np.random.default_rng(7)
    leaks = []

    def replay(trace: TraceArrays, rec: list) -> None:
        policy.reset()
        if earlier is not None:
            run_causal(policy, earlier, ctx)
        run_causal(policy, trace, ctx, rec)

    for seed in seeds:
        trace = synthetic(np.random.default_rng(seed))
        policy.trace = trace  # only the Peeking policy below uses it
        base: list = []
        replay(trace, base)
        assert len(base) > 10
        for s in sorted(rng.choice(len(base), size=4, replace=False)):
            g = base[s][0].position
            n = len(trace.acc_ngram)
            acc_n, prop, acc_d = trace.acc_ngram.copy(), trace.proposed_ngram.copy(), trace.acc_draft.copy()
            acc_n[g:] = rng.integers(1, 22, n - g)
            acc_d[g:] = rng.integers(1, 22, n - g)
            prop[g + 1 :] = rng.integers(0, 21, n - g - 1)
            altered = TraceArrays(trace.start, trace.length, trace.prompt_len, acc_n, prop, acc_d)
            policy.trace = altered
            rec: list = []
            replay(altered, rec)
            if rec[: s + 1] != base[: s + 1]:
                leaks.append(f"seed {seed} step {s} (position {g})")
    return leaks


@pytest.mark.parametrize("proposer, name", CAUSAL)
@pytest.mark.parametrize("batch_size", [1, 64])
def test_causal_policies_ignore_the_future(proposer: str, name: str, batch_size: int) -> None:
    policy = _trained(make_policy(name, proposer), proposer)
    assert future_leaks(policy, PolicyContext(proposer, batch_size, CM)) == []
    # Engine-wide state learned on an earlier request carries no information about the future.
    earlier = synthetic(np.random.default_rng(99))
    assert future_leaks(policy, PolicyContext(proposer, batch_size, CM), earlier=earlier) == []


def test_engine_wide_estimates_carry_over_between_requests() -> None:
    """Goodput's engine-wide estimates: a request served after others starts from what they
    showed, and a fresh engine (``reset``) from the fixed priors."""
    policy = make_policy("adaptive", "combined")
    ctx = PolicyContext("combined", 1, CM)
    trace = synthetic(np.random.default_rng(5))
    policy.reset()
    fresh: list = []
    run_causal(policy, trace, ctx, fresh)
    warm: list = []
    run_causal(policy, trace, ctx, warm)
    assert warm != fresh
    policy.reset()
    again: list = []
    run_causal(policy, trace, ctx, again)
    assert again == fresh


class Peeking(CausalPolicy):
    """A cheating policy reading the trace behind the simulator's back (the test must catch it)."""

    name = "peeking"
    trace: TraceArrays

    def start(self, prompt_len, ctx):
        return None

    def decide(self, state, obs, ctx):
        return DRAFT, int(self.trace.acc_draft[obs.position]) - 1


def test_causality_check_catches_a_peeking_policy() -> None:
    assert future_leaks(Peeking(), PolicyContext("eagle", 1, CM))


def test_goodput_is_batch_size_aware() -> None:
    """Larger batches make verification relatively dearer: proposals shrink."""
    trace = synthetic(np.random.default_rng(11), n=2000)
    policy = make_policy("goodput", "eagle")
    mean_k = []
    for b in (1, 128):
        rec: list = []
        run_causal(policy, trace, PolicyContext("eagle", b, CM), rec)
        mean_k.append(np.mean([k for _, _, k in rec]))
    assert mean_k[1] < mean_k[0]


def test_learned_without_enough_training_data_keeps_the_running_estimates() -> None:
    """A stage whose model cannot be fitted (too few rows) falls back to the estimator it
    would otherwise refine: with nothing fitted, ``learned`` decides like per-request goodput."""
    from sdbench.simulator.causal import Goodput

    ctx = PolicyContext("combined", 8, CM)
    policy = Learned(min_training_rows=10**9)
    policy.train([synthetic(np.random.default_rng(3))], ctx)
    assert policy.weights == {}
    trace = synthetic(np.random.default_rng(4))
    got: list = []
    run_causal(policy, trace, ctx, got)
    want: list = []
    run_causal(Goodput(prior_weight=policy.prior_weight, engine_wide=False), trace, ctx, want)
    assert got == want
