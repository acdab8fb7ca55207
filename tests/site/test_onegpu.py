"""On a one-GPU workstation (profiles/gpu) a timed engine job never shares the machine with another
job of the workflow.

The real plan of ``snakemake --profile profiles/gpu --configfile config/gpu-smoke.yaml`` (Snakemake's
API with the profile's resource settings, on ``--cores 4``) is executed by Snakemake's own local
scheduler with a stand-in for every job: the same dependencies, threads, ``gpu`` resource and
priority, a short sleep instead of the command. Each stand-in writes its start and end time; no job
may run while an engine job (a timed cell) runs. Threads and resources are what keep them apart:
an engine job's threads are every core of ``--cores``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # plans the smoke grid and runs ~70 stand-in jobs through Snakemake

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PROFILE = REPO / "profiles" / "gpu" / "config.yaml"
ENGINE_RULES = {"run_engine", "trace_group", "breakdown_group", "serve_group"}
CORES = 4

STAND_IN = '''
import json
JOBS = json.load(open("jobs.json"))

rule all:
    input: expand("done/{job}", job=sorted(JOBS))

rule stand_in:
    input: lambda w: [f"done/{d}" for d in JOBS[w.job]["deps"]]
    output: "done/{job}"
    threads: lambda w: JOBS[w.job]["threads"]
    resources: gpu=lambda w: JOBS[w.job]["gpu"]
    priority: lambda w: JOBS[w.job]["priority"]
    shell: "date +%s.%N > {output}.start; sleep 0.3; date +%s.%N > {output}"
'''


def planned(profile: Path, workdir: Path) -> dict[str, dict]:
    """The smoke grid's jobs as the profile plans them on ``--cores 4``: rule, threads, GPUs,
    priority and the jobs each waits for."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

    settings = yaml.safe_load(profile.read_text())
    resources = dict(item.split("=") for item in settings.get("resources", []))
    with SnakemakeApi(OutputSettings(dryrun=True)) as api:
        wf = api.workflow(
            resource_settings=ResourceSettings(
                cores=CORES, resources={k: int(v) for k, v in resources.items()},
                overwrite_threads=settings.get("set-threads", {}), overwrite_resources=settings.get("set-resources", {}),
            ),
            config_settings=ConfigSettings(configfiles=[REPO / "config" / "gpu-smoke.yaml"]),
            snakefile=REPO / "Snakefile",
            workdir=workdir,
        )  # fmt: skip
        wf.dag(DAGSettings()).execute_workflow(executor="dryrun")
        dag = wf._workflow.dag
        jobs = [j for j in dag.jobs if j.rule.name != "all"]
        ids = {j: f"{j.rule.name}-{i:03d}" for i, j in enumerate(jobs)}
        return {
            ids[j]: {"rule": j.rule.name, "threads": j.threads, "gpu": int(j.resources.get("gpu", 0)),
                     "priority": j.priority, "deps": sorted(ids[d] for d in dag.dependencies[j] if d in ids)}
            for j in jobs
        }  # fmt: skip


def overlaps(jobs: dict[str, dict], times: dict[str, tuple[float, float]]) -> list[tuple[str, str]]:
    """(engine job, other job) pairs whose run times intersect."""
    engines = [j for j in jobs if jobs[j]["rule"] in ENGINE_RULES]
    return sorted(
        (e, o) for e in engines for o in jobs
        if o != e and times[o][0] < times[e][1] and times[e][0] < times[o][1]
    )  # fmt: skip


def test_no_job_runs_beside_a_timed_engine_job(tmp_path: Path) -> None:
    jobs = planned(PROFILE, tmp_path / "plan")
    engines = [j for j, job in jobs.items() if job["rule"] in ENGINE_RULES]
    assert len(engines) == 8 and all(jobs[j]["threads"] == CORES and jobs[j]["gpu"] == 1 for j in engines)
    assert all(job["threads"] >= 1 for job in jobs.values())
    run = tmp_path / "run"
    run.mkdir()
    (run / "jobs.json").write_text(json.dumps(jobs))
    (run / "Snakefile").write_text(STAND_IN)
    settings = yaml.safe_load(PROFILE.read_text())
    done = subprocess.run(
        [str(BIN / "snakemake"), "--cores", str(CORES), "--resources", *settings["resources"], "--quiet", "all"],
        cwd=run, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    times = {j: (float((run / "done" / f"{j}.start").read_text()), float((run / "done" / j).read_text())) for j in jobs}
    assert overlaps(jobs, times) == []
    # Other jobs did run side by side (the cores were shared out), so the check could have failed.
    others = [j for j in jobs if j not in engines]
    assert any(times[a][0] < times[b][1] and times[b][0] < times[a][1] for a in others for b in others if a < b)
