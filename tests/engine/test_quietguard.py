"""The quiet-machine guard sees real busy processes (no mocks: it reads /proc)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from sdbench.engine.site.quietguard import Contaminated, QuietGuard, _is_engine, own_family


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

from sdbench.engine.site.quietguard import (  # noqa: E402
    JobScope,
    cgroup_members,
    host_job_cgroup,
    job_scope,
    nvml_gpu_processes,
)
from tests.support.doubles.nvml import NVMLDouble  # noqa: E402
from tests.support.require import require  # noqa: E402


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
step = sys.argv[1]
with open(os.path.join(step, "cgroup.procs"), "w") as fh:  # this task's cgroup (an srun step's)
    fh.write(str(os.getpid()))
os.sched_setaffinity(0, {0})  # the job's core
from sdbench.engine.site.quietguard import QuietGuard, cgroup_members
guard = QuietGuard("flag", interval=0.2)
guard.start()
time.sleep(3.0)
report = guard.stop()
print(json.dumps({"scope": report.scope, "cgroup": report.cgroup, "busy": sorted(report.busy),
                  "members": sorted(cgroup_members(guard.scope.cgroup)) if guard.scope.cgroup else []}))
"""


def _burner(core: int) -> int:
    """A busy process outside this test's family, pinned to ``core``."""
    out = subprocess.run(
        ["bash", "-c", f"taskset -c {core} {sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, check=True,
    )
    return int(out.stdout.strip())


def _cgroup2_mount() -> Path | None:
    """Where this machine mounts its cgroup v2 hierarchy (the test makes a job's cgroups there)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[:1] == ["cgroup2"]:
            return Path(left.split()[4])
    return None


@pytest.fixture()
def job_cgroup():
    """A real cgroup v2 tree of a SLURM job, ``<root>/job_4242/{step_0,step_batch}`` (needs a
    writable cgroup v2 hierarchy, e.g. root); yields the job's directory."""
    mount = _cgroup2_mount()
    # CI (.ci/run: root) has one; a skip there would hide the job-scope guard, so require() fails it.
    require(mount is not None and len(os.sched_getaffinity(0)) >= 2 and os.access(mount, os.W_OK),
            "no writable cgroup v2 hierarchy or fewer than 2 cores: cannot make a job cgroup")  # fmt: skip
    root = mount / f"sdbench-test-{os.getpid()}"
    job = root / "job_4242"
    try:
        for path in (root, job, job / "step_0", job / "step_batch"):
            path.mkdir()
    except OSError as exc:
        require(False, f"cannot create cgroup v2 children: {exc}")
    yield job
    for path in (job / "step_0", job / "step_batch", job, root):
        for pid in (path / "cgroup.procs").read_text().split():
            try:
                (mount / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        path.rmdir()


def test_under_srun_the_guard_judges_the_job_not_the_step_or_the_node(job_cgroup: Path) -> None:
    """The guard runs in an srun task's cgroup (step_0); a busy process in another step of the
    job (step_batch) is flagged, one outside the job (on another core) is not."""
    outside, inside = _burner(1), _burner(1)
    try:
        (job_cgroup / "step_batch" / "cgroup.procs").write_text(str(inside))
        time.sleep(0.3)
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"), "SLURM_JOB_ID": "4242"}
        env.pop("SDBENCH_JOB_CGROUP", None)
        out = subprocess.run([sys.executable, "-c", _GUARD_IN_CGROUP, str(job_cgroup / "step_0")],
                             capture_output=True, text=True, check=True, env=env, timeout=60)  # fmt: skip
        seen = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        for pid in (outside, inside):
            os.kill(pid, signal.SIGKILL)
    mount = _cgroup2_mount()
    assert seen["scope"] == "job" and seen["cgroup"] == "/" + str(job_cgroup.relative_to(mount)), seen
    assert inside in seen["members"] and outside not in seen["members"], seen
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


# ----------------------------------------------------------------------------- a /proc seen from a container


def _proc(root: Path, cgroups: dict[str, str], mountinfo: str = "") -> Path:
    """A /proc tree with ``<pid>/cgroup`` per entry (``self`` too) and ``self/mountinfo``."""
    for pid, text in cgroups.items():
        (root / pid).mkdir(parents=True)
        (root / pid / "cgroup").write_text(text)
    (root / "self" / "mountinfo").write_text(mountinfo)
    return root


# What Apptainer's setuid mode shows a job: the host's /proc (no PID or cgroup namespace) and a
# fresh sysfs with no cgroup filesystem mounted (mountinfo lists no cgroup2, /sys/fs/cgroup empty).
SETUID_MOUNTINFO = (
    "612 611 0:52 / / ro,nodev,relatime master:1 - squashfs /dev/loop3 ro\n"
    "620 612 0:5 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n"
    "621 612 0:53 / /sys rw,nosuid,nodev,relatime - sysfs sysfs rw\n"
)
JOB = "/system.slice/slurmstepd.scope/job_42"


def test_in_a_setuid_container_the_job_cgroup_is_found_without_a_cgroup_mount(tmp_path: Path) -> None:
    proc = _proc(tmp_path / "proc", {
        "self": f"0::{JOB}/step_0/user/task_0\n",
        "101": f"0::{JOB}/step_batch/user/task_0\n",  # the job's batch step (its workflow)
        "102": f"0::{JOB}/step_0/user/task_0\n",  # a sibling in the task's cgroup
        "103": "0::/system.slice/slurmstepd.scope/job_43/step_0/user/task_0\n",  # another job
        "104": "0::/system.slice/slurmstepd.scope/job_420/step_0\n",  # job_420 is not job_42
        "105": "0::/system.slice/sshd.service\n",
    }, SETUID_MOUNTINFO)  # fmt: skip
    (tmp_path / "sys" / "fs" / "cgroup").mkdir(parents=True)  # the container's empty /sys/fs/cgroup
    scope = job_scope({"SLURM_JOB_ID": "42"}, proc_root=proc)
    assert scope.kind == "job" and str(scope.cgroup) == JOB
    assert cgroup_members(scope.cgroup, proc) == {101, 102}
    # Found on the host before the container started (a cgroup namespace would hide it).
    host = _proc(tmp_path / "host", {"self": f"0::{JOB}/step_batch/user/task_0\n"})
    assert host_job_cgroup({"SLURM_JOB_ID": "42"}, host) == JOB
    inside = _proc(tmp_path / "ns", {"self": "0::/\n"})
    assert str(job_scope({"SLURM_JOB_ID": "42", "SDBENCH_JOB_CGROUP": JOB}, proc_root=inside).cgroup) == JOB
    assert job_scope({"SLURM_JOB_ID": "42"}, proc_root=inside).cgroup is None  # GPUs and cores only


def test_cgroup_v1_jobs_and_a_workstation_session(tmp_path: Path) -> None:
    v1 = "12:memory:/slurm/uid_1000/job_7/step_0/task_0\n11:cpuset:/slurm/uid_1000/job_7/step_0\n0::/\n"
    proc = _proc(tmp_path / "proc", {"self": v1, "9": "12:memory:/slurm/uid_1000/job_7/step_batch\n0::/\n",
                                     "10": "12:memory:/slurm/uid_1000/job_8/step_0\n0::/\n"})  # fmt: skip
    scope = job_scope({"SLURM_JOB_ID": "7"}, proc_root=proc)
    assert str(scope.cgroup) == "memory:/slurm/uid_1000/job_7"  # the first hierarchy naming the job
    assert cgroup_members(scope.cgroup, proc) == {9}
    # A systemd login session has a cgroup of its own: the workstation is still judged as a node.
    desk = _proc(tmp_path / "desk", {"self": "0::/user.slice/user-1000.slice/session-3.scope\n"},
                 "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")  # fmt: skip
    assert job_scope({}, proc_root=desk) == JobScope("node")
    report = QuietGuard("flag", scope=job_scope({}, proc_root=desk)).report
    assert report.columns()["guard_scope"] == "node" and report.columns()["guard_cgroup"] == ""


def test_a_judgement_waits_for_the_sample_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cell's progress shard asks the guard for its judgement (``interim``) from the engine's
    thread while the sampling thread may be mid-sample, adding processes to what the judgement
    iterates: on the paper grid's rehearsal this killed cells ("dictionary changed size during
    iteration"). A sample paused halfway through its scan holds the judgement until it ends."""
    import threading

    from sdbench.engine.site import quietguard

    inside, release = threading.Event(), threading.Event()
    real = quietguard._read_stat

    def paused_read_stat(pid: int):
        if threading.current_thread().name == "sdbench-quiet-guard" and not release.is_set():
            inside.set()
            release.wait(10)
        return real(pid)

    guard = QuietGuard("flag", interval=0.05)
    guard.start()  # the first sample, in this thread, before the pause is installed
    monkeypatch.setattr(quietguard, "_read_stat", paused_read_stat)
    assert inside.wait(10), "the sampling thread never sampled"
    judged: list = []
    judge = threading.Thread(target=lambda: judged.append(guard.interim()))
    judge.start()
    judge.join(0.5)
    assert judge.is_alive() and not judged  # waits for the sample in flight
    release.set()
    judge.join(10)
    assert judged and judged[0].samples >= 2  # the start sample and the one it waited for
    guard.stop()
