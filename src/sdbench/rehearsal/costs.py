"""Step times of the rehearsal: the simulator's cost model, scaled to the cell's model.

The base is the paper simulator's Llama-3.1-8B / one H100 / vLLM 0.10.1.1 model
(:data:`~sdbench.rehearsal.standins.BASE_COST_MODEL`): a target pass costs
``c_kv * kv + c_compute * batched + c_fixed``, plus ``overhead_per_step``. Another target scales
each coefficient by what it stands for, counted from the architecture configs
(:mod:`sdbench.analysis.memory`), per GPU of its tensor-parallel group:

- ``c_fixed`` (reading the weights once per step) by the parameters a step reads (a MoE model's
  active ones) / the base's;
- ``c_compute`` (per batched token) by active parameters / the base's;
- ``c_kv`` (per token in the KV cache) by KV elements per token / the base's;
- with tensor parallelism, each divided by the GPUs and multiplied by ``1 + TP_OVERHEAD``;
  times the engine version's factor (1 for every version: stated).

``overhead_per_step`` (scheduling, sampling, bookkeeping) is the engine's, not the model's, and is
not scaled. Drafting: :data:`~sdbench.rehearsal.standins.DRAFTING`.

A **calibrated** cost model (``rehearsal_cost_model: FILE.yaml`` in the config, e.g. ``sdbench
calibrate fit``'s of the cell's model on the GPU to rehearse; it reaches the job's spec as
``rehearsal.cost_model``) prices the steps instead, unscaled: it was measured on that model's shape.
Its own drafter for the method's vLLM name prices drafting where it has one (an EAGLE-like method
falls back to its ``eagle`` drafter, then to the scaled base head); its ``ngram`` fraction and
``overhead_per_step`` are used as they are. :func:`priced_by` names the model that priced a job.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdbench.rehearsal import MARKER, standins
from sdbench.simulator.costmodel import DrafterCost, TargetCost, load_cost_model


def load_target_spec(model_dir: str, expect: str | None = None) -> Any:
    """The architecture of the model in ``model_dir``: a stand-in's repository's shipped config,
    else the directory's own config.json (``expect``: as sdbench.models.spec.load_hf_config)."""
    from sdbench.models.spec import load_model_spec

    marker = Path(model_dir) / MARKER
    if marker.is_file():
        return load_model_spec(json.loads(marker.read_text(encoding="utf-8"))["repo"])
    return load_model_spec(str(model_dir), expect=expect)


def parameter_counts(spec: Any) -> tuple[float, float]:
    """(total, active per token) parameters of a full model; a MoE token reads the routed experts
    it is sent to, not all of them."""
    from sdbench.analysis.memory import count_full_model

    total = float(count_full_model(spec).total)
    if not spec.n_routed_experts or not spec.moe_intermediate_size:
        return total, total
    expert = 3 * spec.hidden_size * spec.moe_intermediate_size
    moe_layers = spec.num_hidden_layers - (spec.first_k_dense_replace or 0)
    idle = (spec.n_routed_experts - (spec.num_experts_per_tok or 0)) * expert * moe_layers
    return total, total - idle


def kv_elements(spec: Any) -> int:
    """K and V elements per token over all layers."""
    return int(spec.num_hidden_layers * spec.kv_bytes_per_layer_elem)


@dataclass(frozen=True)
class Scale:
    """Factors of the base model's target coefficients for one model on one engine."""

    fixed: float
    compute: float
    kv: float

    def target(self, base: TargetCost) -> TargetCost:
        """``base`` scaled (a hinge's slope above its knee like ``c_compute``; the knee kept)."""
        return TargetCost(base.c_kv * self.kv, base.c_compute * self.compute, base.c_fixed * self.fixed,
                          knee_tokens=base.knee_tokens, c_above_knee=base.c_above_knee * self.compute)  # fmt: skip


def scale_for(spec: Any, tensor_parallel: int, vllm_version: str) -> Scale:
    """How the cell's target compares with the base model (module docstring)."""
    from sdbench.models.spec import load_model_spec

    base = load_model_spec(standins.BASE_MODEL)
    base_total, _ = parameter_counts(base)
    _, active = parameter_counts(spec)
    tp = max(1, int(tensor_parallel))
    factor = (1.0 + standins.TP_OVERHEAD if tp > 1 else 1.0) * standins.VERSION_FACTOR.get(vllm_version, 1.0) / tp
    return Scale(fixed=active / base_total * factor, compute=active / base_total * factor,
                 kv=kv_elements(spec) / kv_elements(base) * factor)  # fmt: skip


@dataclass(frozen=True)
class StepCost:
    """Prices one engine step of a cell's engine (seconds)."""

    target: TargetCost
    overhead: float
    drafting: str | None  # "ngram", "eagle", "draft_model" or None (no SD)
    ngram_fraction: float
    head: DrafterCost
    draft_ratio: float
    num_speculative_tokens: int

    def verify(self, kv: Any, batched: Any) -> Any:
        """The target's forward pass over ``batched`` tokens with ``kv`` tokens in the cache
        (elementwise on arrays, as everything here)."""
        return self.target.time(kv, batched)

    def draft(self, verify_s: Any, kv: Any, proposed: float, seqs: float) -> Any:
        """Drafting for ``seqs`` sequences proposing ``proposed`` tokens in all (0: none)."""
        if self.drafting is None or proposed <= 0:
            return 0.0 * verify_s
        if self.drafting == "ngram":
            return self.ngram_fraction * verify_s
        if self.drafting == "eagle":
            return self.head.time(verify_s, kv, proposed)
        # A draft model: one pass per draft position, each a fraction of a one-token target pass.
        return self.num_speculative_tokens * self.draft_ratio * self.verify(kv, seqs)


def calibrated_model(spec: dict[str, Any]) -> str | None:
    """The calibrated cost model a job's spec names (``rehearsal.cost_model``), None for the scaled base."""
    name = (spec.get("rehearsal") or {}).get("cost_model")
    return str(name) if name else None


def priced_by(spec: dict[str, Any]) -> dict[str, Any]:
    """Which cost model priced a rehearsed job: its name, source, sha256 and whether it was scaled."""
    calibrated = calibrated_model(spec)
    model = load_cost_model(calibrated or standins.BASE_COST_MODEL)
    return {"cost_model": model.name, "cost_model_source": calibrated or standins.BASE_COST_MODEL,
            "cost_model_sha256": model.digest(), "cost_model_scaled": calibrated is None}  # fmt: skip


def step_cost(spec: dict[str, Any], model_dir: str) -> StepCost:
    """The step prices of a cell spec's engine (engine, model, method) on ``model_dir``'s model:
    the base scaled to it, or the spec's calibrated model as it is (module docstring)."""
    calibrated = calibrated_model(spec)
    base = load_cost_model(calibrated or standins.BASE_COST_MODEL)
    scale = scale_for(
        load_target_spec(model_dir), int(spec["model"].get("tensor_parallel_size", 1)), spec["engine"]["vllm_version"]
    )
    method = spec["method"]["method"]
    base_model = base if calibrated is None else load_cost_model(standins.BASE_COST_MODEL)
    eagle = base_model.drafter("eagle")
    drafting = standins.DRAFTING.get(method) if method != "none" else None
    if method != "none" and drafting is None:
        raise ValueError(f"rehearsal: no drafting cost for method {method!r} (known: {', '.join(sorted(standins.DRAFTING))})")
    # The head is as wide as its target and sharded like it: the target's weight-read factor.
    head = DrafterCost("linear", c_kv=eagle.c_kv * scale.kv, c_spec=eagle.c_spec * scale.fixed,
                       c_fixed=eagle.c_fixed * scale.fixed)  # fmt: skip
    if calibrated is not None:  # measured on this model's shape: nothing scaled
        scale = Scale(1.0, 1.0, 1.0)
        own = base.drafters.get(method) or base.drafters.get("eagle")
        head = own if own is not None and own.kind == "linear" else head
    return StepCost(
        target=scale.target(base.target),
        overhead=base.overhead_per_step * standins.VERSION_FACTOR.get(spec["engine"]["vllm_version"], 1.0),
        drafting=drafting,
        ngram_fraction=(base.drafters.get("ngram") or base_model.drafter("ngram")).fraction,
        head=head,
        draft_ratio=standins.DRAFT_MODEL_RATIO.get(load_target_spec(model_dir).repo_id, standins.DEFAULT_DRAFT_MODEL_RATIO),
        num_speculative_tokens=int(spec["method"].get("num_speculative_tokens", 0)),
    )


def startup_seconds(weight_bytes: float, tensor_parallel: int) -> float:
    """Modelled engine start-up: a fixed part plus loading each rank's share of the weights."""
    return standins.STARTUP_FIXED_S + weight_bytes / max(1, tensor_parallel) / (standins.LOAD_GIB_PER_S * 2**30)
