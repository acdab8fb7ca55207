"""Tokenizer and model building on a tiny corpus (the stdlib's wsgiref package), a few steps."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sdbench.datasets import corpus
from sdbench.models import architecture, tokenizer, training
from sdbench.models import cli as models_cli
from sdbench.models.trainconfig import TrainConfig

TINY = TrainConfig(
    layers=1,
    hidden=32,
    heads=2,
    kv_heads=1,
    intermediate=64,
    steps=5,
    batch_size=2,
    seq_len=64,
    warmup_steps=2,
    max_position_embeddings=128,
    threads=1,
    eval_tokens=256,
    eval_edit_examples=2,
)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    tokenizer.build_tokenizer(out, vocab_size=320, seed=0, corpus_root=corpus.stdlib_root() / "wsgiref")
    return out


@pytest.fixture(scope="module")
def model_dirs(tokenizer_dir, tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("models")
    for name in ("a", "b"):
        training.train_model(tokenizer_dir, base / name, TINY, log=lambda _msg: None)
    return base / "a", base / "b"


def test_tokenizer_files_and_round_trip(tokenizer_dir):
    from transformers import AutoTokenizer

    for name in (*tokenizer.TOKENIZER_FILES, "tokenizer_info.json", "data/train_stream.npy"):
        assert (tokenizer_dir / name).is_file(), name
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == tokenizer.SPECIAL_TOKENS
    assert len(tok) == 320
    text = "def f(x):\n\tif x:  # ünïcode ✓\n        return {'a': 1}\n"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == text
    # The tokenizers-only loader agrees with transformers.
    assert tokenizer.load_tokenizer(tokenizer_dir).encode(text).ids == ids


def test_tokenizer_build_is_deterministic(tokenizer_dir, tmp_path):
    again = tmp_path / "tok"
    tokenizer.build_tokenizer(again, vocab_size=320, seed=0, corpus_root=corpus.stdlib_root() / "wsgiref")
    for name in ("tokenizer.json", "data/train_stream.npy", "data/train_edits.npy", "data/heldout_edits.npy"):
        assert (again / name).read_bytes() == (tokenizer_dir / name).read_bytes(), name


@pytest.mark.slow  # trains
def test_training_is_bit_identical_and_loadable(model_dirs):
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    a, b = model_dirs
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    model = LlamaForCausalLM.from_pretrained(a)
    tok = AutoTokenizer.from_pretrained(a)
    assert model.config.tie_word_embeddings and model.config.eos_token_id == tok.eos_token_id
    assert next(model.parameters()).dtype == torch.float32
    out = model.generate(torch.tensor([tok("def f(")["input_ids"]]), max_new_tokens=3, do_sample=False)
    assert out.shape[1] >= 4
    info = json.loads((a / "training.json").read_text())
    assert info["config"]["steps"] == 5 and info["parameters"] == sum(p.numel() for p in model.parameters())
    assert info["heldout_cross_entropy"] > 0 and info["final_train_loss"] > 0
    assert 0 < info["cpu_seconds"]["train"] <= info["cpu_seconds"]["process"]


@pytest.mark.slow  # trains
def test_training_attention_is_not_saved(model_dirs):
    """Training runs eager attention for speed; the saved config leaves the choice to the loader."""
    config = json.loads((model_dirs[0] / "config.json").read_text())
    assert training.TRAIN_ATTENTION == "eager"
    assert not any("attn_implementation" in key for key in config)


def test_invalid_options_are_named(tokenizer_dir, tmp_path):
    with pytest.raises(ValueError, match="--hidden"):
        training.train_model(tokenizer_dir, tmp_path / "m", replace(TINY, hidden=33), log=lambda _m: None)
    with pytest.raises(ValueError, match="--hidden / --heads"):
        training.train_model(tokenizer_dir, tmp_path / "m", replace(TINY, hidden=30), log=lambda _m: None)
    with pytest.raises(ValueError, match="--induction-init"):
        bad = replace(TINY, induction_init="bigram")  # one layer: no room for the circuit
        training.train_model(tokenizer_dir, tmp_path / "m", bad, log=lambda _m: None)
    with pytest.raises(FileNotFoundError, match="--tokenizer"):
        training.train_model(tmp_path / "missing", tmp_path / "m", TINY, log=lambda _m: None)
    with pytest.raises(ValueError, match="--precision"):
        training.train_model(tokenizer_dir, tmp_path / "m", replace(TINY, precision="fp8"), log=lambda _m: None)
    with pytest.raises(ValueError, match="--compile must be one of"):
        training.train_model(tokenizer_dir, tmp_path / "m", replace(TINY, compile="yes"), log=lambda _m: None)
    assert not (tmp_path / "m").exists()


@pytest.mark.slow  # trains
def test_compile_auto_follows_the_compiler_and_is_recorded(model_dirs, tokenizer_dir, tmp_path, monkeypatch):
    """auto compiles the step where a C++ compiler exists; training.json says what ran, and an
    eager build of the same recipe is a valid model too (its weights differ in the last bits)."""
    info = json.loads((model_dirs[0] / "training.json").read_text())
    assert info["compile"] == training.resolve_compile("auto") and info["config"]["compile"] == "auto"
    assert info["cpu_seconds"]["children"] >= 0
    eager = training.train_model(tokenizer_dir, tmp_path / "m", replace(TINY, compile="off"), log=lambda _m: None)
    assert eager["compile"] == "off" and abs(eager["heldout_cross_entropy"] - info["heldout_cross_entropy"]) < 0.05
    monkeypatch.setattr(training.shutil, "which", lambda _name: None)
    assert training.resolve_compile("auto") == "off" and training.resolve_compile("off") == "off"
    with pytest.raises(ValueError, match="--compile on: no C\\+\\+ compiler"):
        training.resolve_compile("on")


@pytest.mark.slow  # trains
def test_precision_auto_uses_bf16_only_where_the_cpu_has_it(model_dirs, tokenizer_dir, tmp_path):
    """Emulated bf16 is slower than float32: auto picks bf16 only on native bf16 CPUs, and says which."""
    native = training.native_bf16()
    assert training.resolve_precision("auto") == ("bfloat16" if native else "float32")
    assert training.resolve_precision("float32") == "float32"
    info = json.loads((model_dirs[0] / "training.json").read_text())
    assert info["precision"] == training.resolve_precision("auto") and info["config"]["precision"] == "auto"
    forced = "float32" if native else "bfloat16"
    other = training.train_model(tokenizer_dir, tmp_path / "m", replace(TINY, precision=forced), log=lambda _m: None)
    assert other["precision"] == forced and other["heldout_cross_entropy"] > 0


def test_cli_registers_both_commands():
    import argparse

    parser = argparse.ArgumentParser()
    models_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        "train-model --tokenizer t --output o --layers 3 --hidden 128 --heads 2 --kv-heads 2 --intermediate 384 "
        "--steps 3000 --batch-size 4 --seq-len 512 --lr 3e-3 --seed 0 --threads 2 --edit-fraction 0.25".split()
    )
    assert (args.layers, args.kv_heads, args.lr, args.edit_fraction) == (3, 2, 3e-3, 0.25)
    args = parser.parse_args("build-tokenizer --output t --vocab-size 2048 --seed 0".split())
    assert args.vocab_size == 2048


@pytest.mark.parametrize("kind", ["unigram", "bigram"])
def test_induction_init_copies_before_training(kind):
    """The hand-initialized circuit already predicts the repeat of a random token sequence."""
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = TrainConfig(layers=3, heads=2, kv_heads=2, rope_theta=1e6, induction_init=kind)
    model = LlamaForCausalLM(architecture.llama_config(cfg, 2048, 0, 1, 2))
    architecture.init_induction_circuit(model, kind, seed=0)
    tokens = torch.randint(3, 2048, (2, 100), generator=torch.Generator().manual_seed(1))
    seq = torch.cat([torch.zeros(2, 1, dtype=torch.long), tokens, tokens], dim=1)
    with torch.no_grad():
        logits = model(seq).logits
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, 2048), seq[:, 1:].reshape(-1), reduction="none").view(
        2, -1
    )
    assert ce[:, 101:].mean() < 2.5 < 7.0 < ce[:, :100].mean()
