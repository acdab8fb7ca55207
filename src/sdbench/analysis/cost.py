"""What a token costs: price per 1M output tokens and per request, per method x batch size.

A cell's measured throughput (the paper's metric, output tokens/s of the whole batch) is
what one engine instance delivers; the instance holds ``devices`` devices (the model's
``tensor_parallel_size``, 1 without) at the configured price per device-hour
(``cost.price_per_device_hour``, per engine). So

    cost per 1M output tokens = price/h x devices / (3600 x tokens/s) x 1e6
    cost per request          = cost per output token x the cell's mean output length

The interval of a cost is its throughput's 95% interval, inverted; the cost relative to the
same batch size without SD is 1 / speedup, with the speedup's interval (paired when the cell
was measured in pairs). An SD cell's throughput is its no-SD cell's times its speedup
(:func:`cost_table` says why). Batch size is the offline concurrency: every request of a call is in
flight at once. Prices are inputs, not facts: the config names where its numbers come from.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from sdbench.analysis.endtoend import grid_cells
from sdbench.columns import conform
from sdbench.io import read_parquet, write_parquet, write_text


KEYS = ["engine", "model", "dataset", "method", "batch_size"]
COLUMNS: tuple[str, ...] = (
    *KEYS, "sd_method", "currency", "devices", "price_per_hour", "tokens_per_s", "cost_per_1m_tokens",
    "cost_per_1m_tokens_ci_low", "cost_per_1m_tokens_ci_high", "cost_per_request", "cost_vs_no_sd",
    "cost_vs_no_sd_ci_low", "cost_vs_no_sd_ci_high",
)  # fmt: skip
NEEDED = [*KEYS, "sd_method", "tokens_per_s", "tokens_per_s_ci_low", "tokens_per_s_ci_high", "output_len_mean",
          "speedup", "speedup_ci_low", "speedup_ci_high"]  # fmt: skip
TOKENS = 1e6


def per_million_tokens(price_per_hour: pd.Series, tokens_per_s: pd.Series) -> pd.Series:
    """Cost of 1M output tokens at ``tokens_per_s`` for ``price_per_hour`` (NaN where nothing ran)."""
    return price_per_hour / (3600.0 * tokens_per_s.where(tokens_per_s > 0)) * TOKENS


def cost_table(
    cells: pd.DataFrame, price_per_device_hour: dict[str, float], devices: dict[str, int], currency: str
) -> pd.DataFrame:
    """One row per cell: price per hour, cost per 1M output tokens and per request (95% intervals).

    An SD cell's throughput is taken as its no-SD cell's (same engine, model, dataset and batch
    size) times its speedup. With paired measurement the speedup comes from the SD cell's own
    process, whose absolute speed differs from the no-SD group's process (two engines in one
    process, README "Uncertainty"); this keeps "cost" and "vs no SD" consistent. Its interval
    combines the no-SD throughput's interval with the speedup's (outer bounds).
    """
    missing = [c for c in NEEDED if c not in cells]
    if missing:
        raise ValueError(f"cost: the cells table lacks columns {missing}")
    unpriced = sorted(set(cells["engine"]) - set(price_per_device_hour))
    if unpriced:
        raise ValueError(f"cost.price_per_device_hour: no price for engine(s) {unpriced}")
    t = cells[NEEDED].sort_values(KEYS, kind="stable").reset_index(drop=True)
    base_keys = ["engine", "model", "dataset", "batch_size"]
    base = t.loc[t["sd_method"] == "none", base_keys + ["tokens_per_s", "tokens_per_s_ci_low", "tokens_per_s_ci_high"]]
    if base.duplicated(base_keys).any():
        raise ValueError("cost: more than one no-SD cell per engine/model/dataset/batch size")
    base = base.rename(columns=lambda c: c.replace("tokens_per_s", "base") if c.startswith("tokens") else c)
    t = t.merge(base, on=base_keys, how="left", validate="many_to_one")
    no_base = t[t["base"].isna()]
    if len(no_base):
        raise ValueError(f"cost: no no-SD cell for {no_base[KEYS].iloc[0].to_dict()}")
    is_sd = t["sd_method"] != "none"
    speedup = t["speedup"].where(is_sd, 1.0)
    tps = t["base"] * speedup
    tps_low = t["base_ci_low"] * t["speedup_ci_low"].where(is_sd, 1.0)
    tps_high = t["base_ci_high"] * t["speedup_ci_high"].where(is_sd, 1.0)

    n_devices = t["model"].map(lambda m: int(devices.get(m, 1)))
    per_hour = t["engine"].map(price_per_device_hour).astype(float) * n_devices

    def per_million(tokens_per_s: pd.Series) -> pd.Series:
        return per_million_tokens(per_hour, tokens_per_s)

    out = t[KEYS + ["sd_method"]].assign(
        currency=currency,
        devices=n_devices,
        price_per_hour=per_hour,
        tokens_per_s=tps,
        cost_per_1m_tokens=per_million(tps),
        # A higher throughput is a lower cost: the bounds swap.
        cost_per_1m_tokens_ci_low=per_million(tps_high),
        cost_per_1m_tokens_ci_high=per_million(tps_low),
    )
    out["cost_per_request"] = out["cost_per_1m_tokens"] / TOKENS * t["output_len_mean"]
    out["cost_vs_no_sd"] = 1.0 / speedup
    out["cost_vs_no_sd_ci_low"] = 1.0 / t["speedup_ci_high"].where(is_sd, 1.0)
    out["cost_vs_no_sd_ci_high"] = 1.0 / t["speedup_ci_low"].where(is_sd, 1.0)
    return conform(out, COLUMNS, "cost")


def cost_markdown(table: pd.DataFrame, source: str = "") -> str:
    """The table as Markdown: cost per 1M tokens [95% interval], per request, and relative to no SD."""
    currency = ", ".join(sorted(set(table["currency"]))) or "?"
    lines = [
        f"Cost in {currency} from the measured throughput and the configured price per device-hour"
        + (f" ({source})." if source else "."),
        "",
        "| engine | model | dataset | method | batch | price/h | per 1M output tokens [95%] | per request | vs no SD [95%] |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table.itertuples(index=False):
        relative = (
            "1" if r.sd_method == "none" else f"{r.cost_vs_no_sd:.2f} [{r.cost_vs_no_sd_ci_low:.2f}, {r.cost_vs_no_sd_ci_high:.2f}]"
        )
        lines.append(
            f"| {r.engine} | {r.model} | {r.dataset} | {r.method} | {r.batch_size} | {r.price_per_hour:.4g} "
            f"| {r.cost_per_1m_tokens:.4g} [{r.cost_per_1m_tokens_ci_low:.4g}, {r.cost_per_1m_tokens_ci_high:.4g}] "
            f"| {r.cost_per_request:.3g} | {relative} |"
        )
    return "\n".join(lines) + "\n"


def plot_cost(table: pd.DataFrame, out_png: str | Path) -> pd.DataFrame:
    """Cost per 1M output tokens vs batch size, one line per method, a panel per engine x model x dataset."""
    from sdbench.plotting import method_lines

    currency = table["currency"].iloc[0] if len(table) else ""
    return method_lines(table, out_png, panel_keys=["engine", "model", "dataset"], x="batch_size",
                        rows=[("cost_per_1m_tokens", "cost_per_1m_tokens_ci_low", "cost_per_1m_tokens_ci_high",
                               f"{currency} per 1M output tokens")],
                        xlabel="batch size (requests in flight)", xlog=2, ylog=True)  # fmt: skip


def _cmd_cost(args: argparse.Namespace) -> int:
    prices = json.loads(args.prices)
    devices = json.loads(args.devices)
    bad = {k: v for k, v in prices.items() if not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0}
    if bad:
        raise ValueError(f"cost.price_per_device_hour: not a price: {bad}")

    table = cost_table(grid_cells(read_parquet(args.cells, what="cells table")), prices, devices, args.currency)
    write_parquet(table, args.output)
    write_text(cost_markdown(table, args.source), args.markdown)
    plot_cost(table, args.figure)
    return 0
