"""Non-negative least squares for the simulator's fits (cost, step energy, calibration).

A leaf module (numpy only): the fits that use it import each other's callers, so it lives
apart from them to keep the simulator's import graph acyclic.
"""

from __future__ import annotations

import numpy as np


def nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: drop the most negative one and refit until none is."""
    free = np.ones(x.shape[1], bool)
    coef = np.zeros(x.shape[1])
    while free.any():
        sol, *_ = np.linalg.lstsq(x[:, free], y, rcond=None)
        if (sol >= 0).all():
            coef[free] = sol
            break
        idx = np.flatnonzero(free)[int(np.argmin(sol))]
        free[idx] = False
    return coef
