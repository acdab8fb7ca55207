"""What each engine worker measures of its own memory, reached by name through ``collective_rpc``.

Memory lives in the workers: the weights and KV cache their runner allocated, the device peak of
each tensor-parallel rank's GPU, and the peak RSS of the worker's process. The front-end process
holding ``vllm.LLM`` sees none of that when the engine core runs in another process (vLLM 0.11.1
does so for every SD cell) or with tensor parallelism (one process per rank).

So the report is a *method of the worker wrapper*, added by this vLLM general plugin (entry point
``sdbench_worker_probe``, loaded in every engine-core and worker process), and
:func:`sdbench.engine.release.versions.engine_memory` calls it by name: ``llm.collective_rpc(RPC_METHOD)``.
A name travels through every client. A function would not: vLLM's multiprocess client encodes
requests with msgpack and refuses a function unless ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``
(``v1/serial_utils.py``), which would also let the engine core unpickle whatever reaches its
socket -- so this package never sets it.
"""

from __future__ import annotations

import os
import resource
from typing import Any

RPC_METHOD = "sdbench_memory_report"
# Where the worker wrapper lives: V1's own (0.11+), else the shared V0/V1 one (0.10.1.1).
WRAPPER_MODULES = ("vllm.v1.worker.worker_base", "vllm.worker.worker_base")


def loaded_weight_bytes(models: list[Any]) -> int:
    """Bytes of the weights the engine's modules hold, target and drafter, a tensor they share
    (embedding, LM head) once.

    On CPU the runner's profiled "consumed memory" is a host-memory difference that misses
    memory-mapped weights, and the CPU build repacks each linear layer's weight into a oneDNN
    handle, leaving an empty parameter: such a weight counts as the layer's own partition shape
    (``input_size_per_partition`` x ``output_size_per_partition``) at its ``params_dtype``.
    """
    seen: dict[tuple[int, int], int] = {}
    for model in models:
        for module in model.modules():
            for name, p in module.named_parameters(recurse=False):
                if p.numel() == 0 and name == "weight" and hasattr(module, "input_size_per_partition"):
                    n = int(module.input_size_per_partition) * int(module.output_size_per_partition)
                    dtype = getattr(module, "params_dtype", p.dtype)
                    seen[(id(module), 0)] = n * dtype.itemsize
                elif p.numel():
                    seen[(p.data_ptr(), p.numel())] = p.numel() * p.element_size()
    return sum(seen.values())


def memory_report(wrapper: Any) -> dict[str, float]:
    """This worker's memory: weights and KV cache of its runner, device peak, process peak RSS.

    Runs inside the worker process (``self`` is vLLM's ``WorkerWrapperBase``). Anything the
    runner lacks is NaN, never an error.
    """
    worker = getattr(wrapper, "worker", wrapper)
    runner = getattr(worker, "model_runner", None)
    on_gpu = getattr(getattr(worker, "device", None), "type", None) == "cuda"
    weights = getattr(runner, "model_memory_usage", None) if on_gpu else None
    if not weights:
        models = [getattr(runner, "model", None), getattr(getattr(runner, "drafter", None), "model", None)]
        weights = loaded_weight_bytes([m for m in models if hasattr(m, "modules")])
    kv = 0
    for tensor in getattr(runner, "kv_caches", None) or []:
        if hasattr(tensor, "numel"):
            kv += tensor.numel() * tensor.element_size()
    device_peak = float("nan")
    try:
        import torch

        device = getattr(worker, "device", None)
        if torch.cuda.is_available() and getattr(device, "type", None) == "cuda":
            device_peak = float(torch.cuda.max_memory_reserved(device))
    except Exception:  # noqa: BLE001 - memory accounting must never fail a timed run
        pass
    return {
        "pid": float(os.getpid()),
        "weights_bytes": float(weights) if weights else float("nan"),
        "kv_bytes": float(kv) or float("nan"),
        "device_peak_bytes": device_peak,
        "peak_rss_bytes": float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024,
    }


def add_worker_method(name: str, method: Any) -> str | None:
    """Add ``method`` to vLLM's worker wrapper as ``name`` (reached by ``LLM.collective_rpc(name)``
    on every client); returns the module patched, None when this vLLM has no wrapper."""
    import importlib

    for module_name in WRAPPER_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        wrapper = getattr(module, "WorkerWrapperBase", None)
        if wrapper is not None:
            setattr(wrapper, name, method)
            return module_name
    return None


def install() -> str | None:
    """Add :func:`memory_report` to vLLM's worker wrapper as ``RPC_METHOD``; returns the module patched."""
    return add_worker_method(RPC_METHOD, memory_report)


def register() -> None:
    """vLLM general-plugin entry point (every process that loads plugins: cheap, idempotent)."""
    install()


# ----------------------------------------------------------------------------- touchpoints
from sdbench.engine.release import touchpoints as tp  # noqa: E402 - standard library only


def _check_wrapper(src: tp.SourceTree) -> str | None:
    """The wrapper the plugin patches is the object ``run_method`` receives, and it loads plugins."""
    for module in WRAPPER_MODULES:
        if src.has(f"{module}:WorkerWrapperBase"):
            if not src.has(f"{module}:WorkerWrapperBase.init_worker"):
                return f"{module}.WorkerWrapperBase has no init_worker"
            runs = [c for c in src.calls_in(f"{module}:WorkerWrapperBase.init_worker")
                    if tp.call_name(c).endswith("load_general_plugins")]
            return None if runs else f"{module}.WorkerWrapperBase.init_worker loads no plugins"
    return "no WorkerWrapperBase"


def _check_executors(src: tp.SourceTree) -> str | None:
    """Both executors hand a method to ``run_method`` with the worker wrapper."""
    found = []
    for package in ("vllm.v1.executor", "vllm.executor"):
        for module in src.modules_under(package):
            text = src.text(module) or ""
            if "run_method(self.driver_worker" in text or "run_method(self.worker" in text:
                found.append(module)
    return None if found else "no executor calls run_method on the worker wrapper"


TOUCHPOINTS = tp.declare(
    __name__,
    tp.custom("memory.worker_wrapper", _check_wrapper, [f"{m}:WorkerWrapperBase" for m in WRAPPER_MODULES]),
    tp.custom("memory.executors_run_method", _check_executors, ["vllm.v1.executor", "vllm.executor"]),
    tp.self_attributes("memory.runner_attributes", "vllm.v1.worker.gpu_model_runner:GPUModelRunner",
                       ["model_memory_usage", "kv_caches", "model", "drafter"]),
    tp.self_attributes("memory.worker_attributes", "vllm.v1.worker.gpu_worker:Worker", ["model_runner", "device"]),
)
