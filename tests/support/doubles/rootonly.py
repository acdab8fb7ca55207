"""Test double: a file only root may read (RAPL's energy_uj since CVE-2020-8694).

The tests run as root, so a chmod refuses nothing: the read itself raises the PermissionError an
unprivileged user gets.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


def refuse_reads(monkeypatch: pytest.MonkeyPatch, locked: Path) -> Callable[..., str]:
    """Make ``locked.read_text()`` raise EACCES (every other path reads as before); returns the real
    ``Path.read_text``, to put back mid-test."""
    real = Path.read_text

    def read_text(self: Path, *a: object, **k: object) -> str:
        if self == locked:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", read_text)
    return real
