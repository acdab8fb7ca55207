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
  them (:mod:`sdbench.engine.serving.loadgen`); ITL as vLLM's: the gaps between consecutive streamed chunks
  of a request, pooled over requests. With SD a chunk carries all the tokens a step accepted, so an
  ITL is the wait between the chunks a user sees (one per engine step), not a time per token; TPOT
  is the time per token.

Goodput's 95% interval is a hierarchical bootstrap (:func:`resample_weights`): server starts with
replacement, then rounds within each drawn start, then requests within each drawn round, because
engine processes differ by 20-35% (docs/measurement.md) and rounds of one process do not show it.
Tokens per second come from the same draws (``tokens_per_s_boot``), so one verdict square's
throughput and goodput intervals rest on the same resampled rounds. A table without server starts
(``round_start``, from before serve-group repeated them) is one start per arm: the draws are then the
rounds-only bootstrap's, draw for draw; ``resample="rounds"`` keeps that older method callable on any
table, for comparison. With few starts (3 per arm) the percentile interval is still somewhat too
narrow (a bootstrap of n clusters sees (n-1)/n of their variance); it is no longer blind to them.

An SD cell's ratio over the no-SD cell at the same concurrency is judged on the interval of the
ratio of the two cells' draws, paired by index. ``pairing`` says how they were drawn (:func:`pairings`):
``paired`` when both arms ran interleaved in one job (the same ``job_id``, and start s of one
adjacent in the job's sequence of starts to start s of the other): the start indices are then drawn
jointly (start s of SD with start s of no SD, one shared seed), so a slow period that hit both arms
cancels in the ratio; ``unpaired`` otherwise (separate jobs, or a table from before interleaving):
independent draws. Rounds and requests are always drawn per cell. A draw where neither meets any
target counts as ratio 1 (the same goodput), one where only SD does as infinite; the interval's
bounds are then draws themselves (no interpolation across an infinite draw).

Stream-off control rounds (``stream`` False in the requests table, sdbench.engine.serving.loadgen's plain
completions) are never part of timed throughput, goodput or latency: :func:`timed_requests` drops them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from sdbench.analysis.stats import CONFIDENCE, NUM_RESAMPLES

# server.slo key -> the request column it bounds (seconds in the table, ms in the config).
TARGETS = {"ttft_ms": "ttft_s", "tpot_ms": "tpot_s", "e2e_ms": "latency_s"}
from sdbench.engine.measure.latencysummary import PERCENTILES, latency_percentiles  # noqa: F401 - a server cell's summary
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


STARTS, ROUNDS_ONLY = "starts", "rounds"  # what the bootstrap resamples above requests (resample_weights)
RESAMPLE_MODES = (STARTS, ROUNDS_ONLY)
PAIRED, UNPAIRED = "paired", "unpaired"  # how an SD/no-SD ratio's draws were made (pairings)


def resample_weights(rounds: np.ndarray, walls: list[float], seed: int, resamples: int = NUM_RESAMPLES,
                     round_start: list[int] | None = None, start_seed: int | None = None,
                     resample: str = STARTS) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The bootstrap of :func:`goodput_draws` as weights: per draw, how often each request was drawn
    and the drawn rounds' summed wall time. ``rounds``: each request's round position (0 to
    len(walls) - 1, :func:`round_positions`); ``round_start``: each round's server start.

    ``resample="starts"``: starts with replacement (drawn from ``start_seed``'s generator: two arms
    given one seed and as many starts draw the same start indices, the joint draw of a paired ratio),
    then each drawn start's rounds with replacement, then each drawn round's requests. One start (or
    no ``round_start``) skips the first level, so the draws are ``"rounds"``'s: rounds with
    replacement over all rounds, then requests. One set of weights serves every target (``weights @
    good / wall``) and tokens per second (``weights @ tokens / wall``): the same resamples."""
    if resample not in RESAMPLE_MODES:
        raise ValueError(f"resample {resample!r}: one of {RESAMPLE_MODES}")
    if round_start is not None and len(round_start) != len(walls):
        raise ValueError(f"round_start has {len(round_start)} entries for {len(walls)} rounds (round_wall_s)")
    rng = np.random.default_rng(seed)
    members = [np.flatnonzero(rounds == r) for r in range(len(walls))]
    if resample == ROUNDS_ONLY or round_start is None or len(set(round_start)) < 2:
        groups = [np.arange(len(walls))]
    else:
        groups = [np.flatnonzero(np.asarray(round_start) == s) for s in sorted(set(round_start))]
    start_rng = np.random.default_rng([seed, 1] if start_seed is None else start_seed)
    weights = np.zeros((resamples, len(rounds)))
    wall = np.empty(resamples)
    walls_arr = np.asarray(walls, dtype=float)
    for b in range(resamples):
        starts = start_rng.integers(0, len(groups), size=len(groups)) if len(groups) > 1 else [0]
        chosen = np.concatenate([groups[s][rng.integers(0, len(groups[s]), size=len(groups[s]))] for s in starts])
        for r in chosen:
            picked = members[r][rng.integers(0, len(members[r]), size=len(members[r]))]
            weights[b] += np.bincount(picked, minlength=len(rounds))
        wall[b] = walls_arr[chosen].sum()
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


def round_positions(requests: pd.DataFrame, walls: list[float], where: str = "server cell") -> np.ndarray:
    """Each timed request's round as a position in ``walls`` (``round_wall_s``). Rounds numbered 0 to
    len(walls) - 1 are their own positions; other numbers (a stream-off control round between them,
    rounds numbered across starts) map in increasing order, one per wall."""
    values = requests["round"].to_numpy()
    distinct = np.unique(values)
    if len(distinct) and np.isin(distinct, np.arange(len(walls))).all():
        return values.astype(int)
    if len(distinct) != len(walls):
        raise ValueError(f"{where}: {len(distinct)} timed rounds in the requests table, {len(walls)} in round_wall_s")
    return np.searchsorted(distinct, values)


def energy_columns(cell: dict[str, Any], requests: int, good: int | None) -> dict[str, Any]:
    """A server cell's joules per timed request and per good request, from ``round_energy_j`` (one
    reading per timed round, NaN where unmetered); NaN with ``energy_reason`` saying why."""
    nan = math.nan
    readings = cell.get("round_energy_j")
    reason = cell.get("energy_reason")
    reason = reason if isinstance(reason, str) and reason else ""
    if readings is None or (isinstance(readings, float) and math.isnan(readings)):
        return {"energy_j": nan, "joules_per_request": nan, "joules_per_good_request": nan,
                "energy_reason": reason or "not recorded (a serve-group from before energy metering)"}  # fmt: skip
    values = np.asarray(readings, dtype=float)
    if not len(values) or np.isnan(values).all():
        return {"energy_j": nan, "joules_per_request": nan, "joules_per_good_request": nan,
                "energy_reason": reason or "not metered"}  # fmt: skip
    if np.isnan(values).any():  # a sum over some rounds is no cell's energy
        why = f"metered in {int((~np.isnan(values)).sum())} of {len(values)} rounds only"
        return {"energy_j": nan, "joules_per_request": nan, "joules_per_good_request": nan,
                "energy_reason": f"{reason}; {why}" if reason else why}  # fmt: skip
    total = float(values.sum())
    per_good, why = nan, reason
    if good is None:
        why = "; ".join(x for x in (reason, "no targets: no good requests to count") if x)
    elif good == 0:
        why = "; ".join(x for x in (reason, "no request met the targets") if x)
    else:
        per_good = total / good
    return {"energy_j": total, "joules_per_request": total / requests if requests else nan,
            "joules_per_good_request": per_good, "energy_reason": why}  # fmt: skip


def goodput_columns(requests: pd.DataFrame, walls: list[float], slo: dict[str, float], seed: int,
                    draws: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, Any]:  # fmt: skip
    """A server cell's goodput summary columns (docs/schema.md); NaN without targets. ``draws``: the
    cell's bootstrap weights and walls (:func:`resample_weights`), else rounds then requests."""
    from sdbench.analysis.stats import interval

    targets = {f"slo_{k}": float(slo[k]) if slo.get(k) is not None else math.nan for k in TARGETS}
    if all(math.isnan(v) for v in targets.values()):
        nan = math.nan
        return {**targets, "slo_attainment": nan, "goodput_rps": nan, "goodput_rps_ci_low": nan,
                "goodput_rps_ci_high": nan, "goodput_rps_min": nan, "goodput_rps_max": nan, "goodput_rps_boot": []}  # fmt: skip
    good = meets_targets(requests, slo)
    rounds = round_positions(requests, walls)
    per_round = [good[rounds == r].sum() / w for r, w in enumerate(walls)]
    weights, wall = draws if draws is not None else resample_weights(rounds, walls, seed)
    draws_ = weights @ good.astype(float) / wall
    low, high = interval(draws_)
    return {
        **targets,
        "slo_attainment": float(good.mean()),
        "goodput_rps": float(good.sum() / sum(walls)),
        "goodput_rps_ci_low": low,
        "goodput_rps_ci_high": high,
        "goodput_rps_min": float(min(per_round)),
        "goodput_rps_max": float(max(per_round)),
        "goodput_rps_boot": [float(x) for x in draws_],
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
    from sdbench.engine.measure.summary import cell_seed

    return cell_seed({"seed": seed, "cell": cell})


def timed_requests(requests: pd.DataFrame) -> pd.DataFrame:
    """The requests of timed streamed rounds: a stream-off control round's (``stream`` False) is no
    part of throughput, goodput or latency."""
    return requests[requests["stream"].ne(False)] if "stream" in requests else requests


def server_cell_requests(cells: pd.DataFrame, requests: pd.DataFrame) -> list[tuple[dict[str, Any], pd.DataFrame]]:
    """Each server cell's summary row with its timed requests (:func:`timed_requests`), in the order
    the requests table holds them (the bootstrap draws requests by position within a round: one
    order, one set of draws)."""
    from sdbench.servermode import SERVER_CELL_KEYS

    keys = list(SERVER_CELL_KEYS)
    if len(cells) and "round_wall_s" not in cells:
        raise ValueError("server cell summaries lack round_wall_s: measured by an older serve-group, rerun it")
    requests = timed_requests(requests)
    by_cell = dict(iter(requests.groupby(keys, sort=False))) if len(requests) else {}
    out = []
    for cell in cells.to_dict("records"):
        key = tuple(cell[k] for k in keys)
        if key not in by_cell:
            raise ValueError(f"server cell {dict(zip(keys, key))}: no requests table")
        out.append((cell, by_cell[key]))
    return out


def _listed(value: Any) -> list[Any] | None:
    """A list-valued summary column, None where the table has none (NaN in an older table)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return list(value)


def _true(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_)) and bool(value)  # NaN or None in an older table: False


def round_starts(cell: dict[str, Any]) -> list[int] | None:
    """Each timed round's server start (``round_start``); None for a table from before repeated
    starts (one start per arm)."""
    starts = _listed(cell.get("round_start"))
    if starts is None:
        return None
    walls = list(cell["round_wall_s"])
    if len(starts) != len(walls):
        raise ValueError(f"server cell {cell.get('method')} c{cell.get('concurrency')}: round_start has "
                         f"{len(starts)} entries, round_wall_s {len(walls)}")  # fmt: skip
    return [int(x) for x in starts]


def interleaved_with(sd: dict[str, Any], base: dict[str, Any]) -> bool:
    """Whether an SD arm's starts alternate with no SD's in one job: both ``interleaved``, the same
    ``job_id``, as many starts, and start s of each adjacent to start s of the other in the job's
    sequence (no start of either arm between them): then start s of both saw the same period."""
    if not (_true(sd.get("interleaved")) and _true(base.get("interleaved"))):
        return False
    job = sd.get("job_id")
    if not isinstance(job, str) or not job or job != base.get("job_id"):
        return False
    a, b = _listed(sd.get("start_sequence")), _listed(base.get("start_sequence"))
    if not a or not b or len(a) != len(b):
        return False
    blocks = [(min(x, y), max(x, y)) for x, y in zip(a, b)]
    return all(x != y for x, y in zip(a, b)) and all(hi < nxt for (_, hi), (nxt, _) in zip(blocks, blocks[1:]))


def pairings(cells: pd.DataFrame, seed: int) -> dict[tuple, tuple[str, int | None]]:
    """Per server cell (by its keys): how its ratio to no SD is drawn (``paired``, ``unpaired``; ""
    for a no-SD cell) and the seed of its start draws: one seed shared by a job's interleaved arms
    at one concurrency (the joint draw), None for a cell's own (independent) draws."""
    from sdbench.servermode import SERVER_CELL_KEYS

    records = cells.to_dict("records")
    key = lambda c: tuple(c[k] for k in SERVER_CELL_KEYS)  # noqa: E731
    level = lambda c: (c["engine"], c["model"], c["dataset"], c["concurrency"])  # noqa: E731
    base = {level(c): c for c in records if c["sd_method"] == "none"}
    out: dict[tuple, tuple[str, int | None]] = {}
    for c in records:
        if c["sd_method"] == "none":
            continue
        b = base.get(level(c))
        if b is not None and interleaved_with(c, b):
            shared = draw_seed({"job_id": c["job_id"], **dict(zip(("engine", "model", "dataset", "concurrency"),
                                                                  level(c)))}, seed)  # fmt: skip
            out[key(c)] = (PAIRED, shared)
            out[key(b)] = ("", shared)
        else:
            out[key(c)] = (UNPAIRED, None)
    for c in records:
        out.setdefault(key(c), ("", None))
    return out


Draws = tuple[dict[str, Any], pd.DataFrame, np.ndarray, np.ndarray, str]  # cell, requests, weights, walls, pairing


def server_draws(cells: pd.DataFrame, requests: pd.DataFrame, seed: int, resample: str = STARTS,
                 resamples: int = NUM_RESAMPLES) -> list[Draws]:  # fmt: skip
    """Each server cell with its timed requests, bootstrap weights and walls (:func:`resample_weights`:
    its own seed for rounds and requests, :func:`pairings`' seed for starts) and its ``pairing``.
    The server table (goodput, tokens/s) and the frontier draw from here: the same resamples."""
    from sdbench.servermode import SERVER_CELL_KEYS

    plan = pairings(cells, seed) if len(cells) else {}
    out = []
    for cell, reqs in server_cell_requests(cells, requests):
        key = {k: cell[k] for k in SERVER_CELL_KEYS}
        pairing, start_seed = plan[tuple(key.values())]
        if resample == ROUNDS_ONLY and pairing:  # no start is drawn: every draw is the cell's own
            pairing = UNPAIRED
        walls = list(cell["round_wall_s"])
        where = f"server cell {key}"
        weights, wall = resample_weights(round_positions(reqs, walls, where), walls, draw_seed(key, seed), resamples,
                                         round_starts(cell), start_seed, resample)  # fmt: skip
        out.append((cell, reqs, weights, wall, pairing))
    return out


def add_goodput(cells: pd.DataFrame, requests: pd.DataFrame, slos: dict[str, dict[str, float]],
                seed: int, resample: str = STARTS) -> pd.DataFrame:  # fmt: skip
    """The server cells (one row each, ``round_wall_s`` per round) with their goodput columns under
    their dataset's targets (``slos``: dataset -> targets, sdbench.servermode.slo_for), tokens per
    second's draws from the same resamples, ``starts``, ``pairing`` and joules per (good) request."""
    from sdbench.analysis.stats import interval

    rows = []
    for cell, reqs, weights, wall, pairing in server_draws(cells, requests, seed, resample):
        walls = list(cell["round_wall_s"])
        slo = slos.get(cell["dataset"], {})
        row = goodput_columns(reqs, walls, slo, 0, draws=(weights, wall))
        tokens = weights @ reqs["num_output_tokens"].to_numpy(dtype=float) / wall
        low, high = interval(tokens)
        starts = round_starts(cell)
        good = None if math.isnan(row["goodput_rps"]) else int(meets_targets(reqs, slo).sum())
        rows.append({**row, "tokens_per_s_ci_low": low, "tokens_per_s_ci_high": high,
                     "tokens_per_s_boot": [float(x) for x in tokens],
                     "starts": len(set(starts)) if starts is not None else 1, "pairing": pairing, "resample": resample,
                     **energy_columns(cell, len(reqs), good)})  # fmt: skip
    extra = pd.DataFrame(rows, index=range(len(cells)))
    base = cells.reset_index(drop=True).drop(columns=[c for c in extra if c in cells and c != "energy_reason"])
    base = base.drop(columns=["energy_reason"], errors="ignore")
    return pd.concat([base, extra], axis=1)


def _ms(v: float) -> str:
    """Milliseconds in at most three significant digits, whole from 100 ms up."""
    return "–" if v is None or math.isnan(v) else f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _joules(v: float | None) -> str:
    return "–" if v is None or v != v else f"{v:.3g}"


def goodput_markdown(table: pd.DataFrame) -> str:
    """Per server cell: the targets, goodput [95% interval] and the share of requests meeting them,
    and the P50 / P90 / P99 of TTFT, TPOT and ITL."""
    lines = [
        "Under the latency targets (`server.slo`; definitions as `vllm bench serve --goodput`): goodput = requests "
        "meeting every target per second of the timed rounds [95% bootstrap interval over rounds and requests]; "
        "ITL = the gaps between streamed chunks (with SD one chunk per step), TPOT = time per output token. "
        "J/good request: the timed rounds' metered energy over the requests meeting every target (– where not "
        "metered or none met them: `energy_reason`).",
        "",
        "| model | dataset | method | conc. | targets TTFT / TPOT / E2E ms | goodput req/s [95%] | met "
        "| TTFT p50 / p90 / p99 ms | TPOT p50 / p90 / p99 ms | ITL p50 / p90 / p99 ms | J/good request |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
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
                     f"| {' | '.join(pcts)} | {_joules(r.get('joules_per_good_request', math.nan))} |")  # fmt: skip
    return "\n".join(lines) + "\n"
