"""sdbench installed from its wheel, as the Apptainer images install it, finds its package data.

The module fixture builds the wheel, creates a fresh virtualenv outside the repository and
installs the wheel with its declared runtime dependencies pinned to ``requirements/lock.txt``
(so a dependency missing from ``pyproject.toml`` fails here too). The installed ``sdbench`` then
runs from a working directory that is not the repository, so nothing can be found through the
checkout. About 30 s, nearly all of it ``pip install`` (pip's cache makes the wheels local).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sdbench.cli import main

pytestmark = pytest.mark.slow  # builds the wheel and a fresh virtualenv

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements" / "lock.txt"
PACKAGE = REPO / "src" / "sdbench"
DATA_DIR_ENV = "SDBENCH_DATA_DIR"
COST_MODEL = "llama3.1-8b-h100"
L31_8B = "meta-llama/Llama-3.1-8B-Instruct"
EAGLE_8B = "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"


def _run(cmd: list[str | os.PathLike[str]], **kw: object) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; on failure show its output (pip's reasons are in it)."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


class Installed:
    """A fresh virtualenv holding the sdbench wheel."""

    def __init__(self, venv: Path, wheel: Path, cwd: Path) -> None:
        self.venv, self.wheel, self.cwd = venv, wheel, cwd

    def sdbench(self, *args: str | os.PathLike[str], data_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run the installed ``sdbench`` console script from a directory outside the repository."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", DATA_DIR_ENV)}
        if data_dir is not None:
            env[DATA_DIR_ENV] = str(data_dir)
        cmd = [self.venv / "bin" / "sdbench", *args]
        return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=self.cwd, env=env)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("installed")
    # Build from a copy of what the image definitions copy to /opt/sdbench (src/, pyproject.toml,
    # README.md): an in-tree build would leave build/ and *.egg-info in the checkout.
    tree = work / "tree"
    shutil.copytree(PACKAGE, tree / "src" / "sdbench", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, tree / name)
    dist = work / "dist"
    # --no-build-isolation: the build uses the setuptools pinned in the test's venv, offline.
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, tree])
    (wheel,) = dist.glob("sdbench-*.whl")
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    # The fresh venv has no pip of its own; this venv's pip installs into it (--python).
    _run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q", wheel, "-c", LOCK])
    cwd = work / "elsewhere"
    cwd.mkdir()
    return Installed(venv, wheel, cwd)


def test_wheel_carries_every_data_file(installed: Installed) -> None:
    shipped = {
        p.relative_to(PACKAGE.parent).as_posix()
        for sub in ("data", "schemas")
        for p in (PACKAGE / sub).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert shipped >= {f"sdbench/data/cost_models/{COST_MODEL}.yaml", "sdbench/schemas/config.schema.yaml"}
    with zipfile.ZipFile(installed.wheel) as whl:
        assert shipped <= set(whl.namelist())


def test_imports_the_installed_copy(installed: Installed) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import sdbench; print(sdbench.__file__)"
    out = _run([installed.venv / "bin" / "python", "-c", code], cwd=installed.cwd, env=env).stdout.strip()
    assert Path(out).is_relative_to(installed.venv), out
    assert not Path(out).is_relative_to(REPO), out


def test_memory(installed: Installed) -> None:
    proc = installed.sdbench("memory", "--target", L31_8B, "--draft", EAGLE_8B)
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    # Paper Tab. 2 / Tab. 3 and the exact counts of tests/analysis/test_memory.py.
    assert round(rep["static_gib"], 2) == 15.43 and rep["per_token_kib"] == 132
    assert rep["method"] == "eagle"
    assert rep["target_params"] == 8_030_261_248 and rep["draft_params"] == 251_662_336
    assert rep["breakdown"]["draft_shared_with_target"] == ["embed_tokens", "lm_head"]
    assert all(Path(src).is_relative_to(installed.venv) for src in rep["sources"].values()), rep["sources"]


def _tiny_trace(path: Path) -> Path:
    """Four requests in the published-trace form (``acc_len`` = accepted drafts + 1, so >= 1)."""
    rows = []
    for i in range(4):
        n = 12 + i
        rows.append(
            {
                "id": f"r{i}",
                "prompt_token_ids": list(range(5 + i)),
                "generated_token_ids": [(7 * j + i) % 11 for j in range(n)],
                "acc_ngram": {"acc_len": [1 + (j + i) % 3 for j in range(n)]},
                "acc_eagle": {"acc_len": [1 + (j * (i + 1)) % 4 for j in range(n)]},
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


SIM_ARGS = ("--proposer", "eagle", "--policy", "fixed-1", "fixed-3", "oracle", "--batch-sizes", "1", "4")
SIM_ARGS += ("--num-requests", "0")


def test_simulate_matches_the_checkout(installed: Installed, tmp_path: Path) -> None:
    trace = _tiny_trace(tmp_path / "combined_tiny.jsonl")
    out = tmp_path / "installed.csv"
    proc = installed.sdbench("simulate", "--traces", trace, *SIM_ARGS, "--cost-model", COST_MODEL, "--output", out)
    assert proc.returncode == 0, proc.stderr
    ref = tmp_path / "checkout.csv"
    assert main(["simulate", "--traces", str(trace), *SIM_ARGS, "--cost-model", COST_MODEL, "--output", str(ref)]) == 0
    got = pd.read_csv(out)
    assert len(got) == 6 and set(got["cost_model"]) == {COST_MODEL} and (got["speedup"] > 1).all()
    pd.testing.assert_frame_equal(got, pd.read_csv(ref))


def test_override_dir_adds_a_cost_model(installed: Installed, tmp_path: Path) -> None:
    shipped = yaml.safe_load((PACKAGE / "data" / "cost_models" / f"{COST_MODEL}.yaml").read_text())
    override = tmp_path / "override"
    (override / "cost_models").mkdir(parents=True)
    (override / "cost_models" / "only-here.yaml").write_text(yaml.safe_dump({**shipped, "name": "only-here"}))
    proc = installed.sdbench("costmodel", "show", "only-here", data_dir=override)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["name"] == "only-here"
    trace = _tiny_trace(tmp_path / "combined_tiny.jsonl")
    out = tmp_path / "out.csv"
    args = ("simulate", "--traces", trace, *SIM_ARGS, "--cost-model", "only-here", "--output", out)
    proc = installed.sdbench(*args, data_dir=override)
    assert proc.returncode == 0, proc.stderr
    assert set(pd.read_csv(out)["cost_model"]) == {"only-here"}
    # The shipped architecture configs stay visible beside the override (no models/ there).
    assert installed.sdbench("memory", "--target", L31_8B, data_dir=override).returncode == 0
    # Without the override the name is unknown.
    proc = installed.sdbench("costmodel", "show", "only-here")
    assert proc.returncode != 0 and "no cost model named 'only-here'" in proc.stderr


def test_missing_override_dir_is_a_one_line_error(installed: Installed, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    trace = _tiny_trace(tmp_path / "combined_tiny.jsonl")
    args = ("simulate", "--traces", trace, *SIM_ARGS, "--output", tmp_path / "out.csv")
    proc = installed.sdbench(*args, data_dir=missing)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"error: {DATA_DIR_ENV}={missing}: no such directory "
        "(it should hold cost_models/ and/or models/, like sdbench/data; unset it to use the shipped data)"
    ]
