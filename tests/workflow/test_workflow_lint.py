"""The workflow passes Snakemake's linter and snakefmt, as the Workflow Catalog checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs snakemake --lint and snakefmt on the workflow

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_snakemake_lint_is_clean() -> None:
    result = subprocess.run([str(BIN / "snakemake"), "--lint"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_snakefmt_check_is_clean() -> None:
    result = subprocess.run(
        [str(BIN / "snakefmt"), "--check", "Snakefile", "workflow"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
