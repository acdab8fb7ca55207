"""``sdbench doctor``, the GPUs of this host (with CUDA engines in the grid): GPUs and a driver
every engine image accepts (:func:`sdbench.gpudriver.driver_check`), and NVML's energy counter read
around ~2 s of matmuls on the first GPU, printed as joules and mean watts (the meter of every timed
call, :mod:`sdbench.engine.measure.energy`). The GPUs inside each image are checked with the images
(:func:`sdbench.doctorcontainers.image_gpus`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sdbench.doctorcore import Result, failed, ok, skipped
from sdbench.doctorsite import Site, grid_uses
from sdbench.gpudriver import driver_check


def cuda_images(site: Site) -> list[str]:
    """Names of the images of the grid's CUDA engines."""
    engines = site.config["engines"] if site.config else {}
    return sorted({Path(engines[c.engine]["container"]).stem for c in site.plan.cells
                   if engines[c.engine].get("device") == "cuda" and engines[c.engine].get("container")})


def host_gpu_checks(site: Site) -> list[Result]:
    """With CUDA engines in the grid: GPUs and a driver every engine image accepts, on this host
    (says what is missing before any image is built; the same inside each image follows)."""
    if not grid_uses(site, "cuda"):
        return []
    return [driver_check("GPUs on this host (nvidia-smi)", [], cuda_images(site))]


METER_CHECK = "GPU energy meter (NVML total-energy counter)"


METER_FIX = ("energy needs a Volta or later GPU whose driver exposes nvmlDeviceGetTotalEnergyConsumption; "
             "without it every energy column says 'not measured' (docs/measurement.md, Energy)")


def matmul_load() -> Callable[[float], None] | str:
    """A GPU load: bf16 matmuls on the first CUDA device for a given number of seconds; or why
    there is none here (no torch, or a torch without CUDA: the host's CPU build)."""
    try:
        import torch
    except ImportError:
        return "no torch here"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"

    def load(seconds: float) -> None:
        import time

        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(8):
                a @ a
            torch.cuda.synchronize()

    return load


def gpu_meter_check(nvml: Any = None, load: Callable[[float], None] | str | None = None, seconds: float = 2.0,
                    clock: Callable[[], float] | None = None) -> Result:  # fmt: skip
    """NVML's total-energy counter of the first visible GPU read around ``seconds`` of GPU load
    (:func:`matmul_load`): its joules and mean watts. FAILED when the counter is unsupported or does
    not move; skipped without an NVML library (no driver: the GPU check says so) or without a load."""
    import time

    from sdbench.engine.measure.energy import nvml_meter, nvml_module
    from sdbench.engine.site.quietguard import visible_gpus

    nvml = nvml if nvml is not None else nvml_module()
    if nvml is None:
        return failed(METER_CHECK, "no NVML binding (pynvml, or the copy vLLM ships)", "pip install nvidia-ml-py")
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound / DriverNotLoaded
        return skipped(METER_CHECK, f"NVML does not start here ({exc}): no NVIDIA driver")
    try:
        meter = nvml_meter(nvml, visible_gpus(), 1)
    except Exception as exc:  # noqa: BLE001 - NVMLError_NotSupported and kin
        return failed(METER_CHECK, f"the counter cannot be read: {type(exc).__name__}: {exc}", METER_FIX)
    load = matmul_load() if load is None else load
    if isinstance(load, str):
        return skipped(METER_CHECK, f"the counter reads, but no GPU load to meter ({load}): run "
                                    "scripts/gpu-meter-check.py inside the engine's image")  # fmt: skip
    clock = clock or time.perf_counter
    e0, t0 = meter.read(), clock()
    load(seconds)
    joules, elapsed = meter.read() - e0, clock() - t0
    if not joules > 0:
        return failed(METER_CHECK, f"the counter did not advance over {elapsed:.2f} s of GPU load", METER_FIX)
    return ok(f"{METER_CHECK}: {joules:.1f} J over {elapsed:.2f} s of GPU load, mean {joules / elapsed:.0f} W")


def energy_meter_checks(site: Site) -> list[Result]:
    """With CUDA engines in the grid: the GPU energy meter works (:func:`gpu_meter_check`)."""
    if not grid_uses(site, "cuda"):
        return []
    return [gpu_meter_check()]
