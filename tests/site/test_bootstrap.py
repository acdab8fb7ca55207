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
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.require import require

REPO = Path(__file__).resolve().parents[2]
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


# --- no Python 3.11 on PATH: uv fetches one -------------------------------------------------------
UV = Path(sys.executable).parent / "uv"  # the venv's real uv binary
DOUBLES = REPO / "tests" / "support" / "doubles"
NOT_3_11 = ("python", "pydoc", "pip", "uv", "idle", "2to3")


def _machine_path(tmp_path: Path, python3: Path, uv: Path | None) -> str:
    """A PATH like Ubuntu 24.04's: the system's tools, ``python3`` = ``python3`` given (a 3.12), no
    python3.11 anywhere, and ``uv`` only when given."""
    bin_dir = tmp_path / "machine-bin"
    bin_dir.mkdir()
    for directory in ("/usr/local/bin", "/usr/bin", "/bin"):
        for tool in sorted(Path(directory).glob("*")) if Path(directory).is_dir() else []:
            if not tool.name.startswith(NOT_3_11) and not (bin_dir / tool.name).exists():
                (bin_dir / tool.name).symlink_to(tool)
    (bin_dir / "python3").symlink_to(python3)
    if uv is not None:
        (bin_dir / "uv").symlink_to(uv)
    return str(bin_dir)


def _readme_command_1(cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", "bash scripts/bootstrap.sh && .venv/bin/snakemake --profile profiles/local"],
                          cwd=cwd, capture_output=True, text=True, timeout=900, env=env)  # fmt: skip


def _script_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "clone"
    for name in ("scripts/bootstrap.sh", "requirements/lock.txt", "requirements/test.txt", "pyproject.toml"):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, copy / name)
    return copy


def _python_312() -> Path:
    """A real CPython 3.12 of this machine (the test needs one only to pip-install uv)."""
    found = sorted(Path("/root/.pyenv/versions").glob("3.12*/bin/python3.12")) + [
        Path(p) for p in (shutil.which("python3.12"),) if p]  # fmt: skip
    require(bool(found), "no CPython 3.12 on this machine to stand for Ubuntu 24.04's python3")
    return found[0]


def test_only_python_3_12_on_path_and_uv_cannot_fetch_one_line(tmp_path: Path) -> None:
    """README command 1 where python3 is 3.12 (a stand-in reporting 3.12) and uv is on PATH but
    fetches nothing (UV_PYTHON_INSTALL_MIRROR: an empty mirror, as GitHub is unreachable here):
    one line naming the interpreter, uv's error and what to do; nothing after it runs."""
    stand_in = tmp_path / "python3.12-stand-in"  # test double: an interpreter that reports 3.12
    stand_in.write_text("#!/bin/sh\necho 3.12\n")
    stand_in.chmod(0o755)
    mirror = tmp_path / "empty-mirror"
    mirror.mkdir()
    env = _user_env(PATH=_machine_path(tmp_path, stand_in, UV), HOME=str(tmp_path / "home"),
                    UV_PYTHON_INSTALL_DIR=str(tmp_path / "uv-python"), UV_CACHE_DIR=str(tmp_path / "uv-cache"),
                    UV_PYTHON_INSTALL_MIRROR=mirror.as_uri())  # fmt: skip
    copy = _script_copy(tmp_path)
    done = _readme_command_1(copy, env)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert re.fullmatch(uv_failed(mirror), lines[0]), lines[0]
    assert not (copy / ".venv").exists()


def uv_failed(mirror: Path) -> str:
    """The bootstrap's one line when uv cannot fetch CPython 3.11 from ``mirror`` (a regex)."""
    return (
        r"bootstrap: python3 is Python 3\.12; sdbench needs Python 3\.11, and uv could not fetch CPython 3\.11 "
        r"\(Failed to install cpython-3\.11\.\d+-linux-x86_64-gnu: failed to query metadata of file `"
        + re.escape(str(mirror)) + r"/[^`]+`: No such file or directory \(os error 2\)\); install python3\.11 "
        r"\(your distribution's, or 'uv python install 3\.11'\) and run PYTHON=python3\.11 bash scripts/bootstrap\.sh, "
        r"or set UV_PYTHON_INSTALL_MIRROR to a mirror of python-build-standalone"
    )


@pytest.mark.slow  # pip-installs uv from PyPI with a real Python 3.12
def test_only_python_3_12_and_no_uv_pip_installs_uv_then_stops_in_one_line(tmp_path: Path) -> None:
    """Ubuntu 24.04 as it comes, simulated: python3 is a real CPython 3.12 with pip, no uv: the
    bootstrap pip-installs uv (PyPI) and uv's fetch fails (an empty mirror): the same one line."""
    mirror = tmp_path / "empty-mirror"
    mirror.mkdir()
    env = _user_env(PATH=_machine_path(tmp_path, _python_312(), None), HOME=str(tmp_path / "home"),
                    UV_PYTHON_INSTALL_DIR=str(tmp_path / "uv-python"), UV_CACHE_DIR=str(tmp_path / "uv-cache"),
                    UV_PYTHON_INSTALL_MIRROR=mirror.as_uri())  # fmt: skip
    done = _readme_command_1(_script_copy(tmp_path), env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert re.fullmatch(uv_failed(mirror), lines[0]), lines[0]


@pytest.mark.slow  # creates a venv and pip-installs uv into it
def test_uv_fetched_python_makes_the_venv(tmp_path: Path) -> None:
    """What a fetch gives (the uv test double answers for GitHub with a real CPython 3.11 of this
    machine): the venv is made from it and the bootstrap goes on (here to the torch index, empty,
    where it stops in its own one line)."""
    stand_in = tmp_path / "python3.12-stand-in"  # test double: an interpreter that reports 3.12
    stand_in.write_text("#!/bin/sh\necho 3.12\n")
    stand_in.chmod(0o755)
    real_311 = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    empty = tmp_path / "empty-index"
    empty.mkdir()
    (empty / "index.html").write_text("<html><body></body></html>\n")
    env = _user_env(PATH=_machine_path(tmp_path, stand_in, DOUBLES / "uv-python" / "uv"), HOME=str(tmp_path / "h"),
                    SDBENCH_UV_DOUBLE_PYTHON=str(real_311), TORCH_INDEX_URL=empty.as_uri())  # fmt: skip
    copy = _script_copy(tmp_path)
    done = _readme_command_1(copy, env)
    lines = done.stderr.strip().splitlines()
    assert lines[0] == ("bootstrap: python3 is Python 3.12; sdbench needs Python 3.11: uv fetched "
                        "+ cpython-3.11.7-linux-x86_64-gnu"), done.stderr  # fmt: skip
    version = subprocess.run([str(copy / ".venv" / "bin" / "python"), "-c", "import sys; print(sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert version == "(3, 11)"
    assert done.returncode != 0 and lines[-1].startswith(f"bootstrap: {TORCH_PIN} is on no index here"), done.stderr
