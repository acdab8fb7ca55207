"""EAGLE / EAGLE-3 heads: the layout vLLM loads, refusal of incomplete heads, training-time test math."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sdbench.errors import ConfigError
from sdbench.models import eagle
from sdbench.models.check import check_model_dir

BIN = Path(sys.executable).parent
TARGET = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 3,
    "vocab_size": 97,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "attention_bias": True,
    "tie_word_embeddings": True,
}


def _write_head(directory: Path, kind: str, drop: str | None = None) -> dict:
    from safetensors.torch import save_file

    cfg = eagle.HeadConfig(kind=kind)
    config = eagle.head_config(kind, TARGET, cfg)
    head = eagle._Head(kind, TARGET, len(cfg.aux_layers), seed=0)
    state = {k: v.detach().contiguous() for k, v in head.params.items() if k != drop}
    directory.mkdir(parents=True)
    save_file(state, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    return config


@pytest.mark.parametrize("kind", eagle.KINDS)
def test_built_layout_passes_the_engine_preflight_check(tmp_path: Path, kind: str) -> None:
    config = _write_head(tmp_path / kind, kind)
    check_model_dir(tmp_path / kind, role=kind)
    # No bias tensors are written, so the config must not promise them (vLLM would expect them).
    assert config["attention_bias"] is False and config["num_hidden_layers"] == 1
    assert config["architectures"] == [eagle.ARCHITECTURES[kind]]
    if kind == "eagle3":
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
        assert config["num_aux_hidden_states"] == 3 and config["draft_vocab_size"] == 97


@pytest.mark.parametrize(("kind", "tensor"), [("eagle", "fc.weight"), ("eagle3", "midlayer.hidden_norm.weight")])
def test_a_head_with_a_missing_tensor_is_refused_naming_it(tmp_path: Path, kind: str, tensor: str) -> None:
    _write_head(tmp_path / kind, kind, drop=tensor)
    with pytest.raises(ConfigError, match=tensor.replace(".", r"\.")):
        check_model_dir(tmp_path / kind, role=kind)
    result = subprocess.run(
        [str(BIN / "sdbench"), "check-model", str(tmp_path / kind), "--role", kind],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and tensor in lines[0]


def test_builder_refuses_missing_or_misshapen_tensors() -> None:
    cfg = eagle.HeadConfig(kind="eagle3")
    config = eagle.head_config("eagle3", TARGET, cfg)
    shapes = eagle.expected_tensors("eagle3", config)
    eagle.check_head_tensors("eagle3", config, shapes)
    missing = {k: v for k, v in shapes.items() if k != "norm.weight"}
    with pytest.raises(ValueError, match=r"'norm\.weight' is missing"):
        eagle.check_head_tensors("eagle3", config, missing)
    with pytest.raises(ValueError, match=r"'fc\.weight' has shape"):
        eagle.check_head_tensors("eagle3", config, {**shapes, "fc.weight": (32, 64)})
    with pytest.raises(ValueError, match=r"unexpected tensor 'lm_head\.weight'"):
        eagle.check_head_tensors("eagle3", config, {**shapes, "lm_head.weight": (97, 32)})


def test_bad_options_are_named() -> None:
    with pytest.raises(ValueError, match="--aux-layers"):
        eagle.HeadConfig(kind="eagle3", aux_layers=(1, 4)).validate(num_target_layers=3)
    with pytest.raises(ValueError, match="--aux-layers"):
        eagle.HeadConfig(kind="eagle3", aux_layers=(2, 1)).validate()
    with pytest.raises(ValueError, match="--kind"):
        eagle.HeadConfig(kind="medusa").validate()


@pytest.mark.parametrize("kind", eagle.KINDS)
def test_training_time_test_equals_drafting_with_a_kv_cache(kind: str) -> None:
    """Step j of chain p attends to the true rows 0..p and the chain's own steps, as vLLM drafts."""
    torch.manual_seed(0)
    head = eagle._Head(kind, TARGET, 3, seed=1)
    b, t, steps, h = 1, 6, 3, TARGET["hidden_size"]
    embed = torch.randn(b, t + steps - 1, h)
    first = torch.randn(b, t, h)
    with torch.no_grad():
        unrolled = eagle.unrolled_forward(head, embed, first, steps)
        for p in range(t):
            # Naive drafting of chain p: a KV cache of the step-1 rows 0..p, then one row per step.
            x, residual = head.layer_input(embed[:, :t], first)
            _, k1, v1 = head.qkv(x, torch.arange(t))
            keys, values = [k1[:, :, : p + 1]], [v1[:, :, : p + 1]]
            hidden = first[:, p : p + 1]
            for j in range(1, steps + 1):
                x, residual = head.layer_input(embed[:, p + j - 1 : p + j], hidden)
                q, k, v = head.qkv(x, torch.tensor([p + j - 1]))
                if j > 1:
                    keys.append(k)
                    values.append(v)
                kk, vv = torch.cat(keys, dim=2), torch.cat(values, dim=2)
                attn = torch.softmax((q @ kk.transpose(-1, -2)) / head.hd**0.5, dim=-1) @ vv
                logit_in, hidden = head.finish(attn, residual)
                torch.testing.assert_close(logit_in[:, 0], unrolled[j - 1][0][:, p], rtol=1e-4, atol=1e-5)
