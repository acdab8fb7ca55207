"""How far from its ceiling SD runs, measured on the engine: forced-acceptance curves and the gap split.

The forced-acceptance sweep (:mod:`sdbench.sweeps`) runs each method with vLLM's synthetic
rejection sampling at chosen mean accepted lengths: the drafter drafts and the target verifies
as always, only the accept/reject decision is set. Per method x dataset x batch size that gives
the measured speedup as a function of the accepted length, on this engine and machine, and

- the **ceiling**: the speedup with every draft accepted (length k + 1);
- the speedup **at the real accepted length** of the method's own (unforced) cell, read off
  the forced curve (linear between the measured points, their 95% intervals likewise);

so the distance from the ideal k + 1 (k + 1 tokens per step, each step as cheap as a step
without SD) to the measured speedup splits into

- ``system_loss = (k + 1) - ceiling``: what the engine loses -- drafting, verifying k + 1
  tokens instead of one, and the step's bookkeeping -- with perfect acceptance;
- ``acceptance_loss = ceiling - at_real``: what the drafter loses by being rejected;
- ``residual = at_real - measured``: what the forced curve does not explain (a real drafter's
  acceptance varies along the output and between requests; forced acceptance has the minimum
  variance at the same mean, and forced cells run every output to ``max_tokens``).

The accepted length on the x axis is the one the engine *measured* in each forced cell (its
counters), not the one asked for: they agree for learned drafters, while n-gram drafts only
where the prompt matches, and a short n-gram draft is padded and never accepted.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sdbench.columns import conform
from sdbench.io import write_parquet, write_text

FORCED = "forced_acceptance"
KEYS = ["engine", "model", "dataset", "base_method", "batch_size"]
COLUMNS: tuple[str, ...] = (
    "engine", "model", "dataset", "base_method", "method", "sd_method", "num_speculative_tokens", "batch_size",
    "forced_acceptance_length", "mean_acceptance_length", "drafts_per_step", "draft_step_share", "output_len_mean",
    "tokens_per_s", "tokens_per_s_ci_low", "tokens_per_s_ci_high", "baseline_tokens_per_s", "speedup",
    "speedup_ci_low", "speedup_ci_high", "generate_s", "num_calls", "contaminated",
)  # fmt: skip
GAP_COLUMNS: tuple[str, ...] = (
    *KEYS, "sd_method", "num_speculative_tokens", "real_acceptance_length", "measured_speedup",
    "measured_speedup_ci_low", "measured_speedup_ci_high", "ceiling_acceptance_length", "ceiling_speedup",
    "ceiling_speedup_ci_low", "ceiling_speedup_ci_high", "at_real_speedup", "at_real_speedup_ci_low",
    "at_real_speedup_ci_high", "ideal_speedup", "system_loss", "acceptance_loss", "residual", "explained",
)  # fmt: skip


def forced_table(cells: pd.DataFrame, methods: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """One row per forced cell: the forced and the measured accepted length, drafts per drafting
    step, the share of steps that drafted, throughput and speedup with their 95% intervals."""
    sub = cells[cells.get("sweep", pd.Series("", index=cells.index)).fillna("") == FORCED].copy()
    if sub.empty:
        raise ValueError(f"no forced-acceptance cell in the cells table (sweep == {FORCED!r})")
    output_tokens = sub["tokens_per_s_pooled"] * sub["generate_s"]
    steps = output_tokens - sub["num_accepted_tokens"]  # every step emits 1 + its accepted drafts
    out = pd.DataFrame({
        "engine": sub["engine"], "model": sub["model"], "dataset": sub["dataset"],
        "base_method": [methods[m]["sweep_of"] for m in sub["method"]], "method": sub["method"],
        "sd_method": sub["sd_method"], "num_speculative_tokens": sub["num_speculative_tokens"].astype(int),
        "batch_size": sub["batch_size"].astype(int),
        "forced_acceptance_length": [float(methods[m]["forced_acceptance_length"]) for m in sub["method"]],
        "mean_acceptance_length": sub["mean_acceptance_length"],
        "drafts_per_step": sub["num_draft_tokens"] / sub["num_drafts"].where(sub["num_drafts"] > 0),
        "draft_step_share": sub["num_drafts"] / steps.where(steps > 0),
        "output_len_mean": sub["output_len_mean"],
        "tokens_per_s": sub["tokens_per_s"], "tokens_per_s_ci_low": sub["tokens_per_s_ci_low"],
        "tokens_per_s_ci_high": sub["tokens_per_s_ci_high"], "baseline_tokens_per_s": sub["paired_baseline_tokens_per_s"],
        "speedup": sub["speedup"], "speedup_ci_low": sub["speedup_ci_low"], "speedup_ci_high": sub["speedup_ci_high"],
        "generate_s": sub["generate_s"], "num_calls": sub["num_calls"],
        "contaminated": sub.get("contaminated", pd.Series(False, index=sub.index)).fillna(False).astype(bool),
    })  # fmt: skip
    return conform(out.sort_values([*KEYS, "forced_acceptance_length"]).reset_index(drop=True), COLUMNS, "forced acceptance")


def _interpolate(x: np.ndarray, y: np.ndarray, at: float) -> float:
    """``y`` at ``at`` on the line through the points (sorted by ``x``); NaN outside their range."""
    ok = ~(np.isnan(x) | np.isnan(y))
    x, y = x[ok], y[ok]
    if len(x) < 2 or math.isnan(at) or not x.min() - 1e-9 <= at <= x.max() + 1e-9:
        return float("nan")
    order = np.argsort(x, kind="stable")
    return float(np.interp(at, x[order], y[order]))


def gap_table(forced: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """Per engine x model x dataset x method x batch size with a real (unforced) cell: the
    measured speedup, the ceiling, the speedup at the real accepted length on the forced curve
    (each with its 95% interval) and the gap to the ideal k + 1 split as in the module docstring."""
    grid = cells[cells.get("sweep", pd.Series("", index=cells.index)).fillna("") == ""]
    real = grid.rename(columns={"method": "base_method"}).set_index(KEYS)
    rows = []
    for key, curve in forced.groupby(KEYS, sort=True):
        if key not in real.index:
            continue
        cell = real.loc[key]
        k = int(curve["num_speculative_tokens"].iloc[0])
        x = curve["mean_acceptance_length"].to_numpy(float)
        full = curve.loc[curve["forced_acceptance_length"].idxmax()]
        tau = float(cell["mean_acceptance_length"])
        at = {c: _interpolate(x, curve[c].to_numpy(float), tau) for c in ("speedup", "speedup_ci_low", "speedup_ci_high")}
        measured = float(cell["speedup"])
        ideal = float(k + 1)
        rows.append({
            **dict(zip(KEYS, key)), "sd_method": curve["sd_method"].iloc[0], "num_speculative_tokens": k,
            "real_acceptance_length": tau, "measured_speedup": measured,
            "measured_speedup_ci_low": float(cell["speedup_ci_low"]),
            "measured_speedup_ci_high": float(cell["speedup_ci_high"]),
            "ceiling_acceptance_length": float(full["mean_acceptance_length"]), "ceiling_speedup": float(full["speedup"]),
            "ceiling_speedup_ci_low": float(full["speedup_ci_low"]),
            "ceiling_speedup_ci_high": float(full["speedup_ci_high"]),
            "at_real_speedup": at["speedup"], "at_real_speedup_ci_low": at["speedup_ci_low"],
            "at_real_speedup_ci_high": at["speedup_ci_high"], "ideal_speedup": ideal,
            "system_loss": ideal - float(full["speedup"]), "acceptance_loss": float(full["speedup"]) - at["speedup"],
            "residual": at["speedup"] - measured,
            # Inside the forced curve's interval: the forced points explain the real cell.
            "explained": bool(at["speedup_ci_low"] <= measured <= at["speedup_ci_high"])
            if not math.isnan(at["speedup"]) else False,
        })  # fmt: skip
    return conform(pd.DataFrame(rows), GAP_COLUMNS, "SD gap")


def _fmt(x: Any, spec: str = ".2f") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _ci(v: float, lo: float, hi: float) -> str:
    return f"{_fmt(v)} [{_fmt(lo)}, {_fmt(hi)}]"


def forced_markdown(forced: pd.DataFrame, labels: dict[str, str]) -> str:
    """The forced points and each method's ceiling per batch size, as Markdown."""
    lines = [
        "# Forced acceptance: speedup at chosen accepted lengths, measured on the engine",
        "",
        "vLLM's synthetic rejection sampling sets how many drafts are accepted; the drafter still drafts and",
        "the target still verifies, so the step costs are real. τ forced is what was asked, τ measured what",
        "the engine's counters saw (n-gram drafts only where the prompt matches). Speedup over the paired",
        "no-SD arm, 95% bootstrap interval; every output runs to max_tokens in both arms.",
        "",
    ]
    for (engine, model, dataset), sub in forced.groupby(["engine", "model", "dataset"], sort=True):
        lines += [f"## {model} on {dataset} ({engine})", "",
                  "| method | batch size | τ forced | τ measured | drafts per step | speedup [95% CI] |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for r in sub.itertuples(index=False):
            lines.append(
                f"| {labels.get(r.base_method, r.base_method)} | {r.batch_size} | {r.forced_acceptance_length:g} "
                f"| {_fmt(r.mean_acceptance_length)} | {_fmt(r.drafts_per_step)} "
                f"| {_ci(r.speedup, r.speedup_ci_low, r.speedup_ci_high)} |"
            )
        lines += ["", "Ceiling (every draft accepted, τ = k + 1):", "",
                  "| method | " + " | ".join(f"bs {b}" for b in sorted(sub["batch_size"].unique())) + " |",
                  "|---|" + "---|" * sub["batch_size"].nunique()]  # fmt: skip
        for base, rows in sub.groupby("base_method", sort=True):
            full = rows[rows["forced_acceptance_length"] == rows["forced_acceptance_length"].max()]
            by_bs = {r.batch_size: _ci(r.speedup, r.speedup_ci_low, r.speedup_ci_high) for r in full.itertuples()}
            lines.append(f"| {labels.get(base, base)} | "
                         + " | ".join(by_bs.get(b, "—") for b in sorted(sub["batch_size"].unique())) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def gap_markdown(gap: pd.DataFrame, labels: dict[str, str]) -> str:
    """The gap to the ideal split into the engine's and the drafter's share, as Markdown."""
    lines = [
        "# How far from the ceiling: the gap split into system and acceptance",
        "",
        "Per method and batch size: the ideal k + 1 (every draft accepted, a step as cheap as one without SD),",
        "the measured ceiling (every draft accepted, on this engine), the speedup the forced curve gives at the",
        "method's real accepted length τ, and the measured speedup. system = ideal − ceiling (drafting and",
        "verification cost), acceptance = ceiling − at τ (the drafter's rejections), residual = at τ − measured",
        "(what forced acceptance at the same mean does not explain); ✓ where the measured speedup lies inside the",
        "forced curve's 95% interval at τ.",
        "",
        "| model / dataset | method | bs | τ | measured | at τ (forced curve) | ceiling | ideal | system | acceptance | residual | |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in gap.itertuples(index=False):
        lines.append(
            f"| {r.model} / {r.dataset} | {labels.get(r.base_method, r.base_method)} | {r.batch_size} "
            f"| {_fmt(r.real_acceptance_length)} | {_ci(r.measured_speedup, r.measured_speedup_ci_low, r.measured_speedup_ci_high)} "
            f"| {_ci(r.at_real_speedup, r.at_real_speedup_ci_low, r.at_real_speedup_ci_high)} "
            f"| {_ci(r.ceiling_speedup, r.ceiling_speedup_ci_low, r.ceiling_speedup_ci_high)} | {r.ideal_speedup:g} "
            f"| {_fmt(r.system_loss)} | {_fmt(r.acceptance_loss)} | {_fmt(r.residual, '+.2f')} "
            f"| {'✓' if r.explained else ''} |"
        )
    if len(gap):
        share = (gap["system_loss"] / (gap["ideal_speedup"] - gap["at_real_speedup"])).median()
        lines += ["", f"Median share of the gap between the ideal and the speedup at τ that the system "
                      f"takes: {_fmt(share * 100, '.0f')}%; {int(gap['explained'].sum())} of {len(gap)} measured "
                      "speedups lie inside the forced curve's interval."]  # fmt: skip
    return "\n".join(lines) + "\n"


def plot_forced(forced: pd.DataFrame, gap: pd.DataFrame, out_png: str | Path, labels: dict[str, str],
                dpi: int = 110) -> pd.DataFrame:  # fmt: skip
    """Speedup against the measured accepted length per method (a panel each), a line per batch
    size with 95% intervals; the method's own cell as a star; the ideal (speedup = τ) dotted.
    Returns the drawn table (series ``bs <N>``; the own cell a ``point``)."""
    from matplotlib.lines import Line2D

    from sdbench.plotting import drawn_table, figure_legend, panel_axes, panel_grid, pyplot, save_png

    panels = list(forced.groupby(["engine", "model", "dataset", "base_method"], sort=True))
    sizes = sorted(forced["batch_size"].unique())
    cmap = pyplot().get_cmap("viridis")
    colors = {b: cmap(0.1 + 0.8 * i / max(len(sizes) - 1, 1)) for i, b in enumerate(sizes)}
    fig, axes = panel_grid(len(panels), 3.8, 3.2, dpi)
    drawn = drawn_table(fig)
    for i, (key, sub) in enumerate(panels):
        ax = panel_axes(axes, i)
        top = float(sub["num_speculative_tokens"].max() + 1)
        drawn.plot(ax, [1, top], [1, top], color="grey", lw=0.8, ls=":", mark="reference", series="ideal")
        drawn.axhline(ax, 1.0, color="grey", lw=0.8, ls="--", series="no SD")
        for b, line in sub.groupby("batch_size", sort=True):
            line = line.sort_values("mean_acceptance_length")
            err = [(line["speedup"] - line["speedup_ci_low"]).clip(lower=0),
                   (line["speedup_ci_high"] - line["speedup"]).clip(lower=0)]  # fmt: skip
            drawn.errorbar(ax, line["mean_acceptance_length"], line["speedup"], yerr=err, color=colors[b], marker="o",
                           capsize=3, lw=1.2, series=f"bs {b}", label=f"forced, batch size {b}",
                           note=line["num_speculative_tokens"].map(lambda k: f"forced {k}"))  # fmt: skip
            real = gap[(gap[["engine", "model", "dataset", "base_method"]].apply(tuple, axis=1) == key)
                       & (gap["batch_size"] == b)] if len(gap) else gap  # fmt: skip
            for r in real.itertuples(index=False):
                drawn.errorbar(ax, [r.real_acceptance_length], [r.measured_speedup], color=colors[b], marker="*",
                               markersize=12, ls="none", capsize=3, mark="point", series=f"bs {b}",
                               label="the method's own cell",
                            yerr=[[max(r.measured_speedup - r.measured_speedup_ci_low, 0)],
                                  [max(r.measured_speedup_ci_high - r.measured_speedup, 0)]])  # fmt: skip
        ax.set_title(f"{labels.get(key[3], key[3])}\n{key[1]} / {key[2]}", fontsize=9)
        ax.set_xlabel("accepted length τ (measured)", fontsize=8)
        ax.set_ylabel("speedup over no SD", fontsize=8)
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=colors[b], marker="o", label=f"forced, batch size {b}") for b in sizes]
    handles += [Line2D([], [], color="black", marker="*", markersize=10, ls="none", label="the method's own cell"),
                Line2D([], [], color="grey", ls=":", label="ideal: speedup = τ")]  # fmt: skip
    figure_legend(fig, {}, extra=handles)
    return save_png(fig, out_png, dpi=dpi)


def plot_gap(gap: pd.DataFrame, out_png: str | Path, labels: dict[str, str], dpi: int = 110) -> pd.DataFrame:
    """Fig. 9 style: per method (a panel each) and batch size, bars for the measured speedup, the
    forced curve at the real τ, the ceiling (95% intervals) and the ideal k + 1. Returns the drawn
    table (series the bar's column, x the batch size; a missing value drawn as 0)."""
    from matplotlib.patches import Patch

    from sdbench.plotting import drawn_table, figure_legend, panel_axes, panel_grid, save_png

    bars = (("measured", "measured_speedup", "#4c72b0"),
            ("forced curve at the real τ", "at_real_speedup", "#55a868"),
            ("ceiling: every draft accepted", "ceiling_speedup", "#c44e52"),
            ("ideal: k + 1", "ideal_speedup", "#bbbbbb"))  # fmt: skip
    panels = list(gap.groupby(["engine", "model", "dataset", "base_method"], sort=True))
    fig, axes = panel_grid(len(panels), 3.8, 3.2, dpi)
    width = 0.8 / len(bars)
    for i, (key, sub) in enumerate(panels):
        ax = panel_axes(axes, i)
        sub = sub.sort_values("batch_size")
        xs = np.arange(len(sub))
        for j, (label, y, color) in enumerate(bars):
            err = None
            if f"{y}_ci_low" in sub:  # the ideal has no interval
                lo, hi = sub[f"{y}_ci_low"], sub[f"{y}_ci_high"]
                err = [(sub[y] - lo).clip(lower=0).fillna(0), (hi - sub[y]).clip(lower=0).fillna(0)]
            drawn_table(fig).bar(ax, xs + (j - 1.5) * width, sub[y].fillna(0), width, yerr=err, color=color, capsize=2,
                                 series=y, label=label, legend=False)  # fmt: skip
        drawn_table(fig).axhline(ax, 1.0, color="grey", lw=0.8, ls="--", series="no SD")
        ax.set_xticks(xs, [str(b) for b in sub["batch_size"]])
        ax.set_xlabel("batch size", fontsize=8)
        ax.set_ylabel("speedup over no SD", fontsize=8)
        ax.set_title(f"{labels.get(key[3], key[3])}\n{key[1]} / {key[2]}", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    figure_legend(fig, {}, extra=[Patch(color=color, label=label) for label, _, color in bars])
    return save_png(fig, out_png, dpi=dpi)


def _cmd_forced(args: argparse.Namespace) -> int:
    from sdbench.io import read_parquet

    cells = read_parquet(args.cells, what="cells table")
    methods = json.loads(args.methods)
    labels = {k: m.get("label", k) for k, m in methods.items()}
    forced = forced_table(cells, methods)
    gap = gap_table(forced, cells)
    write_parquet(forced, args.table)
    write_parquet(gap, args.gap_table)
    write_text(forced_markdown(forced, labels), args.markdown)
    write_text(gap_markdown(gap, labels), args.gap_markdown)
    plot_forced(forced, gap, args.figure, labels)
    plot_gap(gap, args.gap_figure, labels)
    return 0
