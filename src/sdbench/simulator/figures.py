"""Figures of simulation results: Fig. 9 (fixed vs oracle), Fig. 11 (combining drafters),
compat vs exact, and the causal policies against their bounds.

Each returns its drawn table (:class:`sdbench.plotting.DrawnTable`, also written beside the
PNG): a ``line`` row per point, series the policy (or line) drawn, x the batch size, y the speedup.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from sdbench.plotting import drawn_table, figure_legend, panel_axes, panel_grid, pyplot, save_png, subplots
from sdbench.simulator.core import DEFAULT_BATCH_SIZES
from sdbench.simulator.reports import PAPER_GRID


def _axes_grid(nrows: int, ncols: int) -> tuple[object, np.ndarray]:
    fig, axes = subplots(nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows), squeeze=False, sharex=True)
    for ax in axes.flat:
        _style_batch_axes(ax)
    return fig, axes


def _style_batch_axes(ax: object) -> None:
    """Batch size on a log2 axis at the simulator's batch sizes, a line at speedup 1, a light grid."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(DEFAULT_BATCH_SIZES, [str(b) for b in DEFAULT_BATCH_SIZES])
    drawn_table(ax.figure).axhline(ax, 1.0, color="0.7", lw=0.8, series="no SD")
    ax.grid(alpha=0.3)


def figure_fixed_vs_oracle(results: pd.DataFrame, path: str | os.PathLike[str]) -> pd.DataFrame:
    """Fig. 9: speedup of fixed-k and oracle proposal lengths vs batch size, per dataset (rows)
    and proposer (columns: EAGLE, n-gram)."""
    datasets = sorted(results["dataset"].unique())
    proposers = [p for p in ("eagle", "ngram") if p in set(results["proposer"])]
    if not datasets or not proposers:
        raise ValueError("Fig. 9 needs simulate results of proposer eagle or ngram")
    fig, axes = _axes_grid(len(datasets), len(proposers))
    for i, d in enumerate(datasets):
        for j, p in enumerate(proposers):
            ax = axes[i, j]
            sub = results[(results["dataset"] == d) & (results["proposer"] == p)]
            for policy, g in sub.groupby("policy", sort=True):
                g = g.sort_values("batch_size")
                style = dict(color="k", lw=2) if policy.startswith("oracle") else dict(marker="o", ms=3)
                drawn_table(fig).plot(ax, g["batch_size"], g["speedup"], label=policy, series=policy, **style)
            ax.set_title(f"{d} / {'EAGLE' if p == 'eagle' else 'n-gram'}")
            if i == len(datasets) - 1:
                ax.set_xlabel("batch size")
            ax.set_ylabel("speedup")
            ax.legend(fontsize=7)
    return save_png(fig, path, dpi=130, bbox_inches="tight")


def figure_combining(results: pd.DataFrame, path: str | os.PathLike[str]) -> pd.DataFrame:
    """Fig. 11: oracle of EAGLE, of n-gram and of their per-position combination, with the best
    fixed policy of each, vs batch size per dataset."""
    datasets = sorted(results["dataset"].unique())
    fig, axes = _axes_grid(1, len(datasets))
    for j, d in enumerate(datasets):
        ax = axes[0, j]
        sub = results[results["dataset"] == d]
        lines = {
            "Oracle_Combine": sub[(sub["proposer"] == "combined") & sub["policy"].isin(["oracle", "oracle-combine"])],
            "Oracle_EAGLE": sub[(sub["proposer"] == "eagle") & (sub["policy"] == "oracle")],
            "Oracle_n-gram": sub[(sub["proposer"] == "ngram") & (sub["policy"] == "oracle")],
        }
        for p, label in (("eagle", "best fixed EAGLE"), ("ngram", "best fixed n-gram")):
            fx = sub[(sub["proposer"] == p) & sub["policy"].str.startswith("fixed-")]
            if len(fx):
                lines[label] = fx.loc[fx.groupby("batch_size")["speedup"].idxmax()]
        for label, g in lines.items():
            if len(g):
                g = g.sort_values("batch_size")
                ls = "-" if label.startswith("Oracle") else "--"
                drawn_table(fig).plot(ax, g["batch_size"], g["speedup"], ls, marker="o", ms=3, label=label, series=label,
                                      note=g["policy"])  # fmt: skip
        ax.set_title(d)
        ax.set_xlabel("batch size")
        ax.set_ylabel("speedup")
        ax.legend(fontsize=7)
    return save_png(fig, path, dpi=130, bbox_inches="tight")


def figure_compare(table: pd.DataFrame, path: str | os.PathLike[str]) -> pd.DataFrame:
    """Compat (dashed) vs exact (solid) speedup per dataset (rows) and proposer (columns)."""
    datasets = sorted(table["dataset"].unique())
    proposers = [p for p, _ in PAPER_GRID if p in set(table["proposer"])]
    fig, axes = _axes_grid(len(datasets), len(proposers))
    for i, d in enumerate(datasets):
        for j, p in enumerate(proposers):
            ax = axes[i, j]
            sub = table[(table["dataset"] == d) & (table["proposer"] == p)]
            for n, (policy, g) in enumerate(sub.groupby("policy", sort=True)):
                g = g.sort_values("batch_size")
                color = f"C{n}"
                drawn = drawn_table(fig)
                drawn.plot(ax, g["batch_size"], g["compat"], "--", color=color, lw=1, series=policy,
                           label=f"{policy} (compat)", legend=False, note="compat")  # fmt: skip
                drawn.plot(ax, g["batch_size"], g["exact"], "-", marker="o", ms=3, color=color, label=policy, series=policy,
                           note="exact")  # fmt: skip
            ax.set_title(f"{d} / {p} (dashed: compat, solid: exact)", fontsize=9)
            if i == len(datasets) - 1:
                ax.set_xlabel("batch size")
            ax.set_ylabel("speedup")
            ax.legend(fontsize=7)
    return save_png(fig, path, dpi=130, bbox_inches="tight")


def figure_adaptive(report: pd.DataFrame, path: str | os.PathLike[str]) -> pd.DataFrame:
    """Causal policies between the best fixed policy and oracle-combine, a panel per dataset
    (wrapped into a grid), one legend for all."""
    datasets = sorted(report["dataset"].unique())
    policies = sorted(report["policy"].unique())
    colors = dict(zip(policies, pyplot().rcParams["axes.prop_cycle"].by_key()["color"] * len(policies)))
    fig, axes = panel_grid(len(datasets), 4.2, 3.2, dpi=130)
    for j, d in enumerate(datasets):
        ax = panel_axes(axes, j)
        _style_batch_axes(ax)
        sub = report[report["dataset"] == d]
        ref = sub.drop_duplicates("batch_size").sort_values("batch_size")
        drawn = drawn_table(fig)
        drawn.fill_between(ax, ref["batch_size"], ref["best_fixed"], ref["oracle_combine"], color="0.9", label="gap",
                           series="gap")  # fmt: skip
        drawn.plot(ax, ref["batch_size"], ref["best_fixed"], "k-", lw=2, label="best fixed", series="best fixed")
        drawn.plot(ax, ref["batch_size"], ref["oracle_combine"], "k--", lw=2, label="oracle-combine",
                   series="oracle-combine")  # fmt: skip
        for policy, g in sub.groupby("policy", sort=True):
            g = g.sort_values("batch_size")
            drawn.plot(ax, g["batch_size"], g["speedup"], marker="o", ms=3, color=colors[policy], label=policy,
                       series=policy)  # fmt: skip
        ax.set_title(d)
        ax.set_xlabel("batch size")
        ax.set_ylabel("speedup")
    figure_legend(fig, {}, extra=axes[0, 0].get_legend_handles_labels()[0])
    return save_png(fig, path, dpi=130, bbox_inches="tight")
