"""`sdbench bench engine-sharing`: the comparison without an engine (the engine runs in the README's measurement)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sdbench.bench import sharing
from sdbench.config import load_config
from sdbench.grid import EngineGroup, engine_groups

REPO = Path(__file__).resolve().parents[2]


def test_group_cells_are_the_workflows_group() -> None:
    config = load_config(REPO / "config" / "config.yaml")
    cells = sharing.group_cells(config, "vllm-cpu", "tiny-target", "ngram-k3")
    keys = [(s["cell"]["dataset"], s["cell"]["batch_size"]) for s in cells]
    group = engine_groups(config)[EngineGroup("vllm-cpu", "tiny-target", "ngram-k3", "all")]
    assert keys == [(c.dataset, c.batch_size) for c in group]
    assert {(d, b) for d in ("code-edit", "code-write") for b in (1, 4, 8)} <= set(keys)
    assert all(s["cell"]["method"] == "ngram-k3" for s in cells)
    with pytest.raises(ValueError, match="no engine group vllm-cpu/tiny-target/eagle"):
        sharing.group_cells(config, "vllm-cpu", "tiny-target", "eagle")


def _row(side: str, bs: int, tps: float, low: float, high: float) -> dict:
    return {
        "dataset": "code-edit", "batch_size": bs, "side": side, "round": 0, "tokens_per_s": tps,
        "tokens_per_s_ci_low": low, "tokens_per_s_ci_high": high, "contaminated": False,
    }  # fmt: skip


def test_compare_marks_overlapping_intervals() -> None:
    rows = [
        _row("shared", 1, 100.0, 98.0, 102.0),
        _row("fresh", 1, 101.0, 99.0, 103.0),  # overlaps
        _row("shared", 8, 400.0, 395.0, 405.0),
        _row("fresh", 8, 420.0, 410.0, 430.0),  # disjoint
    ]
    table = sharing.compare(pd.DataFrame(rows))
    assert table["agree"].tolist() == [True, False]
    assert table["fresh_over_shared"].round(3).tolist() == [1.01, 1.05]
    report = sharing.format_report(table, {"shared": [30.0], "fresh": [60.0]})
    assert "cells whose intervals overlap: 1/2" in report and "NO" in report
