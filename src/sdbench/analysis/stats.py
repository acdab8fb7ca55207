"""Uncertainty of measured throughput and speedup: a stratified bootstrap over trials.

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

A speedup pairs the resamples of the SD cell and of its no-SD baseline by index
(independent runs, independent resamples), so the ratio's percentiles are its
interval. The draws are seeded: the same calls give the same interval.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

NUM_RESAMPLES = 2000
CONFIDENCE = 0.95


def _per_prompt_trials(calls: pd.DataFrame) -> list[np.ndarray]:
    """Tokens/s of each prompt's trials (one array per prompt, in call order)."""
    key = "call_index" if "call_index" in calls else "request_id"
    return [g["tokens_per_s"].to_numpy(dtype=float) for _, g in calls.groupby(key, sort=True)]


def point_estimate(calls: pd.DataFrame) -> float:
    """Mean over prompts of each prompt's median tokens/s across trials."""
    groups = _per_prompt_trials(calls)
    return float(np.mean([np.median(g) for g in groups])) if groups else float("nan")


def bootstrap(calls: pd.DataFrame, seed: int, resamples: int = NUM_RESAMPLES) -> np.ndarray:
    """Bootstrap draws of :func:`point_estimate`: engine starts (if several), then trials within each prompt."""
    if "engine_start" in calls and calls["engine_start"].nunique() > 1:
        return _bootstrap_starts(calls, seed, resamples)
    groups = _per_prompt_trials(calls)
    if not groups:
        return np.full(resamples, np.nan)
    rng = np.random.default_rng(seed)
    per_prompt = np.empty((len(groups), resamples))
    for i, trials in enumerate(groups):
        picks = rng.integers(0, len(trials), size=(resamples, len(trials)))
        per_prompt[i] = np.median(trials[picks], axis=1)
    return per_prompt.mean(axis=0)


def _bootstrap_starts(calls: pd.DataFrame, seed: int, resamples: int) -> np.ndarray:
    """Two-level draws: starts with replacement, then each start's trials within each prompt."""
    starts = [_per_prompt_trials(g) for _, g in calls.groupby("engine_start", sort=True)]
    n_starts, n_prompts = len(starts), len(starts[0])
    if any(len(s) != n_prompts for s in starts):
        raise ValueError("engine starts measured different prompt sets")
    rng = np.random.default_rng(seed)
    draws = np.empty(resamples)
    for b in range(resamples):
        chosen = rng.integers(0, n_starts, size=n_starts)
        medians = []
        for p in range(n_prompts):
            pooled = [starts[s][p][rng.integers(0, len(starts[s][p]), size=len(starts[s][p]))] for s in chosen]
            medians.append(np.median(np.concatenate(pooled)))
        draws[b] = np.mean(medians)
    return draws


def interval(draws: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Percentile interval of bootstrap draws (NaN when there are none)."""
    draws = np.asarray(draws, dtype=float)
    if draws.size == 0 or np.isnan(draws).all():
        return float("nan"), float("nan")
    tail = (1 - confidence) / 2 * 100
    low, high = np.nanpercentile(draws, [tail, 100 - tail])
    return float(low), float(high)


def ratio_interval(numerator: np.ndarray, denominator: np.ndarray) -> tuple[float, float]:
    """Interval of a ratio of two independently bootstrapped estimates (paired by index)."""
    n = min(len(numerator), len(denominator))
    if n == 0:
        return float("nan"), float("nan")
    return interval(np.asarray(numerator[:n], dtype=float) / np.asarray(denominator[:n], dtype=float))
