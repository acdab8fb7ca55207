"""Medusa-1 draft heads trained for a small target, in the layout vLLM loads (``method: medusa``).

vLLM's Medusa (``vllm/model_executor/models/medusa.py``, read for vLLM 0.32.0): head ``i`` is
a ``ResidualBlock`` (``num_hidden_layers`` times ``x = x + SiLU(W x + b)``; ``b`` only with
``medusa_fc_bias``) over the target's last hidden state, then the head's own LM head
(``lm_heads.<i>``; one shared ``lm_head`` with ``original_lm_head``). The proposer
(``vllm/v1/spec_decode/medusa.py``) feeds every head the hidden state of the last accepted token
(after the target's final norm: the state the runner samples from) and drafts the argmax of heads
``0..k-1`` at once. The target's LM head turns that state into token ``t+1``, so head ``i``
drafts token ``t+2+i``: Medusa-1's heads over a frozen backbone.

Training reuses the EAGLE heads' machinery (:mod:`sdbench.models.headtraining`): the same
corpus batches and seeds (:class:`sdbench.models.training.TrainingData`), the frozen target's
features, the target's learning-rate schedule, precision and compile options. Head ``i`` at position
``p`` is trained to the target's next-token distribution at position ``p+1+i`` (self-distillation:
greedy verification accepts the target's argmax), weighted ``step_decay ** i`` (Medusa's
0.8 decay). Blocks start at zero (a head first repeats the target's own next token) and LM heads
as copies of the target's, as in the reference implementation.

vLLM builds ``num_speculative_tokens`` heads (``MedusaConfig.num_lookahead_tokens`` sets
``num_heads``) and loads the checkpoint's first ``k``; ``MedusaConfig.from_pretrained`` renames
every config key holding "num" and "heads" to ``num_heads`` (and "num"+"layers" to
``num_hidden_layers``), so the config written here has no other such key.

The directory's format (config, tensors, its check) is :mod:`sdbench.models.medusaformat`.
Module-level imports are the standard library only (torch loads inside the functions); the
options are :class:`sdbench.models.headconfig.HeadConfig`'s (``kind: medusa``, ``num_heads``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sdbench.models.headconfig import HeadConfig
from sdbench.models.medusaformat import check_medusa_dir, check_medusa_tensors, expected_tensors, medusa_config


class MedusaHeads:
    """The heads' parameters (vLLM's names) and forward pass, as plain tensors."""

    def __init__(self, config: Mapping[str, Any], lm_head_weight) -> None:
        import torch

        self.config = dict(config)
        self.num_heads = int(config["num_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.params: dict[str, torch.Tensor] = {}
        for name, shape in expected_tensors(config).items():
            if name.startswith("lm_head"):
                t = lm_head_weight.detach().float().clone()  # the reference copies the base LM head
            else:
                t = torch.zeros(shape)  # block = identity: a head starts as the target's next token
            if tuple(t.shape) != shape:
                raise ValueError(f"medusa heads: the target's LM head is {list(t.shape)}, {name} needs {list(shape)}")
            self.params[name] = t.requires_grad_(True)

    def features(self, hidden) -> list[Any]:
        """Each head's block output (vLLM ``Medusa.forward``) for hidden states ``[..., H]``."""
        import torch.nn.functional as F

        outs = []
        for i in range(self.num_heads):
            x = hidden
            for j in range(self.layers):
                p = f"blocks.{i}.layers.{j}."
                x = x + F.silu(F.linear(x, self.params[p + "weight"], self.params.get(p + "bias")))
            outs.append(x)
        return outs

    def logits(self, hidden) -> list[Any]:
        """Each head's logits (vLLM ``Medusa.compute_logits`` without a token map)."""
        import torch.nn.functional as F

        shared = self.params.get("lm_head.weight")
        return [F.linear(x, shared if shared is not None else self.params[f"lm_heads.{i}.weight"])
                for i, x in enumerate(self.features(hidden))]


def medusa_losses(heads: MedusaHeads, feats: Mapping[str, Any], step_decay: float, with_metrics: bool = False):
    """(Weighted cross-entropy to the target's distributions, metrics) for one batch of features.

    ``feats`` is :class:`sdbench.models.headtraining.TargetFeatures`' output for rows of ``n`` tokens:
    head ``i`` at position ``p`` (``p < n - num_heads``) reads ``final[p]`` and is scored against
    the target's distribution at ``p + 1 + i``. Metrics: top-1 agreement with the target's argmax
    per head, and the mean accepted length of a chain of all heads scored position by position
    (1 + the number of leading heads that agree: a rough estimate of the engine's).
    """
    import torch
    import torch.nn.functional as F

    k = heads.num_heads
    t = feats["final"].shape[1] - k
    total = torch.zeros(())
    agree: list[float] = []
    hits = []
    for i, logits in enumerate(heads.logits(feats["final"][:, :t])):
        target_lp = feats["logprobs"][:, 1 + i : 1 + i + t]
        logp = F.log_softmax(logits.float(), dim=-1)
        total = total + (step_decay**i) * -(target_lp.exp() * logp).sum(-1).mean()
        if with_metrics:
            hit = logp.argmax(-1) == target_lp.argmax(-1)
            hits.append(hit)
            agree.append(hit.float().mean().item())
    metrics: dict[str, Any] = {}
    if with_metrics:
        chained = torch.stack(hits, dim=-1).long().cumprod(dim=-1)
        metrics = {"agreement_per_head": agree, "chain_acceptance_length": 1.0 + chained.sum(-1).float().mean().item()}
    return total, metrics


def heldout_metrics(heads: MedusaHeads, features, data, cfg: HeadConfig) -> dict[str, Any]:
    """:func:`medusa_losses` metrics on the held-out windows the EAGLE heads are scored on."""
    import numpy as np
    import torch

    n = cfg.seq_len + 1
    stream = data.heldout_stream
    starts = np.linspace(0, len(stream) - n - 1, cfg.eval_windows).astype(np.int64)
    rows = torch.from_numpy(np.stack([stream[s : s + n] for s in starts]))
    with torch.no_grad():
        loss, metrics = medusa_losses(heads, features(rows), cfg.step_decay, with_metrics=True)
    return {
        "heldout_loss": round(loss.item(), 4),
        "heldout_top1_agreement_per_head": [round(a, 4) for a in metrics["agreement_per_head"]],
        "heldout_chain_acceptance_length": round(metrics["chain_acceptance_length"], 4),
    }


def train_medusa(
    target_dir: str | Path,
    tokenizer_dir: str | Path,
    output: str | Path,
    cfg: HeadConfig,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train ``cfg.num_heads`` Medusa-1 heads for the target in ``target_dir``; save them under ``output``.

    ``output`` receives ``config.json`` (:func:`medusa_config`), ``model.safetensors`` (keys of
    :func:`expected_tensors`) and ``training.json`` (hyper-parameters, held-out agreement per
    head, wall and CPU time); :func:`check_medusa_dir` runs on the files before the directory appears.
    """
    import numpy as np

    from sdbench.io import atomic_dir
    from sdbench.models.headtraining import TargetFeatures, load_frozen_target, optimize, prepare_run, run_record
    from sdbench.models.training import TrainingData, _autocast, compiled_step_loss

    if cfg.kind != "medusa":
        raise ValueError(f"train_medusa: kind {cfg.kind!r} is not medusa (sdbench.models.eagle.train_head trains it)")
    target_dir = Path(target_dir)
    target_config, precision, compile_mode = prepare_run(target_dir, cfg)
    config = medusa_config(target_config, cfg.num_heads)
    t0, c0 = time.perf_counter(), time.process_time()
    target = load_frozen_target(target_dir)
    features = TargetFeatures(target, (0,))  # no aux stream is read: (0,) is the embeddings, free
    data = TrainingData(tokenizer_dir, cfg.seq_len, cfg.seed)
    heads = MedusaHeads(config, target.lm_head.weight)

    def head_loss(feats, rows):
        with _autocast(precision):
            return medusa_losses(heads, feats, cfg.step_decay)[0]

    step_loss = compiled_step_loss(head_loss, compile_mode)  # the frozen target's forward stays eager
    losses, train_s, train_cpu = optimize(list(heads.params.values()), features, step_loss, data, cfg, precision, log)
    held = heldout_metrics(heads, features, data, cfg)
    log(
        f"train-head medusa: held-out top-1 agreement per head {held['heldout_top1_agreement_per_head']}, "
        f"chain acceptance length {held['heldout_chain_acceptance_length']:.2f}, {train_s:.0f}s ({train_cpu:.0f} CPU s)"
    )
    state = {name: t.detach().contiguous() for name, t in heads.params.items()}
    check_medusa_tensors(config, {k: tuple(v.shape) for k, v in state.items()})
    info = {
        "config": {**asdict(cfg), "aux_layers": list(cfg.aux_layers)},
        "kind": "medusa",
        "precision": precision,
        "compile": compile_mode,
        "vllm_method": "medusa",  # speculative_config method; num_speculative_tokens <= num_heads
        "max_num_speculative_tokens": cfg.num_heads,
        "parameters": int(sum(t.numel() for t in state.values())),
        "shapes": {k: list(v.shape) for k, v in sorted(state.items())},
        "final_train_loss": round(float(np.mean(losses[-max(1, cfg.steps // 10) :])), 4),
        **held,
        **run_record(target_dir, t0, c0, train_s, train_cpu),
    }
    with atomic_dir(output) as tmp:
        write_heads(tmp, config, state, info)
    return info


def write_heads(directory: str | Path, config: Mapping[str, Any], state: Mapping[str, Any], info: Mapping[str, Any] | None = None) -> None:
    """Write ``config.json``, ``model.safetensors`` (and ``training.json``) into an existing
    directory, then :func:`check_medusa_dir` on the files written."""
    from safetensors.torch import save_file

    directory = Path(directory)
    save_file(dict(state), str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if info is not None:
        (directory / "training.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    check_medusa_dir(directory)
