"""What every draft-head training run shares (``sdbench train-head``): the frozen target, its
features, the optimization loop and the run record.

:mod:`sdbench.models.eagle` (EAGLE-1, EAGLE-3, MTP) and :mod:`sdbench.models.medusa` train on
the same corpus batches (:class:`sdbench.models.training.TrainingData`, seeded), the target's
learning-rate schedule, precision and compile options, and record the same wall and CPU times.

Module-level imports are the standard library only (torch and transformers load inside the
functions).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sdbench.models.headconfig import HeadConfig


class TargetFeatures:
    """The frozen target's features for a batch: embeddings, final hidden, aux residual streams, log-probs."""

    def __init__(self, model, aux_layers: tuple[int, ...]) -> None:
        self.model = model
        self.aux_layers = aux_layers
        self._pre_norm = None
        model.model.norm.register_forward_hook(self._hook)

    def _hook(self, module, inputs, output) -> None:
        self._pre_norm = inputs[0]

    def __call__(self, rows):
        import torch

        with torch.no_grad():
            out = self.model(input_ids=rows, output_hidden_states=True)
            states = list(out.hidden_states)
            n = len(self.model.model.layers)
            streams = {i: (states[i] if i < n else self._pre_norm) for i in self.aux_layers}
            return {
                "final": out.hidden_states[-1].float(),  # after the final norm (vLLM's EAGLE-1 input)
                "pre_norm": self._pre_norm.float(),  # before it (MiMo's MTP input)
                "aux": torch.cat([streams[i].float() for i in self.aux_layers], dim=-1),
                "logprobs": torch.log_softmax(out.logits.float(), dim=-1),
            }


def prepare_run(target_dir: Path, cfg: HeadConfig) -> tuple[dict[str, Any], str, str]:
    """Check the target and the options, set this run's threads, determinism and seed.

    Returns (the target's ``config.json``, the resolved precision, the resolved compile mode).
    """
    import torch
    from transformers.utils import logging as hf_logging

    from sdbench.models.check import check_model_dir, read_config
    from sdbench.models.training import resolve_compile, resolve_precision

    hf_logging.set_verbosity_error()
    check_model_dir(target_dir, role="target")
    target_config = read_config(target_dir)
    cfg.validate(int(target_config["num_hidden_layers"]))
    torch.set_num_threads(cfg.threads)
    torch.use_deterministic_algorithms(True)
    precision = resolve_precision(cfg.precision)
    compile_mode = resolve_compile(cfg.compile)
    torch.manual_seed(cfg.seed)
    return target_config, precision, compile_mode


def load_frozen_target(target_dir: Path):
    """The target in float32, in eval mode, with no parameter requiring a gradient."""
    import torch
    from transformers import LlamaForCausalLM

    target = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    return target


def optimize(params: list[Any], features, step_loss, data, cfg: HeadConfig, precision: str, log: Callable[[str], None]):
    """AdamW on ``params`` over ``cfg.steps`` batches of ``data``, the target's schedule; returns
    (the loss per step, wall seconds, CPU seconds of the loop)."""
    import torch

    from sdbench.models.training import _autocast
    from sdbench.models.training import _lr_at as lr_at  # the target's schedule (same field names)

    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay, foreach=False)
    losses: list[float] = []
    t1, c1 = time.perf_counter(), time.process_time()
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        rows = torch.from_numpy(data.batch(cfg.batch_size, cfg.edit_fraction))
        # bf16 matmuls halve a step's CPU time where the CPU has native bf16 (else float32:
        # emulated bf16 costs more); parameters, norms and the loss stay float32.
        with _autocast(precision):
            feats = features(rows)
        loss = step_loss(feats, rows)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip, foreach=False)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if (step + 1) % max(1, cfg.steps // 10) == 0:
            recent = losses[-max(1, cfg.steps // 10) :]
            log(f"  step {step + 1}/{cfg.steps} loss {sum(recent) / len(recent):.3f} ({time.perf_counter() - t1:.0f}s)")
    return losses, time.perf_counter() - t1, time.process_time() - c1


def run_record(target_dir: Path, t0: float, c0: float, train_s: float, train_cpu: float) -> dict[str, Any]:
    """``training.json`` entries every head records: the target's digests, wall and CPU seconds."""
    from sdbench.models.training import children_cpu_seconds

    return {
        "target_config_sha256": hashlib.sha256((target_dir / "config.json").read_bytes()).hexdigest(),
        "target_weights_sha256": hashlib.sha256((target_dir / "model.safetensors").read_bytes()).hexdigest(),
        "wall_seconds": {"train": round(train_s, 2), "total": round(time.perf_counter() - t0, 2)},
        "cpu_seconds": {"train": round(train_cpu, 2), "process": round(time.process_time(), 2), "this_build": round(time.process_time() - c0, 2),
                        "children": children_cpu_seconds()},
    }


