"""README command 1's set-up step as it runs on a user's machine: ``scripts/bootstrap.sh``.

The machines the suite runs on keep the pinned CPU torch wheel in a pip find-links directory;
a user's machine has PyPI (which cannot hold ``+cpu`` builds) and the PyTorch CPU index. The slow
tests run the bootstrap in a clean copy of the repository with pip's configuration hidden
(``PIP_CONFIG_FILE=/dev/null``, no find-links): once against an index with no torch (it must stop
in one line naming the wheel and the index to use), then against a local PEP 503 index
(``file://``) that holds the wheel (it must install from it and import vLLM). The Python check is
a fast test with a stand-in interpreter of another version.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.require import require

REPO = Path(__file__).resolve().parents[1]
BOOTSTRAP = REPO / "scripts" / "bootstrap.sh"
TORCH_PIN = next(line for line in (REPO / "requirements" / "lock.txt").read_text().splitlines() if line.startswith("torch=="))
TORCH_VERSION = TORCH_PIN.split("==", 1)[1]
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _user_env(**extra: str) -> dict[str, str]:
    """This process's environment as a user's shell would have it: no pip or uv settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "VIRTUAL_ENV", "TORCH_INDEX"))}
    env.update(PIP_CONFIG_FILE=os.devnull, **extra)
    return env


def _clean_copy(dest: Path) -> Path:
    """The repository's tracked files (as a fresh clone has them) under ``dest``."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    for name in filter(None, files.split("\0")):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def _torch_wheel(cache: Path) -> Path:
    """The pinned torch wheel for this Python: from a find-links directory, else downloaded from
    the PyTorch CPU index into ``cache``."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    pattern = f"torch-{TORCH_VERSION}-{tag}-*.whl"
    configured = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True, text=True
    ).stdout.split()
    for directory in [*os.environ.get("PIP_FIND_LINKS", "").split(), *configured]:
        found = sorted(Path(directory).glob(pattern))
        if found:
            return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(cache), TORCH_PIN,
         "--index-url", PYTORCH_CPU_INDEX],
        capture_output=True, text=True,
    )
    found = sorted(cache.glob(pattern))
    require(bool(found), f"{pattern} is in no find-links directory and {PYTORCH_CPU_INDEX} is unreachable")
    return found[0]


def _pep503_index(root: Path, wheel: Path) -> str:
    """A PEP 503 simple index at ``root`` holding ``wheel`` (torch only); its file:// URL."""
    project = root / "torch"
    project.mkdir(parents=True)
    (project / wheel.name).symlink_to(wheel)
    (project / "index.html").write_text(f'<html><body><a href="{wheel.name}">{wheel.name}</a></body></html>\n')
    (root / "index.html").write_text('<html><body><a href="torch/">torch</a></body></html>\n')
    return root.as_uri()


@pytest.mark.slow  # creates a virtualenv and installs the whole lock (uv's cache makes it ~1-2 min)
def test_bootstrap_installs_torch_from_the_torch_index_with_pip_config_hidden(tmp_path: Path) -> None:
    copy = _clean_copy(tmp_path / "clone")
    empty = tmp_path / "empty-index"
    empty.mkdir()
    (empty / "index.html").write_text("<html><body></body></html>\n")

    # No index holds the wheel: one line naming it and the index to use, non-zero exit.
    failed = subprocess.run(
        ["bash", "scripts/bootstrap.sh"], cwd=copy, capture_output=True, text=True, timeout=900,
        env=_user_env(TORCH_INDEX_URL=empty.as_uri()),
    )
    assert failed.returncode != 0
    lines = failed.stderr.strip().splitlines()
    assert len(lines) == 1, failed.stderr
    assert lines[0].startswith(f"bootstrap: {TORCH_PIN} is on no index here")
    assert PYTORCH_CPU_INDEX in lines[0] and "TORCH_INDEX_URL" in lines[0]

    # A file:// index with the wheel (what the PyTorch CPU index is to a user): installs, vLLM imports.
    index = _pep503_index(tmp_path / "torch-index", _torch_wheel(tmp_path / "wheel-cache"))
    done = subprocess.run(
        ["bash", "scripts/bootstrap.sh"], cwd=copy, capture_output=True, text=True, timeout=1800,
        env=_user_env(TORCH_INDEX_URL=index),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith("bootstrap: .venv ready (vllm ")
    probe = subprocess.run(
        [str(copy / ".venv" / "bin" / "python"), "-c", "import torch, vllm; print(torch.__version__)"],
        capture_output=True, text=True, check=True,
    )
    assert probe.stdout.strip() == TORCH_VERSION


def test_a_python_of_another_version_gets_one_line(tmp_path: Path) -> None:
    # Test double: an interpreter that reports Python 3.10 (a stock Ubuntu 22.04 python3).
    stand_in = tmp_path / "python3.10-stand-in"
    stand_in.write_text("#!/bin/sh\necho 3.10\n")
    stand_in.chmod(0o755)
    for name in ("scripts/bootstrap.sh", "requirements/lock.txt", "pyproject.toml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, tmp_path / name)
    done = subprocess.run(
        ["bash", "scripts/bootstrap.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env=_user_env(PYTHON=str(stand_in)),
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"bootstrap: {stand_in} is Python 3.10; sdbench needs Python 3.11 (install one, e.g. 'uv python install 3.11' "
        "or your distribution's python3.11, then run PYTHON=python3.11 bash scripts/bootstrap.sh)"
    ]
    assert not (tmp_path / ".venv").exists()
