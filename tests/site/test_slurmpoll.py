"""support/slurmpoll.py: the SLURM executor's status checks kept at their first interval."""

from __future__ import annotations

import asyncio
import inspect
from types import SimpleNamespace

from support.slurmpoll import keep_first_interval


def fake_executor(first: int | None):
    """The plugin's shape: an async generator that yields the jobs still running and backs off."""

    class Executor:
        def __init__(self) -> None:
            self.workflow = SimpleNamespace(executor_settings=SimpleNamespace(init_seconds_before_status_checks=first))
            self.next_seconds_between_status_checks = 12

        async def check_active_jobs(self, active_jobs):
            for job in active_jobs:
                if job != "done":
                    yield job
            self.next_seconds_between_status_checks += 10

    return Executor


def checked(executor, jobs: list[str]) -> list[str]:
    async def run() -> list[str]:
        return [job async for job in executor.check_active_jobs(jobs)]

    return asyncio.run(run())


def test_every_wait_is_the_first_and_every_job_still_running_is_yielded() -> None:
    cls = fake_executor(2)
    keep_first_interval(cls)
    executor = cls()
    assert checked(executor, ["a", "done", "b"]) == ["a", "b"]
    assert executor.next_seconds_between_status_checks == 2


def test_a_first_wait_longer_than_the_backoff_leaves_it() -> None:
    cls = fake_executor(40)
    keep_first_interval(cls)
    executor = cls()
    checked(executor, ["a"])
    assert executor.next_seconds_between_status_checks == 22


def test_without_the_setting_the_plugins_backoff_stays() -> None:
    cls = fake_executor(None)
    keep_first_interval(cls)
    executor = cls()
    checked(executor, ["a"])
    assert executor.next_seconds_between_status_checks == 22


def test_the_installed_plugin_has_the_patched_shape() -> None:
    import snakemake_executor_plugin_slurm as slurm

    assert inspect.isasyncgenfunction(slurm.Executor.check_active_jobs)
    assert "init_seconds_before_status_checks" in {f for f in slurm.ExecutorSettings.__dataclass_fields__}


def test_main_patches_the_installed_executor_then_runs_snakemake(monkeypatch) -> None:
    import snakemake.cli
    import snakemake_executor_plugin_slurm as slurm

    from support import slurmpoll

    original = slurm.Executor.check_active_jobs
    monkeypatch.setattr(slurm.Executor, "check_active_jobs", original)  # restored after the test
    seen: list[list[str]] = []
    monkeypatch.setattr(snakemake.cli, "main", lambda argv: seen.append(argv) or 7)
    assert slurmpoll.main(["--version"]) == 7 and seen == [["--version"]]
    assert slurm.Executor.check_active_jobs is not original


def test_the_script_is_snakemakes_cli() -> None:
    import subprocess
    import sys

    import snakemake

    from support import slurmpoll

    done = subprocess.run([sys.executable, slurmpoll.__file__, "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == snakemake.__version__, done.stderr[-2000:]
