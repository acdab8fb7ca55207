"""Sweeps as grid blocks (sdbench.sweeps) and the proposal-length table (sdbench.analysis.proposal)."""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sdbench import sweeps
from sdbench.analysis import proposal
from sdbench.config import ConfigError, validate_config
from sdbench.grid import cells, engine_groups

REPO = Path(__file__).resolve().parents[2]
RAW = yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def test_proposal_length_sweep_becomes_methods_and_a_grid_block() -> None:
    config = validate_config(copy.deepcopy(RAW))
    points = sweeps.proposal_length_methods(config)
    # The base at its own k, an identical hand-written entry (ngram-k5), else a derived key.
    assert points == {
        "ngram-k3.k1": ("ngram-k3", 1), "ngram-k3": ("ngram-k3", 3), "ngram-k5": ("ngram-k3", 5),
        "ngram-k3.k10": ("ngram-k3", 10), "eagle3-k3.k1": ("eagle3-k3", 1), "eagle3-k3": ("eagle3-k3", 3),
        "eagle3-k3.k5": ("eagle3-k3", 5), "eagle3-k3.k10": ("eagle3-k3", 10),
    }  # fmt: skip
    derived = config["methods"]["eagle3-k3.k10"]
    assert derived["num_speculative_tokens"] == 10 and derived["sweep_of"] == "eagle3-k3"
    assert derived["drafter"] == config["methods"]["eagle3-k3"]["drafter"]
    block = next(b for b in config["grid"] if b.get("sweep") == "proposal_length")
    assert block["methods"][0] == "none"
    assert block["datasets"] == ["code-edit"] and block["batch_sizes"] == [1]
    # Each new k is its own engine group with one cell; everything else is unchanged.
    new = {c.method for c in cells(config)} - set(RAW["methods"]) - set(sweeps.forced_acceptance_methods(config)) - {
        sweeps.aa_key("none")}  # fmt: skip
    assert new == {"ngram-k3.k1", "ngram-k3.k10", "eagle3-k3.k1", "eagle3-k3.k5", "eagle3-k3.k10"}
    assert {g.method for g in engine_groups(config)} >= new


def test_forced_acceptance_sweep_becomes_synthetic_methods_and_a_grid_block() -> None:
    config = validate_config(copy.deepcopy(RAW))
    points = sweeps.forced_acceptance_methods(config)
    assert list(points) == [f"{m}.a{a}" for m in ("draft-k3", "eagle3-k3", "medusa-k3", "ngram-k3") for a in ("1", "2.5", "4")]
    assert points["eagle3-k3.a4"] == ("eagle3-k3", 4.0)  # full = k + 1
    entry = config["methods"]["eagle3-k3.a2.5"]
    base = config["methods"]["eagle3-k3"]
    assert entry.get("speculative_config") == base.get("speculative_config")  # switched in-engine
    assert entry["forced_acceptance_length"] == 2.5
    assert sweeps.forced_base(config, "eagle3-k3.a2.5") == "eagle3-k3" and sweeps.forced_base(config, "none") == "none"
    assert entry["drafter"] == config["methods"]["eagle3-k3"]["drafter"] and entry["label"].endswith("forced τ=2.5")
    block = next(b for b in config["grid"] if b.get("sweep") == "forced_acceptance")
    assert block["methods"] == ["none", *points] and block["batch_sizes"] == [1, 8]
    assert sweeps.forced_run(config, "ngram-k3.a1") == {"ignore_eos": True, "num_requests": 4}
    assert sweeps.forced_run(config, "ngram-k3") is None


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["forced_acceptance"].update(acceptance_lengths=[1, 5]),
     r"forced_acceptance.acceptance_lengths\[1\]: 5 is outside 1..4 \(k \+ 1 for 'draft-k3', k = 3\)"),
    (lambda c: c["forced_acceptance"].update(methods=["none"]),
     r"forced_acceptance.methods\[0\]: 'none' is the no-SD baseline; it drafts nothing to accept"),
    (lambda c: c["methods"]["ngram-k3"].update(speculative_config={"rejection_sample_method": "standard"}),
     r"methods.ngram-k3.speculative_config: sets rejection_sample_method; the sweep forces acceptance itself"),
    (lambda c: c["forced_acceptance"].update(acceptance_lengths=["all", 1]),
     r"forced_acceptance.acceptance_lengths\[0\]"),
])  # fmt: skip
def test_forced_acceptance_problems_are_named(edit, message) -> None:
    raw = copy.deepcopy(RAW)
    edit(raw)
    with pytest.raises(ConfigError, match=message):
        validate_config(raw)


def test_expanding_twice_changes_nothing() -> None:
    once = validate_config(copy.deepcopy(RAW))
    twice = validate_config(copy.deepcopy(once))
    assert twice == once


def test_sweep_names_are_checked_under_its_own_key() -> None:
    bad = copy.deepcopy(RAW)
    bad["proposal_length"]["methods"] = ["ngram-k3", "none", "nope"]
    bad["proposal_length"]["engine"] = "vllm-9"
    with pytest.raises(ConfigError) as err:
        validate_config(bad)
    text = str(err.value)
    assert "proposal_length.engine: unknown engine 'vllm-9'" in text
    assert "proposal_length.methods[1]: 'none' is the no-SD baseline" in text
    assert "proposal_length.methods[2]: unknown method 'nope'" in text
    short = copy.deepcopy(RAW)
    short["proposal_length"]["num_speculative_tokens"] = [3]
    with pytest.raises(ConfigError, match=r"proposal_length.num_speculative_tokens"):
        validate_config(short)


def _cell(method: str, sd: str, acc: float, speedup: float) -> dict:
    return {
        "engine": "e", "model": "m", "dataset": "d", "method": method, "batch_size": 2, "sd_method": sd,
        "mean_acceptance_length": acc, "acceptance_rate": (acc - 1) / 3, "speedup": speedup,
        "speedup_ci_low": 0.9 * speedup, "speedup_ci_high": 1.1 * speedup,
    }  # fmt: skip


def _memory(method: str, static: float) -> dict:
    return {"engine": "e", "model": "m", "dataset": "d", "method": method, "batch_size": 2,
            "analytical_static_gib": static, "analytical_per_token_kib": 1024.0, "peak_memory_gib": 3.0}  # fmt: skip


def test_proposal_length_table_and_outputs(tmp_path: Path) -> None:
    cells_t = pd.DataFrame([_cell("none", "none", float("nan"), 1.0), _cell("ng", "ngram", 2.0, 1.5),
                            _cell("ng.k8", "ngram", 2.5, 1.2), {**_cell("ng", "ngram", 2.0, 1.4), "batch_size": 4}])  # fmt: skip
    memory = pd.DataFrame([_memory("none", 1.0), _memory("ng", 1.0), _memory("ng.k8", 1.0), {**_memory("ng", 1.0), "batch_size": 4}])
    scope = {"engine": "e", "models": ["m"], "datasets": ["d"], "batch_sizes": [2]}
    points = {"ng.k8": ("ng", 8), "ng": ("ng", 3)}
    table = proposal.proposal_length_table(cells_t, memory, points, scope)  # the base's bs-4 cell is outside
    assert table["num_speculative_tokens"].tolist() == [3, 8]
    assert table["base_method"].tolist() == ["ng", "ng"]
    # 2 sequences x k draft positions x 1 MiB of KV per token
    assert table["draft_kv_gib"].tolist() == pytest.approx([6 / 1024, 16 / 1024])
    assert table["extra_static_gib"].tolist() == [0.0, 0.0]
    md = proposal.proposal_length_markdown(table)
    assert "| ng | 8 | 2.50 | 0.50 | 1.20 [1.08, 1.32] |" in md
    proposal.plot_proposal_length(table, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 5_000
    with pytest.raises(ValueError, match="no cell of the sweep's methods"):
        proposal.proposal_length_table(cells_t, memory, {"other": ("x", 1)}, scope)


def test_the_aa_control_is_no_sd_timed_as_an_sd_arm_beside_every_block() -> None:
    """verdict.aa_control: the no-SD entry copied as none.aa, one cell per model x dataset of the
    grid's own blocks at their smallest batch size, paired with the no-SD arm as an SD cell is; the
    baseline stays the one no-SD entry."""
    from sdbench.grid import baseline_method, resolve_cell

    config = validate_config(copy.deepcopy(RAW))
    entry = config["methods"]["none.aa"]
    assert (entry["method"], entry["aa_control"], entry["sweep_of"]) == ("none", True, "none")
    assert baseline_method(config) == "none" and sweeps.variant_keys(config)["methods"]["none.aa"] == "aa_control"
    aa = sorted(c for c in cells(config) if c.method == "none.aa")
    assert [(c.model, c.dataset, c.batch_size) for c in aa] == [
        ("tiny-target", "code-edit", 1), ("tiny-target", "code-edit-random", 1), ("tiny-target", "code-write", 1),
        ("tiny-target", "my-chat", 1), ("tiny-target", "speed-bench-sample", 1), ("tiny-target-mtp", "code-edit", 1),
        ("tiny-target-mtp", "code-write", 1)]  # fmt: skip
    spec = resolve_cell(config, aa[0])
    assert spec["method"]["method"] == "none" and spec["paired_baseline"]["key"] == "none"
    assert {g.method for g in engine_groups(config) if g.method == "none.aa"} == {"none.aa"}
    validate_config(config)  # expanding is idempotent: a resolved config validates again
    assert sum(b.get("sweep") == "aa_control" for b in config["grid"]) == 5
    off = validate_config({**copy.deepcopy(RAW), "verdict": {"aa_control": False}})
    assert "none.aa" not in off["methods"] and not any(b.get("sweep") == "aa_control" for b in off["grid"])
