"""An engine group killed by its SLURM time limit keeps the cells it finished.

A real single-node SLURM (tests/support/slurm_cluster.py) runs one engine group of twelve cells
(.test/config/slurm-timeout.yaml: the tiny model on real vLLM for CPU, each cell timed for at
least 8 s) with a 1-minute time limit, shorter than the group. SLURM kills the job; Snakemake
deletes the group's directory, not its checkpoints (results/engine_checkpoints/). The rerun,
without the limit, measures only the cells the killed job had not finished, and Snakemake then
sees every cell as done; the checkpoints stay for any later split of the group.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO
from tests.e2e.test_slurm_pipeline import snakemake_slurm

pytestmark = pytest.mark.slow

CONFIG = REPO / ".test" / "config" / "slurm-timeout.yaml"
BATCH_SIZES = list(range(1, 13))
GROUP = "results/engines/vllm-cpu/tiny-target/none/all"
CHECKPOINTS = "results/engine_checkpoints/vllm-cpu/tiny-target/none"
LOG = "logs/run_engine/vllm-cpu/tiny-target/none/all.log"


def cell_targets() -> list[str]:
    return [f"results/runs/vllm-cpu/tiny-target/code-edit/none/bs{bs}/summary.parquet" for bs in BATCH_SIZES]


def cells_logged(log: str, what: str) -> list[int]:
    """Batch sizes the run-group log says it measured (``what`` = measured) or re-used."""
    return sorted(int(bs) for bs in re.findall(rf"cell none/code-edit/bs(\d+): {what}\b", log))


def test_a_group_killed_by_its_time_limit_reruns_only_its_missing_cells(slurm_cluster, tmp_path: Path,
                                                                        tiny_target_build: Path) -> None:  # fmt: skip
    from support.tinybuild import seed

    workdir = tmp_path
    seed(workdir, tiny_target_build, CONFIG)  # the builds are not what this test is about
    # The engine job asks SLURM for 1 minute (build_model keeps the CI profile's memory).
    killed = snakemake_slurm(
        slurm_cluster, workdir, *cell_targets(),
        "--set-resources", "run_engine:runtime=1", "build_model:mem_mb=4000",
        configfile=CONFIG,
    )  # fmt: skip
    first_log = (workdir / LOG).read_text()
    out = killed.stdout + killed.stderr
    assert killed.returncode != 0, out[-3000:]
    slurm_logs = sorted((workdir / "logs" / "slurm").rglob("*.log"))
    engine_logs = [p.read_text(errors="replace") for p in slurm_logs if "rule_run_engine" in p.parts]
    assert any("DUE TO TIME LIMIT" in t for t in engine_logs), "\n".join(t[-1500:] for t in engine_logs)
    first = cells_logged(first_log, "measured")
    print(f"\nkilled run measured bs {first}")
    assert 1 <= len(first) < len(BATCH_SIZES), first_log[-3000:]
    assert not (workdir / GROUP).exists()  # Snakemake deleted the killed job's output...
    kept = {p.name: p for p in (workdir / CHECKPOINTS).iterdir() if not p.name.startswith(".")}
    assert len(kept) == len(first)  # ...but not the finished cells
    kept_calls = {
        int(pd.read_parquet(p / "summary.parquet")["batch_size"].iloc[0]): (p / "calls.parquet").read_bytes()
        for p in kept.values()
    }
    assert sorted(kept_calls) == first

    rerun = snakemake_slurm(slurm_cluster, workdir, *cell_targets(), configfile=CONFIG)
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-4000:]
    second_log = (workdir / LOG).read_text()
    second, reused = cells_logged(second_log, "measured"), cells_logged(second_log, "re-used")
    print(f"rerun measured bs {second}, re-used bs {reused}")
    assert reused == first and second == sorted(set(BATCH_SIZES) - set(first)), second_log[-3000:]
    assert f"group: {len(second)} of {len(BATCH_SIZES)} cell(s) to measure, {len(first)} re-used" in second_log
    # A re-used cell's tables are the killed run's, byte for byte; every cell's tables exist.
    for bs in BATCH_SIZES:
        cell = workdir / f"results/runs/vllm-cpu/tiny-target/code-edit/none/bs{bs}"
        assert pd.read_parquet(cell / "summary.parquet")["tokens_per_s"].iloc[0] > 0
        if bs in kept_calls:
            assert (cell / "calls.parquet").read_bytes() == kept_calls[bs]
    stored = [p for p in (workdir / CHECKPOINTS).iterdir() if not p.name.startswith(".")]
    assert len(stored) == len(BATCH_SIZES)  # kept: a later split of the group re-uses them
    done = snakemake_slurm(slurm_cluster, workdir, *cell_targets(), "-n", configfile=CONFIG)
    assert "Nothing to be done" in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]
