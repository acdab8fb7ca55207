"""Small models the pipeline builds itself: BPE tokenizer and Llama target/draft.

Everything is offline and deterministic: the corpus is the interpreter's
standard library (:mod:`sdbench.corpus`), the tokenizer is a byte-level BPE,
and the models are ``transformers`` Llama models trained on CPU with fixed
seeds and deterministic kernels, so the same thread count gives bit-identical
``model.safetensors`` on a rerun. Output directories are Hugging Face model
directories that ``transformers`` and vLLM load directly; target and draft
built from the same tokenizer directory share the vocabulary, as
draft-model speculative decoding requires.

Heavy imports (torch, transformers, tokenizers) are deferred to the functions
that need them so that ``sdbench --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sdbench import corpus

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)  # ids 0, 1, 2

# The files a tokenizer directory must contain (also copied into model dirs).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


# ----------------------------------------------------------------------------
# Atomic directories
# ----------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``path``; move it onto ``path`` on success.

    An existing ``path`` is replaced only once the new content is complete;
    on any exception the temporary directory is removed and ``path`` is untouched.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        yield tmp
        # mkdtemp makes the directory 0700 and some writers make files 0600.
        for sub in [tmp, *tmp.rglob("*")]:
            os.chmod(sub, 0o755 if sub.is_dir() else 0o644)
        if final.exists():
            # os.replace cannot overwrite a non-empty directory: swap via a side name.
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old", dir=final.parent))
            os.replace(final, old / "x")
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------


def build_tokenizer(
    output: str | os.PathLike[str],
    vocab_size: int = 2048,
    seed: int = 0,
    edit_max_chars: int = 700,
    edits_per_function: int = 2,
    corpus_root: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Train a byte-level BPE on the corpus train split; save a Hugging Face fast tokenizer.

    Writes ``tokenizer.json``, ``tokenizer_config.json``,
    ``special_tokens_map.json`` and ``tokenizer_info.json`` to ``output``.
    Special tokens: ``<|bos|>`` (0, prepended to every encoded text),
    ``<|eos|>`` (1) and ``<|pad|>`` (2). Also writes the tokenized training
    data under ``output/data`` (see :func:`prepare_training_data`) so that
    every model trained with this tokenizer shares it without re-tokenizing;
    ``seed`` seeds the synthetic edit examples (BPE training itself is
    deterministic). ``corpus_root`` replaces the stdlib directory (tests use a
    small package). Returns the info dict.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(
            f"--vocab-size must be >= {256 + len(SPECIAL_TOKENS)} (byte alphabet + specials), got {vocab_size}"
        )
    start = time.perf_counter()
    root = Path(corpus_root) if corpus_root is not None else None
    texts = [text for _, text in corpus.corpus_texts("train", root)]
    if not texts:
        raise ValueError(f"corpus root {root or corpus.stdlib_root()} has no train files")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    bos_id = tok.token_to_id(BOS_TOKEN)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=[(BOS_TOKEN, bos_id)]
    )
    n_chars = sum(len(t) for t in texts)
    with atomic_dir(output) as tmp:
        counts = prepare_training_data(tok, tmp / DATA_DIR, seed, edit_max_chars, edits_per_function, root)
        n_tokens = counts["train_stream_tokens"] - 2 * len(texts)  # minus bos/eos per file
        info = {
            "vocab_size": tok.get_vocab_size(),
            "requested_vocab_size": vocab_size,
            "seed": seed,
            "special_tokens": {"bos": BOS_TOKEN, "eos": EOS_TOKEN, "pad": PAD_TOKEN},
            "special_token_ids": {
                name: tok.token_to_id(t) for name, t in zip(("bos", "eos", "pad"), SPECIAL_TOKENS)
            },
            "train_files": len(texts),
            "train_chars": n_chars,
            "train_tokens": n_tokens,
            "chars_per_token": round(n_chars / n_tokens, 4),
            "corpus_root": str(root or corpus.stdlib_root()),
            "corpus_train_sha256": corpus.corpus_fingerprint("train", root),
            "python_version": platform.python_version(),
            "edit_max_chars": edit_max_chars,
            "edits_per_function": edits_per_function,
            "data": counts,
            "wall_seconds": round(time.perf_counter() - start, 2),
        }
        tok.save(str(tmp / "tokenizer.json"))
        _write_json(tmp / "tokenizer_config.json", _tokenizer_config())
        _write_json(
            tmp / "special_tokens_map.json",
            {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN},
        )
        _write_json(tmp / "tokenizer_info.json", info)
    return info


def _tokenizer_config() -> dict[str, Any]:
    """A minimal, version-independent ``tokenizer_config.json`` for AutoTokenizer/vLLM."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000,
    }


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def load_tokenizer(directory: str | os.PathLike[str]):  # -> tokenizers.Tokenizer
    """Load ``directory/tokenizer.json`` with the ``tokenizers`` library (no transformers import)."""
    from tokenizers import Tokenizer

    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"--tokenizer: {path} not found (run `sdbench build-tokenizer` first)")
    return Tokenizer.from_file(str(path))


# ----------------------------------------------------------------------------
# Training data
# ----------------------------------------------------------------------------


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

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid option."""
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


DATA_DIR = "data"  # tokenized corpus and edit examples, inside the tokenizer directory

TRAIN_ATTENTION = "eager"  # transformers attention implementation used while training


def prepare_training_data(
    tok,
    output_dir: Path,
    edit_seed: int,
    edit_max_chars: int,
    edits_per_function: int,
    root: Path | None = None,
) -> dict[str, int]:
    """Tokenize the corpus splits and the edit examples once; save them as ``.npy`` under ``output_dir``.

    Files: ``{split}_stream.npy`` (each file wrapped in bos/eos, concatenated),
    ``{split}_edits.npy`` (each example ``bos prompt completion eos``,
    concatenated), ``{split}_edit_offsets.npy`` (start of each example plus
    the total length) and ``{split}_edit_prompt_lens.npy`` (bos + prompt
    tokens). ``np.save`` output is byte-stable, unlike ``.npz``. Returns counts.
    """
    import numpy as np

    bos, eos = tok.token_to_id(BOS_TOKEN), tok.token_to_id(EOS_TOKEN)
    output_dir.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for split in corpus.SPLITS:
        texts = [text for _, text in corpus.corpus_texts(split, root)]  # type: ignore[arg-type]
        if not texts:
            raise ValueError(f"corpus split {split!r} is empty (corpus root {root or corpus.stdlib_root()})")
        stream = np.concatenate(
            [
                np.asarray([bos, *e.ids, eos], dtype=np.int32)
                for e in tok.encode_batch(texts, add_special_tokens=False)
            ]
        )
        examples = corpus.edit_examples(split, edit_seed, edits_per_function, max_chars=edit_max_chars, root=root)  # type: ignore[arg-type]
        prompts = tok.encode_batch([e.prompt for e in examples], add_special_tokens=False)
        completions = tok.encode_batch([e.completion for e in examples], add_special_tokens=False)
        rows = [[bos, *p.ids, *c.ids, eos] for p, c in zip(prompts, completions)]
        offsets = np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)
        np.save(output_dir / f"{split}_stream.npy", stream)
        np.save(output_dir / f"{split}_edits.npy", np.asarray([t for r in rows for t in r], dtype=np.int32))
        np.save(output_dir / f"{split}_edit_offsets.npy", offsets)
        np.save(
            output_dir / f"{split}_edit_prompt_lens.npy",
            np.asarray([1 + len(p.ids) for p in prompts], dtype=np.int32),
        )
        counts[f"{split}_stream_tokens"] = int(len(stream))
        counts[f"{split}_edit_examples"] = len(rows)
        counts[f"{split}_edit_tokens"] = int(offsets[-1])
    return counts


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


# ----------------------------------------------------------------------------
# Model training
# ----------------------------------------------------------------------------


def _set_determinism(seed: int, threads: int) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


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


INDUCTION_INITS = ("none", "unigram", "bigram")


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


def _lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio * lr``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _autocast():
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16)


def heldout_cross_entropy(model, stream, seq_len: int, max_tokens: int) -> float:
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
    with torch.no_grad(), _autocast():
        for chunk in range(0, k, 8):
            rows = torch.from_numpy(np.stack([stream[s : s + n] for s in starts[chunk : chunk + 8]]))
            logits = model(input_ids=rows[:, :-1]).logits.float()
            losses.append(
                F.cross_entropy(
                    logits.reshape(-1, logits.size(-1)), rows[:, 1:].reshape(-1), reduction="sum"
                ).item()
            )
    return sum(losses) / (k * seq_len)


def completion_cross_entropy(model, examples: Sequence[tuple[list[int], int]], limit: int) -> float:
    """Mean cross-entropy (nats) of held-out edit completions given their prompts.

    Low values mean the model copies the prompt's code into the completion.
    """
    import torch
    import torch.nn.functional as F

    total, count = 0.0, 0
    with torch.no_grad(), _autocast():
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
    losses: list[float] = []
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, cfg)
        rows = torch.from_numpy(data.batch(cfg.batch_size, cfg.edit_fraction))
        with _autocast():
            logits = model(input_ids=rows[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, data.vocab_size), rows[:, 1:].reshape(-1))
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
    heldout_ce = heldout_cross_entropy(model, data.heldout_stream, cfg.seq_len, cfg.eval_tokens)
    edit_ce = completion_cross_entropy(model, data.heldout_edits, cfg.eval_edit_examples)
    tail = losses[-max(1, min(100, cfg.steps // 10)) :]
    info = {
        "config": asdict(cfg),
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
        # CPU time of all threads of this process (the process total includes imports).
        "cpu_seconds": {"train": round(train_cpu, 2), "process": round(time.process_time(), 2)},
        "seconds_per_step": round(train_seconds / cfg.steps, 4),
        "tokenizer_sha256": hashlib.sha256((tokenizer_dir / "tokenizer.json").read_bytes()).hexdigest(),
        "tokenizer_info": _read_json(tokenizer_dir / "tokenizer_info.json"),
        "versions": _versions(),
    }
    log(
        f"train-model: held-out CE {heldout_ce:.3f}, edit-completion CE {edit_ce:.3f}, train {train_seconds:.0f}s ({train_cpu:.0f} CPU s)"
    )
    with atomic_dir(output) as tmp:
        model.save_pretrained(tmp)
        for name in TOKENIZER_FILES:
            shutil.copyfile(tokenizer_dir / name, tmp / name)
        _write_json(tmp / "training.json", info)
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


# ----------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------


def _cmd_build_tokenizer(args: argparse.Namespace) -> int:
    # ValueError / FileNotFoundError (bad option or input) become one `error:` line in sdbench.cli.main.
    info = build_tokenizer(
        args.output,
        args.vocab_size,
        args.seed,
        args.edit_max_chars,
        args.edits_per_function,
        args.corpus_root,
    )
    print(
        f"build-tokenizer: vocab {info['vocab_size']}, {info['chars_per_token']} chars/token, {info['wall_seconds']}s -> {args.output}"
    )
    return 0


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


_OPTION_HELP = {
    "edit_fraction": "share of training rows made of packed code-edit examples",
    "induction_init": f"hand-initialized copy circuit: one of {', '.join(INDUCTION_INITS)}",
    "rope_theta": "RoPE base (large: more position-invariant dims for content matching)",
    "max_position_embeddings": "positions the model (and vLLM's max_model_len) accepts",
    "threads": "torch threads; the same count gives bit-identical weights on a rerun "
    "(1 is cheapest: a second thread barely shortens a step of these small models and spins when the cores are shared)",
    "eval_tokens": "held-out tokens scored for training.json",
    "eval_edit_examples": "held-out edit examples scored for training.json",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``build-tokenizer`` and ``train-model`` subcommands."""
    p = subparsers.add_parser(
        "build-tokenizer", help="train the byte-level BPE tokenizer on the stdlib corpus"
    )
    p.add_argument("--output", required=True, help="tokenizer directory to write")
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the synthetic edit examples (BPE itself is deterministic)",
    )
    p.add_argument(
        "--edit-max-chars", type=int, default=700, help="longest function (characters) used for edit examples"
    )
    p.add_argument(
        "--edits-per-function", type=int, default=2, help="edit examples drawn per train/held-out function"
    )
    p.add_argument(
        "--corpus-root", default=None, help="directory of .py files instead of the interpreter's stdlib"
    )
    p.set_defaults(func=_cmd_build_tokenizer)

    d = TrainConfig()
    p = subparsers.add_parser("train-model", help="train a small Llama model (target or draft) on CPU")
    p.add_argument("--tokenizer", required=True, help="directory written by build-tokenizer")
    p.add_argument("--output", required=True, help="Hugging Face model directory to write")
    for name in TrainConfig.__dataclass_fields__:
        default = getattr(d, name)
        p.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            type=type(default),
            default=default,
            choices=INDUCTION_INITS if name == "induction_init" else None,
            help=f"{_OPTION_HELP.get(name, '')} (default {default})".lstrip(),
        )
    p.set_defaults(func=_cmd_train_model)
