"""The quiet-machine guard sees work too short for its per-process view: other CPU time, CPU pressure
and steal from the machine's counters (sdbench.engine.site.quietguard).

Fast: a simulated /proc in a temporary directory (``/proc/stat``, ``/proc/pressure/cpu``,
``/proc/<pid>/{stat,cmdline,cgroup,status}``), advanced between samples on a simulated clock; the
guard samples it as it samples the real one (its sampling thread never wakes: the test samples).
Samples are :data:`SAMPLE_SECONDS` (5 s) apart, as the guard takes them.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from sdbench.engine.site.quietguard import (
    SAMPLE_SECONDS,
    GuardReport,
    JobScope,
    QuietGuard,
    merge_reports,
    other_cpu_tolerance,
    parse_cpu_list,
    pressure_tolerance,
    read_cpu_pressure,
    steal_tolerance,
)
from tests.support.doubles.nvml import NVMLDouble

TICK = os.sysconf("SC_CLK_TCK")
ME = os.getpid()  # the guard's own process: the cell
WORKFLOW = 4_100_050  # the cell's parent (its workflow); simulated pids stay above any real one here
OTHER = 4_100_500  # first pid of other work


class SimProc:
    """A /proc tree of ``cpus`` CPUs with the cell (this process, under its workflow) in it.

    :meth:`run` lets time pass with processes keeping whole CPUs busy (``steady`` ones all along):
    their ``utime`` and the CPUs' ``user`` ticks grow, the rest is idle, less any steal.
    :meth:`exit` ends a process, its parent reaping it (``cutime``).
    """

    def __init__(self, root: Path, cpus: int = 4, psi: bool = True) -> None:
        self.root = root
        self.now = 0.0
        self.cpu = [[0] * 8 for _ in range(cpus)]  # user nice system idle iowait irq softirq steal
        self.procs: dict[int, dict] = {}
        self.pressure_us: int | None = 0 if psi else None
        self.steady: dict[int, list[int]] = {}
        self.add(1, 0, "/sbin/init")
        self.add(WORKFLOW, 1, "python snakemake --profile slurm")
        self.add(ME, WORKFLOW, "python sdbench run-cell --spec x.json")
        self.write()

    def clock(self) -> float:
        return self.now

    def add(self, pid: int, ppid: int, cmd: str, cpus: set[int] | None = None) -> None:
        cpus = cpus if cpus is not None else set(range(len(self.cpu)))
        self.procs[pid] = {"ppid": ppid, "cmd": cmd, "utime": 0, "cutime": 0, "processor": min(cpus), "cpus": cpus}
        self.write()

    def exit(self, pid: int) -> None:
        """``pid`` ends and its parent reaps it (init reaps orphans)."""
        gone = self.procs.pop(pid)
        parent = self.procs.get(gone["ppid"], self.procs[1])
        parent["cutime"] += gone["utime"] + gone["cutime"]
        shutil.rmtree(self.root / str(pid))
        self.write()

    def run(self, seconds: float, work: dict[int, list[int]] | None = None, steal_s: float = 0.0,
            pressure_s: float = 0.0) -> None:  # fmt: skip
        """``seconds`` pass; ``work``: pid -> the CPUs it keeps busy; ``steal_s`` taken from every
        CPU by the VM's host; ``pressure_s`` during which some runnable task waited."""
        ticks = round(seconds * TICK)
        used = [0] * len(self.cpu)
        for pid, cpus in {**self.steady, **(work or {})}.items():
            for c in cpus:
                used[c] += ticks
                self.procs[pid]["utime"] += ticks
                self.procs[pid]["processor"] = c
        stolen = round(steal_s * TICK)
        for c, counters in enumerate(self.cpu):
            assert used[c] + stolen <= ticks, f"cpu{c} is busier than the time that passed"
            counters[0] += used[c]
            counters[3] += ticks - used[c] - stolen
            counters[7] += stolen
        if self.pressure_us is not None:
            self.pressure_us += round(pressure_s * 1e6)
        self.now += seconds
        self.write()

    def write(self) -> None:
        total = [sum(c[i] for c in self.cpu) for i in range(8)]
        lines = ["cpu  " + " ".join(map(str, total)) + " 0 0"]
        lines += [f"cpu{n} " + " ".join(map(str, c)) + " 0 0" for n, c in enumerate(self.cpu)]
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "stat").write_text("\n".join([*lines, "intr 0", "ctxt 0", "btime 1700000000", ""]))
        (self.root / "loadavg").write_text("0.50 0.40 0.30 2/120 4100999\n")
        if self.pressure_us is not None:
            (self.root / "pressure").mkdir(exist_ok=True)
            (self.root / "pressure" / "cpu").write_text(
                f"some avg10=0.00 avg60=0.00 avg300=0.00 total={self.pressure_us}\n"
                "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
            )
        for pid, p in self.procs.items():
            stat = ["S", p["ppid"], pid, 0, 0, -1, 4194304, 0, 0, 0, 0, p["utime"], 0, p["cutime"], 0] + [0] * 21
            stat += [p["processor"], 0, 0]  # field 39: the CPU it last ran on
            name = p["cmd"].split()[0].rsplit("/", 1)[-1][:15]
            d = self.root / str(pid)
            d.mkdir(exist_ok=True)
            (d / "stat").write_text(f"{pid} ({name}) " + " ".join(map(str, stat)) + "\n")
            (d / "cmdline").write_bytes(p["cmd"].replace(" ", "\0").encode() + b"\0")
            (d / "cgroup").write_text("0::/user.slice/user-1000.slice/session-3.scope\n")
            cpus = ",".join(map(str, sorted(p["cpus"])))
            (d / "status").write_text(f"Name:\t{name}\nPid:\t{pid}\nCpus_allowed_list:\t{cpus}\n")


# A scenario lets the simulated machine run from the guard's start (``start()``) taking its samples
# (``sample()``) 5 s apart; the guard stops at 10 s (the timed part's end: its last sample).
Scenario = Callable[[SimProc, Callable[[], None], Callable[[], None]], None]


def judged(sim: SimProc, scenario: Scenario, scope: JobScope | None = None) -> GuardReport:
    guard = QuietGuard("flag", interval=3600, scope=scope or JobScope("node"), nvml=NVMLDouble([]),
                       proc_root=sim.root, clock=sim.clock)  # fmt: skip
    scenario(sim, guard.start, guard._sample)
    assert sim.now == 2 * SAMPLE_SECONDS
    return guard.stop()


def single_burst(sim: SimProc, start: Callable[[], None], sample: Callable[[], None]) -> None:
    """Another process keeps one CPU busy from 1 s to 3 s: between the samples at 0 s and 5 s."""
    start()
    sim.run(1.0)
    sim.add(OTHER, 1, "python burn.py")
    sim.run(2.0, {OTHER: [1]})
    sim.exit(OTHER)
    sim.run(2.0)
    sample()
    sim.run(5.0)


def back_to_back(sim: SimProc, start: Callable[[], None], sample: Callable[[], None]) -> None:
    """A 3 s process at a full CPU (started just before the 0 s sample), then a 4.9 s one (3 s to
    7.9 s): each is seen by one sample only."""
    sim.add(OTHER, 1, "python burn.py 3")
    start()
    sim.run(3.0, {OTHER: [1]})
    sim.exit(OTHER)
    sim.add(OTHER + 1, 1, "python burn.py 4.9")
    sim.run(2.0, {OTHER + 1: [1]})
    sample()
    sim.run(2.9, {OTHER + 1: [1]})
    sim.exit(OTHER + 1)
    sim.run(2.1)


def two_cores(sim: SimProc, start: Callable[[], None], sample: Callable[[], None]) -> None:
    """Two processes at a full CPU each from 6 s to 8 s: between the samples at 5 s and 10 s."""
    start()
    sim.run(5.0)
    sample()
    sim.run(1.0)
    sim.add(OTHER, 1, "python burn.py")
    sim.add(OTHER + 1, 1, "python burn.py")
    sim.run(2.0, {OTHER: [1], OTHER + 1: [2]})
    sim.exit(OTHER)
    sim.exit(OTHER + 1)
    sim.run(2.0)


def quiet(sim: SimProc, start: Callable[[], None], sample: Callable[[], None]) -> None:
    start()
    sim.run(5.0)
    sample()
    sim.run(5.0)


def busy_cell(sim: SimProc) -> SimProc:
    """The cell keeps CPU 0 busy all along (its engine)."""
    sim.steady = {ME: [0]}
    return sim


# ----------------------------------------------------------------------------- short work


@pytest.mark.parametrize(
    ("scenario", "other_s"), [(single_burst, 2.0), (back_to_back, 7.9), (two_cores, 4.0)],
    ids=["single-2s-burst", "back-to-back-3s-4.9s", "two-cores-2s"],
)  # fmt: skip
def test_work_between_two_samples_is_flagged(tmp_path: Path, scenario: Scenario, other_s: float) -> None:
    report = judged(busy_cell(SimProc(tmp_path / "proc")), scenario)
    assert not report.busy  # no process was seen in two samples: the per-process view misses them all
    assert report.other_cpu_s == pytest.approx(other_s)
    assert other_s > other_cpu_tolerance(10.0, 10.0)  # the cell's own 10 CPU-s over 10 s
    assert report.contaminated and report.reasons == [
        f"other work: {other_s:.1f} CPU-s beside the cell's own 10.0 over 10.0 s (tolerance 1.6)"
    ]
    columns = report.columns()
    assert columns["contaminated"] is True and columns["guard_other_cpu_s"] == pytest.approx(other_s)
    assert columns["contamination"].startswith("other work: ")


def test_an_idle_machine_is_not_flagged(tmp_path: Path) -> None:
    sim = SimProc(tmp_path / "proc")
    guard = QuietGuard("refuse", interval=3600, scope=JobScope("node"), nvml=NVMLDouble([]), proc_root=sim.root,
                       clock=sim.clock)  # fmt: skip
    guard.start()
    assert math.isnan(guard.interim().other_cpu_s)  # one sample: nothing to judge yet
    quiet(sim, lambda: None, guard._sample)
    report = guard.stop()  # refuse: would raise if it saw anything
    assert not report.contaminated and report.samples == 3
    assert (report.other_cpu_s, report.cpu_pressure_s, report.steal_s) == (0.0, 0.0, 0.0)
    assert report.load_max == 0.5  # the simulated /proc/loadavg


def test_the_cells_own_processes_are_not_other_work_however_busy(tmp_path: Path) -> None:
    """The cell on 2 CPUs all along, a child of it on a third that starts a grandchild between two
    samples (reaped by the child) and is itself reaped by the cell before the end, the workflow
    (an ancestor) polling on the fourth: every CPU of the machine busy, none of it other work."""
    sim = SimProc(tmp_path / "proc")
    sim.steady = {ME: [0, 1]}
    engine, compiler = 4_100_900, 4_100_901

    def scenario(sim: SimProc, start: Callable[[], None], sample: Callable[[], None]) -> None:
        sim.add(engine, ME, "VLLM::EngineCore")
        start()
        sim.run(1.0, {engine: [2], WORKFLOW: [3]})
        sim.add(compiler, engine, "python -m torch._inductor.compile_worker")
        sim.run(2.0, {engine: [2], compiler: [3]})
        sim.exit(compiler)
        sim.run(2.0, {engine: [2], WORKFLOW: [3]})
        sample()
        sim.run(3.0, {engine: [2], WORKFLOW: [3]})
        sim.exit(engine)
        sim.run(2.0, {WORKFLOW: [3]})

    report = judged(sim, scenario)
    assert report.other_cpu_s == 0.0 and not report.contaminated, report.reasons


def test_a_sibling_reaped_by_the_workflow_is_other_work(tmp_path: Path) -> None:
    """The workflow's other job (a sibling of the cell) lives between two samples: the workflow reaps
    it, but an ancestor's reaped children are not the cell's."""
    sim = busy_cell(SimProc(tmp_path / "proc"))

    def scenario(sim: SimProc, start: Callable[[], None], sample: Callable[[], None]) -> None:
        start()
        sim.run(5.0)
        sample()
        sim.add(OTHER, WORKFLOW, "python sdbench prompts --dataset x")
        sim.run(3.0, {OTHER: [3]})
        sim.exit(OTHER)
        sim.run(2.0)

    report = judged(sim, scenario)
    assert report.other_cpu_s == 3.0 and report.contaminated


# ----------------------------------------------------------------------------- pressure and steal


def test_cpu_pressure_beyond_the_tolerance_is_flagged(tmp_path: Path) -> None:
    assert pressure_tolerance(10.0) == pytest.approx(1.5)

    def waited(seconds: float) -> Scenario:
        def scenario(sim: SimProc, start: Callable[[], None], sample: Callable[[], None]) -> None:
            start()
            sim.run(5.0, pressure_s=seconds / 2)
            sample()
            sim.run(5.0, pressure_s=seconds / 2)

        return scenario

    report = judged(SimProc(tmp_path / "a"), waited(2.0))
    assert report.cpu_pressure_s == 2.0 and report.reasons == [
        "CPU pressure: runnable work waited for a CPU 2.0 s of 10.0 s (tolerance 1.5)"
    ]
    report = judged(SimProc(tmp_path / "b"), waited(1.0))
    assert report.cpu_pressure_s == 1.0 and not report.contaminated


def test_a_kernel_without_psi_is_not_an_error(tmp_path: Path) -> None:
    sim = SimProc(tmp_path / "proc", psi=False)
    assert read_cpu_pressure(sim.root) is None
    report = judged(sim, quiet)
    assert math.isnan(report.cpu_pressure_s) and math.isnan(report.columns()["guard_cpu_pressure_s"])
    assert not report.contaminated and report.other_cpu_s == 0.0


def test_steal_beyond_the_tolerance_is_flagged(tmp_path: Path) -> None:
    """The host takes 0.5 s of each of 4 CPUs over 10 s (5%): flagged; 0.1 s of each (1%) is not."""
    assert steal_tolerance(10.0, 4) == pytest.approx(1.05)

    def stolen(per_cpu: float) -> Scenario:
        def scenario(sim: SimProc, start: Callable[[], None], sample: Callable[[], None]) -> None:
            start()
            sim.run(5.0, steal_s=per_cpu / 2)
            sample()
            sim.run(5.0, steal_s=per_cpu / 2)

        return scenario

    report = judged(SimProc(tmp_path / "a"), stolen(0.5))
    assert report.steal_s == 2.0 and report.other_cpu_s == 0.0
    assert report.reasons == ["steal: the VM's host took 2.0 of 40.0 CPU-s (5%, tolerance 1.1)"]
    report = judged(SimProc(tmp_path / "b"), stolen(0.1))
    assert report.steal_s == pytest.approx(0.4) and not report.contaminated


# ----------------------------------------------------------------------------- a SLURM job's cores


def test_in_a_job_only_the_jobs_cores_are_counted(tmp_path: Path) -> None:
    """The job holds CPUs 0 and 1; its server runs on CPU 2 (placed apart: the cell's process narrowed
    its own affinity to the client's cores); a neighbour job keeps CPU 3 busy and its waits raise the
    node's CPU pressure. A 2 s burst on the job's CPU 1, between two samples, is the only other work."""
    scope = JobScope("job", None, None, frozenset({0, 1}))
    server, neighbour = 4_100_900, 4_100_800

    def scenario(burst: bool) -> Scenario:
        def run(sim: SimProc, start: Callable[[], None], sample: Callable[[], None]) -> None:
            sim.procs[ME]["cpus"] = {0, 1}  # the job's cores (sched_getaffinity)
            sim.add(server, ME, "python -m vllm.entrypoints.openai.api_server", cpus={2})
            sim.add(neighbour, 1, "python train.py", cpus={3})
            sim.steady = {ME: [0], server: [2], neighbour: [3]}
            start()
            sim.run(5.0, pressure_s=4.0)
            sample()
            if burst:
                sim.add(OTHER, 1, "python burn.py", cpus={1})
            sim.run(2.0, {OTHER: [1]} if burst else {})
            if burst:
                sim.exit(OTHER)
            sim.run(3.0, pressure_s=4.0)

        return run

    report = judged(SimProc(tmp_path / "a"), scenario(False), scope)
    assert report.other_cpu_s == 0.0 and report.cpu_pressure_s == 8.0  # recorded, not judged in a job
    assert not report.contaminated and not report.busy, report.reasons
    report = judged(SimProc(tmp_path / "b"), scenario(True), scope)
    # The server's 10 CPU-s are counted on its core and taken off as the cell's: the burst stays visible.
    assert report.other_cpu_s == 2.0 and report.contaminated
    assert report.reasons[0].startswith("other work: 2.0 CPU-s beside the cell's own 20.0")


# ----------------------------------------------------------------------------- reports


def test_resumed_cells_add_up_the_counters_and_a_cpu_list_parses() -> None:
    first = GuardReport("flag", 2, other_cpu_s=1.0, cpu_pressure_s=float("nan"), steal_s=0.5)
    second = GuardReport("flag", 2, other_cpu_s=2.5, cpu_pressure_s=float("nan"), steal_s=0.0,
                         reasons=["other work: 2.5 CPU-s"])  # fmt: skip
    merged = merge_reports([first, second])
    assert (merged.other_cpu_s, merged.steal_s) == (3.5, 0.5) and math.isnan(merged.cpu_pressure_s)
    assert merged.reasons == ["engine process 2 of 2: other work: 2.5 CPU-s"]
    assert {"guard_other_cpu_s", "guard_cpu_pressure_s", "guard_steal_s"} <= set(merged.columns())
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11} and parse_cpu_list("") == set()
