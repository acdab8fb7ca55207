"""Server mode's latency-throughput trade-off and what a token costs at each concurrency.

Reads the server groups' cell summaries (sdbench.engine.serving.servegroup) into one table, one row per
engine x model x dataset x method x concurrency, adds goodput under the configured latency targets
(:mod:`sdbench.analysis.goodput`, from the cells' requests), throughput per device and the cost per
1M output tokens and per request at the configured price (the same formula as
:mod:`sdbench.analysis.cost`), and draws, per engine x model x dataset, TPOT p50 against output
tokens/s per device: one curve per method, each point labelled by its concurrency. Up and to
the left is worse; a method whose curve lies below another's at the same throughput gives
users faster tokens for the same hardware.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from sdbench.analysis.cost import TOKENS, per_million_tokens
from sdbench.io import read_parquet, write_parquet, write_text
from sdbench.plotting import save_png
from sdbench.servermode import SERVER_CELL_KEYS

KEYS = list(SERVER_CELL_KEYS)
NEEDED = [*KEYS, "sd_method", "tokens_per_s", "tokens_per_s_min", "tokens_per_s_max", "mean_output_tokens",
          "ttft_p50_ms", "tpot_p50_ms", "tpot_p95_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms",
          "mean_acceptance_length"]  # fmt: skip


def read_server_cells(group_dirs: list[str | Path]) -> pd.DataFrame:
    """Every cell summary under the server group directories, sorted by the cell keys."""
    frames = []
    for group in group_dirs:
        paths = sorted(Path(group).glob("*/c*/summary.parquet"))
        if not paths:
            raise FileNotFoundError(f"{group}: no server cell summaries (<dataset>/c<N>/summary.parquet)")
        frames += [read_parquet(p, what="server cell summary") for p in paths]
    table = pd.concat(frames, ignore_index=True)
    missing = [c for c in NEEDED if c not in table]
    if missing:
        raise ValueError(f"server cell summaries lack columns {missing} (expected sdbench serve-group output)")
    return table.sort_values(KEYS, kind="stable").reset_index(drop=True)


def latency_table(
    cells: pd.DataFrame, price_per_device_hour: dict[str, float], devices: dict[str, int], currency: str
) -> pd.DataFrame:
    """The server cells with throughput per device and cost per 1M output tokens / per request.

    A server holds the model's ``tensor_parallel_size`` devices (1 without). The cost's range
    (``cost_per_1m_tokens_min``/``_max``) is the throughput's range over rounds, inverted.
    """
    unpriced = sorted(set(cells["engine"]) - set(price_per_device_hour))
    if unpriced:
        raise ValueError(f"cost.price_per_device_hour: no price for engine(s) {unpriced}")
    t = cells.copy()
    n_devices = t["model"].map(lambda m: int(devices.get(m, 1)))
    per_hour = t["engine"].map(price_per_device_hour).astype(float) * n_devices

    def per_million(tokens_per_s: pd.Series) -> pd.Series:
        return per_million_tokens(per_hour, tokens_per_s)

    t["devices"] = n_devices
    t["tokens_per_s_per_device"] = t["tokens_per_s"] / n_devices
    t["currency"] = currency
    t["price_per_hour"] = per_hour
    t["cost_per_1m_tokens"] = per_million(t["tokens_per_s"])
    t["cost_per_1m_tokens_min"] = per_million(t["tokens_per_s_max"])
    t["cost_per_1m_tokens_max"] = per_million(t["tokens_per_s_min"])
    t["cost_per_request"] = t["cost_per_1m_tokens"] / TOKENS * t["mean_output_tokens"]
    return t


def latency_markdown(table: pd.DataFrame, source: str = "") -> str:
    """Markdown: per cell throughput (median [min, max] over rounds), TTFT/TPOT/E2E percentiles, cost."""
    currency = ", ".join(sorted(set(table["currency"]))) or "?"
    lines = [
        "Server mode: a fixed number of requests in flight (concurrency), streamed from vLLM's "
        "OpenAI-compatible server. Throughput = output tokens / wall time of a round (median [min, max] "
        f"over rounds); TTFT, TPOT and E2E percentiles over every timed request. Cost in {currency}"
        + (f" ({source})." if source else ".")
        + " (busy) marks a cell the quiet-machine guard flagged: other work ran beside it. J/request: the "
        "timed rounds' metered energy over their requests (– where not metered: `energy_reason` says why).",
        "",
        "| engine | model | dataset | method | conc. | output tok/s [min, max] | TTFT p50 ms | TPOT p50 / p95 / p99 ms "
        "| E2E p50 / p99 ms | acc. length | per 1M tokens | per request | J/request |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table.itertuples(index=False):
        acc = "–" if np.isnan(r.mean_acceptance_length) else f"{r.mean_acceptance_length:.2f}"
        busy = " (busy)" if bool(getattr(r, "contaminated", False)) else ""
        lines.append(
            f"| {r.engine} | {r.model} | {r.dataset} | {r.method}{busy} | {r.concurrency} "
            f"| {r.tokens_per_s:.1f} [{r.tokens_per_s_min:.1f}, {r.tokens_per_s_max:.1f}] "
            f"| {r.ttft_p50_ms:.1f} | {r.tpot_p50_ms:.2f} / {r.tpot_p95_ms:.2f} / {r.tpot_p99_ms:.2f} "
            f"| {r.e2e_p50_ms:.0f} / {r.e2e_p99_ms:.0f} | {acc} | {r.cost_per_1m_tokens:.4g} "
            f"| {r.cost_per_request:.3g} "
            f"| {_joules(getattr(r, 'joules_per_request', np.nan))} |"
        )
    return "\n".join(lines) + "\n"


def _joules(v: float) -> str:
    return "–" if v is None or v != v else f"{v:.3g}"


def plot_latency_throughput(table: pd.DataFrame, out_png: str | Path) -> pd.DataFrame:
    """TPOT p50 vs output tokens/s per device, one curve per method, points labelled by concurrency;
    a panel per engine x model x dataset, wrapped into a grid. Returns the drawn table (x_lo/x_hi
    the min/max throughput per device, note the concurrency label)."""
    from sdbench.plotting import drawn_table, figure_legend, method_styles, panel_axes, panel_grid

    panels = list(table.groupby(["engine", "model", "dataset"], sort=True))
    styles = method_styles(table)
    fig, axes = panel_grid(len(panels), 4.6, 3.8, 110)
    for i, (keys, sub) in enumerate(panels):
        ax = panel_axes(axes, i)
        for method, line in sub.groupby("method", sort=True):
            line = line.sort_values("concurrency")
            x = line["tokens_per_s_per_device"]
            xerr = [
                (x - line["tokens_per_s_min"] / line["devices"]).clip(lower=0),
                (line["tokens_per_s_max"] / line["devices"] - x).clip(lower=0),
            ]
            style = styles[method]
            drawn_table(fig).errorbar(ax, x, line["tpot_p50_ms"], xerr=xerr, capsize=2, color=style.color,
                                      marker=style.marker, series=method, label=style.label,
                                      note=line["concurrency"].astype(str))  # fmt: skip
            for xi, yi, c in zip(x, line["tpot_p50_ms"], line["concurrency"]):
                ax.annotate(str(c), (xi, yi), textcoords="offset points", xytext=(3, 3), fontsize=7)
        ax.set_title(f"{keys[1]} / {keys[2]}\n{keys[0]}", fontsize=9)
        ax.set_xlabel("output tokens/s per device")
        ax.set_ylabel("TPOT p50 (ms)")
        ax.grid(alpha=0.3)
    figure_legend(fig, styles, title="method (point labels: requests in flight)")
    return save_png(fig, out_png, dpi=110)


def read_server_requests(group_dirs: list[str | Path]) -> pd.DataFrame:
    """Every timed request of the server cells under the group directories."""
    paths = sorted(p for group in group_dirs for p in Path(group).glob("*/c*/requests.parquet"))
    frames = [read_parquet(p, what="server requests table") for p in paths]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=KEYS)


def _cmd_latency(args: argparse.Namespace) -> int:
    from sdbench.analysis.goodput import add_goodput, goodput_markdown

    prices = json.loads(args.prices)
    devices = json.loads(args.devices)
    cells = read_server_cells(args.groups)
    cells = add_goodput(cells, read_server_requests(args.groups), json.loads(args.slo), args.seed)
    table = latency_table(cells, prices, devices, args.currency)
    write_parquet(table, args.output)
    write_text(latency_markdown(table, args.source) + "\n" + goodput_markdown(table), args.markdown)
    plot_latency_throughput(table, args.figure)
    return 0
