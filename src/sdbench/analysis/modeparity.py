"""Offline and served speedups at the same load, side by side, and why they differ, measured.

The verdict judges SD offline (a batch of ``b`` prompts in one ``LLM.generate``) and in server mode
(``b`` requests in flight against vLLM's OpenAI-compatible server, streamed). At the same load the
two can disagree: on a 2-core CPU EAGLE-3 read 1.04x offline and 1.67x served (issue #50 item 7),
because the served no-SD arm streams one chunk per token and SD one per step, and because the
server runs the engine in other processes than ``LLM()`` does. This module joins each offline SD
cell (``grid_cells.parquet``: engine x model x dataset x method x batch size ``b``) with the served
cell of the same engine x model x dataset x method at concurrency ``b`` (``server.parquet``) and
gives

- both speedups (offline with its 95% interval; served with its interval, or range over rounds
  for a one-start table, the verdict's bounds :func:`sdbench.analysis.verdict.server_points`);
- the stream-off control's speedup: SD's over no SD's output tokens/s in the control rounds of the
  same servers with streaming off (plain completions, :func:`sdbench.engine.serving.loadgen.run_level`
  ``stream=False``; ``stream_off_tokens_per_s`` of the server table);
- ``reason``, from those numbers, never from a guess (:func:`reason`):
  ``agree`` (the served speedup lies inside the offline interval, or the served interval holds the
  offline speedup: no difference the measurement can tell, nothing to explain),
  ``client streaming`` (it does not, but the stream-off speedup does: turning streaming off removes
  the difference, so it is the client's per-chunk work, not the engine's),
  ``server layout`` (the stream-off speedup is outside the offline interval too: the server's own
  process layout changes the answer), ``no control`` (no stream-off rounds were measured).

``pairing`` is the served ratio's (``paired`` / ``unpaired``, :mod:`sdbench.analysis.goodput`);
the offline one's is ``offline_pairing`` (``paired``: its no-SD calls timed in the same process).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import pandas as pd

from sdbench.analysis.verdictpoints import judged_bounds, server_points
from sdbench.io import read_parquet, write_parquet, write_text

AGREE, CLIENT, LAYOUT, NO_CONTROL = "agree", "client streaming", "server layout", "no control"
REASONS = (AGREE, CLIENT, LAYOUT, NO_CONTROL)
KEYS = ["engine", "model", "dataset", "method"]
COLUMNS: tuple[str, ...] = (
    *KEYS, "sd_method", "num_speculative_tokens", "load", "offline_speedup", "offline_speedup_ci_low",
    "offline_speedup_ci_high", "offline_pairing", "offline_tokens_per_s", "offline_baseline_tokens_per_s",
    "served_speedup", "served_speedup_low", "served_speedup_high", "served_interval", "pairing",
    "served_tokens_per_s", "served_baseline_tokens_per_s", "stream_off_speedup", "stream_off_tokens_per_s",
    "stream_off_baseline_tokens_per_s", "reason", "flags",
)  # fmt: skip


def reason(offline: float, offline_low: float, offline_high: float, served: float, served_low: float,
           served_high: float, stream_off: float) -> str:  # fmt: skip
    """Why the served speedup differs from the offline one at the same load (:data:`REASONS`)."""
    inside = lambda x: offline_low <= x <= offline_high  # noqa: E731
    if inside(served) or served_low <= offline <= served_high:
        return AGREE
    if stream_off is None or math.isnan(stream_off):
        return NO_CONTROL
    return CLIENT if inside(stream_off) else LAYOUT


def modes_table(cells: pd.DataFrame, server: pd.DataFrame) -> pd.DataFrame:
    """Every offline SD cell with a served cell at the same load (:data:`COLUMNS`), sorted."""
    nan = math.nan
    if server is None or not len(server) or not len(cells):
        return pd.DataFrame(columns=list(COLUMNS))
    offline = cells[(cells["method"] != "none") & cells["speedup"].notna()]
    if "sweep" in offline:
        offline = offline[offline["sweep"].fillna("") == ""]
    points = server_points(server)
    low, high = judged_bounds(points)
    points = points.assign(served_speedup_low=low, served_speedup_high=high)
    control = server.set_index(["engine", "model", "dataset", "method", "concurrency"])
    off_col = "stream_off_tokens_per_s"
    rows = []
    for o in offline.to_dict("records"):
        at = points[(points["engine"] == o["engine"]) & (points["model"] == o["model"])
                    & (points["dataset"] == o["dataset"]) & (points["method"] == o["method"])
                    & (points["load"] == int(o["batch_size"]))]  # fmt: skip
        if at.empty:
            continue
        p = at.iloc[0]
        level = (o["engine"], o["model"], o["dataset"], int(o["batch_size"]))
        sd_row = control.loc[(*level[:3], o["method"], level[3])]
        base_rows = server[(server["engine"] == level[0]) & (server["model"] == level[1])
                           & (server["dataset"] == level[2]) & (server["concurrency"] == level[3])
                           & (server["sd_method"] == "none")]  # fmt: skip
        base_row = base_rows.iloc[0]
        sd_off = float(sd_row.get(off_col, nan)) if off_col in control else nan
        base_off = float(base_row.get(off_col, nan)) if off_col in server else nan
        stream_off = sd_off / base_off if base_off > 0 else nan
        design = o.get("speedup_design", "")
        rows.append({
            **{k: o[k] for k in KEYS}, "sd_method": o.get("sd_method", p["sd_method"]),
            "num_speculative_tokens": o.get("num_speculative_tokens", p["num_speculative_tokens"]),
            "load": int(o["batch_size"]), "offline_speedup": float(o["speedup"]),
            "offline_speedup_ci_low": float(o["speedup_ci_low"]),
            "offline_speedup_ci_high": float(o["speedup_ci_high"]),
            "offline_pairing": {"paired": "paired", "independent": "unpaired"}.get(design, ""),
            "offline_tokens_per_s": float(o.get("tokens_per_s", nan)),
            "offline_baseline_tokens_per_s": _offline_baseline(o),
            "served_speedup": float(p["speedup"]), "served_speedup_low": float(p["served_speedup_low"]),
            "served_speedup_high": float(p["served_speedup_high"]), "served_interval": p["interval"],
            "pairing": p["pairing"], "served_tokens_per_s": float(sd_row["tokens_per_s"]),
            "served_baseline_tokens_per_s": float(base_row["tokens_per_s"]), "stream_off_speedup": stream_off,
            "stream_off_tokens_per_s": sd_off, "stream_off_baseline_tokens_per_s": base_off,
            "reason": reason(float(o["speedup"]), float(o["speedup_ci_low"]), float(o["speedup_ci_high"]),
                             float(p["speedup"]), float(p["served_speedup_low"]), float(p["served_speedup_high"]),
                             stream_off),
            "flags": ", ".join(f for f in (_offline_flags(o), p["flags"]) if f),
        })  # fmt: skip
    out = pd.DataFrame(rows, columns=list(COLUMNS))
    return out.sort_values([*KEYS, "load"], kind="stable").reset_index(drop=True)


def _offline_baseline(cell: dict[str, Any]) -> float:
    """No SD's offline tokens/s beside this SD cell: its paired no-SD calls' (SD's over the paired
    speedup: timed in the same process, at the same time), else the no-SD cell's."""
    if cell.get("speedup_design") == "paired" and cell.get("speedup"):
        paired = cell.get("paired_baseline_tokens_per_s")
        if paired is not None and paired == paired:
            return float(paired)
        return float(cell["tokens_per_s"]) / float(cell["speedup"])
    return float(cell.get("baseline_tokens_per_s", math.nan))


def _offline_flags(cell: dict[str, Any]) -> str:
    names = (("preempted", "offline preempted"), ("contaminated", "offline contaminated"),
             ("hardware_mismatch", "offline hardware mismatch"))  # fmt: skip
    return ", ".join(label for key, label in names if bool(cell.get(key)) and cell.get(key) == cell.get(key))


def _f(x: float, spec: str = ".2f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


HEADER = ("| model / dataset (engine) | method | load | offline [95%] | served [interval] | draws "
          "| stream off | offline / served no-SD tok/s | reason |")  # fmt: skip


def modes_rows(table: pd.DataFrame, labels: dict[str, str]) -> list[str]:
    """The Markdown table of :func:`modes_table` (the verdict's paragraph and the report item)."""
    out = [HEADER, "|" + "---|" * 9]
    for r in table.itertuples(index=False):
        flag = f" ({r.flags})" if r.flags else ""
        out.append(
            f"| {r.model} / {r.dataset} ({r.engine}) | {labels.get(r.method, r.method)}{flag} | {r.load} "
            f"| {_f(r.offline_speedup)} [{_f(r.offline_speedup_ci_low)}, {_f(r.offline_speedup_ci_high)}] "
            f"| {_f(r.served_speedup)} [{_f(r.served_speedup_low)}, {_f(r.served_speedup_high)}] "
            f"| {r.pairing or '–'} "
            f"| {_f(r.stream_off_speedup)} | {_f(r.offline_baseline_tokens_per_s, '.0f')} / "
            f"{_f(r.served_baseline_tokens_per_s, '.0f')} | {r.reason} |"
        )  # fmt: skip
    return out


INTRO = (
    "At the same load (batch size b offline, b requests in flight served) SD's speedup over no SD, both ways: "
    "offline with its 95% interval, served with the verdict's bounds (95% bootstrap over server starts, or the "
    "range over rounds with one start per arm), and the stream-off control (the same servers answering plain, "
    "non-streamed completions). Reason, measured: `agree` (served inside the offline interval, or the served "
    "bounds hold the offline speedup: no difference to explain), `client "
    "streaming` (outside, but the stream-off speedup is inside: the difference is the client's per-chunk "
    "streaming work, not the engine's), `server layout` (the stream-off speedup is outside too: the server's "
    "process layout changes the answer), `no control` (no stream-off rounds measured)."
)


def modes_markdown(table: pd.DataFrame, labels: dict[str, str]) -> str:
    out = ["# Offline and served speedups at the same load\n", INTRO, ""]
    if table.empty:
        out.append("No offline cell has a served cell at the same load.")
    else:
        out += modes_rows(table, labels)
        counts = table["reason"].value_counts()
        out += ["", "Reasons: " + ", ".join(f"{r} {int(counts.get(r, 0))}" for r in REASONS) + "."]
    return "\n".join(out) + "\n"


def _cmd_mode_parity(args: argparse.Namespace) -> int:
    import json

    cells = read_parquet(args.cells, what="grid cells table")
    server = read_parquet(args.server, what="server table")
    labels = json.loads(args.labels) if args.labels else {}
    table = modes_table(cells, server)
    write_parquet(table, args.output)
    write_text(modes_markdown(table, labels), args.markdown)
    return 0
