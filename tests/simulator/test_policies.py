"""Proposal policies: trajectories, oracles, and causality of the deployable policies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sdbench.simulator.causal import (
    CausalPolicy,
    FittedGoodput,
    Learned,
    measure_priors,
    run_causal,
)
from sdbench.simulator.core import prepare
from sdbench.simulator.costmodel import load_cost_model
from sdbench.simulator.policies import make_policy, walk
from sdbench.simulator.policytypes import (
    COMPAT,
    DRAFT,
    EXACT,
    NGRAM,
    NONE,
    PolicyContext,
    TraceArrays,
    Trajectories,
)
from sdbench.simulator.pricing import baseline_trajectories, replicated_latency
from sdbench.simulator.reports import adaptive_report
from sdbench.simulator.tracesets import load_traces, with_ngram_proposals

CM = load_cost_model("llama3.1-8b-h100")
CAUSAL = [
    ("combined", "adaptive"),
    ("combined", "goodput"),
    ("combined", "trust"),
    ("combined", "ngram-else-eagle"),
    ("combined", "learned"),
    ("combined", "goodput-fitted"),
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
    if getattr(policy, "needs_training", False):
        train = concat([synthetic(np.random.default_rng(100 + i)) for i in range(4)])
        policy.train([train], PolicyContext(proposer, 1, CM))
        if isinstance(policy, Learned):
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


def test_measure_priors_is_the_censored_geometric_estimate() -> None:
    """q = share of positions whose first draft is accepted; r = accepted continuations /
    (continuations + rejections before the draft ran out). The prefill position is skipped."""
    # Position 0 is the prefill; n-gram drafts at 1, 2, 4 (proposal lengths 3, 3, 2).
    prop = np.array([5, 3, 3, 0, 2])
    acc_n = np.array([9, 4, 1, 1, 2])  # accepted drafts 3 (ran out), 0, 1 (rejected)
    acc_d = np.array([9, 3, 1, 6, 21])  # accepted 2 (rejected), 0, 5 (rejected), 20 (ran out)
    traces = TraceArrays(np.array([0]), np.array([5]), np.array([10]), acc_n, prop, acc_d)
    got = measure_priors([traces])
    # n-gram: 2 of 3 first drafts accepted; continuations 2 + 0, rejections 0 (ran out) + 1.
    assert got["ngram_prior"] == pytest.approx((2 / 3, 2 / 3))
    # learned drafter without an n-gram draft (position 3): 5 accepted, then rejected.
    assert got["draft_prior"] == pytest.approx((1.0, 4 / 5))
    # with one (1, 2, 4): first accepted at 1 and 4; continuations 1 + 19, one rejection.
    assert got["draft_prior_at_ngram"] == pytest.approx((2 / 3, 20 / 21))
    policy = make_policy("goodput-fitted", "combined")
    policy.train([traces], PolicyContext("combined", 1, CM))
    assert (policy.ngram_prior, policy.draft_prior, policy.draft_prior_at_ngram) == tuple(got.values())
    with pytest.raises(ValueError, match="needs training traces"):
        FittedGoodput().train([], PolicyContext("combined", 1, CM))
    # Learned-drafter traces alone (proposer eagle): its priors only, all positions without a draft.
    eagle_only = TraceArrays(traces.start, traces.length, traces.prompt_len, None, None, acc_d)
    assert measure_priors([eagle_only]) == {"draft_prior": pytest.approx((3 / 4, 24 / 26))}


def test_hindsight_policies_read_the_realised_acceptance() -> None:
    """The hindsight yardsticks are labelled non-causal. Told n-gram's realised acceptance,
    goodput never proposes an n-gram token that fails; told whether first drafts are accepted, it
    never drafts where none would be."""
    ctx = PolicyContext("combined", 8, CM)
    arrays = concat([synthetic(np.random.default_rng(i)) for i in range(3)])
    assert not any(make_policy(n, "combined").causal for n in ("hindsight-first", "hindsight-ngram"))
    tr = make_policy("hindsight-ngram", "combined").trajectories(arrays, ctx, EXACT)
    ng = tr.drafter == NGRAM
    assert ng.any() and np.array_equal(tr.emitted[ng], tr.k[ng] + 1)
    tr = make_policy("hindsight-first", "combined").trajectories(arrays, ctx, EXACT)
    drafted = tr.drafter != NONE
    assert drafted.any() and (tr.emitted[drafted] >= 2).all()


# ----------------------------------------------------------------------------- published traces
# Gap closed = (policy - best fixed) / (oracle-combine - best fixed), best fixed = the best of
# EAGLE and n-gram fixed-1/3/5 at that batch size. Llama-3.1-8B/H100 cost model, 300 requests,
# batch sizes 1, 8, 16, 32, 64, 128 (docs/methods/simulator.md quotes these numbers).
BATCHES = (1, 8, 16, 32, 64, 128)


@pytest.fixture(scope="module")
def published(published_traces_dir: Path) -> dict:
    """Both published datasets with n-gram drafts traced."""
    paths = (published_traces_dir / f"combined_{d}.jsonl" for d in ("gsm8k", "instructcoder"))
    return {ts.dataset: ts for ts in (with_ngram_proposals(load_traces(p)) for p in paths)}


def _gaps(report: pd.DataFrame, policy: str) -> tuple[list[float], list[float]]:
    rows = report[report["policy"] == policy].sort_values("batch_size")
    assert rows["batch_size"].tolist() == list(BATCHES)
    return rows["gap_closed"].tolist(), rows["vs_best_fixed"].tolist()


# (dataset it is evaluated on, dataset its priors are measured on): gap closed and ratio to the
# best fixed policy at each batch size.
FITTED_GOODPUT = {
    ("instructcoder", "gsm8k"): (
        [0.7907, 0.6364, 0.5372, 0.4360, 0.3321, 0.2155],
        [1.6666, 1.4583, 1.3468, 1.2495, 1.1543, 1.0751],
    ),
    ("gsm8k", "instructcoder"): (
        [0.1890, 0.0217, -0.0214, 0.0147, -0.0070, 0.0493],
        [1.0339, 1.0048, 0.9944, 1.0048, 0.9976, 1.0179],
    ),
    ("instructcoder", "instructcoder"): (
        [0.7909, 0.6371, 0.5372, 0.4347, 0.3298, 0.2175],
        [1.6668, 1.4589, 1.3468, 1.2487, 1.1533, 1.0758],
    ),
    ("gsm8k", "gsm8k"): (
        [0.2016, 0.0234, -0.0074, 0.0236, -0.0055, 0.0521],
        [1.0361, 1.0052, 0.9980, 1.0077, 0.9981, 1.0189],
    ),
}


@pytest.mark.parametrize("evaluated, trained", list(FITTED_GOODPUT))
def test_fitted_goodput_on_the_published_traces(published: dict, evaluated: str, trained: str) -> None:
    """Goodput with priors measured on one dataset, replayed on the other (cross-validated) or the
    same (in-sample): short of half the gap on either dataset (InstructCoder 49%, GSM8K 4-5% on
    average; see test_gsm8k_gap_is_realised_acceptance for why), cross-validated within a point
    of in-sample."""
    report = adaptive_report(
        [published[evaluated]], CM, BATCHES, ["combined:goodput-fitted"], train_sets=[published[trained]]
    )
    gaps, ratios = _gaps(report, "combined:goodput-fitted")
    want_gaps, want_ratios = FITTED_GOODPUT[evaluated, trained]
    assert gaps == pytest.approx(want_gaps, abs=2e-4)
    assert ratios == pytest.approx(want_ratios, abs=2e-4)


def _request_oracle_gap(arrays: TraceArrays) -> np.ndarray:
    """Gap closed at each of :data:`BATCHES` by the best fixed method chosen per request after
    the fact (EAGLE or n-gram, k = 1..20), all priced on the same requests (``combined`` lengths)."""

    def throughput(traj: Trajectories, proposer: str | None) -> np.ndarray:  # per request x batch size
        lat = replicated_latency(traj, arrays, proposer, CM, EXACT, "eagle", BATCHES)
        return arrays.length[:, None] * np.asarray(BATCHES, float)[None, :] / lat

    def run(policy: str, proposer: str) -> np.ndarray:
        traj = make_policy(policy, proposer).trajectories(arrays, PolicyContext(proposer, 1, CM), EXACT)
        return throughput(traj, proposer)

    base = throughput(baseline_trajectories(arrays), None).mean(axis=0)
    fixed = {(p, k): run(f"fixed-{k}", p) for p in ("eagle", "ngram") for k in range(1, 21)}
    best_fixed = np.max([fixed[p, k].mean(axis=0) for p in ("eagle", "ngram") for k in (1, 3, 5)], axis=0) / base
    per_request = np.max(np.stack(list(fixed.values())), axis=0).mean(axis=0) / base
    oracle = run("oracle-combine", "combined").mean(axis=0) / base
    return (per_request - best_fixed) / (oracle - best_fixed)


def test_gsm8k_gap_is_realised_acceptance(published: dict) -> None:
    """Why no causal policy closes half the GSM8K gap: the oracle's lead is knowing each step's
    realised acceptance, mostly EAGLE's. EAGLE alone with k = its realised acceptance closes
    79-96%; goodput told only whether each drafter's first draft token will be accepted closes
    52% on average, told n-gram's realised acceptance outright 16%; the best fixed method per
    request (after the fact) 10%."""
    gsm8k = published["gsm8k"]
    report = adaptive_report(
        [gsm8k], CM, BATCHES, ["eagle:oracle", "combined:hindsight-first", "combined:hindsight-ngram"]
    )
    got = {p: _gaps(report, p)[0] for p in ("eagle:oracle", "combined:hindsight-first", "combined:hindsight-ngram")}
    per_request = _request_oracle_gap(prepare(gsm8k, "combined").arrays).tolist()
    assert got["eagle:oracle"] == pytest.approx([0.7935, 0.8417, 0.8741, 0.9097, 0.9335, 0.9557], abs=2e-4)
    assert np.mean(got["combined:hindsight-first"]) == pytest.approx(0.5193, abs=2e-4)
    assert np.mean(got["combined:hindsight-ngram"]) == pytest.approx(0.1606, abs=2e-4)
    assert per_request == pytest.approx([0.2692, 0.1002, 0.0560, 0.0735, 0.0370, 0.0771], abs=2e-4)
