"""A real single-node SLURM: sbatch, scancel of a process tree, Snakemake's slurm executor.

Uses the session fixture ``slurm_cluster`` (tests/conftest.py → tests/support/slurm_cluster.py),
which installs the Debian packages when needed and always stops the daemons.
Run with ``-s`` to see the phase timings.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.slurm_cluster import pid_alive

pytestmark = pytest.mark.slow

VENV_BIN = Path(sys.executable).parent


def _phase(name: str, seconds: float) -> None:
    print(f"[slurm timing] {name}: {seconds:.1f} s")


def test_cluster_comes_up(slurm_cluster):
    for name in ("install", "prepare", "start"):
        _phase(name, slurm_cluster.timings.get(name, 0.0))
    assert slurm_cluster.node_state().rstrip("*") == "idle"
    sinfo = slurm_cluster.run("sinfo", "-h", "-o", "%P %a %D %c %m").stdout.split()
    assert sinfo[0].rstrip("*") == slurm_cluster.partition
    assert int(sinfo[3]) == slurm_cluster.cpus >= 1
    assert int(sinfo[4]) == slurm_cluster.memory_mb > 0
    assert slurm_cluster.env["SLURM_CONF"] == str(slurm_cluster.conf)
    assert str(slurm_cluster.conf).startswith(str(slurm_cluster.root))


def test_sbatch_wrap_job_completes(slurm_cluster, tmp_path):
    t0 = time.monotonic()
    job = slurm_cluster.sbatch(wrap='echo "job=$SLURM_JOB_ID on $(hostname -s)"', output=tmp_path / "out-%j.txt")
    assert slurm_cluster.wait_job(job, timeout=30) == "COMPLETED"
    out = tmp_path / f"out-{job}.txt"
    deadline = time.monotonic() + 5
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"job={job} on {slurm_cluster.nodename}" in out.read_text()
    _phase("sbatch --wrap job", time.monotonic() - t0)


def test_scancel_kills_process_tree(slurm_cluster, tmp_path):
    """scancel must end every process the job started (no cgroups here: proctrack/pgid)."""
    pids_file = tmp_path / "pids.txt"
    script = tmp_path / "tree.sh"
    py = sys.executable
    script.write_text(f"""#!/bin/bash
P={pids_file}
echo "batch $$" >> $P
sleep 300 & echo "bg_sleep $!" >> $P
# the issue's example: a shell with a sleep and a python (which has a child of its own)
bash -c 'echo "nested_bash $$" >> {pids_file}; sleep 300 & echo "nested_sleep $!" >> {pids_file}
{py} -c "
import os, subprocess, time
c = subprocess.Popen([\\"sleep\\", \\"300\\"])
open(\\"{pids_file}\\", \\"a\\").write(f\\"python {{os.getpid()}}\\npython_child {{c.pid}}\\n\\")
time.sleep(300)"; wait' &
# an orphan (double fork: its parent exits at once, so it is re-parented to PID 1)
( sleep 300 & echo "orphan_sleep $!" >> $P )
# an "engine" that ignores SIGTERM, so only the final SIGKILL ends it
bash -c 'trap "" TERM; sleep 300 & echo "ignterm_sleep $!" >> {pids_file}; wait' &
wait
""")
    expected = {"batch", "bg_sleep", "nested_bash", "nested_sleep", "python", "python_child",
                "orphan_sleep", "ignterm_sleep"}
    job = slurm_cluster.sbatch(script=script, output=tmp_path / "tree-%j.out")

    def recorded() -> dict[str, int]:
        if not pids_file.exists():
            return {}
        return {ln.split()[0]: int(ln.split()[1]) for ln in pids_file.read_text().splitlines() if len(ln.split()) == 2}

    deadline = time.monotonic() + 30
    while set(recorded()) != expected:
        assert time.monotonic() < deadline, f"job tree did not start: {recorded()} state={slurm_cluster.job_state(job)}"
        time.sleep(0.1)
    pids = recorded()
    assert all(pid_alive(p) for p in pids.values()), pids
    assert slurm_cluster.job_state(job) == "RUNNING"

    t0 = time.monotonic()
    slurm_cluster.scancel(job)
    while any(pid_alive(p) for p in pids.values()) and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    survivors = {name: pid for name, pid in pids.items() if pid_alive(pid)}
    _phase(f"scancel → process tree gone ({slurm_cluster.proctrack})", time.monotonic() - t0)
    for pid in survivors.values():  # do not leave them behind if the assertion fails
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"still alive 10 s after scancel with {slurm_cluster.proctrack}: {survivors}"
    assert slurm_cluster.wait_job(job, timeout=20) == "CANCELLED"


SNAKEFILE = """\
rule combine:
    input: expand("part_{i}.txt", i=[1, 2])
    output: "combined.txt"
    shell: "cat {input} > {output} && echo combine=$SLURM_JOB_ID >> {output}"

rule part:
    output: "part_{i}.txt"
    shell: "echo part{wildcards.i}=$SLURM_JOB_ID > {output}"
"""


def _kill_group(proc: subprocess.Popen) -> None:
    # SIGKILL: on SIGTERM snakemake only "exits after finishing currently running jobs"
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _snakemake(cluster, workdir: Path, timeout: float) -> subprocess.CompletedProcess:
    exe = VENV_BIN / "snakemake"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "snakemake"]
    cmd += [
        "--executor", "slurm", "--jobs", "2",
        "--slurm-status-command", "squeue",
        "--slurm-init-seconds-before-status-checks", "2",
        "--slurm-keep-successful-logs",
        "--default-resources", f"slurm_partition={cluster.partition}", "runtime=5", "mem_mb=500",
        "--latency-wait", "5",
    ]
    env = dict(cluster.env, PATH=f"{VENV_BIN}{os.pathsep}{cluster.env['PATH']}")
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # a misconfigured status command makes snakemake wait forever: kill it and report
        _kill_group(proc)
        out, _ = proc.communicate()
        pytest.fail(f"snakemake did not finish in {timeout} s:\n{out[-4000:]}\n{cluster.log_tails()}")
    except BaseException:  # Ctrl-C: never leave a snakemake polling a cluster that is about to stop
        _kill_group(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def test_snakemake_slurm_executor(slurm_cluster, tmp_path):
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    t0 = time.monotonic()
    run = _snakemake(slurm_cluster, tmp_path, timeout=120)
    _phase("snakemake run (3 jobs, 2 rules)", time.monotonic() - t0)
    assert run.returncode == 0, run.stdout[-4000:]

    submitted = set(re.findall(r"has been submitted with SLURM jobid (\d+)", run.stdout))
    assert len(submitted) == 3, run.stdout[-4000:]
    # each job ran inside its own SLURM allocation, and the ids match what snakemake logged
    combined = (tmp_path / "combined.txt").read_text()
    seen = set(re.findall(r"=(\d+)", combined))
    assert seen == submitted, (combined, submitted)
    assert {ln.split("=")[0] for ln in combined.split()} == {"part1", "part2", "combine"}
    logs = list((tmp_path / ".snakemake" / "slurm_logs").rglob("*.log"))
    assert {p.stem for p in logs} >= submitted, logs
    assert any(submitted & set(re.findall(r"\d+", p.read_text())) for p in (tmp_path / ".snakemake" / "log").glob("*.log"))

    t0 = time.monotonic()
    rerun = _snakemake(slurm_cluster, tmp_path, timeout=60)
    _phase("snakemake no-op rerun", time.monotonic() - t0)
    assert rerun.returncode == 0, rerun.stdout[-4000:]
    assert "Nothing to be done" in rerun.stdout
    assert "has been submitted" not in rerun.stdout
