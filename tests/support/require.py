"""Skip where an input cannot exist here, fail where it must (under CI, ``CI`` is set).

A test that needs something the bootstrap installs (vLLM modules) or that ``.ci/run`` provides
(root for SLURM and tmpfs) must not pass silently as a skip in CI: a moved module has to fail the
upstream-bug detector, not skip it. The published traces never skip: ``tests/conftest.py`` fetches
them (pinned, sha256-checked) when ``../shared`` lacks them, and fails if it cannot.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

import pytest


def in_ci() -> bool:
    """Whether this is a CI run (``.ci/run`` sets ``CI``)."""
    return os.environ.get("CI", "") not in ("", "0", "false")


def require(condition: bool, reason: str) -> None:
    """Skip the test when ``condition`` is false; under CI, fail it instead."""
    if not condition:
        if in_ci():
            pytest.fail(f"required under CI: {reason}")
        pytest.skip(reason)


def import_or_fail(name: str) -> ModuleType:
    """``pytest.importorskip(name)``, but a failure under CI."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        require(False, f"cannot import {name}: {exc}")
        raise  # not reached: require skipped or failed


def shared_file(path: Path) -> Path:
    """``path`` in ``../shared``, which only this project's own checkouts have beside them (the GPU
    step tables): a user's clone skips the test with one line naming the file, CI fails it."""
    require(path.is_file(), f"shared data: {path} is missing (read-only input beside this project's own checkouts)")
    return path
