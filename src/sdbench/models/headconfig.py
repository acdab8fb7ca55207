"""Options of an EAGLE / EAGLE-3 head, MTP layer or Medusa heads training run (``sdbench train-head``).

Standard library only: the command's parser (:mod:`sdbench.models.cli`) reads these fields,
while the training itself (:mod:`sdbench.models.eagle`, :mod:`sdbench.models.medusa`) imports
torch. Keeping them apart also keeps a change to the head's training code from rerunning the
target's and draft's builds, whose steps digest the models parser.
"""

from __future__ import annotations

from dataclasses import dataclass

from sdbench.models.trainconfig import COMPILES, PRECISIONS

# Kinds built around one decoder layer (sdbench.models.eagle), then all kinds: Medusa-1 heads
# (sdbench.models.medusa) are residual blocks over the target's last hidden state.
EAGLE_KINDS = ("eagle", "eagle3", "mtp")
KINDS = (*EAGLE_KINDS, "medusa")


@dataclass(frozen=True)
class HeadConfig:
    """Hyper-parameters of one head training run (recorded in ``training.json``)."""

    kind: str = "eagle"
    steps: int = 550
    batch_size: int = 4
    seq_len: int = 256
    lr: float = 6e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    edit_fraction: float = 0.5
    ttt_steps: int = 2  # chain depth trained on the head's own outputs
    step_decay: float = 0.8  # loss weight of chain step j: step_decay ** (j - 1) (Medusa: of head j)
    feature_weight: float = 1.0  # EAGLE-1 feature regression (token loss weight is 1; unused by eagle3/mtp)
    aux_layers: tuple[int, ...] = (1, 2, 3)  # EAGLE-3: residual stream entering these target layers
    num_heads: int = 3  # Medusa: heads (head j = 1, 2, ... drafts token t+1+j); vLLM runs the first k
    seed: int = 0
    threads: int = 1
    eval_windows: int = 16
    precision: str = "auto"  # as train-model's (sdbench.models.trainconfig.PRECISIONS)
    compile: str = "auto"  # as train-model's (COMPILES): the head's loss under torch.compile

    def validate(self, num_target_layers: int | None = None) -> None:
        """Raise ``ValueError`` naming the first invalid option."""
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.compile not in COMPILES:
            raise ValueError(f"--compile must be one of {COMPILES}, got {self.compile!r}")
        if self.kind not in KINDS:
            raise ValueError(f"--kind must be one of {KINDS}, got {self.kind!r}")
        for name in ("steps", "batch_size", "seq_len", "ttt_steps", "threads", "eval_windows", "num_heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if not 0.0 <= self.edit_fraction <= 1.0:
            raise ValueError(f"--edit-fraction must be in [0, 1], got {self.edit_fraction}")
        for name in ("feature_weight", "step_decay", "weight_decay"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.kind == "eagle3":
            ids = self.aux_layers
            if len(ids) != len(set(ids)) or list(ids) != sorted(ids):
                raise ValueError(f"--aux-layers must be distinct and ascending (vLLM sorts them), got {list(ids)}")
            if num_target_layers is not None and not all(0 <= i <= num_target_layers for i in ids):
                raise ValueError(
                    f"--aux-layers {list(ids)}: ids must lie in 0..{num_target_layers} (the target has {num_target_layers} layers)"
                )
