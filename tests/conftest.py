"""Shared test fixtures."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.doubles import cpuisa

REPO = Path(__file__).resolve().parents[1]
# SDBENCH_TEST_CPU_ISA=avx2: this process's vLLM loads the kernels of a CPU without AVX-512
# (support/doubles/cpuisa.py), before any test module imports vLLM.
cpuisa.pretend_from_environment()
# Read-only data shared beside the repository (never copied into it).
SHARED = REPO.parent / "shared"
PUBLISHED_TRACES = SHARED / "data" / "published-traces" / "llama3.1-8B"


# The two published traces the tests read (sharegpt and cnn are held-out evaluation: never fetched).
PUBLISHED_DATASETS = ("gsm8k", "instructcoder")
# Where they are fetched to when ../shared lacks them (SDBENCH_TRACES_CACHE overrides).
TRACES_CACHE_ENV = "SDBENCH_TRACES_CACHE"


def traces_cache_dir() -> Path:
    """Cache of the fetched published traces, per pinned commit: ``$SDBENCH_TRACES_CACHE``,
    else ``$XDG_CACHE_HOME/sdbench/published-traces/<commit>`` (``~/.cache`` by default)."""
    import os

    from sdbench.traces.fetch import SIMULATOR_COMMIT

    if os.environ.get(TRACES_CACHE_ENV):
        return Path(os.environ[TRACES_CACHE_ENV])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "sdbench" / "published-traces" / SIMULATOR_COMMIT[:12]


@pytest.fixture(scope="session")
def published_traces_dir() -> Path:
    """Directory holding the paper's published traces (gsm8k, instructcoder), sha256-checked.

    ``../shared`` when it holds them with the pinned sha256; otherwise they are fetched from the pinned commit into
    :func:`traces_cache_dir` (sdbench.traces.fetch; a file already there with the pinned hash is
    kept). Neither: the tests fail with one line naming the URL, never skip.
    """
    from sdbench.traces.fetch import PUBLISHED_SHA256, fetch_published_traces, sha256_file

    shared = [PUBLISHED_TRACES / f"combined_{d}.jsonl" for d in PUBLISHED_DATASETS]
    if all(p.is_file() and sha256_file(p) == PUBLISHED_SHA256[d] for p, d in zip(shared, PUBLISHED_DATASETS)):
        return PUBLISHED_TRACES

    cache = traces_cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        for dataset in PUBLISHED_DATASETS:
            fetch_published_traces(dataset, cache / f"combined_{dataset}.jsonl", PUBLISHED_TRACES)
    except (OSError, ValueError) as exc:  # DownloadError, ChecksumError
        problem = str(exc)
    else:
        return cache
    # Outside the except block: one line, without the chained traceback.
    pytest.fail(f"published traces: not in {PUBLISHED_TRACES} nor fetchable into {cache}: {problem}", pytrace=False)


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


@contextlib.contextmanager
def live_cluster(**kwargs: Any) -> Iterator[Any]:
    """A started SLURM cluster (``start_cluster(**kwargs)``), stopped on exit.

    Skips when SLURM cannot be provided (not root and not installed, or
    SDBENCH_SLURM_TESTS=0); under CI that fails (support.require).
    """
    from support import slurm_cluster as harness

    from support.require import require

    try:
        cluster = harness.start_cluster(**kwargs)
    except harness.SlurmUnavailable as exc:
        require(False, str(exc))
    try:
        yield cluster
    finally:
        harness.stop_cluster(cluster)


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real single-node SLURM (munged + slurmctld + slurmd) shared by the session.

    See tests/support/slurm_cluster.py: installs the Debian packages if needed (root),
    keeps all state in a temp dir, always stops the daemons at session end (live_cluster).
    """
    with live_cluster() as cluster:
        yield cluster
    print(f"\n[slurm timing] stop: {cluster.timings.get('stop', 0.0):.1f} s")


@pytest.fixture(scope="session")
def tiny_target_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tokenizer and tiny-target of .test/config/faults.yaml, built once for every slow test
    whose config builds them alike (support/tinybuild.py; ``seed`` copies them into a workdir)."""
    from support import tinybuild

    return tinybuild.build(tmp_path_factory.mktemp("tiny-target-build"))
