"""``sdbench bench compare-runs``: two runs' speedups judged cell by cell."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from sdbench.bench.runcompare import compare, markdown, summary, verdict
from sdbench.io import write_parquet

SDBENCH = Path(sys.executable).with_name("sdbench")


def cells(rows: list[tuple[str, int, float, float, float, float]]) -> pd.DataFrame:
    """A cells table: (method, batch size, speedup, low, high, acceptance length) rows plus no-SD."""
    out = [
        {"engine": "e", "model": "m", "dataset": "d", "method": method, "batch_size": bs, "speedup": s,
         "speedup_ci_low": lo, "speedup_ci_high": hi, "mean_acceptance_length": acc}
        for method, bs, s, lo, hi, acc in rows
    ]
    out.append({"engine": "e", "model": "m", "dataset": "d", "method": "none", "batch_size": 1, "speedup": 1.0,
                "speedup_ci_low": float("nan"), "speedup_ci_high": float("nan"), "mean_acceptance_length": float("nan")})
    return pd.DataFrame(out)


def test_verdicts():
    assert verdict(1.05, 1.0, 1.1, 1.0, 1.1) == "inside"
    assert verdict(1.15, 1.0, 1.1, 1.08, 1.2) == "overlap"
    assert verdict(1.25, 1.0, 1.1, 1.2, 1.3) == "disjoint"
    assert verdict(0.95, 1.0, 1.1, 0.9, 0.99) == "disjoint"  # below A's interval


def test_compare_counts_verdicts_half_widths_and_acceptance():
    a = cells([("ngram", 1, 2.0, 1.9, 2.1, 3.0), ("ngram", 4, 1.0, 0.98, 1.02, 3.0), ("draft", 1, 0.8, 0.7, 0.9, 1.9)])
    b = cells([("ngram", 1, 2.05, 2.0, 2.1, 3.0), ("ngram", 4, 1.1, 1.05, 1.15, 3.0), ("draft", 1, 0.95, 0.85, 1.0, 2.1)])
    table = compare(a, b)
    assert list(table["method"]) == ["draft", "ngram", "ngram"]  # sorted, no-SD dropped
    assert list(table["verdict"]) == ["overlap", "inside", "disjoint"]
    s = summary(table)
    assert (s["cells"], s["inside"], s["overlap"], s["disjoint"]) == (3, 1, 1, 1)
    assert s["median_half_width_a"] == pytest.approx(0.05)  # 0.0625, 0.05, 0.02
    assert not s["agree"] and s["acceptance_differs"] == 1
    text = markdown(table, {"ngram": "n-gram"})
    assert "| n-gram | d | 2.00 [1.90, 2.10] / 2.05 [2.00, 2.10] | 1.00 [0.98, 1.02] / 1.10 [1.05, 1.15] ‼ |" in text
    assert "(differs in B)" in text


def test_runs_of_different_grids_are_refused():
    a = cells([("ngram", 1, 2.0, 1.9, 2.1, 3.0), ("ngram", 4, 1.0, 0.98, 1.02, 3.0)])
    b = cells([("ngram", 1, 2.0, 1.9, 2.1, 3.0)])
    with pytest.raises(ValueError, match="cell e/m/d/ngram/4 is only in run A"):
        compare(a, b)
    with pytest.raises(ValueError, match="missing columns speedup_ci_low"):
        compare(a.drop(columns="speedup_ci_low"), b)


def test_common_compares_the_cells_both_runs_measured():
    a = cells([("ngram", 1, 2.0, 1.9, 2.1, 3.0), ("ngram", 4, 1.0, 0.98, 1.02, 3.0)])
    b = cells([("ngram", 1, 2.0, 1.9, 2.1, 3.0), ("ngram.k8", 1, 1.5, 1.4, 1.6, 4.0)])
    table = compare(a, b, common=True)
    assert list(zip(table["method"], table["batch_size"])) == [("ngram", 1)]
    assert table.attrs["only"] == {"A": 1, "B": 1}
    with pytest.raises(ValueError, match="no SD cell in common"):
        compare(a, cells([("draft", 1, 1.0, 0.9, 1.1, 2.0)]), common=True)


def test_cli_prints_table_and_summary_and_checks(tmp_path):
    a = cells([("ngram", 1, 2.0, 1.9, 2.1, 3.0)])
    b = cells([("ngram", 1, 2.3, 2.2, 2.4, 3.0)])
    write_parquet(a, tmp_path / "a.parquet")
    write_parquet(b, tmp_path / "b.parquet")
    cmd = [str(SDBENCH), "bench", "compare-runs", "--runs", str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "disjoint: 1" in done.stdout and "agree (no disjoint cell): no" in done.stdout
    assert subprocess.run([*cmd, "--check"], capture_output=True).returncode == 1
