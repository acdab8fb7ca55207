"""``sdbench bench job-usage``: SLURM jobs' peak memory and time against their asks.

Fast: hand-written job records (the format tests/support/slurm_usage.py writes), no cluster.
tests/e2e/test_slurm_rehearsal.py checks the records of real jobs on the local SLURM.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from sdbench.bench.jobusage import (
    command_startup,
    parse_comment,
    parse_gpus,
    parse_memory_mb,
    parse_time_limit,
    read_usage,
)

MB = 1024  # kB per MB in the records


def record(job: str, *, state: str = "COMPLETED", comment: str = "rule_aggregate", mem: str = "8000M",
           limit: str = "1:00:00", start: str = "2026-11-27T10:00:00", end: str = "2026-11-27T10:00:30",
           peak_mb: float = 500.0, tres_job: str = "N/A", cpus: str = "1", processes: list | None = None) -> dict:
    return {
        "version": 1,
        "job_id": job,
        "squeue": {
            "JobID": job, "State": state, "Partition": "cpu", "TimeLimit": limit, "MinMemory": mem,
            "NumCPUs": cpus, "tres-per-job": tres_job, "tres-per-node": "N/A", "SubmitTime": "2026-11-27T09:59:58",
            "StartTime": start, "EndTime": end, "Name": "uuid", "Comment": comment, "WorkDir": "/run",
        },
        "usage": {
            "peak_rss_kb": int(peak_mb * MB), "sampled_rss_kb": int(peak_mb * MB * 0.9),
            "peak_process_kb": int(peak_mb * MB * 0.6), "peak_process": "python sdbench aggregate",
            "processes": 6, "samples": 60, "first_seen": 1.0, "last_seen": 30.0, "interval_s": 0.5,
            "process_list": processes or [],
        },
    }


def write(directory: Path, *records: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for r in records:
        (directory / f"{r['job_id']}.json").write_text(json.dumps(r))
    return directory


def test_slurm_fields_parse() -> None:
    assert parse_time_limit("2-00:00:00") == 2880
    assert parse_time_limit("1:30:00") == 90
    assert parse_time_limit("5:00") == 5
    assert parse_time_limit("1-02:03:30") == 24 * 60 + 2 * 60 + 3.5
    assert math.isnan(parse_time_limit("UNLIMITED"))
    assert parse_memory_mb("8000M") == 8000
    assert parse_memory_mb("250G") == 256_000
    assert parse_memory_mb("1T") == 1_048_576
    assert parse_memory_mb("512K") == 0.5
    assert parse_memory_mb("2000") == 2000
    assert math.isnan(parse_memory_mb("N/A"))
    assert parse_gpus("gres:gpu:h100:4", "N/A") == (4, "h100")
    assert parse_gpus("N/A", "gres/gpu:2") == (2, "")
    assert parse_gpus("gres:gpu", "N/A") == (1, "")
    assert parse_gpus("N/A", "N/A") == (0, "")
    assert parse_comment("rule_run_engine_wildcards_vllm-0.10.1.1_llama3.1-8b_none_all.gsm8k") == (
        "run_engine", "vllm-0.10.1.1_llama3.1-8b_none_all.gsm8k")
    assert parse_comment("rule_join_grid_cells") == ("join_grid_cells", "")
    assert parse_comment("wrap") == ("", "")


def test_the_start_up_before_the_rules_command() -> None:
    processes = [
        {"start": 104.0, "last_seen": 130.0, "cpu_s": 2.5, "argv": ["/v/bin/python", "-m", "snakemake"]},
        {"start": 100.0, "last_seen": 130.0, "cpu_s": 0.0, "argv": ["/bin/sh", "-c", "python -m snakemake"]},
        {"start": 100.2, "last_seen": 130.0, "cpu_s": 3.0, "argv": ["/v/bin/python", "-m", "snakemake"]},
        {"start": 108.5, "last_seen": 128.5, "cpu_s": 19.0, "argv": ["/v/bin/python", "/v/bin/sdbench", "aggregate"]},
        {"start": 109.0, "last_seen": 110.0, "cpu_s": 1.0, "argv": ["/v/bin/python", "/v/bin/sdbench", "other"]},
    ]
    assert command_startup(processes) == (8.5, 5.5, 20.0)
    assert all(math.isnan(v) for v in command_startup([p for p in processes if p["start"] < 105]))
    assert all(math.isnan(v) for v in command_startup([]))


def test_jobs_over_their_asks_and_failed_jobs(tmp_path: Path) -> None:
    usage = write(
        tmp_path / "usage",
        record("7", peak_mb=300, mem="1000M", comment="rule_fig01_end_to_end"),
        record("8", peak_mb=1200, mem="1000M", comment="rule_aggregate"),
        record("9", state="TIMEOUT", limit="10:00", start="2026-11-27T10:00:00", end="2026-11-27T10:10:30"),
        record("10", limit="10:00", start="2026-11-27T10:00:00", end="2026-11-27T10:10:01"),
        record("11", state="FAILED", comment="rule_run_engine_wildcards_e_m_none_all", mem="250G", cpus="64",
               tres_job="gres:gpu:h100:4", limit="2-00:00:00"),
    )
    table = read_usage(usage).set_index("job_id")
    assert list(table.index) == ["7", "8", "9", "10", "11"]  # numeric order
    assert table.loc["7", ["failed", "over_memory", "over_time"]].tolist() == [False, False, False]
    assert table.loc["7", "mem_share"] == pytest.approx(0.3)
    assert table.loc["7", "wall_s"] == 30 and table.loc["7", "time_share"] == pytest.approx(30 / 3600)
    assert table.loc["8", "over_memory"] and not table.loc["8", "failed"]
    assert table.loc["9", "over_time"] and table.loc["9", "failed"]
    assert table.loc["10", "over_time"] and not table.loc["10", "failed"]  # 601 s of a 600 s limit
    row = table.loc["11"]
    assert (row["rule"], row["wildcards"], row["gpus"], row["gpu_type"], row["cpus"]) == (
        "run_engine", "e_m_none_all", 4, "h100", 64)
    assert (row["mem_asked_mb"], row["time_limit_min"], row["failed"]) == (256_000, 2880, True)


def sdbench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sdbench.cli", *args], capture_output=True, text=True, timeout=120)


def test_the_report_and_its_exit_status(tmp_path: Path) -> None:
    # Twelve jobs, peaks 100..1200 MB and walls 12..1 s: the ten largest of each are listed.
    jobs = [record(str(i), peak_mb=100 * i, end=f"2026-11-27T10:00:{13 - i:02d}", comment=f"rule_r{i}")
            for i in range(1, 13)]
    clean = write(tmp_path / "clean", *jobs)
    out = sdbench("bench", "job-usage", "--usage-dir", str(clean), "--output", str(tmp_path / "t.parquet"),
                  "--markdown", str(tmp_path / "r.md"))
    assert out.returncode == 0, out.stderr
    assert "- jobs ended: 12 (COMPLETED 12)" in out.stdout
    assert "- failed: 0" in out.stdout and "- over their memory: 0" in out.stdout
    memory = out.stdout.split("## The 10 largest by peak memory")[1].split("## The 10 longest")[0]
    longest = out.stdout.split("## The 10 longest")[1].split("## Per rule")[0]
    assert "| r12 " in memory and "| r3 " in memory and "| r2 " not in memory and "| r1 " not in memory
    assert "| r1 " in longest and "| r10 " in longest and "| r11 " not in longest
    assert memory.index("| r12 ") < memory.index("| r11 ")  # largest first
    assert (tmp_path / "r.md").read_text() == out.stdout
    assert len(pd.read_parquet(tmp_path / "t.parquet")) == 12

    over = write(tmp_path / "over", *jobs[:2], record("99", peak_mb=9000, mem="8000M", comment="rule_big"))
    out = sdbench("bench", "job-usage", "--usage-dir", str(over))
    assert out.returncode == 1
    assert out.stderr.strip() == "error: 0 job(s) failed, 1 over their memory, 0 over their time (of 3)"
    problems = out.stdout.split("## Failed or over")[1].split("## The 10")[0]
    assert "| big " in problems and " 9,000 |" in problems and "| r1 " not in problems


def test_bad_usage_dirs_fail_in_one_line(tmp_path: Path) -> None:
    out = sdbench("bench", "job-usage", "--usage-dir", str(tmp_path / "nowhere"))
    assert out.returncode != 0 and out.stderr.strip().endswith("no such directory")
    (tmp_path / "empty").mkdir()
    out = sdbench("bench", "job-usage", "--usage-dir", str(tmp_path / "empty"))
    assert out.returncode != 0 and "no job records" in out.stderr
    bad = write(tmp_path / "bad", {**record("3"), "version": 7})
    out = sdbench("bench", "job-usage", "--usage-dir", str(bad))
    assert out.returncode != 0 and "3.json: not a job usage record" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
