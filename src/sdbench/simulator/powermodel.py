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

The simulator's energy bounds (``sdbench simulate --power-model FILE.json``; ``energy_ratio``,
``baseline_tokens_per_j``, ``sd_tokens_per_j`` of its rows) price each simulated step as its time
under the cost model (exactly the time bound's step, drafting and overhead included) times
``P(tokens the step batches)``. A model file (:func:`save_power_model`, :func:`load_power_model`)
holds the fitted parameters and a ``source``; where no cell measured energy it holds no
parameters and a ``reason`` instead (``sdbench costmodel power``, :func:`cells_power_model`), and
the simulator's energy columns are NaN with that reason in its ``power_model`` column, never 0.

Fitted on ``joules / ms``, this model is only a power where time and energy came from one window; the
shared H100/H200 tables' did not (up to 749 W on a 700 W board). :mod:`sdbench.simulator.stepenergy`
fits a step's energy from ``B``, ``q`` and ``L`` on joules alone; its file (``kind: step_energy``)
loads here too, and the simulator prices it through :func:`step_watts`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sdbench.io import read_parquet, write_text

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
    source: str = ""  # where it was fitted (the simulator's ``power_model`` column)

    def watts(self, tokens: Any) -> Any:
        """Power (W) of a step batching ``tokens``; elementwise on arrays."""
        n = np.asarray(tokens, dtype=float) ** self.h
        return self.p_idle_w + self.p_span_w * n / (n + self.n_half**self.h)

    def describe(self) -> str:
        return (f"P(n) = {self.p_idle_w:.4g} W + {self.p_span_w:.4g} W x n^h / (n^h + {self.n_half:.3g}^h), "
                f"h = {self.h:g}, n = batched tokens per step (R^2 {self.r2:.3f})")  # fmt: skip

    def label(self) -> str:
        """Its source and form in one line (the simulator's ``power_model`` column)."""
        return f"{self.source}: {self.describe()}" if self.source else self.describe()


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


def step_watts(power: Any, target: Any, batched_tokens: Any, kv_tokens: Any) -> Any:
    """The power (W) at which the simulator prices a step's seconds: ``P(batched)`` of a
    :class:`PowerModel`; a step energy model's (:mod:`sdbench.simulator.stepenergy`) joules of the
    target pass over its seconds under ``target`` (the cost model's ``TargetCost``), so that the
    target pass costs exactly the model's joules and drafting and overhead cost their seconds at
    that pass's power. Elementwise."""
    if isinstance(power, PowerModel):
        return power.watts(batched_tokens)
    seconds = target.time(np.asarray(kv_tokens, dtype=float), np.asarray(batched_tokens, dtype=float))
    return power.joules(batched_tokens, kv_tokens) / seconds


def step_energy_j(power: Any, cost: Any, kv_tokens: Any, batched_tokens: Any) -> Any:
    """Joules of one target step under a time cost model (sdbench.simulator.costmodel.CostModel):
    ``watts * (target time + overhead per step)`` (:func:`step_watts`: a step energy model's own
    joules for the target pass, its power for the overhead)."""
    seconds = cost.target.time(kv_tokens, batched_tokens) + cost.overhead_per_step
    return step_watts(power, cost.target, batched_tokens, kv_tokens) * seconds


def cell_power_points(cells: pd.DataFrame) -> pd.DataFrame:
    """(``tokens_per_step``, ``mean_power_w``) of the cells whose energy was measured (cells.parquet)."""
    if "mean_power_w" not in cells:
        return pd.DataFrame({"tokens_per_step": [], "mean_power_w": []})
    measured = cells[cells["mean_power_w"].notna()]
    k = measured["num_speculative_tokens"].fillna(0).astype(float) if "num_speculative_tokens" in measured else 0.0
    return pd.DataFrame({"tokens_per_step": measured["batch_size"].astype(float) * (k + 1),
                         "mean_power_w": measured["mean_power_w"].astype(float)})  # fmt: skip



# Why a simulation has no energy bound (its ``power_model`` column; energy columns NaN).
NO_POWER_MODEL_GIVEN = "no power model: none given (sdbench simulate --power-model)"
NO_CELL_ENERGY = "no power model: no cell measured energy"
_PARAMETERS = ("p_idle_w", "p_span_w", "n_half", "h", "r2")


def cells_power_model(cells: pd.DataFrame, source: str = "cells") -> tuple[PowerModel | None, str]:
    """The power model fitted to the metered cells of ``cells`` (:func:`cell_power_points`), and
    its ``source``; ``(None, reason)`` where no cell measured energy or too few did to fit one,
    or where the cells were measured by different meters (GPU and CPU watts are not one curve)."""
    points = cell_power_points(cells)
    if points.empty:
        return None, NO_CELL_ENERGY
    meters = sorted(set(cells.loc[cells["mean_power_w"].notna(), "energy_meter"])) if "energy_meter" in cells else []
    if len(meters) > 1:
        return None, f"no power model: the cells were measured by several meters ({', '.join(meters)})"
    n, counts = len(points), points["tokens_per_step"].nunique()
    if n < 3 or counts < 2:
        return None, (f"no power model: {n} cell(s) measured energy at {counts} batched-token count(s); "
                      "need 3 at 2 or more")
    fitted = fit_power_model(points["tokens_per_step"], points["mean_power_w"])
    meter = f" ({meters[0]})" if meters else ""
    return PowerModel(fitted.p_idle_w, fitted.p_span_w, fitted.n_half, fitted.h, fitted.r2,
                      f"fitted to {n} metered cell(s){meter} of {source}"), ""  # fmt: skip


def save_power_model(model: Any, path: str | os.PathLike[str], reason: str = "") -> None:
    """Write ``model`` as JSON (its parameters and ``source``; a step energy model with ``kind:
    step_energy``), or with no model its ``reason``."""
    from sdbench import provenance
    from sdbench.simulator.stepenergy import StepEnergyModel

    if isinstance(model, StepEnergyModel):
        data = {**model.to_dict(), "source": model.source, "reason": "", "form_text": model.describe()}
    elif model is None:
        data: dict[str, Any] = dict.fromkeys(_PARAMETERS)
        data.update(source="", reason=reason or NO_CELL_ENERGY)
    else:
        data = {k: (None if math.isnan(v) else v) for k, v in ((k, float(getattr(model, k))) for k in _PARAMETERS)}
        data.update(source=model.source, reason="", form=model.describe())
    data["measured"] = provenance.measured()
    write_text(json.dumps(data, indent=2) + "\n", path)


def load_power_model(path: str | os.PathLike[str]) -> tuple[Any, str]:
    """A power model file: ``(model, "")``, or ``(None, reason)`` for a file written without one.
    ``kind: step_energy`` holds a :class:`sdbench.simulator.stepenergy.StepEnergyModel`; a file
    without ``kind`` the older :class:`PowerModel` (still loaded as it was written)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: power model: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: power model: expected a JSON object")
    from sdbench import provenance

    provenance.observe(None, str(path), measured=data.get("measured") is not False)  # fitted to rehearsal cells
    kind = data.get("kind")
    if kind is not None:
        from sdbench.simulator import stepenergy

        if kind != stepenergy.KIND:
            raise ValueError(f"{path}: power model: kind {kind!r} is not known (step_energy, or none: the older "
                             "watts-against-tokens model)")  # fmt: skip
        return stepenergy.from_dict(data, str(path)), ""
    if data.get("p_idle_w") is None:
        reason = data.get("reason") or ""
        if not reason:
            raise ValueError(f"{path}: power model: no parameters (p_idle_w ...) and no reason")
        return None, reason
    missing = [k for k in _PARAMETERS[:4] if not isinstance(data.get(k), (int, float))]
    if missing:
        raise ValueError(f"{path}: power model: {', '.join(missing)} missing or not numbers")
    r2 = data.get("r2")
    model = PowerModel(*(float(data[k]) for k in _PARAMETERS[:4]), math.nan if r2 is None else float(r2),
                       str(data.get("source") or path))  # fmt: skip
    if model.p_idle_w < 0 or model.p_span_w < 0 or model.n_half <= 0 or model.h <= 0:
        raise ValueError(f"{path}: power model: needs p_idle_w, p_span_w >= 0 and n_half, h > 0")
    return model, ""


def _cmd_power(args: argparse.Namespace) -> int:
    cells = read_parquet(args.cells, what="cells table")
    source = str(args.cells)
    for key in ("engine", "model"):  # the cells of the engine x model whose steps priced the simulations
        value = getattr(args, key, None)
        if value:
            if key not in cells:
                raise ValueError(f"{args.cells}: cells table lacks column {key!r}")
            cells = cells[cells[key] == value]
    if getattr(args, "engine", None) or getattr(args, "model", None):
        source = f"{args.engine or '*'}/{args.model or '*'} in {source}"
    model, reason = cells_power_model(cells, source)
    save_power_model(model, args.output, reason)
    print(model.describe() + f"; {model.source}" if model else reason)
    print(f"wrote {args.output}")
    return 0
