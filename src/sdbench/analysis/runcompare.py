"""``sdbench compare A B``: two finished runs (or bundles) side by side, cell by cell.

The same grid measured twice -- on vLLM 0.10.1.1 and 0.11.1, before and after a driver upgrade,
or simply again -- is the same result only where the second measurement agrees with the first
within their intervals. This joins two runs' ``cells.parquet`` (``docs/schema.md``) on the cell
key and judges each cell's speedup (SD cells) and throughput (every cell, no SD included):

- ``inside``: B's value lies inside A's 95% interval;
- ``overlap``: it does not, but the two intervals overlap;
- ``disjoint``: the intervals do not overlap -- the runs differ.

The mean accepted length of each run is reported separately: under greedy decoding it moves
only when the outputs do (another model, another engine's numerics), so an acceptance change is
named apart from a speed change. With ``--threshold T`` a cell *regresses* when B is lower
than A by more than the fraction T in speedup or throughput (``--gate``: either, or only one)
*and* the intervals are disjoint; the command then exits 1, so it can gate a CI job.

A rehearsal (cells with ``measured`` false, :mod:`sdbench.provenance`) is refused in one line
(exit code 2) unless ``--allow-rehearsal``: then a real run is compared with its rehearsal cell by
cell (a simulator validation at the grid's scale), and every output says which run is the rehearsal.

A run is given as its ``results/`` directory (``tables/cells.parquet`` in it), a checkout or an
unpacked bundle holding ``results/tables/cells.parquet``, a ``.tar.gz`` bundle
(``sdbench bundle create``), or the parquet file itself.
"""

from __future__ import annotations

import argparse
import io
import math
import tarfile
from pathlib import Path

import pandas as pd

from sdbench.config import load_config
from sdbench.plotting import drawn_table, figure_legend, method_styles, save_png, subplots
from sdbench.provenance import MEASURED

KEY = ["engine", "model", "dataset", "method", "batch_size"]
SPEED = ["speedup", "speedup_ci_low", "speedup_ci_high"]
THROUGHPUT = ["tokens_per_s", "tokens_per_s_ci_low", "tokens_per_s_ci_high"]
VALUE = [*SPEED, *THROUGHPUT, "mean_acceptance_length"]
VERDICTS = ("inside", "overlap", "disjoint")
# Greedy outputs are deterministic; beyond this relative change the acceptance length moved.
ACCEPTANCE_TOLERANCE = 0.01
CELLS_IN = ("tables/cells.parquet", "results/tables/cells.parquet", "sdbench-bundle/results/tables/cells.parquet")


def read_run(path: str | Path) -> pd.DataFrame:
    """The cells table of a run: a results directory, a checkout or unpacked bundle, a ``.tar.gz``
    bundle or the parquet file (``ValueError`` naming what was looked for)."""
    path = Path(path)
    if path.is_file() and path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.is_dir():
        for rel in CELLS_IN:
            if (path / rel).is_file():
                return pd.read_parquet(path / rel)
        raise ValueError(f"{path}: no cells table ({' or '.join(CELLS_IN)}): is this a finished run's results/?")
    if path.is_file() and path.name.endswith((".tar.gz", ".tgz", ".tar")):
        with tarfile.open(path, "r:*") as tar:
            member = next((m for m in tar.getmembers() if m.name.endswith("results/tables/cells.parquet")), None)
            if member is None:
                raise ValueError(f"{path}: the bundle holds no results/tables/cells.parquet")
            handle = tar.extractfile(member)
            assert handle is not None
            return pd.read_parquet(io.BytesIO(handle.read()))
    raise ValueError(f"{path}: not a run (a results directory, a bundle or a cells.parquet)")


def verdict(b: float, lo_a: float, hi_a: float, lo_b: float, hi_b: float) -> str:
    """``inside`` / ``overlap`` / ``disjoint`` for run B's value ``b`` and both intervals."""
    if lo_a <= b <= hi_a:
        return "inside"
    return "overlap" if lo_b <= hi_a and lo_a <= hi_b else "disjoint"


def _judge(row: pd.Series, cols: list[str]) -> str:
    v, lo, hi = cols
    values = [row[f"{c}_{s}"] for c in cols for s in ("a", "b")]
    if any(x is None or (isinstance(x, float) and math.isnan(x)) for x in values):
        return ""
    return verdict(row[f"{v}_b"], row[f"{lo}_a"], row[f"{hi}_a"], row[f"{lo}_b"], row[f"{hi}_b"])


def _cells(cells: pd.DataFrame, name: str) -> pd.DataFrame:
    missing = [c for c in KEY + VALUE if c not in cells.columns]
    if missing:
        raise ValueError(f"{name}: not a cells table (missing columns {', '.join(missing)})")
    if cells[KEY].duplicated().any():
        raise ValueError(f"{name}: a cell appears twice")
    keep = KEY + VALUE + [c for c in ("sd_method", "num_speculative_tokens") if c in cells]
    out = cells[keep].copy()
    # Per run (measured_a / measured_b after the join): whether the cell was measured or rehearsed.
    out[MEASURED] = cells[MEASURED].fillna(True).astype(bool) if MEASURED in cells else True
    out.loc[out["method"] == "none", SPEED] = float("nan")  # no-SD: throughput only
    return out


# What a regression is judged on. The speedup is paired with the no-SD arm in the same process,
# so it survives a machine that runs faster or slower between the two runs; throughput does not
# (two runs of one commit hours apart on a shared 2-core VM: throughput -46% to +16%).
GATES = ("speedup", "throughput", "both")


def compare(
    a: pd.DataFrame,
    b: pd.DataFrame,
    names: tuple[str, str] = ("A", "B"),
    common: bool = False,
    threshold: float | None = None,
    gate: str = "both",
) -> pd.DataFrame:
    """One row per cell in both runs: both speedups and throughputs with intervals, half-widths,
    verdicts, acceptance change and (with ``threshold``) whether the cell regressed in what
    ``gate`` names: ``speedup``, ``throughput`` or ``both``.

    Cells in only one run are an error naming the first (comparing different grids is not a
    run-versus-run check), unless ``common``: then only the cells both runs measured are
    compared and the table's ``attrs["only"]`` counts the rest.
    """
    sa, sb = _cells(a, names[0]), _cells(b, names[1])
    joined = sa.merge(sb.drop(columns=[c for c in ("sd_method", "num_speculative_tokens") if c in sb]),
                      on=KEY, how="outer", suffixes=("_a", "_b"), indicator=True)  # fmt: skip
    lonely = joined[joined["_merge"] != "both"]
    only = {n: int((lonely["_merge"] == side).sum()) for n, side in zip(names, ("left_only", "right_only"))}
    if common:
        joined = joined[joined["_merge"] == "both"]
        if joined.empty:
            raise ValueError("the two runs have no cell in common")
    elif len(lonely):
        row = lonely.iloc[0]
        where = names[0] if row["_merge"] == "left_only" else names[1]
        cell = "/".join(str(row[k]) for k in KEY)
        raise ValueError(f"cell {cell} is only in run {where}: the runs measured different grids (--common compares the rest)")
    out = joined.drop(columns="_merge").reset_index(drop=True)
    for s in ("a", "b"):
        out[f"half_width_{s}"] = (out[f"speedup_ci_high_{s}"] - out[f"speedup_ci_low_{s}"]) / 2 / out[f"speedup_{s}"]
    out["verdict"] = [_judge(r, SPEED) for _, r in out.iterrows()]
    out["throughput_verdict"] = [_judge(r, THROUGHPUT) for _, r in out.iterrows()]
    out["speedup_change"] = out["speedup_b"] / out["speedup_a"] - 1
    out["throughput_change"] = out["tokens_per_s_b"] / out["tokens_per_s_a"] - 1
    la, lb = out["mean_acceptance_length_a"], out["mean_acceptance_length_b"]
    out["same_acceptance"] = ((la - lb).abs() <= ACCEPTANCE_TOLERANCE * la.abs()) | (la.isna() & lb.isna())
    out["regressed"] = False
    if gate not in GATES:
        raise ValueError(f"gate {gate!r} is not one of {', '.join(GATES)}")
    if threshold is not None:
        slower = pd.Series(False, index=out.index)
        if gate in ("speedup", "both"):
            slower |= (out["speedup_change"] < -threshold) & (out["verdict"] == "disjoint")
        if gate in ("throughput", "both"):
            slower |= (out["throughput_change"] < -threshold) & (out["throughput_verdict"] == "disjoint")
        out["regressed"] = slower.fillna(False).astype(bool)
    out = out.sort_values(KEY).reset_index(drop=True)
    out.attrs["only"] = only
    return out


def summary(table: pd.DataFrame, max_half_width: float = 0.05) -> dict[str, float | int | bool]:
    """Counts per verdict (SD cells' speedups), median half-widths, acceptance changes, regressions.

    ``agree``: no SD cell is disjoint; ``narrow``: both runs' median half-width is at most
    ``max_half_width`` of the speedup.
    """
    sd = table[table["verdict"] != ""]
    counts = sd["verdict"].value_counts()
    med_a, med_b = float(sd["half_width_a"].median()), float(sd["half_width_b"].median())
    return {
        "cells": len(table),
        "sd_cells": len(sd),
        **{v: int(counts.get(v, 0)) for v in VERDICTS},
        "throughput_disjoint": int((table["throughput_verdict"] == "disjoint").sum()),
        "median_half_width_a": med_a,
        "median_half_width_b": med_b,
        "agree": int(counts.get("disjoint", 0)) == 0,
        "narrow": max(med_a, med_b) <= max_half_width,
        "acceptance_differs": int((~table["same_acceptance"]).sum()),
        "regressed": int(table["regressed"].sum()),
    }


def _interval(x: float, lo: float, hi: float, fmt: str = ".2f") -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


MARK = {"inside": "", "overlap": " †", "disjoint": " ‼", "": ""}


def markdown(table: pd.DataFrame, labels: dict[str, str] | None = None) -> str:
    """Per cell: speedup A / B, throughput A / B (95% intervals), acceptance length A / B and what changed.

    † B outside A's interval but overlapping, ‼ disjoint, ▼ regressed beyond the threshold.
    """
    labels = labels or {}
    head = ["engine / model / dataset", "method", "bs", "speedup A / B", "tokens/s A / B", "acc. length A / B",
            "changed"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table.itertuples(index=False):
        changed = []
        if r.verdict == "disjoint":
            changed.append(f"speed {100 * r.speedup_change:+.0f}%")
        if r.throughput_verdict == "disjoint":
            changed.append(f"throughput {100 * r.throughput_change:+.0f}%")
        if not r.same_acceptance:
            changed.append("acceptance")
        if r.regressed:
            changed.append("▼ regressed")
        lines.append(
            f"| {r.engine} / {r.model} / {r.dataset} | {labels.get(r.method, r.method)} | {r.batch_size} "
            f"| {_interval(r.speedup_a, r.speedup_ci_low_a, r.speedup_ci_high_a)} / "
            f"{_interval(r.speedup_b, r.speedup_ci_low_b, r.speedup_ci_high_b)}{MARK[r.verdict]} "
            f"| {_interval(r.tokens_per_s_a, r.tokens_per_s_ci_low_a, r.tokens_per_s_ci_high_a, '.0f')} / "
            f"{_interval(r.tokens_per_s_b, r.tokens_per_s_ci_low_b, r.tokens_per_s_ci_high_b, '.0f')}"
            f"{MARK[r.throughput_verdict]} "
            f"| {_num(r.mean_acceptance_length_a)} / {_num(r.mean_acceptance_length_b)} | {', '.join(changed)} |"
        )
    return "\n".join(lines)


def _num(x: float) -> str:
    return "—" if x is None or math.isnan(x) else f"{x:.2f}"


def format_summary(s: dict[str, float | int | bool], threshold: float | None = None, gate: str = "both") -> str:
    """The summary as text lines."""
    lines = [
        f"cells: {s['cells']} ({s['sd_cells']} with SD); speedup: B inside A's interval {s['inside']}, "
        f"intervals overlap {s['overlap']}, disjoint {s['disjoint']}; throughput disjoint in {s['throughput_disjoint']}",
        f"median 95% half-width of the speedup: A {100 * s['median_half_width_a']:.1f}%, "
        f"B {100 * s['median_half_width_b']:.1f}%",
        f"agree (no disjoint speedup): {'yes' if s['agree'] else 'no'}; "
        f"narrow (both medians <= 5%): {'yes' if s['narrow'] else 'no'}",
        f"cells whose acceptance length changed (> {100 * ACCEPTANCE_TOLERANCE:g}%): {s['acceptance_differs']}",
    ]
    if threshold is not None:
        what = "B lower" if gate == "both" else f"B's {gate} lower"
        lines.append(f"regressed ({what} by > {100 * threshold:g}% with disjoint intervals): {s['regressed']}")
    return "\n".join(lines)


def plot(table: pd.DataFrame, out_png: str | Path, names: tuple[str, str] = ("A", "B")) -> pd.DataFrame:
    """Speedup and throughput of B against A per cell (95% intervals both ways), y = x dashed;
    regressed cells ringed in red. Returns the drawn table (x run A's value, y run B's)."""
    fig, axes = subplots(1, 2, figsize=(11, 5.2), squeeze=False)
    drawn = drawn_table(fig)
    styles = method_styles(table)
    for ax, (v, lo, hi), what in zip(axes[0], (SPEED, THROUGHPUT), ("speedup over no SD", "output tokens / s")):
        for method, sub in table.groupby("method", sort=True):
            sub = sub.dropna(subset=[f"{v}_a", f"{v}_b"])
            if sub.empty:
                continue
            style = styles[method]
            drawn.errorbar(ax, sub[f"{v}_a"], sub[f"{v}_b"], mark="point", series=method, label=style.label,
                           xerr=[(sub[f"{v}_a"] - sub[f"{lo}_a"]).clip(lower=0), (sub[f"{hi}_a"] - sub[f"{v}_a"]).clip(lower=0)],
                           yerr=[(sub[f"{v}_b"] - sub[f"{lo}_b"]).clip(lower=0), (sub[f"{hi}_b"] - sub[f"{v}_b"]).clip(lower=0)],
                           ls="none", capsize=2, color=style.color, marker=style.marker)  # fmt: skip
            bad = sub[sub["regressed"]]
            drawn.scatter(ax, bad[f"{v}_a"], bad[f"{v}_b"], s=160, facecolors="none", edgecolors="red", zorder=5,
                          mark="ring", series=method, note="regressed")  # fmt: skip
        finite = table[[f"{v}_a", f"{v}_b"]].stack().dropna()
        if len(finite):
            lo_v, hi_v = float(finite.min()) * 0.9, float(finite.max()) * 1.1
            ax.plot([lo_v, hi_v], [lo_v, hi_v], color="grey", ls="--", lw=0.8)
        ax.set_xlabel(f"{what}, run {names[0]}")
        ax.set_ylabel(f"{what}, run {names[1]}")
        ax.grid(alpha=0.3)
    axes[0, 0].axhline(1.0, color="grey", lw=0.5)
    axes[0, 0].axvline(1.0, color="grey", lw=0.5)
    from matplotlib.lines import Line2D

    ring = Line2D([], [], ls="none", marker="o", markerfacecolor="none", markeredgecolor="red", markersize=10,
                  label="regressed")  # fmt: skip
    figure_legend(fig, styles, [ring])
    return save_png(fig, out_png, dpi=110)


def rehearsal_line(runs: list[tuple[str, pd.DataFrame]]) -> str:
    """The line saying which run is a rehearsal and how many of its cells ("" when none is)."""
    from sdbench.provenance import rehearsal_rows

    parts = [f"run {name} has {rehearsal_rows(cells)} of {len(cells)} cells with measured = false"
             for name, cells in runs if rehearsal_rows(cells)]  # fmt: skip
    if not parts:
        return ""
    return f"A rehearsal, not measured: {'; '.join(parts)}. This compares a rehearsal with a run cell by cell."


# What ran a run, beside its cells' numbers: the code inside the engine's process and the hardware.
RAN_ON = {"code_digest": "sdbench code", "hardware": "hardware"}


def ran_on_differences(a: pd.DataFrame, b: pd.DataFrame, names: tuple[str, str] = ("A", "B")) -> list[str]:
    """One line per :data:`RAN_ON` column whose values differ between the runs (each run's
    distinct values with their cell counts); none where they agree or a run lacks the column."""
    lines = []
    for column, what in RAN_ON.items():
        if column not in a or column not in b:
            continue
        seen = [cells[column].fillna("").astype(str).value_counts().sort_index() for cells in (a, b)]
        if set(seen[0].index) == set(seen[1].index):
            continue
        ran = [", ".join(f"{v or '?'} ({n} cells)" for v, n in counts.items()) for counts in seen]
        lines.append(f"{what} differs: {names[0]} ran {ran[0]}; {names[1]} ran {ran[1]}")
    return lines


def _cmd_compare(args: argparse.Namespace) -> int:
    from sdbench import provenance

    a_path, b_path = args.runs
    runs = [(str(a_path), read_run(a_path)), (str(b_path), read_run(b_path))]
    if not args.allow_rehearsal:
        provenance.refuse_rehearsal([(n, provenance.rehearsal_rows(c), len(c)) for n, c in runs], "compare")
    for name, cells in runs:
        provenance.observe(cells, name)
    (_, a), (_, b) = runs
    table = compare(a, b, (str(a_path), str(b_path)), args.common, args.threshold, args.gate)
    labels = {}
    if args.config:
        labels = {k: v.get("label", k) for k, v in load_config(args.config)["methods"].items()}
    text = markdown(table, labels)
    s = summary(table, args.max_half_width)
    report = text + "\n\n" + format_summary(s, args.threshold, args.gate)
    if rehearsal := rehearsal_line(runs):
        report = f"{rehearsal}\n\n{report}"
    for line in ran_on_differences(a, b):
        report += "\n" + line
    if args.common:
        report += "\ncells left out (in one run only): " + ", ".join(f"{k} {v}" for k, v in table.attrs["only"].items())
    print(report)
    from sdbench.io import write_parquet, write_text

    if args.markdown:
        write_text(report + "\n", args.markdown)
    if args.output:
        write_parquet(table, args.output)
    if args.figure:
        plot(table, args.figure, ("A", "B"))
    if s["regressed"]:
        return 1
    return 0 if (s["agree"] and s["narrow"]) or not args.check else 1
