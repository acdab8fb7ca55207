"""The byte-level BPE tokenizer of the small models, trained on the standard-library corpus
(:mod:`sdbench.datasets.corpus`), and the tokenized training data stored beside it.

Special tokens: ``<|bos|>`` (id 0, prepended to every encoded text), ``<|eos|>`` (1) and
``<|pad|>`` (2). A tokenizer directory holds :data:`TOKENIZER_FILES` (a Hugging Face fast
tokenizer that ``transformers`` and vLLM load) and ``data/`` (:func:`prepare_training_data`), so
every model trained with it shares the same tokenized corpus.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from sdbench.datasets import corpus
from sdbench.io import atomic_dir

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)  # ids 0, 1, 2

# The files a tokenizer directory must contain (also copied into model dirs).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
DATA_DIR = "data"  # tokenized corpus and edit examples, inside the tokenizer directory


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
        write_json(tmp / "tokenizer_config.json", _tokenizer_config())
        write_json(
            tmp / "special_tokens_map.json",
            {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN},
        )
        write_json(tmp / "tokenizer_info.json", info)
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


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def load_tokenizer(directory: str | os.PathLike[str]):  # -> tokenizers.Tokenizer
    """Load ``directory/tokenizer.json`` with the ``tokenizers`` library (no transformers import)."""
    from tokenizers import Tokenizer

    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"--tokenizer: {path} not found (run `sdbench build-tokenizer` first)")
    return Tokenizer.from_file(str(path))


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
