"""The paper's question, answered per model x method x dataset: does speculative decoding pay here?

One rule, used by every item that judges a speedup (this verdict and the temperature sweep,
:mod:`sdbench.analysis.temperature`): at one load point (a batch size offline, a number of
requests in flight in server mode) SD

- ``pays`` when the speedup's 95% interval lies entirely above 1;
- ``loses`` when it lies entirely below 1;
- ``break-even`` when the whole interval lies inside the equivalence margin around 1
  (``verdict.equivalence_margin``, set in the config before any data: SD and no SD are the same
  speed for a deployment decision);
- ``undecided`` when it contains 1 but reaches past the margin (the measurement cannot tell);
- ``not judged`` without an interval: a design of one replicate (one engine process per arm
  offline) has none (:mod:`sdbench.analysis.intervals`: the interval is a t interval over engine
  starts, the level that varies).

Per line (engine x model x dataset x method x kind of load) the verdict table adds

- ``largest_paying_load``: the largest measured load at which SD pays;
- ``break_even_load``: where the speedup crosses 1 going up in load, interpolated linearly in
  log2(load) between the last point above 1 and the next one at or below it; its interval comes
  from where the interval's bounds cross 1 (the lower bound first). ``>N`` when the speedup stays
  above 1 up to the largest load N measured, ``<n`` when it is below 1 already at the smallest;
- the mean accepted length (tokens per step) over the line's points.

and the recommendation names, per model x dataset x load, the method with the largest speedup
among those that pay ("no SD" where none does). Server mode judges the speedup over the rounds'
range (min..max of each arm: a range, not a 95% interval) with the same rule where an arm ran one
server start; where both arms ran several, on the 95% interval of the ratio of their tokens-per-second
draws, a bootstrap over starts, rounds and requests (:mod:`sdbench.analysis.goodput`, the goodput
ratio's draws). A point carries the bounds it was judged on under their own names:
``speedup_ci_low``/``speedup_ci_high`` (95% interval: offline, or server mode over starts) or
``speedup_min``/``speedup_max`` (range over rounds, server mode, the 95% pair then NaN); ``interval``
says which. ``pairing`` says how a ratio's two arms were drawn: ``paired`` (offline: the no-SD calls
timed in the same process; server mode: starts interleaved in one job and drawn jointly) or
``unpaired`` (independent draws).

Energy: each offline point carries its energy ratio (SD's joules per output token over no SD's,
:mod:`sdbench.analysis.energy`) and ``energy``, the same rule on that ratio's 95% interval
(``saves`` below 1, ``costs`` above 1, ``even`` containing 1, ``not measured`` without a meter);
``time_not_energy`` marks a point where SD pays in time but not in energy, and the Markdown names
each such point on a line of its own.

Goodput (server mode, :mod:`sdbench.analysis.goodput`): the user's latency targets (``server.slo``)
are one point of the goodput frontier (:mod:`sdbench.analysis.goodputfrontier`, ext17: over every
TTFT x TPOT target, where SD's goodput is higher than no SD's with 95% confidence), not the verdict
itself. Each server point carries SD's and no SD's goodput under the targets, their ratio with the
interval of the ratio of the two cells' bootstrap draws (``goodput_ratio``), the targets
(``slo_*_ms``) and ``goodput_verdict``: where the targets fall, ``SD better`` / ``no SD better`` /
``undecided`` (the verdict's rule on that interval), ``neither meets`` where no request of either
arm met them (targets this hardware does not reach: named, never scored), ``no targets`` without
``server.slo``. Where no SD's goodput is 0 the Markdown gives SD's in req/s and says so, never an
infinite ratio.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import pandas as pd

from sdbench.analysis.goodput import BASE_BETTER, SD_BETTER, UNDECIDED
from sdbench.analysis.intervals import DEFAULT_MARGIN, T_START, T_WELCH

# The rule on one point and the server points live apart (the frontier and offline-vs-served read them
# without the page that reads those two); re-exported here, where the verdict's readers look.
from sdbench.analysis.verdictpoints import (  # noqa: F401
    BOOTSTRAP,
    BREAK_EVEN,
    LOSES,
    NO_INTERVAL,
    NO_TARGETS,
    OFFLINE,
    PAYS,
    ROUNDS,
    SERVER,
    STARTS_BOOTSTRAP,
    _column,
    goodput_points,
    judged_bounds,
    point_flags,
    server_points,
    verdict,
)
from sdbench.columns import conform
from sdbench.io import write_parquet, write_text

# A point measured under a condition that makes it no measurement of the load it names: drawn and
# marked, never judged "pays" nor the base of a recommendation (:func:`point_flags`).
FLAGGED = "flagged"
# goodput's verdict where no request of either arm met every target (sdbench.analysis.goodput.NEITHER)
NEITHER = "neither meets"
RULE = (
    "SD pays at a load when the speedup's 95% interval (over engine starts) lies entirely above 1, loses "
    "when it lies entirely below 1, breaks even when it lies inside the equivalence margin around 1, and is "
    "undecided when it contains 1 but is wider; a design of one engine start per arm gives no interval "
    "and is not judged"
)
LINE = ["engine", "model", "dataset", "method", "load_kind"]
POINT_COLUMNS: tuple[str, ...] = (
    "engine", "model", "dataset", "method", "sd_method", "num_speculative_tokens", "load_kind", "load", "speedup",
    "speedup_ci_low", "speedup_ci_high", "speedup_min", "speedup_max", "interval", "mean_acceptance_length",
    "preempted", "flags", "verdict", "pairing",
    # Energy (offline; sdbench.analysis.energy) and goodput under the latency targets (server mode).
    "energy_ratio", "energy_ratio_ci_low", "energy_ratio_ci_high", "energy_meter", "energy_reason", "energy",
    "time_not_energy", "goodput_rps", "baseline_goodput_rps", "goodput_ratio", "goodput_ratio_ci_low",
    "goodput_ratio_ci_high",
    "slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms", "goodput_verdict",
)  # fmt: skip
# verdict.parquet: each point with its line's break-even loads.
LINE_RESULTS: tuple[str, ...] = ("largest_paying_load", "break_even_load", "break_even_low", "break_even_high")
COLUMNS: tuple[str, ...] = (*POINT_COLUMNS, *LINE_RESULTS)
PLURAL = {OFFLINE: "batch sizes", SERVER: "concurrencies"}
# A point's energy ratio (SD's joules per token over no SD's, sdbench.analysis.energy) and its meter.
ENERGY_POINT_COLUMNS = ("energy_ratio", "energy_ratio_ci_low", "energy_ratio_ci_high", "energy_meter", "energy_reason")



def crossing(loads: list[float], values: list[float]) -> str:
    """Where ``values`` (over increasing ``loads``) first fall to 1 or below after being above 1:
    log2-linear interpolation, ``>N`` / ``<n`` outside the measured range, ``""`` without data."""
    pts = [(x, y) for x, y in zip(loads, values) if y is not None and not math.isnan(y)]
    if not pts:
        return ""
    if pts[0][1] <= 1.0:
        return f"<{pts[0][0]:g}"
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if y0 > 1.0 >= y1:
            l0, l1 = math.log2(x0), math.log2(x1)
            at = l0 + (y0 - 1.0) / (y0 - y1) * (l1 - l0)
            return f"{2 ** at:.3g}"
    return f">{pts[-1][0]:g}"


def points_table(cells: pd.DataFrame, server: pd.DataFrame | None = None,
                 margin: float = DEFAULT_MARGIN) -> pd.DataFrame:  # fmt: skip
    """One row per SD point: offline cells (``cells.parquet``, sweep variants left out) and
    server cells (``server.parquet``) with the speedup, its interval and the verdict (``margin``:
    the config's ``verdict.equivalence_margin``)."""
    frames, nan = [], float("nan")
    sd = cells[(cells["speedup_design"].fillna("") != "") & cells["speedup"].notna()] if "speedup_design" in cells \
        else cells[cells["method"] != "none"]
    if "sweep" in sd:
        sd = sd[sd["sweep"].fillna("") == ""]
    frames.append(pd.DataFrame({
        "engine": sd["engine"], "model": sd["model"], "dataset": sd["dataset"], "method": sd["method"],
        "sd_method": sd.get("sd_method", sd["method"]), "num_speculative_tokens": sd.get("num_speculative_tokens"),
        "load_kind": OFFLINE, "load": sd["batch_size"].astype(int), "speedup": sd["speedup"],
        "speedup_ci_low": sd["speedup_ci_low"], "speedup_ci_high": sd["speedup_ci_high"],
        "speedup_min": float("nan"), "speedup_max": float("nan"),
        "interval": [T_START if d == "paired" else T_WELCH for d in sd.get("speedup_design", pd.Series("", sd.index))],
        "mean_acceptance_length": sd["mean_acceptance_length"],
        # Requests of the cell (or of its no-SD arm) waited for KV cache: the batch was not all running.
        "preempted": _column(sd, "preempted").fillna(False).astype(bool),
        "flags": point_flags(_column(sd, "preempted"), _column(sd, "contaminated"), _column(sd, "hardware_mismatch")),
        # A no-SD run in the same process (endtoend's paired design) or not.
        "pairing": sd["speedup_design"].map({"paired": "paired", "independent": "unpaired"}).fillna("")
        if "speedup_design" in sd else "",
        **{c: sd[c] if c in sd else nan for c in ENERGY_POINT_COLUMNS},
    }))  # fmt: skip
    if server is not None and len(server):
        frames.append(server_points(server))
    out = pd.concat(frames, ignore_index=True)
    out["verdict"] = [verdict(lo, hi, margin) for lo, hi in zip(*judged_bounds(out))]
    out.loc[out["flags"] != "", "verdict"] = FLAGGED
    out = judge_energy(out)
    for column in POINT_COLUMNS[POINT_COLUMNS.index("goodput_rps"):]:  # server points only
        if column not in out:
            out[column] = float("nan")
    out["goodput_verdict"] = out["goodput_verdict"].fillna("").astype(str)
    out.loc[(out["flags"] != "") & (out["goodput_verdict"] != ""), "goodput_verdict"] = FLAGGED
    return conform(out.sort_values([*LINE, "load"], kind="stable").reset_index(drop=True), POINT_COLUMNS, "verdict points")


def judge_energy(points: pd.DataFrame) -> pd.DataFrame:
    """``energy`` (saves / even / costs / not measured: the energy ratio's interval vs 1) and
    ``time_not_energy``: SD pays in time while its energy ratio's interval does not lie below 1."""
    from sdbench.analysis.energy import NOT_MEASURED, energy_word

    points = points.assign(energy_meter=points["energy_meter"].fillna(NOT_MEASURED),
                           energy_reason=points["energy_reason"].fillna("").astype(str))  # fmt: skip
    points["energy"] = [energy_word(lo, hi) for lo, hi in zip(points["energy_ratio_ci_low"],
                                                               points["energy_ratio_ci_high"])]  # fmt: skip
    points["time_not_energy"] = (points["verdict"] == PAYS) & points["energy"].isin(["even", "costs"])
    return points


def time_not_energy_lines(points: pd.DataFrame, labels: dict[str, str]) -> list[str]:
    """The verdict's energy section: one line per point where SD pays in time but not in energy."""
    from sdbench.analysis.energy import fmt_energy

    measured = points[points["energy"] != "not measured"]
    if measured.empty:
        # Why, as the meters said it (no NVML, RAPL root-only, ...): the remedy differs per reason.
        why = "; ".join(sorted(set(points["energy_reason"]) - {""})) or "no energy meter"
        return [f"Energy not measured on this run ({why}: `energy_meter` = not measured)."]
    cases = points[points["time_not_energy"]]
    if cases.empty:
        return [f"Wherever SD pays in time it also saves energy per token ({len(measured)} point(s) measured)."]
    out = []
    for r in cases.itertuples(index=False):
        what = "costs more energy per token" if r.energy == "costs" else "saves no energy per token measurably"
        out.append(f"- {r.model} / {r.dataset} ({r.engine}), {labels.get(r.method, r.method)} at {r.load_kind} "
                   f"{int(r.load)}: pays in time ({_fmt(r.speedup)}x) but {what} (energy ratio "
                   f"{fmt_energy(r.energy_ratio, r.energy_ratio_ci_low, r.energy_ratio_ci_high, '.2f')}, "
                   f"{r.energy_meter}).")  # fmt: skip
    return out



def _targets(point: pd.Series) -> str:
    """A point's targets as the section names them: ``TTFT 100 / TPOT 4 / E2E 612 ms`` (those set)."""
    parts = [f"{name} {point[c]:g}" for name, c in (("TTFT", "slo_ttft_ms"), ("TPOT", "slo_tpot_ms"),
                                                    ("E2E", "slo_e2e_ms")) if not math.isnan(point[c])]  # fmt: skip
    return " / ".join(parts) + " ms" if parts else "none"


def goodput_sections(points: pd.DataFrame, labels: dict[str, str]) -> list[str]:
    """The verdict on goodput in server mode: per model x dataset, where the user's targets fall on
    the goodput frontier, as a method x concurrency table of SD's goodput over no SD's [95% interval]
    and the side they fall on, with no SD's goodput beside it."""
    server = points[(points["load_kind"] == SERVER)] if "goodput_verdict" in points else points.iloc[:0]
    out: list[str] = []
    for (engine, model, dataset), sub in server.groupby(["engine", "model", "dataset"], sort=True):
        loads = sorted(sub["load"].unique())
        targets = sorted({_targets(p) for _, p in sub.iterrows()})
        out.append(f"## Goodput at your latency targets: {model} / {dataset} ({engine}), by {SERVER}\n")
        out.append(f"Your targets (`server.slo`: {', '.join(targets)}) are one point of the goodput frontier "
                   "(`ext17_goodput_frontier`: over every TTFT x TPOT target, where SD's goodput is higher than "
                   "no SD's with 95% confidence), not the verdict. Each square: SD's goodput (requests/s meeting "
                   "every target) over no SD's [95% interval of the ratio] and on which side your targets fall "
                   f"(`{SD_BETTER}`, `{BASE_BETTER}`, `{UNDECIDED}`); `{NEITHER}` where no request of either arm "
                   "met them (targets this hardware does not reach at that load: not scored). No SD's goodput in "
                   "req/s, and SD's own where no SD's is 0.\n")  # fmt: skip
        if (sub["goodput_verdict"] == NEITHER).all():
            out.append(f"No request of any arm met your targets at any {SERVER}: this hardware does not reach "
                       "them, and they say nothing about SD; the frontier shows the targets it reaches.\n")
        out.append("| method | " + " | ".join(f"{SERVER} {x}" for x in loads) + " |")
        out.append("|" + "---|" * (len(loads) + 1))
        base = sub.drop_duplicates("load").set_index("load")["baseline_goodput_rps"]
        out.append("| no SD (req/s) | " + " | ".join(_fmt(base.get(x), ".3g") for x in loads) + " |")
        for method, line in sub.groupby("method", sort=True):
            at = line.set_index("load")
            cells = [_goodput_cell(at.loc[x]) if x in at.index else "" for x in loads]
            out.append(f"| {labels.get(method, method)} | " + " | ".join(cells) + " |")
        out.append("")
    return out


def _goodput_cell(point: pd.Series) -> str:
    """One square of the goodput table: the ratio [interval] and the side the targets fall on; where
    no request without SD met every target (an infinite ratio says nothing a reader can use), SD's
    own goodput, saying that none met them without SD; where neither arm did, that, unscored."""
    if point["goodput_verdict"] == NEITHER:
        return "0 req/s, neither meets: not scored"
    if point["baseline_goodput_rps"] == 0:
        return f"{_fmt(point['goodput_rps'], '.3g')} req/s, none without SD: {point['goodput_verdict']}"
    pairing = (point.get("pairing") or "") if point["goodput_verdict"] != NO_TARGETS else ""
    return (f"{_fmt(point['goodput_ratio'])} [{_fmt(point['goodput_ratio_ci_low'])}, "
            f"{_fmt(point['goodput_ratio_ci_high'])}] {point['goodput_verdict']}" + (f", {pairing}" if pairing else ""))


def lines_table(points: pd.DataFrame) -> pd.DataFrame:
    """One row per line: verdict per load, the largest paying load, the break-even load and its interval."""
    rows = []
    for key, line in points.groupby(LINE, sort=True):
        line = line.sort_values("load")
        loads = line["load"].astype(float).tolist()
        low, high = judged_bounds(line)
        paying = line[line["verdict"] == PAYS]["load"]
        rows.append({
            **dict(zip(LINE, key)),
            "sd_method": line["sd_method"].iloc[0],
            "num_speculative_tokens": line["num_speculative_tokens"].iloc[0],
            "loads": " ".join(str(int(x)) for x in loads),
            "verdicts": "; ".join(f"{int(x)}: {v}" for x, v in zip(loads, line["verdict"])),
            "largest_paying_load": float(paying.max()) if len(paying) else float("nan"),
            "break_even_load": crossing(loads, line["speedup"].tolist()),
            # The lower bound reaches 1 first (a smaller load), the upper bound last.
            "break_even_low": crossing(loads, low.tolist()),
            "break_even_high": crossing(loads, high.tolist()),
            "max_speedup": float(line["speedup"].max()),
            "mean_acceptance_length": float(line["mean_acceptance_length"].mean()),
        })  # fmt: skip
    return pd.DataFrame(rows)


def recommendations(points: pd.DataFrame, labels: dict[str, str]) -> pd.DataFrame:
    """Per engine x model x dataset x kind of load x load: the fastest method that pays, or no SD."""
    rows = []
    for key, at in points.groupby(["engine", "model", "dataset", "load_kind", "load"], sort=True):
        paying = at[at["verdict"] == PAYS].sort_values(["speedup", "method"], ascending=[False, True])
        best = paying.iloc[0] if len(paying) else None
        rows.append({
            **dict(zip(["engine", "model", "dataset", "load_kind", "load"], key)),
            "use": labels.get(best["method"], best["method"]) if best is not None else "no SD",
            "speedup": float(best["speedup"]) if best is not None else float("nan"),
        })  # fmt: skip
    return pd.DataFrame(rows)


def advice(recs: pd.DataFrame) -> list[str]:
    """One sentence per engine x model x dataset x kind of load: which method to use where."""
    out = []
    for (engine, model, dataset, kind), sub in recs.groupby(["engine", "model", "dataset", "load_kind"], sort=True):
        runs: list[tuple[str, list[int], list[float]]] = []
        for r in sub.sort_values("load").itertuples(index=False):
            if runs and runs[-1][0] == r.use:
                runs[-1][1].append(int(r.load))
                runs[-1][2].append(r.speedup)
            else:
                runs.append((r.use, [int(r.load)], [r.speedup]))
        parts = []
        for use, loads, speedups in runs:
            where = f"{kind} {loads[0]}" if len(loads) == 1 else f"{PLURAL.get(kind, kind + 's')} {loads[0]}-{loads[-1]}"
            if use == "no SD":
                parts.append(f"{where}: run without SD (no method pays)")
            else:
                parts.append(f"{where}: {use} ({', '.join(f'{s:.2f}x' for s in speedups)})")
        out.append(f"{model} on {dataset} ({engine}): " + "; ".join(parts) + ".")
    return out


AA_CONTROL = "aa_control"  # the A/A control's sweep (sdbench.sweeps.AA_CONTROL)


def aa_points(cells: pd.DataFrame, margin: float = DEFAULT_MARGIN) -> pd.DataFrame:
    """The run's A/A cells (no SD timed as an SD arm against no SD, ``sweep`` aa_control), each judged
    by the verdict's rule: a correct interval holds 1 and is judged pays or loses in 5% of them."""
    aa = cells[cells["sweep"].fillna("") == AA_CONTROL] if "sweep" in cells else cells.iloc[:0]
    flags = point_flags(_column(aa, "preempted"), _column(aa, "contaminated"), _column(aa, "hardware_mismatch"))
    words = [FLAGGED if f else verdict(lo, hi, margin) for lo, hi, f in
             zip(aa["speedup_ci_low"], aa["speedup_ci_high"], flags)]  # fmt: skip
    return aa[["engine", "model", "dataset", "batch_size", "speedup", "speedup_ci_low", "speedup_ci_high"]].assign(
        flags=flags, verdict=words).reset_index(drop=True)


def aa_failed(aa: pd.DataFrame) -> bool:
    """Whether the A/A control judged more of its clean cells pays or loses than 95% allows."""
    from sdbench.analysis.intervals import false_verdicts_allowed

    clean = aa[aa["verdict"] != FLAGGED]
    return int(clean["verdict"].isin([PAYS, LOSES]).sum()) > false_verdicts_allowed(len(clean))


def aa_lines(aa: pd.DataFrame) -> list[str]:
    """The verdict page's A/A section: the false-verdict count against what 95% allows, each interval."""
    from sdbench.analysis.intervals import false_verdicts_allowed

    if aa.empty:
        return []
    clean = aa[aa["verdict"] != FLAGGED]
    false = int(clean["verdict"].isin([PAYS, LOSES]).sum())
    judged = int((clean["verdict"] != NO_INTERVAL).sum())
    head = (f"A/A: {false} of {len(clean)} judged pays or loses (no SD against no SD, measured as every SD arm is; "
            f"95% allows {false_verdicts_allowed(len(clean))}; {judged} had an interval"
            + (f", {len(aa) - len(clean)} flagged" if len(aa) > len(clean) else "") + ").")  # fmt: skip
    if aa_failed(aa):
        head += (" **The design is not judged on this machine**: its intervals do not hold their 95% here, so no "
                 "point below is judged pays, loses or break-even.")  # fmt: skip
    out = ["## A/A control\n", head, "", "| model / dataset (engine) | batch size | speedup [95% interval] | verdict |",
           "|---|---|---|---|"]  # fmt: skip
    out += [f"| {r.model} / {r.dataset} ({r.engine}) | {int(r.batch_size)} | {_fmt(r.speedup, '.3f')} "
            f"[{_fmt(r.speedup_ci_low, '.3f')}, {_fmt(r.speedup_ci_high, '.3f')}] | {r.verdict}"
            + (f" ({r.flags})" if r.flags else "") + " |" for r in aa.itertuples(index=False)]  # fmt: skip
    return [*out, ""]


def flagged_lines(points: pd.DataFrame, labels: dict[str, str]) -> list[str]:
    """A section naming every flagged point and why (nothing when none is)."""
    flagged = points[points["flags"] != ""]
    if flagged.empty:
        return []
    out = ["## Not judged\n", f"{len(flagged)} point(s) are drawn but neither judged nor advised from: their "
           "speedup is no clean measurement of the load they name.\n"]  # fmt: skip
    out += [f"- {labels.get(r.method, r.method)}, {r.model} / {r.dataset} ({r.engine}), {r.load_kind} {int(r.load)}: "
            f"{_fmt(r.speedup)}x, {r.flags}" for r in flagged.itertuples(index=False)]  # fmt: skip
    return [*out, ""]


def _fmt(x: Any, spec: str = ".2f") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def modes_section(modes: pd.DataFrame | None, labels: dict[str, str]) -> list[str]:
    """The page's paragraph on offline vs served speedups at the same load (:mod:`sdbench.analysis.modeparity`,
    ext18): which of the two answers to believe, and why they differ, measured."""
    from sdbench.analysis.modeparity import CLIENT, INTRO, LAYOUT, modes_rows

    if modes is None or modes.empty:
        return []
    client, layout = (int((modes["reason"] == r).sum()) for r in (CLIENT, LAYOUT))
    out = ["## Offline and served at the same load\n", INTRO + "\n"]
    if client:
        out.append(f"{client} point(s) differ by the client's streaming: there the served speedup is the client's, "
                   "not the engine's, and the offline one is the engine's answer.\n")  # fmt: skip
    if layout:
        out.append(f"{layout} point(s) differ by the server's layout: both answers are measured, each for its own "
                   "way of running the engine.\n")  # fmt: skip
    return [*out, *modes_rows(modes, labels), ""]


def frontier_section(frontier: pd.DataFrame | None, loads: pd.DataFrame | None, labels: dict[str, str]) -> list[str]:
    """The server verdict without a hand-picked target beside the goodput squares: ext17's frontier (the
    picture, and its regions in numbers) and max-load table with intervals
    (:func:`sdbench.analysis.goodputfrontier.frontier_markdown`)."""
    from sdbench.analysis.goodputfrontier import frontier_markdown

    if frontier is None or loads is None or (frontier.empty and loads.empty):
        return []
    text = frontier_markdown(frontier, loads, labels).split("\n", 1)[1]  # its own title left out
    text = text.replace("\n## ", "\n### ")
    return ["## Goodput without a hand-picked target (`ext17_goodput_frontier`)\n",
            "![goodput frontier: where SD's goodput is higher, per TTFT x TPOT target](ext17_goodput_frontier.png)\n",
            text.strip() + "\n"]  # fmt: skip


def verdict_markdown(points: pd.DataFrame, lines: pd.DataFrame, recs: pd.DataFrame, labels: dict[str, str],
                     modes: pd.DataFrame | None = None, frontier: pd.DataFrame | None = None,
                     max_loads: pd.DataFrame | None = None, aa: pd.DataFrame | None = None) -> str:  # fmt: skip
    """The verdict as Markdown: the advice in words, then one table per model x dataset x kind of load,
    the goodput squares at the user's targets beside the frontier and max-load table (``frontier``,
    ``max_loads``: ext17's tables), and, with ``modes`` (:func:`sdbench.analysis.modeparity.modes_table`),
    offline vs served."""
    out = ["# Does speculative decoding pay here?\n", f"Rule: {RULE}.\n"]
    out += aa_lines(aa if aa is not None else pd.DataFrame())
    out += ["## Which method to use where\n"]
    out += [f"- {sentence}" for sentence in advice(recs)]
    out += ["", "## Where SD pays in time but not in energy\n", *time_not_energy_lines(points, labels), ""]
    out += flagged_lines(points, labels)
    mark = {PAYS: "pays", BREAK_EVEN: "even", LOSES: "loses", UNDECIDED: "undecided", NO_INTERVAL: "not judged",
            FLAGGED: "flagged"}  # fmt: skip
    for (engine, model, dataset, kind), sub in points.groupby(["engine", "model", "dataset", "load_kind"], sort=True):
        loads = sorted(sub["load"].unique())
        interval = " or ".join(dict.fromkeys(sub["interval"]))
        out.append(f"## {model} / {dataset} ({engine}), by {kind}\n")
        out.append(f"Speedup over no SD [{interval}] and verdict; draws: `paired` (the no-SD arm ran in the same "
                   "process, or its server starts interleaved with SD's in one job and drawn jointly) or `unpaired` "
                   "(independent).\n")  # fmt: skip
        head = ["method", *(f"{kind} {x}" for x in loads), "pays up to", "break-even at [interval]", "accepted length",
                "draws"]  # fmt: skip
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        for method, line in sub.groupby("method", sort=True):
            # A point's bracket: its interval, or a one-start server point's range over rounds (shown, not judged).
            rounds = line["interval"] == ROUNDS
            low = line["speedup_min"].where(rounds, line["speedup_ci_low"])
            high = line["speedup_max"].where(rounds, line["speedup_ci_high"])
            by_load = {int(r.load): (r, lo, hi) for r, lo, hi in zip(line.itertuples(index=False), low, high)}
            info = lines[(lines["engine"] == engine) & (lines["model"] == model) & (lines["dataset"] == dataset)
                         & (lines["method"] == method) & (lines["load_kind"] == kind)].iloc[0]  # fmt: skip
            cells = []
            for x in loads:
                if int(x) not in by_load:
                    cells.append("")
                    continue
                r, lo, hi = by_load[int(x)]
                cells.append(f"{_fmt(r.speedup)} [{_fmt(lo)}, {_fmt(hi)}] {mark[r.verdict]}")
            upto = _fmt(info["largest_paying_load"], "g") if not math.isnan(info["largest_paying_load"]) else "never"
            lo, hi = info["break_even_low"], info["break_even_high"]
            out.append(f"| {labels.get(method, method)} | " + " | ".join(cells)
                       + f" | {upto} | {info['break_even_load']} [{lo}, {hi}] | {_fmt(info['mean_acceptance_length'])} "
                       + f"| {', '.join(p for p in dict.fromkeys(line['pairing'].fillna('')) if p) or '–'} |")
        out.append("")
    out += goodput_sections(points, labels)
    out += frontier_section(frontier, max_loads, labels)
    out += modes_section(modes, labels)
    return "\n".join(out) + "\n"


def plot_verdict(points: pd.DataFrame, out_png: str | Path, labels: dict[str, str]) -> pd.DataFrame:
    """A panel per model x dataset x kind of load: methods x loads, each square colored by verdict
    and labelled with its speedup; the accepted length beside each method. Returns the drawn
    table read back from the figure: a ``square`` per point (x its load and label its method as
    the ticks read, y the speedup written in it, color its verdict's, note the verdict it was
    given), a ``text`` per method (y τ as written)."""
    from matplotlib.patches import Patch, Rectangle

    from sdbench.plotting import drawn_table, method_styles, panel_axes, panel_grid, save_png

    colors = {PAYS: "#b7e4b0", BREAK_EVEN: "#e6e6e6", LOSES: "#f4b6b0", UNDECIDED: "#c9d7ee", NO_INTERVAL: "#ffffff",
              FLAGGED: "#fbe3a1"}  # fmt: skip
    panels = list(points.groupby(["engine", "model", "dataset", "load_kind"], sort=True))
    n_methods = max((p[1]["method"].nunique() for p in panels), default=1)
    n_loads = max((p[1]["load"].nunique() for p in panels), default=1)
    dpi = 110
    fig, axes = panel_grid(len(panels), 1.3 + 0.75 * n_loads + 1.1, 0.9 + 0.42 * n_methods, dpi)
    styles = method_styles(points)
    drawn = drawn_table(fig)
    for i, ((engine, model, dataset, kind), sub) in enumerate(panels):
        ax = panel_axes(axes, i)
        methods = sorted(sub["method"].unique())
        loads = sorted(sub["load"].unique())
        for y, method in enumerate(methods):
            line = sub[sub["method"] == method]
            for r in line.itertuples(index=False):
                x = loads.index(r.load)
                drawn.patch(ax, Rectangle((x - 0.5, y - 0.5), 1, 1, color=colors[r.verdict], ec="white"), mark="square",
                            series=method, note=r.verdict)  # fmt: skip
                ax.text(x, y, f"{r.speedup:.2f}x", ha="center", va="center", fontsize=7)
                if r.preempted:  # an orange frame: part of the batch waited for KV cache
                    drawn.patch(ax, Rectangle((x - 0.44, y - 0.44), 0.88, 0.88, fill=False, ec="darkorange", lw=1.5),
                                mark="preempted", series=method, note="requests preempted (KV cache full)")  # fmt: skip
            acc = line["mean_acceptance_length"].mean()
            drawn.text(ax, len(loads) - 0.35, y, f"τ={acc:.2f}", series=method, ha="left", va="center", fontsize=7)
        ax.set_xlim(-0.5, len(loads) + 0.6)
        ax.set_ylim(-0.5, len(methods) - 0.5)
        ax.set_xticks(range(len(loads)), [str(x) for x in loads], fontsize=7)
        ax.set_yticks(range(len(methods)), [labels.get(m, styles[m].label) for m in methods], fontsize=7)
        for tick, m in zip(ax.get_yticklabels(), methods):
            tick.set_color(styles[m].color)
        ax.set_xlabel(kind, fontsize=8)
        ax.set_title(f"{model} / {dataset}\n{engine}", fontsize=8)
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
        ax.tick_params(length=0)
    legend = [Patch(color=colors[v], label=v) for v in (PAYS, BREAK_EVEN, LOSES, UNDECIDED)]
    if (points["verdict"] == FLAGGED).any():
        legend.append(Patch(color=colors[FLAGGED], label="flagged: not judged (preempted, contaminated or hardware)"))
    if points["preempted"].any():
        legend.append(Patch(fill=False, ec="darkorange", lw=1.5, label="requests preempted (KV cache full)"))
    fig.legend(handles=legend, loc="lower center", ncol=len(legend), fontsize=8, frameon=False,
               title="verdict (speedup's interval vs 1); τ = mean accepted length", title_fontsize=8)
    fig.tight_layout(rect=(0, 0.12 if fig.get_figheight() < 4 else 0.06, 1, 1))
    return save_png(fig, out_png, dpi=dpi)


def _cmd_verdict(args: argparse.Namespace) -> int:
    import json

    from sdbench.io import read_parquet

    cells = read_parquet(args.cells, what="cells table")
    server = read_parquet(args.server, what="server table") if args.server else None
    labels = json.loads(args.labels) if args.labels else {}
    points = points_table(cells, server, args.equivalence_margin)
    if points.empty:
        raise ValueError(f"{args.cells}: no SD cell with a speedup to judge")
    aa = aa_points(cells, args.equivalence_margin)
    if aa_failed(aa):  # the control says the intervals do not hold here: judge nothing
        points.loc[points["verdict"] != FLAGGED, "verdict"] = NO_INTERVAL
    lines = lines_table(points)
    recs = recommendations(points, labels)
    table = points.merge(lines[[*LINE, *LINE_RESULTS]], on=LINE, how="left")
    write_parquet(conform(table, COLUMNS, "verdict"), args.output)
    modes = None
    if server is not None and len(server):
        from sdbench.analysis.modeparity import modes_table

        modes = modes_table(cells, server)
    frontier = read_parquet(args.frontier, what="goodput frontier") if getattr(args, "frontier", None) else None
    loads = read_parquet(args.max_load, what="goodput max-load table") if getattr(args, "max_load", None) else None
    write_text(verdict_markdown(points, lines, recs, labels, modes, frontier, loads, aa), args.markdown)
    plot_verdict(points, args.figure, labels)
    return 0

