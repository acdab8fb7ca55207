"""The summary row of a cell: throughput with its bootstrap interval, acceptance and output lengths,
computed from the cell's call and request rows.

Apart from the trial loop because a cell measured in several engine starts is summarised again
from the starts' rows, with no engine (:func:`sdbench.engine.groups.merge_engine_starts`).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

from sdbench.engine.measure.counters import SDCounters, acceptance_stats
from sdbench.engine.measure.energy import PAIRED_ENERGY_COLUMNS, energy_columns
from sdbench.provenance import frame_measured

# Summary columns of a cell timed in pairs with a no-SD engine (sdbench.engine.measure.paired).
PAIRED_COLUMNS = (
    "paired_baseline_tokens_per_s",
    "paired_speedup",
    "paired_speedup_ci_low",
    "paired_speedup_ci_high",
    *PAIRED_ENERGY_COLUMNS,
)


def cell_seed(spec: dict[str, Any]) -> int:
    """Seed of a cell's bootstrap: the config seed and the cell's keys (stable across runs)."""
    import hashlib

    key = json.dumps([spec["seed"], spec["cell"]], sort_keys=True).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "little")


def summarise(
    keys: dict[str, Any], spec: dict[str, Any], calls: pd.DataFrame, requests: pd.DataFrame
) -> pd.DataFrame:
    """One summary row: throughput (paper style and pooled), acceptance, lengths."""
    total = SDCounters(
        int(calls["num_drafts"].sum()),
        int(calls["num_draft_tokens"].sum()),
        int(calls["num_accepted_tokens"].sum()),
        tuple(int(x) for x in _sum_lists(calls["accepted_per_pos"])),
    )
    acc = acceptance_stats(total)
    from sdbench.engine.measure import resampling as stats

    draws = stats.bootstrap(calls, cell_seed(spec))
    low, high = stats.interval(draws)
    row = {
        **keys,
        "sd_method": spec["method"]["method"],
        "num_speculative_tokens": spec["method"].get("num_speculative_tokens", 0),
        # Set on forced-acceptance cells (sdbench.sweeps): their outputs are not the greedy ones.
        "forced_acceptance_length": float(spec["method"].get("forced_acceptance_length", math.nan)),
        "batch_mode": spec["run"].get("batch_mode", "replicate"),
        "temperature": float(spec.get("dataset", {}).get("temperature", 0.0)),
        "num_engine_starts": int(calls["engine_start"].nunique()) if "engine_start" in calls else 1,
        "num_trials": len(calls[[c for c in ("engine_start", "trial") if c in calls]].drop_duplicates())
        if "trial" in calls
        else 1,
        "num_calls": len(calls),
        "num_sequences": len(requests),
        # Paper's metric (mean over calls of output tokens / wall time of the call),
        # with each prompt's median over trials; 95% bootstrap interval (sdbench.engine.measure.resampling).
        "tokens_per_s": stats.point_estimate(calls),
        "tokens_per_s_ci_low": low,
        "tokens_per_s_ci_high": high,
        "tokens_per_s_boot": [float(x) for x in draws],
        "tokens_per_s_mean_calls": float(calls["tokens_per_s"].mean()),
        "tokens_per_s_pooled": float(calls["num_output_tokens"].sum() / calls["duration_s"].sum()),
        "generate_s": float(calls["duration_s"].sum()),
        "output_len_mean": float(requests["num_output_tokens"].mean()),
        "output_len_std": float(requests["num_output_tokens"].std(ddof=0)),
        "share_finished_stop": float((requests["finish_reason"] == "stop").mean()),
        "num_drafts": total.num_drafts,
        "num_draft_tokens": total.num_draft_tokens,
        "num_accepted_tokens": total.num_accepted_tokens,
        # Timed calls during which the scheduler preempted requests (the KV cache was full).
        "num_preemptions": int(calls["num_preemptions"].sum()) if "num_preemptions" in calls else 0,
        **acc,
        # Joules per output token [95% interval] and the meter ("not measured": NaN; sdbench.engine.measure.energy).
        **energy_columns(calls, cell_seed(spec)),
        # False for a rehearsal (a stand-in engine, spec engine_mode; or rows it wrote): never a measurement.
        "measured": spec.get("engine_mode", "measured") != "rehearsal"
        and frame_measured(calls)
        and frame_measured(requests),
    }
    return pd.DataFrame([row])


def _sum_lists(series: pd.Series) -> np.ndarray:
    width = max((len(x) for x in series), default=0)
    total = np.zeros(width, dtype=np.int64)
    for values in series:
        total[: len(values)] += np.asarray(values, dtype=np.int64)
    return total
