"""`sdbench bench timeline`: a run's wall time split into stages from Snakemake's log."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdbench.bench import timeline

LOG = """\
[Mon Nov 23 03:27:20 2026]
localrule build_tokenizer:
    output: results/models/tokenizer
    jobid: 6
[Mon Nov 23 03:27:40 2026]
Finished jobid: 6 (Rule: build_tokenizer)
[Mon Nov 23 03:27:40 2026]
rule build_model:
    jobid: 7
[Mon Nov 23 03:27:50 2026]
localrule simulate_published:
    jobid: 8
[Mon Nov 23 03:28:00 2026]
Finished jobid: 8 (Rule: simulate_published)
[Mon Nov 23 03:29:40 2026]
Finished jobid: 7 (Rule: build_model)
[Mon Nov 23 03:29:40 2026]
rule run_engine:
    jobid: 9
    wildcards: engine=e, model=m, method=ngram-k3, share=all
[Mon Nov 23 03:30:40 2026]
Finished jobid: 9 (Rule: run_engine)
"""


def test_stages_add_up_to_the_run_and_overlaps_go_to_the_earlier_stage(tmp_path: Path) -> None:
    log = tmp_path / "run.snakemake.log"
    log.write_text(LOG)
    jobs = timeline.read_jobs(log)
    assert jobs["rule"].tolist() == ["build_tokenizer", "build_model", "simulate_published", "run_engine"]
    assert jobs["seconds"].tolist() == [20.0, 120.0, 10.0, 60.0]
    assert jobs["wildcards"].tolist() == ["", "", "", "engine=e, model=m, method=ngram-k3, share=all"]
    split = timeline.split(jobs).set_index("stage")
    # simulate_published ran beside build_model: its 10 s count as training wall time.
    assert split.loc["training", "wall_s"] == 140.0 and split.loc["analyses", "wall_s"] == 0.0
    assert split.loc["engine cells", "wall_s"] == 60.0 and split["wall_s"].sum() == 200.0
    assert split.loc["analyses", "job_s"] == 10.0 and split.loc["training", "jobs"] == 2
    report = timeline.format_report(jobs, setup_s=100.0)
    assert "total               300 s wall (5.0 min)" in report


def test_a_file_without_jobs_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("Building DAG of jobs...\n")
    with pytest.raises(ValueError, match="no finished jobs found"):
        timeline.read_jobs(log)


def test_engine_jobs_split_into_startup_warmup_timed_and_the_rest(tmp_path: Path) -> None:
    """The run_engine job of LOG (60 s) from its two cells' tables: one SD engine and one paired
    no-SD engine started once (12 + 5 s), warm-ups 1 + 2 s each cell, timed calls of both arms."""
    import pandas as pd

    log = tmp_path / "run.snakemake.log"
    log.write_text(LOG)
    group = tmp_path / "results" / "engines" / "e" / "m" / "ngram-k3" / "all"
    for bs, trials, sd_s, base_s in ((1, 3, 10.0, 6.0), (8, 5, 8.0, 4.0)):
        cell = group / "ngram-k3" / "d" / f"bs{bs}"
        cell.mkdir(parents=True)
        pd.DataFrame([{"startup_s": 12.0, "paired_baseline_startup_s": 5.0, "warmup_s": 1.0,
                       "paired_baseline_warmup_s": 2.0, "generate_s": sd_s, "num_trials": trials}]).to_parquet(
            cell / "summary.parquet")  # fmt: skip
        pd.DataFrame({"duration_s": [base_s / 2, base_s / 2]}).to_parquet(cell / "baseline_calls.parquet")
    table = timeline.engine_breakdown(timeline.read_jobs(log), tmp_path / "results")
    row = table.iloc[0]
    assert row["group"] == "e/m/ngram-k3/all" and row["cells"] == 2 and row["median_trials"] == 4.0
    assert (row["startup_s"], row["warmup_s"], row["timed_s"]) == (17.0, 6.0, 28.0)
    assert row["other_s"] == 60.0 - 17.0 - 6.0 - 28.0
    text = timeline.format_engine_breakdown(table)
    assert "e/m/ngram-k3/all" in text and "total (1 jobs)" in text
