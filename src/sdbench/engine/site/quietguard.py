"""Quiet-machine guard: what else ran beside a cell while it was being timed.

A timed cell samples its surroundings before and during its timed part: the load average
(recorded), processes holding more than a few percent of a CPU over the timed part, other
vLLM engine processes, on GPUs the devices' other processes and free memory, and the machine's
CPU counters. A cell whose samples exceed the limits is *contaminated*: with mode ``flag`` it is
kept and flagged in its tables, with ``refuse`` the cell fails (a cluster retries it later),
``disabled`` skips the checks.

A process is judged by its CPU time between the first and the last sample that saw it, so work
that lives between two samples (:data:`SAMPLE_SECONDS` apart) or in another PID namespace is not
seen there. The machine's counters see it, read at every sample beside the cell's own CPU time:

- other work (``guard_other_cpu_s``): the busy CPU-seconds of ``/proc/stat`` (user + nice +
  system) over the timed part, less the CPU-seconds of the cell's own processes (:func:`own_family`;
  ``utime + stime`` of ``/proc/<pid>/stat``, and for this process and its descendants the
  ``cutime + cstime`` of the children they reaped, so a child of the cell that lived between two
  samples is still the cell's; an ancestor's reaped children are the workflow's other jobs, which
  count), beyond :data:`OTHER_CPU_SHARE` of one CPU over the timed part, :data:`OTHER_CPU_OWN_SHARE`
  of the cell's own CPU time and :data:`OTHER_CPU_FLOOR_S`.
- CPU pressure (``guard_cpu_pressure_s``): the rise of ``some total`` in ``/proc/pressure/cpu``
  (PSI: time during which some runnable task waited for a CPU), beyond :data:`PRESSURE_SHARE` of the
  timed part and :data:`PRESSURE_FLOOR_S`. NaN where the kernel has no PSI (before 4.20, or booted
  with ``psi=0``): not read, never an error. A cell whose own runnable threads outnumber its cores
  raises it too.
- steal (``guard_steal_s``): the rise of ``/proc/stat``'s ``steal`` column (a VM's host ran
  something else on its CPUs), beyond :data:`STEAL_SHARE` of the timed part times the CPUs counted,
  and :data:`STEAL_FLOOR_S`.

What is judged depends on where the cell runs (:func:`job_scope`):

- ``node`` (a workstation: no ``SLURM_JOB_ID``; a systemd login session's cgroup is no job):
  every process of the node, and the whole machine's counters (``/proc/stat``'s ``cpu`` line).
- ``job`` (a SLURM job: ``SLURM_JOB_ID`` set, or its cgroup named in ``SDBENCH_JOB_CGROUP``):
  the job, not the node. A process counts if it is in the job's cgroup (the ``job_<id>`` cgroup,
  found on the host before the job's container started, else from ``/proc/self/cgroup``, walked
  up from an ``srun`` task's ``step_<n>/.../task_<n>``; members from every ``/proc/<pid>/cgroup``,
  so that no cgroup filesystem is needed), if it holds one of the job's GPUs
  (``CUDA_VISIBLE_DEVICES``; NVML's processes on those devices), or if it is busy and was
  seen running on one of the job's cores (``sched_getaffinity``; ``/proc/<pid>/stat``'s
  last CPU). A neighbour job on other GPUs and other cores of the node is not contamination.
  The cgroup judged is recorded (``guard_cgroup``). The node-wide ``cpu`` line counts the
  neighbour jobs too, so other work and steal are counted on the job's cores alone: the
  ``cpu<N>`` lines of ``sched_getaffinity`` and of the cores the cell's own processes may use (a
  server placed on cores of its own). CPU pressure is recorded, not judged: the node-wide figure
  counts neighbour jobs' waits on their own cores.

Processes of the cell itself (this process, its children and its ancestors, i.e.
the workflow that started it) never count.

``/proc`` is read by hand from ``proc_root`` (tests point it at a simulated tree), not with
psutil: psutil reads the procfs at its process-wide ``PROCFS_PATH``, and pointing that at another
tree would move every psutil user of the engine's process (vLLM is one) with it.
"""

from __future__ import annotations

import copy
import math
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODES = ("flag", "refuse", "disabled")
ENV_MODE = "SDBENCH_QUIET_GUARD"
PROC = Path("/proc")
# A process above this share of one CPU, averaged over the timed part, is busy.
BUSY_CPU_PERCENT = 5.0
# Shortest observation of a process that is judged (CPU times tick every 10 ms).
MIN_WINDOW_S = 0.2
# Seconds between samples. A sample scans /proc while holding the GIL, stalling the engine's
# Python loop in this process (at 0.5 s: 5-10% slower, noisier tiny-model cells); judging uses
# the first and last sample of each process, the ones between only catch short-lived ones.
SAMPLE_SECONDS = 5.0
# sdbench commands that hold a vLLM engine (an idle one still holds its device memory).
ENGINE_COMMANDS = ("run-cell", "run-group", "trace-group", "serve-group")

# Other work (CPU-seconds nobody of the cell used) up to this share of one CPU over the timed part
# is a quiet machine: twice what makes one process busy (BUSY_CPU_PERCENT), room for a node's
# daemons and kernel threads together (their lifetime share on a 2-vCPU VM: about 2% of one CPU).
OTHER_CPU_SHARE = 0.1
# ... plus this share of the cell's own CPU time: per-process times (the scheduler's runtime split
# by ticks) and /proc/stat (ticks) are kept apart; they agreed within 0.2% over 10 s here, and a
# busy cell's rounding must not read as other work on kernels where they drift further.
OTHER_CPU_OWN_SHARE = 0.01
# ... plus this many CPU-seconds: a short timed part (tiny cells: under a second) would otherwise be
# flagged for 10 ms ticks rounded on every counter and a kernel thread's wake-up.
OTHER_CPU_FLOOR_S = 0.5
# Some runnable task waited for a CPU for up to this share of the timed part: a quiet machine (the
# cell's own threads briefly outnumbering its cores wait too). More is a CPU shortage.
PRESSURE_SHARE = 0.1
PRESSURE_FLOOR_S = 0.5  # a short timed part: a brief wake-up of many threads at once
# A VM's host takes a little of its CPUs all the time (1.7% over 10 s at most on a loaded 2-vCPU
# VM here); more than this share of the counted CPUs' time is another VM competing.
STEAL_SHARE = 0.02
STEAL_FLOOR_S = 0.25  # ticks rounded on every CPU line of a short timed part


class Contaminated(RuntimeError):
    """Raised in ``refuse`` mode when the timed part ran beside other work."""


def _clock_ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def _entry(proc: int | str | Path) -> Path:
    """A process's /proc directory: from its pid (under /proc), or the directory itself."""
    return PROC / str(proc) if isinstance(proc, (int, str)) else proc


def _stat_fields(proc: int | str | Path) -> list[str] | None:
    """``/proc/<pid>/stat`` from field 3 (state) on; None if the process is gone."""
    try:
        raw = (_entry(proc) / "stat").read_text(encoding="utf-8")
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()  # the command (field 2) may hold spaces and parentheses


def _read_stat(proc: int | Path) -> tuple[int, int, float, int] | None:
    """(ppid, process group, cpu seconds, CPU it last ran on) of a process (its pid, or its /proc
    directory), or None if it is gone."""
    fields = _stat_fields(proc)
    if fields is None:
        return None
    try:
        ppid, pgrp = int(fields[1]), int(fields[2])
        cpu = (int(fields[11]) + int(fields[12])) / _clock_ticks()
        return ppid, pgrp, cpu, int(fields[36])  # stat field 39: processor
    except (IndexError, ValueError):
        return None  # read while the process exited: empty or cut short


def _read_times(proc: int | Path) -> tuple[int, int] | None:
    """(utime + stime, cutime + cstime) of a process in clock ticks: its own CPU time (all its
    threads, live and exited) and that of the children it reaped; None if it is gone."""
    fields = _stat_fields(proc)
    if fields is None:
        return None
    try:
        return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
    except (IndexError, ValueError):
        return None


def _cpus_allowed(proc: int | Path) -> set[int]:
    """The CPUs a process may run on (``Cpus_allowed_list`` of ``/proc/<pid>/status``); empty if gone."""
    try:
        text = (_entry(proc) / "status").read_text(encoding="utf-8")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpu_list(line.split(":", 1)[1])
    return set()


def parse_cpu_list(text: str) -> set[int]:
    """A kernel CPU list (``0-3,8``) as a set."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        first, _, last = part.strip().partition("-")
        if first.isdigit():
            cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def _cmdline(proc: int | Path) -> str:
    try:
        return (_entry(proc) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _is_engine(cmd: str) -> bool:
    """A vLLM engine: vLLM's own processes or another sdbench engine job."""
    words = cmd.split()
    if not words:
        return False
    if "sdbench" in cmd and any(w in ENGINE_COMMANDS for w in words):
        return True
    return any("vllm" in w.rsplit("/", 1)[-1].lower() for w in words[:3]) or words[0].startswith("VLLM::")


def _all_pids(proc_root: str | Path = PROC) -> list[int]:
    return [int(p) for p in os.listdir(proc_root) if p.isdigit()]


def _loadavg(proc_root: str | Path = PROC) -> float | None:
    """The 1-minute load average (what ``os.getloadavg`` reads); None where unreadable."""
    try:
        return float((Path(proc_root) / "loadavg").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None


def family_tree(pid: int | None = None, proc_root: str | Path = PROC) -> tuple[set[int], set[int]]:
    """(this process and all its descendants, its ancestors); ``pid``: this process."""
    me = pid or os.getpid()
    root = Path(proc_root)
    parents: dict[int, int] = {}
    for p in _all_pids(root):
        st = _read_stat(root / str(p))
        if st:
            parents[p] = st[0]
    below = {me}
    changed = True
    while changed:  # descendants (siblings of the workflow's other jobs do count)
        changed = False
        for p, pp in parents.items():
            if pp in below and p not in below:
                below.add(p)
                changed = True
    above: set[int] = set()
    cur = me
    while cur in parents and parents[cur] > 1:  # ancestors: the workflow, its shell
        cur = parents[cur]
        above.add(cur)
    return below, above - below


def own_family(pid: int | None = None, proc_root: str | Path = PROC) -> set[int]:
    """This process, its ancestors and all its descendants."""
    below, above = family_tree(pid, proc_root)
    return below | above


def allowed_cores() -> int:
    """Cores this process may run on (its affinity mask, as SLURM or taskset sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


# ---------------------------------------------------------------------------- the machine's counters


def read_cpu_stat(proc_root: str | Path = PROC) -> dict[str, tuple[int, int]]:
    """``/proc/stat``'s CPU lines, ``cpu`` (the machine) and ``cpu<N>``: name -> (busy, steal) in
    clock ticks. Busy is user + nice + system: guest time is inside user and nice already; iowait
    is idle; irq and softirq are charged to no process (mostly the cell's own I/O: a server's
    loopback HTTP, the GPU's interrupts), so they are no one's other work. {} where unreadable."""
    try:
        text = (Path(proc_root) / "stat").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("cpu"):
            name, *values = line.split()
            v = [int(x) for x in values] + [0] * 8  # user nice system idle iowait irq softirq steal
            out[name] = (v[0] + v[1] + v[2], v[7])
    return out


def read_cpu_pressure(proc_root: str | Path = PROC) -> int | None:
    """``some total`` of ``/proc/pressure/cpu`` (PSI), microseconds during which some runnable task
    waited for a CPU; None without PSI (a kernel before 4.20, or PSI off: the read fails)."""
    try:
        text = (Path(proc_root) / "pressure" / "cpu").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("some "):
            for word in line.split():
                if word.startswith("total="):
                    return int(word.removeprefix("total="))
    return None


@dataclass(frozen=True)
class CpuCounters:
    """The machine's CPU counters and the cell's own CPU time, read one right after the other: the
    cell keeps running while a sample scans /proc, so a gap between them would be counted as work."""

    time: float
    lines: dict[str, tuple[int, int]]  # read_cpu_stat
    own: int  # the cell's processes' CPU time in clock ticks (family_ticks)
    pressure_us: int | None  # read_cpu_pressure


def family_ticks(below: set[int], above: set[int], proc_root: str | Path = PROC) -> int:
    """CPU time of the cell's processes in clock ticks: each one's own, and for this process and its
    descendants (``below``) their reaped children's, so that a child's time stays counted when it
    exits and its parent reaps it (a sum that only grows while the cell's processes reap their own).
    Not the ancestors' reaped children: the workflow's other jobs. A descendant re-parented to init
    takes its time with it when it exits: it reads as other work."""
    root = Path(proc_root)
    total = 0
    for pid in below | above:
        times = _read_times(root / str(pid))
        if times is not None:
            total += times[0] + (times[1] if pid in below else 0)
    return total


def other_cpu_tolerance(window_s: float, own_s: float) -> float:
    """CPU-seconds of other work that a quiet machine shows over a timed part of ``window_s``
    during which the cell itself used ``own_s``."""
    return OTHER_CPU_SHARE * window_s + OTHER_CPU_OWN_SHARE * max(own_s, 0.0) + OTHER_CPU_FLOOR_S


def pressure_tolerance(window_s: float) -> float:
    """Seconds of CPU pressure (PSI ``some``) that a quiet machine shows over ``window_s``."""
    return PRESSURE_SHARE * window_s + PRESSURE_FLOOR_S


def steal_tolerance(window_s: float, cpus: int) -> float:
    """CPU-seconds of steal that a quiet VM shows over ``window_s`` on ``cpus`` CPUs."""
    return STEAL_SHARE * window_s * cpus + STEAL_FLOOR_S


# ---------------------------------------------------------------------------- the job's scope

# The job's cgroup as the workflow found it on the host before the job's container started
# (sdbench.lifeline passes it in): "<path>" (cgroup v2) or "<controllers>:<path>" (v1).
ENV_JOB_CGROUP = "SDBENCH_JOB_CGROUP"
_SLURM_JOB_RE = re.compile(r"^job_(\d+)$")


@dataclass(frozen=True)
class Cgroup:
    """One cgroup: its hierarchy (``""`` for cgroup v2, else the v1 controllers, e.g. ``memory``)
    and its path from that hierarchy's root."""

    hierarchy: str
    path: str

    def __str__(self) -> str:
        return self.path if not self.hierarchy else f"{self.hierarchy}:{self.path}"

    @classmethod
    def parse(cls, text: str) -> Cgroup:
        """The form ``str()`` writes (and :data:`ENV_JOB_CGROUP` holds)."""
        if text.startswith("/"):
            return cls("", text)
        hierarchy, _, path = text.partition(":")
        return cls(hierarchy, path)

    def holds(self, other: Cgroup) -> bool:
        """``other`` is this cgroup or one below it (same hierarchy)."""
        return other.hierarchy == self.hierarchy and (other.path == self.path or other.path.startswith(self.path + "/"))


def process_cgroups(pid: int | str = "self", proc_root: str | Path = PROC) -> list[Cgroup]:
    """The cgroups of a process, one per hierarchy (``/proc/<pid>/cgroup``: ``0::<path>`` for v2,
    ``<id>:<controllers>:<path>`` for v1); [] when it is gone. Read from /proc alone: a container
    started in Apptainer's setuid mode has a fresh sysfs without the cgroup filesystem."""
    try:
        lines = (Path(proc_root) / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            out.append(Cgroup("" if parts[0] == "0" and not parts[1] else parts[1], parts[2]))
    return out


def slurm_job_cgroup(cgroups: list[Cgroup], job_id: str | None = None) -> Cgroup | None:
    """The SLURM job's cgroup among a process's cgroups: its path cut after the ``job_<id>``
    component (``job_id`` when given), v2 first. A task started by ``srun`` sits below it
    (``.../job_<id>/step_0/user/task_0``), and so do the job's other steps: the job is judged, not
    the step. None when no path has that component (no cgroup tracking, or not a SLURM job)."""
    for cgroup in sorted(cgroups, key=lambda c: c.hierarchy != ""):
        parts = cgroup.path.split("/")
        for i, part in enumerate(parts):
            match = _SLURM_JOB_RE.match(part)
            if match and (job_id is None or match.group(1) == str(job_id)):
                return Cgroup(cgroup.hierarchy, "/".join(parts[: i + 1]))
    return None


def host_job_cgroup(env: dict[str, str] | None = None, proc_root: str | Path = PROC) -> str | None:
    """The job's cgroup of this process (:func:`slurm_job_cgroup`) as :data:`ENV_JOB_CGROUP`
    holds it; None outside a SLURM job. Called on the host, where the workflow starts the job's
    container."""
    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        return None
    found = slurm_job_cgroup(process_cgroups("self", proc_root), job_id)
    return str(found) if found else None


def cgroup_members(cgroup: Cgroup, proc_root: str | Path = PROC) -> set[int]:
    """Processes in ``cgroup`` or below it, from every ``/proc/<pid>/cgroup``."""
    members = set()
    for entry in os.listdir(proc_root):
        if entry.isdigit() and any(cgroup.holds(c) for c in process_cgroups(entry, proc_root)):
            members.add(int(entry))
    return members


def visible_gpus(env: dict[str, str] | None = None) -> list[str] | None:
    """The job's GPUs as ``CUDA_VISIBLE_DEVICES`` names them (indices or UUIDs); None if unset."""
    raw = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    return [d.strip() for d in raw.split(",") if d.strip()]


def device_selected(index: int, uuid: str, devices: list[str] | None) -> bool:
    """Whether device ``index`` (NVML order, UUID ``uuid``) is one of ``devices`` as
    ``CUDA_VISIBLE_DEVICES`` names them (indices, UUIDs or UUID prefixes); None selects every device."""
    if devices is None:
        return True
    return str(index) in devices or uuid in devices or any(d.startswith("GPU-") and uuid.startswith(d) for d in devices)


def nvml_gpu_processes(nvml: Any, devices: list[str] | None) -> tuple[set[int], float]:
    """(pids of compute processes on ``devices``, lowest free MiB among them) through an NVML
    module (pynvml); ``devices`` None: every device of the node."""
    nvml.nvmlInit()
    try:
        pids: set[int] = set()
        free: list[float] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            if not device_selected(index, uuid, devices):
                continue
            pids |= {int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)}
            free.append(nvml.nvmlDeviceGetMemoryInfo(handle).free / 2**20)
        return pids, min(free) if free else float("nan")
    finally:
        nvml.nvmlShutdown()


@dataclass(frozen=True)
class JobScope:
    """What the guard judges: the whole node, or one cluster job (see the module docstring)."""

    kind: str  # "node" or "job"
    cgroup: Cgroup | None = None
    gpus: list[str] | None = None
    cores: frozenset[int] = frozenset()


def job_scope(env: dict[str, str] | None = None, proc_root: str | Path = PROC) -> JobScope:
    """``job`` in a SLURM job (``SLURM_JOB_ID``) or where the workflow named the job's cgroup
    (:data:`ENV_JOB_CGROUP`), else ``node``: a workstation, whatever cgroup its session sits in
    (a systemd login session has one of its own; it is not a job).

    The job's cgroup: :data:`ENV_JOB_CGROUP` (found on the host before the container started), else
    this process's own ``job_<id>`` cgroup (:func:`slurm_job_cgroup`); None when neither is known:
    then the job's GPUs and cores alone say what counts."""
    env = os.environ if env is None else env
    given = env.get(ENV_JOB_CGROUP)
    job_id = env.get("SLURM_JOB_ID")
    if not job_id and not given:
        return JobScope("node")
    cgroup = Cgroup.parse(given) if given else slurm_job_cgroup(process_cgroups("self", proc_root), job_id)
    try:
        cores = frozenset(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        cores = frozenset(range(os.cpu_count() or 1))
    return JobScope("job", cgroup, visible_gpus(env), cores)


def _gpu_snapshot(devices: list[str] | None = None, nvml: Any = None) -> dict[str, Any]:
    """Compute processes and lowest free memory of the GPUs ``devices`` (None: all), through
    an NVML module (``nvml``, else pynvml when it imports), else nvidia-smi (all devices);
    empty without either."""
    pynvml = nvml
    if pynvml is None:
        try:
            import pynvml  # type: ignore[import-not-found,no-redef]
        except ImportError:
            pynvml = None
    if pynvml is not None:
        try:
            pids, free = nvml_gpu_processes(pynvml, devices)
            return {"gpu_pids": sorted(pids), "gpu_free_mib": free}
        except Exception:  # noqa: BLE001 - no driver: fall back to nvidia-smi
            pass
    if not shutil.which("nvidia-smi"):
        return {}
    try:
        apps = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
        mem = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,memory.free,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    pids = [int(line.split(",")[0]) for line in apps.splitlines() if line.strip()]
    free = [float(line.split(",")[1]) for line in mem.splitlines() if line.strip()]
    return {"gpu_pids": pids, "gpu_free_mib": min(free) if free else float("nan")}


@dataclass
class GuardReport:
    """What the guard saw; ``reasons`` empty means the machine was quiet."""

    mode: str
    cores: int
    scope: str = "node"  # what was judged: the node, or the job (job_scope)
    load_max: float = 0.0
    busy: dict[str, float] = field(default_factory=dict)  # "pid cmd" -> mean CPU %
    engines: set[str] = field(default_factory=set)
    gpu_others: set[int] = field(default_factory=set)
    gpu_free_mib: float = float("nan")
    cgroup: str = ""  # the job's cgroup judged ("" for a node, or a job whose cgroup is unknown)
    samples: int = 0
    # The machine's counters over the timed part (NaN: not read, e.g. fewer than two samples):
    other_cpu_s: float = float("nan")  # busy CPU-seconds less the cell's own (rounding: may be < 0)
    cpu_pressure_s: float = float("nan")  # PSI "some" seconds; NaN without PSI
    steal_s: float = float("nan")  # CPU-seconds a VM's host took
    reasons: list[str] = field(default_factory=list)

    @property
    def contaminated(self) -> bool:
        return bool(self.reasons)

    def columns(self) -> dict[str, Any]:
        """Columns recorded in every table of the cell (schema: docs/schema.md)."""
        return {
            "quiet_guard": self.mode,
            "contaminated": self.contaminated,
            "contamination": "; ".join(self.reasons),
            "guard_load_max": self.load_max,
            "guard_cores": self.cores,
            "guard_samples": self.samples,
            "guard_gpu_free_mib": self.gpu_free_mib,
            "guard_scope": self.scope,
            "guard_cgroup": self.cgroup,
            "guard_other_cpu_s": self.other_cpu_s,
            "guard_cpu_pressure_s": self.cpu_pressure_s,
            "guard_steal_s": self.steal_s,
        }


class QuietGuard:
    """Samples the cell's surroundings (:func:`job_scope`) in a background thread between
    :meth:`start` and :meth:`stop`; ``proc_root`` and ``clock`` (seconds, monotonic) are where it
    reads /proc and the time."""

    def __init__(
        self, mode: str = "flag", interval: float = SAMPLE_SECONDS, scope: JobScope | None = None, nvml: Any = None,
        proc_root: str | Path = PROC, clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        if mode not in MODES:
            from sdbench.errors import ConfigError

            raise ConfigError(f"quiet guard mode {mode!r}: expected one of {', '.join(MODES)}")
        self.proc_root = Path(proc_root)
        self._clock = clock
        self.scope = scope or job_scope(proc_root=self.proc_root)
        self._nvml = nvml  # an NVML module; None: pynvml if it imports
        self.report = GuardReport(mode=mode, cores=allowed_cores(), scope=self.scope.kind,
                                  cgroup=str(self.scope.cgroup or ""))  # fmt: skip
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._first: dict[int, tuple[float, float, str]] = {}  # pid -> (time, cpu s, cmd) first seen
        self._last: dict[int, tuple[float, float]] = {}
        self._on_my_cores: set[int] = set()  # (job scope) pids seen running on one of the job's cores
        self._counters: list[CpuCounters] = []  # the first and the latest sample's
        self._cpus: set[int] = set(self.scope.cores)  # (job scope) CPUs whose counters are counted
        # A sample (the sampling thread) and a judgement (the engine's thread: a cell's progress
        # shard asks for one mid-cell) never run at once: the judgement iterates what a sample adds
        # to ("dictionary changed size during iteration" killed SPEED-Bench 32k cells mid-run).
        self._lock = threading.Lock()

    def _sample(self) -> None:
        with self._lock:
            self._sample_locked()

    def _count(self, below: set[int], above: set[int]) -> None:
        """Read the machine's counters beside the cell's own CPU time (:class:`CpuCounters`)."""
        now = self._clock()
        lines = read_cpu_stat(self.proc_root)
        own = family_ticks(below, above, self.proc_root)
        counters = CpuCounters(now, lines, own, read_cpu_pressure(self.proc_root))
        self._counters = [self._counters[0], counters] if self._counters else [counters]
        if self.scope.kind == "job":  # where the cell's own processes run (a server placed apart)
            for pid in below:
                self._cpus |= _cpus_allowed(self.proc_root / str(pid))

    def _sample_locked(self) -> None:
        root = self.proc_root
        below, above = family_tree(None, root)
        family = below | above
        self._count(below, above)
        now = self._clock()
        scope = self.scope
        members = cgroup_members(scope.cgroup, root) if scope.cgroup is not None else set()
        gpu = _gpu_snapshot(scope.gpus if scope.kind == "job" else None, self._nvml)
        gpu_pids = {p for p in gpu.get("gpu_pids", []) if p not in family}
        for pid in _all_pids(root):
            if pid in family:
                continue
            st = _read_stat(root / str(pid))
            if st is None:
                continue
            if scope.kind == "job" and pid not in members and pid not in gpu_pids:
                # Outside the job: only CPU contention on the job's own cores counts.
                if st[3] not in scope.cores:
                    if pid not in self._on_my_cores:
                        continue
                else:
                    self._on_my_cores.add(pid)
                cmd = _cmdline(root / str(pid))
            else:
                cmd = _cmdline(root / str(pid))
                if _is_engine(cmd):
                    self.report.engines.add(f"{pid} {cmd[:80]}")
            self._first.setdefault(pid, (now, st[2], cmd))
            self._last[pid] = (now, st[2])
        load = _loadavg(root)
        if load is not None:
            self.report.load_max = max(self.report.load_max, load)
        self.report.gpu_others |= gpu_pids
        if "gpu_free_mib" in gpu:
            seen = self.report.gpu_free_mib
            self.report.gpu_free_mib = gpu["gpu_free_mib"] if seen != seen else min(seen, gpu["gpu_free_mib"])
        self.report.samples += 1

    def _busy(self) -> dict[str, float]:
        """Processes whose CPU use, averaged over the time they were seen, exceeds the limit.

        An average over the whole timed part, not a per-sample peak: a workflow's
        status poll or a daemon's wake-up is not contention, a competing job is.
        """
        busy: dict[str, float] = {}
        for pid, (t0, cpu0, cmd) in self._first.items():
            t1, cpu1 = self._last[pid]
            if t1 - t0 < MIN_WINDOW_S:  # seen once only: no rate to judge
                continue
            pct = 100.0 * (cpu1 - cpu0) / (t1 - t0)
            if pct > BUSY_CPU_PERCENT:
                busy[f"{pid} {(cmd or '?')[:60]}"] = pct
        return busy

    def _judge_counters(self, r: GuardReport) -> None:
        """Other work, CPU pressure and steal between the first and the latest sample, into ``r``."""
        if len(self._counters) < 2:
            return
        first, last = self._counters
        window = last.time - first.time
        if window < MIN_WINDOW_S:
            return
        if self.scope.kind == "job":  # the job's cores alone: the node's line counts its neighbours
            names = [f"cpu{c}" for c in sorted(self._cpus)]
        else:
            names = ["cpu"]
        names = [n for n in names if n in first.lines and n in last.lines]  # a CPU taken offline: unread
        if not names:
            return
        tick = _clock_ticks()
        busy = sum(last.lines[n][0] - first.lines[n][0] for n in names) / tick
        own = (last.own - first.own) / tick
        r.other_cpu_s = round(busy - own, 3)
        limit = other_cpu_tolerance(window, own)
        if r.other_cpu_s > limit:
            r.reasons.append(f"other work: {r.other_cpu_s:.1f} CPU-s beside the cell's own {own:.1f} "
                             f"over {window:.1f} s (tolerance {limit:.1f})")  # fmt: skip
        cpus = len(names) if names != ["cpu"] else max(1, sum(n != "cpu" for n in last.lines))
        r.steal_s = round(sum(last.lines[n][1] - first.lines[n][1] for n in names) / tick, 3)
        limit = steal_tolerance(window, cpus)
        if r.steal_s > limit:
            r.reasons.append(f"steal: the VM's host took {r.steal_s:.1f} of {window * cpus:.1f} CPU-s "
                             f"({r.steal_s / (window * cpus):.0%}, tolerance {limit:.1f})")  # fmt: skip
        if first.pressure_us is not None and last.pressure_us is not None:
            r.cpu_pressure_s = round((last.pressure_us - first.pressure_us) / 1e6, 3)
            limit = pressure_tolerance(window)
            if self.scope.kind == "node" and r.cpu_pressure_s > limit:
                r.reasons.append(f"CPU pressure: runnable work waited for a CPU {r.cpu_pressure_s:.1f} s "
                                 f"of {window:.1f} s (tolerance {limit:.1f})")  # fmt: skip

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> None:
        """Take the 'before' sample and start sampling in the background."""
        if self.report.mode == "disabled":
            return
        self._started = self._clock()
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="sdbench-quiet-guard", daemon=True)
        self._thread.start()

    def _judge(self) -> GuardReport:
        """The report with what has been seen so far judged (busy processes, reasons)."""
        with self._lock:
            return self._judge_locked()

    def _judge_locked(self) -> GuardReport:
        r = copy.deepcopy(self.report)
        if r.mode == "disabled":
            return r
        # The load average is recorded, not judged: it lags by a minute and counts
        # the cell's own threads, so a busy neighbour is found by its CPU time instead.
        r.busy = self._busy()
        if r.busy:
            top = sorted(r.busy.items(), key=lambda kv: -kv[1])[:3]
            r.reasons.append("busy processes: " + ", ".join(f"{k} ({v:.0f}% CPU)" for k, v in top))
        if r.engines:
            r.reasons.append("other engine processes: " + ", ".join(sorted(r.engines)[:3]))
        if r.gpu_others:
            r.reasons.append("other GPU processes: " + ", ".join(map(str, sorted(r.gpu_others))))
        self._judge_counters(r)
        return r

    def interim(self) -> GuardReport:
        """What the guard has seen so far, judged as :meth:`stop` would, without stopping or raising
        (a cell's partial checkpoint keeps it: sdbench.engine.measure.progress)."""
        return self._judge()

    def stop(self, earlier: Sequence[GuardReport] = ()) -> GuardReport:
        """Stop sampling, decide, and (mode ``refuse``) raise :class:`Contaminated`.

        ``earlier``: the reports of the engine processes that timed this cell's calls before it
        was resumed (:func:`merge_reports`); the verdict covers them too.
        """
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            # A timed part shorter than the judging window (tiny cells) would leave every process
            # unjudged: extend the observation to the window, after the timed part has ended.
            short = MIN_WINDOW_S * 1.25 - (self._clock() - self._started)
            if short > 0:
                time.sleep(short)
            self._sample()
        r = merge_reports([*earlier, self._judge()])
        if r.mode == "refuse" and r.reasons:
            raise Contaminated("timed part ran on a busy machine: " + "; ".join(r.reasons))
        return r


def _sum_read(values: list[float]) -> float:
    """The sum of the values read (not NaN); NaN when none was."""
    read = [v for v in values if not math.isnan(v)]
    return sum(read) if read else float("nan")


def merge_reports(reports: list[GuardReport]) -> GuardReport:
    """One report over the engine processes that timed one cell (the last one's mode, cores and
    scope): a cell resumed after its job was killed is contaminated if any of them was. The
    counters' measures add up over the processes' timed parts."""
    if len(reports) == 1:
        return reports[0]
    last = reports[-1]
    frees = [r.gpu_free_mib for r in reports if r.gpu_free_mib == r.gpu_free_mib]
    merged = GuardReport(mode=last.mode, cores=last.cores, scope=last.scope)
    merged.load_max = max(r.load_max for r in reports)
    merged.samples = sum(r.samples for r in reports)
    merged.gpu_free_mib = min(frees) if frees else float("nan")
    merged.other_cpu_s = _sum_read([r.other_cpu_s for r in reports])
    merged.cpu_pressure_s = _sum_read([r.cpu_pressure_s for r in reports])
    merged.steal_s = _sum_read([r.steal_s for r in reports])
    for i, r in enumerate(reports):
        merged.busy.update(r.busy)
        merged.engines |= r.engines
        merged.gpu_others |= r.gpu_others
        merged.reasons += [f"engine process {i + 1} of {len(reports)}: {reason}" for reason in r.reasons]
    return merged


def mode_from_env(default: str = "flag") -> str:
    """Guard mode for this process: ``$SDBENCH_QUIET_GUARD`` (set by the workflow) or ``default``."""
    return os.environ.get(ENV_MODE, default) or default
