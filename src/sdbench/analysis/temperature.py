"""Temperature sweep: acceptance and speedup vs sampling temperature, and where SD stops paying.

The cells come from the ``temperature`` sweep (sdbench.sweeps): each SD method and the no-SD
baseline run on a dataset and on its copies sampled at each temperature (``<dataset>.t<T>``;
T = 0 is the dataset itself, greedy). A sampled SD cell is timed against a no-SD arm running
the same calls with the same per-sequence seeds (sdbench.engine.measure.sampling), so its speedup is
SD at T over no SD at T. Per point the table gives the mean accepted length, the acceptance
rate, the mean output length (sampling changes how long outputs run, and with it the work per
request) and the speedup with its 95% interval, judged against 1:

- ``pays``: the interval lies entirely above 1;
- ``break-even``: the interval contains 1;
- ``loses``: the interval lies entirely below 1.

(the one rule of :mod:`sdbench.analysis.verdict`). The recommendation is derived from those verdicts: per engine x model x dataset x method x batch
size, the lowest swept temperature whose verdict is not ``pays`` (SD stops paying there), or
"pays at every swept temperature".
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from sdbench.analysis.verdict import BREAK_EVEN, LOSES, NO_INTERVAL, PAYS, verdict  # noqa: F401 - one rule
from sdbench.columns import conform
from sdbench.io import read_parquet, write_parquet, write_text

SCOPE = ["engine", "model", "base_dataset", "batch_size"]
LINE = ["engine", "model", "base_dataset", "method", "batch_size"]
VALUES = ["mean_acceptance_length", "acceptance_rate", "output_len_mean", "tokens_per_s", "baseline_tokens_per_s",
          "speedup", "speedup_ci_low", "speedup_ci_high"]  # fmt: skip
COLUMNS: tuple[str, ...] = (*LINE[:3], "dataset", "method", "batch_size", "temperature", *VALUES, "speedup_design",
                             "contaminated", "verdict")  # fmt: skip
RECOMMENDATION_COLUMNS: tuple[str, ...] = (*LINE, "stops_paying_at", "verdict", "speedup_there", "max_swept_temperature",
                                           "verdicts", "rule")  # fmt: skip
PAYS_EVERYWHERE = "pays at every swept temperature"
RULE = (
    "lowest swept temperature whose speedup 95% interval is not entirely above 1 "
    "(entirely below 1: loses; inside the equivalence margin around 1: break-even; containing 1 but wider: "
    "undecided); points without an interval are not judged and skipped"
)


def temperature_table(
    cells: pd.DataFrame, points: dict[str, tuple[str, float]], scope: dict[str, Any]
) -> pd.DataFrame:
    """One row per SD cell of the sweep (``scope``: its ``engine``, ``models``, ``methods``,
    ``batch_sizes``; ``points``: dataset key -> (base dataset, temperature)), with its verdict, sorted."""
    if not points:
        raise ValueError("temperature: no sweep points (config temperature)")
    keys = ["engine", "model", "dataset", "method", "batch_size"]
    missing = sorted({*keys, *VALUES} - set(cells))
    if missing:
        raise ValueError(f"temperature: the cells table lacks columns {missing}")
    t = cells[
        cells["dataset"].isin(list(points))
        & (cells["engine"] == scope["engine"])
        & cells["model"].isin(scope["models"])
        & cells["method"].isin(scope["methods"])
        & cells["batch_size"].isin(scope["batch_sizes"])
    ].copy()
    if t.empty:
        raise ValueError(
            f"temperature: no cell of the sweep's methods {sorted(scope['methods'])} on {sorted(points)} in the cells table"
        )
    t["base_dataset"] = t["dataset"].map(lambda d: points[d][0])
    t["temperature"] = t["dataset"].map(lambda d: float(points[d][1]))
    for column, default in (("speedup_design", ""), ("contaminated", False)):
        if column not in t:
            t[column] = default
    t["verdict"] = [verdict(lo, hi) for lo, hi in zip(t["speedup_ci_low"], t["speedup_ci_high"])]
    t = t.sort_values(LINE + ["temperature"], kind="stable").reset_index(drop=True)
    return conform(t[[c for c in t.columns if c in COLUMNS]], COLUMNS, "temperature")


def recommendation_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per engine x model x dataset x method x batch size: the lowest swept temperature at which
    SD stops paying (:data:`RULE`) and the verdict there, or :data:`PAYS_EVERYWHERE`."""
    rows = []
    for key, line in table.groupby(LINE, sort=True):
        line = line.sort_values("temperature")
        decided = line[line["verdict"] != NO_INTERVAL]
        stops = decided[decided["verdict"] != PAYS]
        first = stops.iloc[0] if len(stops) else None
        rows.append(
            {
                **dict(zip(LINE, key)),
                "stops_paying_at": float(first["temperature"]) if first is not None else float("nan"),
                "verdict": first["verdict"] if first is not None else PAYS_EVERYWHERE,
                "speedup_there": float(first["speedup"]) if first is not None else float("nan"),
                "max_swept_temperature": float(line["temperature"].max()),
                "verdicts": "; ".join(f"{t:g}: {v}" for t, v in zip(line["temperature"], line["verdict"])),
                "rule": RULE,
            }
        )
    return conform(pd.DataFrame(rows), RECOMMENDATION_COLUMNS, "temperature recommendation")


def _num(x: float, fmt: str = ".2f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def temperature_markdown(table: pd.DataFrame, recommendation: pd.DataFrame) -> str:
    """The sweep table (one block per engine / model / dataset / batch size) and the recommendation."""
    out = [
        "Speedup at T is SD sampled at T over no SD sampled at T with the same per-sequence seeds "
        "(paired arm); T = 0 is greedy decoding. Verdict from the speedup's 95% interval: above 1 pays, "
        "contains 1 break-even, below 1 loses.\n"
    ]
    for keys, sub in table.groupby(SCOPE, sort=True):
        out.append(f"### {keys[0]} / {keys[1]} / {keys[2]} / batch size {keys[3]}\n")
        out.append("| method | T | accepted length | acceptance rate | output length | speedup [95%] | verdict |")
        out.append("|---|---|---|---|---|---|---|")
        for r in sub.itertuples(index=False):
            flag = "*" if bool(r.contaminated) else ""
            out.append(
                f"| {r.method} | {r.temperature:g} | {_num(r.mean_acceptance_length)} | {_num(r.acceptance_rate)} "
                f"| {_num(r.output_len_mean, '.1f')} | {_num(r.speedup)} [{_num(r.speedup_ci_low)}, "
                f"{_num(r.speedup_ci_high)}]{flag} | {r.verdict} |"
            )
        out.append("")
    out.append("### Recommendation: where SD stops paying\n")
    out.append(f"Rule: {RULE}.\n")
    out.append("| engine | model | dataset | method | batch size | stops paying at T | verdict there | verdict per T |")
    out.append("|---|---|---|---|---|---|---|---|")
    for r in recommendation.itertuples(index=False):
        at = "—" if math.isnan(r.stops_paying_at) else f"{r.stops_paying_at:g} (speedup {_num(r.speedup_there)})"
        out.append(
            f"| {r.engine} | {r.model} | {r.base_dataset} | {r.method} | {r.batch_size} | {at} | {r.verdict} "
            f"| {r.verdicts} |"
        )
    return "\n".join(out) + "\n"


def plot_temperature(table: pd.DataFrame, out_png: str | Path) -> pd.DataFrame:
    """Accepted length and speedup (95% intervals, dashed line at 1) vs temperature, one line per
    method, a panel per engine / model / dataset / batch size."""
    from sdbench.plotting import method_lines

    lines = table.assign(dataset=table["base_dataset"], batch=table["batch_size"].map(lambda b: f"bs {b}"))
    return method_lines(lines, out_png, panel_keys=["engine", "model", "dataset", "batch"], x="temperature",
                        rows=[("mean_acceptance_length", None, None, "mean accepted length (tokens/step)"),
                              ("speedup", "speedup_ci_low", "speedup_ci_high", "speedup over no SD at the same T")],
                        xlabel="sampling temperature", hline={1: 1.0})  # fmt: skip


def _cmd_temperature(args: argparse.Namespace) -> int:
    points = {k: (v[0], float(v[1])) for k, v in json.loads(args.points).items()}
    table = temperature_table(read_parquet(args.cells, what="cells table"), points, json.loads(args.scope))
    recommendation = recommendation_table(table)
    write_parquet(table, args.output)
    write_parquet(recommendation, args.recommendation)
    write_text(temperature_markdown(table, recommendation), args.markdown)
    plot_temperature(table, args.figure)
    return 0
