"""Analytical memory accounting of speculative decoding (paper Sec. 5.2, Tab. 2/3, App. A.2).

Two numbers per (target, drafter, method) cell, both computed from architecture configs, never typed in:

* static memory: bytes of the weights the engine holds for target + drafter, at the serving dtype
  (App. A.2: ``(P_target + P_draft) * 2 / 2**30`` for 16-bit weights);
* per-token KV cache: ``layers * 2 (K and V) * n_kv * d_head * bytes`` summed over target and drafter
  layers, in KiB.

Parameter counts follow what vLLM 0.10.1.1 loads, which is also what the paper counts: EAGLE-1 heads
share the target's embedding and LM head; EAGLE-3 heads share the embedding and, with a reduced
draft vocabulary, bring their own LM head and a ``d2t`` table (``t2d`` is skipped), else share the
target's LM head too; n-gram adds nothing.

Architecture configs (shipped YAMLs or a local ``config.json``) are read by :mod:`sdbench.models.spec`.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sdbench.models.spec import DTYPE_BYTES, ModelSpec, load_model_spec
from sdbench.plotting import drawn_table, save_png, subplots

# "none" = no speculative decoding; "mtp" = the target's own multi-token-prediction layers.
METHODS = ("none", "ngram", "eagle", "eagle3", "draft_model", "mtp", "medusa")
# d2t is a torch.long parameter in vLLM's Eagle3LlamaForCausalLM, whatever the weights' dtype.
INT64_BYTES = 8
GIB = 2**30
KIB = 2**10


@dataclass(frozen=True)
class ParamBreakdown:
    """Parameters one model contributes to a cell, by component.

    ``components`` are held in GPU memory at the serving dtype, except those named in ``int64``;
    ``shared_with_target`` names the drafter parts reused from the target (counted once, in the
    target); ``not_loaded`` lists checkpoint tensors the engine skips (not counted).
    """

    components: dict[str, int]
    int64: tuple[str, ...] = ()
    shared_with_target: tuple[str, ...] = ()
    not_loaded: dict[str, int] = field(default_factory=dict)
    kv_layers: int = 0

    @property
    def total(self) -> int:
        """Total counted parameters."""
        return sum(self.components.values())

    def weight_bytes(self, dtype_bytes: int) -> int:
        """Bytes of the counted parameters at ``dtype_bytes`` per element (int64 tables at 8)."""
        return sum(n * (INT64_BYTES if name in self.int64 else dtype_bytes) for name, n in self.components.items())


# --------------------------------------------------------------------------------------------------
# Parameter counting


def _linear(n_in: int, n_out: int, bias: bool) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _attention(spec: ModelSpec, n_in: int) -> int:
    """q, k, v, o projections (GQA: k/v have n_kv heads); q/k/v read ``n_in`` features."""
    q_out = spec.num_attention_heads * spec.head_dim
    kv_out = spec.num_key_value_heads * spec.head_dim
    # GLM-4.5 and Qwen2 (MiMo) put a bias on q/k/v only; Llama/Qwen3 `attention_bias` covers o_proj too.
    o_bias = spec.attention_bias and spec.architecture not in ("glm4_moe", "mimo")
    return (
        _linear(n_in, q_out, spec.attention_bias)
        + 2 * _linear(n_in, kv_out, spec.attention_bias)
        + _linear(q_out, spec.hidden_size, o_bias)
    )


def _qk_norm(spec: ModelSpec) -> int:
    """Per-head RMSNorm weights on q and k (Qwen3 always, GLM-4.5 if ``use_qk_norm``)."""
    has = spec.architecture == "qwen3" or (spec.architecture == "glm4_moe" and spec.use_qk_norm)
    return 2 * spec.head_dim if has else 0


def _gated_mlp(hidden: int, inter: int, bias: bool) -> int:
    """SwiGLU MLP: gate and up (h -> I), down (I -> h)."""
    return 2 * _linear(hidden, inter, bias) + _linear(inter, hidden, bias)


def _moe_parts(spec: ModelSpec) -> dict[str, int]:
    """One MoE layer's MLP: routed experts, shared experts, router (gate weight + correction bias)."""
    assert spec.moe_intermediate_size and spec.n_routed_experts is not None and spec.n_shared_experts is not None
    expert = _gated_mlp(spec.hidden_size, spec.moe_intermediate_size, False)
    return {
        "moe_routed_experts": spec.n_routed_experts * expert,
        "moe_shared_experts": spec.n_shared_experts * expert,
        "moe_router": spec.n_routed_experts * spec.hidden_size + spec.n_routed_experts,
    }


def _add(acc: dict[str, int], part: Mapping[str, int], times: int = 1) -> None:
    for k, v in part.items():
        acc[k] = acc.get(k, 0) + v * times


def _decoder_layers(spec: ModelSpec) -> dict[str, int]:
    """All decoder layers of a full model (dense, or GLM-style dense-then-MoE)."""
    h = spec.hidden_size
    acc: dict[str, int] = {}
    per_layer = {"attention": _attention(spec, h), "layer_norms": 2 * h}
    if _qk_norm(spec):
        per_layer["qk_norm"] = _qk_norm(spec)
    _add(acc, per_layer, spec.num_hidden_layers)
    if spec.architecture == "glm4_moe":
        dense = spec.first_k_dense_replace or 0
        _add(acc, {"mlp_dense": _gated_mlp(h, spec.intermediate_size, False)}, dense)
        _add(acc, _moe_parts(spec), spec.num_hidden_layers - dense)
    else:
        _add(acc, {"mlp": _gated_mlp(h, spec.intermediate_size, spec.mlp_bias)}, spec.num_hidden_layers)
    return acc


def count_full_model(spec: ModelSpec) -> ParamBreakdown:
    """A complete causal LM (target, or draft model for draft-model SD)."""
    if spec.architecture in ("eagle", "eagle3"):
        raise ValueError(f"{spec.source}: {spec.repo_id} is an {spec.architecture} head, not a standalone model")
    emb = spec.vocab_size * spec.hidden_size
    comps = {"embed_tokens": emb}
    comps.update(_decoder_layers(spec))
    comps["final_norm"] = spec.hidden_size
    # Tied embeddings: the LM head *is* the embedding matrix (App. A.2, Qwen3-0.6B), so it adds nothing.
    comps["lm_head"] = 0 if spec.tie_word_embeddings else emb
    return ParamBreakdown(components=comps, kv_layers=spec.num_hidden_layers)


def count_eagle(spec: ModelSpec) -> ParamBreakdown:
    """EAGLE-1 head: fc (2h -> h) + decoder layer(s); embedding and LM head usually from the target."""
    h = spec.hidden_size
    comps: dict[str, int] = {"fc": _linear(2 * h, h, spec.fc_bias)}
    _add(
        comps,
        {"attention": _attention(spec, h), "mlp": _gated_mlp(h, spec.intermediate_size, spec.mlp_bias)},
        spec.num_hidden_layers,
    )
    # post_attention_layernorm on every layer; input_layernorm absent on layer 0 (EAGLE cnets.py).
    comps["layer_norms"] = spec.num_hidden_layers * h + (spec.num_hidden_layers - 1) * h
    if spec.first_layer_input_layernorm:
        comps["layer_norms"] += h
    shared = []
    if spec.shares_embed_tokens:
        shared.append("embed_tokens")
    else:
        comps["embed_tokens"] = spec.vocab_size * h
    if spec.shares_lm_head:
        shared.append("lm_head")
    else:
        comps["lm_head"] = spec.vocab_size * h
    return ParamBreakdown(components=comps, shared_with_target=tuple(shared), kv_layers=spec.num_hidden_layers)


def count_eagle3(spec: ModelSpec) -> ParamBreakdown:
    """EAGLE-3 head: fc (``num_aux_hidden_states`` target hiddens, default 3 -> h), decoder layer(s) whose first qkv reads 2h, final norm,
    draft-vocabulary LM head and d2t; the embedding comes from the target, t2d is not loaded."""
    h = spec.hidden_size
    draft_vocab = spec.draft_vocab_size or spec.vocab_size
    n_aux = spec.num_aux_hidden_states or 3
    comps: dict[str, int] = {"fc": _linear(n_aux * (spec.target_hidden_size or h), h, spec.fc_bias)}
    # Layer 0 attends over concat(normed embedding, normed fused feature); later layers over h.
    comps["attention"] = _attention(spec, 2 * h) + (spec.num_hidden_layers - 1) * _attention(spec, h)
    comps["mlp"] = spec.num_hidden_layers * _gated_mlp(h, spec.intermediate_size, spec.mlp_bias)
    # input_layernorm + post_attention_layernorm per layer, hidden_norm on layer 0.
    comps["layer_norms"] = spec.num_hidden_layers * 2 * h + h
    comps["final_norm"] = h
    shared = []
    if spec.shares_embed_tokens:
        shared.append("embed_tokens")
    else:
        comps["embed_tokens"] = spec.vocab_size * h
    if spec.shares_lm_head:
        shared.append("lm_head")
    else:
        comps["lm_head"] = draft_vocab * h
    int64: tuple[str, ...] = ()
    if spec.has_d2t:
        comps["d2t"] = draft_vocab
        int64 = ("d2t",)
    not_loaded = {"t2d": spec.vocab_size} if spec.has_t2d else {}
    return ParamBreakdown(
        components=comps,
        int64=int64,
        shared_with_target=tuple(shared),
        not_loaded=not_loaded,
        kv_layers=spec.num_hidden_layers,
    )


def count_mtp(spec: ModelSpec) -> ParamBreakdown:
    """MTP layers as vLLM loads them. GLM-4.5: per layer enorm, hnorm, eh_proj (2h -> h), one MoE
    decoder layer, shared_head norm and its own LM head; the embedding is the target's. MiMo
    (``mimo_mtp.py``): per layer token/hidden/final norms, input_proj (2h -> h) and one dense Qwen2
    decoder layer; embedding and LM head are the target's."""
    n = spec.num_nextn_predict_layers
    if spec.architecture not in ("glm4_moe", "mimo") or n < 1:
        raise ValueError(f"{spec.source}: {spec.repo_id} has no MTP layers (num_nextn_predict_layers = {n})")
    h = spec.hidden_size
    if spec.architecture == "mimo":
        mimo: dict[str, int] = {
            "attention": _attention(spec, h),
            "mlp": _gated_mlp(h, spec.intermediate_size, spec.mlp_bias),
            "layer_norms": 2 * h,
            "input_proj": 2 * h * h,
            "mtp_norms": 3 * h,
        }
        comps_mimo: dict[str, int] = {}
        _add(comps_mimo, mimo, n)
        return ParamBreakdown(components=comps_mimo, shared_with_target=("embed_tokens", "lm_head"), kv_layers=n)
    layer: dict[str, int] = {"attention": _attention(spec, h), "layer_norms": 2 * h}
    if _qk_norm(spec):
        layer["qk_norm"] = _qk_norm(spec)
    layer.update(_moe_parts(spec))
    layer.update({"eh_proj": 2 * h * h, "mtp_norms": 3 * h, "lm_head": spec.vocab_size * h})
    comps: dict[str, int] = {}
    _add(comps, layer, n)
    return ParamBreakdown(components=comps, shared_with_target=("embed_tokens",), kv_layers=n)


# --------------------------------------------------------------------------------------------------
# Cells


def count_medusa(spec: ModelSpec) -> ParamBreakdown:
    """Medusa heads (vLLM ``MedusaModel``): per head ``num_hidden_layers`` residual blocks (h -> h,
    bias per ``medusa_fc_bias``) and, unless one original LM head is shared, an LM head over the
    (truncated) vocabulary. They read the target's last hidden state: no KV cache of their own."""
    h, heads = spec.hidden_size, int(spec.medusa_num_heads or 0)
    comps = {"blocks": heads * spec.num_hidden_layers * _linear(h, h, spec.medusa_fc_bias)}
    vocab = spec.draft_vocab_size or spec.vocab_size
    if spec.medusa_lm_heads:
        comps["lm_heads"] = int(spec.medusa_lm_heads) * vocab * h
    else:
        comps["lm_head"] = spec.vocab_size * h
    return ParamBreakdown(components=comps, kv_layers=0)


def _infer_method(draft: ModelSpec | None) -> str:
    if draft is None:
        return "none"
    return {"eagle": "eagle", "eagle3": "eagle3", "medusa": "medusa"}.get(draft.architecture, "draft_model")


def _draft_breakdown(target: ModelSpec, draft: ModelSpec | None, method: str) -> ParamBreakdown | None:
    """Check the (target, draft, method) combination and count the drafter."""
    if method in ("none", "ngram"):
        if draft is not None:
            raise ValueError(f"method {method!r} uses no drafter model, but --draft {draft.repo_id!r} was given")
        return None  # n-gram looks up CPU-resident token history: no weights, no KV cache
    if method == "mtp":
        if draft is not None and draft.repo_id != target.repo_id:
            raise ValueError(f"method 'mtp' uses the target's own MTP layers; --draft {draft.repo_id!r} is not allowed")
        return count_mtp(target)
    if draft is None:
        raise ValueError(f"method {method!r} needs --draft")
    if method == "medusa":
        if draft.architecture != "medusa":
            raise ValueError(f"method 'medusa' needs Medusa heads, but {draft.repo_id!r} ({draft.source}) "
                             f"has architecture {draft.architecture!r}")  # fmt: skip
        if draft.hidden_size != target.hidden_size:
            raise ValueError(
                f"{draft.repo_id!r} ({draft.source}) reads hidden states of size {draft.hidden_size}, "
                f"but target {target.repo_id!r} has hidden_size {target.hidden_size}"
            )
        return count_medusa(draft)
    if method in ("eagle", "eagle3"):
        if draft.architecture != method:
            raise ValueError(
                f"method {method!r} needs an {method} head, but {draft.repo_id!r} ({draft.source}) "
                f"has architecture {draft.architecture!r}"
            )
        fused = (draft.target_hidden_size or draft.hidden_size) if method == "eagle3" else draft.hidden_size
        if fused != target.hidden_size:
            raise ValueError(
                f"{draft.repo_id!r} ({draft.source}) reads hidden states of size {fused}, "
                f"but target {target.repo_id!r} has hidden_size {target.hidden_size}"
            )
        if draft.shares_embed_tokens and draft.vocab_size != target.vocab_size:
            raise ValueError(
                f"{draft.repo_id!r} shares the target's embedding but has vocab_size {draft.vocab_size} "
                f"!= {target.vocab_size} of {target.repo_id!r}"
            )
        return count_eagle(draft) if method == "eagle" else count_eagle3(draft)
    if method == "draft_model":
        if draft.architecture in ("eagle", "eagle3"):
            raise ValueError(f"{draft.repo_id!r} is an {draft.architecture} head; use --method {draft.architecture}")
        if draft.vocab_size != target.vocab_size:
            raise ValueError(
                f"draft model {draft.repo_id!r} has vocab_size {draft.vocab_size}, target {target.repo_id!r} "
                f"has {target.vocab_size}: draft-model SD needs a shared vocabulary"
            )
        return count_full_model(draft)
    raise ValueError(f"unknown method {method!r} (choose from {', '.join(METHODS)})")


def memory_report(
    target: str | ModelSpec,
    draft: str | ModelSpec | None = None,
    method: str | None = None,
    models_dir: str | os.PathLike[str] | None = None,
    dtype: str | None = None,
) -> dict[str, Any]:
    """Static weight memory (GiB) and per-token KV cache (KiB) of one cell, with the breakdown.

    ``dtype`` is the serving dtype of weights and KV cache; by default the target's ``torch_dtype``
    (vLLM runs the drafter at the target's dtype). ``method`` defaults to what the drafter implies.
    """
    tspec = target if isinstance(target, ModelSpec) else load_model_spec(target, models_dir)
    if method is not None and method not in METHODS:
        raise ValueError(f"unknown method {method!r} (choose from {', '.join(METHODS)})")
    dspec = None
    if draft is not None:
        dspec = draft if isinstance(draft, ModelSpec) else load_model_spec(draft, models_dir, expect=method)
    method = method or _infer_method(dspec)
    serving = dtype or tspec.torch_dtype
    if serving not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {serving!r} (choose from {', '.join(DTYPE_BYTES)})")
    nbytes = DTYPE_BYTES[serving]

    tparams = count_full_model(tspec)
    dparams = _draft_breakdown(tspec, dspec, method)
    t_bytes = tparams.weight_bytes(nbytes)
    d_bytes = dparams.weight_bytes(nbytes) if dparams else 0
    # KV cache is allocated at the model dtype (vLLM kv_cache_dtype "auto").
    t_kv = tparams.kv_layers * tspec.kv_bytes_per_layer_elem * nbytes
    kv_spec = tspec if method == "mtp" else dspec
    d_kv = dparams.kv_layers * kv_spec.kv_bytes_per_layer_elem * nbytes if dparams and kv_spec else 0

    return {
        "target": tspec.repo_id,
        "draft": (tspec.repo_id if method == "mtp" else dspec.repo_id) if dparams else None,
        "method": method,
        "dtype": serving,
        "bytes_per_param": nbytes,
        "static_gib": (t_bytes + d_bytes) / GIB,
        "per_token_kib": (t_kv + d_kv) / KIB,
        "target_params": tparams.total,
        "draft_params": dparams.total if dparams else 0,
        "target_params_b": tparams.total / 1e9,
        "draft_params_b": (dparams.total if dparams else 0) / 1e9,
        "target_static_gib": t_bytes / GIB,
        "draft_static_gib": d_bytes / GIB,
        "target_per_token_kib": t_kv / KIB,
        "draft_per_token_kib": d_kv / KIB,
        "target_kv_layers": tparams.kv_layers,
        "draft_kv_layers": dparams.kv_layers if dparams else 0,
        "breakdown": {
            "target": tparams.components,
            "draft": dparams.components if dparams else {},
            "draft_int64": list(dparams.int64) if dparams else [],
            "draft_shared_with_target": list(dparams.shared_with_target) if dparams else [],
            "draft_not_loaded": dparams.not_loaded if dparams else {},
        },
        "sources": {"target": tspec.source, "draft": (kv_spec.source if dparams and kv_spec else None)},
    }


ANALYTICAL_COLUMNS = ("analytical_static_gib", "analytical_per_token_kib", "target_params_b", "draft_params_b")


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (isinstance(value, str) and not value)


def analytical_memory_table(
    cells: Any,
    models_dir: str | os.PathLike[str] | None = None,
    dtype: str | None = None,
) -> Any:
    """Add analytical memory columns to a table of cells.

    ``cells`` is a ``pandas.DataFrame`` with columns ``target``, ``draft`` (null for none/n-gram) and
    ``method`` (null: inferred from the drafter). Returns a copy with :data:`ANALYTICAL_COLUMNS`
    appended, ready to be joined with measured memory columns.
    """
    import pandas as pd

    missing = [c for c in ("target", "draft", "method") if c not in cells.columns]
    if missing:
        raise ValueError(f"cells table lacks column(s) {', '.join(missing)}")
    clash = [c for c in ANALYTICAL_COLUMNS if c in cells.columns]
    if clash:
        raise ValueError(f"cells table already has column(s) {', '.join(clash)}")
    specs: dict[tuple[str, str | None], ModelSpec] = {}

    def spec(name: str, expect: str | None) -> ModelSpec:
        key = (name, expect)
        if key not in specs:
            specs[key] = load_model_spec(name, models_dir, expect=expect)
        return specs[key]

    rows = []
    for i, (target, draft, method) in enumerate(zip(cells["target"], cells["draft"], cells["method"])):
        method = None if _is_missing(method) else str(method)
        try:
            rep = memory_report(
                spec(str(target), None),
                None if _is_missing(draft) else spec(str(draft), method),
                method,
                models_dir,
                dtype,
            )
        except ValueError as exc:
            raise ValueError(f"cells row {i} (target={target!r}, draft={draft!r}, method={method!r}): {exc}") from exc
        rows.append([rep["static_gib"], rep["per_token_kib"], rep["target_params_b"], rep["draft_params_b"]])
    out = cells.copy()
    extra = pd.DataFrame(rows, columns=list(ANALYTICAL_COLUMNS), index=cells.index, dtype="float64")
    return pd.concat([out, extra], axis=1)


def _short(name: Any) -> str:
    return "" if _is_missing(name) else str(name).rstrip("/").split("/")[-1]


def plot_memory(df: Any, out_png: str | os.PathLike[str]) -> Any:
    """Analytical vs measured memory per cell, written atomically to ``out_png``.

    Left: weights, analytical ``analytical_static_gib`` next to ``measured_weights_gib`` (bars) and
    ``peak_memory_gib`` (marker). Right: ``analytical_per_token_kib``, annotated with the KV-cache
    capacity in tokens that ``measured_kv_cache_gib`` implies. Measured columns may be absent or NaN.
    Returns the drawn table (x the cell's tick label; a missing measured weight is drawn as 0, note n/a).
    """
    import numpy as np

    for col in ("analytical_static_gib", "analytical_per_token_kib"):
        if col not in df.columns:
            raise ValueError(f"plot_memory: missing column {col!r} (run analytical_memory_table first)")
    n = len(df)
    if n == 0:
        raise ValueError("plot_memory: no cells to plot")

    def col(name: str) -> np.ndarray:
        return df[name].to_numpy(dtype=float) if name in df.columns else np.full(n, np.nan)

    if "cell" in df.columns:
        labels = [str(c) for c in df["cell"]]
    else:
        labels = [
            f"{_short(t)} | {m if not _is_missing(m) else 'none'}" + (f" | {_short(d)}" if not _is_missing(d) else "")
            for t, d, m in zip(df["target"], df.get("draft", [None] * n), df.get("method", [None] * n))
        ]
    static, weights, peak = col("analytical_static_gib"), col("measured_weights_gib"), col("peak_memory_gib")
    per_tok, kv_gib = col("analytical_per_token_kib"), col("measured_kv_cache_gib")

    x = np.arange(n)
    # Two panels side by side while they fit in 3000 px, else stacked (sdbench.plotting limits).
    wide = max(4.5, 0.55 * n + 1.5)
    stacked = 2 * wide * 150 > 3000
    fig, (ax1, ax2) = subplots(2 if stacked else 1, 1 if stacked else 2,
                               figsize=(wide, 9.0) if stacked else (2 * wide, 5.0))  # fmt: skip
    w = 0.38
    drawn = drawn_table(fig)
    drawn.bar(ax1, x - w / 2, static, w, label="analytical weights", color="#4c72b0", series="analytical_static_gib",
)  # fmt: skip
    drawn.bar(ax1, x + w / 2, np.nan_to_num(weights, nan=0.0), w, label="measured weights", color="#dd8452",
              series="measured_weights_gib", note=[None if np.isfinite(m) else "n/a" for m in weights])  # fmt: skip
    if np.isfinite(peak).any():
        drawn.plot(ax1, x, peak, "k_", markersize=22, mew=2, linestyle="none", label="peak memory", mark="point",
                   series="peak_memory_gib")  # fmt: skip
    for xi, m in zip(x, weights):
        if not np.isfinite(m):
            ax1.text(xi + w / 2, 0, "n/a", ha="center", va="bottom", fontsize=7, rotation=90)
    ax1.set_ylabel("GiB")
    ax1.set_title("Static memory (weights)")
    ax1.legend(fontsize=8)

    notes = [f"{gib:.2f} GiB = {gib * 2**20 / kib:,.0f} tok" if np.isfinite(gib) and kib > 0 else None
             for kib, gib in zip(per_tok, kv_gib)]  # fmt: skip
    drawn.bar(ax2, x, per_tok, 0.6, color="#55a868", series="analytical_per_token_kib", note=notes)
    for xi, kib, gib in zip(x, per_tok, kv_gib):
        if np.isfinite(gib) and kib > 0:
            ax2.text(xi, kib, f"{gib:.2f} GiB\n= {gib * 2**20 / kib:,.0f} tok", ha="center", va="bottom", fontsize=7)
    ax2.set_ylim(0, float(np.nanmax(per_tok)) * 1.2)
    ax2.set_ylabel("KiB per token")
    ax2.set_title("KV cache per token (labels: measured cache, capacity)", fontsize=10)
    for ax in (ax1, ax2):
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=7, rotation=30, ha="right", rotation_mode="anchor")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save_png(fig, out_png, dpi=150)


# --------------------------------------------------------------------------------------------------
# CLI


def _cmd_memory(args: argparse.Namespace) -> int:
    # A ValueError (unknown model, bad config) becomes one `error:` line in sdbench.cli.main.
    report = memory_report(args.target, args.draft, args.method, args.models_dir, args.dtype)
    print(json.dumps(report, indent=2))
    return 0


# vLLM method name (a config's ``method``, a cells table's ``sd_method``) -> the method names of
# this module (suffix decoding: no weights, no KV cache, as n-gram).
_MEMORY_METHODS = {"deepseek_mtp": "mtp", "qwen3_next_mtp": "mtp", "suffix": "ngram"}


def cells_memory_table(cells: Any, model_names: Mapping[str, str], dtype: str | None = None) -> Any:
    """Analytical next to measured memory for every cell of a joined cells table.

    ``cells`` has the run-cell summary columns (``model``, ``drafter``, ``sd_method``,
    ``peak_rss_gib``, ``peak_device_gib``, ``measured_*``); ``model_names`` maps config
    model keys to what :func:`load_model_spec` accepts (a repo id or a model directory).
    ``peak_memory_gib`` is device memory on GPU, the process's resident memory on CPU (with
    ``run.paired_baseline`` an SD cell's process also holds the paired no-SD engine, so compare
    ``measured_*``, which are per engine, across methods, not this peak).
    """
    import numpy as np
    import pandas as pd

    frame = pd.DataFrame(
        {
            "target": [model_names[m] for m in cells["model"]],
            "draft": [model_names[d] if d else None for d in cells["drafter"]],
            "method": [_MEMORY_METHODS.get(m, m) for m in cells["sd_method"]],
        }
    )
    table = analytical_memory_table(frame, dtype=dtype)
    keys = ["engine", "model", "dataset", "method", "batch_size"]
    out = pd.concat([cells[keys].reset_index(drop=True), table[list(ANALYTICAL_COLUMNS)]], axis=1)
    peak_device = cells["peak_device_gib"].to_numpy(dtype=float)
    out["peak_memory_gib"] = np.where(np.isnan(peak_device), cells["peak_rss_gib"].to_numpy(dtype=float), peak_device)
    for col in ("measured_weights_gib", "measured_kv_cache_gib", "kv_cache_capacity_tokens"):
        out[col] = cells[col].to_numpy(dtype=float)
    return out


def _cmd_memory_table(args: argparse.Namespace) -> int:
    from sdbench.io import read_parquet, write_parquet

    cells = read_parquet(args.cells, what="cells table")
    try:
        models = json.loads(args.models)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--models: not valid JSON ({exc}); expected an object: model key -> repo id or dir") from exc
    if not isinstance(models, dict):
        raise ValueError(f"--models: expected a JSON object (model key -> repo id or dir), got {type(models).__name__}")
    keys = set(cells["model"]) if "model" in cells else set()
    keys |= {d for d in cells["drafter"] if d} if "drafter" in cells else set()
    missing = sorted(map(str, keys - set(models)))
    if missing:
        raise ValueError(f"--models: no entry for model key(s) {', '.join(map(str, missing))} of {args.cells}")
    table = cells_memory_table(cells, models, dtype=args.dtype)
    write_parquet(table, args.output)
    per_engine = per_configuration(table)
    if args.markdown:
        from sdbench.io import write_text

        write_text(memory_markdown(per_engine), args.markdown)
    plot_memory(per_engine.assign(cell=per_engine["model"] + " | " + per_engine["method"]), args.figure)
    return 0


def per_configuration(table: Any) -> Any:
    """One row per engine x model x method (Tab. 2/3): memory does not depend on the dataset, and
    the KV cache is allocated per engine; peak memory is the largest over the configuration's cells."""
    keys = ["engine", "model", "method"]
    agg = {c: "first" for c in table.columns if c not in keys + ["dataset", "batch_size", "peak_memory_gib"]}
    agg["peak_memory_gib"] = "max"
    return table.groupby(keys, sort=True).agg(agg).reset_index()


def memory_markdown(per_engine: Any) -> str:
    """Tab. 2/3 as Markdown: analytical and measured memory per engine x model x method."""

    def num(x: Any, fmt: str) -> str:
        return "—" if _is_missing(x) else format(float(x), fmt)

    lines = [
        "Analytical (from the model configs) next to measured (the engine's workers) memory per engine x model x "
        "method. Peak memory: device on GPU, resident memory of the engine's processes on CPU.\n",
        "| engine | model | method | weights analytical / measured (GiB) | KV cache per token (KiB) "
        "| KV cache measured (GiB) | KV capacity (tokens) | peak memory (GiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in per_engine.itertuples(index=False):
        lines.append(
            f"| {r.engine} | {r.model} | {r.method} | {num(r.analytical_static_gib, '.3f')} / "
            f"{num(r.measured_weights_gib, '.3f')} | {num(r.analytical_per_token_kib, '.1f')} "
            f"| {num(r.measured_kv_cache_gib, '.3f')} | {num(r.kv_cache_capacity_tokens, ',.0f')} "
            f"| {num(r.peak_memory_gib, '.2f')} |"
        )
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# KV cache capacity (sdbench check-config, config key kv_capacity)

# Device memory vLLM keeps outside weights and KV cache, per GPU: the profiled activation peak,
# CUDA graphs and the NCCL / cuBLAS workspaces. A round figure on purpose: the check refuses
# only batches clearly beyond the cache; the preemption counter catches the rest at run time.
NON_KV_RESERVE_GIB = 2.0
# vLLM's default share of a GPU the engine may use (EngineArgs.gpu_memory_utilization).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9


@dataclass(frozen=True)
class KVCapacity:
    """KV cache capacity of one engine x target x drafter, as the memory model computes it."""

    capacity_tokens: int
    per_token_kib: float
    kv_cache_gib: float
    how: str  # where the KV budget came from, for the one-line refusal


def kv_capacity(
    report: Mapping[str, Any],
    *,
    kv_cache_memory_bytes: int | None = None,
    device_memory_gib: float | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    tensor_parallel_size: int = 1,
) -> KVCapacity | None:
    """Tokens the KV cache of a cell's engine holds, or ``None`` when its memory is unknown.

    ``report`` is :func:`memory_report`'s (its ``per_token_kib`` counts the drafter's KV too,
    its ``static_gib`` target and drafter weights). The KV budget is the engine's explicit
    ``kv_cache_memory_bytes`` per worker when set, else ``device_memory_gib`` x
    ``gpu_memory_utilization`` minus :data:`NON_KV_RESERVE_GIB` per GPU, minus the weights;
    tensor-parallel ranks each hold their share of every token's KV.
    """
    per_token = float(report["per_token_kib"]) * KIB
    if per_token <= 0:
        return None
    tp = int(tensor_parallel_size)
    if kv_cache_memory_bytes is not None:
        budget = float(kv_cache_memory_bytes) * tp
        how = f"kv_cache_memory_bytes {kv_cache_memory_bytes / GIB:.2f} GiB x {tp} worker(s)"
    elif device_memory_gib is not None:
        budget = tp * (device_memory_gib * gpu_memory_utilization - NON_KV_RESERVE_GIB) * GIB \
            - float(report["static_gib"]) * GIB
        how = (f"{tp} x {device_memory_gib:g} GiB x gpu_memory_utilization {gpu_memory_utilization:g} "
               f"- {tp} x {NON_KV_RESERVE_GIB:g} GiB reserve - {float(report['static_gib']):.1f} GiB weights")
    else:
        return None
    budget = max(budget, 0.0)
    return KVCapacity(int(budget // per_token), per_token / KIB, budget / GIB, how)


# --------------------------------------------------------------------------------------------------
# KV capacity of a config's cells (sdbench check-config, config key kv_capacity)


def _prompt_tokens(dataset: dict[str, Any]) -> int | None:
    """Longest prompt a dataset entry can have before its table exists: ``max_prompt_tokens``,
    else a SPEED-Bench throughput tier's input length (``throughput_32k``: 32768), else unknown."""
    import re

    if dataset.get("max_prompt_tokens"):
        return int(dataset["max_prompt_tokens"])
    if dataset.get("builder") == "speed_bench":
        where = f"{dataset.get('local_path') or ''} {dataset.get('hf_config') or ''}"
        tier = re.search(r"throughput_(\d+)k", where)
        if tier:
            return int(tier.group(1)) * 1024
    return None


def _engine_kv(engine: dict[str, Any]) -> dict[str, Any]:
    """The KV budget settings of an engine entry (sdbench.analysis.memory.kv_capacity)."""
    kwargs = engine.get("llm_kwargs", {})
    explicit = kwargs.get("kv_cache_memory_bytes")
    cpu_space = (engine.get("env") or {}).get("VLLM_CPU_KVCACHE_SPACE")
    if explicit is None and engine["device"] == "cpu" and cpu_space not in (None, ""):
        explicit = int(cpu_space) * GIB  # the CPU build's GiB setting (vllm/platforms/cpu.py)
    return {
        "kv_cache_memory_bytes": None if explicit is None else int(explicit),
        "device_memory_gib": engine.get("device_memory_gib") if engine["device"] == "cuda" else None,
        "gpu_memory_utilization": float(kwargs.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION)),
    }


def residency_tokens(config: dict[str, Any], dataset_key: str) -> tuple[int | None, int, str]:
    """(prompt, output, basis) tokens one sequence of a dataset holds in the KV cache, by the
    config's ``kv_residency``: ``expected`` (the default) counts the expected prompt
    (``expected_prompt_tokens``, its ``matched_to``'s, else the longest: :func:`_prompt_tokens`) and the expected output
    (:func:`sdbench.expectedlengths.output_tokens`: ``expected_output_tokens`` within ``max_tokens``, the
    budget where outputs ignore EOS or none is stated), what a batch holds while it runs; ``max_tokens``
    the longest prompt and the whole budget, what no sequence can exceed."""
    from sdbench.expectedlengths import output_tokens

    dataset = config["datasets"][dataset_key]
    if config.get("kv_residency", "expected") == "max_tokens":
        return _prompt_tokens(dataset), int(dataset["max_tokens"]), "max_tokens"
    matched = config["datasets"].get(dataset.get("matched_to") or "", {})  # a random-token control's
    stated = dataset.get("expected_prompt_tokens") or matched.get("expected_prompt_tokens")
    return (int(stated) if stated else _prompt_tokens(dataset)), output_tokens(config, dataset_key), "expected output"


def kv_capacity_shortfalls(config: dict[str, Any]) -> dict[tuple[str, str, str, str, int], str]:
    """Cells of a validated config whose batch cannot fit the engine's KV cache -> why, one line each.

    Needed: ``batch_size`` sequences of (prompt + output + k lookahead) tokens
    (:func:`residency_tokens`), each capped at the model's ``max_model_len``; capacity:
    :func:`sdbench.analysis.memory.kv_capacity` with the drafter's KV for SD cells. Cells whose
    capacity or model architecture is unknown (a model built locally, a cuda engine without
    ``device_memory_gib``) are not judged.
    """
    import functools

    from sdbench.config import DRAFTER_METHODS

    @functools.lru_cache(maxsize=None)
    def report(target: str, drafter: str | None, method: str, dtype: str | None) -> dict[str, Any] | None:
        try:
            return memory_report(target, drafter, method, dtype=dtype)
        except (ValueError, FileNotFoundError):
            return None  # no architecture config for a hub id or a model built by the workflow

    out: dict[tuple[str, str, str, str, int], str] = {}
    for block in config["grid"]:
        engine = config["engines"][block["engine"]]
        budget = _engine_kv(engine)
        if budget["kv_cache_memory_bytes"] is None and budget["device_memory_gib"] is None:
            continue
        for model_key in block["models"]:
            model = config["models"][model_key]
            if not model.get("hf_id"):
                continue
            dtype = model.get("dtype") if model.get("dtype") not in (None, "auto") else None
            for method_key in block["methods"]:
                method = config["methods"][method_key]
                name = _MEMORY_METHODS.get(method["method"], method["method"])
                drafter = None
                if method["method"] in DRAFTER_METHODS and name != "mtp":
                    entry = config["models"].get(method["drafter"][model_key], {})
                    if not entry.get("hf_id"):
                        continue
                    drafter = entry["hf_id"]
                rep = report(model["hf_id"], drafter, name, dtype)
                if rep is None:
                    continue
                cap = kv_capacity(rep, tensor_parallel_size=int(model.get("tensor_parallel_size", 1)), **budget)
                if cap is None:
                    continue
                k = int(method.get("num_speculative_tokens", 0))
                for dataset_key in block["datasets"]:
                    prompt, output, basis = residency_tokens(config, dataset_key)
                    per_seq = (prompt or 0) + output + k
                    if model.get("max_model_len"):
                        per_seq = min(per_seq, int(model["max_model_len"]))
                    for bs in block["batch_sizes"]:
                        needed = int(bs) * per_seq
                        if needed <= cap.capacity_tokens:
                            continue
                        prompt_text = f"{prompt} prompt" if prompt is not None else "prompt length unknown, counted as 0"
                        out[(block["engine"], model_key, dataset_key, method_key, int(bs))] = (
                            f"{block['engine']}/{model_key}/{dataset_key}/{method_key}/bs{bs}: needs {needed:,} KV "
                            f"tokens (batch {bs} x ({prompt_text} + {output} {basis} + {k})), "
                            f"capacity {cap.capacity_tokens:,} ({cap.kv_cache_gib:.1f} GiB at "
                            f"{cap.per_token_kib:.0f} KiB/token: {cap.how})"
                        )
    return dict(sorted(out.items()))


def trimmed_cells(config: dict[str, Any]) -> set[tuple[str, str, str, str, int]]:
    """Cells ``kv_capacity: trim`` drops from the grid (empty under refuse / off)."""
    if config.get("kv_capacity") != "trim":
        return set()
    return set(kv_capacity_shortfalls(config))


def refuse_kv_shortfalls(config: dict[str, Any], source: str = "config") -> None:
    """Under ``kv_capacity: refuse`` (the default), raise ``ConfigError`` in one line naming the first
    cell that cannot fit its engine's KV cache and how many do (the workflow calls this when it builds
    the DAG; ``sdbench check-config`` lists every one)."""
    from sdbench.errors import ConfigError

    if config.get("kv_capacity", "refuse") != "refuse":
        return
    short = check_kv_capacity(config)
    if short:
        raise ConfigError(
            f"{source}: kv_capacity refuse: {len(short)} cell(s) cannot fit the KV cache, first {short[0]} "
            "(sdbench check-config lists them; kv_capacity: trim drops them)"
        )


def check_kv_capacity(config: dict[str, Any]) -> list[str]:
    """The cells ``sdbench check-config`` refuses (``kv_capacity: refuse``) or trims (``trim``),
    one line each; nothing under ``off``."""
    if config.get("kv_capacity", "refuse") == "off":
        return []
    return list(kv_capacity_shortfalls(config).values())
