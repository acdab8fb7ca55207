"""The real pipeline through a real SLURM: ``snakemake --profile profiles/slurm-cpu``.

A single-node SLURM (tests/support/slurm_cluster.py) runs a reduced CPU config
(.test/config/slurm.yaml: tiny model, real vLLM on CPU) with the CI overrides of
.test/profiles/slurm-ci. Apptainer cannot be installed here: the container layer
goes through the test double tests/support/doubles/apptainer, which records each call and
runs the command on the host.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DOUBLES = REPO / "tests" / "support" / "doubles"
CONFIG = REPO / ".test" / "config" / "slurm.yaml"
SLURMPOLL = REPO / "tests" / "support" / "slurmpoll.py"

pytestmark = pytest.mark.slow


def snakemake_slurm(
    cluster, workdir: Path, *args: str, configfile: Path = CONFIG, timeout: float = 1500
) -> subprocess.CompletedProcess[str]:
    """Run the workflow through the cluster with the CPU-cluster profile and CI overrides."""
    env = {
        **cluster.env,
        "PATH": os.pathsep.join([str(DOUBLES), str(BIN), cluster.env.get("PATH", os.environ["PATH"])]),
        "SDBENCH_APPTAINER_CALLS": str(workdir / "apptainer_calls.jsonl"),
    }
    # Targets and options go first: --configfile takes several values and would
    # swallow a target written after it.
    # Snakemake's CLI with the SLURM executor's status checks not backing off (support/slurmpoll.py).
    cmd = [
        sys.executable, str(SLURMPOLL), *args, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
        "--profile", str(REPO / "profiles" / "slurm-cpu"),
        "--workflow-profile", str(REPO / ".test" / "profiles" / "slurm-ci"),
        "--configfile", str(configfile),
    ]
    try:
        return subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        # A hung run must say where it hung, and its killed Snakemake must not leave
        # a lock that fails the next test for an unrelated reason.
        subprocess.run([*cmd, "--unlock"], cwd=workdir, env=env, capture_output=True, timeout=120)
        raise AssertionError(f"snakemake timed out after {timeout} s\n{hang_report(cluster, workdir, exc)}") from None


def hang_report(cluster, workdir: Path, exc: subprocess.TimeoutExpired) -> str:
    """The queue, the node, the daemons' logs and the newest job logs at a timeout."""
    def text(b) -> str:
        return (b.decode(errors="replace") if isinstance(b, bytes) else b or "")[-3000:]

    queue = cluster.run("squeue", "-t", "all", "-o", "%i %j %T %M %R", check=False, timeout=15).stdout
    jobs = sorted((workdir / "logs").rglob("*.log"), key=lambda p: p.stat().st_mtime)[-3:]
    tails = "\n".join(f"--- {p.relative_to(workdir)} (tail) ---\n{p.read_text(errors='replace')[-2500:]}" for p in jobs)
    return (f"squeue:\n{queue}\nnode: {cluster.node_state()}\n{cluster.log_tails(15)}\n{tails}\n"
            f"--- snakemake stderr ---\n{text(exc.stderr)}\n--- stdout ---\n{text(exc.output)}")


@pytest.fixture(scope="module")
def slurm_run(slurm_cluster, tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("slurm-pipeline")
    start = time.perf_counter()
    result = snakemake_slurm(slurm_cluster, workdir)
    elapsed = time.perf_counter() - start
    print(f"\nSLURM pipeline run: {elapsed:.0f} s")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-6000:]
    return workdir, result


def submitted_job_ids(text: str) -> list[int]:
    return [int(m) for m in re.findall(r"submitted with SLURM jobid (\d+)", text)]


def test_jobs_went_through_sbatch(slurm_run) -> None:
    workdir, result = slurm_run
    log = result.stdout + result.stderr
    ids = submitted_job_ids(log)
    # Every job but the local rules (`all`, and `run_cell`, which copies a cell's
    # tables out of its engine group) is a SLURM job.
    assert len(ids) >= 7 and len(set(ids)) == len(ids), log[-3000:]
    slurm_logs = sorted((workdir / "logs" / "slurm").rglob("*.log"))
    assert {int(p.stem) for p in slurm_logs} == set(ids)
    # One engine job per method (none, ngram-k3); cells are copied out locally.
    run_logs = [p for p in slurm_logs if "rule_run_engine" in p.parts]
    assert len(run_logs) == 2


def test_outputs_are_complete(slurm_run) -> None:
    workdir, _ = slurm_run
    cells = pd.read_parquet(workdir / "results" / "tables" / "cells.parquet")
    assert sorted(cells["method"]) == ["ngram-k3", "none"]
    assert (cells["tokens_per_s"] > 0).all()
    for name in ("paper/fig01_end_to_end.png", "tables/memory.parquet", "tables/output_divergence.parquet"):
        assert (workdir / "results" / name).stat().st_size > 0, name
    assert not list(workdir.rglob("*.tmp")), "a temporary file was left behind"


def test_container_layer_was_used(slurm_run) -> None:
    """Every job ran under `apptainer exec` of its rule's image (the double recorded it)."""
    workdir, _ = slurm_run
    calls = [json.loads(line) for line in (workdir / "apptainer_calls.jsonl").read_text().splitlines()]
    images = {Path(c["image"]).name for c in calls if c.get("subcommand", "exec") == "exec"}
    assert {"sdbench-vllm-cpu-0.32.0.sif", "sdbench-analysis.sif"} <= images, images


def test_rerun_through_slurm_does_nothing(slurm_cluster, slurm_run) -> None:
    workdir, _ = slurm_run
    result = snakemake_slurm(slurm_cluster, workdir, "-n")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Nothing to be done" in result.stdout + result.stderr, result.stdout[-3000:]


def test_changed_cell_reruns_alone_through_slurm(slurm_cluster, slurm_run, tmp_path: Path) -> None:
    """A params change of the one n-gram cell reruns that cell and its downstream, via sbatch."""
    # In a copy of the run (mtimes and Snakemake's records kept): the module's run stays as it was
    # for the tests after this one, without a second rerun to restore it.
    workdir = tmp_path / "run"
    shutil.copytree(slurm_run[0], workdir, symlinks=True)
    config = yaml.safe_load(CONFIG.read_text())
    config["methods"]["ngram-k3"]["prompt_lookup_max"] = 6
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(config, sort_keys=False))
    untouched = workdir / "results/runs/vllm-cpu/tiny-target/code-edit/none/bs1/summary.parquet"
    before = untouched.stat().st_mtime_ns
    result = snakemake_slurm(slurm_cluster, workdir, configfile=changed)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    log = result.stdout + result.stderr
    ran = re.findall(r"^(?:local)?rule (\w+):", log, re.MULTILINE)
    assert ran.count("run_engine") == 1 and ran.count("run_cell") == 1, ran
    assert "build_model" not in ran and "prepare_dataset" not in ran, ran
    assert "/ngram-k3/bs1" in log
    assert submitted_job_ids(log), "the rerun did not go through sbatch"
    assert untouched.stat().st_mtime_ns == before


def test_busy_node_refuses_the_cell_under_the_cluster_profile(slurm_cluster, slurm_run) -> None:
    """quiet_guard=refuse (for exclusive nodes) in a SLURM job: a busy process on the job's cores fails the cell."""
    import signal

    workdir, _ = slurm_run
    cell = "results/runs/vllm-cpu/tiny-target/code-edit/none/bs1/summary.parquet"
    out = subprocess.run(
        ["bash", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, check=True,
    )
    busy = int(out.stdout.strip())
    try:
        # profiles/slurm-cpu flags (a shared node); refuse is for whole nodes, as here.
        profile = yaml.safe_load((REPO / "profiles" / "slurm-cpu" / "config.yaml").read_text())
        assert "quiet_guard=flag" in profile["config"]
        result = snakemake_slurm(
            slurm_cluster, workdir, cell, "--forcerun", "run_engine", "--config", "quiet_guard=refuse"
        )
    finally:
        os.kill(busy, signal.SIGKILL)
    assert result.returncode != 0
    log = (workdir / "logs/run_engine/vllm-cpu/tiny-target/none/all.log").read_text()
    assert "error: timed part ran on a busy machine" in log and f"{busy} " in log, (
        log[-2000:] + result.stdout[-3000:] + result.stderr[-3000:]
    )
    assert not (workdir / "results/engines/vllm-cpu/tiny-target/none/all").exists()
    restore = snakemake_slurm(slurm_cluster, workdir)
    assert restore.returncode == 0, restore.stderr[-3000:]
