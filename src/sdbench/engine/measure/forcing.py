"""Forced acceptance switched inside a running engine, between the cells measured on it.

vLLM's synthetic rejection sampling (``speculative_config`` ``rejection_sample_method:
synthetic``) sets the accept/reject decision while the drafter still drafts and the target
still verifies: the forced-acceptance cells of :mod:`sdbench.sweeps`. As an engine argument it
needs one engine per forced length. But the rejection sampler reads its mode and per-position
rates from two attributes on every step (``RejectionSampler.forward``: ``self.synthetic_mode``,
``self.synthetic_conditional_rates``), so setting them between calls forces the next calls
exactly as an engine built with that length would, and resetting them restores the method's
own acceptance. So one engine per method runs every forced length of the method (the engine
group ``<share>-forced`` of :func:`sdbench.grid.engine_group_of`).

The setter is a *method of the worker wrapper* added by this vLLM general plugin (entry point
``sdbench_forced_acceptance``), called by name through ``LLM.collective_rpc``, which reaches
the runner of every worker on every engine client (see :mod:`sdbench.engine.release.workerprobe` for
why a name, not a function). The rates come from vLLM's own functions (length -> unconditional
rates -> the conditional rates the kernels read), as the engine argument would compute them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sdbench.engine.release.workerprobe import add_worker_method

RPC_METHOD = "sdbench_force_acceptance"
_SPEC_CONFIG = "vllm.config:SpeculativeConfig"
_SAMPLER = "vllm.v1.sample.rejection_sampler:RejectionSampler"
_RATES = "vllm.v1.spec_decode.utils:unconditional_to_conditional_rates"
_RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"


def conditional_rates(length: float, num_speculative_tokens: int) -> list[float]:
    """The per-position conditional acceptance rates vLLM derives from a forced mean accepted
    length (``synthetic_acceptance_length``), with vLLM's own functions and checks."""
    from vllm.config import SpeculativeConfig
    from vllm.v1.spec_decode.utils import unconditional_to_conditional_rates

    rates = SpeculativeConfig._resolve_synthetic_acceptance_rates(num_speculative_tokens, None, float(length))
    return [float(r) for r in unconditional_to_conditional_rates(rates)]


def force_acceptance(wrapper: Any, length: float | None) -> list[float]:
    """Force this worker's rejection sampler to accepted length ``length`` (None: the method's own).

    Runs inside the worker process (``wrapper`` is vLLM's ``WorkerWrapperBase``); returns the
    conditional rates now in force ([] for none). A worker without a rejection sampler (an
    engine without SD) raises: forcing it would silently measure nothing.
    """
    worker = getattr(wrapper, "worker", wrapper)
    runner = getattr(worker, "model_runner", None)
    sampler = getattr(runner, "rejection_sampler", None)
    if sampler is None or not hasattr(sampler, "synthetic_mode"):
        raise RuntimeError("forced acceptance: this engine's worker has no rejection sampler with a synthetic mode")
    if length is None:
        sampler.synthetic_conditional_rates, sampler.synthetic_mode = None, False
        return []
    import torch

    k = int(runner.speculative_config.num_speculative_tokens)
    rates = conditional_rates(length, k)
    device = getattr(worker, "device", None) or "cpu"
    sampler.synthetic_conditional_rates = torch.tensor(rates, dtype=torch.float32, device=device)
    sampler.synthetic_mode = True
    return rates


def install() -> str | None:
    """Add :func:`force_acceptance` to vLLM's worker wrapper as ``RPC_METHOD``; returns the module patched."""
    return add_worker_method(RPC_METHOD, force_acceptance)


def register() -> None:
    """vLLM general-plugin entry point (every process that loads plugins: cheap, idempotent)."""
    install()


def forced_length_of(spec: dict[str, Any]) -> float | None:
    """A cell spec's forced accepted length (sdbench.sweeps), None for a cell that is not forced."""
    value = spec["method"].get("forced_acceptance_length")
    return None if value is None else float(value)


@contextlib.contextmanager
def forced_acceptance(llm: Any, length: float | None) -> Iterator[None]:
    """Within the block, every worker of ``llm`` accepts drafts at forced length ``length``;
    afterwards the method's own acceptance again. Nothing happens for ``length`` None."""
    if length is None:
        yield
        return
    llm.collective_rpc(RPC_METHOD, args=(float(length),))
    try:
        yield
    finally:
        llm.collective_rpc(RPC_METHOD, args=(None,))


# ----------------------------------------------------------------------------- touchpoints
from sdbench.engine.release import touchpoints as tp  # noqa: E402 - standard library only


def _check_sampler_reads_attributes(src: tp.SourceTree) -> str | None:
    """``RejectionSampler.forward`` hands ``self.synthetic_mode`` and ``self.synthetic_conditional_rates``
    to the sampling on every call (so setting them between calls switches the mode)."""
    text = src.source_of(f"{_SAMPLER}.forward")
    if not text:
        return f"{_SAMPLER}.forward not found"
    missing = [a for a in ("self.synthetic_mode", "self.synthetic_conditional_rates") if a not in text]
    return f"RejectionSampler.forward does not read {', '.join(missing)}" if missing else None


def _synthetic_versions() -> list[str]:
    from sdbench.engine.release.versions import synthetic_versions

    return synthetic_versions()


TOUCHPOINTS = tp.declare(
    __name__,
    tp.custom("forced.sampler_reads_attributes", _check_sampler_reads_attributes, [f"{_SAMPLER}.forward"],
              versions=_synthetic_versions()),
    tp.self_attributes("forced.sampler_attributes", _SAMPLER, ["synthetic_mode", "synthetic_conditional_rates"],
                       versions=_synthetic_versions()),
    tp.self_attributes("forced.runner_attributes", _RUNNER, ["rejection_sampler", "speculative_config"],
                       versions=_synthetic_versions()),
    tp.defined("forced.length_to_rates", f"{_SPEC_CONFIG}._resolve_synthetic_acceptance_rates", ["n", "rates", "length"],
               versions=_synthetic_versions()),
    tp.defined("forced.conditional_rates", _RATES, ["rates"], versions=_synthetic_versions()),
)
