"""Test double of the NVML Python binding (pynvml): GPUs cannot exist here.

``NVMLDouble(devices)`` answers the calls :func:`sdbench.engine.site.quietguard.nvml_gpu_processes` and
:func:`sdbench.engine.site.hardware.gpu_inventory` make, for devices given as ``(uuid, [pids],
free_mib)`` or ``(uuid, [pids], free_mib, name, total_mib)``, in index order; ``name``,
``total_mib`` and ``driver`` default to an H100 SXM board (what NVML reports for one). With
``energy_mj`` (device index -> its total-energy counter in millijoules now) it answers the energy
meter's (:mod:`sdbench.engine.measure.energy`); without it the counter is unsupported, as on GPUs before
Volta: :class:`NVMLNotSupported` (pynvml's ``NVMLError_NotSupported``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

H100_SXM = ("NVIDIA H100 80GB HBM3", 81559)


class NVMLNotSupported(Exception):
    """What pynvml raises for a counter the GPU does not have (``NVMLError_NotSupported``)."""

    def __str__(self) -> str:
        return "Not Supported"


class NVMLDouble:
    """Stands in for the ``pynvml`` module."""

    def __init__(
        self, devices: list[tuple], driver: str = "550.54.15", energy_mj: Callable[[int], int] | None = None
    ) -> None:
        self.devices = devices
        self.driver = driver
        self.energy_mj = energy_mj
        self.initialised = 0
        self.energy_reads = 0

    def _board(self, handle: int) -> tuple[str, int]:
        device = self.devices[handle]
        return (device[3], device[4]) if len(device) >= 5 else H100_SXM

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's names
        self.initialised += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return self.driver

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:  # noqa: N802
        return self.devices[handle][0]

    def nvmlDeviceGetName(self, handle: int) -> str:  # noqa: N802
        return self._board(handle)[0]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:  # noqa: N802
        return [SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in self.devices[handle][1]]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(free=int(self.devices[handle][2] * 2**20), total=self._board(handle)[1] * 2**20)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:  # noqa: N802
        if self.energy_mj is None:
            raise NVMLNotSupported()
        self.energy_reads += 1
        return int(self.energy_mj(handle))
