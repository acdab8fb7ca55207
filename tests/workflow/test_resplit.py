"""A site's runtime limit edited on a finished run re-measures nothing (real Snakemake, real vLLM on CPU).

The no-SD cells of the fault-injection config (.test/config/faults.yaml: the tiny model, batch sizes
1 and 2) run to completion without a site: one engine group, ``none/all``. Then the run is planned
with a site whose ``max_runtime`` splits that group into one job per cell (as editing the SLURM
profile's ``max_runtime`` from 2,880 to 1,440 re-splits the paper's groups). ``snakemake -n`` lists
the re-split groups' jobs; each one's ``sdbench run-group --dry-run`` says it would measure 0 cells.
Run for real, they start no engine, every cell's tables stay byte for byte the measured ones, and
the run is then complete.
"""

from __future__ import annotations

import math
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.workflow.test_faults import CONFIG, env, snakemake_cmd

pytestmark = pytest.mark.slow

CELLS = [f"results/runs/vllm-cpu/tiny-target/code-edit/none/bs{b}" for b in (1, 2)]
TARGETS = [f"{c}/calls.parquet" for c in CELLS]
LOGS = "logs/run_engine/vllm-cpu/tiny-target/none"


def sized_config(workdir: Path) -> Path:
    """The fault-injection config with a long expected prompt: a sizing key only (in no job's
    params), so that each cell's runtime estimate is above the scheduler's 10-minute floor and a
    site's limit can fit one cell but not both."""
    config = yaml.safe_load(CONFIG.read_text())
    config["datasets"]["code-edit"]["expected_prompt_tokens"] = 2_000_000
    path = workdir / "sized.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def splitting_site(path: Path) -> str:
    """A ``site`` config value whose limit fits each cell alone but not the two together."""
    from sdbench import scheduling
    from sdbench.config import validate_config
    from sdbench.grid import engine_groups

    config = validate_config(yaml.safe_load(path.read_text()), source=str(path))
    cells = next(cs for g, cs in engine_groups(config).items() if g.method == "none")
    alone = max(scheduling.group_estimate_minutes(config, [c]) for c in cells)
    together = scheduling.group_estimate_minutes(config, cells)
    limit = math.ceil(alone / scheduling.SITE_MARGIN)  # budget 80% of it: >= alone, < together
    assert scheduling.SITE_MARGIN * limit < together, (alone, together)
    return f"site={{engine_partition: cpu, partitions: {{cpu: {{max_runtime: {limit}}}}}}}"


def run(workdir: Path, *args: str, timeout: int = 1800) -> str:
    # A second --configfile replaces the first (sized_config: the same config, one sizing key more);
    # last, so that it takes no target for a config file.
    done = subprocess.run(snakemake_cmd(workdir, *args, "--configfile", str(workdir / "sized.yaml")), cwd=workdir, env=env(), capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    return out


def test_a_new_max_runtime_re_splits_groups_but_measures_no_cell_again(tmp_path: Path, tiny_target_build: Path) -> None:
    from support.tinybuild import seed

    seed(tmp_path, tiny_target_build, CONFIG)
    sized = sized_config(tmp_path)
    first = run(tmp_path, *TARGETS)
    assert first.count("rule run_engine:") == 1
    measured = {c: (tmp_path / c / "calls.parquet").read_bytes() for c in CELLS}
    store = tmp_path / "results/engine_checkpoints/vllm-cpu/tiny-target/none"
    assert len([p for p in store.iterdir() if not p.name.startswith(".")]) == 2  # kept after the group completed

    site = splitting_site(sized)
    planned = run(tmp_path, *TARGETS, "-n", "-p", "--config", site, timeout=600)
    shares = sorted(re.findall(r"results/engines/vllm-cpu/tiny-target/none/(all\.[\w.-]+)", planned))
    assert sorted(set(shares)) == ["all.code-edit.bs1", "all.code-edit.bs2"], planned[-3000:]
    # -p prints each job's shell command ("Shell command: sdbench run-group ... > log 2>&1").
    commands = [line[line.index("sdbench run-group"):].split(" > ")[0] for line in planned.splitlines()
                if "sdbench run-group" in line]  # fmt: skip
    assert len(commands) == 2, planned[-3000:]
    for command in commands:  # what each re-split job would measure
        dry = subprocess.run([*shlex.split(command), "--dry-run"], cwd=tmp_path, env=env(), capture_output=True,
                             text=True, timeout=600)  # fmt: skip
        assert dry.returncode == 0, dry.stderr[-3000:]
        assert dry.stdout.strip().endswith(": 0 cell(s) to measure, 1 re-used"), dry.stdout + dry.stderr[-2000:]

    resplit = run(tmp_path, *TARGETS, "--config", site)
    assert resplit.count("rule run_engine:") == 2
    for share in ("all.code-edit.bs1", "all.code-edit.bs2"):
        log = (tmp_path / LOGS / f"{share}.log").read_text()
        assert "group: 0 of 1 cell(s) to measure, 1 re-used" in log and "LLM kwargs" not in log, log[-2000:]
    assert {c: (tmp_path / c / "calls.parquet").read_bytes() for c in CELLS} == measured
    assert "Nothing to be done" in run(tmp_path, *TARGETS, "-n", "--config", site, timeout=600)
