"""``sdbench calibrate fit``: a cost model (and power model) from a calibration table.

Fits a cost model in the simulator's format (:mod:`costmodel`) from such
a table, or from any table with columns ``B, q, L, ms`` (a published step-cost table, given by path):
a straight line in batched tokens and a hinge (a knee fitted on a grid) are both fitted, each with
the KV term, on the rows not held out, and the shape with the smaller held-out median relative
error is refitted on every row and written. Its power model (watts against batched tokens,
:mod:`powermodel`) is fitted only from rows whose time and energy came from one window; otherwise
the energy per step is fitted on ``joules`` alone and reported (no power model written).

The table comes from :mod:`sdbench.simulator.calibrate` (the timing harness).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sdbench.io import read_csv, read_parquet
from sdbench.simulator.costmodel import CostModel, DrafterCost, TargetCost, load_cost_model, save_cost_model

HOLDOUT_RULES: tuple[str, ...] = ("every-4th", "random")
STATISTICS: tuple[str, ...] = ("median", "min")  # which window of a point's the fit reads


@dataclass(frozen=True)
class ShapeFit:
    """One shape fitted on the rows not held out, and its errors (relative, |pred - y| / y)."""

    shape: str  # line | hinge
    coef: dict[str, float]  # c_fixed, c_compute, c_kv (+ knee_tokens, c_above_knee)
    heldout_median: float
    heldout_max: float
    train_rows: int
    heldout_rows: int
    worst: str = ""  # the held-out row of the largest error (B, q, L)


@dataclass(frozen=True)
class SeriesFit:
    """A quantity (seconds or joules per step) fitted both ways, the chosen shape refitted on all rows."""

    what: str
    shapes: list[ShapeFit]
    chosen: str
    coef: dict[str, float]
    median: float  # the chosen refit's errors over every row (in-sample)
    largest: float
    notes: list[str] = field(default_factory=list)


def holdout_mask(frame: pd.DataFrame, rule: str, seed: int = 0) -> np.ndarray:
    """Rows held out: ``every-4th`` row in (L, B, q) order (positions 3, 7, 11, ...), or a
    ``random`` 25% drawn with ``seed``."""
    n = len(frame)
    mask = np.zeros(n, bool)
    if rule == "every-4th":
        order = np.lexsort((frame["q"].to_numpy(), frame["B"].to_numpy(), frame["L"].to_numpy()))
        mask[order[3::4]] = True
    elif rule == "random":
        mask[np.random.default_rng(seed).permutation(n)[: round(n / 4)]] = True
    else:
        raise ValueError(f"--holdout: {rule!r} is not a rule (choose from {', '.join(HOLDOUT_RULES)})")
    return mask


def _design(n: np.ndarray, kv: np.ndarray, knee: float | None) -> np.ndarray:
    cols = [np.ones_like(n), n, kv]
    if knee is not None:
        cols.append(np.maximum(n - knee, 0.0))
    return np.column_stack(cols)


def _relative_nnls(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Coefficients >= 0 minimising the squared *relative* error (rows weighted 1/y), and that sum."""
    from sdbench.simulator.lstsq import nonnegative_lstsq

    w = 1.0 / y
    coef = nonnegative_lstsq(x * w[:, None], y * w)
    return coef, float(np.sum(((x @ coef - y) * w) ** 2))


def fit_shape(n: np.ndarray, kv: np.ndarray, y: np.ndarray, shape: str) -> dict[str, float]:
    """``line``: ``c_fixed + c_compute n + c_kv kv``; ``hinge``: plus ``c_above_knee max(0, n - knee)``,
    the knee the best of a log grid over the rows' batched tokens, refined between its neighbours."""
    if shape == "line":
        c, _ = _relative_nnls(_design(n, kv, None), y)
        return {"c_fixed": c[0], "c_compute": c[1], "c_kv": c[2]}
    lo, hi = float(n.min()), float(n.max())
    if not hi > lo:
        raise ValueError(f"a hinge needs two batched-token counts or more (all rows batch {lo:g})")
    grid, knee = np.geomspace(lo, hi, 122)[1:-1], lo  # inside: a knee at either end is the line again
    for _ in range(3):  # a coarse grid, then finer ones between the best knee's neighbours
        i = int(np.argmin([_relative_nnls(_design(n, kv, k), y)[1] for k in grid]))  # the first best
        knee = float(grid[i])
        grid = np.geomspace(grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)], 41)
    c, _ = _relative_nnls(_design(n, kv, knee), y)
    return {"c_fixed": c[0], "c_compute": c[1], "c_kv": c[2], "knee_tokens": knee, "c_above_knee": c[3]}


def predict(coef: dict[str, float], n: Any, kv: Any) -> np.ndarray:
    n, kv = np.asarray(n, dtype=float), np.asarray(kv, dtype=float)
    out = coef["c_fixed"] + coef["c_compute"] * n + coef["c_kv"] * kv
    if coef.get("c_above_knee", 0.0) > 0:
        out = out + coef["c_above_knee"] * np.maximum(n - coef["knee_tokens"], 0.0)
    return out


def _errors(coef: dict[str, float], n: np.ndarray, kv: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.abs(predict(coef, n, kv) - y) / y


SHAPES: tuple[str, ...] = ("line", "hinge")


def fit_series(frame: pd.DataFrame, y: np.ndarray, hold: np.ndarray, what: str,
               shapes: Sequence[str] = SHAPES) -> SeriesFit:  # fmt: skip
    """Fit each shape on the rows not ``hold``-out, score it on the held-out rows, choose the
    smaller held-out median (ties: the line, fewer parameters) and refit it on every row."""
    n = frame["batched_tokens"].to_numpy(float)
    kv = frame["kv_tokens"].to_numpy(float)
    train = ~hold
    fits, notes = [], []
    for shape in shapes:
        params = 3 if shape == "line" else 5
        if train.sum() < params + 1 or not hold.any():
            notes.append(f"{shape}: not fitted ({int(train.sum())} training / {int(hold.sum())} held-out rows; "
                         f"needs {params + 1} and 1)")  # fmt: skip
            continue
        try:
            coef = fit_shape(n[train], kv[train], y[train], shape)
        except ValueError as exc:
            notes.append(f"{shape}: not fitted ({exc})")
            continue
        err = _errors(coef, n[hold], kv[hold], y[hold])
        row = frame[hold].iloc[int(np.argmax(err))]
        worst = f"B={int(row['B'])} q={int(row['q'])} L={int(row['L'])}"
        fits.append(ShapeFit(shape, coef, float(np.median(err)), float(err.max()), int(train.sum()), int(hold.sum()),
                             worst))  # fmt: skip
    if not fits:
        raise ValueError(f"{what}: too few rows to fit and hold out ({len(frame)}; " + "; ".join(notes) + ")")
    best = min(fits, key=lambda f: (round(f.heldout_median, 12), SHAPES.index(f.shape)))
    chosen = best.shape
    coef = fit_shape(n, kv, y, chosen)
    if chosen == "hinge" and coef["c_above_knee"] <= 0:  # no slope past the knee: it is the line
        notes.append("hinge chosen, but refitted on every row it has no slope above its knee: written as the line")
        chosen, coef = "line", fit_shape(n, kv, y, "line")
    err = _errors(coef, n, kv, y)
    return SeriesFit(what, fits, chosen, coef, float(np.median(err)), float(err.max()), notes)


def read_calibration_table(path: str | os.PathLike[str]) -> pd.DataFrame:
    """A calibration table (``sdbench calibrate``) or any step table with ``B, q, L, ms`` (the
    shared H100/H200 tables): rows of positive ms, ``component`` target where absent."""
    frame = read_csv(path, "calibration table") if str(path).endswith(".csv") else read_parquet(
        path, what="calibration table")  # fmt: skip
    missing = [c for c in ("B", "q", "L", "ms") if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: calibration table lacks column(s) {', '.join(missing)} (needs B, q, L, ms)")
    for col in ("B", "q", "L", "ms"):
        values = pd.to_numeric(frame[col], errors="coerce")
        bad = frame.index[~(values > 0) if col != "L" else ~(values >= 0)]
        if len(bad):
            value = frame.loc[bad[0], col]
            value = value.item() if hasattr(value, "item") else value  # -1.0, not np.float64(-1.0)
            raise ValueError(f"{path}: row {int(bad[0]) + 2}: column {col!r}: {value!r} "
                             f"is not a {'positive' if col != 'L' else 'non-negative'} number")  # fmt: skip
        frame[col] = values
    return _normalised(frame)


def _normalised(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the columns the fit reads: a table without ``component`` is the target's, one
    without ``same_window`` did not read time and energy over one window (the shared tables)."""
    frame = frame.copy()
    if "component" not in frame.columns:
        frame["component"] = "target"
    frame["batched_tokens"] = frame["B"] * frame["q"]
    frame["kv_tokens"] = frame["B"] * frame["L"]
    if "same_window" not in frame.columns:
        frame["same_window"] = False
    return frame


@dataclass(frozen=True)
class CalibrationFit:
    """What ``calibrate fit`` found: the cost model, the time and energy fits, the power model."""

    model: Any  # CostModel
    time: SeriesFit
    energy: SeriesFit | None
    drafter: SeriesFit | None
    power: Any  # PowerModel | None
    power_reason: str
    implied_watts: dict[str, Any]
    lines: list[str]


def fit_calibration(
    frame: pd.DataFrame,
    name: str,
    *,
    source: str,
    holdout: str = "every-4th",
    seed: int = 0,
    base: str = "llama3.1-8b-h100",
    board_limit_w: float | None = None,
    statistic: str = "median",
    overhead_s: float | None = None,
) -> CalibrationFit:
    """The cost model (and power model) of a calibration table (module docstring).

    ``statistic``: ``median`` fits each point's window of median time (``ms``); ``min`` its fastest
    window (``ms_min``: on a shared CPU the least disturbed one), whose energy was not read with
    it (its rows are then not same-window: no power model from them). ``overhead_s``: the per-step
    overhead outside the forward pass (None: the base's, listed as not calibrated); a base that
    splits one timed pass into pass + overhead would otherwise count that part twice.
    """
    from sdbench.simulator.powermodel import PowerModel, fit_power_model

    if statistic not in STATISTICS:
        raise ValueError(f"--statistic: {statistic!r} is not one of {', '.join(STATISTICS)}")
    if statistic == "min":
        if "ms_min" not in frame:
            raise ValueError(f"{source}: --statistic min needs the column ms_min (a calibrate table)")
        frame = frame.assign(ms=frame["ms_min"], same_window=False)
    frame = _normalised(frame)
    target = frame[frame["component"] == "target"].reset_index(drop=True)
    if target.empty:
        raise ValueError(f"{source}: no target rows (component 'target') to fit")
    rule = "every 4th row in (L, B, q) order" if holdout == "every-4th" else f"a random 25% (seed {seed})"
    hold = holdout_mask(target, holdout, seed)
    seconds = target["ms"].to_numpy(float) / 1e3
    tfit = fit_series(target, seconds, hold, "step time")
    lines = [f"{source}: {len(target)} target rows ({statistic} window per point); held out: {rule} "
             f"({int(hold.sum())} rows)"]  # fmt: skip
    lines += _describe(tfit, "s")

    # Energy: a power model only where time and energy came from one window; else joules alone.
    energy, power, reason = None, None, ""
    joules = target["joules"].to_numpy(float) if "joules" in target else np.full(len(target), np.nan)
    metered = np.isfinite(joules) & (joules > 0)
    same = metered & target["same_window"].fillna(False).astype(bool).to_numpy()
    implied: dict[str, Any] = {}
    limit = board_limit_w
    if limit is None and "power_limit_w" in target and target["power_limit_w"].notna().any():
        limit = float(target["power_limit_w"].max())
    if metered.any():
        sub = target[metered].reset_index(drop=True)
        energy = fit_series(sub, joules[metered], holdout_mask(sub, holdout, seed), "energy per step")
        lines += _describe(energy, "J")
        watts = predict(energy.coef, sub["batched_tokens"], sub["kv_tokens"]) / predict(
            tfit.coef, sub["batched_tokens"], sub["kv_tokens"])  # fmt: skip
        implied = {"min_w": float(watts.min()), "max_w": float(watts.max()), "limit_w": limit,
                   "above_limit": None if limit is None else int((watts > limit).sum()), "rows": int(len(watts)),
                   "from": "fitted joules / fitted seconds"}  # fmt: skip
    if same.sum() >= 3:
        sub = target[same]
        fitted = fit_power_model(sub["batched_tokens"], sub["joules"] / (sub["ms"] / 1e3))
        meters = sorted(set(sub["energy_meter"].astype(str))) if "energy_meter" in sub else []
        power = PowerModel(fitted.p_idle_w, fitted.p_span_w, fitted.n_half, fitted.h, fitted.r2,
                           f"calibrated on {len(sub)} same-window rows of {source}"
                           + (f" ({', '.join(meters)})" if meters else ""))  # fmt: skip
        peak = float(np.max(power.watts(sub["batched_tokens"])))
        implied.update(power_model_max_w=peak, power_model_saturated_w=power.p_idle_w + power.p_span_w)
        lines.append(f"  power model: {power.describe()}")
    elif metered.any():
        reason = (f"no power model: time and energy of {source} are not from one window "
                  "(energy per step fitted on joules alone)")  # fmt: skip
    else:
        reason = f"no power model: {source} measured no energy"
    if reason:
        lines.append(f"  {reason}")
    if implied:
        measured_ratio = ""
        if metered.any():
            raw = joules[metered] / (seconds[metered])
            over = "" if limit is None else f", {int((raw > limit).sum())} of {int(metered.sum())} above {limit:g} W"
            measured_ratio = f"; joules / ms as measured: {raw.min():.0f}-{raw.max():.0f} W{over}"
        above = "" if limit is None else f", {implied.get('above_limit')} of {implied.get('rows')} above {limit:g} W"
        if "min_w" in implied:
            lines.append(f"  implied watts (fitted joules / fitted seconds): {implied['min_w']:.0f}-"
                         f"{implied['max_w']:.0f} W{above}{measured_ratio}")  # fmt: skip
        if "power_model_max_w" in implied:
            lines.append(f"  power model's watts over the table: at most {implied['power_model_max_w']:.0f} W "
                         f"(saturating at {implied['power_model_saturated_w']:.0f} W)"
                         + ("" if limit is None else f"; board limit {limit:g} W"))  # fmt: skip

    # Drafter rows: a linear drafter (c_fixed + c_spec x proposed + c_kv x kv), held out the same way.
    base_model = load_cost_model(base)
    drafters = dict(base_model.drafters)
    if overhead_s is not None and not (math.isfinite(overhead_s) and overhead_s >= 0):
        raise ValueError(f"--overhead-ms: expected a time >= 0, got {overhead_s * 1e3:g}")
    not_calibrated = (["overhead_per_step"] if overhead_s is None else []) + ["switching_overhead"]
    dfit = None
    draft_rows = frame[frame["component"] == "drafter"].reset_index(drop=True)
    if not draft_rows.empty:
        method = str(draft_rows["method"].iloc[0]) if "method" in draft_rows else "eagle"
        dfit = fit_series(draft_rows, draft_rows["ms"].to_numpy(float) / 1e3, holdout_mask(draft_rows, holdout, seed),
                          f"drafter {method} proposal", shapes=("line",))  # fmt: skip
        lines += _describe(dfit, "s")
        c = dfit.coef
        drafters[method] = DrafterCost("linear", c_kv=float(c["c_kv"]), c_spec=float(c["c_compute"]),
                                       c_fixed=float(c["c_fixed"]))  # fmt: skip
        kept = sorted(set(drafters) - {method})
    else:
        kept = sorted(drafters)
        lines.append(f"  drafter: not in the table (not covered): drafters {', '.join(kept)} from {base_model.name}")
    not_calibrated += [f"drafters.{m}" for m in kept]
    lines.append(f"  not calibrated (from {base_model.name}): {', '.join(not_calibrated)}")
    if overhead_s is not None:
        lines.append(f"  overhead_per_step: {overhead_s * 1e3:g} ms as given (--overhead-ms), not the base's "
                     f"{base_model.overhead_per_step * 1e3:g} ms")  # fmt: skip

    c = tfit.coef
    tc = TargetCost(c_kv=float(c["c_kv"]), c_compute=float(c["c_compute"]), c_fixed=float(c["c_fixed"]),
                    knee_tokens=float(c.get("knee_tokens", 0.0)),
                    c_above_knee=float(c.get("c_above_knee", 0.0)))  # fmt: skip
    fit: dict[str, Any] = {
        "method": "calibrate fit: least squares of the relative error, coefficients >= 0, knee on a log grid",
        "table": str(source),
        # where the table was timed (a calibration's device column; a shared table's: not recorded)
        "device": ", ".join(sorted(set(target["device"].astype(str)))) if "device" in target else "not recorded",
        "holdout": rule,
        "statistic": statistic,
        "time": _fit_record(tfit),
        "not_calibrated": not_calibrated,
        "base": base_model.name,
    }
    if overhead_s is not None:
        fit["overhead_per_step"] = {"seconds": float(overhead_s), "from": "--overhead-ms",
                                    "base_had": float(base_model.overhead_per_step)}  # fmt: skip
    if energy is not None:
        fit["energy"] = {**_fit_record(energy), "unit": "joules per step"}
    if dfit is not None:
        fit["drafter"] = _fit_record(dfit)
    if implied:
        fit["implied_watts"] = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in implied.items()}
    fit["power_model"] = power.label() if power is not None else reason
    model = CostModel(
        name=name,
        target=tc,
        drafters=drafters,
        overhead_per_step=base_model.overhead_per_step if overhead_s is None else float(overhead_s),
        switching_overhead=base_model.switching_overhead,
        description=f"calibrated target step ({tfit.chosen}) from {Path(source).name}; "
        f"drafters and overhead as noted in fit.not_calibrated",
        source=f"sdbench calibrate fit {source}",
        fit=fit,
    )
    return CalibrationFit(model, tfit, energy, dfit, power, reason, implied, lines)


def _fit_record(f: SeriesFit) -> dict[str, Any]:
    """The YAML record of a fit: each shape's held-out errors, the choice, its in-sample errors."""
    return {
        "shapes": {s.shape: {"heldout_median": round(s.heldout_median, 6), "heldout_max": round(s.heldout_max, 6),
                             "heldout_max_at": s.worst, "train_rows": s.train_rows, "heldout_rows": s.heldout_rows}
                   for s in f.shapes},
        "chosen": f.chosen,
        "coefficients": {k: float(v) for k, v in f.coef.items()},
        "all_rows_median": round(f.median, 6),
        "all_rows_max": round(f.largest, 6),
    }  # fmt: skip


def _describe(f: SeriesFit, unit: str) -> list[str]:
    out = [f"  {f.what}:"]
    for s in f.shapes:
        knee = f" (knee {s.coef['knee_tokens']:.4g} tokens)" if s.shape == "hinge" else ""
        out.append(f"    {s.shape:5s}{knee}: held-out median {s.heldout_median:.1%}, largest {s.heldout_max:.1%} "
                   f"at {s.worst} ({s.heldout_rows} rows; fitted on {s.train_rows})")  # fmt: skip
    out += [f"    {note}" for note in f.notes]
    c = f.coef
    terms = f"{c['c_fixed']:.4g} {unit} + {c['c_compute']:.4g} {unit}/token + {c['c_kv']:.4g} {unit}/KV token"
    if c.get("c_above_knee", 0.0) > 0:
        terms += f" + {c['c_above_knee']:.4g} {unit}/token above {c['knee_tokens']:.4g} tokens"
    out.append(f"    chosen: {f.chosen}, refitted on every row: {terms} "
               f"(in-sample median {f.median:.1%}, largest {f.largest:.1%})")  # fmt: skip
    return out


# ----------------------------------------------------------------------------- CLI
def _cmd_fit(args: argparse.Namespace) -> int:
    from sdbench.simulator.powermodel import save_power_model

    frame = read_calibration_table(args.table)
    result = fit_calibration(frame, args.name, source=str(args.table), holdout=args.holdout, seed=args.seed,
                             base=args.base, board_limit_w=args.board_limit_w, statistic=args.statistic,
                             overhead_s=None if args.overhead_ms is None else args.overhead_ms / 1e3)  # fmt: skip
    save_cost_model(result.model, args.output)
    print("\n".join(result.lines))
    wrote = [str(args.output)]
    if args.power_output:
        save_power_model(result.power, args.power_output, result.power_reason)
        wrote.append(str(args.power_output))
    print(f"wrote {' and '.join(wrote)}")
    return 0
