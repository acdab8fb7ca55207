"""Server mode's verdict without a hand-picked target: the goodput frontier and the max-load table.

Fixed latency targets decide a goodput verdict: set on the baseline's own median, they turn a
1.2-2x throughput gain into "4.7-20x goodput". So, from the same per-request tables
(``requests.parquet`` of each server cell) and the same bootstrap as the server table's goodput
(:mod:`sdbench.analysis.goodput`: rounds, then requests within each drawn round; the same seeds, so
the same resamples):

- **the frontier**, per SD arm against no SD at the same concurrency: over a grid of (TTFT, TPOT)
  targets, log-spaced from the smaller of both arms' observed values over :data:`MARGIN` to the
  larger times it (so the grid shows where neither arm meets a target and where both meet every
  one; widened to hold the user's targets), :data:`GRID_POINTS` per axis, the region each target lies in
  (:func:`sdbench.analysis.goodput.region`): ``SD better`` where SD's goodput minus no SD's has its
  95% interval above 0, ``no SD better`` below 0, ``undecided`` where it contains 0, ``neither
  meets`` where no request of either arm meets the target (this hardware does not reach it). E2E is
  no axis (it is about TTFT + TPOT x output tokens); a request of one token has TPOT 0, as vLLM's.
- **the user's targets** (``server.slo``, per dataset, or ``--slo`` at the command line) are one
  point of that picture, marked, and judged with every target they set (E2E too) on the same draws:
  the verdict's goodput squares (:mod:`sdbench.analysis.verdict`) give the same region at them.
- **the max-load table** (DistServe's goodput, Zhong et al., OSDI 2024: the highest load at which
  at least 90% of requests meet the target): per arm (no SD too) and target, the largest measured
  concurrency up to which every concurrency has at least :data:`ATTAINMENT` of its requests meeting
  the target, with the requests per second served there; 95% bootstrap intervals (per draw, the
  same rule on that draw's attainments). Targets: the user's, and a ladder needing no choice,
  DistServe's "SLO scale": no SD's unloaded latency (its TTFT and TPOT p50 at the smallest
  concurrency measured) times each of :data:`SLO_SCALES`.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sdbench.analysis.goodput import (
    BASE_BETTER,
    NEITHER,
    REGIONS,
    SD_BETTER,
    TARGETS,
    UNDECIDED,
    draw_seed,
    meets_targets,
    region,
    server_draws,
)
from sdbench.analysis.stats import CONFIDENCE, NUM_RESAMPLES
from sdbench.analysis.verdictpoints import server_points
from sdbench.io import write_parquet, write_text
from sdbench.servermode import SERVER_CELL_KEYS

GRID_POINTS = 24  # targets per axis: 24 x 24 per panel
MARGIN = 1.25  # the grid reaches this factor beyond both arms' fastest and slowest requests
ATTAINMENT = 0.9  # DistServe's goodput: the share of requests that must meet the target
SLO_SCALES = (1.0, 1.5, 2.0, 3.0, 5.0)  # the max-load table's ladder, times no SD's unloaded p50
GRID, YOURS = "grid", "your targets"  # a frontier row: a grid target, or the user's (server.slo)
REGION_COLORS = {SD_BETTER: "#b7e4b0", BASE_BETTER: "#f4b6b0", UNDECIDED: "#e6e6e6", NEITHER: "#8c8c8c"}
ARM = ["engine", "model", "dataset", "method", "sd_method", "num_speculative_tokens"]
SLO_COLUMNS = ["slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms"]
FRONTIER_COLUMNS: tuple[str, ...] = (
    *ARM, "concurrency", "point", *SLO_COLUMNS, "goodput_rps", "baseline_goodput_rps", "goodput_difference_rps",
    "goodput_difference_rps_ci_low", "goodput_difference_rps_ci_high", "slo_attainment", "baseline_slo_attainment",
    "region", "pairing", "flags",
)  # fmt: skip
MAX_LOAD_COLUMNS: tuple[str, ...] = (
    *ARM, "target", "slo_scale", *SLO_COLUMNS, "concurrencies", "slo_attainments", "max_concurrency",
    "max_concurrency_ci_low", "max_concurrency_ci_high", "beyond_measured", "max_requests_per_s",
    "max_requests_per_s_ci_low", "max_requests_per_s_ci_high",
)  # fmt: skip


@dataclass
class Arm:
    """One server cell: its summary row, timed requests (the table's order), and bootstrap weights."""

    cell: dict[str, Any]
    requests: pd.DataFrame
    weights: np.ndarray  # resamples x requests: how often each request is drawn
    wall: np.ndarray  # per resample: the drawn rounds' summed wall time

    @property
    def walls(self) -> float:
        return float(sum(self.cell["round_wall_s"]))

    def ms(self, column: str) -> np.ndarray:
        """A latency column in ms; TPOT of a one-token request 0 (vLLM counts it so)."""
        values = self.requests[column].to_numpy(dtype=float) * 1000.0
        return np.nan_to_num(values, nan=0.0) if column == "tpot_s" else values

    def goodput(self, good: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Goodput per target (``good``: requests x targets) and its draws (resamples x targets)."""
        good = good.astype(float)
        return good.sum(axis=0) / self.walls, self.weights @ good / self.wall[:, None]


def arms(cells: pd.DataFrame, requests: pd.DataFrame, seed: int, resamples: int = NUM_RESAMPLES) -> dict[tuple, Arm]:
    """Every server cell as an :class:`Arm`, keyed by the server cell keys; the resamples are the
    server table's (:func:`sdbench.analysis.goodput.server_draws`: starts, rounds, requests; the
    same seeds, start draws joint for interleaved arms)."""
    out = {}
    for cell, reqs, weights, wall, pairing in server_draws(cells, requests, seed, resamples=resamples):
        key = tuple(cell[k] for k in SERVER_CELL_KEYS)
        out[key] = Arm({**cell, "pairing": pairing}, reqs.reset_index(drop=True), weights, wall)
    return out


def target_grid(values: list[np.ndarray], target: float | None, n: int = GRID_POINTS) -> np.ndarray:
    """``n`` targets (ms), log-spaced from the smallest positive value observed (or the user's
    target) over :data:`MARGIN` to the largest times it."""
    v = np.concatenate([np.asarray(x, dtype=float) for x in values])
    v = v[np.isfinite(v) & (v > 0)]
    if target is not None:
        v = np.append(v, float(target))
    if not len(v):  # every request of one token: TPOT bounds nothing, any grid will do
        v = np.array([1.0])
    return np.geomspace(v.min() / MARGIN, v.max() * MARGIN, n)


def _difference_interval(sd: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(sd - base, [tail, 1 - tail], axis=0, method="inverted_cdf")
    return low, high


def _slo_values(slo: dict[str, float]) -> dict[str, float]:
    return {f"slo_{k}": float(slo[k]) if slo.get(k) is not None else math.nan for k in TARGETS}


def pair_frontier(sd: Arm, base: Arm, slo: dict[str, float], n: int = GRID_POINTS) -> pd.DataFrame:
    """One SD arm against no SD at one concurrency: a row per grid target (TTFT x TPOT), then one for
    the user's targets where ``slo`` sets any."""
    ttft = target_grid([sd.ms("ttft_s"), base.ms("ttft_s")], slo.get("ttft_ms"), n)
    tpot = target_grid([sd.ms("tpot_s"), base.ms("tpot_s")], slo.get("tpot_ms"), n)

    def good_on_grid(arm: Arm) -> np.ndarray:  # requests x (TTFT target, TPOT target), TTFT major
        ok_ttft = arm.ms("ttft_s")[:, None] <= ttft[None, :]
        ok_tpot = arm.ms("tpot_s")[:, None] <= tpot[None, :]
        return (ok_ttft[:, :, None] & ok_tpot[:, None, :]).reshape(len(arm.requests), -1)

    goods = [good_on_grid(sd), good_on_grid(base)]
    frame = pd.DataFrame({"point": GRID, "slo_ttft_ms": np.repeat(ttft, n), "slo_tpot_ms": np.tile(tpot, n),
                          "slo_e2e_ms": math.nan})  # fmt: skip
    if any(slo.get(k) is not None for k in TARGETS):
        goods = [np.concatenate([g, meets_targets(arm.requests, slo)[:, None]], axis=1)
                 for g, arm in zip(goods, (sd, base))]  # fmt: skip
        frame = pd.concat([frame, pd.DataFrame([{"point": YOURS, **_slo_values(slo)}])], ignore_index=True)
    (g_sd, d_sd), (g_base, d_base) = sd.goodput(goods[0]), base.goodput(goods[1])
    low, high = _difference_interval(d_sd, d_base)
    keys = {c: sd.cell.get(c) for c in ARM}
    return frame.assign(**keys, concurrency=sd.cell["concurrency"], pairing=sd.cell.get("pairing", ""),
                        goodput_rps=g_sd, baseline_goodput_rps=g_base,
                        goodput_difference_rps=g_sd - g_base, goodput_difference_rps_ci_low=low,
                        goodput_difference_rps_ci_high=high, slo_attainment=goods[0].mean(axis=0),
                        baseline_slo_attainment=goods[1].mean(axis=0),
                        region=region(d_sd, d_base, g_sd, g_base))  # fmt: skip


def _pairs(found: dict[tuple, Arm]) -> list[tuple[Arm, Arm]]:
    """(SD arm, no-SD arm at the same engine x model x dataset x concurrency), sorted."""
    base = {(a.cell["engine"], a.cell["model"], a.cell["dataset"], a.cell["concurrency"]): a
            for a in found.values() if a.cell["sd_method"] == "none"}  # fmt: skip
    out = []
    for key in sorted(found, key=lambda k: tuple(str(x) for x in k[:4]) + (int(k[4]),)):
        arm = found[key]
        at = (arm.cell["engine"], arm.cell["model"], arm.cell["dataset"], arm.cell["concurrency"])
        if arm.cell["sd_method"] != "none" and at in base:
            out.append((arm, base[at]))
    return out


def _flags(cells: pd.DataFrame) -> dict[tuple, str]:
    """The verdict's flags per SD point (contaminated either arm, hardware mismatch), by cell keys."""
    points = server_points(cells)
    return {(r.engine, r.model, r.dataset, r.method, int(r.load)): r.flags for r in points.itertuples(index=False)}


def frontier_table(found: dict[tuple, Arm], cells: pd.DataFrame, slos: dict[str, dict[str, float]],
                   n: int = GRID_POINTS) -> pd.DataFrame:  # fmt: skip
    """The frontier of every SD arm against no SD at each concurrency (:data:`FRONTIER_COLUMNS`)."""
    flags = _flags(cells) if len(cells) else {}
    frames = [pair_frontier(sd, base, slos.get(sd.cell["dataset"], {}), n) for sd, base in _pairs(found)]
    if not frames:
        return pd.DataFrame(columns=list(FRONTIER_COLUMNS))
    out = pd.concat(frames, ignore_index=True)
    out["flags"] = [flags.get((r.engine, r.model, r.dataset, r.method, int(r.concurrency)), "")
                    for r in out.itertuples(index=False)]  # fmt: skip
    return out[list(FRONTIER_COLUMNS)]


# ----------------------------------------------------------------------------- max load
def ladder(found: dict[tuple, Arm], engine: str, model: str, dataset: str) -> list[tuple[float, dict[str, float]]]:
    """(scale, targets) of the SLO-scale ladder: no SD's TTFT and TPOT p50 at its smallest
    concurrency times each of :data:`SLO_SCALES` ([] without a no-SD arm)."""
    base = [a for a in found.values() if a.cell["sd_method"] == "none"
            and (a.cell["engine"], a.cell["model"], a.cell["dataset"]) == (engine, model, dataset)]  # fmt: skip
    if not base:
        return []
    unloaded = min(base, key=lambda a: int(a.cell["concurrency"]))
    tpot = unloaded.requests["tpot_s"].to_numpy(dtype=float) * 1000.0
    ttft_p50 = float(np.median(unloaded.ms("ttft_s")))
    tpot_p50 = float(np.median(tpot[~np.isnan(tpot)])) if (~np.isnan(tpot)).any() else math.nan
    return [(s, {"ttft_ms": s * ttft_p50, **({"tpot_ms": s * tpot_p50} if not math.isnan(tpot_p50) else {})})
            for s in SLO_SCALES]  # fmt: skip


def max_load(line: list[Arm], slo: dict[str, float]) -> dict[str, Any]:
    """One arm's highest load meeting ``slo`` (``line``: its cells by increasing concurrency): the
    largest concurrency up to which every measured one has at least :data:`ATTAINMENT` of its
    requests meeting every target (0 when the smallest does not), the requests per second there,
    and their 95% bootstrap intervals (the same rule on each draw's attainments and rates)."""
    concurrency = np.array([int(a.cell["concurrency"]) for a in line])
    attain = np.array([meets_targets(a.requests, slo).mean() for a in line])
    rate = np.array([len(a.requests) / a.walls for a in line])
    draws_att = np.stack([a.weights @ meets_targets(a.requests, slo).astype(float) / a.weights.sum(axis=1)
                          for a in line], axis=1)  # fmt: skip
    draws_rate = np.stack([a.weights.sum(axis=1) / a.wall for a in line], axis=1)

    def highest(ok: np.ndarray) -> np.ndarray:  # leading levels meeting the share -> index of the last, -1 none
        return np.cumprod(ok, axis=-1).sum(axis=-1) - 1

    top = int(highest(attain >= ATTAINMENT))
    tops = highest(draws_att >= ATTAINMENT)
    at = np.concatenate([[0], concurrency])[tops + 1]  # 0 where no level meets it
    served = np.where(tops >= 0, draws_rate[np.arange(len(tops)), np.maximum(tops, 0)], 0.0)
    tail = (1 - CONFIDENCE) / 2
    (c_low, c_high), (r_low, r_high) = (np.quantile(x, [tail, 1 - tail], method="inverted_cdf") for x in (at, served))
    return {
        "concurrencies": concurrency.tolist(), "slo_attainments": attain.tolist(),
        "max_concurrency": int(concurrency[top]) if top >= 0 else 0,
        "max_concurrency_ci_low": float(c_low), "max_concurrency_ci_high": float(c_high),
        "beyond_measured": bool(top == len(line) - 1),
        "max_requests_per_s": float(rate[top]) if top >= 0 else 0.0,
        "max_requests_per_s_ci_low": float(r_low), "max_requests_per_s_ci_high": float(r_high),
    }  # fmt: skip


def max_load_table(found: dict[tuple, Arm], slos: dict[str, dict[str, float]]) -> pd.DataFrame:
    """Per arm (no SD too) and target (the user's, then the SLO-scale ladder): :func:`max_load`."""
    lines: dict[tuple, list[Arm]] = {}
    for arm in found.values():
        lines.setdefault(tuple(arm.cell.get(c) for c in ARM), []).append(arm)
    rows = []
    for key in sorted(lines, key=lambda k: tuple(str(x) for x in k)):
        line = sorted(lines[key], key=lambda a: int(a.cell["concurrency"]))
        engine, model, dataset = key[:3]
        user = {k: v for k, v in slos.get(dataset, {}).items() if k in TARGETS and v is not None}
        targets = ([(YOURS, math.nan, user)] if user else [])
        targets += [(f"scale {s:g}", s, t) for s, t in ladder(found, engine, model, dataset)]
        for name, scale, slo in targets:
            rows.append({**dict(zip(ARM, key)), "target": name, "slo_scale": scale, **_slo_values(slo),
                         **max_load(line, slo)})  # fmt: skip
    return pd.DataFrame(rows, columns=list(MAX_LOAD_COLUMNS))


# ----------------------------------------------------------------------------- Markdown
def _label(labels: dict[str, str], method: str, sd_method: str, k: Any) -> str:
    from sdbench.plotting import method_style

    return labels.get(method) or method_style(method, sd_method, None if k is None or k != k else int(k)).label


def _ms(v: float) -> str:
    return "–" if v is None or math.isnan(v) else f"{v:.3g}"


def _runs(values: np.ndarray, last: bool) -> str:
    """Sorted neighbouring targets of the grid as a range (``a-b``; ``≥a`` when it reaches the grid's
    loosest target, beyond every request of both arms)."""
    if last:
        return f"≥{_ms(values[0])}"
    return f"{_ms(values[0])}-{_ms(values[-1])}" if len(values) > 1 else _ms(values[0])


def sd_better_tpot(panel: pd.DataFrame) -> str:
    """The TPOT targets (ms) where SD is better at the loosest TTFT target of the grid, as runs."""
    grid = panel[panel["point"] == GRID]
    top = grid[grid["slo_ttft_ms"] == grid["slo_ttft_ms"].max()].sort_values("slo_tpot_ms")
    tpot, better = top["slo_tpot_ms"].to_numpy(), (top["region"] == SD_BETTER).to_numpy()
    runs, start = [], None
    for i, b in enumerate([*better, False]):
        if b and start is None:
            start = i
        elif not b and start is not None:
            runs.append(_runs(tpot[start:i], i == len(tpot)))
            start = None
    return ", ".join(runs) or "none"


def _targets_text(r: Any) -> str:
    names = (("TTFT", "slo_ttft_ms"), ("TPOT", "slo_tpot_ms"), ("E2E", "slo_e2e_ms"))
    parts = [f"{n} {_ms(getattr(r, c))}" for n, c in names if not math.isnan(getattr(r, c))]
    return " / ".join(parts) + " ms"


def _load(v: float, largest: int) -> str:
    """A max load as read: ``none`` (no level meets it), ``≥N`` at the largest level measured."""
    return "none" if v == 0 else f"≥{v:g}" if v >= largest else f"{v:g}"


def frontier_markdown(frontier: pd.DataFrame, loads: pd.DataFrame, labels: dict[str, str],
                      grid: int = GRID_POINTS) -> str:  # fmt: skip
    """Per model x dataset: each SD arm's frontier in numbers (the share of grid targets per region,
    the TPOT targets where SD is better, where the user's targets fall), then the max-load table."""
    out = ["# Goodput without a hand-picked target\n",
           "Over a grid of TTFT x TPOT targets spanning both arms' requests (log-spaced, "
           f"{grid} x {grid}), where SD's goodput (requests/s meeting both targets) is higher than no "
           f"SD's at the same concurrency with 95% confidence (bootstrap over server starts, rounds and requests; "
           "`paired`: the arms' starts interleaved in one job "
           f"and drawn jointly, `unpaired`: drawn independently): `{SD_BETTER}` "
           f"(the difference's interval above 0), `{BASE_BETTER}` (below 0), `{UNDECIDED}` (contains 0), "
           f"`{NEITHER}` (no request of either arm meets the target: not reached on this hardware, not scored). "
           "Your targets (`server.slo`, E2E included) are one point on it. Then DistServe's goodput: each arm's "
           f"highest concurrency up to which at least {ATTAINMENT:.0%} of the requests of every concurrency meet a "
           "target, and the requests/s served there [95% bootstrap interval], for your targets and for no SD's "
           "unloaded latency (TTFT and TPOT p50 at its smallest concurrency) times each SLO scale.\n"]  # fmt: skip
    keys = ["engine", "model", "dataset"]
    scopes = sorted({tuple(k) for k in pd.concat([frontier[keys], loads[keys]]).itertuples(index=False)})
    if not scopes:
        out.append("No server cells.\n")
    for engine, model, dataset in scopes:
        out.append(f"## {model} / {dataset} ({engine})\n")
        sub = frontier[(frontier["engine"] == engine) & (frontier["model"] == model) & (frontier["dataset"] == dataset)]
        if sub.empty:
            out.append("No SD arm with a no-SD arm at the same concurrency: no frontier.\n")
        else:
            out.append("| method | conc. | draws | " + " | ".join(f"{r} (share of grid)" for r in REGIONS)
                       + " | SD better at TPOT targets (ms), loosest TTFT | your targets |")  # fmt: skip
            out.append("|" + "---|" * (len(REGIONS) + 5))
            for (method, c), panel in sub.groupby(["method", "concurrency"], sort=True):
                grid = panel[panel["point"] == GRID]
                shares = [f"{(grid['region'] == r).mean():.0%}" for r in REGIONS]
                yours = panel[panel["point"] == YOURS]
                mark = "–" if yours.empty else (f"{yours['region'].iloc[0]} ({_targets_text(yours.iloc[0])}: SD "
                                                f"{yours['goodput_rps'].iloc[0]:.3g}, no SD "
                                                f"{yours['baseline_goodput_rps'].iloc[0]:.3g} req/s)")  # fmt: skip
                flag = f" (flagged: {panel['flags'].iloc[0]})" if panel["flags"].iloc[0] else ""
                label = _label(labels, method, panel["sd_method"].iloc[0], panel["num_speculative_tokens"].iloc[0])
                pairing = panel["pairing"].iloc[0] if "pairing" in panel else ""
                out.append(f"| {label}{flag} | {c} | {pairing or '–'} | " + " | ".join(shares)
                           + f" | {sd_better_tpot(panel)} | {mark} |")  # fmt: skip
            out.append("")
        lsub = loads[(loads["engine"] == engine) & (loads["model"] == model) & (loads["dataset"] == dataset)]
        if lsub.empty:
            continue
        targets = list(dict.fromkeys(lsub["target"]))
        heads = [f"{t}: {_targets_text(lsub[lsub['target'] == t].iloc[0])}" for t in targets]
        out.append(f"Highest concurrency with ≥{ATTAINMENT:.0%} of requests meeting the target [95%]; requests/s "
                   "served there [95%].\n")  # fmt: skip
        out.append("| method | " + " | ".join(heads) + " |")
        out.append("|" + "---|" * (len(heads) + 1))
        for _, rows in sorted(lsub.groupby("method", sort=True), key=lambda m: m[1]["sd_method"].iloc[0] != "none"):
            r0 = rows.iloc[0]
            cells = []
            for t in targets:
                r = rows[rows["target"] == t].iloc[0]
                top = max(r["concurrencies"])
                load = (f"{_load(r['max_concurrency'], top)} [{_load(r['max_concurrency_ci_low'], top)}, "
                        f"{_load(r['max_concurrency_ci_high'], top)}]")  # fmt: skip
                rate = (f"{r['max_requests_per_s']:.3g} [{r['max_requests_per_s_ci_low']:.3g}, "
                        f"{r['max_requests_per_s_ci_high']:.3g}]")  # fmt: skip
                cells.append(f"{load}; {rate} req/s")
            out.append(f"| {_label(labels, r0['method'], r0['sd_method'], r0['num_speculative_tokens'])} | "
                       + " | ".join(cells) + " |")  # fmt: skip
        out.append("")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- the figure
def _tick(value: float, _: Any = None) -> str:
    """A log axis's tick as milliseconds (1, 2, 3, 5 of each decade; the others unlabelled)."""
    mantissa = round(value / 10 ** math.floor(math.log10(value)), 6) if value > 0 else 0
    return f"{value:g}" if mantissa in (1, 2, 3, 5) else ""


def plot_frontier(frontier: pd.DataFrame, out_png: str | Path, labels: dict[str, str]) -> pd.DataFrame:
    """A panel per engine x model x dataset x SD arm x concurrency: x the TPOT target, y the TTFT
    target (ms, log), a square per grid target in its region's colour, a star at the user's targets.
    Returns the drawn table: a ``cell`` per grid target (x, y its TPOT and TTFT targets, series the
    method, note its region, color the region's), a ``target`` for the user's (note: its region)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    from sdbench.plotting import drawn_table, save_png, subplots

    panels = list(frontier.groupby(["engine", "model", "dataset", "method", "concurrency"], sort=True))
    # A row per arm (engine x model x dataset x SD method), a column per concurrency.
    rows = list(dict.fromkeys(key[:4] for key, _ in panels)) or [()]
    columns = sorted({key[4] for key, _ in panels}) or [0]
    dpi = 110
    fig, axes = subplots(len(rows), len(columns), figsize=(3.0 * len(columns), 3.3 * len(rows) + 0.6), squeeze=False)
    drawn = drawn_table(fig)
    used = {(rows.index(key[:4]), columns.index(key[4])) for key, _ in panels}
    for r, c in np.ndindex(axes.shape):
        axes[r, c].set_visible((r, c) in used or not panels)
    squares = []
    for (engine, model, dataset, method, c), panel in panels:
        ax = axes[rows.index((engine, model, dataset, method)), columns.index(c)]
        grid = panel[panel["point"] == GRID]
        tpot, ttft = np.sort(grid["slo_tpot_ms"].unique()), np.sort(grid["slo_ttft_ms"].unique())
        for name in REGIONS:
            at = grid[grid["region"] == name]
            if len(at):
                squares.append((ax, len(tpot), drawn.scatter(ax, at["slo_tpot_ms"], at["slo_ttft_ms"], series=method,
                                                             mark="cell", note=name, marker="s",
                                                             color=REGION_COLORS[name], linewidths=0)))  # fmt: skip
        for r in panel[panel["point"] == YOURS].itertuples(index=False):
            # A target left unset bounds nothing: drawn at the grid's loosest value, where every request meets it.
            x = r.slo_tpot_ms if not math.isnan(r.slo_tpot_ms) else tpot[-1]
            y = r.slo_ttft_ms if not math.isnan(r.slo_ttft_ms) else ttft[-1]
            drawn.scatter(ax, [x], [y], series=method, mark="target", note=f"your targets: {r.region}", marker="*",
                          s=140, color="black", edgecolors="white", linewidths=0.6, zorder=3)  # fmt: skip
        for values, setter in ((tpot, ax.set_xlim), (ttft, ax.set_ylim)):
            half = math.sqrt(values[1] / values[0]) if len(values) > 1 else 1.5  # half a grid step, in log
            setter(values[0] / half, values[-1] * half)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_box_aspect(1)  # as many steps up as across: a grid target's square is square
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FuncFormatter(_tick))
            axis.set_minor_formatter(FuncFormatter(_tick))
        label = _label(labels, method, panel["sd_method"].iloc[0], panel["num_speculative_tokens"].iloc[0])
        flag = f" (flagged: {panel['flags'].iloc[0]})" if panel["flags"].iloc[0] else ""
        ax.set_title(f"{model} / {dataset} / {engine}\n{label}, concurrency {c}{flag}", fontsize=8)
        ax.set_xlabel("TPOT target (ms)", fontsize=8)
        ax.set_ylabel("TTFT target (ms)", fontsize=8)
        ax.tick_params(which="both", labelsize=7)
    if not panels:
        axes[0, 0].text(0.5, 0.5, "no SD arm with a no-SD arm\nat the same concurrency", ha="center", va="center",
                        fontsize=9, transform=axes[0, 0].transAxes)  # fmt: skip
    legend = [Patch(color=REGION_COLORS[r], label=r) for r in REGIONS]
    legend.append(Line2D([], [], marker="*", color="black", ls="", markersize=10, label="your targets (server.slo)"))
    fig.legend(handles=legend, loc="lower center", ncol=len(legend), fontsize=8, frameon=False,
               title="SD's goodput vs no SD's at the same concurrency (95% bootstrap interval of the difference)",
               title_fontsize=8)  # fmt: skip
    fig.tight_layout(rect=(0, min(0.3, 0.6 / fig.get_figheight()), 1, 1), h_pad=2.0)
    for ax, steps, squares_of in squares:  # one grid step per square, now that the axes have their size
        width_pt = ax.get_position().width * fig.get_figwidth() * 72
        squares_of.set_sizes([(1.04 * width_pt / steps) ** 2])  # a hair over a step: no seams between squares
    return save_png(fig, out_png, dpi=dpi)


# ----------------------------------------------------------------------------- the command
def _cmd_goodput_frontier(args: argparse.Namespace) -> int:
    from sdbench.analysis.latency import read_server_cells, read_server_requests

    if args.grid < 2:
        raise ValueError(f"--grid {args.grid}: at least 2 targets per axis")
    slos = json.loads(args.slo)
    labels = json.loads(args.labels) if args.labels else {}
    cells = read_server_cells(args.groups)
    found = arms(cells, read_server_requests(args.groups), args.seed)
    frontier = frontier_table(found, cells, slos, args.grid)
    loads = max_load_table(found, slos)
    write_parquet(frontier, args.output)
    write_parquet(loads, args.max_load)
    write_text(frontier_markdown(frontier, loads, labels, args.grid), args.markdown)
    plot_frontier(frontier, args.figure, labels)
    return 0
