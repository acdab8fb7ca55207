"""Bootstrap intervals of throughput and speedup (sdbench.analysis.stats)."""

from __future__ import annotations

import numpy as np
import pytest
import pandas as pd

from sdbench.analysis import stats


def calls_frame(per_prompt: list[list[float]]) -> pd.DataFrame:
    rows = [
        {"trial": t, "call_index": i, "tokens_per_s": v}
        for i, trials in enumerate(per_prompt)
        for t, v in enumerate(trials)
    ]
    return pd.DataFrame(rows)


def test_point_estimate_is_mean_of_per_prompt_medians() -> None:
    calls = calls_frame([[10, 12, 100], [20, 20, 22]])
    assert stats.point_estimate(calls) == (12 + 20) / 2


def test_interval_covers_the_estimate_and_shrinks_with_trials() -> None:
    rng = np.random.default_rng(0)
    few = calls_frame([list(100 + rng.normal(0, 5, 3)) for _ in range(8)])
    many = calls_frame([list(100 + rng.normal(0, 5, 30)) for _ in range(8)])
    lo_f, hi_f = stats.interval(stats.bootstrap(few, seed=1))
    lo_m, hi_m = stats.interval(stats.bootstrap(many, seed=1))
    assert lo_f <= stats.point_estimate(few) <= hi_f
    assert lo_m <= stats.point_estimate(many) <= hi_m
    assert hi_m - lo_m < hi_f - lo_f


def test_bootstrap_is_seeded() -> None:
    calls = calls_frame([[1.0, 2.0, 3.0], [4.0, 5.0, 7.0]])
    assert np.array_equal(stats.bootstrap(calls, seed=3), stats.bootstrap(calls, seed=3))


def test_single_trial_has_a_zero_width_interval() -> None:
    calls = calls_frame([[10.0], [20.0]])
    assert stats.interval(stats.bootstrap(calls, seed=0)) == (15.0, 15.0)


def test_ratio_interval_of_independent_cells() -> None:
    a = calls_frame([[200, 210, 190]] * 4)
    b = calls_frame([[100, 105, 95]] * 4)
    lo, hi = stats.ratio_interval(stats.bootstrap(a, 1), stats.bootstrap(b, 2))
    assert lo <= 2.0 <= hi and hi - lo < 0.5


def test_engine_starts_widen_the_interval_to_cover_process_differences() -> None:
    """Two processes at 100 and 120 tok/s, tight trials each: one-level resampling of the
    pooled trials gives a narrow interval; resampling starts covers both levels."""
    rng = np.random.default_rng(0)
    rows = [
        {"engine_start": s, "trial": t, "call_index": i, "tokens_per_s": level + rng.normal(0, 1)}
        for s, level in enumerate((100.0, 120.0, 101.0))
        for t in range(3)
        for i in range(4)
    ]
    calls = pd.DataFrame(rows)
    lo, hi = stats.interval(stats.bootstrap(calls, seed=1))
    lo1, hi1 = stats.interval(stats.bootstrap(calls.drop(columns="engine_start"), seed=1))
    assert lo <= stats.point_estimate(calls) <= hi
    assert hi - lo > 2 * (hi1 - lo1) and hi > 110
    assert np.array_equal(stats.bootstrap(calls, seed=2), stats.bootstrap(calls, seed=2))


def test_paired_bootstrap_cancels_what_both_arms_share() -> None:
    """Trial-to-trial swings hit both arms of a pair alike: the paired ratio stays tight,
    the ratio of independent resamples does not."""
    rng = np.random.default_rng(0)
    swings = [list(100 * rng.uniform(0.7, 1.3, 6)) for _ in range(8)]
    base = calls_frame(swings)
    sd = calls_frame([[2 * v for v in trials] for trials in swings])
    lo, hi = stats.interval(stats.paired_bootstrap(sd, base, seed=1))
    assert lo == pytest.approx(2.0) and hi == pytest.approx(2.0)
    lo_i, hi_i = stats.ratio_interval(stats.bootstrap(sd, 1), stats.bootstrap(base, 2))
    assert hi_i - lo_i > 0.2


def test_paired_bootstrap_refuses_unpaired_arms() -> None:
    with pytest.raises(ValueError, match="same calls and trials"):
        stats.paired_bootstrap(calls_frame([[1.0, 2.0]]), calls_frame([[1.0, 2.0, 3.0]]), seed=0)


def test_relative_half_width_of_one_arm_and_of_a_paired_ratio() -> None:
    rng = np.random.default_rng(0)
    noisy = calls_frame([list(100 * rng.uniform(0.8, 1.2, 5)) for _ in range(8)])
    low, high = stats.interval(stats.bootstrap(noisy, seed=4))
    assert stats.relative_half_width([noisy], seed=4) == pytest.approx((high - low) / 2 / stats.point_estimate(noisy))
    # The SD arm moves with the baseline: its paired ratio is exact, its own throughput is not.
    sd = calls_frame([[2 * v for v in g["tokens_per_s"]] for _, g in noisy.groupby("call_index")])
    assert stats.relative_half_width([noisy, sd], seed=4) == pytest.approx(0.0)
    assert stats.relative_half_width([sd], seed=4) > 0.02
    assert stats.relative_half_width([noisy.iloc[:0], sd], seed=4) == float("inf")


def test_a_target_half_width_stops_the_trials_only_when_met() -> None:
    """The runner's stopping rule on recorded call rows (sdbench.engine.measure.trials._precise_enough)."""
    from types import SimpleNamespace

    from sdbench.engine.measure.trials import _precise_enough, _trial_plan

    rows = calls_frame([[100.0, 130.0, 80.0]] * 4).to_dict("records")
    arm = SimpleNamespace(call_rows=rows)
    assert _precise_enough([arm], None, seed=0)
    assert not _precise_enough([arm], 0.05, seed=0)
    assert _precise_enough([arm], 0.5, seed=0)
    assert _trial_plan({"repeats": 3, "max_repeats": 8, "target_half_width": 0.05}) == (3, 0.0, 8, 0.05)
    assert _trial_plan({"repeats": 3}) == (3, 0.0, 50, None)
