"""Uncertainty of measured throughput and speedup: a stratified bootstrap over trials.

Part of the measurement (:mod:`sdbench.engine.scope`): a cell with ``run.target_half_width``
takes trials until :func:`relative_half_width` is narrow enough, and its summary records these
intervals. The analyses read them through :mod:`sdbench.analysis.stats`.

A cell times the same prompts in repeated trials (one ``generate`` call per prompt
and trial). The prompt set is the workload, not a sample to generalise from, so
the interval describes measurement noise: for each prompt we resample its trials
with replacement, take the median per prompt, and average over prompts (the
paper's metric is the mean over calls of output tokens / wall time). The 2.5 and
97.5 percentiles of that statistic over the resamples give the 95% interval.

When a cell was measured in several engine processes (``engine_start`` column,
``run.engine_starts``) the bootstrap is two-level: each resample first draws the
engine starts with replacement, then each drawn start's trials within each prompt,
so the interval covers the process-to-process differences (thread placement,
memory layout) that trials within one process never see.

A speedup measured in pairs (``run.paired_baseline``: the SD cell's calls interleaved
with the same calls on a no-SD engine in the same process) resamples both arms with
the same indices (:func:`paired_bootstrap`), so the process-to-process factor cancels.
Without pairing, the resamples of the SD cell and of its separately measured no-SD cell
are paired by index (independent runs, independent resamples) and the ratio's
percentiles are its interval. The draws are seeded: the same calls give the same interval.

Joules per output token and the paired energy ratio are estimated the same way, on another
per-call column (``column``; sdbench.engine.measure.energy).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

NUM_RESAMPLES = 2000
CONFIDENCE = 0.95


def _per_prompt_trials(calls: pd.DataFrame, column: str = "tokens_per_s") -> list[np.ndarray]:
    """``column`` (tokens/s) of each prompt's trials (one array per prompt, in call order)."""
    key = "call_index" if "call_index" in calls else "request_id"
    return [g[column].to_numpy(dtype=float) for _, g in calls.groupby(key, sort=True)]


def point_estimate(calls: pd.DataFrame, column: str = "tokens_per_s") -> float:
    """Mean over prompts of each prompt's median ``column`` (tokens/s; joules/token) across trials."""
    groups = _per_prompt_trials(calls, column)
    return float(np.mean([np.median(g) for g in groups])) if groups else float("nan")


def bootstrap(calls: pd.DataFrame, seed: int, resamples: int = NUM_RESAMPLES, column: str = "tokens_per_s") -> np.ndarray:
    """Bootstrap draws of :func:`point_estimate`: engine starts (if several), then trials within each prompt."""
    if calls.empty:
        return np.full(resamples, np.nan)
    return _draws([_start_trials(calls, column)], seed, resamples)[0]


def paired_bootstrap(
    numerator: pd.DataFrame,
    denominator: pd.DataFrame,
    seed: int,
    resamples: int = NUM_RESAMPLES,
    column: str = "tokens_per_s",
) -> np.ndarray:
    """Bootstrap draws of the ratio of two arms measured in pairs (a paired speedup).

    Both arms timed the same calls, interleaved in the same process(es)
    (sdbench.engine.measure.paired): each resample draws engine starts and then trials once and
    applies the same draw to both arms, so what the two arms shared (the process's speed,
    a slow minute) cancels in the ratio instead of widening it.
    """
    keys = [c for c in ("engine_start", "call_index", "trial") if c in numerator]
    if not set(keys) <= set(denominator):
        raise ValueError(f"paired bootstrap: the baseline arm lacks columns {sorted(set(keys) - set(denominator))}")
    numerator = numerator.sort_values(keys, kind="stable")
    denominator = denominator.sort_values(keys, kind="stable")
    if not numerator[keys].reset_index(drop=True).equals(denominator[keys].reset_index(drop=True)):
        raise ValueError("paired bootstrap: the two arms did not time the same calls and trials")
    num, den = _draws([_start_trials(numerator, column), _start_trials(denominator, column)], seed, resamples)
    return num / den


def _start_trials(calls: pd.DataFrame, column: str = "tokens_per_s") -> list[list[np.ndarray]]:
    """Per engine start (one if there is no ``engine_start`` column), each prompt's trials."""
    if "engine_start" not in calls:
        return [_per_prompt_trials(calls, column)]
    return [_per_prompt_trials(g, column) for _, g in calls.groupby("engine_start", sort=True)]


def _draws(arms: list[list[list[np.ndarray]]], seed: int, resamples: int) -> np.ndarray:
    """Draws of :func:`point_estimate` per arm (rows), every arm resampled with the same indices.

    One engine start: per prompt, its trials with replacement. Several: first the starts
    with replacement, then each drawn start's trials within each prompt, pooled.
    """
    n_starts, n_prompts = len(arms[0]), len(arms[0][0])
    if any(len(s) != n_prompts for arm in arms for s in arm):
        raise ValueError("engine starts measured different prompt sets")
    rng = np.random.default_rng(seed)
    if n_starts == 1:
        per_prompt = np.empty((len(arms), n_prompts, resamples))
        for p in range(n_prompts):
            n = len(arms[0][0][p])
            picks = rng.integers(0, n, size=(resamples, n))
            for a, arm in enumerate(arms):
                per_prompt[a, p] = np.median(arm[0][p][picks], axis=1)
        return per_prompt.mean(axis=1)
    draws = np.empty((len(arms), resamples))
    for b in range(resamples):
        chosen = rng.integers(0, n_starts, size=n_starts)
        medians = np.empty((len(arms), n_prompts))
        for p in range(n_prompts):
            picks = [rng.integers(0, len(arms[0][s][p]), size=len(arms[0][s][p])) for s in chosen]
            for a, arm in enumerate(arms):
                medians[a, p] = np.median(np.concatenate([arm[s][p][i] for s, i in zip(chosen, picks)]))
        draws[:, b] = medians.mean(axis=1)
    return draws


def interval(draws: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Percentile interval of bootstrap draws (NaN when there are none)."""
    draws = np.asarray(draws, dtype=float)
    if draws.size == 0 or np.isnan(draws).all():
        return float("nan"), float("nan")
    tail = (1 - confidence) / 2 * 100
    low, high = np.nanpercentile(draws, [tail, 100 - tail])
    return float(low), float(high)


def relative_half_width(arms: list[pd.DataFrame], seed: int) -> float:
    """Half the 95% interval over the point estimate: of one arm's throughput, or of the paired
    ratio ``arms[1] / arms[0]`` (an SD arm over its no-SD arm). Infinite until every prompt has a trial."""
    if any(a.empty for a in arms):
        return float("inf")
    if len(arms) == 1:
        point, draws = point_estimate(arms[0]), bootstrap(arms[0], seed)
    else:
        point = point_estimate(arms[1]) / point_estimate(arms[0])
        draws = paired_bootstrap(arms[1], arms[0], seed)
    low, high = interval(draws)
    return float((high - low) / 2 / point) if point > 0 else float("inf")
