"""Intervals at the level that varies, and the verdict they can support.

A speedup's 95% interval is a claim about repeats of the whole measurement. What varies from one
repeat to the next on a shared machine is mostly the engine process (offline) or the server start
(server mode): thread placement and memory layout make one process 5-30% faster than the next,
and two engines in one process do not share all of it (a per-engine-instance factor the pairing
cannot cancel). Trials inside one process never see that, so an interval over trials of one
process is the spread of the wrong thing, and a design with one process per arm has no interval
at all. The unit of replication here is the process (``engine_start``) or the server start.

:func:`replicate_interval`: the speedup of each replicate (paired: SD's throughput over no SD's
in the same process; the log of it), a t interval on S - 1 degrees of freedom around their mean,
and its exponent. The point is the exponent of that mean, the statistic the interval is for.
:func:`welch_interval`: arms measured in separate processes (unpaired), each arm's log throughput
per replicate, Welch's t interval of the difference (Welch-Satterthwaite degrees of freedom).
Fewer than two replicates (per arm, unpaired) give no interval: the point is not judged.

Why t and not a bootstrap over starts: a percentile bootstrap of S clusters sees (S - 1) / S of
their variance and takes few distinct values (10 at S = 3), so at the 3-5 starts a site can afford
it is too narrow (``sdbench bench coverage`` measures by how much); the t interval is exact for
normal replicate means and needs no resampling. A wild cluster bootstrap (Webb's six-point weights)
is the remedy for regressions with few clusters; for the mean of S replicate values it is a t test
with a resampled critical value, which at S <= 5 takes at most 6^S values, so the exact t quantile
is used instead. Quantiles from :mod:`scipy.stats`.

:func:`judge` turns an interval into a verdict, with break-even as an equivalence claim (as two
one-sided tests do): ``pays`` above 1, ``loses`` below 1, ``break-even`` only where the whole
interval lies inside the stated margin ``[1 / (1 + m), 1 + m]`` (``verdict.equivalence_margin``
in the config, set before any data), ``undecided`` where it holds 1 but is wider, ``not judged``
without an interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from sdbench.analysis.stats import point_estimate

CONFIDENCE = 0.95
# The verdict's words (sdbench.analysis.verdictpoints re-exports them).
PAYS, BREAK_EVEN, LOSES, UNDECIDED, NOT_JUDGED = "pays", "break-even", "loses", "undecided", "not judged"
VERDICTS = (PAYS, BREAK_EVEN, LOSES, UNDECIDED, NOT_JUDGED)
# The config's default margin (schemas/config.schema.yaml, verdict.equivalence_margin): within +-3%
# SD and no SD are the same speed for a deployment decision, about the spread of a quiet GPU's runs.
DEFAULT_MARGIN = 0.03
T_START, T_WELCH = "t over starts", "Welch t over starts"  # the ``interval`` of a point


@dataclass(frozen=True)
class Interval:
    """A ratio's point and 95% interval (NaN bounds: none), from ``replicates`` replicates."""

    point: float
    low: float
    high: float
    replicates: int
    df: float

    @property
    def judged(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))


def _finite(values: Sequence[float]) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    return x[np.isfinite(x)]


def replicate_interval(log_ratios: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """A ratio's interval from its per-replicate log ratios: ``exp(mean +- t(S-1) * sd / sqrt(S))``.

    One replicate: the point, no interval (``df`` 0). Identical replicates: a zero-width interval."""
    x = _finite(log_ratios)
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0, 0.0)
    point = float(np.exp(x.mean()))
    if x.size < 2:
        return Interval(point, math.nan, math.nan, 1, 0.0)
    half = stats.t.ppf((1 + confidence) / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return Interval(point, float(np.exp(x.mean() - half)), float(np.exp(x.mean() + half)), int(x.size), x.size - 1.0)


def welch_interval(log_numerator: Sequence[float], log_denominator: Sequence[float],
                   confidence: float = CONFIDENCE) -> Interval:  # fmt: skip
    """The ratio of two arms measured apart (each value: one replicate's log throughput): Welch's t
    interval of the difference of means, exponentiated. Fewer than two replicates in either arm:
    the point only."""
    a, b = _finite(log_numerator), _finite(log_denominator)
    if a.size == 0 or b.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0, 0.0)
    diff = a.mean() - b.mean()
    replicates = int(min(a.size, b.size))
    if replicates < 2:
        return Interval(float(np.exp(diff)), math.nan, math.nan, replicates, 0.0)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    if se == 0.0:
        return Interval(float(np.exp(diff)), float(np.exp(diff)), float(np.exp(diff)), replicates, math.inf)
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    half = stats.t.ppf((1 + confidence) / 2, df) * se
    return Interval(float(np.exp(diff)), float(np.exp(diff - half)), float(np.exp(diff + half)), replicates, float(df))


def judge(low: float | None, high: float | None, margin: float = DEFAULT_MARGIN) -> str:
    """The verdict on one interval of SD over no SD (module docstring): pays / loses / break-even
    (inside ``[1 / (1 + margin), 1 + margin]``) / undecided / not judged."""
    if margin < 0:
        raise ValueError(f"verdict.equivalence_margin = {margin}: needs a number >= 0")
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return NOT_JUDGED
    if low > 1.0:
        return PAYS
    if high < 1.0:
        return LOSES
    if low >= 1.0 / (1.0 + margin) and high <= 1.0 + margin:
        return BREAK_EVEN
    return UNDECIDED


def false_verdicts_allowed(n: int, rate: float = 1 - CONFIDENCE, confidence: float = CONFIDENCE) -> int:
    """Of ``n`` A/A comparisons, the most that intervals of the nominal error ``rate`` judge pays or
    loses in ``confidence`` of runs: the binomial quantile (0 of 1, 1 of 3, 1 of 7, 2 of 10, 3 of 20)."""
    return int(stats.binom.ppf(confidence, n, rate)) if n > 0 else 0


def start_log_throughputs(calls: pd.DataFrame, column: str = "tokens_per_s") -> np.ndarray:
    """Per engine start (one without an ``engine_start`` column), the log of the paper's throughput
    (:func:`sdbench.analysis.stats.point_estimate`: the mean over prompts of each prompt's median)."""
    if calls.empty:
        return np.array([])
    groups = [calls] if "engine_start" not in calls else [g for _, g in calls.groupby("engine_start", sort=True)]
    return np.log([point_estimate(g, column) for g in groups])


def paired_start_log_ratios(calls: pd.DataFrame, baseline_calls: pd.DataFrame) -> np.ndarray:
    """Per engine start, the log of SD's throughput over the no-SD arm's timed in the same process."""
    sd, base = start_log_throughputs(calls), start_log_throughputs(baseline_calls)
    if sd.size != base.size:
        raise ValueError(f"paired arms measured in {sd.size} and {base.size} engine starts")
    return sd - base
