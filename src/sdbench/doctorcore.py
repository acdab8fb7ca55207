"""What the checks of ``sdbench doctor`` share (:mod:`sdbench.doctor`, :mod:`sdbench.doctorslurm`):
the result of a check and its one line, running a command, a profile's resources and SLURM's
time limits."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

OK, FAILED, SKIPPED = "ok", "FAILED", "skipped"
COMMAND_TIMEOUT = 60.0


@dataclass(frozen=True)
class Result:
    """One check's outcome: ``status`` is ``ok``, ``FAILED`` or ``skipped``."""

    check: str
    status: str
    why: str = ""
    fix: str = ""

    @property
    def failed(self) -> bool:
        return self.status == FAILED

    def line(self) -> str:
        """``check | ok``, ``check | FAILED: why | how to fix`` or ``check | skipped: why``."""
        if self.status == OK:
            return f"{self.check} | ok"
        if self.status == SKIPPED:
            return f"{self.check} | skipped: {self.why}"
        return f"{self.check} | FAILED: {self.why} | {self.fix}"


def ok(check: str) -> Result:
    return Result(check, OK)


def failed(check: str, why: str, fix: str) -> Result:
    return Result(check, FAILED, why, fix)


def skipped(check: str, why: str) -> Result:
    return Result(check, SKIPPED, why)


def run_command(cmd: Sequence[str], timeout: float = COMMAND_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; a missing binary or a timeout comes back as returncode 127 / 124."""
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return subprocess.CompletedProcess(list(cmd), 127, "", f"{cmd[0]}: command not found")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(cmd), 124, "", f"{cmd[0]}: no answer within {timeout:.0f} s")


def resource_map(value: Any) -> dict[str, Any]:
    """``default-resources`` as a mapping (a profile may give it as ``["key=value", ...]``)."""
    if isinstance(value, Mapping):
        return dict(value)
    out: dict[str, Any] = {}
    for item in value or []:
        key, _, val = str(item).partition("=")
        out[key.strip()] = yaml.safe_load(val) if val else None
    return out


def set_resources(profile: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``set-resources`` as rule -> mapping (also from the ``["rule:key=value", ...]`` form)."""
    value = profile.get("set-resources") or {}
    if isinstance(value, Mapping):
        return {rule: dict(res or {}) for rule, res in value.items()}
    out: dict[str, dict[str, Any]] = {}
    for item in value:
        rule, _, rest = str(item).partition(":")
        out.setdefault(rule.strip(), {}).update(resource_map([rest]))
    return out


def parse_slurm_minutes(text: str) -> float | None:
    """A SLURM time limit in minutes; None for UNLIMITED/INFINITE.

    Formats (sbatch(1) --time): minutes, minutes:seconds, hours:minutes:seconds, days-hours,
    days-hours:minutes, days-hours:minutes:seconds.
    """
    text = text.strip()
    if text.upper() in ("UNLIMITED", "INFINITE", ""):
        return None
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
        parts = [int(p) for p in text.split(":")]
        h, m, s = (parts + [0, 0])[:3]
    else:
        parts = [int(p) for p in text.split(":")]
        if len(parts) == 1:
            h, m, s = 0, parts[0], 0
        elif len(parts) == 2:
            h, m, s = 0, parts[0], parts[1]
        else:
            h, m, s = parts[:3]
    return days * 1440 + h * 60 + m + s / 60


_UNITS = {"d": 1440, "h": 60, "m": 1, "min": 1, "s": 1 / 60}


def profile_minutes(value: Any) -> int:
    """A profile's ``runtime`` in minutes: a number, ``"90"``, ``"2h"``, ``"1h30m"`` or ``"1-00:00:00"``."""
    if isinstance(value, (int, float)):
        return int(value)
    text = str(value).strip().replace(" ", "")
    parts = re.findall(r"(\d+(?:\.\d+)?)(d|h|min|m|s)", text)
    if parts and "".join(n + u for n, u in parts) == text:
        return int(sum(float(n) * _UNITS[u] for n, u in parts))
    return int(parse_slurm_minutes(text) or 0)
