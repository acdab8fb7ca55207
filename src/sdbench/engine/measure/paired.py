"""Paired no-SD baseline: an SD cell's calls interleaved with the same calls on a no-SD engine.

On a shared CPU the same engine runs up to 30% faster or slower from one process to the
next (thread placement, memory layout), and a slow minute slows whatever runs in it. A
speedup taken between two separately started processes carries both. With
``run.paired_baseline`` an SD engine group's process also starts a no-SD engine with the
same engine arguments, and every timed call of an SD cell is timed next to the same call
on that baseline (the order alternates, so neither arm always runs second). The ratio of
the two arms then cancels what they shared; :func:`sdbench.engine.measure.resampling.paired_bootstrap`
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

from sdbench.engine.measure.energy import paired_energy_columns
from sdbench.engine.measure.summary import PAIRED_COLUMNS, cell_seed
from sdbench.engine.measure.trials import CellRun, timed_part

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
    """Summary columns of a paired cell: the baseline arm's throughput, the speedup and its 95% interval
    (and the energy ratio with its interval)."""
    from sdbench.engine.measure import resampling as stats

    if baseline_calls.empty:
        return {c: float("nan") for c in PAIRED_COLUMNS}
    base = stats.point_estimate(baseline_calls)
    low, high = stats.interval(stats.paired_bootstrap(calls, baseline_calls, seed))
    return {
        "paired_baseline_tokens_per_s": base,
        "paired_speedup": stats.point_estimate(calls) / base,
        "paired_speedup_ci_low": low,
        "paired_speedup_ci_high": high,
        **paired_energy_columns(calls, baseline_calls, seed),  # the energy ratio, the same way
    }


def measure_paired(
    engine: Any,
    baseline_engine: Any,
    spec: dict[str, Any],
    prompts: pd.DataFrame,
    guard_mode: str = "flag",
    progress: Any = None,
) -> dict[str, pd.DataFrame]:
    """Measure an SD cell and its no-SD arm call by call; returns the cell's tables.

    Both arms time each call in turn (:func:`sdbench.engine.measure.trials.timed_part`); one
    quiet-machine guard watches both, and its verdict applies to both. A forced-acceptance
    cell's SD engine is forced from its warm-up to its last call (sdbench.engine.measure.forcing).
    With ``progress`` (sdbench.engine.measure.progress) both arms are saved together as calls finish
    and resume together: one partial checkpoint, on one hardware, holds the pair.
    """
    from sdbench.engine.measure.forcing import forced_acceptance, forced_length_of

    sd = CellRun(engine, spec, prompts)
    base = CellRun(baseline_engine, baseline_spec(spec), prompts)
    with forced_acceptance(engine.llm, forced_length_of(spec)):
        base.warm_up()
        sd.warm_up()
        report = timed_part([base, sd], spec["run"], guard_mode, progress)
    requests, calls, summary, _ = sd.tables(report)
    _, baseline_calls, _, _ = base.tables(report)
    summary = summary.assign(**paired_columns(calls, baseline_calls, cell_seed(spec)))
    if "num_preemptions" in baseline_calls:
        summary["paired_baseline_num_preemptions"] = int(baseline_calls["num_preemptions"].sum())
    summary["paired_baseline_startup_s"] = baseline_engine.startup_s
    summary["paired_baseline_warmup_s"] = base.warmup_s
    if not getattr(baseline_engine, "measured", True):  # a rehearsal: both arms ran on the modelled engines
        summary["modelled_s"] += base.warmup_s + base.timed_s
    return {"requests": requests, "calls": calls, "baseline_calls": baseline_calls, "summary": summary}
