"""Image gates (sdbench.imagegate): one small GPU job per CUDA engine image, before its engine jobs.

TEST DOUBLE: ``nvidia-smi`` (tests/support/doubles/gpu/nvidia-smi), a site whose driver is 570:
the draft-model image (vLLM 0.26.0, CUDA 13) needs 580.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sdbench.config import load_config, validate_config
from sdbench.imagegate import gate
from sdbench.workflow import paths as P
from sdbench.workflow.plan import Plan

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
GPU_DOUBLES = REPO / "tests" / "support" / "doubles" / "gpu"
OLD_DRIVER = "570.86.10"


@pytest.fixture()
def site_570(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """PATH with the nvidia-smi double first, reporting driver 570 on one H100."""
    env = {"PATH": os.pathsep.join([str(GPU_DOUBLES), str(BIN), os.environ.get("PATH", "")]),
           "SDBENCH_NVIDIA_SMI_DRIVER": OLD_DRIVER}  # fmt: skip
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return {**os.environ, **env}


def test_a_driver_below_the_images_minimum_fails_its_gate_in_one_line(site_570: dict[str, str], tmp_path: Path) -> None:
    passed, line = gate("sdbench-vllm-0.26.0")
    assert not passed
    assert line.startswith(f"image sdbench-vllm-0.26.0: 1 x NVIDIA H100 80GB HBM3, driver {OLD_DRIVER} (CUDA 12.4) "
                           "| FAILED: driver too old: sdbench-vllm-0.26.0 needs CUDA 13 = driver >= 580")  # fmt: skip
    assert gate("sdbench-vllm-0.11.1") == (True, f"image sdbench-vllm-0.11.1: 1 x NVIDIA H100 80GB HBM3, driver "
                                                  f"{OLD_DRIVER} (CUDA 12.4) | ok")  # fmt: skip
    out = tmp_path / "gate.json"
    refused = subprocess.run([str(BIN / "sdbench"), "image-gate", "--image", "sdbench-vllm-0.26.0", "--output", str(out)],
                             env=site_570, capture_output=True, text=True)  # fmt: skip
    assert refused.returncode == 1 and not out.exists()
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: image sdbench-vllm-0.26.0: ")
    assert lines[0].endswith("none of the engine jobs of image sdbench-vllm-0.26.0 start (the other images' jobs run)")
    passed = subprocess.run([str(BIN / "sdbench"), "image-gate", "--image", "sdbench-vllm-0.11.1", "--output", str(out)],
                            env=site_570, capture_output=True, text=True)  # fmt: skip
    assert passed.returncode == 0 and json.loads(out.read_text())["image"] == "sdbench-vllm-0.11.1"


def test_without_nvidia_smi_only_a_rehearsal_passes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    assert gate("sdbench-vllm-0.11.1", rehearsal=True) == (
        True, "image sdbench-vllm-0.11.1 | skipped: a rehearsal, no nvidia-smi to ask (no GPU checked)")
    passed, line = gate("sdbench-vllm-0.11.1")
    assert not passed and "FAILED: no GPU visible" in line


def test_every_engine_job_of_a_cuda_image_waits_for_its_gate() -> None:
    paper = Plan(load_config(REPO / "config" / "paper.yaml"))
    for group, cells_ in paper.groups.items():
        image = Path(paper.config["engines"][group.engine]["container"]).stem
        assert paper.engine_job_inputs(cells_, group.method, group.model)["gate"] == P.IMAGE_GATE.format(image=image)
    for sgroup in paper.server_groups:
        assert "gate" in paper.server_inputs(sgroup)
    assert paper.image_container("sdbench-vllm-0.26.0") == "containers/sif/sdbench-vllm-0.26.0.sif"
    default = Plan(load_config(REPO / "config" / "config.yaml"))  # CPU engines: nothing to gate
    assert all("gate" not in default.engine_job_inputs(c, g.method, g.model) for g, c in default.groups.items())


@pytest.mark.slow  # a rehearsal through Snakemake
def test_a_site_with_driver_570_runs_every_job_but_the_draft_model_images(
    published_traces_dir: Path, site_570: dict[str, str], tmp_path: Path
) -> None:
    """.test/config/rehearsal.yaml's two engines in their images, on a site double whose driver is
    570: vLLM 0.26.0's gate fails in one line and none of its engine jobs starts; vLLM 0.10.1.1's
    cells are measured (rehearsed) to the end."""
    raw = yaml.safe_load((REPO / ".test" / "config" / "rehearsal.yaml").read_text())
    raw["published_traces"]["local_dir"] = str(published_traces_dir)
    for engine in raw["engines"].values():
        engine["container"] = f"containers/sif/sdbench-vllm-{engine['vllm_version']}.sif"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    plan = Plan(validate_config({**raw, "engine_mode": "rehearsal"}, source="test"))
    cells = {e: [c for c in plan.cells if c.engine == e] for e in ("vllm-0.10.1.1", "vllm-0.26.0")}
    targets = [P.CELL_TABLE.format(name="summary", **c.as_dict()) for cs in cells.values() for c in cs]
    run = subprocess.run([str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path),
                          "--configfile", str(tmp_path / "config.yaml"), "--config", "engine_mode=rehearsal",
                          "--cores", "2", "--keep-going", *targets],
                         cwd=tmp_path, env=site_570, capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert run.returncode != 0, run.stderr[-3000:]  # the failed gate
    gate_log = (tmp_path / "logs/image_gate/sdbench-vllm-0.26.0.log").read_text()
    assert f"driver {OLD_DRIVER}" in gate_log and "needs CUDA 13 = driver >= 580" in gate_log
    assert not list((tmp_path / "logs/run_engine").glob("vllm-0.26.0/**/*.log"))  # no job of the image started
    assert not any((tmp_path / P.CELL_DIR.format(**c.as_dict())).exists() for c in cells["vllm-0.26.0"])
    done = [pd.read_parquet(tmp_path / P.CELL_TABLE.format(name="summary", **c.as_dict())) for c in cells["vllm-0.10.1.1"]]
    assert len(done) == len(cells["vllm-0.10.1.1"]) > 0 and not any(d["measured"].any() for d in done)
