"""What every cell records of the hardware and the code it ran on, and the joins that refuse to
divide arms measured apart on different hardware. GPUs cannot exist here: NVML is the test double
tests/support/doubles/nvml.py, nvidia-smi the double tests/support/doubles/gpu/nvidia-smi."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from sdbench.analysis.endtoend import hardware_kind, join_cells
from sdbench.analysis.runcompare import ran_on_differences
from sdbench.analysis.verdict import server_points
from sdbench.codedigest import package_digest
from sdbench.engine.site.hardware import gpu_inventory, hardware_class, provenance, same_hardware
from tests.support.doubles.nvml import NVMLDouble

REPO = Path(__file__).resolve().parents[2]
GPU_DOUBLE = REPO / "tests" / "support" / "doubles" / "gpu"
SXM = ("NVIDIA H100 80GB HBM3", 81559)
PCIE = ("NVIDIA H100 PCIe", 81559)
NVL = ("NVIDIA H100 NVL", 95830)


def _devices(*boards: tuple[str, int]) -> list[tuple]:
    return [(f"GPU-{i:04d}", [], 1000.0, name, mib) for i, (name, mib) in enumerate(boards)]


def test_provenance_records_the_job_gpus_memory_driver_cpu_and_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")  # the job's two of four boards
    nvml = NVMLDouble(_devices(SXM, SXM, SXM, NVL), driver="550.54.15")
    facts = provenance(nvml=nvml)
    assert facts["gpus"] == "NVIDIA H100 80GB HBM3, NVIDIA H100 80GB HBM3"
    assert (facts["gpu_memory_mib"], facts["gpu_driver"]) == (81559, "550.54.15")
    cpu = facts["cpu_model"]
    assert facts["hardware"] == f"2 x NVIDIA H100 80GB HBM3 (81559 MiB), driver 550.54.15; CPU {cpu}"
    assert facts["hostname"] and facts["code_digest"] == package_digest() and nvml.initialised == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-0003")  # by UUID
    assert gpu_inventory(nvml) == ([NVL], "550.54.15")


def test_h100_boards_differ_by_name_and_memory() -> None:
    """``gpu_model: h100`` in a SLURM profile matches SXM, PCIe and NVL nodes: the recorded
    hardware tells them apart."""
    labels = {provenance(nvml=NVMLDouble(_devices(board)))["hardware"] for board in (SXM, PCIE, NVL)}
    assert len(labels) == 3


def test_without_nvml_nvidia_smi_answers_and_without_either_the_cpu_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", os.pathsep.join([str(GPU_DOUBLE), os.environ["PATH"]]))
    monkeypatch.setenv("SDBENCH_NVIDIA_SMI_GPUS", "NVIDIA H100 PCIe")
    monkeypatch.setenv("SDBENCH_NVIDIA_SMI_DRIVER", "560.35.03")
    assert gpu_inventory() == ([("NVIDIA H100 PCIe", 81559)], "560.35.03")
    monkeypatch.setenv("PATH", os.environ["PATH"].split(os.pathsep, 1)[1])  # no double: no GPU here
    facts = provenance()
    assert (facts["gpus"], facts["gpu_memory_mib"], facts["gpu_driver"]) == ("", 0, "")
    assert facts["hardware"] == f"CPU {facts['cpu_model']}"


def test_the_digest_is_of_the_imported_package(tmp_path: Path) -> None:
    """A process importing another copy of the package records that copy's digest."""
    import shutil

    copy = tmp_path / "image" / "sdbench"
    shutil.copytree(REPO / "src" / "sdbench", copy, ignore=shutil.ignore_patterns("__pycache__"))
    code = "from sdbench.engine.site.hardware import provenance; print(provenance()['code_digest'])"
    same = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(copy.parent)},
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert same == package_digest()
    (copy / "engine" / "measure" / "trials.py").write_text((copy / "engine" / "measure" / "trials.py").read_text() + "\nSTALE = 1\n")
    stale = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(copy.parent)},
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert stale == package_digest(copy) != package_digest()


# --- joins ----------------------------------------------------------------------------------------
A = "1 x NVIDIA H100 80GB HBM3 (81559 MiB), driver 550.54.15; CPU AMD EPYC 9654"
B = "1 x NVIDIA H100 PCIe (81559 MiB), driver 550.54.15; CPU Intel Xeon 8480+"


def _cell(method: str, bs: int, tps: float, hardware: str) -> pd.DataFrame:
    return pd.DataFrame([{"engine": "e", "model": "m", "dataset": "d", "method": method, "batch_size": bs,
                          "tokens_per_s": tps, "tokens_per_s_pooled": tps, "hardware": hardware}])  # fmt: skip


def test_arms_on_different_gpus_are_marked_not_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Another board is another machine: the pair is marked and the join completes; another driver
    on the same board is the same machine."""
    table = join_cells([_cell("none", 4, 300.0, A), _cell("ngram", 4, 330.0, B)], baseline="none").set_index("method")
    assert table["hardware_mismatch"].to_dict() == {"none": False, "ngram": True}
    assert table.at["ngram", "speedup"] == pytest.approx(1.1)
    assert capsys.readouterr().err == (
        "warning: cell e/m/d/ngram/bs4: SD measured on [1 x NVIDIA H100 PCIe (81559 MiB)], its no-SD arm on "
        "[1 x NVIDIA H100 80GB HBM3 (81559 MiB)]: marked hardware_mismatch, kept out of the verdict (1 such cell(s)); "
        "to measure both arms on one kind of node: SDBENCH_REMEASURE_OTHER_HARDWARE=1 snakemake --forcerun "
        "run_engine, or measure in pairs (run.paired_baseline)\n"
    )
    other_driver = A.replace("driver 550.54.15", "driver 570.86.10")
    same = join_cells([_cell("none", 4, 300.0, A), _cell("ngram", 4, 330.0, other_driver)], baseline="none")
    assert not same["hardware_mismatch"].any() and capsys.readouterr().err == ""
    cpus = join_cells([_cell("none", 4, 300.0, "CPU AMD EPYC"), _cell("ngram", 4, 330.0, "CPU Intel Xeon")], "none")
    assert cpus.set_index("method")["hardware_mismatch"].to_dict() == {"none": False, "ngram": True}


def test_the_kind_of_machine_leaves_out_driver_and_node() -> None:
    assert hardware_kind(A) == "1 x NVIDIA H100 80GB HBM3 (81559 MiB)"
    assert hardware_kind("CPU AMD EPYC 7763") == "CPU AMD EPYC 7763"
    assert hardware_kind(None) == hardware_kind(float("nan")) == ""
    h100 = {"node": "n1", "cpu_model": "Xeon", "cpu_count": 112, "gpus": ["H100", "H100"],
            "gpu_memory_mib": [81559, 81559], "driver": "550.54.15"}  # fmt: skip
    assert same_hardware(h100, {**h100, "node": "n2", "driver": "570.86.10", "cpu_count": 56})
    assert not same_hardware(h100, {**h100, "gpus": ["H100"], "gpu_memory_mib": [81559]})
    assert not same_hardware(h100, {**h100, "gpu_memory_mib": [95830, 95830]})
    cpu = {"node": "c1", "cpu_model": "AMD EPYC 7763", "cpu_count": 2, "gpus": [], "gpu_memory_mib": [], "driver": ""}
    assert not same_hardware(cpu, {**cpu, "cpu_count": 4}) and same_hardware(cpu, {**cpu, "node": "c2"})
    assert hardware_class(["H100", "A100", "H100"], [81559, 81920, 81559], "x", 1) == (
        "1 x A100 (81920 MiB), 2 x H100 (81559 MiB)")


def test_paired_arms_share_one_job_and_old_tables_have_no_hardware() -> None:
    paired = _cell("ngram", 4, 330.0, B).assign(paired_speedup=1.2, paired_speedup_ci_low=1.1,
                                                paired_speedup_ci_high=1.3)  # fmt: skip
    table = join_cells([_cell("none", 4, 300.0, A), paired], baseline="none")
    assert table.set_index("method").at["ngram", "speedup"] == 1.2
    old = [c.drop(columns="hardware") for c in (_cell("none", 4, 300.0, A), _cell("ngram", 4, 330.0, B))]
    assert len(join_cells(old, baseline="none")) == 2


def test_server_mode_flags_a_method_server_on_other_hardware(capsys: pytest.CaptureFixture[str]) -> None:
    def row(method: str, hardware: str, contaminated: bool = False) -> dict:
        return {"engine": "e", "model": "m", "dataset": "d", "method": method, "sd_method": method,
                "concurrency": 8, "tokens_per_s": 100.0, "tokens_per_s_min": 90.0, "tokens_per_s_max": 110.0,
                "mean_acceptance_length": 2.0, "hardware": hardware, "contaminated": contaminated}  # fmt: skip

    apart = server_points(pd.DataFrame([row("none", A), row("ngram", B)]))
    assert apart["flags"].tolist() == ["hardware mismatch"]
    assert capsys.readouterr().err.startswith("warning: cell e/m/d/ngram/c8: SD measured on [1 x NVIDIA H100 PCIe")
    assert server_points(pd.DataFrame([row("none", A), row("ngram", A)]))["flags"].tolist() == [""]
    # A contaminated no-SD server taints the SD point measured against it.
    tainted = server_points(pd.DataFrame([row("none", A, contaminated=True), row("ngram", A)]))
    assert tainted["flags"].tolist() == ["contaminated"]


def test_compare_names_the_code_and_hardware_two_runs_ran() -> None:
    a = pd.DataFrame({"code_digest": ["aaaa", "aaaa"], "hardware": [A, A]})
    b = pd.DataFrame({"code_digest": ["bbbb", "bbbb"], "hardware": [A, A]})
    assert ran_on_differences(a, b) == ["sdbench code differs: A ran aaaa (2 cells); B ran bbbb (2 cells)"]
    assert ran_on_differences(a, a) == [] and ran_on_differences(a, b.drop(columns="code_digest")) == []
