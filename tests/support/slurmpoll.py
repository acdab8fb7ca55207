"""``python tests/support/slurmpoll.py ARGS``: Snakemake's CLI with the SLURM executor's status
checks kept at its first interval, for the tests that run long jobs through the local SLURM.

snakemake-executor-plugin-slurm (2.8.0) waits 10 s longer after each status check that finds no job
ended, up to 180 s, with no setting for it: a 2-minute engine job is seen ending a minute late, and
``test_slurm_timeout`` spent 117 of its 359 s waiting so. Here every check but the first waits
``--slurm-init-seconds-before-status-checks`` (2 s in .test/profiles/slurm-ci), as after a check that
found a job ended. Nothing else changes: the same plugin submits with sbatch, reads squeue and
reports each job; only this (workflow) process is patched, not a job's Snakemake.
``tests/site/test_slurm_cluster.py`` and the rehearsal through SLURM run the plugin as it ships.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from typing import Any


def keep_first_interval(executor_class: type) -> None:
    """Patch ``executor_class.check_active_jobs`` to reset the next wait to the first one."""
    original = executor_class.check_active_jobs

    async def check_active_jobs(self: Any, active_jobs: list[Any]) -> AsyncIterator[Any]:
        async for job in original(self, active_jobs):
            yield job
        first = getattr(self.workflow.executor_settings, "init_seconds_before_status_checks", None)
        if first:
            self.next_seconds_between_status_checks = min(self.next_seconds_between_status_checks, first)

    executor_class.check_active_jobs = check_active_jobs


def main(argv: list[str]) -> int:
    """Snakemake's CLI on ``argv``, the installed SLURM executor patched first."""
    import snakemake_executor_plugin_slurm
    from snakemake.cli import main as snakemake

    keep_first_interval(snakemake_executor_plugin_slurm.Executor)
    return snakemake(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
