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


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real single-node SLURM (munged + slurmctld + slurmd) shared by the session.

    See tests/slurm_cluster.py: installs the Debian packages if needed (root),
    keeps all state in a temp dir, always stops the daemons at session end.
    Skips when SLURM cannot be provided (not root and not installed, or
    SDBENCH_SLURM_TESTS=0).
    """
    import slurm_cluster as harness

    try:
        cluster = harness.start_cluster()
    except harness.SlurmUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield cluster
    finally:
        harness.stop_cluster(cluster)
        print(f"\n[slurm timing] stop: {cluster.timings.get('stop', 0.0):.1f} s")
