"""The paper grid planned through the SLURM profile: what every job would ask SLURM for.

The slow tests build the plan by Snakemake's own API with the settings of
``profiles/slurm/config.yaml``; the sbatch arguments come from the SLURM executor
plugin's own functions, so the test sees what ``sbatch`` would receive. The fast tests
read the same requests from the plan (sdbench.schedulingsite.engine_jobs), without Snakemake.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DOUBLES = REPO / "tests" / "support" / "doubles"
PROFILE = REPO / "profiles" / "slurm" / "config.yaml"
MULTI_GPU_MODELS = {"llama3-70b", "glm-4.5-air"}
ENGINE_RULES = {"run_engine", "trace_group", "breakdown_group", "serve_group"}


def planned_jobs(profile: Path, configfile: Path, workdir: Path, snakefile: Path = REPO / "Snakefile") -> list:
    """Jobs of a dry run with the profile's resource settings (Snakemake API)."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

    from snakemake.cli import parse_config

    settings = yaml.safe_load(profile.read_text())
    with SnakemakeApi(OutputSettings(dryrun=True)) as api:
        wf = api.workflow(
            resource_settings=ResourceSettings(
                nodes=settings["jobs"],
                overwrite_threads=settings.get("set-threads", {}),
                overwrite_resources=settings.get("set-resources", {}),
                default_resources=settings.get("default-resources"),
            ),
            # The profile's config entries (the site's limits, quiet_guard), as `--profile` passes them.
            config_settings=ConfigSettings(configfiles=[configfile], config=parse_config(settings.get("config", []))),
            snakefile=snakefile,
            workdir=workdir,
        )
        wf.dag(DAGSettings()).execute_workflow(executor="dryrun")
        return list(wf._workflow.dag.jobs)


def cli_dry_run(profile: str, config: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    """``snakemake -n --profile profiles/<profile> --configfile config/<config>``, as a user types it,
    with the Apptainer test double on PATH (Apptainer deployment looks for the binary even in a dry
    run; it cannot be the real thing here). Fails the test unless it plans."""
    env = {**os.environ, "PATH": os.pathsep.join([str(DOUBLES), str(BIN), os.environ["PATH"]])}
    result = subprocess.run(
        [str(BIN / "snakemake"), "-n", "--profile", str(REPO / "profiles" / profile),
         "--configfile", str(REPO / "config" / config), "--snakefile", str(REPO / "Snakefile"),
         "--directory", str(workdir)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def paper_jobs(tmp_path_factory: pytest.TempPathFactory) -> list:
    return planned_jobs(PROFILE, REPO / "config" / "paper.yaml", tmp_path_factory.mktemp("plan"))


@pytest.mark.slow  # plans the paper's grid through Snakemake
def test_gpus_and_cpus_per_engine_job(paper_jobs: list) -> None:
    from snakemake_executor_plugin_slurm.utils import set_gres_string
    from snakemake_executor_plugin_slurm_jobstep import get_cpu_setting

    engine_jobs = [j for j in paper_jobs if j.rule.name in ENGINE_RULES]
    # The paper's 546 cells + 78 of the proposal-length sweep + 12 random-token control cells
    # + 108 of the temperature sweep (3 methods x 6 temperatures > 0 x 2 datasets x 3 batch sizes)
    # + 6 suffix-decoding cells + 36 SPEED-Bench cells (3 methods x 4 datasets x 3 batch sizes), less
    # the 11 the expected KV residency trims (tests/analysis/test_kvcapacity.py PAPER_TRIMMED).
    assert sum(j.rule.name == "run_cell" for j in paper_jobs) == 775
    gpu_model = yaml.safe_load(PROFILE.read_text())["set-resources"]["run_engine"]["gpu_model"]
    for job in paper_jobs:
        gpus = job.resources.get("gpu") or 0
        cpu_arg = get_cpu_setting(job, bool(gpus))
        n = int(re.search(r"=(\d+)", cpu_arg).group(1))
        cpus = n * gpus if "per-gpu" in cpu_arg else n
        assert cpus <= 64, (job, cpu_arg)
        if job.rule.name in ENGINE_RULES:
            want = 4 if job.wildcards.model in MULTI_GPU_MODELS else 1
            assert gpus == want, job
            assert set_gres_string(job).strip() == f"--gpus={gpu_model}:{want}"
            assert job.resources.get("nodes") == 1, job  # the plugin's sbatch --nodes=1: GPUs on one node
            assert job.resources.get("slurm_partition") == "gpu"
        elif job.rule.name == "image_gate":  # one GPU of the engine partition, a few minutes
            assert (gpus, job.resources.get("slurm_partition"), job.resources.get("runtime")) == (1, "gpu", 10), job
        else:
            assert gpus == 0, job
        if job.rule.name == "run_cell":  # copies a cell's tables out of its engine group
            assert job.is_local, job
    per_model = Counter((j.wildcards.model, j.resources.get("gpu")) for j in engine_jobs)
    assert {m for (m, g) in per_model if g == 4} == MULTI_GPU_MODELS


def gsm8k_call_seconds(batch: int) -> float:
    """One gsm8k call of Llama-3.1-8B (the published cost model's own model) at ``batch``: 100-token
    prompts (a prefill step per 8,192 tokens) and 200 decode steps at a mean context of 200 tokens, 0.2 s a call.
    The coefficients are the published cost model's (llama3.1-8b-h100.yaml): c_fixed 5.886 ms,
    overhead 1.207 ms a step, c_compute 21.01 us a token, c_kv 39.26 ns a KV token; causal
    attention adds c_compute x 32 layers x 4,096 / 8.03e9 parameters per squared prompt token."""
    step, c, kv = 5.88590713e-03 + 1.20683946e-03, 2.10103129e-05, 3.92645679e-08
    prefill = c * batch * 100 + c * (32 * 4096 / 8_030_261_248) * batch * 100**2 + math.ceil(batch * 100 / 8192) * step
    return prefill + 200 * (step + c * batch + kv * batch * 200) + 0.2


@pytest.mark.slow  # plans the paper's grid through Snakemake
def test_runtime_grows_with_batch_size_and_retries(paper_jobs: list) -> None:
    from sdbench.grid import Cell
    from sdbench.scheduling import cell_runtime_minutes

    config = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    from sdbench.config import validate_config
    from sdbench.grid import engine_groups
    from sdbench.scheduling import group_runtime_minutes
    from sdbench.workflow.plan import Plan

    validate_config(config, source="paper.yaml")
    small = cell_runtime_minutes(config, Cell("vllm-0.10.1.1", "llama3.1-8b", "gsm8k", "none", 1))
    large = cell_runtime_minutes(config, Cell("vllm-0.10.1.1", "llama3.1-8b", "gsm8k", "none", 128))
    # (300 prompts + 5 warm-up) calls, 20 min start-up, x2 safety.
    hand = [math.ceil(2 * (1200 + 305 * gsm8k_call_seconds(b)) / 60) for b in (1, 128)]
    assert [small, large] == hand == [57, 67]
    cell = Cell("vllm-0.10.1.1", "llama3.1-8b", "gsm8k", "none", 1)
    assert cell_runtime_minutes(config, cell, attempt=2) == 2 * cell_runtime_minutes(config, cell)
    # An engine job asks for its group's time: every cell's, with one start-up; groups are split
    # until each fits the site's limit (profiles/slurm: 2,880 minutes), and no job asks for more.
    site = {**config, **parse_profile_config()}
    plan = Plan(validate_config(site, source="paper.yaml + profiles/slurm"))
    for job in (j for j in paper_jobs if j.rule.name == "run_engine"):
        key = next(g for g in plan.groups if g.as_dict() == dict(job.wildcards.items()))
        assert job.resources["runtime"] == group_runtime_minutes(site, plan.groups[key])
        assert job.resources["runtime"] >= min(2880, max(cell_runtime_minutes(config, c) for c in plan.groups[key]))
    assert max(j.resources["runtime"] for j in paper_jobs if j.rule.name in ENGINE_RULES) == 2880
    assert max(j.resources["runtime"] for j in paper_jobs) == 2880
    # 46 engine groups without the limit; 196 jobs with it (split by dataset, then batch sizes).
    assert len(engine_groups(config)) == 46 and sum(j.rule.name == "run_engine" for j in paper_jobs) == 196
    # What the DAG asks is what the plan says (sdbench check-config --jobs).
    from sdbench.schedulingsite import engine_jobs

    planned = {(j.rule, tuple(j.wildcards.items())): (j.runtime, j.mem_mb) for j in engine_jobs(plan)}
    dag = {(j.rule.name, tuple(dict(j.wildcards.items()).items())): (j.resources["runtime"], j.resources["mem_mb"])
           for j in paper_jobs if j.rule.name in ENGINE_RULES}  # fmt: skip
    assert planned == dag


def parse_profile_config() -> dict:
    from snakemake.cli import parse_config

    return parse_config(yaml.safe_load(PROFILE.read_text())["config"])


@pytest.mark.slow  # plans the paper's grid through Snakemake
def test_cli_dry_run_with_profile_and_container_double(tmp_path: Path) -> None:
    """``snakemake -n --profile profiles/slurm --configfile config/paper.yaml`` plans the grid, split to
    the profile's 2,880-minute limit: the log says which groups were split, and no job asks for more."""
    result = cli_dry_run("slurm", "paper.yaml", tmp_path)
    match = re.search(r"^run_cell\s+(\d+)$", result.stdout, re.MULTILINE)
    assert match and int(match.group(1)) == 775, result.stdout[-3000:]
    engines = re.search(r"^run_engine\s+(\d+)$", result.stdout, re.MULTILINE)
    assert engines and int(engines.group(1)) == 196  # 46 engine groups, split to fit
    gates = re.search(r"^image_gate\s+(\d+)$", result.stdout, re.MULTILINE)
    assert gates and int(gates.group(1)) == 3  # vLLM 0.10.1.1, 0.11.1 and 0.26.0's images
    log = result.stdout + result.stderr
    assert len(set(re.findall(r"^site: engine group .* split into \d+ jobs", log, re.MULTILINE))) == 26
    asks = [int(m) for m in re.findall(r"\bruntime=(\d+)", log)]
    assert asks and max(asks) == 2880


# ------------------------------------------------------------------ fast: the plan's own requests
@pytest.fixture(scope="module")
def paper_at_site():
    from sdbench.config import validate_config
    from sdbench.workflow.plan import Plan

    config = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    return Plan(validate_config({**config, **parse_profile_config()}, source="paper.yaml + profiles/slurm"))


def test_trace_and_server_jobs_ask_their_estimate_not_the_limit(paper_at_site) -> None:
    """Under the shipped site (2,880 minutes) a job asks for the whole limit only when its own
    estimate reaches it: no trace or server job does; every engine job asks min(limit, estimate)."""
    from sdbench.schedulingsite import engine_jobs

    jobs = engine_jobs(paper_at_site)
    for job in jobs:
        assert job.runtime == min(2880, job.estimate.minutes), job.row()
    by_rule = {r: [j for j in jobs if j.rule == r] for r in ("run_engine", "trace_group", "serve_group")}
    assert [len(js) for js in by_rule.values()] == [196, 15, 1]  # one server job: 4 arms interleaved
    assert not [j.row() for j in by_rule["trace_group"] + by_rule["serve_group"] if j.runtime >= 2880]
    # A trace group is one pass per dataset: Llama-3.1-8B's EAGLE traces (4 datasets of 300-500
    # prompts, 64 running) take about half an hour, not the 3,690 minutes of replicate calls.
    eagle = next(j for j in by_rule["trace_group"] if j.wildcards == {
        "engine": "vllm-0.10.1.1", "model": "llama3.1-8b", "method": "eagle-k3"})  # fmt: skip
    assert 20 < eagle.estimate.expected_s / 60 < 40 and eagle.estimate.startup_s == 1200
    # The server job decodes the datasets' expected outputs (737 and 300 tokens), not 8,192: 4 arms x
    # 2 starts in one job, under 16 h (each arm alone was under 4 h).
    assert all(j.runtime < 16 * 60 for j in by_rule["serve_group"])
    # The jobs at the limit are single cells whose own estimate is beyond the budget.
    assert all(len(paper_at_site.groups[g]) == 1 for g in paper_at_site.groups
               if next(j for j in by_rule["run_engine"] if j.wildcards == g.as_dict()).runtime >= 2880)  # fmt: skip


def test_check_config_prints_every_engine_jobs_estimate(capsys) -> None:
    """``sdbench check-config config/paper.yaml --profile profiles/slurm --jobs``: one row per engine
    job with the parts of its estimate, and the totals (the lead's dated log quotes them)."""
    from sdbench.cli import main

    assert main(["check-config", str(REPO / "config" / "paper.yaml"), "--profile", str(REPO / "profiles" / "slurm"),
                 "--jobs"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    header = lines.index("rule\tjob\tgpus\tmem_mb\tstartup\twarmup\tprefill\tdecode\tcalls\ttrials\texpected\testimate\truntime")
    rows = [line.split("\t") for line in lines[header + 1 :] if "\t" in line]
    # 196 run_engine, 15 trace_group, 1 serve_group (4 arms interleaved), 4 breakdown_group (Fig. 3a: one per method).
    assert len(rows) == 216 and {r[0] for r in rows} == {"run_engine", "trace_group", "serve_group", "breakdown_group"}
    # Its memory: 64 GB for one GPU and, kept to the end, the token ids of cnn 500 x (1,100 + 3 x 512),
    # gsm8k 300 x (100 + 3 x 200), instructcoder 500 x (200 + 3 x 300), sharegpt 500 x (1,024 + 3 x 737)
    # at 44 B: 163 MB, rounded up to 100 MB.
    assert ["trace_group", "vllm-0.10.1.1/llama3.1-8b/eagle-k3", "1", "64200"] == next(
        r[:4] for r in rows if r[1] == "vllm-0.10.1.1/llama3.1-8b/eagle-k3")  # fmt: skip
    totals = next(line for line in lines if line.startswith("engine jobs: "))
    assert totals.startswith("engine jobs: 216; asking the full limit (2880 min): 20; GPU-hours asked")
    print("\n".join(lines[header:]))  # the table, for the log (pytest -s)


def _params_by_job(jobs: list) -> dict:
    return {(j.rule.name, str(j.wildcards)): repr(sorted(j.params.items())) for j in jobs}


@pytest.mark.slow  # plans the paper's grid through Snakemake
def test_a_new_image_reruns_exactly_its_engines_jobs(paper_jobs: list, tmp_path: Path) -> None:
    """Re-plan the paper grid from a copy of the workflow whose 0.11.1 image definition gained
    one label: the jobs whose params change (what Snakemake reruns) are exactly that engine's
    engine jobs and its image's gate, and no other job of the paper grid's."""
    import shutil

    copy = tmp_path / "repo"
    for part in ("workflow", "config", "profiles"):
        shutil.copytree(REPO / part, copy / part)
    shutil.copytree(REPO / "containers", copy / "containers", ignore=shutil.ignore_patterns("sif"))
    shutil.copy(REPO / "Snakefile", copy / "Snakefile")
    changed = copy / "containers" / "sdbench-vllm-0.11.1.def"
    changed.write_text(changed.read_text().replace("%labels", "%labels\n    rebuilt yes", 1))

    from sdbench.config import validate_config

    config = validate_config(yaml.safe_load((REPO / "config" / "paper.yaml").read_text()), source="paper.yaml")
    before = _params_by_job(paper_jobs)
    after = _params_by_job(planned_jobs(PROFILE, copy / "config" / "paper.yaml", tmp_path / "plan", copy / "Snakefile"))
    # ext17_goodput_frontier, ext18_offline_vs_served: one more each; the 4 server arms one interleaved job (3 fewer)
    assert before.keys() == after.keys() and len(before) == 1403
    rerun = {key for key in before if before[key] != after[key]}
    expected = {
        (j.rule.name, str(j.wildcards))
        for j in paper_jobs
        if j.rule.name in ENGINE_RULES and j.wildcards.engine == "vllm-0.11.1"
        or j.rule.name == "image_gate" and j.wildcards.image == "sdbench-vllm-0.11.1"  # its gate too
    }
    assert rerun == expected and len(rerun) == 105, sorted(rerun)  # its one interleaved server job among them
    assert config["engines"]["vllm-0.11.1"]["container"].endswith("sdbench-vllm-0.11.1.sif")


@pytest.mark.slow  # plans the paper's grid through Snakemake
def test_one_gpu_first_run_plans(tmp_path: Path) -> None:
    """``snakemake -n --profile profiles/gpu --configfile config/gpu-smoke.yaml`` (README, cluster
    section): 12 cells on three engine groups, two trace groups and three breakdown groups, every
    engine job asking for the one GPU the profile has, and the figures they feed."""
    result = cli_dry_run("gpu", "gpu-smoke.yaml", tmp_path)
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", result.stdout, re.MULTILINE))
    assert {k: int(counts[k]) for k in ("run_cell", "run_engine", "trace_group", "breakdown_group")} == {
        "run_cell": 12, "run_engine": 3, "trace_group": 2, "breakdown_group": 3,
    }  # fmt: skip
    for figure in ("fig01_end_to_end", "fig03_runtime_breakdown", "fig04_acceptance_heatmap", "tab02_memory"):
        assert int(counts.get(figure, 0)) >= 1, figure
    engine_resources = re.findall(r"^rule (?:run_engine|trace_group|breakdown_group):.*?resources: ([^\n]*)",
                                  result.stdout, re.MULTILINE | re.DOTALL)  # fmt: skip
    assert len(engine_resources) == 8 and all("gpu=1" in r for r in engine_resources)
    assert yaml.safe_load((REPO / "profiles" / "gpu" / "config.yaml").read_text())["resources"] == ["gpu=1"]
