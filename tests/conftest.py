"""Shared test fixtures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
# Read-only data shared beside the repository (never copied into it).
SHARED = REPO.parent / "shared"
PUBLISHED_TRACES = SHARED / "data" / "published-traces" / "llama3.1-8B"


@pytest.fixture(scope="session")
def published_traces_dir() -> Path:
    """Directory holding the paper's published traces (gsm8k, instructcoder)."""
    from support.require import require

    require(PUBLISHED_TRACES.is_dir(), f"published traces not found at {PUBLISHED_TRACES}")
    return PUBLISHED_TRACES


@pytest.fixture
def offline_hub(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """No hub access, and the Arrow cache in a temporary directory instead of ~/.cache.

    ``datasets`` and ``huggingface_hub`` read these variables when first imported, which
    another test module may already have done in this process, so their module-level
    settings are set too; any accidental hub request then fails at once instead of timing out.
    """
    import datasets.config
    import huggingface_hub.constants

    cache = tmp_path_factory.mktemp("hf-datasets-cache")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen3-like tokenizer (chat template with thinking) saved by the tests themselves."""
    from support.datasets_tokenizers import save_qwen3_like

    return save_qwen3_like(tmp_path_factory.mktemp("qwen3-tokenizer"))


@pytest.fixture(scope="module")
def qwen3(qwen3_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen3_dir)  # as `sdbench prepare-dataset` loads it


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real single-node SLURM (munged + slurmctld + slurmd) shared by the session.

    See tests/support/slurm_cluster.py: installs the Debian packages if needed (root),
    keeps all state in a temp dir, always stops the daemons at session end.
    Skips when SLURM cannot be provided (not root and not installed, or
    SDBENCH_SLURM_TESTS=0); under CI that fails (support.require).
    """
    from support import slurm_cluster as harness

    from support.require import require

    try:
        cluster = harness.start_cluster()
    except harness.SlurmUnavailable as exc:
        require(False, str(exc))
    try:
        yield cluster
    finally:
        harness.stop_cluster(cluster)
        print(f"\n[slurm timing] stop: {cluster.timings.get('stop', 0.0):.1f} s")
