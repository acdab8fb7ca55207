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


# What a job's container sees of the host's environment: the profiles start containers with
# --cleanenv (a host's OMP_NUM_THREADS, PYTHONPATH or LD_LIBRARY_PATH must not reach a pinned
# image), and Apptainer passes APPTAINERENV_<NAME> into the container as <NAME> even then.
# Thread pools and compile caches are then set by the engine job itself
# (sdbench.engine.site.hardware.job_env), from its own allocation.
CONTAINER_ENV_ALLOW = (
    ENV_WORKFLOW_PID,
    "SDBENCH_QUIET_GUARD",
    # The job and its devices: the quiet guard judges the job (sdbench.engine.site.quietguard), the
    # engine sees the GPUs SLURM gave the job.
    "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_CPUS_ON_NODE", "SLURM_JOB_CPUS_PER_NODE", "SLURM_JOB_GPUS",
    "CUDA_VISIBLE_DEVICES",
    # Node-local scratch (compile caches go there) and the model / dataset caches. The hub token and
    # the site's proxies reach the download jobs only (sdbench.models.hub.download_env).
    "TMPDIR", "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
    "SDBENCH_DATA_DIR", "SOURCE_DATE_EPOCH",
    # Compile caches kept across jobs on a shared path (sdbench.engine.site.compilecache; bind it in).
    "SDBENCH_COMPILE_CACHE",
    # The job's cgroup, found on the host before its container starts (sdbench.engine.site.quietguard).
    "SDBENCH_JOB_CGROUP",
)  # fmt: skip
CONTAINER_ENV_PREFIX = "APPTAINERENV_"


def container_env(environ: dict[str, str] | None = None) -> dict[str, str | None]:
    """``APPTAINERENV_*`` for every allowed variable this process has; ``None`` (unset) for those it
    lacks, so that a value exported by an outer process (the workflow that submitted a SLURM
    job, whose environment the job inherits) does not stand in for the job's own."""
    environ = os.environ if environ is None else environ
    return {
        CONTAINER_ENV_PREFIX + name: environ.get(name) for name in CONTAINER_ENV_ALLOW
    }


def export_workflow_env(quiet_guard: str) -> None:
    """Called by the workflow (common.smk): its jobs inherit its pid, the guard mode, the SLURM
    job's cgroup and, for their containers, the allow-listed environment (:func:`container_env`)."""
    from sdbench.engine.site.quietguard import ENV_JOB_CGROUP, ENV_MODE, host_job_cgroup
    from sdbench.engine.release.versions import apply_env

    os.environ[ENV_WORKFLOW_PID] = str(os.getpid())
    os.environ[ENV_MODE] = quiet_guard
    # In a SLURM job (the job's own Snakemake, on the node, before any container starts): the
    # job's cgroup, which the container's fresh sysfs may hide.
    apply_env({ENV_JOB_CGROUP: host_job_cgroup()})
    apply_env(container_env())
