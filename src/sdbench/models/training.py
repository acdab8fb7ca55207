"""Training the small models the pipeline builds itself: Llama target and draft on CPU.

Everything is offline and deterministic: the corpus is the interpreter's
standard library (:mod:`sdbench.datasets.corpus`), the tokenizer is a byte-level BPE,
and the models are ``transformers`` Llama models trained on CPU with fixed
seeds and deterministic kernels, so the same thread count gives bit-identical
``model.safetensors`` on a rerun. Output directories are Hugging Face model
directories that ``transformers`` and vLLM load directly; target and draft
built from the same tokenizer directory share the vocabulary, as
draft-model speculative decoding requires.

The tokenizer is :mod:`sdbench.models.tokenizer`, the architecture
:mod:`sdbench.models.architecture`, the hyper-parameters
:mod:`sdbench.models.trainconfig`. torch, transformers and tokenizers are
imported by the functions that need them.
"""
from __future__ import annotations

import argparse
import hashlib
import math
import os
import platform
import random
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sdbench.io import atomic_dir
from sdbench.models.architecture import init_induction_circuit, llama_config
from sdbench.models.tokenizer import (
    BOS_TOKEN,
    DATA_DIR,
    EOS_TOKEN,
    PAD_TOKEN,
    TOKENIZER_FILES,
    load_tokenizer,
    read_json,
    write_json,
)
from sdbench.models.trainconfig import TrainConfig

TRAIN_ATTENTION = "eager"  # transformers attention implementation used while training


class TrainingData:
    """Tokenized corpus stream plus tokenized edit examples, with a seeded batch sampler.

    Loaded from the ``data/`` directory that ``build-tokenizer`` writes.
    Plain rows are random windows of the train stream (each file wrapped in
    bos/eos). Edit rows pack whole ``bos prompt completion eos`` examples
    back to back, so every edit row is dense in copy-and-edit supervision and
    the model also learns to stop (eos) after the edited code.
    """

    def __init__(self, tokenizer_dir: str | os.PathLike[str], seq_len: int, seed: int) -> None:
        import numpy as np

        data = Path(tokenizer_dir) / DATA_DIR
        if not (data / "train_stream.npy").is_file():
            raise FileNotFoundError(
                f"--tokenizer: {data}/train_stream.npy not found (rebuild with `sdbench build-tokenizer`)"
            )
        tok = load_tokenizer(tokenizer_dir)
        self.bos = tok.token_to_id(BOS_TOKEN)
        self.eos = tok.token_to_id(EOS_TOKEN)
        self.pad = tok.token_to_id(PAD_TOKEN)
        self.vocab_size = tok.get_vocab_size()
        self.seq_len = seq_len
        self.stream = np.load(data / "train_stream.npy").astype(np.int64)
        self.heldout_stream = np.load(data / "heldout_stream.npy").astype(np.int64)
        self.edits = self._load_edits(data, "train")
        self.heldout_edits = self._load_edits(data, "heldout")
        if len(self.stream) <= seq_len + 1:
            raise ValueError("train corpus is shorter than one sequence")
        self.rng = np.random.default_rng(seed)

    def _load_edits(self, data: Path, split: str) -> list[tuple[list[int], int]]:
        """``(ids, prompt_len)`` per example; examples longer than a sequence are dropped."""
        import numpy as np

        flat = np.load(data / f"{split}_edits.npy").tolist()
        offsets = np.load(data / f"{split}_edit_offsets.npy").tolist()
        plens = np.load(data / f"{split}_edit_prompt_lens.npy").tolist()
        out = []
        for i, plen in enumerate(plens):
            ids = flat[offsets[i] : offsets[i + 1]]
            if len(ids) <= self.seq_len + 1:
                out.append((ids, plen))
        return out

    def batch(self, batch_size: int, edit_fraction: float):  # -> np.ndarray [B, seq_len + 1]
        """One batch of token rows of length ``seq_len + 1`` (inputs and shifted targets)."""
        import numpy as np

        n = self.seq_len + 1
        rows = np.empty((batch_size, n), dtype=np.int64)
        for i in range(batch_size):
            if self.edits and self.rng.random() < edit_fraction:
                row: list[int] = []
                while len(row) < n:
                    row.extend(self.edits[int(self.rng.integers(len(self.edits)))][0])
                rows[i] = row[:n]
            else:
                start = int(self.rng.integers(len(self.stream) - n))
                rows[i] = self.stream[start : start + n]
        return rows


def _set_determinism(seed: int, threads: int) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def _lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio * lr``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX tiles).

    Without it bf16 autocast emulates bf16 and a training step of the small models costs
    2-2.5x a float32 step (measured on an Intel Xeon without AVX512-BF16); with it (e.g. AMD
    EPYC Zen 4) bf16 halves the step.
    """
    import torch

    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in checks)


def resolve_precision(precision: str) -> str:
    """``auto`` -> ``bfloat16`` where :func:`native_bf16`, else ``float32``; others unchanged."""
    if precision == "auto":
        return "bfloat16" if native_bf16() else "float32"
    return precision


CXX_COMPILERS = ("g++", "c++", "clang++")


def resolve_compile(compile: str) -> str:
    """``auto`` -> ``on`` where a C++ compiler for inductor's CPU kernels is on PATH, else ``off``.

    ``on`` without one raises ``ValueError`` before training (inductor would fail at the first step).
    """
    found = any(shutil.which(cxx) for cxx in CXX_COMPILERS)
    if compile == "auto":
        return "on" if found else "off"
    if compile == "on" and not found:
        raise ValueError(f"--compile on: no C++ compiler ({', '.join(CXX_COMPILERS)}) on PATH; use auto or off")
    return compile


def compiled_step_loss(loss_fn, compile: str):
    """``loss_fn`` under ``torch.compile`` for ``compile == "on"``, else unchanged.

    Inductor compiles with one compile thread (no worker pool spinning beside the other
    training job); its Python side counts in ``process_time``, the C++ compiler's runs in
    :func:`children_cpu_seconds`. The generated kernels are the same on a rerun, cold or warm
    cache, so reruns stay bit-identical.
    """
    if compile != "on":
        return loss_fn
    import torch
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1
    return torch.compile(loss_fn, dynamic=False)


def children_cpu_seconds() -> float:
    """CPU seconds of this process's finished child processes (inductor's compiler runs)."""
    times = os.times()
    return round(times.children_user + times.children_system, 2)


def _autocast(precision: str = "bfloat16"):
    """bf16 autocast for ``precision == "bfloat16"``; a no-op context for ``float32``."""
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16")


def heldout_cross_entropy(model, stream, seq_len: int, max_tokens: int, precision: str = "bfloat16") -> float:
    """Mean next-token cross-entropy (nats) over non-overlapping held-out windows.

    Windows are spread evenly over the whole held-out stream, up to
    ``max_tokens`` predicted tokens, so the estimate covers every file region.
    """
    import numpy as np
    import torch
    import torch.nn.functional as F

    n = seq_len + 1
    total_windows = (len(stream) - 1) // seq_len
    k = max(1, min(total_windows, max_tokens // seq_len))
    starts = np.linspace(0, (total_windows - 1) * seq_len, k).astype(np.int64)
    losses = []
    with torch.no_grad(), _autocast(precision):
        for chunk in range(0, k, 8):
            rows = torch.from_numpy(np.stack([stream[s : s + n] for s in starts[chunk : chunk + 8]]))
            logits = model(input_ids=rows[:, :-1]).logits.float()
            losses.append(
                F.cross_entropy(
                    logits.reshape(-1, logits.size(-1)), rows[:, 1:].reshape(-1), reduction="sum"
                ).item()
            )
    return sum(losses) / (k * seq_len)


def completion_cross_entropy(
    model, examples: Sequence[tuple[list[int], int]], limit: int, precision: str = "bfloat16"
) -> float:
    """Mean cross-entropy (nats) of held-out edit completions given their prompts.

    Low values mean the model copies the prompt's code into the completion.
    """
    import torch
    import torch.nn.functional as F

    total, count = 0.0, 0
    with torch.no_grad(), _autocast(precision):
        for ids, plen in examples[:limit]:
            x = torch.tensor([ids])
            logits = model(input_ids=x[:, :-1]).logits.float()[0, plen - 1 :]
            total += F.cross_entropy(logits, x[0, plen:], reduction="sum").item()
            count += len(ids) - plen
    return total / max(1, count)


def train_model(
    tokenizer_dir: str | os.PathLike[str], output: str | os.PathLike[str], cfg: TrainConfig, log=print
) -> dict[str, Any]:
    """Train a Llama model on the corpus and save a Hugging Face model directory.

    ``output`` receives ``config.json``, ``generation_config.json``,
    ``model.safetensors`` (float32), the tokenizer files copied from
    ``tokenizer_dir`` and ``training.json`` (hyper-parameters, wall time,
    losses, parameter count). Returns the ``training.json`` dict.
    """
    cfg.validate()
    tokenizer_dir = Path(tokenizer_dir)
    for name in TOKENIZER_FILES:
        if not (tokenizer_dir / name).is_file():
            raise FileNotFoundError(
                f"--tokenizer: {tokenizer_dir / name} not found (run `sdbench build-tokenizer` first)"
            )
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    _set_determinism(cfg.seed, cfg.threads)
    t0 = time.perf_counter()
    data = TrainingData(tokenizer_dir, cfg.seq_len, cfg.seed)
    t_data = time.perf_counter() - t0
    config = llama_config(cfg, data.vocab_size, data.bos, data.eos, data.pad)
    precision = resolve_precision(cfg.precision)
    compile_mode = resolve_compile(cfg.compile)
    # Plain matmul + softmax attention: at these shapes on CPU (bf16 autocast) a training step
    # costs 15-20% less than with SDPA's flash kernel. Same math; not saved in config.json.
    config._attn_implementation = TRAIN_ATTENTION
    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(config).float()
    init_induction_circuit(model, cfg.induction_init, cfg.seed)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        foreach=False,  # one code path regardless of build: keeps reruns bit-identical
    )
    n_params = sum(p.numel() for p in model.parameters())
    log(
        f"train-model: {n_params} parameters, {len(data.stream)} train tokens, {len(data.edits)} edit examples, data {t_data:.1f}s"
    )
    t1, c1 = time.perf_counter(), time.process_time()
    def batch_loss(inputs, labels):
        with _autocast(precision):
            logits = model(input_ids=inputs).logits
        return F.cross_entropy(logits.float().reshape(-1, data.vocab_size), labels.reshape(-1))

    step_loss = compiled_step_loss(batch_loss, compile_mode)
    losses: list[float] = []
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, cfg)
        rows = torch.from_numpy(data.batch(cfg.batch_size, cfg.edit_fraction))
        loss = step_loss(rows[:, :-1], rows[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip, foreach=False)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if (step + 1) % max(1, cfg.steps // 10) == 0 or step + 1 == cfg.steps:
            recent = losses[-max(1, cfg.steps // 10) :]
            log(
                f"  step {step + 1}/{cfg.steps} loss {sum(recent) / len(recent):.3f} ({time.perf_counter() - t1:.0f}s)"
            )
    train_seconds, train_cpu = time.perf_counter() - t1, time.process_time() - c1
    model.eval()
    heldout_ce = heldout_cross_entropy(model, data.heldout_stream, cfg.seq_len, cfg.eval_tokens, precision)
    edit_ce = completion_cross_entropy(model, data.heldout_edits, cfg.eval_edit_examples, precision)
    tail = losses[-max(1, min(100, cfg.steps // 10)) :]
    info = {
        "config": asdict(cfg),
        "precision": precision,  # what cfg.precision resolved to on this CPU
        "compile": compile_mode,  # what cfg.compile resolved to here
        "parameters": n_params,
        "shapes": {name: list(p.shape) for name, p in model.state_dict().items()},
        "vocab_size": data.vocab_size,
        "train_tokens_seen": cfg.steps * cfg.batch_size * cfg.seq_len,
        "train_stream_tokens": int(len(data.stream)),
        "train_edit_examples": len(data.edits),
        "final_train_loss": round(sum(tail) / len(tail), 4),
        "heldout_cross_entropy": round(heldout_ce, 4),
        "heldout_edit_completion_cross_entropy": round(edit_ce, 4),
        "wall_seconds": {
            "data": round(t_data, 2),
            "train": round(train_seconds, 2),
            "total": round(time.perf_counter() - t0, 2),
        },
        # CPU time of all threads of this process (the process total includes imports), and of
        # its finished children (the C++ compiler's runs when the step is compiled).
        "cpu_seconds": {"train": round(train_cpu, 2), "process": round(time.process_time(), 2), "children": children_cpu_seconds()},
        "seconds_per_step": round(train_seconds / cfg.steps, 4),
        "tokenizer_sha256": hashlib.sha256((tokenizer_dir / "tokenizer.json").read_bytes()).hexdigest(),
        "tokenizer_info": read_json(tokenizer_dir / "tokenizer_info.json"),
        "versions": _versions(),
    }
    log(
        f"train-model: held-out CE {heldout_ce:.3f}, edit-completion CE {edit_ce:.3f}, train {train_seconds:.0f}s ({train_cpu:.0f} CPU s)"
    )
    with atomic_dir(output) as tmp:
        model.save_pretrained(tmp)
        for name in TOKENIZER_FILES:
            shutil.copyfile(tokenizer_dir / name, tmp / name)
        write_json(tmp / "training.json", info)
    return info


def _versions() -> dict[str, str]:
    import tokenizers
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }


def _keep_freed_memory() -> None:
    """Have glibc keep freed heap memory instead of handing it back to the OS after every step.

    Otherwise a training step's large tensors (MBs each) are, in some runs, re-mapped and
    page-faulted in every step (~18k faults/step for the target, up to a fifth of its CPU time).
    Process-wide, so only the CLI sets it; a no-op without glibc. Results are unchanged.
    """
    import ctypes

    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(m_mmap_threshold, 32 << 20)  # glibc's maximum
        libc.mallopt(m_trim_threshold, 1 << 30)
    except (OSError, AttributeError):
        pass


def _cmd_train_model(args: argparse.Namespace) -> int:
    fields = TrainConfig.__dataclass_fields__
    cfg = TrainConfig(**{name: getattr(args, name) for name in fields})
    _keep_freed_memory()
    # A bad option or input (ValueError / FileNotFoundError) becomes one `error:` line in sdbench.cli.main.
    train_model(args.tokenizer, args.output, cfg, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    return 0
