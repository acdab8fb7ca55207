"""A power model beside the step-time cost model, so the simulator's bounds exist for energy too.

The board's power during a step rises with the tokens it batches and saturates:

    P(n) = p_idle_w + p_span_w * n^h / (n^h + n_half^h)     (watts; n = batched tokens of the step)

a Hill curve: ``p_idle_w`` is the power of a step that batches next to nothing, ``p_idle_w +
p_span_w`` the saturated power, ``n_half`` the batched tokens at half the span and ``h`` how sharply
it rises there (h = 1: a hyperbola, too steep at a few tokens: on the H200 table the power of
1 to 4 tokens is flat, R^2 0.90 against 0.95 with h fitted, 2.55). A step's energy is its power times
its time (:mod:`sdbench.simulator.costmodel`: ``E = P(n) * t(kv, n)``), so with the time model the
energy of SD over no SD per output token is its time ratio times a power ratio:

    energy ratio = t(B(k+1)) / (tau * t(B)) * P(B(k+1)) / P(B)

(B sequences, k drafts verified, tau tokens accepted per step; drafting not counted). Power rising
with n makes the energy ratio at least the time ratio; they part most at mid batch sizes, where a
step's power still climbs with its tokens while its time barely moves, and agree again once power
saturates. One H200 (the shared step cost and energy table, ``h200-step-cost-energy.csv``): verifying 4 tokens per sequence
instead of 1 costs +6% time and +32% energy at batch 16, +73% and +70% at batch 128.

:func:`fit_power_model` fits the form to (tokens, watts) points by least squares (``h`` and
``n_half`` on a grid, the linear pair exactly for each); :func:`cell_power_points` takes those points from
measured cells (``mean_power_w`` of cells with a meter; tokens per step = batch size x (k + 1) for
an SD cell, which verifies k + 1 tokens per sequence each step, and the batch size without SD).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

# Grid of (h, n_half): h 0.5..4 in steps of 0.05; n_half 1/4 token to 63k tokens, 100 per decade.
_H_GRID = np.round(np.arange(0.5, 4.0001, 0.05), 2)
_N_HALF_GRID = np.logspace(-0.6, 4.8, 541)


@dataclass(frozen=True)
class PowerModel:
    """``P(n) = p_idle_w + p_span_w * n^h / (n^h + n_half^h)`` (module docstring)."""

    p_idle_w: float
    p_span_w: float
    n_half: float
    h: float = 1.0
    r2: float = math.nan

    def watts(self, tokens: Any) -> Any:
        """Power (W) of a step batching ``tokens``; elementwise on arrays."""
        n = np.asarray(tokens, dtype=float) ** self.h
        return self.p_idle_w + self.p_span_w * n / (n + self.n_half**self.h)

    def describe(self) -> str:
        return (f"P(n) = {self.p_idle_w:.4g} W + {self.p_span_w:.4g} W x n^h / (n^h + {self.n_half:.3g}^h), "
                f"h = {self.h:g}, n = batched tokens per step (R^2 {self.r2:.3f})")  # fmt: skip


def fit_power_model(tokens: Any, watts: Any) -> PowerModel:
    """Least-squares fit of :class:`PowerModel` to points (batched tokens, watts); ``p_span_w`` >= 0."""
    n, w = np.asarray(tokens, dtype=float), np.asarray(watts, dtype=float)
    keep = np.isfinite(n) & np.isfinite(w)
    n, w = n[keep], w[keep]
    if len(n) < 3 or len(np.unique(n)) < 2:
        raise ValueError(f"power model: {len(n)} point(s) at {len(np.unique(n))} token count(s); need 3 at 2 or more")
    h, half = (g.ravel() for g in np.meshgrid(_H_GRID, _N_HALF_GRID, indexing="ij"))
    f = n[None, :] ** h[:, None]
    f = f / (f + half[:, None] ** h[:, None])  # one row of shape values per (h, n_half)
    fc = f - f.mean(axis=1, keepdims=True)
    # The linear pair exactly per row (simple regression of w on f), the span clipped at 0 (flat).
    span = np.clip((fc @ (w - w.mean())) / np.maximum((fc**2).sum(axis=1), 1e-300), 0.0, None)
    idle = w.mean() - span * f.mean(axis=1)
    sse = ((w[None, :] - idle[:, None] - span[:, None] * f) ** 2).sum(axis=1)
    i = int(np.argmin(sse))  # the first best: deterministic
    total = float(np.sum((w - w.mean()) ** 2))
    return PowerModel(float(idle[i]), float(span[i]), float(half[i]), float(h[i]),
                      1.0 - float(sse[i]) / total if total > 0 else math.nan)  # fmt: skip


def energy_ratio(power: PowerModel, time_sd_s: Any, time_base_s: Any, batch: Any, k: Any, tau: Any) -> Any:
    """SD's energy per output token over no SD's (module docstring): step times ``time_sd_s``
    (verifying k + 1 tokens per sequence) and ``time_base_s`` (one), ``tau`` tokens per SD step."""
    batch, k = np.asarray(batch, dtype=float), np.asarray(k, dtype=float)
    time_ratio = np.asarray(time_sd_s, dtype=float) / (np.asarray(tau, dtype=float) * np.asarray(time_base_s, dtype=float))
    return time_ratio * power.watts(batch * (k + 1)) / power.watts(batch)


def step_energy_j(power: PowerModel, cost: Any, kv_tokens: Any, batched_tokens: Any) -> Any:
    """Joules of one target step under a time cost model (sdbench.simulator.costmodel.CostModel):
    ``P(batched) * (target time + overhead per step)``."""
    seconds = cost.target.time(kv_tokens, batched_tokens) + cost.overhead_per_step
    return power.watts(batched_tokens) * seconds


def cell_power_points(cells: pd.DataFrame) -> pd.DataFrame:
    """(``tokens_per_step``, ``mean_power_w``) of the cells whose energy was measured (cells.parquet)."""
    if "mean_power_w" not in cells:
        return pd.DataFrame({"tokens_per_step": [], "mean_power_w": []})
    measured = cells[cells["mean_power_w"].notna()]
    k = measured["num_speculative_tokens"].fillna(0).astype(float) if "num_speculative_tokens" in measured else 0.0
    return pd.DataFrame({"tokens_per_step": measured["batch_size"].astype(float) * (k + 1),
                         "mean_power_w": measured["mean_power_w"].astype(float)})  # fmt: skip
