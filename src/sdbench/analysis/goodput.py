"""Goodput under latency targets in server mode: requests per second that meet every target.

Definitions follow vLLM's own serving benchmark, ``vllm bench serve --goodput`` (the wheel's
``vllm/benchmarks/serve.py``, ``calculate_metrics``, in vLLM 0.32.0 as installed here; its
per-request timing is ``vllm/benchmarks/lib/endpoint_request_func.py``):

- a request is *good* when it meets every configured target (``server.slo``: ``ttft_ms``,
  ``tpot_ms``, ``e2e_ms``; vLLM's ``ttft``, ``tpot``, ``e2el``), each as ``value <= target``; a
  request of one output token has TPOT 0 for this test, as vLLM counts it;
- goodput is good requests over the benchmark's duration (vLLM: ``good_completed / dur_s``).
  Here the duration is the timed rounds' wall time, first send to last answer, summed over rounds;
- TTFT, TPOT = (latency - TTFT) / (output tokens - 1), end-to-end latency as the client records
  them (:mod:`sdbench.engine.loadgen`); ITL as vLLM's: the gaps between consecutive streamed chunks
  of a request, pooled over requests. With SD a chunk carries all the tokens a step accepted, so an
  ITL is the wait between the chunks a user sees (one per engine step), not a time per token; TPOT
  is the time per token.

Goodput's 95% interval is a bootstrap over rounds, then requests within each drawn round
(:func:`goodput_draws`); an SD cell's goodput ratio over the no-SD cell at the same concurrency is
judged on the interval of the ratio of the two cells' draws (independent servers), with the
verdict's rule (:mod:`sdbench.analysis.verdict`). A draw where neither meets any target counts as
ratio 1 (the same goodput), one where only SD does as infinite; the interval's bounds are then
draws themselves (no interpolation across an infinite draw).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from sdbench.analysis.stats import CONFIDENCE, NUM_RESAMPLES

# server.slo key -> the request column it bounds (seconds in the table, ms in the config).
TARGETS = {"ttft_ms": "ttft_s", "tpot_ms": "tpot_s", "e2e_ms": "latency_s"}
from sdbench.engine.latencysummary import PERCENTILES, latency_percentiles  # noqa: F401 - a server cell's summary
# Where a target lies against no SD at the same concurrency (:func:`region`): the verdict's goodput
# squares and the frontier's regions (sdbench.analysis.goodputfrontier) use these words.
SD_BETTER, BASE_BETTER, UNDECIDED, NEITHER = "SD better", "no SD better", "undecided", "neither meets"
REGIONS = (SD_BETTER, BASE_BETTER, UNDECIDED, NEITHER)


def meets_targets(requests: pd.DataFrame, slo: dict[str, float]) -> np.ndarray:
    """Per request, whether it meets every target in ``slo`` (vLLM's test; single-token TPOT is 0)."""
    good = np.ones(len(requests), dtype=bool)
    for key, column in TARGETS.items():
        if slo.get(key) is None:
            continue
        values = requests[column].to_numpy(dtype=float)
        if column == "tpot_s":
            values = np.nan_to_num(values, nan=0.0)
        good &= values * 1000.0 <= float(slo[key])
    return good


def resample_weights(rounds: np.ndarray, walls: list[float], seed: int,
                     resamples: int = NUM_RESAMPLES) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The bootstrap of :func:`goodput_draws` as weights: per draw, how often each request was drawn
    (rounds with replacement, then each drawn round's requests with replacement) and the drawn
    rounds' summed wall time. One set of weights serves every target (``weights @ good / wall``), so
    the draws at two targets, and at the user's targets and a grid's, come from the same resamples."""
    rng = np.random.default_rng(seed)
    members = [np.flatnonzero(rounds == r) for r in range(len(walls))]
    weights = np.zeros((resamples, len(rounds)))
    wall = np.empty(resamples)
    for b in range(resamples):
        chosen = rng.integers(0, len(walls), size=len(walls))
        for r in chosen:
            picked = members[r][rng.integers(0, len(members[r]), size=len(members[r]))]
            weights[b] += np.bincount(picked, minlength=len(rounds))
        wall[b] = sum(walls[r] for r in chosen)
    return weights, wall


def goodput_draws(good: np.ndarray, rounds: np.ndarray, walls: list[float], seed: int,
                  resamples: int = NUM_RESAMPLES) -> np.ndarray:  # fmt: skip
    """Bootstrap draws of goodput (good requests / wall time): rounds with replacement, then each
    drawn round's requests with replacement (:func:`resample_weights`)."""
    weights, wall = resample_weights(rounds, walls, seed, resamples)
    return weights @ np.asarray(good, dtype=float) / wall


def region(sd_draws: Any, base_draws: Any, sd_goodput: Any, base_goodput: Any, confidence: float = CONFIDENCE) -> Any:
    """Where a target lies, from two cells' goodput draws paired by index (columns: targets):
    ``SD better`` where SD's goodput minus no SD's has its 95% interval above 0, ``no SD better``
    below 0, ``undecided`` where it contains 0, ``neither meets`` where no request of either arm
    meets the target (both goodputs 0: a target this hardware does not reach, never scored).

    The same rule as the verdict's on the ratio's interval (:func:`ratio_interval`): with the
    inverted CDF, the ratio's lower bound is above 1 exactly when fewer than 2.5% of the draws have
    SD's goodput at or below no SD's, which is when the difference's lower bound is above 0."""
    a, b = np.asarray(sd_draws, dtype=float), np.asarray(base_draws, dtype=float)
    n = min(len(a), len(b))
    tail = (1 - confidence) / 2
    low, high = np.quantile(a[:n] - b[:n], [tail, 1 - tail], axis=0, method="inverted_cdf")
    out = np.where(low > 0, SD_BETTER, np.where(high < 0, BASE_BETTER, UNDECIDED)).astype(object)
    neither = (np.asarray(sd_goodput, dtype=float) == 0) & (np.asarray(base_goodput, dtype=float) == 0)
    out = np.where(neither, NEITHER, out)
    return str(out) if out.ndim == 0 else out  # one target (draws of one column): its word


def goodput_columns(requests: pd.DataFrame, walls: list[float], slo: dict[str, float], seed: int) -> dict[str, Any]:
    """A server cell's goodput summary columns (docs/schema.md); NaN without targets."""
    from sdbench.analysis.stats import interval

    targets = {f"slo_{k}": float(slo[k]) if slo.get(k) is not None else math.nan for k in TARGETS}
    if all(math.isnan(v) for v in targets.values()):
        nan = math.nan
        return {**targets, "slo_attainment": nan, "goodput_rps": nan, "goodput_rps_ci_low": nan,
                "goodput_rps_ci_high": nan, "goodput_rps_min": nan, "goodput_rps_max": nan, "goodput_rps_boot": []}  # fmt: skip
    good = meets_targets(requests, slo)
    rounds = requests["round"].to_numpy()
    per_round = [good[rounds == r].sum() / w for r, w in enumerate(walls)]
    draws = goodput_draws(good, rounds, walls, seed)
    low, high = interval(draws)
    return {
        **targets,
        "slo_attainment": float(good.mean()),
        "goodput_rps": float(good.sum() / sum(walls)),
        "goodput_rps_ci_low": low,
        "goodput_rps_ci_high": high,
        "goodput_rps_min": float(min(per_round)),
        "goodput_rps_max": float(max(per_round)),
        "goodput_rps_boot": [float(x) for x in draws],
    }


def ratio_interval(numerator: Any, denominator: Any, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Interval of goodput SD / no SD from two cells' draws (paired by index; 0/0 is 1, x/0 infinite)."""
    a, b = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    n = min(len(a), len(b))
    if n == 0:
        return math.nan, math.nan
    a, b = a[:n], b[:n]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(b > 0, a / np.where(b > 0, b, 1.0), np.where(a > 0, np.inf, 1.0))
    tail = (1 - confidence) / 2
    low, high = np.quantile(ratio, [tail, 1 - tail], method="inverted_cdf")
    return float(low), float(high)


# ----------------------------------------------------------------------------- the server table
def draw_seed(cell: dict[str, Any], seed: int) -> int:
    """The seed of a server cell's goodput draws (the config seed and its keys): the server table's
    draws and the frontier's (sdbench.analysis.goodputfrontier) are the same resamples."""
    from sdbench.engine.summary import cell_seed

    return cell_seed({"seed": seed, "cell": cell})


def server_cell_requests(cells: pd.DataFrame, requests: pd.DataFrame) -> list[tuple[dict[str, Any], pd.DataFrame]]:
    """Each server cell's summary row with its timed requests, in the order the requests table holds
    them (the bootstrap draws requests by position within a round: one order, one set of draws)."""
    from sdbench.servermode import SERVER_CELL_KEYS

    keys = list(SERVER_CELL_KEYS)
    if len(cells) and "round_wall_s" not in cells:
        raise ValueError("server cell summaries lack round_wall_s: measured by an older serve-group, rerun it")
    by_cell = dict(iter(requests.groupby(keys, sort=False))) if len(requests) else {}
    out = []
    for cell in cells.to_dict("records"):
        key = tuple(cell[k] for k in keys)
        if key not in by_cell:
            raise ValueError(f"server cell {dict(zip(keys, key))}: no requests table")
        out.append((cell, by_cell[key]))
    return out


def add_goodput(cells: pd.DataFrame, requests: pd.DataFrame, slos: dict[str, dict[str, float]],
                seed: int) -> pd.DataFrame:  # fmt: skip
    """The server cells (one row each, ``round_wall_s`` per round) with their goodput columns under
    their dataset's targets (``slos``: dataset -> targets, sdbench.servermode.slo_for)."""
    from sdbench.servermode import SERVER_CELL_KEYS

    rows = [goodput_columns(reqs, list(cell["round_wall_s"]), slos.get(cell["dataset"], {}),
                            draw_seed({k: cell[k] for k in SERVER_CELL_KEYS}, seed))
            for cell, reqs in server_cell_requests(cells, requests)]  # fmt: skip
    return pd.concat([cells.reset_index(drop=True), pd.DataFrame(rows, index=range(len(cells)))], axis=1)


def _ms(v: float) -> str:
    """Milliseconds in at most three significant digits, whole from 100 ms up."""
    return "–" if v is None or math.isnan(v) else f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def goodput_markdown(table: pd.DataFrame) -> str:
    """Per server cell: the targets, goodput [95% interval] and the share of requests meeting them,
    and the P50 / P90 / P99 of TTFT, TPOT and ITL."""
    lines = [
        "Under the latency targets (`server.slo`; definitions as `vllm bench serve --goodput`): goodput = requests "
        "meeting every target per second of the timed rounds [95% bootstrap interval over rounds and requests]; "
        "ITL = the gaps between streamed chunks (with SD one chunk per step), TPOT = time per output token.",
        "",
        "| model | dataset | method | conc. | targets TTFT / TPOT / E2E ms | goodput req/s [95%] | met "
        "| TTFT p50 / p90 / p99 ms | TPOT p50 / p90 / p99 ms | ITL p50 / p90 / p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table.to_dict("records"):
        targets = " / ".join(_ms(r[f"slo_{k}"]) for k in TARGETS)
        if math.isnan(r["goodput_rps"]):
            good, met = "no targets", "–"
        else:
            good = f"{r['goodput_rps']:.3g} [{r['goodput_rps_ci_low']:.3g}, {r['goodput_rps_ci_high']:.3g}]"
            met = f"{r['slo_attainment']:.0%}"
        pcts = [" / ".join(_ms(r.get(f"{m}_p{p}_ms", math.nan)) for p in (50, 90, 99)) for m in ("ttft", "tpot", "itl")]
        lines.append(f"| {r['model']} | {r['dataset']} | {r['method']} | {r['concurrency']} | {targets} | {good} | {met} "
                     f"| {' | '.join(pcts)} |")  # fmt: skip
    return "\n".join(lines) + "\n"
