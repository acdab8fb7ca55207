"""An engine job ends when the workflow that started it ends.

Snakemake runs a job as ``bash -c '...'``; if Snakemake is killed (``kill -9``, a
lost login session), that shell and the engine are re-parented to init and keep
running: on a GPU node they hold the device's memory and compute, and a restarted
workflow would time its next cell beside them. The workflow therefore exports its
process id (``SDBENCH_WORKFLOW_PID``, set in workflow/rules/common.smk) and an
engine job watches it: when that process is gone (or its pid was reused: the
start time differs), the job kills its own descendants and exits at once, before
writing any output. Under SLURM the job's own Snakemake (the job step) is the
workflow process, and ``scancel`` ends the whole job through SLURM's process
tracking.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

ENV_WORKFLOW_PID = "SDBENCH_WORKFLOW_PID"
POLL_SECONDS = 0.5
EXIT_CODE = 143  # as if terminated by SIGTERM

log = logging.getLogger(__name__)


def _start_time(pid: int) -> str | None:
    """Start time of a process in clock ticks since boot (None if it does not exist)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            raw = fh.read()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()[19]


def descendants(pid: int) -> list[int]:
    """All descendants of ``pid`` (children first found, deepest last)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as fh:
                raw = fh.read()
        except OSError:
            continue
        parents[int(entry)] = int(raw[raw.rfind(")") + 2 :].split()[1])
    found: list[int] = []
    frontier = [pid]
    while frontier:
        children = [p for p, pp in parents.items() if pp in frontier and p not in found]
        found.extend(children)
        frontier = children
    return found


def _end_job(reason: str) -> None:
    print(f"sdbench: {reason}: stopping this job and its engine", file=sys.stderr, flush=True)
    for child in reversed(descendants(os.getpid())):
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass
    os._exit(EXIT_CODE)


def watch_workflow(poll: float = POLL_SECONDS) -> threading.Thread | None:
    """Exit this process (and kill its children) once the workflow process is gone.

    A no-op outside a workflow (``SDBENCH_WORKFLOW_PID`` unset), so the CLI run by
    hand or by tests is unaffected.
    """
    raw = os.environ.get(ENV_WORKFLOW_PID)
    if not raw:
        return None
    pid = int(raw)
    started = _start_time(pid)
    if started is None:
        _end_job(f"workflow process {pid} is gone")

    def loop() -> None:
        stop = threading.Event()
        while not stop.wait(poll):
            if _start_time(pid) != started:
                _end_job(f"workflow process {pid} ended")

    thread = threading.Thread(target=loop, name="sdbench-lifeline", daemon=True)
    thread.start()
    return thread


def export_workflow_env(quiet_guard: str) -> None:
    """Called by the workflow (common.smk): its jobs inherit its pid and the guard mode."""
    from sdbench.engine.quietguard import ENV_MODE

    os.environ[ENV_WORKFLOW_PID] = str(os.getpid())
    os.environ[ENV_MODE] = quiet_guard
