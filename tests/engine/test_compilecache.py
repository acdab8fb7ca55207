"""Compile caches kept across engine jobs (sdbench.engine.site.compilecache, sdbench.engine.site.hardware.engine_job)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from sdbench.engine.site import compilecache as cc
from sdbench.engine.site.hardware import ENV_JOB_SCRATCH, engine_job


def _compiled(scratch: Path, name: str = "kernel.bin", text: str = "x") -> None:
    (scratch / "inductor").mkdir(parents=True, exist_ok=True)
    (scratch / "inductor" / name).write_text(text)


def test_a_published_snapshot_is_what_the_next_job_starts_from(tmp_path: Path) -> None:
    shared, first, second = tmp_path / "shared", tmp_path / "job1", tmp_path / "job2"
    assert cc.restore(shared, "k", first) == "compile cache k: no complete snapshot, compiling from cold"
    _compiled(first)
    (first / "xet").mkdir()
    (first / "xet" / "chunk").write_text("a download, not compiled")
    line = cc.publish(shared, "k", first)
    assert line.startswith("compile cache k: published snapshot snap-") and line.endswith("(1 files)")
    current = shared / "k" / os.readlink(shared / "k" / "current")
    assert (current / "COMPLETE").is_file() and not (current / "xet").exists()
    assert cc.restore(shared, "k", second).startswith("compile cache k: started from snapshot snap-")
    assert (second / "inductor" / "kernel.bin").read_text() == "x"
    assert cc.restore(shared, "other", tmp_path / "job3").endswith("compiling from cold")  # another key


def test_a_half_written_or_unreadable_snapshot_is_discarded_not_fatal(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    half = shared / "k" / "snap-half"
    (half / "inductor").mkdir(parents=True)  # no COMPLETE: a publish that died
    os.symlink("snap-half", shared / "k" / "current")
    assert cc.restore(shared, "k", tmp_path / "a").endswith("no complete snapshot, compiling from cold")
    broken = shared / "k" / "snap-broken"
    broken.mkdir()
    (broken / "COMPLETE").write_text("{}")
    (broken / "inductor").write_text("a file where a directory belongs")
    (shared / "k" / "current").unlink()
    os.symlink("snap-broken", shared / "k" / "current")
    scratch = tmp_path / "b"
    line = cc.restore(shared, "k", scratch)
    assert "snapshot snap-broken unreadable" in line and line.endswith("discarded, compiling from cold")
    assert not (scratch / "inductor").exists()


def test_a_failed_job_marks_its_snapshot_bad_and_old_ones_are_pruned(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    for i in range(4):
        _compiled(tmp_path / f"job{i}", text=str(i))
        cc.publish(shared, "k", tmp_path / f"job{i}")
    assert len(list((shared / "k").glob("snap-*"))) == cc.KEEP
    assert cc.discard(shared, "k").startswith("compile cache k: snapshot snap-")
    assert cc.restore(shared, "k", tmp_path / "next").endswith("no complete snapshot, compiling from cold")
    assert cc.discard(shared, "k") == ""  # nothing current to discard


def test_keys_name_image_vllm_and_device_in_safe_characters() -> None:
    assert cc.cache_key("sdbench-vllm-0.11.1", "0.11.1", "NVIDIA H100 80GB HBM3 (81559 MiB)") == (
        "sdbench-vllm-0.11.1--vllm-0.11.1--NVIDIA_H100_80GB_HBM3_81559_MiB")
    assert cc.cache_key("host", "0.32.0", "cpu-AMD EPYC 7763") != cc.cache_key("host", "0.32.0", "cpu-Intel Xeon")


def test_an_isolated_engine_job_restores_and_publishes_around_its_command(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:  # fmt: skip
    """In a SLURM job with $SDBENCH_COMPILE_CACHE: the second job finds what the first compiled; a
    job that fails discards the snapshot it started from."""
    shared = tmp_path / "shared"
    monkeypatch.setenv("SLURM_JOB_ID", "17")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "node"))
    monkeypatch.setenv("SDBENCH_COMPILE_CACHE", str(shared))
    monkeypatch.delenv(ENV_JOB_SCRATCH, raising=False)
    (tmp_path / "node").mkdir()
    seen: list[bool] = []

    def job(rc: int):
        @engine_job
        def command(args: argparse.Namespace) -> int:
            scratch = Path(os.environ[ENV_JOB_SCRATCH])
            seen.append((scratch / "inductor" / "kernel.bin").is_file())
            _compiled(scratch)
            return rc

        return command(argparse.Namespace(threads=None))

    assert job(0) == 0 and job(1) == 1 and job(0) == 0
    # First job: cold; second: the first's snapshot (then marked bad: it failed); third: cold again.
    assert seen == [False, True, False]
    assert (shared / next((shared).iterdir()).name / "current").is_symlink()
    monkeypatch.delenv("SDBENCH_COMPILE_CACHE")
    assert job(0) == 0 and seen[-1] is False  # without the variable: every job from cold, nothing shared


def test_the_shared_path_reaches_a_job_in_its_container() -> None:
    """Containers start with --cleanenv: the variable must be on the allow-list the workflow passes."""
    from sdbench.lifeline import container_env

    assert container_env({"SDBENCH_COMPILE_CACHE": "/shared/c"})["APPTAINERENV_SDBENCH_COMPILE_CACHE"] == "/shared/c"
