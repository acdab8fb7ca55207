#!/usr/bin/env python3
"""Read NVML's total-energy counter around a short GPU load and print joules and mean watts.

    python scripts/gpu-meter-check.py [--seconds 2] [--device 0] [--idle]

Standalone (no sdbench): plain PyTorch for the load (bf16 8192 x 8192 matmuls on one GPU), and
NVML through ``pynvml`` (nvidia-ml-py) when installed, else ``ctypes`` on ``libnvidia-ml.so.1``.
The same numbers as ``sdbench doctor``'s "GPU energy meter" line, for a node or an image
(``apptainer exec --nv IMAGE python scripts/gpu-meter-check.py``). Also prints the idle power over
as long (``--idle``), and the counter's update step (the smallest non-zero change seen while polling).
Exit 0: the counter works; 1: unsupported or not advancing; 2: no GPU or no torch with CUDA.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time


class CtypesNVML:
    """The few NVML calls needed, through ctypes (when pynvml is not installed)."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._check(self.lib.nvmlInit_v2())

    def _check(self, code: int) -> None:
        if code != 0:
            self.lib.nvmlErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"NVML error {code}: {self.lib.nvmlErrorString(code).decode()}")

    def handle(self, index: int) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)))
        return handle

    def name(self, handle: ctypes.c_void_p) -> str:
        buf = ctypes.create_string_buffer(96)
        self._check(self.lib.nvmlDeviceGetName(handle, buf, ctypes.c_uint(96)))
        return buf.value.decode()

    def energy_mj(self, handle: ctypes.c_void_p) -> int:
        value = ctypes.c_ulonglong()
        self._check(self.lib.nvmlDeviceGetTotalEnergyConsumption(handle, ctypes.byref(value)))
        return value.value


class PyNVML:
    """The same calls through pynvml."""

    def __init__(self, pynvml: object) -> None:
        self.nvml = pynvml
        self.nvml.nvmlInit()

    def handle(self, index: int) -> object:
        return self.nvml.nvmlDeviceGetHandleByIndex(index)

    def name(self, handle: object) -> str:
        name = self.nvml.nvmlDeviceGetName(handle)
        return name.decode() if isinstance(name, bytes) else str(name)

    def energy_mj(self, handle: object) -> int:
        return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(handle))


def open_nvml() -> tuple[object, str]:
    try:
        import pynvml

        return PyNVML(pynvml), "pynvml"
    except ImportError:
        return CtypesNVML(), "ctypes libnvidia-ml.so.1"


def metered(nvml: object, handle: object, seconds: float, work: object) -> tuple[float, float, int]:
    """(joules, seconds, smallest counter step in mJ) around ``work(seconds)``."""
    e0, t0 = nvml.energy_mj(handle), time.perf_counter()
    step, last = 0, e0
    end = t0 + seconds
    while time.perf_counter() < end:
        work()
        now = nvml.energy_mj(handle)
        if now != last:
            step = now - last if step == 0 else min(step, now - last)
            last = now
    return (nvml.energy_mj(handle) - e0) / 1000.0, time.perf_counter() - t0, step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--device", type=int, default=0, help="NVML index = CUDA index with CUDA_DEVICE_ORDER=PCI_BUS_ID")
    parser.add_argument("--idle", action="store_true", help="also meter as long without load")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("no torch here", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        return 2
    try:
        nvml, via = open_nvml()
        handle = nvml.handle(args.device)
        name = nvml.name(handle)
        nvml.energy_mj(handle)
    except Exception as exc:  # noqa: BLE001 - report and exit
        print(f"energy counter unsupported: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    a = torch.randn(8192, 8192, device=f"cuda:{args.device}", dtype=torch.bfloat16)

    def busy() -> None:
        for _ in range(8):
            a @ a
        torch.cuda.synchronize(args.device)

    busy()  # warm-up (kernel selection) outside the metered window
    print(f"GPU {args.device}: {name}; NVML via {via}; torch {torch.__version__}")
    if args.idle:
        joules, elapsed, step = metered(nvml, handle, args.seconds, lambda: time.sleep(0.005))
        print(f"idle: {joules:.1f} J over {elapsed:.2f} s, mean {joules / elapsed:.0f} W (counter step {step} mJ)")
    joules, elapsed, step = metered(nvml, handle, args.seconds, busy)
    print(f"load: {joules:.1f} J over {elapsed:.2f} s of GPU load, mean {joules / elapsed:.0f} W "
          f"(counter step {step} mJ)")
    return 0 if joules > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
