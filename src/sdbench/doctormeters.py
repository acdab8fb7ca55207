"""The doctor's energy-meter checks for the engines it can meter that are not GPUs: RAPL for CPU engines.

``sdbench doctor`` checks NVML's counter for a grid with CUDA engines (``doctorgpu.gpu_meter_check``);
this module adds the CPU side: for a grid with CPU engines (``vllm-cpu``), is Linux powercap RAPL
there and readable (:func:`rapl_check`)? It reads what the run's meter reads
(:func:`sdbench.engine.measure.energy.rapl_meter`), so the doctor's line and a cell's ``energy_reason``
agree. Outcomes:

- ok: the package domains (and their ``dram`` subdomains, or that there are none) read;
- FAILED: the counters exist but cannot be read (root-only since CVE-2020-8694), with the fix (a
  ``chmod`` until reboot or a udev rule; docs/measurement.md, Energy); energy would be
  ``not measured`` on every CPU cell;
- skipped: no powercap RAPL at all (a VM, or a kernel without ``intel_rapl``): nothing a user can
  open, energy is ``not measured`` and says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sdbench.doctorcore import Result, failed, ok, skipped

RAPL_CHECK = "CPU energy meter (RAPL powercap)"
RAPL_FIX = ("make the counters readable: `sudo chmod o+r /sys/class/powercap/intel-rapl:*/energy_uj "
            "/sys/class/powercap/intel-rapl:*:*/energy_uj` (until reboot) or the udev rule of docs/measurement.md, "
            "Energy; else every CPU cell's energy is 'not measured'")  # fmt: skip


def rapl_check(root: Path | None = None) -> Result:
    """Whether a CPU engine's RAPL meter reads under ``root`` (default: /sys/class/powercap)."""
    from sdbench.engine.measure.energy import RAPL_ROOT, MeterUnavailable, rapl_domains, rapl_meter

    root = RAPL_ROOT if root is None else root
    try:
        rapl_meter(root)
    except MeterUnavailable as exc:
        why = str(exc)
        if why.startswith("no RAPL"):
            return skipped(RAPL_CHECK, f"{why}: CPU energy will be 'not measured'")
        return failed(RAPL_CHECK, why.split(" (root-only")[0] + " (root-only since CVE-2020-8694)", RAPL_FIX)
    packages, dram = rapl_domains(root)
    parts = ", ".join(d.name for d in packages)
    memory = f"; DRAM {', '.join(d.name for d in dram)}" if dram else "; no DRAM domain (package energy only)"
    return ok(f"{RAPL_CHECK}: packages {parts}{memory}")


def grid_uses(site: Any, device: str) -> bool:
    """Whether the site's grid has a cell on an engine of ``device`` (as ``doctorsite.grid_uses``)."""
    config = getattr(site, "config", None)
    return config is not None and any(config["engines"][c.engine].get("device") == device
                                      for c in site.plan.cells)  # fmt: skip


def meter_checks(site: Any, rapl_root: Path | None = None) -> list[Result]:
    """The meter checks beyond the GPU's: RAPL where the grid has CPU engines."""
    return [rapl_check(rapl_root)] if grid_uses(site, "cpu") else []
