"""Architecture of the small models: a plain ``transformers`` Llama (:func:`llama_config`),
optionally starting from a hand-initialized copy (induction) circuit (:func:`init_induction_circuit`).

torch and transformers are imported by the functions that use them.
"""

from __future__ import annotations

import math

from sdbench.models.trainconfig import INDUCTION_INITS, TrainConfig


def llama_config(cfg: TrainConfig, vocab_size: int, bos: int, eos: int, pad: int):  # -> LlamaConfig
    """The ``transformers.LlamaConfig`` for ``cfg`` (tied embeddings; attention biases only with an induction init)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.hidden // cfg.heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=True,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        # Biases give the hand-initialized previous-token heads a content-free query/key.
        attention_bias=cfg.induction_init != "none",
        mlp_bias=False,
    )


def _previous_token_head(att, head: int, head_dim: int, distance: int, scale: float, inv_freq) -> None:
    """Make ``head`` attend to the token ``distance`` positions back, whatever the content.

    Query and key are constant (zero weights, biases only), so the RoPE score
    is ``sum_m scale^2 cos((delta - distance) * theta_m)``: largest at
    ``delta == distance``.
    """
    import torch

    half = head_dim // 2
    rows = slice(head * head_dim, (head + 1) * head_dim)
    att.q_proj.weight[rows] = 0.0
    att.k_proj.weight[rows] = 0.0
    q_bias, k_bias = torch.zeros(head_dim), torch.zeros(head_dim)
    q_bias[:half] = scale * torch.cos(distance * inv_freq)
    q_bias[half:] = -scale * torch.sin(distance * inv_freq)
    k_bias[:half] = scale
    att.q_proj.bias[rows] = q_bias
    att.k_proj.bias[rows] = k_bias


def init_induction_circuit(model, kind: str = "bigram", seed: int = 0) -> None:
    """Hand-initialize a copy (induction) circuit in layers 0-1 of a fresh Llama model.

    Why: in a few thousand CPU steps, gradient descent does not discover
    induction heads (tried: more edit data, shapes, RoPE base, a synthetic
    copy task), so the models cannot copy from the prompt, which is what
    makes code-edit outputs n-gram friendly. Starting from a working circuit,
    training refines it within the budget. Only the initial weights differ;
    the architecture is a plain Llama (with attention biases).

    Layout of the residual stream (width d): token identity in dims
    ``[0, d/2)`` (embeddings are zeroed elsewhere); layer-0 head 0 writes the
    previous token there (``[d/2, 3d/4)``, projected), and for ``"bigram"``
    layer-0 head 1 writes the token two back into ``[3d/4, d)``. Layer-1 head 0
    is the induction head: its query (current [and previous] token) matches
    keys holding the preceding token(s) through the lowest-frequency RoPE
    pairs only (nearly position-invariant with a large RoPE base), and its
    value copies the attended token into the token dims, which the tied LM
    head reads. ``"unigram"`` matches one token, ``"bigram"`` two (far fewer
    false matches in code). The scales were tuned so that the untrained model
    already predicts the second copy of a repeated random sequence.
    """
    import torch

    if kind == "none":
        return
    if kind not in INDUCTION_INITS:
        raise ValueError(f"--induction-init must be one of {INDUCTION_INITS}, got {kind!r}")
    cfg = model.config
    d = cfg.hidden_size
    hd = cfg.head_dim
    half = hd // 2
    a = d // 2  # token-identity dims
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    inv_freq = theta ** (-torch.arange(half, dtype=torch.float32) * 2 / hd)
    prev_scale, qk_scale, ov_scale, norm_scale = 9.0, 3.0, 3.0, 8.0
    low = list(range(half - half // 2, half))  # lowest-frequency half of the RoPE pairs
    gen = torch.Generator().manual_seed(seed)

    def orthonormal_rows(rows: int, cols: int):
        return torch.linalg.qr(torch.randn(cols, rows, generator=gen))[0].T

    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb[:, a:] = 0.0
        e_norm = emb[:, :a].norm(dim=1).mean().item()
        att0, att1 = model.model.layers[0].self_attn, model.model.layers[1].self_attn
        for att in (att0, att1):
            att.v_proj.weight[:hd] = 0.0
            att.o_proj.weight[:, :hd] = 0.0
        att1.q_proj.weight[:hd] = 0.0
        att1.k_proj.weight[:hd] = 0.0
        if kind == "unigram":
            b = d - a
            _previous_token_head(att0, 0, hd, 1, prev_scale, inv_freq)
            att0.v_proj.weight[:hd, :a] = torch.eye(hd, a)
            att0.o_proj.weight[a:, :hd] = torch.eye(b, hd) * e_norm / math.sqrt(d)
            dims = low + [p + half for p in low]
            proj = orthonormal_rows(len(dims), a)
            att1.q_proj.weight[dims, :a] = qk_scale * proj
            att1.k_proj.weight[dims, a:] = qk_scale * proj
        else:
            b = (d - a) // 2
            compress = orthonormal_rows(b, a)  # token identity -> b dims
            for head, distance, lo in ((0, 1, a), (1, 2, a + b)):
                _previous_token_head(att0, head, hd, distance, prev_scale, inv_freq)
                cols = slice(head * hd, (head + 1) * hd)
                att0.v_proj.weight[cols] = 0.0
                att0.v_proj.weight[head * hd : head * hd + b, :a] = compress
                att0.o_proj.weight[:, cols] = 0.0
                att0.o_proj.weight[lo : lo + b, head * hd : head * hd + b] = (
                    torch.eye(b) * e_norm / math.sqrt(d) * math.sqrt(a / b)
                )
            k2 = len(low) // 2
            d1 = low[:k2] + [p + half for p in low[:k2]]
            d2 = low[k2:] + [p + half for p in low[k2:]]
            r1, r2 = orthonormal_rows(len(d1), b), orthonormal_rows(len(d2), b)
            # score(i, j) ~ <tok_i, tok_{j-1}> + <tok_{i-1}, tok_{j-2}>
            att1.q_proj.weight[d1, :a] = qk_scale * r1 @ compress
            att1.k_proj.weight[d1, a : a + b] = qk_scale * r1
            att1.q_proj.weight[d2, a : a + b] = qk_scale * r2
            att1.k_proj.weight[d2, a + b :] = qk_scale * r2
        att1.v_proj.weight[:hd, :a] = torch.eye(hd, a)
        att1.o_proj.weight[:a, :hd] = ov_scale * torch.eye(a, hd) * e_norm / math.sqrt(d / 2)
        model.model.norm.weight.mul_(norm_scale)
