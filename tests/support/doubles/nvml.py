"""Test double of the NVML Python binding (pynvml): GPUs cannot exist here.

``NVMLDouble(devices)`` answers the calls :func:`sdbench.engine.quietguard.nvml_gpu_processes`
makes, for devices given as ``(uuid, [pids], free_mib)``, in index order.
"""

from __future__ import annotations

from types import SimpleNamespace


class NVMLDouble:
    """Stands in for the ``pynvml`` module."""

    def __init__(self, devices: list[tuple[str, list[int], float]]) -> None:
        self.devices = devices
        self.initialised = 0

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's names
        self.initialised += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:  # noqa: N802
        return self.devices[handle][0]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:  # noqa: N802
        return [SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in self.devices[handle][1]]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(free=int(self.devices[handle][2] * 2**20), total=80 * 2**30)
