"""Shared test fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Read-only data shared beside the repository (never copied into it).
SHARED = REPO.parent / "shared"
PUBLISHED_TRACES = SHARED / "data" / "published-traces" / "llama3.1-8B"


@pytest.fixture(scope="session")
def published_traces_dir() -> Path:
    """Directory holding the paper's published traces (gsm8k, instructcoder)."""
    if not PUBLISHED_TRACES.is_dir():
        pytest.skip(f"published traces not found at {PUBLISHED_TRACES}")
    return PUBLISHED_TRACES
