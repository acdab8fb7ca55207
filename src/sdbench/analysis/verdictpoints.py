"""The verdict's rule on one point, and the server-mode points it judges.

:func:`verdict` (pays / break-even / loses / undecided / not judged on a 95% interval:
:func:`sdbench.analysis.intervals.judge`), :func:`point_flags` (why a point
is no clean measurement of its load) and :func:`server_points` (SD over no SD at the same
concurrency, with the interval the verdict judges and goodput under the latency targets). Apart
from the page (:mod:`sdbench.analysis.verdict`, which re-exports them) because the goodput frontier
and the offline-vs-served table read the same points, and the page reads those two.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from sdbench.analysis.endtoend import check_hardware
from sdbench.analysis.intervals import BREAK_EVEN, DEFAULT_MARGIN, LOSES, NOT_JUDGED, PAYS, judge

NO_INTERVAL = NOT_JUDGED  # a point without an interval (one replicate): not judged
NO_TARGETS = "no targets"  # goodput's verdict where the config set no latency target (server.slo)
OFFLINE, SERVER = "batch size", "concurrency"
BOOTSTRAP, ROUNDS = "95% bootstrap", "range over rounds"  # the ``interval`` of an offline / server point
STARTS_BOOTSTRAP = "95% bootstrap over server starts"  # a server point whose arms each ran several starts


def verdict(low: float | None, high: float | None, margin: float = DEFAULT_MARGIN) -> str:
    """Whether SD pays at one point, from the speedup's interval ``[low, high]``: ``margin`` is the
    config's ``verdict.equivalence_margin`` (:func:`sdbench.analysis.intervals.judge`)."""
    return judge(low, high, margin)


def point_flags(preempted: pd.Series, contaminated: pd.Series, mismatch: pd.Series) -> list[str]:
    """Why each point is no clean measurement of its load, comma-separated ("" when it is):
    ``preempted`` (requests waited for KV cache: part of the batch was not running),
    ``contaminated`` (the quiet guard saw other work during the timed part, either arm),
    ``hardware mismatch`` (its arms ran on different kinds of machine)."""
    names = ("preempted", "contaminated", "hardware mismatch")
    columns = [c.fillna(False).astype(bool).tolist() for c in (preempted, contaminated, mismatch)]
    return [", ".join(n for n, on in zip(names, row) if on) for row in zip(*columns)]


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    return frame[name] if name in frame else pd.Series(False, index=frame.index)


def judged_bounds(points: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """The bounds each point is judged on: its 95% interval. A server point with one start per arm
    has only its range over rounds, the spread of one process: no interval, not judged."""
    rounds = points["interval"] == ROUNDS
    return points["speedup_ci_low"].mask(rounds), points["speedup_ci_high"].mask(rounds)


def server_points(server: pd.DataFrame) -> pd.DataFrame:
    """SD over no SD at the same concurrency in server mode, with its range over rounds
    (``speedup_min``/``speedup_max``: SD's min over no SD's max, and max over min) and, where both
    arms ran several server starts, the 95% interval of the ratio of their tokens-per-second draws
    (starts, rounds, requests; joint start draws where ``pairing`` is ``paired``), judged on."""
    from sdbench.analysis.stats import ratio_interval

    keys = ["engine", "model", "dataset", "concurrency"]
    server = server.copy()
    if "hardware" not in server:  # tables from before the column
        server = server.assign(hardware="")
    nan = float("nan")
    for column, default in (("goodput_rps", nan), ("goodput_rps_boot", None), ("slo_ttft_ms", nan),
                            ("slo_tpot_ms", nan), ("slo_e2e_ms", nan), ("tokens_per_s_boot", None), ("starts", 1),
                            ("pairing", "unpaired")):  # fmt: skip
        if column not in server:
            server[column] = [default] * len(server)
    if "contaminated" not in server:
        server = server.assign(contaminated=False)
    base = server[server["sd_method"] == "none"][[*keys, "tokens_per_s", "tokens_per_s_min", "tokens_per_s_max",
                                                  "hardware", "goodput_rps", "goodput_rps_boot", "contaminated",
                                                  "tokens_per_s_boot", "starts"]]  # fmt: skip
    base = base.rename(columns=lambda c: c if c in keys else f"base_{c}")
    sd = server[server["sd_method"] != "none"].merge(base, on=keys, how="inner")
    # Each method's server is a job of its own (sdbench.servermode): its arms may have run apart.
    mismatch = check_hardware(sd, "base_hardware", independent=pd.Series(True, index=sd.index), load="concurrency")
    contaminated = _column(sd, "contaminated").fillna(False).astype(bool) | _column(sd, "base_contaminated").fillna(
        False).astype(bool)  # fmt: skip
    sized = lambda x: hasattr(x, "__len__") and len(x) > 0  # noqa: E731
    # One start per arm: rounds of one process, blind to the spread between processes; the range stays judged.
    several = (sd["starts"].fillna(1).astype(int) >= 2) & (sd["base_starts"].fillna(1).astype(int) >= 2)
    several &= pd.Series([sized(a) and sized(b) for a, b in zip(sd["tokens_per_s_boot"], sd["base_tokens_per_s_boot"])],
                         index=sd.index, dtype=bool)  # fmt: skip
    bounds = [ratio_interval(a, b) if on else (nan, nan)
              for a, b, on in zip(sd["tokens_per_s_boot"], sd["base_tokens_per_s_boot"], several)]  # fmt: skip
    return pd.DataFrame({
        "engine": sd["engine"], "model": sd["model"], "dataset": sd["dataset"], "method": sd["method"],
        "sd_method": sd["sd_method"], "num_speculative_tokens": sd.get("num_speculative_tokens"),
        "load_kind": SERVER, "load": sd["concurrency"].astype(int),
        "speedup": sd["tokens_per_s"] / sd["base_tokens_per_s"],
        "speedup_ci_low": [lo for lo, _ in bounds], "speedup_ci_high": [hi for _, hi in bounds],
        "speedup_min": sd["tokens_per_s_min"] / sd["base_tokens_per_s_max"],
        "speedup_max": sd["tokens_per_s_max"] / sd["base_tokens_per_s_min"],
        "interval": [STARTS_BOOTSTRAP if on else ROUNDS for on in several],
        "pairing": sd["pairing"].fillna("unpaired").replace("", "unpaired"),
        "mean_acceptance_length": sd["mean_acceptance_length"],
        "preempted": False,  # the server table does not count preemptions
        "flags": point_flags(pd.Series(False, index=sd.index), contaminated, mismatch),
        **goodput_points(sd),
    })  # fmt: skip


def goodput_points(sd: pd.DataFrame) -> dict[str, Any]:
    """Server points' goodput under the latency targets (sdbench.analysis.goodput): SD's and no SD's,
    their ratio with the interval of the ratio of their draws, the targets, and where the targets
    fall (``goodput_verdict``: :func:`sdbench.analysis.goodput.region` on the same draws; ``no
    targets`` where the config set none)."""
    from sdbench.analysis.goodput import ratio_interval, region

    sized = lambda x: hasattr(x, "__len__") and len(x) > 0  # noqa: E731
    bounds = [ratio_interval(a, b) if sized(a) and sized(b) else (float("nan"),) * 2
              for a, b in zip(sd["goodput_rps_boot"], sd["base_goodput_rps_boot"])]  # fmt: skip
    good, base = sd["goodput_rps"].astype(float), sd["base_goodput_rps"].astype(float)
    ratio = [g / b if b > 0 else (float("inf") if g > 0 else 1.0) for g, b in zip(good, base)]
    where = [str(region(a, b, g, bg)) if sized(a) and sized(b) else NO_TARGETS
             for a, b, g, bg in zip(sd["goodput_rps_boot"], sd["base_goodput_rps_boot"], good, base)]  # fmt: skip
    return {
        "goodput_rps": good, "baseline_goodput_rps": base,
        "goodput_ratio": [r if not (math.isnan(g) or math.isnan(b)) else float("nan") for r, g, b in zip(ratio, good, base)],
        "goodput_ratio_ci_low": [lo for lo, _ in bounds], "goodput_ratio_ci_high": [hi for _, hi in bounds],
        **{c: sd[c].astype(float) for c in ("slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms")},
        "goodput_verdict": where,
    }  # fmt: skip
