"""Grid expansion and the vLLM version quirks."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdbench.config import load_config
from sdbench.engine.release.versions import apply_env, engine_env, quirks_for, speculative_config, unsupported_reason
from sdbench.grid import Cell, cells, drafter_of, models_used, resolve_cell

REPO = Path(__file__).resolve().parents[2]
GPU_0_10 = {"vllm_version": "0.10.1.1", "device": "cuda", "patches": []}
GPU_0_11 = {"vllm_version": "0.11.1", "device": "cuda", "patches": []}


def test_default_grid_is_the_cross_product() -> None:
    grid = cells(load_config(REPO / "config" / "config.yaml"))
    # Block 1: seven methods on the target; block 2: the MiMo form of the target (MTP); block 3:
    # the random-token control; the proposal-length sweep adds 5 k values (code-edit, bs 1), the
    # temperature sweep 3 methods x 3 temperatures > 0 (code-edit, bs 1); block 4: the prompts file
    # (3 methods, bs 1 and 8); block 5: the SPEED-Bench stand-in (3 methods, bs 1); the
    # forced-acceptance sweep 4 methods x 3 lengths x 2 batch sizes (code-edit); the A/A control one
    # cell per model x dataset of the grid's own blocks: 5 datasets on the target, 2 on its MiMo form.
    assert len(grid) == 1 * 1 * 7 * 2 * 3 + 1 * 1 * 2 * 2 * 3 + 1 * 1 * 3 * 1 * 2 + 5 + 3 * 3 + 3 * 2 + 3 + 4 * 3 * 2 + 7
    assert grid == sorted(grid)
    assert {c.batch_size for c in grid} == {1, 4, 8}


def test_paper_grid_resolves_drafters() -> None:
    cfg = load_config(REPO / "config" / "paper.yaml")
    assert drafter_of(cfg, "eagle3-k3", "qwen3-8b") == "eagle3-qwen3-8b"
    assert drafter_of(cfg, "ngram-k3", "qwen3-8b") is None
    assert "qwen3-0.6b" in models_used(cfg)
    spec = resolve_cell(cfg, Cell("vllm-0.10.1.1", "llama3.1-8b", "gsm8k", "eagle-k3", 8))
    assert spec["drafter"] == "eagle-llama3.1-8b"
    assert spec["dataset"]["max_tokens"] == 8192


@pytest.mark.parametrize(
    ("engine", "method", "ok"),
    [
        (GPU_0_10, "draft_model", False),
        ({**GPU_0_10, "patches": ["draft_model"]}, "draft_model", True),
        (GPU_0_10, "deepseek_mtp", False),
        (GPU_0_11, "deepseek_mtp", True),
        (GPU_0_11, "draft_model", False),
        (GPU_0_10, "suffix", False),
        (GPU_0_11, "suffix", False),  # needs arctic-inference in the image
        ({**GPU_0_11, "patches": ["arctic_inference"]}, "suffix", True),
        ({"vllm_version": "0.10.1.1", "device": "cpu"}, "ngram", False),
        ({"vllm_version": "0.32.0", "device": "cpu"}, "draft_model", True),
        (GPU_0_10, "none", True),
    ],
)
def test_method_support_by_version(engine: dict, method: str, ok: bool) -> None:
    assert (unsupported_reason(engine, method) is None) is ok


def test_speculative_config_spelling() -> None:
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 7}
    assert speculative_config(GPU_0_10, ngram, None) == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 7,
        "prompt_lookup_max": 7,
    }
    mtp = {"method": "deepseek_mtp", "num_speculative_tokens": 3}
    assert speculative_config(GPU_0_11, mtp, "/m")["method"] == "mtp"
    assert speculative_config(GPU_0_10, mtp, "/m")["method"] == "deepseek_mtp"
    eagle3 = {"method": "eagle3", "num_speculative_tokens": 3, "speculative_config": {"max_model_len": 8192}}
    assert speculative_config(GPU_0_10, eagle3, "/d") == {
        "method": "eagle3",
        "num_speculative_tokens": 3,
        "model": "/d",
        "max_model_len": 8192,
    }
    assert speculative_config(GPU_0_10, {"method": "none"}, None) is None


def test_tree_methods_select_tree_attention() -> None:
    tree = {"method": "eagle", "speculative_token_tree": "[(0,)]", "env": {"X": "1"}}
    assert engine_env({**GPU_0_10, "env": {"A": "b"}}, tree) == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "A": "b",
        "VLLM_ATTENTION_BACKEND": "TREE_ATTN",
        "X": "1",
    }


@pytest.mark.parametrize(
    ("engine", "layout"),
    [
        (GPU_0_10, "inprocess"),
        (GPU_0_11, "multiprocess"),  # 0.11.1's in-process client never drafts: both arms out of process
        ({"vllm_version": "0.26.0", "device": "cuda", "patches": []}, "inprocess"),
        ({"vllm_version": "0.32.0", "device": "cpu", "patches": []}, "inprocess"),
    ],
)
def test_both_arms_of_a_speedup_get_one_process_layout(engine: dict, layout: str) -> None:
    from sdbench.engine.release.versions import engine_layout, layout_of_env

    arms = [{"method": "none"}, {"method": "ngram", "num_speculative_tokens": 3},
            {"method": "eagle3", "num_speculative_tokens": 3}]  # fmt: skip
    envs = [engine_env(engine, arm) for arm in arms]
    assert {e["VLLM_ENABLE_V1_MULTIPROCESSING"] for e in envs} == {"0" if layout == "inprocess" else "1"}
    assert {layout_of_env(e) for e in envs} == {engine_layout(engine)} == {layout}


def test_a_method_env_that_changes_the_layout_is_refused() -> None:
    from sdbench.errors import ConfigError

    ngram = {"method": "ngram", "num_speculative_tokens": 3, "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}}
    with pytest.raises(ConfigError, match="one process layout"):
        engine_env(GPU_0_10, ngram)
    with pytest.raises(ConfigError, match="never drafts"):
        engine_env({**GPU_0_11, "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}, {"method": "ngram"})


def test_unknown_version_is_named() -> None:
    with pytest.raises(ValueError, match="unknown vllm_version '0.9'"):
        quirks_for("0.9")


def test_trace_breakdown_and_baseline_selections() -> None:
    from sdbench.grid import baseline_cells, breakdown_cells, trace_targets

    cfg = load_config(REPO / "config" / "config.yaml")
    assert {t.method for t in trace_targets(cfg)} == set(cfg["traces"]["methods"])
    assert all(c.batch_size == 1 and c.method == "none" for c in baseline_cells(cfg))
    selected = breakdown_cells(cfg)
    assert len(selected) == len(cfg["breakdown"]["methods"]) * len(cfg["breakdown"]["batch_sizes"])
    assert {c.dataset for c in selected} == set(cfg["breakdown"]["datasets"])


def test_trace_groups_share_one_engine_per_method() -> None:
    """Every trace lands in exactly one group, the group of its engine x model x method."""
    from sdbench.grid import TraceGroup, trace_groups, trace_targets

    for name in ("config.yaml", "paper.yaml"):
        cfg = load_config(REPO / "config" / name)
        groups = trace_groups(cfg)
        flat = [t for ts in groups.values() for t in ts]
        assert sorted(flat) == trace_targets(cfg)
        for group, targets in groups.items():
            assert all(TraceGroup(t.engine, t.model, t.method) == group for t in targets)
            assert [t.dataset for t in targets] == sorted({t.dataset for t in targets})
    # The default: n-gram and EAGLE-3 trace five datasets each on one engine, not five engines.
    groups = trace_groups(load_config(REPO / "config" / "config.yaml"))
    assert len(groups[TraceGroup("vllm-cpu", "tiny-target", "ngram-k3")]) == 5
    assert len(groups) < len(trace_targets(load_config(REPO / "config" / "config.yaml")))


def test_simulated_vs_measured_join() -> None:
    import pandas as pd

    from sdbench.simulator.validation import compare, simulated_policy

    methods = {
        "none": {"method": "none"},
        "ng3": {"method": "ngram", "num_speculative_tokens": 3},
        "dm3": {"method": "draft_model", "num_speculative_tokens": 3},
    }
    assert simulated_policy(methods["dm3"]) == ("eagle", "fixed-3")
    cells = pd.DataFrame(
        {"engine": "e", "model": "m", "dataset": "d", "method": ["none", "ng3", "dm3"], "batch_size": 4,
         "speedup": [1.0, 1.5, 0.8]}
    )
    simulated = pd.DataFrame(
        {"engine": "e", "model": "m", "dataset": "d", "proposer": ["ngram", "eagle", "eagle"],
         "drafter": ["", "draft_model", "draft_model"],
         "policy": ["fixed-3", "fixed-3", "oracle"], "batch_size": 4, "speedup": [1.2, 1.0, 2.0]}
    )
    table = compare(cells, simulated, methods)
    assert list(table["method"]) == ["dm3", "ng3"]
    assert list(table["ratio"].round(3)) == [1.25, 0.8]
    # A second learned drafter without a simulation of its own trace is not judged.
    methods["eg3"] = {"method": "eagle", "num_speculative_tokens": 3}
    both = pd.concat([cells, cells.iloc[[2]].assign(method="eg3", speedup=0.9)], ignore_index=True)
    assert list(compare(both, simulated, methods)["method"]) == ["dm3", "ng3"]
    # A forced-acceptance cell is not what the drafter's trace accepts: not judged here (ext15 is).
    methods["dm3.a4"] = {**methods["dm3"], "sweep_of": "dm3", "forced_acceptance_length": 4.0}
    forced = pd.concat([cells, cells.iloc[[2]].assign(method="dm3.a4", speedup=1.9)], ignore_index=True)
    assert list(compare(forced, simulated, methods)["method"]) == ["dm3", "ng3"]


def test_a_null_engine_env_entry_unsets_the_variable() -> None:
    """`env: {OMP_NUM_THREADS: null}` drops what Snakemake exports, keeping vLLM's default."""
    env = engine_env({**GPU_0_10, "env": {"OMP_NUM_THREADS": None, "A": "b"}}, {"method": "none"})
    target = apply_env(env, {"OMP_NUM_THREADS": "2", "PATH": "/bin"})
    assert target == {"PATH": "/bin", "A": "b", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
