"""An engine job ends when its workflow process dies, whatever the signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sdbench.lifeline import ENV_WORKFLOW_PID, descendants

# The "workflow": starts a job (as Snakemake does, through a shell) and sleeps.
WORKFLOW = """
import os, subprocess, sys, time
os.environ["{env}"] = str(os.getpid())
job = ("from sdbench.lifeline import watch_workflow; import subprocess, sys, time; "
       "watch_workflow(poll=0.1); "
       "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
       "open(sys.argv[1], 'w').write(f'{{child.pid}}'); time.sleep(300)")
subprocess.Popen(["bash", "-c", f"{{sys.executable}} -c \\"{{job}}\\" {{sys.argv[1]}}"])
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


def test_job_and_its_engine_end_when_the_workflow_is_killed(tmp_path: Path) -> None:
    marker = tmp_path / "engine.pid"
    workflow = subprocess.Popen(
        [sys.executable, "-c", WORKFLOW.format(env=ENV_WORKFLOW_PID), str(marker)], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() or not marker.read_text():
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.1)
        family = descendants(workflow.pid)
        engine = int(marker.read_text())
        assert engine in family
        os.kill(workflow.pid, signal.SIGKILL)
        workflow.wait()
        deadline = time.monotonic() + 10
        while any(alive(p) for p in family) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = [p for p in family if alive(p)]
        # The job's shell may linger as a zombie of init; no python process survives.
        assert not [p for p in survivors if "python" in open(f"/proc/{p}/cmdline").read()], survivors
    finally:
        os.killpg(workflow.pid, signal.SIGKILL) if alive(workflow.pid) else None


def test_no_workflow_means_no_watch(monkeypatch) -> None:
    from sdbench.lifeline import watch_workflow

    monkeypatch.delenv(ENV_WORKFLOW_PID, raising=False)
    assert watch_workflow() is None
