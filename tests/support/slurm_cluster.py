"""A throw-away, single-node SLURM cluster for tests (munged + slurmctld + slurmd).

Usage::

    from support.slurm_cluster import slurm_cluster

    with slurm_cluster() as cluster:           # installs packages, starts daemons
        job = cluster.sbatch("--wrap", "hostname", output=tmp / "out.txt")
        cluster.wait_job(job)                  # -> "COMPLETED"
        subprocess.run(["snakemake", ...], env=cluster.env)
    # every daemon, slurmstepd and job process of this cluster is gone here

``tests/conftest.py`` wraps it as the session fixture ``slurm_cluster``.

``start_cluster(shape=paper_node_shape("profiles/slurm"))`` declares the GPU node of a SLURM
profile's site block instead of the machine (:class:`NodeShape`: partitions and MaxTime, typed
GPUs on stand-in device files, 192 CPUs and 2 TB, nothing enforced), and
``python tests/support/slurm_cluster.py hold --profile profiles/slurm --env-file F [--usage-dir D]``
keeps such a cluster up for a long run outside pytest (scripts/rehearse-paper-grid.sh;
docs/cluster.md, "Rehearsal on a local SLURM").

What it does
------------
* Installs the Debian packages ``slurmctld slurmd slurm-client munge``
  (``--no-install-recommends``, ``DEBIAN_FRONTEND=noninteractive``) when a
  binary is missing and we are root; ``apt-get update`` runs only if the first
  install attempt fails.  Not root and not installed → :class:`SlurmUnavailable`
  (the fixture turns that into a skip).  ``SDBENCH_SLURM_TESTS=0`` also skips.
* Keeps ALL state in one temp dir (``/tmp/sdbench-slurm-XXXX``, short because
  slurmd puts unix sockets in its spool dir): a fresh munge key made by
  ``mungekey``, munged in the foreground with its own ``--socket``/``--key-file``/
  ``--pid-file``/``--log-file``/``--seed-file`` (munge 0.5.15 runs as root
  without ``--force``; it only insists that every directory above the socket is
  world-executable, so the temp dir is chmod 0755), and a generated slurm.conf
  whose ``AuthInfo=socket=...`` points auth/munge *and* cred/munge at that
  socket (slurm.conf(5) of 22.05: "Used by auth/munge and cred/munge").
* Clients find the config through ``SLURM_CONF`` (in ``cluster.env``) and
  through small wrappers ``<tmp>/bin/srun`` etc. put first on ``PATH``: the
  slurm-jobstep plugin strips ``SLURM_CONF`` before its nested ``srun``, so
  without them every Snakemake job fails (see :func:`write_client_wrappers`).
* SlurmctldPort/SlurmdPort are free ports picked at start, so this cluster
  cannot clash with a system SLURM or another test cluster on the same host.
* Starts ``slurmctld -D -f <conf>`` and ``slurmd -D -f <conf>`` in their own
  sessions (Ctrl-C in the terminal does not hit them; we stop them in order),
  then waits (bounded) until ``sinfo`` reports the node ``idle``; on timeout or
  if a daemon dies it raises :class:`SlurmClusterError` with the log tails.
* Stops everything it started in ``finally`` (also on failure and
  KeyboardInterrupt; while a cluster is live SIGTERM is turned into
  KeyboardInterrupt, ``atexit`` is a safety net, and the daemons carry a
  parent-death signal via ``setpriv --pdeathsig TERM`` for a SIGKILLed
  test process): cancels the cluster's jobs,
  SIGTERM then SIGKILL to slurmd, slurmctld, munged (by Popen and by pid file),
  then kills any leftover ``slurmstepd`` / job / client process of *this*
  cluster (recognised by ``SLURM_CONF=<our conf>`` in /proc/<pid>/environ) and
  removes the temp dir (``SDBENCH_SLURM_KEEP=1`` keeps it).  If the test
  process was SIGKILLed, the next start reaps the stale dir and its surviving
  job processes (:func:`reap_stale_clusters`).  The only state
  left outside the temp dir is the apt packages and, if ``hostname -s`` did
  not resolve, one ``127.0.0.1 <host>`` line in /etc/hosts.

Process tracking (scancel must end a job's whole process tree)
--------------------------------------------------------------
There is no cgroup support here (no systemd, no delegated cgroup tree), so
``proctrack/cgroup`` is out.  We use **proctrack/pgid** (DEFAULT_PROCTRACK).
Measured with slurm 22.05.8 on Debian 12: a batch script starting a tree
(background ``sleep``, nested ``bash -c`` with ``sleep`` + ``python`` + the
python's own child, a double-forked orphan, a child ignoring SIGTERM and a
``setsid`` child), then ``scancel``:

=====================  ===================  ==============
process                proctrack/linuxproc  proctrack/pgid
=====================  ===================  ==============
batch bash, bg sleep   killed (0.06 s)      killed (0.07 s)
nested bash/python/    killed (0.06 s)      killed (0.07 s)
python's child
orphan (double fork,   SURVIVES             killed (0.07 s)
re-parented to PID 1)
child ignoring SIGTERM SURVIVES             killed (0.07 s)
whose parent shell died
``setsid`` child       killed (0.06 s)      SURVIVES
=====================  ===================  ==============

Why: linuxproc finds the step's processes by walking parent pids below
slurmstepd, so as soon as SIGTERM kills a parent, its still-running children
are re-parented to PID 1 and are no longer found when slurmstepd sends the
final SIGKILL (exactly the case of an engine process that shuts down slowly on
SIGTERM while its launcher exits at once).  pgid signals the task's process
group (slurmstepd makes each task a group leader), which holds the whole tree
regardless of parentage; it misses only processes that leave the group
(``setsid``/``setpgid``).  Nothing on our path does that: snakemake's shell
and the slurm-jobstep plugin's ``srun`` use plain ``Popen``, and vLLM's
offline ``LLM()`` starts its EngineCore with multiprocessing (no new session).
So pgid is what "scancel ends the engine" needs here; the harness's ``stop()``
still sweeps any stray process carrying this cluster's ``SLURM_CONF``.
``KillWait`` (SIGTERM → SIGKILL grace for running steps) is 5 s.
``SDBENCH_SLURM_PROCTRACK=proctrack/linuxproc`` switches the plugin (the
scancel test then fails on the orphan and the SIGTERM-ignoring child).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
# Every binary the harness (or a client) needs, and the package shipping it.
BINARIES = {
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "slurmstepd": "slurmd",
    "sbatch": "slurm-client",
    "squeue": "slurm-client",
    "sinfo": "slurm-client",
    "scancel": "slurm-client",
    "scontrol": "slurm-client",
    "srun": "slurm-client",
    "munged": "munge",
    "mungekey": "munge",
}
SBIN_DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin", "/usr/local/bin")
DEFAULT_PARTITION = "debug"
DEFAULT_PROCTRACK = "proctrack/pgid"


class SlurmUnavailable(RuntimeError):
    """SLURM cannot be provided here (not root and not installed, or disabled)."""


class SlurmClusterError(RuntimeError):
    """The cluster failed to install, start or answer."""


# --------------------------------------------------------------------- install


def _search_path() -> str:
    parts = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(dict.fromkeys([p for p in parts if p] + list(SBIN_DIRS)))


def which(name: str) -> str | None:
    return shutil.which(name, path=_search_path())


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if which(b) is None]


def _apt(args: Sequence[str], timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", PATH=_search_path())
    return subprocess.run(["apt-get", *args], env=env, capture_output=True, text=True, timeout=timeout)


def ensure_packages(timeout: float = 900) -> float:
    """Install the SLURM/munge Debian packages if a binary is missing.

    Returns the seconds spent (0.0 when everything was already there).
    Raises SlurmUnavailable when not root (or no apt-get), SlurmClusterError
    when apt-get fails as root.
    """
    missing = missing_binaries()
    if not missing:
        return 0.0
    if os.geteuid() != 0:
        raise SlurmUnavailable(
            f"SLURM binaries missing ({', '.join(missing)}) and not root; install "
            f"{' '.join(PACKAGES)} (apt-get install --no-install-recommends) to run these tests"
        )
    if which("apt-get") is None:
        raise SlurmUnavailable(f"SLURM binaries missing ({', '.join(missing)}) and no apt-get")
    t0 = time.monotonic()
    install = ["install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    lists = Path("/var/lib/apt/lists")
    have_lists = lists.is_dir() and any(p.name.endswith(("Packages", ".lz4", ".gz", ".xz")) for p in lists.iterdir())
    proc = _apt(install, timeout) if have_lists else None
    if proc is None or proc.returncode != 0:
        upd = _apt(["update", "-q"], timeout)
        if upd.returncode != 0:
            raise SlurmClusterError(f"apt-get update failed:\n{upd.stdout[-2000:]}\n{upd.stderr[-2000:]}")
        proc = _apt(install, timeout)
    if proc.returncode != 0:
        raise SlurmClusterError(f"apt-get install {' '.join(PACKAGES)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    still = missing_binaries()
    if still:
        raise SlurmClusterError(f"after installing {' '.join(PACKAGES)} still missing: {still}")
    return time.monotonic() - t0


# ------------------------------------------------------------------ host facts


def short_hostname() -> str:
    return socket.gethostname().split(".")[0]


def ensure_hostname_resolves(host: str) -> bool:
    """Make ``host`` resolvable (slurm needs it); returns True if /etc/hosts was edited."""
    try:
        socket.gethostbyname(host)
        return False
    except OSError:
        pass
    if os.geteuid() != 0:
        raise SlurmUnavailable(f"hostname {host!r} does not resolve and not root to add it to /etc/hosts")
    with open("/etc/hosts", "a") as fh:
        fh.write(f"127.0.0.1 {host}  # added by sdbench tests/support/slurm_cluster.py\n")
    return True


def node_hardware() -> dict[str, str]:
    """``slurmd -C`` as a dict (NodeName, CPUs, Boards, ..., RealMemory)."""
    out = subprocess.run([which("slurmd") or "slurmd", "-C"], capture_output=True, text=True, timeout=30)
    first = next((ln for ln in out.stdout.splitlines() if ln.startswith("NodeName=")), "")
    if not first:
        raise SlurmClusterError(f"`slurmd -C` gave no node line:\n{out.stdout}\n{out.stderr}")
    return dict(tok.split("=", 1) for tok in first.split())


def available_memory_mb() -> int:
    with open("/proc/meminfo") as fh:
        info = {ln.split(":")[0]: int(ln.split()[1]) for ln in fh if ln.split()[1:2] and ln.split()[1].isdigit()}
    return int(info.get("MemAvailable", info.get("MemFree", 0)) // 1024)


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# -------------------------------------------------------------------- processes


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (PID 1 here reaps slowly)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _read_pidfile(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
    return pids


def processes_of_cluster(conf: Path, root: Path) -> list[int]:
    """Pids of slurmstepd, job and client processes belonging to the cluster of ``conf``.

    A process belongs to it when it is a ``slurmstepd`` whose environment or
    open files mention our temp dir, or when its environment has
    ``SLURM_CONF=<conf>`` (a job's process, or a client such as a snakemake
    started with ``cluster.env``, which would wait forever once the cluster
    is gone).  Our own process and its ancestors are never returned.
    """
    marker = f"SLURM_CONF={conf}".encode()
    rootb = str(root).encode()
    skip = _ancestors()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                environ = fh.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        if not pid_alive(pid):
            continue
        is_job = marker in environ
        is_stepd = cmdline.startswith(b"slurmstepd") or b"/slurmstepd" in cmdline.split(b"\0")[0]
        if is_stepd and not (marker in environ or rootb in cmdline):
            try:
                links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
                links.append(os.readlink(f"/proc/{pid}/cwd"))
            except OSError:
                links = []
            is_stepd = any(link.startswith(str(root)) for link in links)
        if is_job or is_stepd:
            found.append(pid)
    return found


def _signal(pid: int | None, sig: int) -> None:
    if pid and pid > 1:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def terminate(pids: Sequence[int], timeout: float = 10.0) -> list[int]:
    """SIGTERM, wait up to ``timeout`` s, then SIGKILL; returns pids that needed SIGKILL."""
    pids = [p for p in dict.fromkeys(pids) if p and p > 1 and p != os.getpid()]
    for p in pids:
        _signal(p, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.1)
    killed = [p for p in pids if pid_alive(p)]
    for p in killed:
        _signal(p, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(pid_alive(p) for p in killed):
        time.sleep(0.1)
    return killed


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no {path.name})"
    return "\n".join(text[-lines:])


# ---------------------------------------------------------------------- config


@dataclass(frozen=True)
class NodeShape:
    """A node declared larger than the machine: what SLURM schedules against, not what runs.

    slurmd takes the declared CPUs, sockets and memory instead of what it detects
    (``SlurmdParameters=config_overrides``), so jobs asking for 64 CPUs and 256 GB are placed
    on a 2-core machine; nothing is enforced here (no cgroups), the jobs simply share the
    machine. SLURM 22.05 drops a GPU GRES without device files ("Removing file-less GPU
    gpu:h100 from final GRES list": the node then registers 0 GPUs and is drained), so each GPU
    is a device node of the cluster's own (:func:`make_device_files`); SLURM allocates them like
    real ones and sets ``CUDA_VISIBLE_DEVICES`` in a job, and nothing can open them.
    """

    cpus: int
    sockets: int
    real_memory_mb: int
    gres: tuple[tuple[str, str, int], ...] = ()  # (name, type, count), e.g. ("gpu", "h100", 8)
    partitions: tuple[tuple[str, int | None], ...] = ((DEFAULT_PARTITION, None),)  # (name, MaxTime min)

    @property
    def partition(self) -> str:
        """The default partition (the first)."""
        return self.partitions[0][0]

    def gres_conf(self, nodename: str, devdir: Path) -> str:
        """gres.conf: each GRES on the device files ``devdir/<name><i>`` (no autodetection)."""
        lines = ["# Generated by sdbench tests/support/slurm_cluster.py: GRES on stand-in device files",
                 "AutoDetect=off"]
        lines += [f"NodeName={nodename} Name={name} Type={kind} File={devdir}/{name}[0-{count - 1}]"
                  for name, kind, count in self.gres]
        return "\n".join(lines) + "\n"

    def conf_lines(self, nodename: str) -> tuple[str, str, str]:
        """slurm.conf's node line, partition lines and the settings the shape needs before them."""
        if self.cpus % self.sockets:
            raise ValueError(f"NodeShape: {self.cpus} CPUs do not divide into {self.sockets} sockets")
        gres = ",".join(f"{name}:{kind}:{count}" for name, kind, count in self.gres)
        node = (f"NodeName={nodename} CPUs={self.cpus} Boards=1 SocketsPerBoard={self.sockets} "
                f"CoresPerSocket={self.cpus // self.sockets} ThreadsPerCore=1 RealMemory={self.real_memory_mb}"
                + (f" Gres={gres}" if gres else "") + " State=UNKNOWN")
        parts = "\n".join(
            f"PartitionName={name} Nodes={nodename} Default={'YES' if i == 0 else 'NO'} "
            f"MaxTime={'INFINITE' if limit is None else limit} State=UP"
            for i, (name, limit) in enumerate(self.partitions)
        )
        types = sorted({name for name, _, _ in self.gres})
        # EnforcePartLimits: sbatch refuses a job over its partition's MaxTime ("Requested time
        # limit is invalid") instead of leaving it pending forever.
        declared = "SlurmdParameters=config_overrides\nEnforcePartLimits=ALL\n" + (
            f"GresTypes={','.join(types)}\n" if types else "")
        return node, parts, declared


# Major number of NVIDIA's character devices (/dev/nvidia<N> are 195:<N>). Without the driver no
# kernel module claims it, so the stand-in nodes cannot be opened (ENXIO).
NVIDIA_MAJOR = 195


def make_device_files(devdir: Path, shape: NodeShape) -> None:
    """The device files gres.conf names: character devices (root), else regular files.

    slurmd checks only that a GRES file exists and reads its major/minor numbers; a regular file
    is kept too, after one "not a valid character or block device" error per file in its log.
    """
    devdir.mkdir(mode=0o755, exist_ok=True)
    for name, _kind, count in shape.gres:
        for i in range(count):
            path = devdir / f"{name}{i}"
            try:
                os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, i))
            except PermissionError:
                path.touch(mode=0o600)


# The node of an 8-GPU server (2 sockets x 96 cores, 2 TB; GPUs and partitions from a profile:
# see paper_node_shape). Enough for every ask of config/paper.yaml under profiles/slurm: engine
# jobs of up to 4 GPUs x 16 CPUs and 4 x 64,000 MB.
GPU_NODE_CPUS = 192
GPU_NODE_SOCKETS = 2
GPU_NODE_MEMORY_MB = 2_048_000


def paper_node_shape(profile: str | os.PathLike[str]) -> NodeShape:
    """The GPU node and partitions a SLURM profile's site block describes (``profiles/slurm``).

    Partitions and their MaxTime from ``site=`` in the profile's ``config:`` (the engine partition
    first), the GPUs per node from the engine partition's ``gpus_per_node`` and their type from
    ``set-resources: run_engine: gpu_model``.
    """
    import yaml  # a dependency of the project; kept out of the module's stdlib-only import path

    data = yaml.safe_load((Path(profile) / "config.yaml").read_text())
    site_entries = [e for e in data.get("config", []) if str(e).startswith("site=")]
    if len(site_entries) != 1:
        raise ValueError(f"{profile}: expected one site= entry in config:, found {len(site_entries)}")
    site = yaml.safe_load(site_entries[0].split("=", 1)[1])
    engine_partition = site["engine_partition"]
    partitions = site["partitions"]
    order = [engine_partition] + sorted(p for p in partitions if p != engine_partition)
    engine = data.get("set-resources", {}).get("run_engine", {})
    gpus = int(partitions[engine_partition].get("gpus_per_node", 0))
    gres = (("gpu", str(engine["gpu_model"]), gpus),) if gpus and engine.get("gpu_model") else ()
    return NodeShape(
        cpus=GPU_NODE_CPUS, sockets=GPU_NODE_SOCKETS, real_memory_mb=GPU_NODE_MEMORY_MB, gres=gres,
        partitions=tuple((name, int(partitions[name]["max_runtime"])) for name in order),
    )


def render_slurm_conf(
    root: Path,
    *,
    nodename: str,
    hardware: dict[str, str],
    real_memory_mb: int,
    ctld_port: int,
    slurmd_port: int,
    munge_socket: Path,
    partition: str = DEFAULT_PARTITION,
    proctrack: str = DEFAULT_PROCTRACK,
    user: str = "root",
    min_job_age: int = 600,
    kill_wait: int = 5,
    shape: NodeShape | None = None,
) -> str:
    """slurm.conf of the cluster: the machine's node and one partition, or the node ``shape`` declares."""
    if shape is None:
        hw = " ".join(
            f"{k}={hardware[k]}" for k in ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")
            if k in hardware
        )
        node = f"NodeName={nodename} {hw} RealMemory={real_memory_mb} State=UNKNOWN"
        partitions = f"PartitionName={partition} Nodes={nodename} Default=YES MaxTime=INFINITE State=UP"
        declared = ""
    else:
        node, partitions, declared = shape.conf_lines(nodename)
    return f"""\
# Generated by sdbench tests/support/slurm_cluster.py; all state lives in {root}
ClusterName=sdbenchtest
SlurmctldHost={nodename}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
MpiDefault=none
MailProg=/bin/true
ProctrackType={proctrack}
TaskPlugin=task/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
MinJobAge={min_job_age}
KillWait={kill_wait}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
DefMemPerCPU=1024
{declared}{node}
{partitions}
"""


# Client commands wrapped in <root>/bin (see write_client_wrappers).
CLIENTS = ("srun", "sbatch", "squeue", "scancel", "sinfo", "scontrol", "salloc", "sstat")


def write_client_wrappers(bindir: Path, conf: Path) -> Path:
    """Write ``<bindir>/srun`` etc.: ``SLURM_CONF`` defaults to ``conf``, then exec the real binary.

    Needed because snakemake-executor-plugin-slurm-jobstep (0.6.1) strips every
    ``SLURM_*`` variable except the job's identity (SLURM_JOB_ID, ...) before
    the nested ``srun``, including ``SLURM_CONF``; with no /etc/slurm/slurm.conf
    srun then fails ("DNS SRV lookup failed ... Could not establish a
    configuration source").  PATH survives (sbatch --export=ALL), so a wrapper
    first on PATH restores the config without writing outside the temp dir.
    """
    bindir.mkdir(mode=0o755, exist_ok=True)
    for name in CLIENTS:
        real = which(name)
        if real is None:
            continue
        wrapper = bindir / name
        wrapper.write_text(f'#!/bin/sh\nexport SLURM_CONF="${{SLURM_CONF:-{conf}}}"\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
    return bindir


# --------------------------------------------------------------------- cluster


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    nodename: str
    partition: str
    cpus: int
    memory_mb: int
    proctrack: str
    ports: tuple[int, int]
    env: dict[str, str]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    reaped: list[Path] = field(default_factory=list)  # stale clusters cleaned up before this one
    leftovers: list[int] = field(default_factory=list)  # stray pids stop() had to kill
    stopped: bool = False

    # ------------------------------------------------------------ clients
    def run(self, *cmd: str, check: bool = True, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        """Run a client command (sbatch, squeue, ...) against this cluster."""
        proc = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, timeout=timeout, **kw)
        if check and proc.returncode != 0:
            raise SlurmClusterError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def sbatch(self, *args: str, wrap: str | None = None, script: str | Path | None = None,
               output: str | Path | None = None, cwd: str | Path | None = None) -> int:
        """Submit a job; returns its job id.  ``args`` are extra sbatch options."""
        cmd = ["sbatch", "--parsable", f"--partition={self.partition}", *args]
        if output is None and not any(a.startswith(("-o", "--output")) for a in args):
            output = self.root / "jobs" / "slurm-%j.out"  # not slurm-N.out in the caller's cwd
        if output is not None:
            cmd.append(f"--output={output}")
        if wrap is not None:
            cmd += ["--wrap", wrap]
        if script is not None:
            cmd.append(str(script))
        out = self.run(*cmd, cwd=cwd).stdout.strip()
        return int(out.split(";")[0].splitlines()[-1])

    def squeue(self, *args: str) -> str:
        return self.run("squeue", *args).stdout

    def scancel(self, *job_ids: int | str, check: bool = True) -> None:
        self.run("scancel", *map(str, job_ids), check=check)

    def job_state(self, job_id: int | str) -> str:
        """State (PENDING, RUNNING, COMPLETED, CANCELLED, FAILED, ...); '' if unknown."""
        out = self.run("squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T", check=False).stdout
        return out.strip().split("\n")[0].strip()

    def wait_job(self, job_id: int | str, timeout: float = 60, poll: float = 0.25) -> str:
        """Wait until the job leaves PENDING/RUNNING/...; returns the final state."""
        active = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", ""}
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state not in active:
                return state
            time.sleep(poll)
        raise SlurmClusterError(f"job {job_id} still {state or 'unknown'} after {timeout} s\n{self.log_tails()}")

    def node_state(self) -> str:
        """The node's state in sinfo ('' if it does not answer); sinfo prints it once per partition."""
        out = self.run("sinfo", "-h", "-N", "-n", self.nodename, "-o", "%T", check=False, timeout=15)
        states = sorted(set(out.stdout.split())) if out.returncode == 0 else []
        return states[0] if len(states) == 1 else " ".join(states)

    def log_tails(self, lines: int = 25) -> str:
        logs = sorted((self.root / "log").glob("*"))
        return "\n".join(f"--- {p.name} (tail) ---\n{_tail(p, lines)}" for p in logs)

    # --------------------------------------------------------- lifecycle
    def _start_daemon(self, name: str, cmd: list[str]) -> None:
        # If this process dies without cleaning up (SIGKILL), the kernel sends the daemon
        # SIGTERM (parent-death signal; tied to the forking thread, so main thread only).
        setpriv = which("setpriv")
        if setpriv and threading.current_thread() is threading.main_thread():
            cmd = [setpriv, "--pdeathsig", "TERM", "--", *cmd]
        log = open(self.root / "log" / f"{name}.stdout", "ab")
        try:
            self.procs[name] = subprocess.Popen(
                cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.root,
            )
        finally:
            log.close()

    def _wait_for(self, what: str, ok, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ok():
                return
            dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
            if dead:
                raise SlurmClusterError(f"{what}: daemon(s) exited {dead}\n{self.log_tails()}")
            time.sleep(0.2)
        raise SlurmClusterError(f"{what}: not ready after {timeout} s\n{self.log_tails()}")

    def start(self, timeout: float = 60) -> None:
        t0 = time.monotonic()
        munge_sock = self.root / "munge" / "munge.socket"
        self._start_daemon("munged", [
            which("munged") or "munged", "--foreground",
            f"--socket={munge_sock}", f"--key-file={self.root / 'munge' / 'munge.key'}",
            f"--pid-file={self.root / 'munge' / 'munged.pid'}", f"--log-file={self.root / 'log' / 'munged.log'}",
            f"--seed-file={self.root / 'munge' / 'munged.seed'}",
        ])
        self._wait_for("munged", munge_sock.exists, timeout)
        self._start_daemon("slurmctld", [which("slurmctld") or "slurmctld", "-D", "-f", str(self.conf)])
        self._start_daemon("slurmd", [which("slurmd") or "slurmd", "-D", "-f", str(self.conf)])
        self._wait_for("node idle in sinfo", lambda: self.node_state().rstrip("*") == "idle", timeout)
        self.timings["start"] = time.monotonic() - t0

    def stop(self, timeout: float = 10.0) -> None:
        """Stop everything this cluster started; idempotent, never raises."""
        if self.stopped:
            return
        self.stopped = True
        t0 = time.monotonic()
        errors = []
        # 1. cancel jobs while the daemons are still up, so slurmstepd cleans its tree
        with contextlib.suppress(Exception):
            if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
                ids = self.run("squeue", "-h", "-o", "%i", check=False, timeout=10).stdout.split()
                if ids:
                    self.run("scancel", *ids, check=False, timeout=10)
                    deadline = time.monotonic() + timeout
                    while time.monotonic() < deadline and self.run(
                            "squeue", "-h", "-o", "%i", check=False, timeout=10).stdout.split():
                        time.sleep(0.2)
        # 2. daemons: slurmd, slurmctld, munged (by Popen pid and by pid file)
        for name, pidfile in (("slurmd", "slurmd.pid"), ("slurmctld", "slurmctld.pid"),
                              ("munged", "munge/munged.pid")):
            try:
                pids = [_read_pidfile(self.root / pidfile)]
                if name in self.procs:
                    pids.append(self.procs[name].pid)
                terminate([p for p in pids if p], timeout)
                if name in self.procs:
                    with contextlib.suppress(Exception):
                        self.procs[name].wait(timeout=5)
            except Exception as exc:  # keep stopping the rest
                errors.append(f"{name}: {exc!r}")
        # 3. leftovers: slurmstepd, job and client processes of this cluster
        with contextlib.suppress(Exception):
            self.leftovers = processes_of_cluster(self.conf, self.root)
            terminate(self.leftovers, 3)
        self.timings["stop"] = time.monotonic() - t0
        if os.environ.get("SDBENCH_SLURM_KEEP") != "1":
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                (self.root / KEEP_MARKER).write_text("kept because SDBENCH_SLURM_KEEP=1\n")
            print(f"slurm_cluster: kept {self.root} (SDBENCH_SLURM_KEEP=1)")
        if errors:
            print(f"slurm_cluster: errors while stopping: {errors}")


TMP_PARENT = "/tmp"
TMP_PREFIX = "sdbench-slurm-"
KEEP_MARKER = "KEPT"


def reap_stale_clusters(min_age: float = 120.0) -> list[Path]:
    """Clean up after test processes that died without stopping their cluster (SIGKILL).

    A ``/tmp/sdbench-slurm-*`` dir is stale when its slurm.conf is older than
    ``min_age`` s and no live slurmctld/slurmd/munged mentions it (the daemons
    die with their parent through the parent-death signal, but slurmstepd and
    job processes survive).  Its leftover processes are killed and the dir
    removed; dirs kept with ``SDBENCH_SLURM_KEEP=1`` are left alone.
    """
    reaped = []
    for root in Path(TMP_PARENT).glob(f"{TMP_PREFIX}*"):
        conf = root / "slurm.conf"
        try:
            if (root / KEEP_MARKER).exists() or time.time() - conf.stat().st_mtime < min_age:
                continue
        except OSError:
            continue
        if any(f"{root}/" in line for line in running_slurm_daemons()
               if not line.split(" ", 2)[1].startswith("slurmstepd")):
            continue  # a live cluster (maybe another session's)
        terminate(processes_of_cluster(conf, root), 3)
        shutil.rmtree(root, ignore_errors=True)
        reaped.append(root)
    return reaped


_LIVE: list[SlurmCluster] = []
_PREV_SIGTERM: list = []  # the SIGTERM handler we replaced, while clusters are live


@atexit.register
def _stop_all() -> None:
    for cluster in list(_LIVE):
        cluster.stop()


def _on_sigterm(signum, frame):  # pragma: no cover - exercised by hand
    # Turn SIGTERM (CI timeout, kill) into KeyboardInterrupt: pytest then stops
    # and runs fixture teardown, and context managers run their finally.
    raise KeyboardInterrupt("SIGTERM: stopping the SLURM test cluster")


def _register(cluster: SlurmCluster) -> None:
    _LIVE.append(cluster)
    if (not _PREV_SIGTERM and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None)):
        _PREV_SIGTERM.append(signal.signal(signal.SIGTERM, _on_sigterm))


def _unregister(cluster: SlurmCluster) -> None:
    with contextlib.suppress(ValueError):
        _LIVE.remove(cluster)
    if not _LIVE and _PREV_SIGTERM and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _PREV_SIGTERM.pop())


def start_cluster(
    *,
    install: bool = True,
    partition: str = DEFAULT_PARTITION,
    proctrack: str | None = None,
    timeout: float = 60,
    kill_wait: int = 5,
    min_job_age: int = 600,
    shape: NodeShape | None = None,
) -> SlurmCluster:
    """Install (if needed) and start a cluster.  Caller must call ``.stop()``
    (prefer the :func:`slurm_cluster` context manager).

    ``shape``: the node and partitions to declare (:class:`NodeShape`, e.g. :func:`paper_node_shape`)
    instead of the machine's node in one ``partition``.
    """
    if os.environ.get("SDBENCH_SLURM_TESTS", "1").lower() in ("0", "no", "false", "off"):
        raise SlurmUnavailable("SLURM tests disabled by SDBENCH_SLURM_TESTS=0")
    if not sys.platform.startswith("linux"):
        raise SlurmUnavailable("SLURM harness needs Linux")
    proctrack = proctrack or os.environ.get("SDBENCH_SLURM_PROCTRACK", DEFAULT_PROCTRACK)
    timings = {"install": ensure_packages() if install else 0.0}
    if missing_binaries():
        raise SlurmUnavailable(f"SLURM binaries missing: {missing_binaries()}")
    t0 = time.monotonic()
    nodename = short_hostname()
    ensure_hostname_resolves(nodename)
    hw = node_hardware()
    memory = max(256, min(int(0.9 * available_memory_mb()), int(hw.get("RealMemory", 10**9))))
    user = pwd.getpwuid(os.geteuid()).pw_name  # root in CI; a non-root user runs jobs as itself

    reaped = reap_stale_clusters()
    root = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=TMP_PARENT))
    root.chmod(0o755)  # munged: every dir above its socket must be world-executable
    for sub in ("munge", "state", "spool", "log", "jobs"):
        (root / sub).mkdir(mode=0o755)
    key = root / "munge" / "munge.key"
    subprocess.run([which("mungekey") or "mungekey", "--create", f"--keyfile={key}"],
                   check=True, capture_output=True, timeout=30)
    key.chmod(0o400)
    ctld_port, slurmd_port = free_ports(2)
    conf = root / "slurm.conf"
    conf.write_text(render_slurm_conf(
        root, nodename=nodename, hardware=hw, real_memory_mb=memory, ctld_port=ctld_port,
        slurmd_port=slurmd_port, munge_socket=root / "munge" / "munge.socket", partition=partition,
        proctrack=proctrack, user=user, min_job_age=min_job_age, kill_wait=kill_wait, shape=shape,
    ))
    if shape is not None:
        make_device_files(root / "dev", shape)
        (root / "gres.conf").write_text(shape.gres_conf(nodename, root / "dev"))  # read from beside slurm.conf
        partition, memory = shape.partition, shape.real_memory_mb
    bindir = write_client_wrappers(root / "bin", conf)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
    env.update(SLURM_CONF=str(conf), PATH=f"{bindir}{os.pathsep}{_search_path()}")
    cluster = SlurmCluster(
        root=root, conf=conf, nodename=nodename, partition=partition,
        cpus=shape.cpus if shape else int(hw.get("CPUs", os.cpu_count() or 1)),
        memory_mb=memory, proctrack=proctrack, ports=(ctld_port, slurmd_port), env=env, timings=timings,
        reaped=reaped,
    )
    _register(cluster)
    try:
        cluster.timings["prepare"] = time.monotonic() - t0
        cluster.start(timeout=timeout)
    except BaseException:
        stop_cluster(cluster)
        raise
    return cluster


def stop_cluster(cluster: SlurmCluster) -> None:
    """Stop a cluster from :func:`start_cluster` (idempotent, never raises)."""
    try:
        cluster.stop()
    finally:
        _unregister(cluster)


@contextlib.contextmanager
def slurm_cluster(**kwargs) -> Iterator[SlurmCluster]:
    """Context manager: a running cluster, always stopped on exit (also on errors/Ctrl-C)."""
    cluster = start_cluster(**kwargs)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


def running_slurm_daemons() -> list[str]:
    """``pid cmdline`` of every slurmctld/slurmd/slurmstepd/munged on the host (diagnostics)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or not pid_alive(int(entry)):
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        first = cmd.split(" ")[0].rsplit("/", 1)[-1]
        if first in ("slurmctld", "slurmd", "munged") or first.startswith("slurmstepd"):
            out.append(f"{entry} {cmd}")
    return out


# ------------------------------------------------------------------ command line


def hold(argv: Sequence[str] | None = None) -> int:
    """``python tests/support/slurm_cluster.py hold``: a cluster for a long run outside pytest.

    Starts a cluster (with ``--profile``: the GPU node and partitions of that SLURM profile's
    site block, :func:`paper_node_shape`), writes ``--env-file`` (``SLURM_CONF`` and ``PATH`` for
    the cluster's clients, as shell ``export`` lines; written once the node is idle, so its
    appearance says the cluster is ready), records every job's memory and time into
    ``--usage-dir`` (tests/support/slurm_usage.py) and holds until SIGTERM or Ctrl-C, then
    writes the last records and stops everything it started.
    """
    import argparse
    import shlex

    parser = argparse.ArgumentParser(prog="slurm_cluster.py hold", description=hold.__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default=None, help="SLURM profile whose site block shapes the node "
                        "(e.g. profiles/slurm); default: the machine's node in one partition 'debug'")
    parser.add_argument("--env-file", required=True, help="output: shell lines exporting SLURM_CONF and PATH")
    parser.add_argument("--usage-dir", default=None, help="output: one JSON record per job (peak memory, time)")
    args = parser.parse_args(argv)

    shape = paper_node_shape(args.profile) if args.profile else None
    cluster = start_cluster(shape=shape)
    recorder = None
    try:
        if args.usage_dir:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from support.slurm_usage import UsageRecorder

            recorder = UsageRecorder(cluster, args.usage_dir).start()
        env_file = Path(args.env_file)
        tmp = env_file.with_name(f".{env_file.name}.tmp")
        tmp.write_text(f"export SLURM_CONF={shlex.quote(cluster.env['SLURM_CONF'])}\n"
                       f"export PATH={shlex.quote(str(cluster.root / 'bin'))}:\"$PATH\"\n")
        tmp.replace(env_file)
        print(f"slurm_cluster: up in {cluster.timings['start']:.1f} s at {cluster.root}; "
              f"partitions {', '.join(p for p, _ in (shape.partitions if shape else [(cluster.partition, None)]))}; "
              f"holding until SIGTERM", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("slurm_cluster: stopping", flush=True)
    finally:
        if recorder is not None:
            recorder.stop()
            if recorder.errors:
                print(f"slurm_cluster: usage recorder errors: {recorder.errors[:5]}", flush=True)
        stop_cluster(cluster)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["hold"]:
        sys.exit("usage: python tests/support/slurm_cluster.py hold --env-file FILE [--profile DIR] [--usage-dir DIR]")
    sys.exit(hold(sys.argv[2:]))
