"""Quiet-machine guard: what else ran on the node while a cell was being timed.

A timed cell samples the node before and during its timed part: the load average
(recorded), other processes holding more than a few percent of a CPU over the
timed part, other vLLM engine processes, and on GPUs the devices' other processes
and free memory. A cell whose samples exceed the limits is *contaminated*: with mode
``flag`` it is kept and flagged in its tables, with ``refuse`` the cell fails (a
cluster retries it later), ``disabled`` skips the checks.

Processes of the cell itself (this process, its children and its ancestors, i.e.
the workflow that started it) never count.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

MODES = ("flag", "refuse", "disabled")
ENV_MODE = "SDBENCH_QUIET_GUARD"
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


class Contaminated(RuntimeError):
    """Raised in ``refuse`` mode when the timed part ran beside other work."""


def _clock_ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def _read_stat(pid: int) -> tuple[int, int, float] | None:
    """(ppid, process group, cpu seconds) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            raw = fh.read()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    ppid, pgrp = int(fields[1]), int(fields[2])
    cpu = (int(fields[11]) + int(fields[12])) / _clock_ticks()
    return ppid, pgrp, cpu


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
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


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def own_family(pid: int | None = None) -> set[int]:
    """This process, its ancestors and all its descendants."""
    me = pid or os.getpid()
    parents: dict[int, int] = {}
    for p in _all_pids():
        st = _read_stat(p)
        if st:
            parents[p] = st[0]
    family = {me}
    changed = True
    while changed:  # descendants (siblings of the workflow's other jobs do count)
        changed = False
        for p, pp in parents.items():
            if pp in family and p not in family:
                family.add(p)
                changed = True
    cur = me
    while cur in parents and parents[cur] > 1:  # ancestors: the workflow, its shell
        cur = parents[cur]
        family.add(cur)
    return family


def allowed_cores() -> int:
    """Cores this process may run on (its affinity mask, as SLURM or taskset sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def _gpu_snapshot() -> dict[str, Any]:
    """Other compute processes and free memory per GPU (empty without nvidia-smi)."""
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
    load_max: float = 0.0
    busy: dict[str, float] = field(default_factory=dict)  # "pid cmd" -> mean CPU %
    engines: set[str] = field(default_factory=set)
    gpu_others: set[int] = field(default_factory=set)
    gpu_free_mib: float = float("nan")
    samples: int = 0
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
        }


class QuietGuard:
    """Samples the node in a background thread between :meth:`start` and :meth:`stop`."""

    def __init__(self, mode: str = "flag", interval: float = SAMPLE_SECONDS) -> None:
        if mode not in MODES:
            from sdbench.errors import ConfigError

            raise ConfigError(f"quiet guard mode {mode!r}: expected one of {', '.join(MODES)}")
        self.report = GuardReport(mode=mode, cores=allowed_cores())
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._first: dict[int, tuple[float, float, str]] = {}  # pid -> (time, cpu s, cmd) first seen
        self._last: dict[int, tuple[float, float]] = {}

    def _sample(self) -> None:
        family = own_family()
        now = time.monotonic()
        for pid in _all_pids():
            if pid in family:
                continue
            st = _read_stat(pid)
            if st is None:
                continue
            cmd = _cmdline(pid)
            if _is_engine(cmd):
                self.report.engines.add(f"{pid} {cmd[:80]}")
            self._first.setdefault(pid, (now, st[2], cmd))
            self._last[pid] = (now, st[2])
        self.report.load_max = max(self.report.load_max, os.getloadavg()[0])
        gpu = _gpu_snapshot()
        self.report.gpu_others |= {p for p in gpu.get("gpu_pids", []) if p not in family}
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

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> None:
        """Take the 'before' sample and start sampling in the background."""
        if self.report.mode == "disabled":
            return
        self._started = time.monotonic()
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="sdbench-quiet-guard", daemon=True)
        self._thread.start()

    def stop(self) -> GuardReport:
        """Stop sampling, decide, and (mode ``refuse``) raise :class:`Contaminated`."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            # A timed part shorter than the judging window (tiny cells) would leave every process
            # unjudged: extend the observation to the window, after the timed part has ended.
            short = MIN_WINDOW_S * 1.25 - (time.monotonic() - self._started)
            if short > 0:
                time.sleep(short)
            self._sample()
        r = self.report
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
        if r.mode == "refuse" and r.reasons:
            raise Contaminated("timed part ran on a busy machine: " + "; ".join(r.reasons))
        return r


def mode_from_env(default: str = "flag") -> str:
    """Guard mode for this process: ``$SDBENCH_QUIET_GUARD`` (set by the workflow) or ``default``."""
    return os.environ.get(ENV_MODE, default) or default
