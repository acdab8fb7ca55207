"""``sdbench compare`` (alias ``bench compare-runs``): two runs judged cell by cell."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from sdbench.analysis.runcompare import compare, markdown, read_run, summary, verdict
from sdbench.io import write_parquet

SDBENCH = Path(sys.executable).with_name("sdbench")


def cells(rows: list[tuple[str, int, float, float, float, float]]) -> pd.DataFrame:
    """A cells table: (method, batch size, speedup, low, high, acceptance length) rows plus no-SD."""
    out = [
        {"engine": "e", "model": "m", "dataset": "d", "method": method, "batch_size": bs, "speedup": s,
         "speedup_ci_low": lo, "speedup_ci_high": hi, "mean_acceptance_length": acc,
         "tokens_per_s": 100 * s, "tokens_per_s_ci_low": 100 * lo, "tokens_per_s_ci_high": 100 * hi}
        for method, bs, s, lo, hi, acc in rows
    ]
    out.append({"engine": "e", "model": "m", "dataset": "d", "method": "none", "batch_size": 1, "speedup": 1.0,
                "speedup_ci_low": float("nan"), "speedup_ci_high": float("nan"), "mean_acceptance_length": float("nan"),
                "tokens_per_s": 100.0, "tokens_per_s_ci_low": 98.0, "tokens_per_s_ci_high": 102.0})
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
    assert list(table["method"]) == ["draft", "ngram", "ngram", "none"]  # sorted; no-SD: throughput only
    assert list(table["verdict"]) == ["overlap", "inside", "disjoint", ""]
    assert list(table["throughput_verdict"]) == ["overlap", "inside", "disjoint", "inside"]
    s = summary(table)
    assert (s["cells"], s["sd_cells"], s["inside"], s["overlap"], s["disjoint"]) == (4, 3, 1, 1, 1)
    assert s["median_half_width_a"] == pytest.approx(0.05)  # 0.0625, 0.05, 0.02
    assert not s["agree"] and s["acceptance_differs"] == 1 and s["regressed"] == 0
    text = markdown(table, {"ngram": "n-gram"})
    assert ("| e / m / d | n-gram | 4 | 1.00 [0.98, 1.02] / 1.10 [1.05, 1.15] ‼ | 100 [98, 102] / 110 [105, 115] ‼ "
            "| 3.00 / 3.00 | speed +10%, throughput +10% |") in text
    assert "| e / m / d | draft | 1 |" in text and "| acceptance |" in text


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
    assert list(zip(table["method"], table["batch_size"])) == [("ngram", 1), ("none", 1)]
    assert table.attrs["only"] == {"A": 1, "B": 1}
    other = cells([("draft", 1, 1.0, 0.9, 1.1, 2.0)]).assign(model="other")
    with pytest.raises(ValueError, match="no cell in common"):
        compare(a, other, common=True)


def test_cli_prints_table_and_summary_and_checks(tmp_path):
    a = cells([("ngram", 1, 2.0, 1.9, 2.1, 3.0)])
    b = cells([("ngram", 1, 2.3, 2.2, 2.4, 3.0)])
    write_parquet(a, tmp_path / "a.parquet")
    write_parquet(b, tmp_path / "b.parquet")
    cmd = [str(SDBENCH), "bench", "compare-runs", "--runs", str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "disjoint 1" in done.stdout and "agree (no disjoint speedup): no" in done.stdout
    assert subprocess.run([*cmd, "--check"], capture_output=True).returncode == 1


def _run_dir(tmp_path: Path, name: str, table: pd.DataFrame) -> Path:
    run = tmp_path / name / "results"
    write_parquet(table, run / "tables" / "cells.parquet")
    return run


def test_a_cell_lowered_by_20_percent_is_flagged_and_fails_the_gate(tmp_path):
    """`sdbench compare A B --threshold 0.1`: a copy of run A with one cell's throughput (and so its
    speedup) lowered by 20% regresses; the same run against itself does not."""
    a = cells([("ngram", 1, 2.0, 1.96, 2.04, 3.0), ("ngram", 4, 1.5, 1.47, 1.53, 3.0)])
    b = a.copy()
    hit = (b["method"] == "ngram") & (b["batch_size"] == 4)
    for col in ("speedup", "speedup_ci_low", "speedup_ci_high", "tokens_per_s", "tokens_per_s_ci_low",
                "tokens_per_s_ci_high"):
        b.loc[hit, col] *= 0.8
    ra, rb = _run_dir(tmp_path, "a", a), _run_dir(tmp_path, "b", b)
    same = subprocess.run([str(SDBENCH), "compare", str(ra), str(ra), "--threshold", "0.1"], capture_output=True,
                          text=True)  # fmt: skip
    assert same.returncode == 0 and "regressed (B lower by > 10% with disjoint intervals): 0" in same.stdout
    png = tmp_path / "compare.png"
    done = subprocess.run([str(SDBENCH), "compare", str(ra), str(rb), "--threshold", "0.1", "--figure", str(png)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "| e / m / d | ngram | 4 |" in done.stdout and "speed -20%, throughput -20%, ▼ regressed" in done.stdout
    assert "regressed (B lower by > 10% with disjoint intervals): 1" in done.stdout
    drawn = pd.read_csv(png.with_suffix(".csv"))  # what the figure drew: the regressed cell ringed on both panels
    assert drawn.loc[drawn["mark"] == "ring", "series"].tolist() == ["ngram", "ngram"]
    # Throughput alone lowered (the machine ran slower, the paired speedup held): only a throughput gate fails.
    c = a.copy()
    for col in ("tokens_per_s", "tokens_per_s_ci_low", "tokens_per_s_ci_high"):
        c[col] *= 0.8
    rc = _run_dir(tmp_path, "c", c)
    for gate, code in (("both", 1), ("throughput", 1), ("speedup", 0)):
        run = subprocess.run([str(SDBENCH), "compare", str(ra), str(rc), "--threshold", "0.1", "--gate", gate],
                             capture_output=True, text=True)  # fmt: skip
        assert run.returncode == code, (gate, run.stdout + run.stderr)
    assert "regressed (B's speedup lower by > 10% with disjoint intervals): 0" in run.stdout
    from PIL import Image

    width, height = Image.open(png).size
    assert width <= 3000 and width / height <= 4


def test_a_run_is_read_from_a_results_dir_a_checkout_or_a_bundle(tmp_path):
    import tarfile

    table = cells([("ngram", 1, 2.0, 1.9, 2.1, 3.0)])
    run = _run_dir(tmp_path, "checkout", table)
    assert len(read_run(run)) == 2 and len(read_run(run.parent)) == 2
    bundle = tmp_path / "bundle.tar.gz"
    with tarfile.open(bundle, "w:gz") as tar:
        tar.add(run / "tables" / "cells.parquet", arcname="sdbench-bundle/results/tables/cells.parquet")
    assert read_run(bundle).equals(read_run(run))
    with pytest.raises(ValueError, match="no cells table"):
        read_run(tmp_path)


def test_a_rehearsal_is_refused_in_one_line_unless_allowed(tmp_path, capsys):
    """A real run against its rehearsal (cells with measured = false): refused with exit code 2 and
    one line naming the run and its rehearsal cells; with --allow-rehearsal compared, and said so."""
    from sdbench.cli import main

    a = cells([("ngram", 1, 2.0, 1.9, 2.1, 3.0)])
    ra, rb = _run_dir(tmp_path, "a", a), _run_dir(tmp_path, "b", a.assign(measured=[False, True]))
    assert main(["compare", str(ra), str(rb)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {rb}: 1 of 2 cells is a rehearsal (measured = false), not a measurement; "
                   "pass --allow-rehearsal to compare anyway\n")  # fmt: skip
    assert main(["bench", "compare-runs", "--runs", str(rb), str(rb)]) == 2  # the alias too: both sides named
    assert capsys.readouterr().err.startswith(f"error: {rb}: 1 of 2 cells, {rb}: 1 of 2 cells are a rehearsal")

    md, table = tmp_path / "compare.md", tmp_path / "compare.parquet"
    code = main(["compare", str(ra), str(rb), "--allow-rehearsal", "--markdown", str(md), "--output", str(table)])
    assert code == 0
    said = f"A rehearsal, not measured: run {rb} has 1 of 2 cells with measured = false."
    assert capsys.readouterr().out.startswith(said)
    assert md.read_text().splitlines()[0].startswith("> **Rehearsal, not measured.**") and said in md.read_text()
    out = pd.read_parquet(table).set_index("method")
    assert out.loc["ngram", ["measured_a", "measured_b"]].tolist() == [True, False]
    assert not out["measured"].any()  # the comparison as a whole is not two measurements
