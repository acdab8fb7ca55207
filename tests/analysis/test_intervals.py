"""Intervals at the level that varies (sdbench.analysis.intervals) and the coverage study that
checks them (sdbench.bench.coverage). Expected values by hand: t quantiles from tables."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from sdbench.analysis import intervals as iv
from sdbench.bench import coverage


def test_a_t_interval_over_replicates_by_hand() -> None:
    """Log ratios 0.1, 0.2, 0.3: mean 0.2, sd 0.1, t(0.975, 2) = 4.302653, half 0.248414."""
    got = iv.replicate_interval([0.1, 0.2, 0.3])
    assert (got.point, got.low, got.high) == pytest.approx(
        (math.exp(0.2), math.exp(0.2 - 0.248414), math.exp(0.2 + 0.248414)), rel=1e-6)
    assert (got.replicates, got.df) == (3, 2.0)
    # Four replicates: t(0.975, 3) = 3.182446; 90%: t(0.95, 3) = 2.353363.
    x = [0.0, 0.1, 0.2, 0.3]
    se = np.std(x, ddof=1) / 2
    assert iv.replicate_interval(x).high == pytest.approx(math.exp(0.15 + 3.182446 * se), rel=1e-6)
    assert iv.replicate_interval(x, confidence=0.90).high == pytest.approx(math.exp(0.15 + 2.353363 * se), rel=1e-6)


def test_one_replicate_gives_a_point_and_no_interval() -> None:
    one = iv.replicate_interval([math.log(1.5)])
    assert one.point == pytest.approx(1.5) and math.isnan(one.low) and math.isnan(one.high) and not one.judged
    assert iv.replicate_interval([]).replicates == 0 and math.isnan(iv.replicate_interval([]).point)
    assert iv.replicate_interval([float("nan"), 0.1, 0.3]).replicates == 2  # a missing start is left out
    same = iv.replicate_interval([0.2, 0.2])
    assert same.low == same.high == pytest.approx(math.exp(0.2))  # identical starts: zero width


def test_welch_interval_by_hand() -> None:
    """a = 0.0, 0.2, 0.4 (var 0.04), b = 0.0, 0.1 (var 0.005): se^2 = 0.04/3 + 0.005/2 = 0.0158333,
    df = se^4 / ((0.04/3)^2 / 2 + 0.0025^2 / 1) = 2.6350; t(0.975, 2.6350) = 3.4469 (between the
    tables' 4.303 at 2 and 3.182 at 3)."""
    got = iv.welch_interval([0.0, 0.2, 0.4], [0.0, 0.1])
    assert got.df == pytest.approx(2.6350, abs=1e-3) and got.replicates == 2
    half = 3.4469 * math.sqrt(0.0158333)
    want = (math.exp(0.15), math.exp(0.15 - half), math.exp(0.15 + half))
    assert (got.point, got.low, got.high) == pytest.approx(want, rel=2e-4)
    assert not iv.welch_interval([0.1, 0.2], [0.0]).judged  # one replicate in an arm: no interval
    assert iv.welch_interval([0.1, 0.2], [0.0]).point == pytest.approx(math.exp(0.15))


def test_the_verdict_words() -> None:
    assert [iv.judge(*b) for b in ((1.01, 1.5), (0.5, 0.99), (0.98, 1.02), (0.9, 1.02), (math.nan, 1.0))] == [
        iv.PAYS, iv.LOSES, iv.BREAK_EVEN, iv.UNDECIDED, iv.NOT_JUDGED]  # fmt: skip
    assert iv.judge(0.96, 1.04, margin=0.05) == iv.BREAK_EVEN and iv.judge(0.96, 1.04) == iv.UNDECIDED


def test_per_start_values_come_from_the_calls() -> None:
    """Start 0: prompts' medians 100 (trials 90, 100, 110) and 200 -> 150; start 1: 120 and 180 -> 150."""
    calls = pd.DataFrame({"engine_start": [0, 0, 0, 0, 1, 1], "call_index": [0, 0, 0, 1, 0, 1],
                          "trial": [0, 1, 2, 0, 0, 0],
                          "tokens_per_s": [90.0, 110.0, 100.0, 200.0, 120.0, 180.0]})  # fmt: skip
    assert np.exp(iv.start_log_throughputs(calls)).tolist() == pytest.approx([150.0, 150.0])
    base = calls.assign(tokens_per_s=calls["tokens_per_s"] / 2)
    assert np.exp(iv.paired_start_log_ratios(calls, base)).tolist() == pytest.approx([2.0, 2.0])
    with pytest.raises(ValueError, match="paired arms measured in 2 and 1 engine starts"):
        iv.paired_start_log_ratios(calls, base[base["engine_start"] == 0])
    # No engine_start column: one start, each prompt's median over all its trials: 105 and 190.
    assert np.exp(iv.start_log_throughputs(calls.drop(columns="engine_start"))).tolist() == pytest.approx([147.5])


def test_the_coverage_study_runs_the_packages_intervals() -> None:
    """A few runs of two designs (a benchmark asserts no coverage): one process gives no interval
    after; three give one in every run; the table has its columns."""
    designs = (coverage.Design("one", "offline", True, 1, 2, prompts=3),
               coverage.Design("three", "offline", True, 3, 1, prompts=3),
               coverage.Design("srv", "server", True, 2, 1, prompts=3))  # fmt: skip
    table = coverage.study(designs, runs=3, truths=(1.0,), resamples=50).set_index(["design", "method"])
    assert table.loc[("one", coverage.AFTER), "judged"] == 0.0 and table.loc[("three", coverage.AFTER), "judged"] == 1.0
    assert table.loc[("one", coverage.BEFORE), "judged"] == 1.0  # the old bootstrap always gave one
    shares = [f"share_{w.replace(' ', '_').replace('-', '_')}" for w in iv.VERDICTS]
    assert np.allclose(table[shares].sum(axis=1), 1.0)  # every run has exactly one verdict
    assert "false verdicts (A/A)" in coverage.markdown(table.reset_index(), coverage.Spreads())


def test_false_verdicts_a_control_may_show_by_hand() -> None:
    """Binomial(n, 0.05): n = 3: P(0) = 0.857, P(<=1) = 0.993 -> 1; n = 10: P(<=1) = 0.914, P(<=2) =
    0.988 -> 2; n = 20: P(<=2) = 0.925, P(<=3) = 0.984 -> 3; n = 1: P(0) = 0.95 -> 0."""
    assert [iv.false_verdicts_allowed(n) for n in (0, 1, 3, 10, 20)] == [0, 0, 1, 2, 3]


def test_identical_replicates_give_a_zero_width_welch_interval() -> None:
    got = iv.welch_interval([0.1, 0.1], [0.0, 0.0])
    assert got.low == got.high == pytest.approx(math.exp(0.1)) and got.df == math.inf


def test_each_studied_design_is_what_its_name_says() -> None:
    """The study's table is read by its names: starts, trials and pairing as each name states them."""
    import re

    for d in coverage.DESIGNS:
        starts = re.search(r"(\d+) starts?", d.name)
        assert starts and int(starts.group(1)) == d.starts, d
        trials = re.search(r"x (\d+) (trial|round)", d.name)
        assert trials and int(trials.group(1)) == d.trials, d
        assert ("unpaired" in d.name) == (not d.paired) and (d.mode == "server") == d.name.startswith("server"), d
