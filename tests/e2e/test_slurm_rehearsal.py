"""The paper grid rehearsed through a local SLURM shaped like the paper profile's GPU nodes.

Fast: the rehearsal's overlay profile keeps every request of profiles/slurm; the GPU node the
harness declares fits every engine job of config/paper.yaml; the CI slice
(.test/config/rehearsal-slice.yaml) draws every item the paper grid draws.

Slow (a real single-node SLURM, tests/support/slurm_cluster.py with ``paper_node_shape``): the node
takes the paper's largest asks and refuses what its partitions do not allow; the usage watcher
(tests/support/slurm_usage.py) and ``sdbench bench job-usage`` see real jobs over their memory or
failed; and the CI slice of the paper grid runs through ``scripts/rehearse-paper-grid.sh`` with
engine jobs in rehearsal mode, every job within its asks.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import REPO, live_cluster
from support import slurm_cluster as harness
from support.require import require

PROFILE = REPO / "profiles" / "slurm"
OVERLAY = REPO / ".test" / "profiles" / "slurm-rehearsal"
SLICE = REPO / ".test" / "config" / "rehearsal-slice.yaml"
PAPER = REPO / "config" / "paper.yaml"
RUNNER = REPO / "scripts" / "rehearse-paper-grid.sh"
SCHEMA = REPO / "src" / "sdbench" / "schemas" / "config.schema.yaml"


def profile(path: Path) -> dict:
    return yaml.safe_load((path / "config.yaml").read_text())


# ---------------------------------------------------------------------------- fast


def test_the_overlay_keeps_every_request_of_the_slurm_profile() -> None:
    slurm, overlay = profile(PROFILE), profile(OVERLAY)
    # Nothing that shapes a job's request is overridden: rules' resources and threads stay the profile's.
    assert {"set-resources", "set-threads", "resources"}.isdisjoint(overlay)
    assert overlay["default-resources"] == {k: v for k, v in slurm["default-resources"].items() if k != "slurm_account"}
    # A workflow profile's config: replaces the profile's: it must carry all of it, then the switch.
    assert overlay["config"][: len(slurm["config"])] == slurm["config"]
    assert overlay["config"][len(slurm["config"]):] == ["engine_mode=rehearsal"]
    # squeue sees a job for MinJobAge after it ended; the executor needs 3 x its first wait.
    assert overlay["slurm-status-command"] == "squeue"
    assert 3 * overlay["slurm-init-seconds-before-status-checks"] <= 600


def test_no_rule_deploys_environment_modules() -> None:
    """The overlay turns Apptainer off with env-modules, which must then deploy nothing."""
    assert profile(OVERLAY)["software-deployment-method"] == "env-modules"
    sources = [REPO / "Snakefile", *sorted((REPO / "workflow").rglob("*.smk"))]
    assert not [p.name for p in sources if re.search(r"^\s*envmodules\s*:", p.read_text(), re.M)]


def paper_plan(*overlays: Path):
    from snakemake.utils import update_config

    from sdbench.config import validate_config
    from sdbench.workflow.plan import Plan

    config = yaml.safe_load(PAPER.read_text())
    for path in overlays:
        update_config(config, yaml.safe_load(path.read_text()))
    validate_config(config, source="config")
    return config, Plan(config)


def test_the_gpu_node_fits_every_engine_job_of_the_paper_grid() -> None:
    from sdbench import scheduling

    shape = harness.paper_node_shape(PROFILE)
    assert shape.partitions == (("gpu", 2880), ("cpu", 2880))
    assert shape.gres == (("gpu", "h100", 8),)
    config, plan = paper_plan()
    cpus_per_gpu = profile(PROFILE)["set-resources"]["run_engine"]["cpus_per_gpu"]
    gpus = max(scheduling.cell_gpus(config, c) for c in plan.cells)
    mem = max(scheduling.cell_mem_mb(config, c) for c in plan.cells)
    assert (gpus, cpus_per_gpu) == (4, 16) and mem >= 4 * 64_000  # Llama3-70B and GLM-4.5-Air: TP 4
    assert shape.cpus >= gpus * cpus_per_gpu and shape.real_memory_mb >= mem


def test_the_conf_declares_the_gpu_node(tmp_path: Path) -> None:
    shape = harness.paper_node_shape(PROFILE)
    conf = harness.render_slurm_conf(
        tmp_path, nodename="node1", hardware={"CPUs": "2"}, real_memory_mb=20_000, ctld_port=1, slurmd_port=2,
        munge_socket=tmp_path / "sock", shape=shape,
    )
    lines = conf.splitlines()
    assert ("NodeName=node1 CPUs=192 Boards=1 SocketsPerBoard=2 CoresPerSocket=96 ThreadsPerCore=1 "
            "RealMemory=2048000 Gres=gpu:h100:8 State=UNKNOWN") in lines
    assert "PartitionName=gpu Nodes=node1 Default=YES MaxTime=2880 State=UP" in lines
    assert "PartitionName=cpu Nodes=node1 Default=NO MaxTime=2880 State=UP" in lines
    assert {"SlurmdParameters=config_overrides", "EnforcePartLimits=ALL", "GresTypes=gpu"} <= set(lines)
    assert "AutoDetect=off\nNodeName=node1 Name=gpu Type=h100 File=/d/gpu[0-7]\n" in shape.gres_conf("node1", Path("/d"))


def items(plan) -> collections.Counter:
    return collections.Counter(
        out.split("/")[2].split(".")[0] for out in plan.final_outputs() if out.startswith("results/paper/")
    )


def test_the_slice_draws_every_item_of_the_paper_grid_on_few_cells() -> None:
    _, paper = paper_plan()
    _, piece = paper_plan(SLICE)
    assert set(items(piece)) == set(items(paper))
    # Every item of the index but the forced-acceptance ones (ext13-ext15: no synthetic rejection
    # sampling in the paper's engines).
    assert len(items(paper)) == 29
    assert (len(piece.cells), len(piece.groups), len(piece.server_groups)) == (13, 6, 1)  # 2 arms interleaved
    # Cells of the paper's size: its request counts and the longest prompts at batch size 64.
    assert {c.dataset for c in piece.cells} >= {"sharegpt", "sharegpt-random", "speed-bench-throughput-32k"}
    assert max(c.batch_size for c in piece.cells) == 64


# ---------------------------------------------------------------------------- slow


@pytest.fixture(scope="module")
def paper_cluster():
    """A cluster whose node is the paper profile's GPU node (8 typed GPUs, 192 CPUs, 2 TB)."""
    with live_cluster(shape=harness.paper_node_shape(PROFILE)) as cluster:
        yield cluster


def job_output(cluster, job: int) -> str:
    path = cluster.root / "jobs" / f"slurm-{job}.out"
    deadline = time.monotonic() + 5
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return path.read_text()


@pytest.mark.slow
def test_the_gpu_node_takes_the_paper_asks_and_refuses_more(paper_cluster) -> None:
    sinfo = paper_cluster.run("sinfo", "-h", "-N", "-o", "%P %c %m %G %l %T").stdout.split("\n")
    assert sinfo[:2] == ["gpu* 192 2048000 gpu:h100:8 2-00:00:00 idle", "cpu 192 2048000 gpu:h100:8 2-00:00:00 idle"]
    # A TP4 engine job of the paper profile: 4 GPUs x 16 CPUs, 256,000 MB, the partition's limit.
    job = paper_cluster.sbatch(
        "-p", "gpu", "--nodes=1", "--gpus=h100:4", "--cpus-per-gpu=16", "--mem=256000", "-t", "2880",
        wrap='echo "gpus=$CUDA_VISIBLE_DEVICES mem=$SLURM_MEM_PER_NODE cpus=$SLURM_CPUS_ON_NODE"',
    )
    assert paper_cluster.wait_job(job, timeout=60) == "COMPLETED"
    assert "gpus=0,1,2,3 mem=256000 cpus=64" in job_output(paper_cluster, job)
    with pytest.raises(harness.SlurmClusterError, match="Requested time limit is invalid"):
        paper_cluster.sbatch("-p", "gpu", "-t", "2881", wrap="true")
    with pytest.raises(harness.SlurmClusterError, match="Requested node configuration is not available"):
        paper_cluster.sbatch("-p", "gpu", "--gpus=h100:9", wrap="true")


@pytest.mark.slow
def test_the_watcher_and_the_check_see_real_jobs(paper_cluster, tmp_path: Path) -> None:
    from support.slurm_usage import UsageRecorder

    def allocate(mb: int) -> str:
        return (f"{sys.executable} -c 'import time; x = bytearray({mb} * 2**20); "
                f"x[::4096] = bytes(len(x[::4096])); time.sleep(3)'")

    # 200 MB in a child of a child: the job's whole process tree counts. Two processes of 150 MB
    # at once: their sum is over a 250 MB ask, each one alone is not.
    nested = f"bash -c \"{allocate(200)}\""
    pair = f"{allocate(150)} & {allocate(150)}; wait"
    earlier = paper_cluster.sbatch("--comment=rule_earlier", wrap="true")  # in the queue before: not recorded
    paper_cluster.wait_job(earlier, timeout=60)
    recorder = UsageRecorder(paper_cluster, tmp_path / "usage").start()
    try:
        jobs = {
            "fits": paper_cluster.sbatch("--mem=1000", "-t", "5", "--comment=rule_fits_wildcards_a_1", wrap=nested),
            "over": paper_cluster.sbatch("--mem=250", "-t", "5", "--comment=rule_over", wrap=pair),
            # Without SLURM_CONF (as the jobstep's shell before srun): its parent is the job's.
            "stripped": paper_cluster.sbatch("--mem=150", "-t", "5", "--comment=rule_stripped",
                                             wrap=f"env -u SLURM_CONF {allocate(200)}"),
            "fails": paper_cluster.sbatch("--mem=100", "--comment=rule_fails", wrap="sleep 1; exit 3"),
            "gpu": paper_cluster.sbatch("-p", "gpu", "--gpus=h100:2", "--cpus-per-gpu=16", "--mem=128000",
                                        "-t", "2880", "--comment=rule_engine", wrap="sleep 2"),
        }
        for job in jobs.values():
            paper_cluster.wait_job(job, timeout=60)
    finally:
        recorder.stop()
    assert not recorder.errors
    out = subprocess.run([sys.executable, "-m", "sdbench.cli", "bench", "job-usage", "--usage-dir",
                          str(tmp_path / "usage"), "--output", str(tmp_path / "usage.parquet")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout
    assert out.stderr.strip() == "error: 1 job(s) failed, 2 over their memory, 0 over their time (of 5)", out.stdout
    table = pd.read_parquet(tmp_path / "usage.parquet").set_index("rule")
    assert sorted(table["job_id"].astype(int)) == sorted(jobs.values())
    assert table.loc["fits", "wildcards"] == "a_1" and not table.loc["fits", "over_memory"]
    assert 200 <= table.loc["fits", "peak_rss_mb"] < 1000
    assert table.loc["over", "over_memory"] and table.loc["over", "mem_asked_mb"] == 250
    assert table.loc["over", "peak_process_mb"] < 250 <= 300 <= table.loc["over", "peak_rss_mb"]
    assert table.loc["stripped", "over_memory"] and table.loc["stripped", "peak_rss_mb"] >= 200
    assert table.loc["fails", "state"] == "FAILED" and table.loc["fails", "failed"]
    gpu = table.loc["engine"]
    assert (gpu["partition"], gpu["gpus"], gpu["gpu_type"], gpu["cpus"], gpu["mem_asked_mb"]) == (
        "gpu", 2, "h100", 32, 128_000)
    assert gpu["time_limit_min"] == 2880 and 2 <= gpu["wall_s"] <= 30


def rehearsal_exists() -> bool:
    return "engine_mode" in yaml.safe_load(SCHEMA.read_text()).get("properties", {})


@pytest.mark.slow
def test_the_paper_grid_slice_through_slurm(published_traces_dir: Path, tmp_path: Path) -> None:
    """The CI slice: every analysis item of the paper grid, engine jobs in rehearsal mode, through
    scripts/rehearse-paper-grid.sh; every SLURM job ends within what it asked."""
    require(rehearsal_exists(), "config key engine_mode (the rehearsal engine) is not in the schema")
    try:
        harness.ensure_packages()
    except harness.SlurmUnavailable as exc:
        require(False, str(exc))
    run = tmp_path / "run"
    env = {**os.environ, "CONFIGFILES": f"{PAPER} {SLICE}", "TRACES_DIR": str(published_traces_dir)}
    start = time.monotonic()
    try:
        proc = subprocess.run(["bash", str(RUNNER), str(run)], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=1200)
    except subprocess.TimeoutExpired:
        log = run / "snakemake.log"
        pytest.fail(f"the rehearsal did not end in 1200 s:\n{log.read_text()[-4000:] if log.exists() else ''}")
    print(f"\nrehearsal of the slice: {time.monotonic() - start:.0f} s")
    report = (run / "run.md").read_text() if (run / "run.md").exists() else proc.stdout + proc.stderr
    log = (run / "snakemake.log").read_text()
    # run.md ends with each failed job's logs: CI keeps only what this message prints.
    failed = report[report.find("\n## Error in rule"):] if "\n## Error in rule" in report else ""
    assert proc.returncode == 0, report[:2500] + failed[:9000] + log[-2000:]
    table = pd.read_parquet(run / "job-usage.parquet")
    assert not (table["failed"] | table["over_memory"] | table["over_time"]).any(), report
    # The watcher recorded every job Snakemake submitted, of every rule it submitted.
    submitted = re.findall(r"has been submitted with SLURM jobid (\d+)", log)
    assert sorted(map(int, submitted)) == sorted(table["job_id"].astype(int))
    assert set(re.findall(r"^rule (\w+):$", log, re.M)) == set(table["rule"])
    _, piece = paper_plan(SLICE)
    drawn = {p.name.split(".")[0] for p in (run / "results" / "paper").iterdir()}
    assert set(items(piece)) <= drawn
