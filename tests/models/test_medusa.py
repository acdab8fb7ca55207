"""Medusa heads (train-head --kind medusa): the layout vLLM's Medusa loads, the training targets,
refusals, and (slow) the real CPU engine drafting with trained heads, equal to greedy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from sdbench.errors import ConfigError
from sdbench.models import medusa, medusaformat
from sdbench.models.headconfig import HeadConfig

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TARGET = {  # a small Llama target's config.json (as train-model writes it)
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 96,
    "dtype": "float32",
    "tie_word_embeddings": True,
}


def _random_heads(num_heads: int = 3) -> tuple[dict, dict]:
    """(config, state) of heads with random blocks and LM heads (zero blocks would hide the math)."""
    config = medusaformat.medusa_config(TARGET, num_heads)
    gen = torch.Generator().manual_seed(0)
    heads = medusa.MedusaHeads(config, torch.randn(TARGET["vocab_size"], TARGET["hidden_size"], generator=gen))
    state = {k: torch.randn(v.shape, generator=gen) * 0.3 for k, v in heads.params.items()}
    return config, state


def _write(directory: Path, config: dict, state: dict) -> Path:
    directory.mkdir(parents=True)
    medusa.write_heads(directory, config, {k: v.contiguous() for k, v in state.items()})
    return directory


def _vllm_medusa(directory: Path, k: int, monkeypatch: pytest.MonkeyPatch):
    """vLLM's own Medusa module for ``directory`` at ``num_speculative_tokens = k``, its config read
    by vLLM's MedusaConfig. Only ParallelLMHead is replaced (it needs a tensor-parallel group): a
    plain module with the same ``weight`` parameter, so parameter names come from vLLM's classes."""
    from support.require import import_or_fail

    models = import_or_fail("vllm.model_executor.models.medusa")
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.transformers_utils.configs.medusa import MedusaConfig

    class LMHead(torch.nn.Module):
        def __init__(self, num_embeddings: int, embedding_dim: int, prefix: str = "") -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(num_embeddings, embedding_dim))

    monkeypatch.setattr(models, "ParallelLMHead", LMHead)
    hf_config = MedusaConfig.from_pretrained(str(directory))
    hf_config.num_lookahead_tokens = k  # what SpeculativeConfig does with num_speculative_tokens
    draft = type("DraftModelConfig", (), {"hf_config": hf_config})
    vllm_config = type("Config", (), {"speculative_config": type("Spec", (), {"draft_model_config": draft})})
    with set_current_vllm_config(VllmConfig()):
        return models.Medusa(vllm_config=vllm_config), hf_config


def test_the_written_heads_are_what_vllms_medusa_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.torch import load_file

    config, state = _random_heads(3)
    directory = _write(tmp_path / "heads", config, state)
    model, hf_config = _vllm_medusa(directory, 3, monkeypatch)
    assert (hf_config.num_heads, hf_config.num_hidden_layers, hf_config.hidden_size) == (3, 1, 32)
    assert hf_config.vocab_size == hf_config.truncated_vocab_size == 96
    assert hf_config.medusa_fc_bias is True and hf_config.original_lm_head is False
    assert hf_config.architectures == [medusaformat.ARCHITECTURE]

    from vllm.model_executor.models.registry import _SPECULATIVE_DECODING_MODELS

    assert _SPECULATIVE_DECODING_MODELS[medusaformat.ARCHITECTURE][1] == "Medusa"
    params = dict(model.named_parameters())
    assert {k: tuple(v.shape) for k, v in params.items()} == medusaformat.expected_tensors(config)
    weights = load_file(str(directory / "model.safetensors"))
    loaded = model.load_weights(weights.items())
    assert loaded == set(params) == set(weights)  # every parameter filled, no checkpoint key dropped
    for name, tensor in weights.items():
        torch.testing.assert_close(params[name].data, tensor)
    # The blocks compute what training optimizes (the logits are a plain matmul with lm_heads.<i>).
    hidden = torch.randn(5, 32)
    ours = medusa.MedusaHeads(config, weights["lm_heads.0.weight"])
    ours.params = weights
    with torch.no_grad():
        for theirs, mine in zip(model(hidden), ours.features(hidden), strict=True):
            torch.testing.assert_close(theirs, mine)


def test_vllm_runs_the_first_k_heads_and_cannot_run_more(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.torch import load_file

    config, state = _random_heads(3)
    directory = _write(tmp_path / "heads", config, state)
    weights = load_file(str(directory / "model.safetensors"))
    fewer, _ = _vllm_medusa(directory, 2, monkeypatch)
    assert fewer.load_weights(weights.items()) == {n for n, _ in fewer.named_parameters()}
    medusaformat.check_medusa_dir(directory, num_speculative_tokens=3)
    more, _ = _vllm_medusa(directory, 4, monkeypatch)
    unfilled = {n for n, _ in more.named_parameters()} - more.load_weights(weights.items())
    assert "blocks.3.layers.0.weight" in unfilled  # vLLM's loader then refuses to start
    with pytest.raises(ConfigError, match="fewer than num_speculative_tokens 4"):
        medusaformat.check_medusa_dir(directory, num_speculative_tokens=4)


def test_head_i_at_p_is_scored_against_the_target_at_p_plus_1_plus_i() -> None:
    """Hidden state p is one-hot(p); head i's LM head maps it to token p+1+i, and the target's
    distribution at position q peaks on token q: every head agrees only with the right offset."""
    n, k = 12, 3
    config = medusaformat.medusa_config({**TARGET, "hidden_size": n, "vocab_size": n}, k)
    heads = medusa.MedusaHeads(config, torch.zeros(n, n))  # blocks start at zero: the identity
    for i in range(k):
        heads.params[f"lm_heads.{i}.weight"] = torch.roll(torch.eye(n), shifts=1 + i, dims=0) * 20
    feats = {"final": torch.eye(n)[None], "logprobs": torch.log_softmax(torch.eye(n)[None] * 20, dim=-1)}
    loss, metrics = medusa.medusa_losses(heads, feats, step_decay=0.8, with_metrics=True)
    assert metrics["agreement_per_head"] == [1.0] * k
    assert metrics["chain_acceptance_length"] == 1.0 + k
    assert loss.item() < 1e-3
    heads.params["lm_heads.1.weight"] = torch.roll(torch.eye(n), shifts=1, dims=0) * 20  # head 1 one token short
    _, metrics = medusa.medusa_losses(heads, feats, step_decay=0.8, with_metrics=True)
    assert metrics["agreement_per_head"] == [1.0, 0.0, 1.0] and metrics["chain_acceptance_length"] == 2.0


def test_zero_blocks_start_as_the_targets_next_token() -> None:
    config = medusaformat.medusa_config(TARGET, 2)
    lm_head = torch.randn(96, 32)
    heads = medusa.MedusaHeads(config, lm_head)
    hidden = torch.randn(4, 32)
    with torch.no_grad():
        for logits in heads.logits(hidden):
            torch.testing.assert_close(logits, hidden @ lm_head.T)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda c, s: s.pop("lm_heads.1.weight"), r"'lm_heads\.1\.weight' is missing"),
        (lambda c, s: s.update({"blocks.0.layers.1.weight": s["blocks.0.layers.0.weight"].clone()}), r"unexpected tensor 'blocks\.0\.layers\.1\.weight'"),
        (lambda c, s: s.update({"blocks.2.layers.0.bias": torch.zeros(31)}), r"has shape \[31\], expected \[32\]"),
        (lambda c, s: c.update({"num_attention_heads": 2}), "'num_attention_heads' would be read as num_heads"),
        (lambda c, s: c.update({"truncated_vocab_size": 64}), "token_map"),
    ],
)
def test_a_broken_directory_is_refused_naming_what(tmp_path: Path, edit, match: str) -> None:
    from safetensors.torch import save_file

    config, state = _random_heads(3)
    edit(config, state)
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError, match=match):
        medusaformat.check_medusa_dir(tmp_path)


def test_options_and_config_entry() -> None:
    import copy

    import yaml

    from sdbench.cli import build_parser
    from sdbench.config import validate_config

    HeadConfig(kind="medusa", num_heads=4).validate(num_target_layers=3)
    with pytest.raises(ValueError, match="--num-heads"):
        HeadConfig(kind="medusa", num_heads=0).validate()
    args = build_parser().parse_args("train-head --target t --tokenizer k --output o --kind medusa --num-heads 4".split())
    assert (args.kind, args.num_heads) == ("medusa", 4)
    with pytest.raises(ValueError, match="not medusa"):
        medusa.train_medusa("t", "k", "o", HeadConfig(kind="eagle"))
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())  # the default grid runs medusa-k3
    assert config["models"]["tiny-target-medusa"]["head"]["kind"] == "medusa" and "medusa-k3" in config["grid"][0]["methods"]
    validate_config(copy.deepcopy(config))
    config["methods"]["medusa-k3"]["num_speculative_tokens"] = 4
    with pytest.raises(ConfigError, match=r"medusa-k3\.num_speculative_tokens: 4 > the 3 head\(s\)"):
        validate_config(config)


# ----------------------------------------------------------------------------- real engine

ENGINE_RUN = textwrap.dedent("""
    import json, os, sys
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    target, heads, prompts_file = sys.argv[1:4]
    prompts = json.load(open(prompts_file))
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_accepted_tokens": "accepted"}
    out = {}
    for arm, spec in (("greedy", None), ("medusa", {"method": "medusa", "model": heads, "num_speculative_tokens": 3})):
        llm = LLM(model=target, speculative_config=spec, enforce_eager=True, dtype="float32", seed=0,
                  kv_cache_memory_bytes=1 << 28, max_model_len=512, disable_log_stats=False)
        before = {names[m.name]: m.value for m in llm.get_metrics() if m.name in names}
        done = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                            SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True), use_tqdm=False)
        after = {names[m.name]: m.value for m in llm.get_metrics() if m.name in names}
        out[arm] = {"tokens": [list(o.outputs[0].token_ids) for o in done],
                    **{k: after.get(k, 0) - before.get(k, 0) for k in names.values()}}
        del llm
    print("RESULT " + json.dumps(out))
    """)


@pytest.mark.slow
def test_trained_heads_draft_on_the_cpu_engine_and_equal_greedy(tmp_path: Path) -> None:
    """A small target and its Medusa heads built by the pipeline's commands (train-head twice:
    bit-identical), then vLLM CPU greedy without and with method medusa k=3: token for token equal,
    and drafts accepted."""
    import numpy as np

    from support.require import import_or_fail

    import_or_fail("vllm")
    from sdbench.datasets import corpus
    from sdbench.models import tokenizer, training
    from sdbench.models.trainconfig import TrainConfig

    tok, target = tmp_path / "tok", tmp_path / "target"
    tokenizer.build_tokenizer(tok, vocab_size=320, seed=0, corpus_root=corpus.stdlib_root() / "wsgiref")
    cfg = TrainConfig(layers=2, hidden=64, heads=2, kv_heads=2, intermediate=128, steps=200, batch_size=4, seq_len=128,
                      warmup_steps=10, max_position_embeddings=512, eval_tokens=1024, eval_edit_examples=4,
                      induction_init="bigram", compile="off")  # fmt: skip
    training.train_model(tok, target, cfg, log=lambda _msg: None)
    builds = []
    for name in ("heads", "again"):
        argv = [str(BIN / "sdbench"), "train-head", "--target", str(target), "--tokenizer", str(tok),
                "--output", str(tmp_path / name), "--seed", "42", "--threads", "1", "--kind", "medusa",
                "--num-heads", "3", "--steps", "120", "--lr", "0.01", "--seq-len", "128", "--compile", "off"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        builds.append((tmp_path / name / "model.safetensors").read_bytes())
    assert builds[0] == builds[1]
    info = json.loads((tmp_path / "heads" / "training.json").read_text())
    assert info["kind"] == "medusa" and len(info["heldout_top1_agreement_per_head"]) == 3

    stream = np.load(tok / "data" / "heldout_stream.npy")
    prompts = [stream[s : s + 40].tolist() for s in range(0, 8 * 200, 200)]
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))
    script = tmp_path / "run.py"
    script.write_text(ENGINE_RUN)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run([sys.executable, str(script), str(target), str(tmp_path / "heads"), str(tmp_path / "prompts.json")],
                          env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])
    greedy, spec = result["greedy"], result["medusa"]
    assert spec["tokens"] == greedy["tokens"]  # speculative decoding must not change greedy output
    assert all(len(t) == 48 for t in spec["tokens"])
    assert spec["drafts"] > 0 and spec["accepted"] > 0, spec
    print(f"\n[medusa] k=3 mean acceptance length {1 + spec['accepted'] / spec['drafts']:.2f} "
          f"({spec['accepted']} accepted / {spec['drafts']} drafts); held-out agreement per head "
          f"{info['heldout_top1_agreement_per_head']}")
