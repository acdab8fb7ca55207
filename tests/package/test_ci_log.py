"""The end of the CI log (.ci/slowest.py): the ten slowest test cases of pytest's JUnit XML,
slowest first, then the total split into bootstrap and pytest; .ci/run prints it after pytest."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("slowest", REPO / ".ci" / "slowest.py")
assert _spec is not None and _spec.loader is not None
slowest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(slowest)


def _junit(path: Path, times: dict[str, float]) -> Path:
    cases = "".join(f'<testcase classname="tests.e2e.test_x" name="{n}" file="tests/e2e/test_x.py" time="{t}"/>'
                    for n, t in times.items())  # fmt: skip
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    return path


def test_the_ten_slowest_come_slowest_first(tmp_path: Path) -> None:
    times = {f"t{i:02d}": float(i) for i in range(12)}  # t11 slowest, t00 and t01 left out
    got = slowest.slowest(_junit(tmp_path / "j.xml", times))
    assert [name for _, name in got] == [f"tests/e2e/test_x.py::t{i:02d}" for i in range(11, 1, -1)]
    assert got[0][0] == 11.0


def test_the_log_ends_with_the_total(tmp_path: Path) -> None:
    xml = _junit(tmp_path / "j.xml", {"a": 2.5, "b": 700.0})
    import time

    now = time.time()
    out = subprocess.run([sys.executable, str(REPO / ".ci" / "slowest.py"), str(xml), str(now - 100), str(now - 70)],
                         capture_output=True, text=True, check=True).stdout.strip().splitlines()  # fmt: skip
    assert out[1].split() == ["700.0", "s", "tests/e2e/test_x.py::b"] and out[2].split()[0] == "2.5"
    assert out[-1] == "== CI: total 100 s (bootstrap 30 s, pytest 70 s) =="
    missing = subprocess.run([sys.executable, str(REPO / ".ci" / "slowest.py"), str(tmp_path / "none.xml"),
                              str(now), str(now)], capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "pytest did not run" in missing


def test_ci_runs_the_readmes_command_then_the_summary() -> None:
    run = (REPO / ".ci" / "run").read_text()
    readme_command = "bash scripts/bootstrap.sh && .venv/bin/python -m pytest"
    assert readme_command in (REPO / "README.md").read_text()
    assert run.index("bootstrap.sh") < run.index(".venv/bin/python -m pytest") < run.rindex(".ci/slowest.py")
