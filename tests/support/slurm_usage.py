"""Per-job peak memory and time on the test cluster, which has no SLURM accounting database.

:class:`UsageRecorder` watches one cluster of tests/support/slurm_cluster.py from outside its
jobs and writes one JSON record per job into a directory, which ``sdbench bench job-usage``
(src/sdbench/bench/jobusage.py) reads, checks and tabulates.

Why a watcher and not a wrapper inside each job (``/usr/bin/time -v``, or a job's own
``getrusage`` at exit): what a site's SLURM enforces is the whole job, every process of it at
once (the cgroup of its batch and srun steps), and here a job is three Python processes before
the rule's command even starts (the batch step's Snakemake, ``srun``, the step's Snakemake;
each re-parses the workflow). A wrapper sees one process tree's largest member
(``ru_maxrss`` is a maximum, not a sum) and nothing of a job that SLURM kills at its time
limit; the watcher sees every process of the job and keeps what it saw when the job is killed.

How:

* every ``interval`` s (0.5) it lists ``/proc`` and attributes each process to a job of *this*
  cluster: ``SLURM_JOB_ID`` in its environment and ``SLURM_CONF=<the cluster's conf>`` (other
  clusters on the host number their jobs from 1 too), or a parent already attributed to that
  job (the slurm-jobstep plugin strips ``SLURM_CONF`` from the shell that runs ``srun``);
  slurmstepd itself is not counted (it lies outside a job's memory cgroup on a site);
* per job it keeps ``peak_rss_kb``, the largest sum over the job's live processes of each one's
  own peak (``VmHWM``: the kernel's exact high-water mark, so a spike between two samples still
  counts; an upper bound of what a memory cgroup would have seen, page cache aside) and
  ``sampled_rss_kb``, the largest sum of their current ``VmRSS`` (a lower bound), with the
  single largest process and its command line, and each process's start (from ``/proc``, exact),
  last sighting, peak, CPU seconds at its last sighting and first arguments (``process_list``:
  where a job's time went);
* every ``query_every`` s (2) it reads the queue, ``squeue -t all`` (finished jobs stay there for
  ``MinJobAge`` = 600 s), for each job's state, partition, time limit, memory, CPUs, GPUs
  (``tres-per-job``), submit/start/end times and comment (the Snakemake SLURM executor sets it
  to ``rule_<rule>_wildcards_<values>``); and writes a job's record once the job has ended
  (``<job_id>.json``, written aside and renamed). :meth:`UsageRecorder.stop` writes the rest.

A process that lives less than one interval may be missed (its memory then is not counted);
a job's wall time comes from SLURM's start and end times (1 s resolution).

Run it beside a cluster: ``recorder = UsageRecorder(cluster, usage_dir); recorder.start()``
... ``recorder.stop()``; or ``python tests/support/slurm_cluster.py hold --usage-dir DIR``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdbench.bench.jobusage import ACTIVE_STATES, RECORD_VERSION

# The squeue -O fields each record carries, as SLURM prints them (parsed by sdbench.bench.jobusage).
SQUEUE_FIELDS = (
    "JobID", "State", "Partition", "TimeLimit", "MinMemory", "NumCPUs", "tres-per-job", "tres-per-node",
    "SubmitTime", "StartTime", "EndTime", "Name", "Comment", "WorkDir",
)
# Processes kept per job in its record (start, last seen, peak, first arguments), oldest first.
MAX_PROCESSES = 40
# Fields are read as fixed-width columns; this separator follows each (no field holds it).
SEP = "\x1f"


@dataclass
class _JobUsage:
    peak_rss_kb: int = 0
    sampled_rss_kb: int = 0
    peak_process_kb: int = 0
    peak_process: str = ""
    processes: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)  # key -> start, cmd, ...
    samples: int = 0
    first_seen: float | None = None
    last_seen: float | None = None


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def _status_kb(status: bytes, key: bytes) -> int:
    for line in status.splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


def squeue_records(text: str) -> list[dict[str, str]]:
    """Rows of ``squeue -h -O <field>:<width><SEP>,...`` as dicts keyed by :data:`SQUEUE_FIELDS`."""
    rows = []
    for line in text.splitlines():
        values = [v.strip() for v in line.split(SEP)][: len(SQUEUE_FIELDS)]
        if len(values) == len(SQUEUE_FIELDS) and values[0]:
            rows.append(dict(zip(SQUEUE_FIELDS, values)))
    return rows


class UsageRecorder:
    """Watch a cluster's jobs; one JSON record per job in ``usage_dir`` (see the module docstring)."""

    def __init__(self, cluster: Any, usage_dir: str | os.PathLike[str], *, interval: float = 0.5,
                 query_every: float = 2.0) -> None:
        self.cluster = cluster
        self.usage_dir = Path(usage_dir)
        self.interval = interval
        self.query_every = query_every
        self.marker = f"SLURM_CONF={cluster.conf}".encode()
        self.jobs: dict[str, _JobUsage] = {}
        self.queue: dict[str, dict[str, str]] = {}
        self.written: set[str] = set()
        self.before: set[str] = set()  # the queue's jobs when the recorder started (not recorded)
        self.identity: dict[tuple[int, int], tuple[str | None, bool]] = {}  # (pid, start tick) -> _identify
        self.owned: dict[tuple[int, int], str] = {}  # (pid, start tick) -> job id
        self.cpu: dict[tuple[int, int], float] = {}  # (pid, start tick) -> CPU seconds so far
        self.ticks = os.sysconf("SC_CLK_TCK")  # /proc/<pid>/stat start times are clock ticks since boot
        self.boot_time = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                              if line.startswith("btime "))
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- sampling
    def _attribute(self) -> dict[tuple[int, int], str]:
        """Live processes of this cluster's jobs: (pid, start tick) -> job id."""
        live: dict[tuple[int, int], int] = {}  # key -> parent pid
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            stat = _read(f"/proc/{entry}/stat")
            if stat is None:
                continue
            fields = stat[stat.rfind(b")") + 2:].split()
            if fields[0] in (b"Z", b"X"):
                continue
            key = (int(entry), int(fields[19]))  # a pid with its start tick: pids are reused
            live[key] = int(fields[1])
            self.cpu[key] = (int(fields[11]) + int(fields[12])) / self.ticks  # utime + stime
            if key not in self.identity:
                self.identity[key] = self._identify(entry)
        self.identity = {key: ident for key, ident in self.identity.items() if key in live}
        self.owned = {key: job for key, job in self.owned.items() if key in live}
        self.cpu = {key: cpu for key, cpu in self.cpu.items() if key in live}
        for key, (job, ours) in self.identity.items():
            if job is not None and ours:
                self.owned[key] = job
        # The job's processes whose environment lost SLURM_CONF: their parent is the job's.
        by_pid = {key[0]: key for key in live}
        changed = True
        while changed:
            changed = False
            for key, ppid in live.items():
                job = self.identity[key][0]
                parent = by_pid.get(ppid)
                if key not in self.owned and job is not None and self.owned.get(parent) == job:
                    self.owned[key] = job
                    changed = True
        return dict(self.owned)

    def _identify(self, pid: str) -> tuple[str | None, bool]:
        """(SLURM_JOB_ID or None, whether SLURM_CONF names this cluster) of a process; slurmstepd: no job."""
        cmd = (_read(f"/proc/{pid}/cmdline") or b"").split(b"\0")[0]
        if cmd.rsplit(b"/", 1)[-1].startswith(b"slurmstepd"):
            return None, False
        environ = (_read(f"/proc/{pid}/environ") or b"").split(b"\0")
        job = next((var.split(b"=", 1)[1].decode() for var in environ if var.startswith(b"SLURM_JOB_ID=")), None)
        return job, self.marker in environ

    def sample(self) -> None:
        """One look at every process of the cluster's jobs."""
        now = time.time()
        per_job: dict[str, list[tuple[tuple[int, int], int, int]]] = {}
        for key, job in self._attribute().items():
            status = _read(f"/proc/{key[0]}/status")
            if status is None:
                continue
            per_job.setdefault(job, []).append((key, _status_kb(status, b"VmRSS:"), _status_kb(status, b"VmHWM:")))
        for job, procs in per_job.items():
            usage = self.jobs.setdefault(job, _JobUsage())
            usage.samples += 1
            usage.first_seen = usage.first_seen or now
            usage.last_seen = now
            usage.peak_rss_kb = max(usage.peak_rss_kb, sum(hwm for _, _, hwm in procs))
            usage.sampled_rss_kb = max(usage.sampled_rss_kb, sum(rss for _, rss, _ in procs))
            for key, _rss, hwm in procs:
                proc = usage.processes.get(key)
                if proc is None and len(usage.processes) < MAX_PROCESSES:
                    proc = usage.processes[key] = {"start": self.boot_time + key[1] / self.ticks}
                if proc is not None:
                    proc["last_seen"], proc["hwm_kb"] = now, max(hwm, proc.get("hwm_kb", 0))
                    proc["cpu_s"] = self.cpu.get(key, 0.0)
                    argv = (_read(f"/proc/{key[0]}/cmdline") or b"").split(b"\0")
                    if argv[0]:  # read again each time: a shell may exec its command (same pid)
                        proc["argv"] = [a.decode(errors="replace")[:200] for a in argv[:6] if a]
                if hwm > usage.peak_process_kb:
                    usage.peak_process_kb = hwm
                    cmdline = (_read(f"/proc/{key[0]}/cmdline") or b"").replace(b"\0", b" ").decode(errors="replace")
                    usage.peak_process = cmdline.strip()[:300]

    # ------------------------------------------------------------------ queue
    def _read_queue(self) -> None:
        """Every job squeue shows (running, pending and ended within MinJobAge) into ``self.queue``."""
        fmt = ",".join(f"{name}:{600 if name in ('Comment', 'WorkDir') else 40}{SEP}" for name in SQUEUE_FIELDS)
        out = self.cluster.run("squeue", "-h", "-t", "all", "-O", fmt, check=False, timeout=30)
        if out.returncode != 0:
            self.errors.append(out.stderr.strip()[-500:])
            return
        for row in squeue_records(out.stdout):
            self.queue[row["JobID"]] = row

    def query(self) -> None:
        """Read the queue and write the record of every job of this recording that has ended."""
        self._read_queue()
        for job, row in self.queue.items():
            if job not in self.written and row["State"] not in ACTIVE_STATES and self._ours(job):
                self.write(job)

    def _ours(self, job: str) -> bool:
        """A job of this recording: seen running, or not yet in the queue when the recorder started."""
        return job in self.jobs or job not in self.before

    def write(self, job: str) -> None:
        usage = self.jobs.get(job, _JobUsage())
        record = {
            "version": RECORD_VERSION,
            "job_id": job,
            "squeue": self.queue.get(job, {}),
            "usage": {
                "peak_rss_kb": usage.peak_rss_kb,
                "sampled_rss_kb": usage.sampled_rss_kb,
                "peak_process_kb": usage.peak_process_kb,
                "peak_process": usage.peak_process,
                "processes": len(usage.processes),
                "process_list": sorted(usage.processes.values(), key=lambda p: p["start"]),
                "samples": usage.samples,
                "first_seen": usage.first_seen,
                "last_seen": usage.last_seen,
                "interval_s": self.interval,
            },
        }
        self.usage_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.usage_dir / f".{job}.json.tmp"
        tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        tmp.replace(self.usage_dir / f"{job}.json")
        self.written.add(job)

    # -------------------------------------------------------------- lifecycle
    def _run(self) -> None:
        next_query = 0.0
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.sample()
                if t0 >= next_query:
                    self.query()
                    next_query = t0 + self.query_every
            except Exception as exc:  # keep watching; say what went wrong at stop
                self.errors.append(repr(exc))
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))

    def start(self) -> UsageRecorder:
        self._read_queue()
        self.before = set(self.queue)  # a sbatch refused at submission leaves a FAILED job too
        self._thread = threading.Thread(target=self._run, name="slurm-usage", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching; write every job seen or submitted since the start (unfinished ones too)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.query()
        for job in self.queue:
            if job not in self.written and self._ours(job):
                self.write(job)
        for job in self.jobs:
            if job not in self.written:
                self.write(job)
