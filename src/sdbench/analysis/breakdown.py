"""Runtime breakdown per stage (paper Sec. 5.1, Fig. 3): stage fractions of the engine steps
timed in breakdown mode (:mod:`sdbench.engine.measure.steptiming`), and their stacked-bar figure.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from sdbench.engine.measure.steptiming import STAGE_COLUMNS
from sdbench.io import read_csv, read_parquet, write_parquet
from sdbench.plotting import drawn_table, method_style, save_png, subplots

# Stages of the breakdown, in plot order (bottom to top), with Fig. 3's labels.
STAGES: tuple[str, ...] = ("propose", "verify", "sample", "other")
STAGE_LABELS: dict[str, str] = {
    "propose": "Drafting",
    "verify": "Verification",
    "sample": "Rejection sampling",
    "other": "Other overheads",
}
FRACTION_COLUMNS: tuple[str, ...] = tuple(f"{s}_frac" for s in STAGES)
GROUP_COLUMNS: tuple[str, ...] = ("method", "batch_size")
# Whose steps: never pooled across engines or models (kept as group keys where present).
TARGET_COLUMNS: tuple[str, ...] = ("engine", "model")
BASELINE_METHODS = ("none", "baseline", "no_sd", "")
# results/tables/breakdown.parquet (the pipeline's step tables name their engine and model).
COLUMNS: tuple[str, ...] = (*TARGET_COLUMNS, *GROUP_COLUMNS, "num_steps", "total_s", *FRACTION_COLUMNS)


def breakdown_table(steps: pd.DataFrame) -> pd.DataFrame:
    """Fraction of total step time per stage, per ``engine`` x ``model`` x ``method`` x
    ``batch_size`` (those present).

    Sums each stage over the steps of a group and divides by the summed ``step_s``, so long
    steps weigh more (the share of execution time, as in Fig. 3). Columns: the group keys,
    ``num_steps``, ``total_s`` and :data:`FRACTION_COLUMNS` (``propose_frac`` ... ``other_frac``,
    summing to 1).
    """
    required = ("step_s", *STAGE_COLUMNS)
    missing = [c for c in required if c not in steps.columns]
    if missing:
        raise ValueError(f"step table lacks column(s) {', '.join(missing)}")
    if steps.empty:
        raise ValueError("step table has no rows")
    df = steps.copy()
    if "other_s" not in df.columns:
        df["other_s"] = df["step_s"] - df[list(STAGE_COLUMNS)].sum(axis=1)
    keys = [c for c in (*TARGET_COLUMNS, *GROUP_COLUMNS) if c in df.columns]
    sums_cols = ["step_s", "propose_s", "verify_s", "sample_s", "other_s"]
    if keys:
        grouped = df.groupby(keys, sort=True, dropna=False)
        sums = grouped[sums_cols].sum()
        sums["num_steps"] = grouped.size()
        sums = sums.reset_index()
    else:
        sums = df[sums_cols].sum().to_frame().T
        sums["num_steps"] = len(df)
    bad = sums["step_s"] <= 0
    if bad.any():
        raise ValueError(f"group(s) with no step time: {sums.loc[bad, keys].to_dict('records')}")
    out = sums[keys].copy()
    out["num_steps"] = sums["num_steps"].astype("int64")
    out["total_s"] = sums["step_s"].astype("float64")
    for stage in STAGES:
        out[f"{stage}_frac"] = (sums[f"{stage}_s"] / sums["step_s"]).astype("float64")
    return out.reset_index(drop=True)


def _method_order(methods: Iterable[str]) -> list[str]:
    unique = sorted(set(methods))
    return [m for m in BASELINE_METHODS if m in unique] + [m for m in unique if m not in BASELINE_METHODS]


def plot_breakdown(table: pd.DataFrame, out_png: str | os.PathLike[str], title: str | None = None) -> pd.DataFrame:
    """Fig. 3 style: a stacked bar of stage fractions per method x batch size, written atomically.
    Returns the drawn table: a ``bar`` per stage x method x batch size (series the stage, x
    ``<method's label> <batch size>`` as the figure reads it, y its fraction, stacked in
    :data:`STAGES` order) and a ``group`` per method (its label under its bars).

    ``table`` needs ``method``, ``batch_size`` and :data:`FRACTION_COLUMNS` (e.g. from
    :func:`breakdown_table`). Bars are grouped by method, one per batch size.
    """
    missing = [c for c in (*GROUP_COLUMNS, *FRACTION_COLUMNS) if c not in table.columns]
    if missing:
        raise ValueError(f"breakdown table lacks column(s) {', '.join(missing)}")
    if table.empty:
        raise ValueError("breakdown table has no rows")
    from sdbench.simulator.costmodel import one_target

    one_target(table, "Fig. 3")  # one engine x model per figure: its bars are keyed by method and batch size only
    rows = []
    for method in _method_order(table["method"].astype(str)):
        sub = table[table["method"].astype(str) == method].sort_values("batch_size")
        rows.extend(sub.itertuples(index=False))
    positions, ticks, x, prev = [], [], 0.0, None
    for r in rows:
        if prev is not None and r.method != prev:
            x += 0.6  # gap between methods
        positions.append(x)
        ticks.append(str(r.batch_size))
        prev = r.method
        x += 1.0
    n_methods = len(dict.fromkeys(r.method for r in rows))
    fig, ax = subplots(figsize=(max(4.5, 1.3 + 0.6 * len(rows) + 0.35 * n_methods), 4.0))
    colors = {"propose": "#4c72b0", "verify": "#dd8452", "sample": "#55a868", "other": "#8c8c8c"}
    bottom = [0.0] * len(rows)
    drawn = drawn_table(fig)
    for stage in STAGES:
        values = [float(getattr(r, f"{stage}_frac")) for r in rows]
        drawn.bar(ax, positions, values, bottom=bottom, width=0.8, color=colors[stage], label=STAGE_LABELS[stage],
                  series=stage)  # fmt: skip
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(positions, ticks)
    ax.set_ylabel("fraction of execution time")
    ax.set_ylim(0, 1)
    # Method names under each group's batch-size ticks.
    for method in dict.fromkeys(r.method for r in rows):
        xs = [p for p, r in zip(positions, rows) if r.method == method]
        drawn.text(ax, sum(xs) / len(xs), -0.1, method_style(str(method)).label, mark="group", series=method,
                   ha="center", va="top", fontsize=8, color=method_style(str(method)).color,
                   transform=ax.get_xaxis_transform())  # fmt: skip
    ax.set_xlabel("batch size, per method", labelpad=16)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False, fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_png(fig, out_png, dpi=150)


def read_step_tables(paths: Sequence[str | os.PathLike[str]]) -> pd.DataFrame:
    """Concatenate step tables (parquet or CSV) with :data:`sdbench.engine.measure.steptiming.STEP_COLUMNS`
    minus ``other_s`` plus ``method`` and ``batch_size``; ``ValueError`` names the file lacking a column."""
    frames = []
    for path in map(Path, paths):
        df = read_csv(path, "step table") if path.suffix == ".csv" else read_parquet(path, what="step table")
        need = (*GROUP_COLUMNS, "step_s", *STAGE_COLUMNS)
        missing = [c for c in need if c not in df.columns]
        if missing:
            raise ValueError(f"{path}: step table lacks column(s) {', '.join(missing)}")
        frames.append(df)
    if not frames:
        raise ValueError("no step tables given")
    return pd.concat(frames, ignore_index=True)


def _cmd_plot(args: argparse.Namespace) -> int:
    table = breakdown_table(read_step_tables(args.steps))
    if args.table:
        from sdbench.columns import conform

        declared = [c for c in COLUMNS if c in table or c not in TARGET_COLUMNS]  # steps may name no target
        write_parquet(conform(table, declared, "breakdown"), args.table)
    plot_breakdown(table, args.output, title=args.title)
    cols = [*GROUP_COLUMNS, "num_steps", *FRACTION_COLUMNS]
    print(table[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"wrote {args.output}" + (f" and {args.table}" if args.table else ""))
    return 0
