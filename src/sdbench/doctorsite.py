"""What every room of ``sdbench doctor`` reads (:class:`Site`): the checkout, the config with its
plan, the profile and ``--offline``; and which devices the grid uses (:func:`grid_uses`).

Apart from :mod:`sdbench.doctorcore` on purpose: the image gate's code digest holds doctorcore
(:mod:`sdbench.gpudriver` imports it), so what only the doctor needs lives here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Site:
    """What the checks read: the checkout, the config with its plan, the profile, --offline."""

    root: Path
    config_path: Path
    profile_dir: Path | None
    profile: dict[str, Any]
    offline: bool
    config: dict[str, Any] | None = None
    plan: Any = None


def grid_uses(site: Site, device: str) -> bool:
    """Whether the config's grid has a cell on an engine of ``device`` (``cuda``, ``cpu``)."""
    return site.config is not None and any(site.config["engines"][c.engine].get("device") == device
                                           for c in site.plan.cells)  # fmt: skip
