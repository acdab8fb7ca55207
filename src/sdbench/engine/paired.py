"""Paired no-SD baseline: an SD cell's calls interleaved with the same calls on a no-SD engine.

On a shared CPU the same engine runs up to 30% faster or slower from one process to the
next (thread placement, memory layout), and a slow minute slows whatever runs in it. A
speedup taken between two separately started processes carries both. With
``run.paired_baseline`` an SD engine group's process also starts a no-SD engine with the
same engine arguments, and every timed call of an SD cell is timed next to the same call
on that baseline (the order alternates, so neither arm always runs second). The ratio of
the two arms then cancels what they shared; :func:`sdbench.analysis.stats.paired_bootstrap`
resamples both arms together for the interval.

The SD cell's tables gain ``baseline_calls`` (the baseline arm's calls, same schema as
``calls``) and the summary's ``paired_*`` columns. The no-SD cells of the grid are still
measured by their own engine group: they are the baseline's published throughput.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import pandas as pd

from sdbench.engine.runner import PAIRED_COLUMNS, CellRun, _trial_plan, cell_seed

log = logging.getLogger(__name__)

__all__ = ["PAIRED_COLUMNS", "baseline_spec", "is_paired", "measure_paired", "paired_columns"]


def is_paired(spec: dict[str, Any]) -> bool:
    """Whether a cell spec asks for a paired no-SD baseline (sdbench.grid.resolve_cell)."""
    return bool(spec.get("paired_baseline"))


def baseline_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec of a paired cell's no-SD arm: the same cell with the baseline method entry."""
    base = copy.deepcopy(spec)
    paired = base.pop("paired_baseline")
    base["cell"]["method"] = paired["key"]
    base["method"] = paired["method"]
    base["drafter"] = None
    return base


def paired_columns(calls: pd.DataFrame, baseline_calls: pd.DataFrame, seed: int) -> dict[str, float]:
    """Summary columns of a paired cell: the baseline arm's throughput, the speedup and its 95% interval."""
    from sdbench.analysis import stats

    if baseline_calls.empty:
        return {c: float("nan") for c in PAIRED_COLUMNS}
    base = stats.point_estimate(baseline_calls)
    low, high = stats.interval(stats.paired_bootstrap(calls, baseline_calls, seed))
    return {
        "paired_baseline_tokens_per_s": base,
        "paired_speedup": stats.point_estimate(calls) / base,
        "paired_speedup_ci_low": low,
        "paired_speedup_ci_high": high,
    }


def measure_paired(
    engine: Any,
    baseline_engine: Any,
    spec: dict[str, Any],
    prompts: pd.DataFrame,
    guard_mode: str = "flag",
) -> dict[str, pd.DataFrame]:
    """Measure an SD cell and its no-SD arm call by call; returns the cell's tables.

    Trials follow ``run.repeats`` / ``run.min_measured_s`` for both arms (the slower arm
    decides). One quiet-machine guard watches both arms; its verdict applies to both.
    """
    from sdbench.engine.quietguard import QuietGuard

    sd = CellRun(engine, spec, prompts)
    base = CellRun(baseline_engine, baseline_spec(spec), prompts)
    base.warm_up()
    sd.warm_up()
    min_trials, min_seconds, max_trials = _trial_plan(spec["run"])
    guard = QuietGuard(guard_mode)
    guard.start()
    log.info("paired timed part: %d to %d trial(s), at least %.1f s per arm", min_trials, max_trials, min_seconds)
    for trial in range(max_trials):
        for call_index in range(sd.num_calls):
            arms = (base, sd) if (trial + call_index) % 2 == 0 else (sd, base)
            for arm in arms:
                arm.time_call(trial, call_index)
        if trial + 1 >= min_trials and min(sd.timed_s, base.timed_s) >= min_seconds:
            break
    report = guard.stop()  # raises Contaminated in refuse mode
    requests, calls, summary, _ = sd.tables(report)
    _, baseline_calls, _, _ = base.tables(report)
    summary = summary.assign(**paired_columns(calls, baseline_calls, cell_seed(spec)))
    return {"requests": requests, "calls": calls, "baseline_calls": baseline_calls, "summary": summary}
