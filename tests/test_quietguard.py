"""The quiet-machine guard sees real busy processes (no mocks: it reads /proc)."""

from __future__ import annotations

import json
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


# ----------------------------------------------------------------------------- job scope

from pathlib import Path  # noqa: E402

from sdbench.engine.quietguard import JobScope, _cgroup2_mount, nvml_gpu_processes  # noqa: E402
from tests.support.doubles.nvml import NVMLDouble  # noqa: E402


def test_a_neighbour_on_another_gpu_is_not_contamination() -> None:
    """NVML double (no GPU here): the job holds GPU 1; a neighbour's engine runs on GPU 0."""
    nvml = NVMLDouble([("GPU-aaaa", [4242], 1000.0), ("GPU-bbbb", [], 70000.0)])
    assert nvml_gpu_processes(nvml, ["1"]) == (set(), 70000.0)
    assert nvml_gpu_processes(nvml, ["GPU-aaaa"])[0] == {4242}
    assert nvml_gpu_processes(nvml, None)[0] == {4242} and nvml.initialised == 0
    scope = JobScope("job", None, ["1"], frozenset(os.sched_getaffinity(0)))
    guard = QuietGuard("flag", interval=0.2, scope=scope, nvml=nvml)  # neighbours may share the CPU here
    guard.start()
    report = guard.stop()
    assert not report.gpu_others and report.gpu_free_mib == 70000.0
    nvml.devices[1] = ("GPU-bbbb", [4343], 60000.0)  # a process on the job's own GPU
    guard = QuietGuard("flag", interval=0.2, scope=scope, nvml=nvml)
    guard.start()
    report = guard.stop()
    assert report.gpu_others == {4343} and "other GPU processes: 4343" in report.columns()["contamination"]


_GUARD_IN_CGROUP = r"""
import json, os, sys, time
cgroup = sys.argv[1]
with open(os.path.join(cgroup, "cgroup.procs"), "w") as fh:  # this job's own cgroup
    fh.write(str(os.getpid()))
os.sched_setaffinity(0, {0})  # the job's core
from sdbench.engine.quietguard import QuietGuard
from sdbench.engine.quietguard import cgroup_pids
guard = QuietGuard("flag", interval=0.2)
guard.start()
time.sleep(3.0)
report = guard.stop()
inside = int(sys.argv[2])
print(json.dumps({"scope": report.scope, "busy": sorted(report.busy),
                  "members": sorted(cgroup_pids(guard.scope.cgroup)),
                  "inside_seen": [guard._first.get(inside), guard._last.get(inside)]}))
"""


def _burner(core: int) -> int:
    """A busy process outside this test's family, pinned to ``core``."""
    out = subprocess.run(
        ["bash", "-c", f"taskset -c {core} {sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, check=True,
    )
    return int(out.stdout.strip())


@pytest.fixture()
def job_cgroup():
    """A real cgroup v2 child for the job (needs a writable cgroup v2 hierarchy, e.g. root)."""
    mount = _cgroup2_mount()
    if mount is None or len(os.sched_getaffinity(0)) < 2 or not os.access(mount, os.W_OK):
        pytest.skip("no writable cgroup v2 hierarchy or fewer than 2 cores: cannot make a job cgroup")
    path = mount / f"sdbench-test-job-{os.getpid()}"
    try:
        path.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup v2 child: {exc}")
    yield path
    for pid in (path / "cgroup.procs").read_text().split():
        try:
            (mount / "cgroup.procs").write_text(pid)
        except OSError:
            pass
    path.rmdir()


def test_on_a_cluster_the_guard_judges_the_job_not_the_node(job_cgroup: Path) -> None:
    """A busy process outside the job's cgroup (on another core) is not flagged; one inside is."""
    outside, inside = _burner(1), _burner(1)
    try:
        (job_cgroup / "cgroup.procs").write_text(str(inside))
        time.sleep(0.3)
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
        env.pop("SLURM_JOB_ID", None)
        out = subprocess.run([sys.executable, "-c", _GUARD_IN_CGROUP, str(job_cgroup), str(inside)],
                             capture_output=True, text=True, check=True, env=env, timeout=60)  # fmt: skip
        seen = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        for pid in (outside, inside):
            os.kill(pid, signal.SIGKILL)
    assert seen["scope"] == "job"
    pids = {int(name.split()[0]) for name in seen["busy"]}
    assert inside in pids, seen
    assert outside not in pids, seen


def test_interim_judges_so_far_and_a_resumed_cell_inherits_it(busy_process) -> None:
    """What a killed job's guard had seen (kept with the cell's partial checkpoint) flags the cell
    that resumes it, whatever the resumed process sees."""
    guard = QuietGuard("refuse", interval=0.2)
    guard.start()
    time.sleep(1.0)
    seen = guard.interim()  # judged, not raised, still sampling
    assert seen.contaminated and any(name.startswith(f"{busy_process.pid} ") for name in seen.busy)
    assert guard._thread is not None and guard._thread.is_alive()
    with pytest.raises(Contaminated):
        guard.stop()
    later = QuietGuard("flag", interval=0.2)
    later.start()
    report = later.stop([seen])
    assert report.contaminated and report.samples == seen.samples + later.report.samples
    # The reasons name the 3 busiest processes (a shared machine may have busier ones): the orphan by busy.
    assert "engine process 1 of 2: busy processes: " in report.columns()["contamination"]
    assert any(name.startswith(f"{busy_process.pid} ") for name in report.busy)
