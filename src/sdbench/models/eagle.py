"""EAGLE-1 and EAGLE-3 draft heads and a MiMo MTP layer trained for a small target, in the layout vLLM loads.

A head reads the frozen target's activations: EAGLE-1 ``fc([token embedding ;
final hidden state])`` then one decoder layer whose first norm is the identity
and no final norm, trained to regress the target's next hidden state and to
match the target's next-token distribution through the target's LM head;
EAGLE-3 ``fc`` over the residual stream entering three target layers, one
decoder layer over ``[norm(embedding) ; norm(fc)]`` and a final norm, trained
on the target's next-token distribution; the MTP layer (``mimo_mtp.py``) reads the
target's hidden state before its final norm and the next token's embedding, normed and
projected by ``input_proj``, then one Qwen2 layer and a final norm (written inside the
target's MiMo form, :mod:`sdbench.models.mimo`). All are trained with *training-time
test* (EAGLE-3's recipe): step ``j`` of a chain feeds the head its own output
of step ``j-1`` and attends, as in vLLM's drafting loop, to the keys of the
true-feature rows before the chain plus the chain's own earlier steps. The
math mirrors ``vllm/model_executor/models/llama_eagle.py`` and
``llama_eagle3.py`` (vLLM 0.10-0.32), so a head scores here as it drafts there.

vLLM leaves a tensor that a checkpoint lacks uninitialized, without an error: the
builder refuses to write a head whose tensors differ from :func:`expected_tensors`
and runs :func:`sdbench.models.check.check_model_dir` (the check every engine run
makes on its drafter) on the written files before the output directory appears.

Module-level imports are the standard library only (torch and transformers load inside the
functions); the options live in :mod:`sdbench.models.headconfig`.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sdbench.models.headconfig import EAGLE_KINDS as KINDS
from sdbench.models.headconfig import HeadConfig
from sdbench.models.headtraining import TargetFeatures as _TargetFeatures
from sdbench.models.check import compare_tensors
from sdbench.models.headtraining import load_frozen_target, optimize, prepare_run, run_record

ARCHITECTURES = {"eagle": "EagleLlamaForCausalLM", "eagle3": "LlamaForCausalLMEagle3", "mtp": "MiMoForCausalLM"}
# Files besides the weights that make an MTP output a loadable model (copied from the target).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
# Largest logit difference accepted between the target and its MiMo form (float32 rounding).
MIMO_LOGIT_TOLERANCE = 1e-3
# Where each kind's one layer sits in its checkpoint.
PREFIX = {"eagle": "layers.0.", "eagle3": "midlayer.", "mtp": "model.mtp_layers.0."}


def expected_tensors(kind: str, config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Checkpoint keys and shapes this vLLM needs for a one-layer head of ``config``."""
    h = int(config["hidden_size"])
    inter = int(config["intermediate_size"])
    nh = int(config["num_attention_heads"])
    nkv = int(config.get("num_key_value_heads", nh))
    hd = int(config.get("head_dim") or h // nh)
    prefix = PREFIX.get(kind, "")
    if kind == "eagle":
        attn_in = h
        shapes: dict[str, tuple[int, ...]] = {"fc.weight": (h, 2 * h)}
    elif kind == "mtp":
        # mimo_mtp.py: input_proj over [hidden_layernorm(h) ; token_layernorm(e)], one Qwen2 layer
        # (q/k/v biases), final_layernorm; the LM head is the target's.
        attn_in = h
        shapes = {
            f"{prefix}{name}.weight": (h,)
            for name in ("token_layernorm", "hidden_layernorm", "final_layernorm", "input_layernorm")
        }
        shapes[f"{prefix}input_proj.weight"] = (h, 2 * h)
        shapes.update({f"{prefix}self_attn.{p}_proj.bias": (n * hd,) for p, n in (("q", nh), ("k", nkv), ("v", nkv))})
    elif kind == "eagle3":
        attn_in = 2 * h
        n_aux = int(config["num_aux_hidden_states"])
        target_h = int(config.get("target_hidden_size", h))
        shapes = {
            "fc.weight": (h, n_aux * target_h),
            "norm.weight": (h,),
            f"{prefix}input_layernorm.weight": (h,),
            f"{prefix}hidden_norm.weight": (h,),
        }
    else:
        raise ValueError(f"unknown head kind {kind!r}; known: {KINDS}")
    shapes.update(
        {
            f"{prefix}self_attn.q_proj.weight": (nh * hd, attn_in),
            f"{prefix}self_attn.k_proj.weight": (nkv * hd, attn_in),
            f"{prefix}self_attn.v_proj.weight": (nkv * hd, attn_in),
            f"{prefix}self_attn.o_proj.weight": (h, nh * hd),
            f"{prefix}post_attention_layernorm.weight": (h,),
            f"{prefix}mlp.gate_proj.weight": (inter, h),
            f"{prefix}mlp.up_proj.weight": (inter, h),
            f"{prefix}mlp.down_proj.weight": (h, inter),
        }
    )
    return shapes


def check_head_tensors(kind: str, config: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Raise ``ValueError`` naming the first missing, unexpected or mis-shaped tensor of a head.

    vLLM loads an EAGLE head without checking that every parameter was in the
    checkpoint (a missing one stays uninitialized), and rejects extra keys only
    by a late error inside the engine: both are refused here instead.
    """
    compare_tensors(f"{kind} head", expected_tensors(kind, config), shapes,
                    " (vLLM would leave it uninitialized)", "this vLLM has no parameter for it")  # fmt: skip


def head_config(kind: str, target_config: Mapping[str, Any], cfg: HeadConfig) -> dict[str, Any]:
    """The head's ``config.json``: the target's, one layer, no biases, the head's architecture.

    An MTP layer ships inside its target: its config is the target's as MiMo (:mod:`sdbench.models.mimo`).
    """
    if kind == "mtp":
        from sdbench.models.mimo import mimo_config

        return mimo_config(target_config)
    out = {k: v for k, v in target_config.items() if k not in ("architectures", "transformers_version")}
    out.update(
        architectures=[ARCHITECTURES[kind]],
        num_hidden_layers=1,
        attention_bias=False,  # the head has no bias tensors; with True vLLM would expect them
        mlp_bias=False,
    )
    if kind == "eagle3":
        out.update(
            draft_vocab_size=int(target_config["vocab_size"]),  # same vocabulary: no d2t map
            target_hidden_size=int(target_config["hidden_size"]),
            num_aux_hidden_states=len(cfg.aux_layers),
            eagle_config={"eagle_aux_hidden_state_layer_ids": list(cfg.aux_layers), "use_aux_hidden_state": True},
        )
    return out


def _rms(x, weight, eps: float):
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rotate(x, cos, sin):
    import torch

    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class _Head:
    """The head's parameters and forward pass (plain tensors, mirroring vLLM's modules)."""

    def __init__(self, kind: str, config: Mapping[str, Any], n_aux: int, seed: int) -> None:
        import torch

        self.kind = kind
        h = int(config["hidden_size"])
        self.h = h
        self.nh = int(config["num_attention_heads"])
        self.nkv = int(config.get("num_key_value_heads", self.nh))
        self.hd = int(config.get("head_dim") or h // self.nh)
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        rope = config.get("rope_parameters") or {}
        self.theta = float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
        shapes = expected_tensors(kind, {**config, "num_aux_hidden_states": n_aux})
        gen = torch.Generator().manual_seed(seed)
        self.params: dict[str, torch.Tensor] = {}
        for name, shape in shapes.items():
            if name.endswith(".bias"):
                t = torch.zeros(shape)
            elif len(shape) == 1:
                t = torch.ones(shape)
            else:
                t = torch.randn(shape, generator=gen) * (1.0 / math.sqrt(shape[1]))
            self.params[name] = t.requires_grad_(True)
        self.prefix = PREFIX[kind]

    def p(self, name: str):
        return self.params[self.prefix + name]

    def layer_input(self, emb, hidden):
        """(attention input, residual) of the decoder layer for token embeddings and hidden inputs."""
        import torch

        if self.kind == "eagle":
            x = torch.nn.functional.linear(torch.cat((emb, hidden), dim=-1), self.params["fc.weight"])
            return x, x  # layer 0's input_layernorm is the identity
        if self.kind == "mtp":
            h = _rms(hidden, self.p("hidden_layernorm.weight"), self.eps)
            x = torch.nn.functional.linear(torch.cat((h, _rms(emb, self.p("token_layernorm.weight"), self.eps)), dim=-1), self.p("input_proj.weight"))
            return _rms(x, self.p("input_layernorm.weight"), self.eps), x
        e = _rms(emb, self.p("input_layernorm.weight"), self.eps)
        return torch.cat((e, _rms(hidden, self.p("hidden_norm.weight"), self.eps)), dim=-1), hidden

    def qkv(self, x, positions):
        import torch.nn.functional as F

        b, t, _ = x.shape
        bias = self.params.get  # Qwen2 (MTP) layers have q/k/v biases, Llama heads none
        q = F.linear(x, self.p("self_attn.q_proj.weight"), bias(self.prefix + "self_attn.q_proj.bias"))
        k = F.linear(x, self.p("self_attn.k_proj.weight"), bias(self.prefix + "self_attn.k_proj.bias"))
        v = F.linear(x, self.p("self_attn.v_proj.weight"), bias(self.prefix + "self_attn.v_proj.bias"))
        q = q.view(b, t, self.nh, self.hd).transpose(1, 2)
        k = k.view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = v.view(b, t, self.nkv, self.hd).transpose(1, 2)
        cos, sin = self._rope(positions)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if self.nkv != self.nh:
            k = k.repeat_interleave(self.nh // self.nkv, dim=1)
            v = v.repeat_interleave(self.nh // self.nkv, dim=1)
        return q, k, v

    def _rope(self, positions):
        import torch

        inv = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
        freqs = positions.float()[:, None] * inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[None, None], emb.sin()[None, None]

    def finish(self, attn, residual):
        """(features fed to the LM head, features fed to the next draft step)."""
        import torch.nn.functional as F

        b, _, t, _ = attn.shape
        a = F.linear(attn.transpose(1, 2).reshape(b, t, self.nh * self.hd), self.p("self_attn.o_proj.weight"))
        r = a + residual
        x = _rms(r, self.p("post_attention_layernorm.weight"), self.eps)
        m = F.linear(F.silu(F.linear(x, self.p("mlp.gate_proj.weight"))) * F.linear(x, self.p("mlp.up_proj.weight")), self.p("mlp.down_proj.weight"))
        out = m + r
        if self.kind == "eagle":
            return out, out  # no final norm: the same tensor goes to the logits and the next step
        if self.kind == "mtp":
            final = _rms(out, self.p("final_layernorm.weight"), self.eps)
            return final, final  # mimo_mtp.py returns the normed state for both
        return _rms(out, self.params["norm.weight"], self.eps), out


def unrolled_forward(head: _Head, embed, first_hidden, ttt_steps: int) -> list[tuple[Any, Any]]:
    """Run ``ttt_steps`` drafting steps over every chain of a batch; returns (logit features, next hidden) per step.

    ``embed`` is ``[B, T + ttt_steps - 1, H]``: row ``p + j - 1`` is the
    embedding of the token fed at chain ``p``'s step ``j``. ``first_hidden``
    is ``[B, T, H]``: the step-1 hidden input of each chain (EAGLE-1: the
    target's final hidden state; EAGLE-3: ``fc`` of the aux states). Step ``j``
    of chain ``p`` sits at position ``p + j - 1`` and attends to the step-1
    keys of chains ``0..p`` (the true-feature rows vLLM holds in its KV cache)
    plus chain ``p``'s own keys of steps ``2..j``.
    """
    import torch

    b, t, _ = first_hidden.shape
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    scale = 1.0 / math.sqrt(head.hd)
    hidden = first_hidden
    keys, values, outs = [], [], []
    for j in range(1, ttt_steps + 1):
        positions = torch.arange(j - 1, j - 1 + t)
        x, residual = head.layer_input(embed[:, j - 1 : j - 1 + t], hidden)
        q, k, v = head.qkv(x, positions)
        if j == 1:
            k1, v1 = k, v
        else:
            keys.append(k)
            values.append(v)
        s1 = (q @ k1.transpose(-1, -2)) * scale
        s1 = s1.masked_fill(~causal, float("-inf"))
        if keys:
            sd = torch.stack([(q * kk).sum(-1) * scale for kk in keys], dim=-1)  # [B, h, T, j-1]
            probs = torch.softmax(torch.cat((s1, sd), dim=-1), dim=-1)
            attn = probs[..., :t] @ v1 + (probs[..., t:].unsqueeze(-1) * torch.stack(values, dim=-2)).sum(-2)
        else:
            attn = torch.softmax(s1, dim=-1) @ v1
        logit_in, hidden = head.finish(attn, residual)
        outs.append((logit_in, hidden))
    return outs


def _losses(head: _Head, feats: dict[str, Any], rows, lm_head, embed_w, cfg: HeadConfig, with_metrics: bool = False):
    """Weighted loss over the chain steps, plus per-step top-1 agreement with the target."""
    import torch
    import torch.nn.functional as F

    j_max = cfg.ttt_steps
    n = rows.shape[1]
    t = n - j_max  # chains p = 0..t-1; step j reads token p + j and label position p + j
    embed = F.embedding(rows[:, 1 : t + j_max], embed_w)
    if head.kind == "eagle":
        first = feats["final"][:, :t]
    elif head.kind == "mtp":
        first = feats["pre_norm"][:, :t]
        embed = torch.cat((torch.zeros_like(embed[:, :1]), embed[:, 1:]), dim=1)  # mimo_mtp.py masks position 0
    else:
        first = F.linear(feats["aux"][:, :t], head.params["fc.weight"])
    outs = unrolled_forward(head, embed, first, j_max)
    total = torch.zeros(())
    agree = []
    for j, (logit_in, hidden) in enumerate(outs, start=1):
        target_lp = feats["logprobs"][:, j : j + t]
        logp = F.log_softmax(F.linear(logit_in, lm_head), dim=-1)
        token_loss = -(target_lp.exp() * logp).sum(-1).mean()  # cross-entropy to the target's distribution
        loss = token_loss
        if head.kind == "eagle" and cfg.feature_weight:
            loss = loss + cfg.feature_weight * F.smooth_l1_loss(hidden, feats["final"][:, j : j + t])
        total = total + (cfg.step_decay ** (j - 1)) * loss
        if with_metrics:
            agree.append((logp.argmax(-1) == target_lp.argmax(-1)).float().mean().item())
    return total, agree


def train_head(
    target_dir: str | Path,
    tokenizer_dir: str | Path,
    output: str | Path,
    cfg: HeadConfig,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train an EAGLE/EAGLE-3 head (or MTP layer; Medusa heads: :mod:`sdbench.models.medusa`) for
    the target in ``target_dir``; save it under ``output``.

    ``output`` receives ``config.json``, ``model.safetensors`` (keys checked by
    :func:`check_head_tensors`) and ``training.json`` (hyper-parameters, losses,
    held-out top-1 agreement with the target per chain step, wall and CPU time).
    """
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from sdbench.io import atomic_dir
    from sdbench.models.check import check_model_dir
    from sdbench.models.mimo import max_logit_difference
    from sdbench.models.training import TrainingData, _autocast, compiled_step_loss

    if cfg.kind == "medusa":  # residual blocks over the last hidden state, not a decoder layer
        from sdbench.models.medusa import train_medusa

        return train_medusa(target_dir, tokenizer_dir, output, cfg, log)
    target_dir = Path(target_dir)
    target_config, precision, compile_mode = prepare_run(target_dir, cfg)
    t0, c0 = time.perf_counter(), time.process_time()
    target = load_frozen_target(target_dir)
    features = _TargetFeatures(target, cfg.aux_layers)
    embed_w = target.model.embed_tokens.weight
    lm_head = target.lm_head.weight
    data = TrainingData(tokenizer_dir, cfg.seq_len, cfg.seed)
    head = _Head(cfg.kind, target_config, len(cfg.aux_layers), cfg.seed)

    def head_loss(feats, rows):
        with _autocast(precision):
            return _losses(head, feats, rows, lm_head, embed_w, cfg)[0]

    step_loss = compiled_step_loss(head_loss, compile_mode)  # the frozen target's forward stays eager
    losses, train_s, train_cpu = optimize(list(head.params.values()), features, step_loss, data, cfg, precision, log)
    agree = _heldout_agreement(head, features, data, lm_head, embed_w, cfg)
    log(f"train-head {cfg.kind}: held-out top-1 agreement per step {agree}, {train_s:.0f}s ({train_cpu:.0f} CPU s)")
    state = {name: t.detach().contiguous() for name, t in head.params.items()}
    config = head_config(cfg.kind, target_config, cfg)
    check_head_tensors(cfg.kind, config, {k: tuple(v.shape) for k, v in state.items()})
    info = {
        "config": {**asdict(cfg), "aux_layers": list(cfg.aux_layers)},
        "kind": cfg.kind,
        "precision": precision,
        "compile": compile_mode,
        "vllm_method": cfg.kind,  # speculative_config method: the kind's own name
        "parameters": int(sum(t.numel() for t in state.values())),
        "shapes": {k: list(v.shape) for k, v in sorted(state.items())},
        "final_train_loss": round(float(np.mean(losses[-max(1, cfg.steps // 10) :])), 4),
        "heldout_top1_agreement_per_step": agree,
        **run_record(target_dir, t0, c0, train_s, train_cpu),
    }
    if cfg.kind == "mtp":
        state = {**_mimo_target_state(target_dir, target_config), **state}
        rows = torch.from_numpy(np.stack([data.heldout_stream[: cfg.seq_len]]))
        diff = max_logit_difference(target, config, state, rows)
        log(f"train-head mtp: MiMo form of the target, largest logit difference {diff:.2e} on a held-out window")
        if diff > MIMO_LOGIT_TOLERANCE:
            raise ValueError(f"MTP target: the MiMo form's logits differ from the target's by {diff:.2e} (> {MIMO_LOGIT_TOLERANCE:g})")
        info["mimo_max_logit_difference"] = float(f"{diff:.3g}")
    with atomic_dir(output) as tmp:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if cfg.kind == "mtp":  # a full model: the engine tokenizes with it
            for name in TOKENIZER_FILES:
                if (target_dir / name).is_file():
                    shutil.copyfile(target_dir / name, tmp / name)
        (tmp / "training.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        check_model_dir(tmp, role=cfg.kind)  # the engine's own pre-flight check, on the files written
    return info


def _mimo_target_state(target_dir: Path, target_config: Mapping[str, Any]) -> dict[str, Any]:
    """The target's weights as MiMo's (an MTP layer ships inside its model)."""
    from safetensors.torch import load_file

    from sdbench.models.mimo import mimo_state

    return mimo_state(load_file(str(target_dir / "model.safetensors")), target_config)


def _heldout_agreement(head: _Head, features, data, lm_head, embed_w, cfg: HeadConfig) -> list[float]:
    """Top-1 agreement with the target per chain step on evenly spaced held-out windows."""
    import numpy as np
    import torch

    n = cfg.seq_len + 1
    stream = data.heldout_stream
    starts = np.linspace(0, len(stream) - n - 1, cfg.eval_windows).astype(np.int64)
    rows = torch.from_numpy(np.stack([stream[s : s + n] for s in starts]))
    with torch.no_grad():
        _, agree = _losses(head, features(rows), rows, lm_head, embed_w, cfg, with_metrics=True)
    return [round(a, 4) for a in agree]


def _cmd_train_head(args: argparse.Namespace) -> int:
    fields = HeadConfig.__dataclass_fields__
    values = {name: getattr(args, name) for name in fields}
    values["aux_layers"] = tuple(values["aux_layers"])
    cfg = HeadConfig(**values)
    # A bad option or input (ValueError / ConfigError) becomes one `error:` line in sdbench.cli.main.
    train_head(args.target, args.tokenizer, args.output, cfg, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    return 0
