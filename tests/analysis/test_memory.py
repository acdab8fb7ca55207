"""Analytical memory accounting against the paper's Tab. 2 and Tab. 3 (Sec. 5.2, App. A.2)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from sdbench import cli
from sdbench.analysis.memory import GIB, analytical_memory_table, memory_report, plot_memory
from sdbench.models.spec import iter_model_specs, load_model_spec, load_model_yaml, model_file_name

MODELS = Path(__file__).resolve().parents[2] / "src" / "sdbench" / "data" / "models"

L31_8B = "meta-llama/Llama-3.1-8B-Instruct"
L3_70B = "meta-llama/Meta-Llama-3-70B-Instruct"
L32_1B = "meta-llama/Llama-3.2-1B-Instruct"
Q3_8B = "Qwen/Qwen3-8B"
Q3_06B = "Qwen/Qwen3-0.6B"
EAGLE_8B = "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"
EAGLE3_8B = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
EAGLE_70B = "yuhuili/EAGLE-LLaMA3-Instruct-70B"
EAGLE3_Q8B = "AngelSlim/Qwen3-8B_eagle3"

# Paper Tab. 2: (target, draft, method, static GiB as printed, decimals printed, per-token KiB).
# "No SD/n-gram" is one column: both methods are checked against it.
QWEN_BASELINE_REASON = (
    "paper prints 15.25 for Qwen3-8B without SD; its 8.19B parameters (Tab. 3) give 15.2564 GiB, which "
    "rounds to 15.26 (15.25 is the truncation); no component-level counting fits 15.25 together with the "
    "paper's 16.00 and 16.37: see test_tab2_qwen3_baseline_is_not_reproducible_by_any_counting"
)
TAB2 = [
    (L31_8B, None, "none", 14.96, 2, 128),
    (L31_8B, None, "ngram", 14.96, 2, 128),
    (L31_8B, EAGLE_8B, "eagle", 15.43, 2, 132),
    (L31_8B, EAGLE3_8B, "eagle3", 15.75, 2, 132),
    (L3_70B, None, "none", 131.4, 1, 320),
    (L3_70B, None, "ngram", 131.4, 1, 320),
    (L3_70B, EAGLE_70B, "eagle", 133.3, 1, 324),
    (L3_70B, L32_1B, "draft_model", 133.7, 1, 352),
    pytest.param(Q3_8B, None, "none", 15.25, 2, 144, marks=pytest.mark.xfail(strict=True, reason=QWEN_BASELINE_REASON)),
    pytest.param(
        Q3_8B, None, "ngram", 15.25, 2, 144, marks=pytest.mark.xfail(strict=True, reason=QWEN_BASELINE_REASON)
    ),
    (Q3_8B, EAGLE3_Q8B, "eagle3", 16.00, 2, 148),
    (Q3_8B, Q3_06B, "draft_model", 16.37, 2, 256),
]

# Paper Tab. 3: parameter size P (billions), L, n_kv, d_head.
TAB3 = [
    (L31_8B, None, None, 8.03, 32, 8, 128),
    (L3_70B, None, None, 70.55, 80, 8, 128),
    (L32_1B, None, None, 1.23, 16, 8, 64),
    (Q3_8B, None, None, 8.19, 36, 8, 128),
    (Q3_06B, None, None, 0.596, 28, 8, 128),
    (L31_8B, EAGLE_8B, "eagle", 0.25, 1, 8, 128),
    (L31_8B, EAGLE3_8B, "eagle3", 0.425, 1, 8, 128),
    (L3_70B, EAGLE_70B, "eagle", 0.99, 1, 8, 128),
    (Q3_8B, EAGLE3_Q8B, "eagle3", 0.40, 1, 8, 128),
]


@pytest.mark.parametrize(("target", "draft", "method", "static", "decimals", "per_token"), TAB2)
def test_tab2_reproduced(
    target: str, draft: str | None, method: str, static: float, decimals: int, per_token: int
) -> None:
    rep = memory_report(target, draft, method, MODELS)
    assert round(rep["static_gib"], decimals) == pytest.approx(static, abs=1e-9)
    assert rep["per_token_kib"] == per_token


def test_tab2_qwen3_baseline_is_not_reproducible_by_any_counting() -> None:
    """Document the one Tab. 2 number we do not reproduce, and why no defensible counting could.

    Our exact Qwen3-8B count (8,190,735,360 = Tab. 3's 8.19B) gives 15.2564 GiB: 15.26 rounded, 15.25
    truncated. For a P_target to print 15.25 *and* keep the paper's own EAGLE-3 (16.00) and D-M (16.37)
    cells, it must be 0.77M-0.89M parameters below ours: more than all norm weights together (0.31M),
    less than the smallest weight matrix (one layer's k_proj, 4.19M). So 15.25 is a truncation, not a
    different counting.
    """
    base = memory_report(Q3_8B, None, "none", MODELS)
    e3 = memory_report(Q3_8B, EAGLE3_Q8B, "eagle3", MODELS)
    dm = memory_report(Q3_8B, Q3_06B, "draft_model", MODELS)
    ours = base["target_params"]
    assert ours == 8_190_735_360
    assert round(base["static_gib"], 2) == 15.26
    assert math.floor(base["static_gib"] * 100) / 100 == 15.25
    half_gib = GIB / 2  # parameters per GiB at 2 bytes each
    lo = max(15.245 * half_gib, 15.995 * half_gib - e3["draft_params"], 16.365 * half_gib - dm["draft_params"])
    hi = min(15.255 * half_gib, 16.005 * half_gib - e3["draft_params"], 16.375 * half_gib - dm["draft_params"])
    assert lo < hi < ours
    parts = base["breakdown"]["target"]
    all_norms = parts["layer_norms"] + parts["qk_norm"] + parts["final_norm"]
    smallest_matrix = 4096 * 1024  # k_proj (or v_proj) of one layer
    assert all_norms < ours - hi and ours - lo < smallest_matrix


def test_appendix_a2_worked_examples() -> None:
    """App. A.2 computes from rounded Tab. 3 sizes: (70.55 + 1.23) -> 133.7 and (8.03 + 0.25) -> 15.42.

    The exact counts give 133.72 and 15.43 (the latter is what Tab. 2 prints).
    """
    assert round((70.55 + 1.23) * 1e9 * 2 / GIB, 1) == 133.7
    assert round((8.03 + 0.25) * 1e9 * 2 / GIB, 2) == 15.42
    assert round(memory_report(L31_8B, EAGLE_8B, "eagle", MODELS)["static_gib"], 2) == 15.43


@pytest.mark.parametrize(("target", "draft", "method", "params_b", "layers", "n_kv", "d_head"), TAB3)
def test_tab3_reproduced(
    target: str, draft: str | None, method: str | None, params_b: float, layers: int, n_kv: int, d_head: int
) -> None:
    rep = memory_report(target, draft, method, MODELS)
    ours = rep["draft_params_b"] if draft else rep["target_params_b"]
    assert ours == pytest.approx(params_b, abs=0.01)
    spec = load_model_spec(draft or target, MODELS)
    assert (spec.num_hidden_layers, spec.num_key_value_heads, spec.head_dim) == (layers, n_kv, d_head)
    assert (rep["draft_kv_layers"] if draft else rep["target_kv_layers"]) == layers


def test_exact_parameter_counts() -> None:
    """Hand-derived counts (comments give the arithmetic) pin the formulas, not just the rounding."""
    # Llama-3.1-8B: 2*128256*4096 + 32*(attn 41,943,040 + mlp 176,160,768 + norms 8192) + 4096
    assert memory_report(L31_8B, None, None, MODELS)["target_params"] == 8_030_261_248
    # Qwen3-0.6B (tied): 151936*1024 + 28*(6,291,456 + qk-norm 256 + 9,437,184 + 2048) + 1024
    assert memory_report(Q3_06B, None, None, MODELS)["target_params"] == 596_049_920
    # EAGLE-1 8B: fc 8192*4096 + attn 41,943,040 + mlp 176,160,768 + post-attn norm 4096
    eagle = memory_report(L31_8B, EAGLE_8B, "eagle", MODELS)
    assert eagle["draft_params"] == 251_662_336
    assert eagle["breakdown"]["draft_shared_with_target"] == ["embed_tokens", "lm_head"]
    # EAGLE-3 8B: fc 3*4096*4096 + attn(2h in) 67,108,864 + mlp + 3 layer norms + final norm
    #             + lm_head 32000*4096 + d2t 32000; t2d (128256) skipped by vLLM
    e3 = memory_report(L31_8B, EAGLE3_8B, "eagle3", MODELS)
    assert e3["draft_params"] == 424_721_664
    assert e3["breakdown"]["draft"]["attention"] == 67_108_864
    assert e3["breakdown"]["draft_not_loaded"] == {"t2d": 128256}
    assert e3["breakdown"]["draft_shared_with_target"] == ["embed_tokens"]


def test_ngram_adds_nothing_and_rejects_a_draft() -> None:
    base = memory_report(L31_8B, None, "none", MODELS)
    ngram = memory_report(L31_8B, None, "ngram", MODELS)
    assert ngram["static_gib"] == base["static_gib"] and ngram["per_token_kib"] == base["per_token_kib"]
    assert ngram["draft_params_b"] == 0 and ngram["breakdown"]["draft"] == {}
    with pytest.raises(ValueError, match="uses no drafter"):
        memory_report(L31_8B, L32_1B, "ngram", MODELS)


def test_bad_combinations_fail_early() -> None:
    with pytest.raises(ValueError, match="needs an eagle3 head"):
        memory_report(L31_8B, EAGLE_8B, "eagle3", MODELS)
    with pytest.raises(ValueError, match="hidden_size"):
        memory_report(L3_70B, EAGLE_8B, "eagle", MODELS)
    with pytest.raises(ValueError, match="shared vocabulary"):
        memory_report(Q3_8B, L32_1B, "draft_model", MODELS)
    with pytest.raises(ValueError, match="needs --draft"):
        memory_report(L31_8B, None, "eagle", MODELS)
    with pytest.raises(ValueError, match="no architecture config for 'acme/none'"):
        memory_report("acme/none", None, None, MODELS)


def test_glm45_air_moe_and_mtp() -> None:
    """MoE counting against the model card (106B total) and MTP as one extra MoE layer."""
    base = memory_report("zai-org/GLM-4.5-Air", None, "none", MODELS)
    assert 106.0 <= base["target_params_b"] < 107.0
    assert base["per_token_kib"] == 46 * 2 * 8 * 128 * 2 / 1024
    mtp = memory_report("zai-org/GLM-4.5-Air", None, "mtp", MODELS)
    assert mtp["per_token_kib"] == base["per_token_kib"] + 4
    assert mtp["draft_params_b"] == pytest.approx(3.0, abs=0.01)
    assert mtp["breakdown"]["draft_shared_with_target"] == ["embed_tokens"]


def test_every_model_yaml_is_valid_and_named_after_its_repo() -> None:
    specs = list(iter_model_specs(MODELS))
    assert len(specs) >= 9
    for spec in specs:
        assert Path(spec.source).name == model_file_name(spec.repo_id)


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_schema_errors_name_file_and_key(tmp_path: Path) -> None:
    good = yaml.safe_load((MODELS / "yuhuili--EAGLE3-LLaMA3.1-Instruct-8B.yaml").read_text())
    bad = dict(good)
    del bad["draft_vocab_size"]
    bad["num_key_value_heads"] = "8"
    bad["hiden_size"] = 4096
    path = _write(tmp_path / model_file_name(good["repo_id"]), bad)
    with pytest.raises(ValueError) as info:
        load_model_yaml(path)
    msg = str(info.value)
    assert f"{path}: key 'draft_vocab_size': missing (required for architecture 'eagle3')" in msg
    assert f"{path}: key 'num_key_value_heads'" in msg and "is not of type 'integer'" in msg
    assert f"{path}: key 'hiden_size': unknown key" in msg

    misnamed = _write(tmp_path / "other--name.yaml", good)
    with pytest.raises(ValueError, match=r"other--name\.yaml: key 'repo_id'"):
        load_model_yaml(misnamed)


def _tiny_config(path: Path, layers: int) -> Path:
    """A Llama config.json as `transformers` writes it (shape of the pipeline's tiny CPU models)."""
    path.mkdir(parents=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 2048,
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "attention_bias": False,
        "mlp_bias": False,
        "rms_norm_eps": 1e-6,
    }
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def test_local_config_json(tmp_path: Path) -> None:
    target = _tiny_config(tmp_path / "tiny-target", 3)
    draft = _tiny_config(tmp_path / "tiny-draft", 1)
    rep = memory_report(str(target), str(draft / "config.json"), None, MODELS)
    assert rep["method"] == "draft_model"
    # 2048*128 (tied) + 3 * (4*128*128 + 3*128*384 + 2*128) + 128: the 0.90M / 0.48M of the CPU probe
    assert rep["target_params"] == 902_016 and rep["draft_params"] == 475_520
    assert rep["static_gib"] == (902_016 + 475_520) * 4 / GIB  # float32
    assert rep["per_token_kib"] == (3 + 1) * 2 * 2 * 64 * 4 / 1024
    as_eagle = load_model_spec(str(draft), MODELS, expect="eagle")
    assert as_eagle.architecture == "eagle" and as_eagle.shares_lm_head


def test_medusa_heads_count_blocks_and_lm_heads_and_no_kv_cache(tmp_path: Path) -> None:
    """The config `sdbench train-head --kind medusa` writes (3 heads, own LM heads, biased blocks):
    3 x (128*128 + 128) + 3 x 2048*128 = 835,968, the tensors of the built tiny-target-medusa."""
    target = _tiny_config(tmp_path / "tiny-target", 3)
    medusa = tmp_path / "tiny-target-medusa"
    medusa.mkdir()
    (medusa / "config.json").write_text(json.dumps({
        "architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": 128, "vocab_size": 2048,
        "truncated_vocab_size": 2048, "num_heads": 3, "num_hidden_layers": 1, "medusa_fc_bias": True,
        "original_lm_head": False, "dtype": "float32"}))  # fmt: skip
    rep = memory_report(str(target), str(medusa), None, MODELS)
    assert rep["method"] == "medusa" and rep["draft_params"] == 835_968
    assert rep["breakdown"]["draft"] == {"blocks": 49_536, "lm_heads": 786_432}
    assert rep["draft_per_token_kib"] == 0 and rep["draft_kv_layers"] == 0
    with pytest.raises(ValueError, match="method 'medusa' needs Medusa heads"):
        memory_report(str(target), str(target), "medusa", MODELS)


def test_analytical_table_and_plot(tmp_path: Path) -> None:
    cells = pd.DataFrame(
        {
            "target": [L31_8B, L31_8B, L3_70B],
            "draft": [None, EAGLE3_8B, L32_1B],
            "method": ["ngram", None, "draft_model"],
            "measured_weights_gib": [14.99, np.nan, 133.9],
            "measured_kv_cache_gib": [np.nan, 50.0, 200.0],
            "peak_memory_gib": [np.nan, np.nan, 310.0],
        }
    )
    out = analytical_memory_table(cells, MODELS)
    assert list(out.columns[: len(cells.columns)]) == list(cells.columns)
    assert out["analytical_static_gib"].round(2).tolist() == [14.96, 15.75, 133.72]
    assert out["analytical_per_token_kib"].tolist() == [128.0, 132.0, 352.0]
    assert out["draft_params_b"].iloc[0] == 0
    png = tmp_path / "memory.png"
    plot_memory(out, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="cells row 0"):
        analytical_memory_table(pd.DataFrame({"target": [L31_8B], "draft": [L32_1B], "method": ["ngram"]}), MODELS)


def test_cli_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(
        ["memory", "--target", Q3_8B, "--draft", Q3_06B, "--method", "draft_model", "--models-dir", str(MODELS)]
    )
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert round(rep["static_gib"], 2) == 16.37 and rep["per_token_kib"] == 256
    assert {"target_params_b", "draft_params_b", "breakdown"} <= rep.keys()


def test_default_lookup_reads_the_package_data() -> None:
    """Without a models dir, repo ids resolve through sdbench.packagedata (what an installed wheel uses)."""
    assert memory_report(L31_8B, EAGLE_8B, "eagle") == memory_report(L31_8B, EAGLE_8B, "eagle", MODELS)
    assert [s.repo_id for s in iter_model_specs()] == [s.repo_id for s in iter_model_specs(MODELS)]


def test_eagle3_head_with_the_target_vocabulary_shares_its_lm_head(tmp_path) -> None:
    """A built EAGLE-3 head (same vocabulary, 2 aux layers) is counted as the tensors it ships."""
    import json
    import math

    from sdbench.analysis.memory import count_eagle3
    from sdbench.models import eagle
    from sdbench.models.spec import load_hf_config

    target = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
        "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 3,
        "vocab_size": 97, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    }
    cfg = eagle.HeadConfig(kind="eagle3", aux_layers=(1, 3))
    config = eagle.head_config("eagle3", target, cfg)
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = load_hf_config(tmp_path)
    assert spec.shares_lm_head and not spec.has_d2t and spec.num_aux_hidden_states == 2
    shipped = sum(math.prod(s) for s in eagle.expected_tensors("eagle3", config).values())
    assert sum(count_eagle3(spec).components.values()) == shipped


def test_a_built_mtp_model_counts_its_mimo_layer_and_the_qwen2_target(tmp_path) -> None:
    """train-head --kind mtp writes the target as MiMo: the MTP count equals the layer's tensors, and
    the target's count has q/k/v biases but no o_proj bias (Qwen2)."""
    import json
    import math

    from sdbench.analysis.memory import count_full_model, count_mtp
    from sdbench.models import eagle
    from sdbench.models.spec import load_hf_config

    target = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
        "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 3,
        "vocab_size": 97, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "attention_bias": True,
    }
    config = eagle.head_config("mtp", target, eagle.HeadConfig(kind="mtp"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = load_hf_config(tmp_path)
    assert spec.architecture == "mimo" and spec.num_nextn_predict_layers == 1
    shipped = sum(math.prod(s) for s in eagle.expected_tensors("mtp", config).values())
    mtp = count_mtp(spec)
    assert sum(mtp.components.values()) == shipped and set(mtp.shared_with_target) == {"embed_tokens", "lm_head"}
    h, layers = 32, 3
    llama_layer = 4 * h * h + 4 * h + 3 * h * 64 + 2 * h  # q/k/v/o with biases, MLP, two norms
    assert sum(count_full_model(spec).components.values()) == 97 * h + layers * (llama_layer - h) + h


def test_a_cells_table_with_suffix_decoding_and_glm_mtp_cells() -> None:
    """The paper grid's GLM-4.5-Air cells as a joined cells table names them (vLLM's ``sd_method``):
    suffix decoding holds no draft weights and no KV cache of its own (as n-gram), ``deepseek_mtp``
    is the MTP layer. The paper rehearsal's Tab. 2 stopped at "unknown method 'suffix'"."""
    from sdbench.analysis.memory import cells_memory_table

    nan = float("nan")
    cells = pd.DataFrame({"engine": "e", "model": "glm", "dataset": "d", "batch_size": 1, "drafter": None,
                          "method": ["none", "suffix", "mtp-k1"], "sd_method": ["none", "suffix", "deepseek_mtp"],
                          "peak_rss_gib": 1.0, "peak_device_gib": nan, "measured_weights_gib": nan,
                          "measured_kv_cache_gib": nan, "kv_cache_capacity_tokens": nan})  # fmt: skip
    table = cells_memory_table(cells, {"glm": "zai-org/GLM-4.5-Air"})
    base, suffix, mtp = (memory_report("zai-org/GLM-4.5-Air", None, m, MODELS) for m in ("none", "ngram", "mtp"))
    assert suffix["draft_params_b"] == 0 and suffix["per_token_kib"] == base["per_token_kib"]
    assert list(table["method"]) == ["none", "suffix", "mtp-k1"]
    assert list(table["draft_params_b"]) == [0, 0, mtp["draft_params_b"]] and mtp["draft_params_b"] > 0
    assert table.loc[1, "analytical_per_token_kib"] == base["per_token_kib"] < mtp["per_token_kib"]
