"""Uncertainty for the analyses: the measurement's bootstrap (:mod:`sdbench.engine.measure.resampling`,
where the method is described) and the interval of a ratio of two independent estimates.

The bootstrap lives with the measurement because it decides how many trials a cell takes
(``run.target_half_width``); an edit here re-runs analyses only.
"""

from __future__ import annotations

import numpy as np

from sdbench.engine.measure.resampling import (  # noqa: F401 - the analyses' names for the measurement's estimators
    CONFIDENCE,
    NUM_RESAMPLES,
    bootstrap,
    interval,
    paired_bootstrap,
    point_estimate,
    relative_half_width,
)


def ratio_interval(numerator: np.ndarray, denominator: np.ndarray) -> tuple[float, float]:
    """Interval of a ratio of two independently bootstrapped estimates (paired by index)."""
    n = min(len(numerator), len(denominator))
    if n == 0:
        return float("nan"), float("nan")
    return interval(np.asarray(numerator[:n], dtype=float) / np.asarray(denominator[:n], dtype=float))
