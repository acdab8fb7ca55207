"""Random-token inputs vs real prompts: how much a random-input benchmark misstates SD.

For every random-token dataset (``source: random_tokens``, sdbench.datasets.randomtokens) and
each cell it shares with its matched real dataset (same engine, model, method, batch size),
the table puts side by side the mean accepted length, the speedup over no SD (each set's own
no-SD cell) and the SD throughput, and gives random / real for each. SPEED-Bench reports random
inputs overstating SD throughput by about 23%; on a model that answers noise with noise the
sign can differ. Either way a ratio away from 1 is the error a random-input benchmark makes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from sdbench.columns import conform
from sdbench.io import read_parquet, write_parquet, write_text
from sdbench.plotting import save_png

KEYS = ["engine", "model", "method", "batch_size"]
VALUES = ["mean_acceptance_length", "speedup", "speedup_ci_low", "speedup_ci_high", "tokens_per_s",
          "output_len_mean"]  # fmt: skip
RATIOS = ["mean_acceptance_length", "speedup", "tokens_per_s", "output_len_mean"]  # random / real
COLUMNS: tuple[str, ...] = (
    "dataset_random", "dataset_real", *KEYS, "sd_method",
    *sorted([f"{v}_{side}" for v in VALUES for side in ("real", "random")] + [f"{v}_ratio" for v in RATIOS]),
)  # fmt: skip


def random_vs_real(cells: pd.DataFrame, pairs: dict[str, str]) -> pd.DataFrame:
    """One row per (random dataset, cell key) measured on both sets, sorted; ratios random / real."""
    if not pairs:
        raise ValueError("random-inputs: no random_tokens dataset in the config")
    missing = sorted({*KEYS, "dataset", "sd_method", *VALUES} - set(cells))
    if missing:
        raise ValueError(f"random-inputs: the cells table lacks columns {missing}")
    frames = []
    for random_name, real_name in sorted(pairs.items()):
        rnd = cells[cells["dataset"] == random_name]
        real = cells[cells["dataset"] == real_name]
        if rnd.empty:
            raise ValueError(f"random-inputs: no cell of dataset {random_name!r} in the cells table")
        both = real[KEYS + VALUES + ["sd_method"]].merge(
            rnd[KEYS + VALUES], on=KEYS, suffixes=("_real", "_random"), validate="one_to_one"
        )
        frames.append(both.assign(dataset_random=random_name, dataset_real=real_name))
    t = pd.concat(frames, ignore_index=True)
    if t.empty:
        raise ValueError(f"random-inputs: no cell is measured on both sets of {pairs}")
    for v in RATIOS:
        t[f"{v}_ratio"] = t[f"{v}_random"] / t[f"{v}_real"]
    cols = ["dataset_random", "dataset_real", *KEYS, "sd_method"]
    return conform(t.sort_values(cols, kind="stable").reset_index(drop=True), COLUMNS, "random inputs")


def _num(x: float, fmt: str = ".2f") -> str:
    return "n/a" if x is None or np.isnan(x) else format(x, fmt)


def random_vs_real_markdown(table: pd.DataFrame) -> str:
    """SD cells of the table as Markdown: real vs random accepted length and speedup, and ratios."""
    sd = table[table["sd_method"] != "none"]
    lines = [
        "| random set (matched to) | model | method | batch | accepted length real / random | speedup real / random "
        "| speedup random / real | output length random / real |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sd.itertuples(index=False):
        lines.append(
            f"| {r.dataset_random} ({r.dataset_real}) | {r.model} | {r.method} | {r.batch_size} "
            f"| {_num(r.mean_acceptance_length_real)} / {_num(r.mean_acceptance_length_random)} "
            f"| {_num(r.speedup_real)} [{_num(r.speedup_ci_low_real)}, {_num(r.speedup_ci_high_real)}] / "
            f"{_num(r.speedup_random)} [{_num(r.speedup_ci_low_random)}, {_num(r.speedup_ci_high_random)}] "
            f"| {_num(r.speedup_ratio)} | {_num(r.output_len_mean_ratio)} |"
        )
    return "\n".join(lines) + "\n"


def plot_random_vs_real(table: pd.DataFrame, out_png: str | Path) -> pd.DataFrame:
    """Speedup on real vs random prompts per SD method x batch size (bars with 95% intervals): a
    panel per random dataset x engine x model, wrapped into a grid. Returns the drawn table
    (series the method, x its tick label, note ``real`` or ``random``, label the prompts' dataset)."""
    from sdbench.plotting import drawn_table, method_style, panel_axes, panel_grid

    sd = table[table["sd_method"] != "none"]
    panels = list(sd.groupby(["dataset_random", "engine", "model"], sort=True))
    widest = max((len(sub) for _, sub in panels), default=1)
    fig, axes = panel_grid(len(panels), max(4.5, 0.8 * widest + 1.5), 3.8, 110)
    for i, ((rnd, engine, model), sub) in enumerate(panels):
        ax = panel_axes(axes, i)
        labels = [f"{method_style(m).label}\nbs{b}" for m, b in zip(sub["method"], sub["batch_size"])]
        x = np.arange(len(sub))
        colors = [method_style(m).color for m in sub["method"]]
        for offset, side, hatch in ((-0.2, "real", ""), (0.2, "random", "//")):
            y = sub[f"speedup_{side}"].to_numpy()
            err = [np.clip(y - sub[f"speedup_ci_low_{side}"], 0, None), np.clip(sub[f"speedup_ci_high_{side}"] - y, 0, None)]
            name = sub["dataset_real"].iloc[0] if side == "real" else rnd
            drawn_table(fig).bar(ax, x + offset, y, width=0.4, yerr=err, capsize=2, label=name, color=colors,
                                 hatch=hatch, alpha=0.9 if side == "real" else 0.5, edgecolor="black", linewidth=0.4,
                                 series=sub["method"],
                                 note=side)  # fmt: skip
        drawn_table(fig).axhline(ax, 1.0, color="grey", lw=0.8, ls="--", series="reference")
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_ylabel("speedup over no SD")
        ax.set_title(f"{model} ({engine})", fontsize=9)
        ax.legend(fontsize=7, title="prompts (hatched: random)", title_fontsize=7)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return save_png(fig, out_png, dpi=110)


def _cmd_random_inputs(args: argparse.Namespace) -> int:
    table = random_vs_real(read_parquet(args.cells, what="cells table"), json.loads(args.pairs))
    write_parquet(table, args.output)
    write_text(random_vs_real_markdown(table), args.markdown)
    plot_random_vs_real(table, args.figure)
    return 0
