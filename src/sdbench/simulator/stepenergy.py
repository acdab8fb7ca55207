"""Energy per verification step from batch size, tokens per sequence and context, fitted on joules alone.

The older power model (:class:`sdbench.simulator.powermodel.PowerModel`: watts against batched
tokens) is fitted on ``joules / ms``. In the shared H100/H200 tables those two come from different
windows (``ms``: 20 CUDA-graph replays; ``joules``: at least 1.5 s of replays, where the board
clocks down under its power limit; the tables' own README says so), so their quotient is no power (up
to 749 W on a 700 W board) and the fit's parameters are not physical. This model prices a step's
**energy** directly, from the quantity one window measured:

    E(B, q, L) = e_fixed + e_token * B q + e_kv * B L + e_ramp * min(B q, knee)        (joules)

``B`` sequences, ``q`` new tokens each (``B q`` batched tokens), a KV cache of ``L`` tokens each
(``B L`` KV tokens). ``line`` is the form without the ramp; ``ramp`` adds it: below ``knee``
batched tokens a step is memory-bound and each extra token also raises the board's power at a
nearly fixed step time (joules per token ``e_token + e_ramp``), above it only ``e_token`` (compute
at the power cap). Every coefficient is >= 0 (an energy never falls with more work). Other terms
were tried on the shared tables and left out by held-out error: one per sequence (``B``) fitted 0,
and attention over the context per new token (``B q L``) trades with ``e_token`` and doubles the
error at a context it was not fitted on.

:func:`fit_step_energy` fits both forms by least squares of the relative error on the rows not held
out (every 4th in (L, B, q) order), keeps the one with the smaller held-out median (the line on a
tie within half a percent) and refits it on every row. Rows: a calibration table's same-window
rows (``same_window`` true: time and energy from one window) where it has them, else every row
with ``joules`` (the shared tables: energy alone). :func:`implied_watts` divides the model's
energy by the step time of the same window (``ms`` of a same-window row), or says that the time
came from another window (the shared tables: ``ms`` is the 20-replay median, the energy window's
steps are no faster, so those watts are an upper bound). :func:`heldout_errors` compares it with
the old model: every-4th and context-out (a context predicted from the others), per table.

In the simulator (``sdbench simulate --power-model FILE``, :mod:`sdbench.simulator.pricing`) a
step's target pass costs ``E`` and its drafting and per-step overhead cost their seconds at the
target pass's implied power ``E / t`` (``t``: the cost model's target time of that step), as the
old model priced every second at ``P(batched tokens)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

KIND = "step_energy"  # the model file's ``kind`` (a file without one holds the old PowerModel)
FORMS = ("line", "ramp")
TIE = 0.005  # held-out medians this close: the line (fewer parameters)
_KNEES = np.geomspace(2.0, 1024.0, 64)
PARAMETERS = ("e_fixed", "e_token", "e_kv", "e_ramp", "knee_tokens")


@dataclass(frozen=True)
class StepEnergyModel:
    """``E = e_fixed + e_token n + e_kv kv + e_ramp min(n, knee_tokens)`` joules per target step."""

    e_fixed: float
    e_token: float
    e_kv: float
    e_ramp: float = 0.0
    knee_tokens: float = 0.0
    form: str = "line"
    heldout_median: float = math.nan  # relative error on the held-out rows of its fit
    heldout_max: float = math.nan
    source: str = ""

    def joules(self, batched_tokens: Any, kv_tokens: Any) -> Any:
        """Joules of a target step batching ``batched_tokens`` over ``kv_tokens``; elementwise."""
        n, kv = np.asarray(batched_tokens, dtype=float), np.asarray(kv_tokens, dtype=float)
        return self.e_fixed + self.e_token * n + self.e_kv * kv + self.e_ramp * np.minimum(n, self.knee_tokens)

    def describe(self) -> str:
        ramp = f" + {self.e_ramp:.4g} J x min(n, {self.knee_tokens:.0f})" if self.form == "ramp" else ""
        held = "" if math.isnan(self.heldout_median) else (
            f"; held-out error median {100 * self.heldout_median:.1f}%, largest {100 * self.heldout_max:.1f}%")
        return (f"E = {self.e_fixed:.4g} J + {self.e_token:.4g} J x n + {self.e_kv:.4g} J x kv{ramp} per step "
                f"({self.form}; n = B x q batched tokens, kv = B x L){held}")  # fmt: skip

    def label(self) -> str:
        """Its source and form in one line (the simulator's ``power_model`` column)."""
        return f"{self.source}: {self.describe()}" if self.source else self.describe()

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": KIND, "form": self.form}
        data.update({k: float(getattr(self, k)) for k in PARAMETERS})
        data.update(heldout_median=_none(self.heldout_median), heldout_max=_none(self.heldout_max))
        return data


def _none(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


def from_dict(data: dict[str, Any], where: str) -> StepEnergyModel:
    """The model of a file's mapping (``kind: step_energy``); ValueError naming the bad key."""
    form = data.get("form")
    if form not in FORMS:
        raise ValueError(f"{where}: step energy model: form {form!r} is not one of {', '.join(FORMS)}")
    values = {}
    for key in PARAMETERS:
        value = data.get(key, 0.0 if key in ("e_ramp", "knee_tokens") else None)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
            raise ValueError(f"{where}: step energy model: {key} = {value!r}, needs a number >= 0")
        values[key] = float(value)
    held = {k: math.nan if data.get(k) is None else float(data[k]) for k in ("heldout_median", "heldout_max")}
    return StepEnergyModel(**values, form=form, **held, source=str(data.get("source") or where))


# ----------------------------------------------------------------------------- fitting
def _design(n: np.ndarray, kv: np.ndarray, knee: float | None) -> np.ndarray:
    cols = [np.ones_like(n), n, kv]
    if knee is not None:
        cols.append(np.minimum(n, knee))
    return np.column_stack(cols)


def _relative_fit(n: np.ndarray, kv: np.ndarray, y: np.ndarray, knee: float | None) -> tuple[np.ndarray, float]:
    """Coefficients >= 0 minimising the squared relative error (rows weighted 1/y), and that sum."""
    from sdbench.simulator.lstsq import nonnegative_lstsq

    x, w = _design(n, kv, knee), 1.0 / y
    coef = nonnegative_lstsq(x * w[:, None], y * w)
    return coef, float(np.sum(((x @ coef - y) * w) ** 2))


def fit_form(batched: Any, kv: Any, joules: Any, form: str) -> StepEnergyModel:
    """One form fitted to every given row (``ramp``: the knee the best of a log grid, 2 to 1024 tokens)."""
    n, k, y = (np.asarray(a, dtype=float) for a in (batched, kv, joules))
    if len(y) < (4 if form == "line" else 6):
        raise ValueError(f"step energy {form}: {len(y)} row(s), too few to fit")
    if form == "line":
        c, _ = _relative_fit(n, k, y, None)
        return StepEnergyModel(float(c[0]), float(c[1]), float(c[2]))
    if form != "ramp":
        raise ValueError(f"step energy: form {form!r} is not one of {', '.join(FORMS)}")
    fits = [(_relative_fit(n, k, y, knee), knee) for knee in _KNEES]
    (c, _), knee = min(fits, key=lambda f: f[0][1])  # the first best: deterministic
    if c[3] <= 0:  # no ramp at any knee: it is the line
        return fit_form(n, k, y, "line")
    return StepEnergyModel(float(c[0]), float(c[1]), float(c[2]), float(c[3]), float(knee), "ramp")


def table_rows(table: pd.DataFrame, where: str = "table") -> tuple[pd.DataFrame, bool]:
    """The rows a step energy model is fitted on (module docstring) and whether they are same-window."""
    missing = [c for c in ("B", "q", "L", "joules") if c not in table]
    if missing:
        raise ValueError(f"{where}: a step energy fit needs columns B, q, L, joules; lacks {missing}")
    if "component" in table:  # a calibration table: the target's rows
        table = table[table["component"] == "target"]
    metered = table[np.isfinite(table["joules"].astype(float)) & (table["joules"].astype(float) > 0)]
    same = metered["same_window"].fillna(False).astype(bool) if "same_window" in metered else None
    if same is not None and same.any():
        return metered[same].reset_index(drop=True), True
    return metered.reset_index(drop=True), False


def every_4th(table: pd.DataFrame) -> np.ndarray:
    """Held-out rows: every 4th in (L, B, q) order (positions 3, 7, ...), as ``calibrate fit``'s default."""
    mask = np.zeros(len(table), bool)
    mask[np.lexsort((table["q"].to_numpy(), table["B"].to_numpy(), table["L"].to_numpy()))[3::4]] = True
    return mask


def _nk(table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    b = table["B"].to_numpy(float)
    return b * table["q"].to_numpy(float), b * table["L"].to_numpy(float)


def relative_errors(model: StepEnergyModel, table: pd.DataFrame) -> np.ndarray:
    n, kv = _nk(table)
    y = table["joules"].to_numpy(float)
    return np.abs(model.joules(n, kv) - y) / y


def fit_step_energy(table: pd.DataFrame, source: str = "") -> StepEnergyModel:
    """The step energy model of a table (module docstring): each form fitted on the rows not held
    out (every 4th), the smaller held-out median kept (the line within :data:`TIE`), refitted on all."""
    rows, same = table_rows(table, source or "table")
    hold = every_4th(rows)
    n, kv = _nk(rows)
    y = rows["joules"].to_numpy(float)
    scored = []
    for form in FORMS:
        try:
            model = fit_form(n[~hold], kv[~hold], y[~hold], form)
        except ValueError:
            continue
        err = relative_errors(model, rows[hold])
        scored.append((float(np.median(err)), float(err.max()), model.form))
    if not scored or not hold.any():
        raise ValueError(f"{source or 'table'}: {len(rows)} metered row(s), too few to fit and hold out "
                         "a step energy model")
    line = next((s for s in scored if s[2] == "line"), None)
    best = min(scored, key=lambda s: s[0])
    if line is not None and line[0] <= best[0] + TIE:
        best = line
    whole = fit_form(n, kv, y, best[2])
    what = "same-window rows" if same else "rows, joules alone"
    return StepEnergyModel(whole.e_fixed, whole.e_token, whole.e_kv, whole.e_ramp, whole.knee_tokens, whole.form,
                           best[0], best[1], f"fitted to {len(rows)} {what} of {source or 'a table'}")  # fmt: skip


def implied_watts(model: StepEnergyModel, table: pd.DataFrame) -> tuple[np.ndarray, str]:
    """The model's energy over each row's step time, and which window that time is from."""
    rows, same = table_rows(table)
    n, kv = _nk(rows)
    watts = model.joules(n, kv) / (rows["ms"].to_numpy(float) / 1e3)
    if same:
        return watts, "model joules / ms of the same window"
    return watts, ("model joules / ms of another window (the 20-replay median; the energy window's steps are "
                   "no faster, so these watts are an upper bound)")  # fmt: skip
