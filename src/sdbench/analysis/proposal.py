"""Proposal-length sensitivity: acceptance, speedup and memory per method x num_speculative_tokens.

The cells come from the ``proposal_length`` sweep (sdbench.sweeps): one SD method run with
several k on the same model, dataset and batch size. Per point the table gives the mean
accepted length (tokens per verification step, 1 + accepted drafts), the acceptance rate
(accepted / proposed draft tokens), the speedup over no SD with its 95% interval, and memory:
the drafter's weights over no SD (analytical, independent of k), the KV cache the k draft
positions of every running sequence occupy in one step (batch size x k x KV per token), and
the measured peak (device on GPU; on CPU the process's RSS, which also holds the paired
no-SD engine, so it compares across k, not with the no-SD cell).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pandas as pd

from sdbench.columns import conform
from sdbench.io import read_parquet, write_parquet, write_text

POINT = ["engine", "model", "dataset", "batch_size", "base_method", "num_speculative_tokens"]
MEMORY = ["analytical_static_gib", "analytical_per_token_kib", "peak_memory_gib"]
GIB_PER_KIB = 1 / 2**20
COLUMNS: tuple[str, ...] = (
    *POINT, "method", "mean_acceptance_length", "acceptance_rate", "speedup", "speedup_ci_low", "speedup_ci_high",
    "extra_static_gib", "draft_kv_gib", "peak_memory_gib",
)  # fmt: skip


def proposal_length_table(
    cells: pd.DataFrame, memory: pd.DataFrame, points: dict[str, tuple[str, int]], scope: dict[str, Any]
) -> pd.DataFrame:
    """One row per sweep point: the sweep's methods on its ``scope`` (``engine``, ``models``,
    ``datasets``, ``batch_sizes``; the base method also runs elsewhere in the grid), sorted."""
    if not points:
        raise ValueError("proposal-length: no sweep points (config proposal_length)")
    keys = ["engine", "model", "dataset", "method", "batch_size"]
    missing = sorted({*keys, "mean_acceptance_length", "acceptance_rate", "speedup"} - set(cells))
    if missing:
        raise ValueError(f"proposal-length: the cells table lacks columns {missing}")
    mem = memory[keys + MEMORY]
    t = cells.merge(mem, on=keys, how="left", validate="one_to_one")
    none = t[t["sd_method"] == "none"][["engine", "model", "dataset", "batch_size", "analytical_static_gib"]]
    none = none.rename(columns={"analytical_static_gib": "no_sd_static_gib"})
    swept = t[
        t["method"].isin(list(points))
        & (t["engine"] == scope["engine"])
        & t["model"].isin(scope["models"])
        & t["dataset"].isin(scope["datasets"])
        & t["batch_size"].isin(scope["batch_sizes"])
    ].copy()
    if swept.empty:
        raise ValueError(f"proposal-length: no cell of the sweep's methods {sorted(points)} in the cells table")
    swept["base_method"] = swept["method"].map(lambda m: points[m][0])
    swept["num_speculative_tokens"] = swept["method"].map(lambda m: int(points[m][1]))
    swept = swept.merge(none, on=["engine", "model", "dataset", "batch_size"], how="left", validate="many_to_one")
    swept["extra_static_gib"] = swept["analytical_static_gib"] - swept["no_sd_static_gib"]
    swept["draft_kv_gib"] = (
        swept["batch_size"] * swept["num_speculative_tokens"] * swept["analytical_per_token_kib"] * GIB_PER_KIB
    )
    for c in ("speedup_ci_low", "speedup_ci_high"):
        if c not in swept:
            swept[c] = float("nan")
    table = swept.sort_values(POINT, kind="stable").reset_index(drop=True)
    return conform(table[[c for c in table.columns if c in COLUMNS]], COLUMNS, "proposal length")


def proposal_length_markdown(table: pd.DataFrame) -> str:
    """The table as Markdown, one block per engine / model / dataset / batch size."""
    out = []
    for keys, sub in table.groupby(["engine", "model", "dataset", "batch_size"], sort=True):
        out.append(f"### {keys[0]} / {keys[1]} / {keys[2]} / batch size {keys[3]}\n")
        out.append("| method | k | accepted length | acceptance rate | speedup [95%] | extra static GiB | draft KV GiB/step | peak GiB |")
        out.append("|---|---|---|---|---|---|---|---|")
        for r in sub.itertuples(index=False):
            out.append(
                f"| {r.base_method} | {r.num_speculative_tokens} | {r.mean_acceptance_length:.2f} "
                f"| {r.acceptance_rate:.2f} | {r.speedup:.2f} [{r.speedup_ci_low:.2f}, {r.speedup_ci_high:.2f}] "
                f"| {r.extra_static_gib:.4g} | {r.draft_kv_gib:.3g} | {r.peak_memory_gib:.3g} |"
            )
        out.append("")
    return "\n".join(out)


def plot_proposal_length(table: pd.DataFrame, out_png: str | Path) -> pd.DataFrame:
    """Speedup (with 95% intervals) and accepted length vs k, one line per method, a panel per
    engine x model x dataset x batch size."""
    from sdbench.plotting import method_lines

    # One line per base method across k: its label names the family only (k = 0 drops "k=...").
    lines = table.assign(method=table["base_method"], k=table["num_speculative_tokens"], num_speculative_tokens=0,
                         batch=table["batch_size"].map(lambda b: f"bs {b}"))  # fmt: skip
    return method_lines(lines, out_png, panel_keys=["engine", "model", "dataset", "batch"], x="k",
                        rows=[("speedup", "speedup_ci_low", "speedup_ci_high", "speedup over no SD"),
                              ("mean_acceptance_length", None, None, "mean accepted length (tokens/step)")],
                        xlabel="num_speculative_tokens (k)", hline={0: 1.0})  # fmt: skip


def _cmd_proposal_length(args: argparse.Namespace) -> int:
    points = {k: (v[0], int(v[1])) for k, v in json.loads(args.points).items()}
    cells, memory = read_parquet(args.cells, what="cells table"), read_parquet(args.memory, what="memory table")
    table = proposal_length_table(cells, memory, points, json.loads(args.scope))
    write_parquet(table, args.output)
    write_text(proposal_length_markdown(table), args.markdown)
    plot_proposal_length(table, args.figure)
    return 0
