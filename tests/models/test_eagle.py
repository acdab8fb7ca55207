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


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
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
        eagle.HeadConfig(kind="hydra").validate()


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


def _random_llama_target():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    fields = {k: v for k, v in TARGET.items() if k not in ("architectures", "model_type", "rope_parameters")}
    model = LlamaForCausalLM(LlamaConfig(**fields, rope_theta=10000.0)).eval()
    with torch.no_grad():
        for name, t in model.named_parameters():
            if name.endswith("bias"):
                t.normal_(0, 0.5)  # the o_proj bias must survive the conversion
    return model


def _write_mtp_model(directory: Path, drop: str | None = None) -> dict:
    """A random Llama target as MiMo plus a random MTP layer, as train-head --kind mtp writes it."""
    from safetensors.torch import save_file

    from sdbench.models.mimo import mimo_state

    target = _random_llama_target()
    config = eagle.head_config("mtp", TARGET, eagle.HeadConfig(kind="mtp"))
    head = eagle._Head("mtp", TARGET, 3, seed=0)
    state = {**mimo_state(target.state_dict(), TARGET), **{k: v.detach() for k, v in head.params.items()}}
    state = {k: v.contiguous() for k, v in state.items() if k != drop}
    directory.mkdir(parents=True)
    save_file(state, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    return config


def test_the_mimo_form_of_a_target_gives_its_logits() -> None:
    """o_proj bias folded into v_proj: the Qwen2 network computes the Llama target's logits."""
    from sdbench.models.mimo import max_logit_difference, mimo_state

    target = _random_llama_target()
    state = mimo_state(target.state_dict(), TARGET)
    assert not any(k.endswith("o_proj.bias") for k in state) and "lm_head.weight" not in state
    config = eagle.head_config("mtp", TARGET, eagle.HeadConfig(kind="mtp"))
    assert config["architectures"] == ["MiMoForCausalLM"] and config["model_type"] == "qwen2"
    assert config["num_nextn_predict_layers"] == 1 and "attention_bias" not in config
    rows = torch.randint(0, TARGET["vocab_size"], (2, 24))
    assert max_logit_difference(target, config, state, rows) < 1e-4


def test_an_output_bias_that_the_value_space_cannot_hold_is_refused() -> None:
    from sdbench.models.mimo import fold_output_bias

    h, nh, nkv, hd = 32, 4, 1, 8  # 8 value dims cannot reproduce an arbitrary 32-dim bias
    with pytest.raises(ValueError, match="o_proj bias cannot be folded"):
        fold_output_bias(torch.randn(nkv * hd, h), torch.zeros(nkv * hd), torch.randn(h, nh * hd), torch.randn(h), nh, nkv)


@pytest.mark.parametrize(("nh", "nkv"), [(2, 2), (4, 2)])
def test_a_dead_value_dim_carries_the_output_bias_that_w_o_cannot_reach(nh: int, nkv: int) -> None:
    """The copy-circuit init leaves value dims with a zero v_proj row and o_proj column (rank-deficient W_o)."""
    from sdbench.models.mimo import fold_output_bias

    torch.manual_seed(0)
    h, hd, t = 16, 8, 5
    v_w, v_b = torch.randn(nkv * hd, h), torch.randn(nkv * hd)
    o_w, o_b = torch.randn(h, nh * hd), torch.randn(h)
    v_w[3] = 0.0  # dead kv dim 3: no value, no output column, no bias (no gradient ever reached them)
    v_b[3] = 0.0
    for head in range(nh // nkv):
        o_w[:, head * hd + 3] = 0.0
    o_w[:, hd:] = 0.0  # W_o of rank < h: lstsq alone cannot reach b_o
    x, probs = torch.randn(t, h), torch.softmax(torch.randn(nh, t, t), dim=-1)

    def attend(vw, vb, ow, ob):
        v = (x @ vw.T + vb).view(t, nkv, hd).repeat_interleave(nh // nkv, dim=1)  # [t, nh, hd]
        out = torch.einsum("hij,jhd->ihd", probs, v).reshape(t, nh * hd)
        return out @ ow.T + (ob if ob is not None else 0.0)

    new_vb, new_ow = fold_output_bias(v_w, v_b, o_w, o_b, nh, nkv)
    torch.testing.assert_close(attend(v_w, new_vb, new_ow, None), attend(v_w, v_b, o_w, o_b), rtol=1e-5, atol=1e-5)


def test_an_mtp_model_passes_the_preflight_check_and_a_missing_layer_tensor_is_named(tmp_path: Path) -> None:
    _write_mtp_model(tmp_path / "ok")
    check_model_dir(tmp_path / "ok", role="mtp")
    check_model_dir(tmp_path / "ok", role="target")  # and it is a target like any other
    tensor = "model.mtp_layers.0.input_proj.weight"
    _write_mtp_model(tmp_path / "bad", drop=tensor)
    with pytest.raises(ConfigError, match=tensor.replace(".", r"\.")):
        check_model_dir(tmp_path / "bad", role="mtp")
    result = subprocess.run(
        [str(BIN / "sdbench"), "check-model", str(tmp_path / "bad"), "--role", "mtp"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and tensor in result.stderr and len(result.stderr.strip().splitlines()) == 1
