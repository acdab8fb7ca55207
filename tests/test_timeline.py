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
