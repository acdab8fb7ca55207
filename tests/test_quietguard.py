"""The quiet-machine guard sees real busy processes (no mocks: it reads /proc)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from sdbench.engine.quietguard import Contaminated, QuietGuard, _is_engine, own_family


class Orphan:
    def __init__(self, pid: int) -> None:
        self.pid = pid


@pytest.fixture()
def busy_process():
    """A process outside this one's family (re-parented to init) that burns a CPU."""
    out = subprocess.run(
        ["bash", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, check=True,
    )
    orphan = Orphan(int(out.stdout.strip()))
    time.sleep(0.3)
    yield orphan
    os.kill(orphan.pid, signal.SIGKILL)


def test_busy_process_is_flagged(busy_process) -> None:
    guard = QuietGuard("flag", interval=0.2)
    guard.start()
    time.sleep(1.0)
    report = guard.stop()
    assert report.contaminated
    assert any(name.startswith(f"{busy_process.pid} ") for name in report.busy), report.busy
    columns = report.columns()
    assert columns["contaminated"] is True and "busy processes" in columns["contamination"]


def test_refuse_mode_raises(busy_process) -> None:
    guard = QuietGuard("refuse", interval=0.2)
    guard.start()
    time.sleep(1.0)
    with pytest.raises(Contaminated, match="busy processes"):
        guard.stop()


def test_a_timed_part_shorter_than_the_window_is_still_judged(busy_process) -> None:
    """Tiny cells time a few milliseconds: the guard observes for its window anyway."""
    guard = QuietGuard("refuse")  # the default 5 s interval: only the start and stop samples
    guard.start()
    with pytest.raises(Contaminated, match="busy processes"):
        guard.stop()


def test_disabled_mode_checks_nothing(busy_process) -> None:
    guard = QuietGuard("disabled")
    guard.start()
    time.sleep(0.3)
    report = guard.stop()
    assert not report.contaminated and report.samples == 0


def test_own_children_do_not_count() -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        assert child.pid in own_family()
        guard = QuietGuard("flag", interval=0.2)
        guard.start()
        time.sleep(0.8)
        report = guard.stop()
        assert not any(name.startswith(f"{child.pid} ") for name in report.busy)
    finally:
        child.kill()
        child.wait()


def test_engine_processes_are_recognised() -> None:
    assert _is_engine("/x/.venv/bin/python /x/.venv/bin/sdbench run-cell --spec {}")
    assert _is_engine("/x/.venv/bin/python /x/.venv/bin/sdbench run-group --spec {}")
    assert _is_engine("sdbench trace-group --spec {}")
    assert not _is_engine("sdbench trace-tables --group-dir x")
    assert _is_engine("python -m vllm.entrypoints.openai.api_server")
    assert _is_engine("VLLM::EngineCore")
    assert not _is_engine("python -m pytest tests")


def test_unknown_mode_is_a_config_error() -> None:
    from sdbench.config import ConfigError

    with pytest.raises(ConfigError, match="quiet guard mode 'sometimes'"):
        QuietGuard("sometimes")
