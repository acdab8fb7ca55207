"""Hyper-parameters of one small-model training run (:class:`TrainConfig`), one ``sdbench
train-model`` option each; standard library only, so the CLI reads the options and defaults here.
"""

from __future__ import annotations

from dataclasses import dataclass

INDUCTION_INITS = ("none", "unigram", "bigram")
# Matmul precision while training: auto = bf16 autocast where the CPU multiplies bf16 natively
# (AVX512-BF16 / AMX), float32 elsewhere (emulated bf16 is 2-2.5x slower than float32 there).
PRECISIONS = ("auto", "float32", "bfloat16")
# Training step compiled with torch.compile (inductor's C++ CPU kernels): auto = on where a C++
# compiler is found. Fusing the small models' elementwise work makes a step 1.7x cheaper here.
COMPILES = ("auto", "on", "off")


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one model training run (recorded in ``training.json``)."""

    layers: int = 2
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 4
    intermediate: int = 384
    steps: int = 3000
    batch_size: int = 4
    seq_len: int = 512
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    edit_fraction: float = 0.5
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    induction_init: str = "none"
    seed: int = 0
    threads: int = 1
    eval_tokens: int = 65536
    eval_edit_examples: int = 64
    precision: str = "auto"
    compile: str = "auto"

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid option."""
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.compile not in COMPILES:
            raise ValueError(f"--compile must be one of {COMPILES}, got {self.compile!r}")
        positive = (
            "layers",
            "hidden",
            "heads",
            "kv_heads",
            "intermediate",
            "steps",
            "batch_size",
            "seq_len",
            "threads",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise ValueError(f"--hidden ({self.hidden}) must be divisible by --heads ({self.heads})")
        if (self.hidden // self.heads) % 2:
            raise ValueError(
                f"--hidden / --heads (head dim {self.hidden // self.heads}) must be even for RoPE"
            )
        if self.heads % self.kv_heads:
            raise ValueError(f"--heads ({self.heads}) must be divisible by --kv-heads ({self.kv_heads})")
        if not 0.0 <= self.edit_fraction <= 1.0:
            raise ValueError(f"--edit-fraction must be in [0, 1], got {self.edit_fraction}")
        if self.lr <= 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if self.induction_init not in INDUCTION_INITS:
            raise ValueError(
                f"--induction-init must be one of {INDUCTION_INITS}, got {self.induction_init!r}"
            )
        if self.induction_init != "none":
            if not (
                self.layers >= 2
                and 2 <= self.heads <= 4
                and self.kv_heads == self.heads
                and self.hidden % 16 == 0
            ):
                raise ValueError(
                    "--induction-init needs --layers >= 2, 2 <= --heads <= 4, --kv-heads == --heads "
                    "and --hidden divisible by 16 "
                    f"(got layers={self.layers}, heads={self.heads}, kv_heads={self.kv_heads}, hidden={self.hidden}); "
                    "use --induction-init none otherwise"
                )
        if self.max_position_embeddings < self.seq_len:
            raise ValueError(
                f"--max-position-embeddings ({self.max_position_embeddings}) must be >= --seq-len ({self.seq_len})"
            )


# Help of the options that need one (``sdbench train-model --help``).
OPTION_HELP = {
    "edit_fraction": "share of training rows made of packed code-edit examples",
    "induction_init": f"hand-initialized copy circuit: one of {', '.join(INDUCTION_INITS)}",
    "rope_theta": "RoPE base (large: more position-invariant dims for content matching)",
    "max_position_embeddings": "positions the model (and vLLM's max_model_len) accepts",
    "threads": "torch threads; the same count gives bit-identical weights on a rerun "
    "(1 is cheapest: a second thread barely shortens a step of these small models and spins when the cores are shared)",
    "eval_tokens": "held-out tokens scored for training.json",
    "eval_edit_examples": "held-out edit examples scored for training.json",
    "precision": "matmul precision: auto = bf16 autocast where the CPU has native bf16 (AVX512-BF16/AMX), else float32",
    "compile": "torch.compile the training step: auto = on where a C++ compiler is found (changes the weights; reruns stay bit-identical)",
}
