"""``sdbench bench compare-runs``: do two runs of the same grid agree within their intervals?

A speedup measured twice is the same result only if the second measurement falls inside the
first one's 95% interval, or at least the two intervals overlap. This joins two runs'
``cells.parquet`` tables (``docs/schema.md``) on the cell key and gives each SD cell a verdict:

- ``inside``: run B's speedup lies inside run A's interval;
- ``overlap``: it does not, but the two intervals overlap;
- ``disjoint``: the intervals do not overlap (the runs disagree).

It also reports each run's median interval half-width relative to its speedup, and whether a
cell's mean acceptance length differs between the runs (greedy decoding is deterministic, so a
difference means the two runs did not decode the same outputs, e.g. different models).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

KEY = ["engine", "model", "dataset", "method", "batch_size"]
VALUE = ["speedup", "speedup_ci_low", "speedup_ci_high", "mean_acceptance_length"]
VERDICTS = ("inside", "overlap", "disjoint")


def verdict(b: float, lo_a: float, hi_a: float, lo_b: float, hi_b: float) -> str:
    """``inside`` / ``overlap`` / ``disjoint`` for run B's speedup ``b`` and both intervals."""
    if lo_a <= b <= hi_a:
        return "inside"
    return "overlap" if lo_b <= hi_a and lo_a <= hi_b else "disjoint"


def _sd_cells(cells: pd.DataFrame, name: str) -> pd.DataFrame:
    missing = [c for c in KEY + VALUE if c not in cells.columns]
    if missing:
        raise ValueError(f"{name}: not a cells table (missing columns {', '.join(missing)})")
    sd = cells[cells["method"] != "none"]
    sd = sd[sd["speedup_ci_low"].notna() & sd["speedup_ci_high"].notna()]
    if sd[KEY].duplicated().any():
        raise ValueError(f"{name}: a cell appears twice")
    return sd[KEY + VALUE]


def compare(
    a: pd.DataFrame, b: pd.DataFrame, names: tuple[str, str] = ("A", "B"), common: bool = False
) -> pd.DataFrame:
    """One row per SD cell in both runs: both speedups and intervals, half-widths, verdict.

    Cells in only one run are an error naming the first (comparing different grids is not a
    reproducibility check), unless ``common``: then only the cells both runs measured are
    compared (a grid that grew between the runs) and the table's ``attrs["only"]`` counts the rest.
    """
    sa, sb = _sd_cells(a, names[0]), _sd_cells(b, names[1])
    joined = sa.merge(sb, on=KEY, how="outer", suffixes=("_a", "_b"), indicator=True)
    lonely = joined[joined["_merge"] != "both"]
    only = {n: int((lonely["_merge"] == side).sum()) for n, side in zip(names, ("left_only", "right_only"))}
    if common:
        joined = joined[joined["_merge"] == "both"]
        if joined.empty:
            raise ValueError("the two runs have no SD cell in common")
    elif len(lonely):
        row = lonely.iloc[0]
        where = names[0] if row["_merge"] == "left_only" else names[1]
        cell = "/".join(str(row[k]) for k in KEY)
        raise ValueError(f"cell {cell} is only in run {where}: the runs measured different grids")
    out = joined.drop(columns="_merge")
    for s in ("a", "b"):
        out[f"half_width_{s}"] = (out[f"speedup_ci_high_{s}"] - out[f"speedup_ci_low_{s}"]) / 2 / out[f"speedup_{s}"]
    out["verdict"] = [
        verdict(r.speedup_b, r.speedup_ci_low_a, r.speedup_ci_high_a, r.speedup_ci_low_b, r.speedup_ci_high_b)
        for r in out.itertuples()
    ]
    la, lb = out["mean_acceptance_length_a"], out["mean_acceptance_length_b"]
    out["same_acceptance"] = ((la - lb).abs() < 1e-9) | (la.isna() & lb.isna())
    out = out.sort_values(KEY).reset_index(drop=True)
    out.attrs["only"] = only
    return out


def summary(table: pd.DataFrame, max_half_width: float = 0.05) -> dict[str, float | int | bool]:
    """Counts per verdict, median half-widths, and whether the two criteria of a stable result hold.

    ``agree``: no cell is disjoint; ``narrow``: both runs' median half-width is at most
    ``max_half_width`` of the speedup.
    """
    counts = table["verdict"].value_counts()
    med_a, med_b = float(table["half_width_a"].median()), float(table["half_width_b"].median())
    return {
        "cells": len(table),
        **{v: int(counts.get(v, 0)) for v in VERDICTS},
        "median_half_width_a": med_a,
        "median_half_width_b": med_b,
        "agree": int(counts.get("disjoint", 0)) == 0,
        "narrow": max(med_a, med_b) <= max_half_width,
        "acceptance_differs": int((~table["same_acceptance"]).sum()),
    }


def _interval(x: float, lo: float, hi: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.2f} [{lo:.2f}, {hi:.2f}]"


MARK = {"inside": "", "overlap": " †", "disjoint": " ‼"}


def markdown(table: pd.DataFrame, labels: dict[str, str] | None = None) -> str:
    """Run A / run B per cell, batch sizes as columns; † outside A's interval but overlapping, ‼ disjoint."""
    labels = labels or {}
    sizes = sorted(table["batch_size"].unique())
    head = ["method", "dataset", *(f"bs {s}: A / B" for s in sizes), "acc. length"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (engine, model, dataset, method), g in table.groupby(["engine", "model", "dataset", "method"], sort=True):
        by_bs = {int(r.batch_size): r for r in g.itertuples()}
        cols = []
        for s in sizes:
            r = by_bs.get(int(s))
            cols.append(
                "" if r is None else
                f"{_interval(r.speedup_a, r.speedup_ci_low_a, r.speedup_ci_high_a)} / "
                f"{_interval(r.speedup_b, r.speedup_ci_low_b, r.speedup_ci_high_b)}{MARK[r.verdict]}"
            )
        acc = sorted({round(float(x), 2) for x in g["mean_acceptance_length_a"].dropna()})
        acc_text = " / ".join(f"{x:.2f}" for x in acc) + ("" if g["same_acceptance"].all() else " (differs in B)")
        lines.append(f"| {labels.get(method, method)} | {dataset} | " + " | ".join(cols) + f" | {acc_text} |")
    return "\n".join(lines)


def format_summary(s: dict[str, float | int | bool]) -> str:
    """The summary as text lines."""
    return "\n".join([
        f"cells: {s['cells']}; B inside A's interval: {s['inside']}, intervals overlap: {s['overlap']}, "
        f"disjoint: {s['disjoint']}",
        f"median 95% half-width: A {100 * s['median_half_width_a']:.1f}%, B {100 * s['median_half_width_b']:.1f}% "
        "of the speedup",
        f"agree (no disjoint cell): {'yes' if s['agree'] else 'no'}; "
        f"narrow (both medians <= 5%): {'yes' if s['narrow'] else 'no'}",
        f"cells whose acceptance length differs between the runs: {s['acceptance_differs']}",
    ])


def _cmd_bench_compare_runs(args: argparse.Namespace) -> int:
    from sdbench.io import read_parquet

    a_path, b_path = (Path(p) for p in args.runs)
    table = compare(read_parquet(a_path), read_parquet(b_path), (str(a_path), str(b_path)), args.common)
    labels = {}
    if args.config:
        from sdbench.config import load_config

        labels = {k: v.get("label", k) for k, v in load_config(args.config)["methods"].items()}
    print(markdown(table, labels))
    print()
    s = summary(table, args.max_half_width)
    print(format_summary(s))
    if args.common:
        print("SD cells left out (in one run only): " + ", ".join(f"{k} {v}" for k, v in table.attrs["only"].items()))
    if args.output:
        from sdbench.io import write_parquet

        write_parquet(table, args.output)
    return 0 if (s["agree"] and s["narrow"]) or not args.check else 1
