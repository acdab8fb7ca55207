"""A built Llama target re-expressed as a MiMo model (a Qwen2 network that ships an MTP layer).

vLLM runs ``method: mtp`` only on model types that carry their own MTP layers; the one of them
that is dense, deterministic and runs on the CPU build is MiMo (``MiMoForCausalLM``: Qwen2
layers plus ``model.mtp_layers.*``, read by ``vllm/model_executor/models/mimo_mtp.py``). A
Qwen2 layer is a Llama layer with q/k/v biases and no o_proj bias, so the small Llama target
(q/k/v/o biases, from its copy-circuit init) converts exactly once its o_proj bias is folded
into the value path: attention weights sum to one, so a constant ``d`` added to every value
adds ``W_o d`` to the output (:func:`fold_output_bias`). The MTP cells then measure the same network as the Llama cells.

Module-level imports are the standard library only (torch loads inside the functions).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ARCHITECTURE = "MiMoForCausalLM"
# Llama-only config fields: Qwen2 always has q/k/v biases and never an o_proj bias.
_LLAMA_ONLY = ("attention_bias", "mlp_bias", "pretraining_tp", "architectures", "transformers_version")
# Largest relative residual of the fold ||W_o d - b_o|| / ||b_o|| accepted as exact.
FOLD_TOLERANCE = 1e-5


def mimo_config(target_config: Mapping[str, Any], mtp_layers: int = 1) -> dict[str, Any]:
    """The MiMo ``config.json`` of a Llama target: its fields, model type qwen2, ``mtp_layers`` MTP layers.

    ``model_type`` stays ``qwen2`` (transformers has no ``mimo`` type; vLLM picks the model class
    from ``architectures``).
    """
    if target_config.get("mlp_bias"):
        raise ValueError("MTP target: the Llama target has MLP biases, which a Qwen2 (MiMo) layer cannot hold")
    out = {k: v for k, v in target_config.items() if k not in _LLAMA_ONLY}
    out.update(
        architectures=[ARCHITECTURE],
        model_type="qwen2",
        num_nextn_predict_layers=int(mtp_layers),
        use_sliding_window=False,
        max_window_layers=int(target_config["num_hidden_layers"]),
    )
    return out


def fold_output_bias(v_weight, v_bias, o_weight, o_bias, num_heads: int, num_kv_heads: int):
    """(v_proj bias, o_proj weight) that make an attention block without an o_proj bias compute the same output.

    The part of ``b_o`` that ``W_o`` can reach is folded into the v_proj bias (``d = W_o^+ b_o``;
    with grouped-query attention a kv head's value serves ``num_heads // num_kv_heads`` query
    heads, so ``d`` lives in the kv space and is repeated per group). The rest goes through a
    *constant* value channel: a kv dim whose v_proj row is zero (the copy-circuit init leaves
    such dims, and training cannot revive them: their value and their o_proj column get no
    gradient) carries its bias to every position, so one o_proj column scaled to it adds the
    remainder exactly. Raises ``ValueError`` when neither reproduces ``b_o`` (relative residual
    above :data:`FOLD_TOLERANCE`).
    """
    import torch

    hidden, width = o_weight.shape
    head_dim = width // num_heads
    group = num_heads // num_kv_heads
    kv_width = num_kv_heads * head_dim
    # repeat: kv dims -> query-head dims (head h reads kv head h // group), as vLLM's attention does.
    repeat = torch.zeros(width, kv_width, dtype=torch.float64)
    for h in range(num_heads):
        kv = h // group
        repeat[h * head_dim : (h + 1) * head_dim, kv * head_dim : (kv + 1) * head_dim] = torch.eye(head_dim, dtype=torch.float64)
    w_o, b_o = o_weight.double(), o_bias.double()
    a = w_o @ repeat
    # Singular directions below rcond are left to the constant channel (folding them would blow up d).
    d = torch.linalg.lstsq(a, b_o.unsqueeze(1), rcond=1e-6, driver="gelsd").solution.squeeze(1)
    v_bias_new = v_bias.double() + d
    remainder = b_o - a @ d
    scale = max(float(b_o.norm()), 1e-30)
    if float(remainder.norm()) / scale > FOLD_TOLERANCE:
        dead = [j for j in range(kv_width) if not bool(v_weight[j].any())]
        if not dead:
            raise ValueError(
                f"MTP target: o_proj bias cannot be folded into v_proj (relative residual {float(remainder.norm()) / scale:.2e} > "
                f"{FOLD_TOLERANCE:g}: the value space of {num_kv_heads} kv heads x {head_dim} does not reach it, "
                "and no value dim is constant)"
            )
        j = dead[0]
        kv, k = divmod(j, head_dim)
        cols = [h * head_dim + k for h in range(kv * group, (kv + 1) * group)]
        c = float(v_bias_new[j])
        if c == 0.0:  # an unused channel: make it constant 1, it served no head before
            v_bias_new[j] = 1.0
            w_o[:, cols[1:]] = 0.0  # already contributed nothing (value 0); keep it so
            w_o[:, cols[0]] = remainder
        else:
            w_o[:, cols[0]] = w_o[:, cols[0]] + remainder / c
    return v_bias_new.to(v_bias.dtype), w_o.to(o_weight.dtype)


def mimo_state(target_state: Mapping[str, Any], target_config: Mapping[str, Any]) -> dict[str, Any]:
    """The target's tensors under MiMo's (= Qwen2's) names, each layer's o_proj bias folded into v_proj."""
    import torch

    layers = int(target_config["num_hidden_layers"])
    nh = int(target_config["num_attention_heads"])
    nkv = int(target_config.get("num_key_value_heads", nh))
    state = {k: v for k, v in target_state.items() if not k.endswith("self_attn.o_proj.bias")}
    for i in range(layers):
        p = f"model.layers.{i}.self_attn."
        o_bias = target_state.get(f"{p}o_proj.bias")
        if f"{p}v_proj.bias" not in target_state:
            raise ValueError(f"MTP target: {p}v_proj.bias is missing (a Qwen2 layer has q/k/v biases)")
        if o_bias is None:
            continue
        state[f"{p}v_proj.bias"], state[f"{p}o_proj.weight"] = fold_output_bias(
            target_state[f"{p}v_proj.weight"], target_state[f"{p}v_proj.bias"], target_state[f"{p}o_proj.weight"], o_bias, nh, nkv
        )
    if target_config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    return {k: torch.as_tensor(v).contiguous() for k, v in state.items()}


def max_logit_difference(llama_model, config: Mapping[str, Any], state: Mapping[str, Any], rows) -> float:
    """Largest absolute logit difference between the Llama target and its MiMo form on token ``rows``.

    The MiMo network is run as transformers' Qwen2 (MiMo's base; the MTP layers are not part of
    its forward), so a wrong conversion shows here before an engine loads it.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "num_nextn_predict_layers")}
    qwen = Qwen2ForCausalLM(Qwen2Config(**fields)).eval()
    base = {k: v for k, v in state.items() if not k.startswith("model.mtp_layers.")}
    missing, unexpected = qwen.load_state_dict(base, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embedding
    if missing or unexpected:
        raise ValueError(f"MTP target: MiMo weights do not fit Qwen2 (missing {missing[:4]}, unexpected {unexpected[:4]})")
    qwen.tie_weights()
    with torch.no_grad():
        a = llama_model(input_ids=rows).logits.float()
        b = qwen(input_ids=rows).logits.float()
    return float((a - b).abs().max())
