"""Temperature sweep: dataset variants (sdbench.sweeps), per-sequence seeds (sdbench.engine.measure.sampling),
the sweep table and recommendation (sdbench.analysis.temperature), and one real vLLM check."""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from support.require import import_or_fail
import yaml

from sdbench import sweeps
from sdbench.analysis import temperature as temp
from sdbench.config import ConfigError, validate_config
from sdbench.grid import Cell, baseline_cells, breakdown_cells, cells, engine_groups, resolve_cell, trace_targets
from sdbench.requesttable import expand_outputs

REPO = Path(__file__).resolve().parents[2]
RAW = yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def _without_sweep() -> dict:
    raw = copy.deepcopy(RAW)
    raw.pop("temperature")
    return validate_config(raw)


# ----------------------------------------------------------------------------- expansion


def test_sweep_becomes_dataset_variants_and_a_grid_block() -> None:
    config = validate_config(copy.deepcopy(RAW))
    points = sweeps.temperature_datasets(config)
    assert points == {
        "code-edit": ("code-edit", 0.0), "code-edit.t0.5": ("code-edit", 0.5),
        "code-edit.t1.0": ("code-edit", 1.0), "code-edit.t1.5": ("code-edit", 1.5),
    }  # fmt: skip
    variant = config["datasets"]["code-edit.t0.5"]
    base = config["datasets"]["code-edit"]
    assert variant == {**base, "temperature": 0.5, "sweep_of": "code-edit"}
    assert "temperature" not in base  # T = 0 is the base itself, greedy
    block = next(b for b in config["grid"] if b.get("sweep") == "temperature")
    assert block["methods"] == ["none", "ngram-k3", "eagle3-k3"]
    assert block["datasets"] == list(points) and block["batch_sizes"] == [1]
    # 3 variants x 3 methods at bs 1 are new; the T = 0 cells already ran; one engine per method
    # beside the method's own group runs them (the grid's groups never wait for a sweep).
    new = set(cells(config)) - set(cells(_without_sweep()))
    assert len(new) == 9 and {c.dataset for c in new} == {"code-edit.t0.5", "code-edit.t1.0", "code-edit.t1.5"}
    added = set(engine_groups(config)) - set(engine_groups(_without_sweep()))
    assert {(g.method, g.share) for g in added} == {(m, "all-temperature") for m in ("none", "ngram-k3", "eagle3-k3")}
    assert sweeps.prompt_dataset(config, "code-edit.t1.5") == "code-edit"
    assert sweeps.prompt_dataset(config, "code-write") == "code-write"
    assert sweeps.dataset_key("x", 0) == "x" and sweeps.dataset_key("x", 1) == "x.t1.0"


def test_expanding_twice_changes_nothing() -> None:
    once = validate_config(copy.deepcopy(RAW))
    twice = validate_config(json.loads(json.dumps(once)))  # as Snakemake / the bundle hold it
    assert twice == once


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c["temperature"].update(engine="vllm-9"), "temperature.engine: unknown engine 'vllm-9'"),
        (lambda c: c["temperature"].update(datasets=["code-edit", "nope"]), "temperature.datasets[1]: unknown dataset 'nope'"),
        (lambda c: c["temperature"].update(methods=["none"]), "temperature.methods[0]: 'none' is the no-SD baseline"),
        (lambda c: c["temperature"].update(models=["big"]), "temperature.models[0]: unknown model 'big'"),
        (lambda c: c["temperature"].update(temperatures=[0, -0.5]), "temperature.temperatures[1]"),
        (lambda c: c["temperature"].update(temps=[1]), "temperature: Additional properties"),
        (lambda c: c["temperature"].update(datasets=["code-edit-random"]), "temperature.datasets[0]: 'code-edit-random' is a random-token control"),
        (lambda c: c["datasets"]["code-edit"].update(temperature=0.7), "temperature.datasets[0]: 'code-edit' sets its own temperature"),
        (lambda c: c["datasets"].update({"code-edit.t0.5": {**c["datasets"]["code-write"]}}),
         "datasets.code-edit.t0.5: already defined, and not 'code-edit' at temperature 0.5"),
        (lambda c: c["datasets"]["code-write"].update(temperature=-1), "datasets.code-write.temperature"),
    ],
)  # fmt: skip
def test_bad_sweep_names_the_key(mutate, expected: str) -> None:
    bad = copy.deepcopy(RAW)
    mutate(bad)
    with pytest.raises(ConfigError) as err:
        validate_config(bad)
    assert expected in str(err.value)


def test_existing_cells_keep_their_spec_and_greedy_stages() -> None:
    with_sweep, without = validate_config(copy.deepcopy(RAW)), _without_sweep()
    for cell in cells(without):
        assert json.dumps(resolve_cell(with_sweep, cell), sort_keys=True) == json.dumps(
            resolve_cell(without, cell), sort_keys=True
        )
        assert "temperature" not in resolve_cell(with_sweep, cell)["dataset"]
    spec = resolve_cell(with_sweep, Cell("vllm-cpu", "tiny-target", "code-edit.t1.0", "ngram-k3", 1))
    assert spec["dataset"] == {"max_tokens": 128, "num_prompts": 8, "temperature": 1.0}
    assert spec["paired_baseline"]["key"] == "none"
    # Traces, the offline n-gram / BLEU baselines and breakdown stay greedy-only.
    assert trace_targets(with_sweep) == trace_targets(without)
    assert baseline_cells(with_sweep) == baseline_cells(without)
    config = copy.deepcopy(RAW)
    config["breakdown"]["datasets"] = ["code-edit", "code-edit.t1.0"]
    assert breakdown_cells(validate_config(config)) == breakdown_cells(with_sweep)


# ----------------------------------------------------------------------------- seeds


def _spec(temperature: float | None, batch_size: int = 4, method: str = "ngram-k3") -> dict:
    config = validate_config(copy.deepcopy(RAW))
    dataset = "code-edit" if not temperature else sweeps.dataset_key("code-edit", temperature)
    return resolve_cell(config, Cell("vllm-cpu", "tiny-target", dataset, method, batch_size))


def test_request_seeds_are_fixed_and_differ_per_replica() -> None:
    from sdbench.engine.measure.sampling import request_seed

    # Pinned: SHA-256 of [seed, request id, slot], 31 bits (sdbench.engine.measure.sampling).
    assert [request_seed(42, "r1", 0), request_seed(42, "r1", 1), request_seed(7, "r1", 0)] == [
        1369627399, 1295561266, 1739139374]
    replicas = {request_seed(42, "r1", slot) for slot in range(8)}
    assert len(replicas) == 8 and all(0 <= s < 2**31 for s in replicas)
    assert request_seed(42, "r1", 0) not in {request_seed(43, "r1", 0), request_seed(42, "r2", 0)}


def test_sampling_params_greedy_unchanged_and_sampled_arms_share_seeds() -> None:
    import_or_fail("vllm")
    from sdbench.engine.measure.paired import baseline_spec
    from sdbench.engine.measure.sampling import call_sampling_params, request_seed

    greedy = call_sampling_params(_spec(None), ["a", "a", "a", "a"])
    assert not isinstance(greedy, list)  # one object for the call, as before temperatures
    assert (greedy.temperature, greedy.seed, greedy.max_tokens) == (0.0, 42, 128)
    sd = _spec(1.0)
    replicas = call_sampling_params(sd, ["a"] * 4)  # replicate mode: one prompt, 4 slots
    assert [p.temperature for p in replicas] == [1.0] * 4
    assert [p.seed for p in replicas] == [request_seed(42, "a", slot) for slot in range(4)]
    assert len({p.seed for p in replicas}) == 4
    no_sd = call_sampling_params(baseline_spec(sd), ["a"] * 4)  # the paired no-SD arm
    assert [p.seed for p in no_sd] == [p.seed for p in replicas]
    other = call_sampling_params(_spec(1.0, method="eagle3-k3", batch_size=1), ["a"])
    assert other[0].seed == replicas[0].seed  # same slot, other method and batch size: same seed


# ----------------------------------------------------------------------------- analysis


def _cell(dataset: str, method: str, speedup: float, low: float, high: float, acc: float = 2.0) -> dict:
    return {
        "engine": "e", "model": "m", "dataset": dataset, "method": method, "batch_size": 1,
        "sd_method": "ngram" if method != "none" else "none", "mean_acceptance_length": acc,
        "acceptance_rate": (acc - 1) / 3, "output_len_mean": 100.0, "tokens_per_s": 10.0 * speedup,
        "baseline_tokens_per_s": 10.0, "speedup": speedup, "speedup_ci_low": low, "speedup_ci_high": high,
        "speedup_design": "paired", "contaminated": False,
    }  # fmt: skip


POINTS = {"d": ("d", 0.0), "d.t0.5": ("d", 0.5), "d.t1.0": ("d", 1.0)}
SCOPE = {"engine": "e", "models": ["m"], "methods": ["ng", "ea"], "batch_sizes": [1]}


def _cells() -> pd.DataFrame:
    return pd.DataFrame(
        [
            _cell("d", "none", 1.0, float("nan"), float("nan")),
            _cell("d", "ng", 1.5, 1.3, 1.7, 3.0), _cell("d.t0.5", "ng", 1.1, 0.95, 1.2, 2.2),
            _cell("d.t1.0", "ng", 0.8, 0.7, 0.9, 1.4),
            _cell("d", "ea", 1.2, 1.1, 1.3), _cell("d.t0.5", "ea", 1.2, 1.05, 1.3),
            _cell("d.t1.0", "ea", 1.1, 1.02, 1.2),
            _cell("d.t1.0", "other", 0.5, 0.4, 0.6),  # not a method of the sweep
            {**_cell("d.t1.0", "ng", 0.1, 0.1, 0.1), "batch_size": 8},  # outside the sweep's batch sizes
        ]
    )  # fmt: skip


def test_verdicts_and_recommendation_from_hand_made_cells(tmp_path: Path) -> None:
    assert temp.verdict(1.01, 1.2) == "pays" and temp.verdict(0.9, 0.99) == "loses"
    assert temp.verdict(0.99, 1.01) == "break-even" and temp.verdict(float("nan"), 1.0) == "not judged"
    table = temp.temperature_table(_cells(), POINTS, SCOPE)
    assert table[["method", "temperature"]].values.tolist() == [
        ["ea", 0.0], ["ea", 0.5], ["ea", 1.0], ["ng", 0.0], ["ng", 0.5], ["ng", 1.0]
    ]
    assert table["verdict"].tolist() == ["pays", "pays", "pays", "pays", "undecided", "loses"]
    assert set(table["base_dataset"]) == {"d"}
    rec = temp.recommendation_table(table).set_index("method")
    assert rec.loc["ng", "stops_paying_at"] == 0.5 and rec.loc["ng", "verdict"] == "undecided"
    assert rec.loc["ng", "verdicts"] == "0: pays; 0.5: undecided; 1: loses"
    assert pd.isna(rec.loc["ea", "stops_paying_at"]) and rec.loc["ea", "verdict"] == temp.PAYS_EVERYWHERE
    assert (rec["rule"] == temp.RULE).all()
    md = temp.temperature_markdown(table, rec.reset_index())
    assert "| ng | 0.5 | 2.20 | 0.40 | 100.0 | 1.10 [0.95, 1.20] | undecided |" in md
    assert "| e | m | d | ng | 1 | 0.5 (speedup 1.10) | undecided |" in md and temp.RULE in md
    temp.plot_temperature(table, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 5_000
    with pytest.raises(ValueError, match="no cell of the sweep's methods"):
        temp.temperature_table(_cells(), {"x.t1.0": ("x", 1.0)}, SCOPE)
    with pytest.raises(ValueError, match=r"lacks columns \['speedup_ci_high'\]"):
        temp.temperature_table(_cells().drop(columns="speedup_ci_high"), POINTS, SCOPE)


def test_a_point_without_interval_does_not_decide() -> None:
    rows = [_cell("d", "ng", 1.5, 1.3, 1.7), _cell("d.t0.5", "ng", 0.9, float("nan"), float("nan")),
            _cell("d.t1.0", "ng", 0.8, 0.7, 0.9)]  # fmt: skip
    rec = temp.recommendation_table(temp.temperature_table(pd.DataFrame(rows), POINTS, SCOPE))
    assert rec.loc[0, "stops_paying_at"] == 1.0 and rec.loc[0, "verdict"] == "loses"
    assert "0.5: not judged" in rec.loc[0, "verdicts"]


def test_cli_writes_tables_markdown_and_figure(tmp_path: Path) -> None:
    from sdbench.analysis import cli as analysis_cli

    _cells().to_parquet(tmp_path / "cells.parquet")
    parser = argparse.ArgumentParser()
    analysis_cli.add_temperature(parser.add_subparsers(dest="command", required=True))
    out = {name: str(tmp_path / name) for name in ("t.parquet", "r.parquet", "t.md", "t.png")}
    args = parser.parse_args(
        ["temperature", "--cells", str(tmp_path / "cells.parquet"), "--points",
         json.dumps({k: list(v) for k, v in POINTS.items()}), "--scope", json.dumps(SCOPE),
         "--output", out["t.parquet"], "--recommendation", out["r.parquet"], "--markdown", out["t.md"],
         "--figure", out["t.png"]]
    )  # fmt: skip
    assert args.func(args) == 0
    first = Path(out["t.parquet"]).read_bytes()
    assert len(pd.read_parquet(out["t.parquet"])) == 6 and len(pd.read_parquet(out["r.parquet"])) == 2
    assert "Recommendation" in Path(out["t.md"]).read_text()
    assert args.func(args) == 0 and Path(out["t.parquet"]).read_bytes() == first  # deterministic


def test_output_divergence_labels_sampled_cells() -> None:
    from sdbench.analysis.endtoend import output_divergence

    def req(dataset: str, method: str, ids: list[int]) -> dict:
        return {"engine": "e", "model": "m", "dataset": dataset, "method": method, "batch_size": 1,
                "request_id": "r", "slot": 0, "output_token_ids": ids}  # fmt: skip

    requests = pd.DataFrame([req("d", "none", [1, 2]), req("d", "ng", [1, 2]),
                             req("d.t1.0", "none", [5, 6]), req("d.t1.0", "ng", [5, 7])])  # fmt: skip
    keys = ["engine", "model", "dataset", "method", "batch_size"]
    cells_t = requests[keys].assign(temperature=[0.0, 0.0, 1.0, 1.0])
    table = output_divergence(requests, "none", cells_t).set_index(["dataset", "method"])
    assert table.loc[("d", "ng"), "reference"] == "greedy no-SD"
    assert table.loc[("d.t1.0", "ng"), "reference"] == "no-SD sampled at T=1, same seeds"
    assert table.loc[("d.t1.0", "ng"), "share_differs"] == 1.0  # reported, not hidden
    assert "reference" not in output_divergence(requests, "none").columns


# ----------------------------------------------------------------------------- real engine

TINY_MODEL = textwrap.dedent("""
    import sys
    from pathlib import Path
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    sys.path.insert(0, sys.argv[2])
    from support.datasets_tokenizers import save_llama3_like

    out = sys.argv[1]
    tok = AutoTokenizer.from_pretrained(save_llama3_like(Path(out)))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # sharp next-token distributions: at T = 1 sampling mostly, not always, picks the argmax
        model.lm_head.weight.mul_(40.0)
    model.save_pretrained(out)
    """)


@pytest.mark.slow
def test_real_vllm_ngram_cell_at_temperature_one(tmp_path: Path) -> None:
    """One engine group (n-gram k=3, paired no-SD arm) on a tiny random Llama: the same prompts
    greedy and at T = 1.0, batch size 2, two trials. Sampled outputs repeat from trial to trial,
    the two replicas of a prompt differ, and acceptance differs from greedy."""
    import_or_fail("vllm")
    model = tmp_path / "model"
    script = tmp_path / "make_model.py"
    script.write_text(TINY_MODEL)
    subprocess.run([sys.executable, str(script), str(model), str(REPO / "tests")], check=True, timeout=300)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    texts = ["def add(a, b):\n    return a + b\n" * 3, "for i in range(10):\n    print(i)\n" * 3]
    pd.DataFrame(
        {"request_id": ["p0", "p1"], "prompt_token_ids": [tok(t)["input_ids"] for t in texts]}
    ).to_parquet(tmp_path / "prompts.parquet")
    config = yaml.safe_load((REPO / ".test" / "config" / "e2e.yaml").read_text())
    config["run"] = {"warmup_requests": 1, "repeats": 2, "paired_baseline": True}
    config["temperature"] = {"engine": "vllm-cpu", "models": ["tiny-target"], "methods": ["ngram-k3"],
                             "datasets": ["code-edit"], "temperatures": [0, 1.0], "batch_sizes": [2]}  # fmt: skip
    config = validate_config(config)
    specs = [resolve_cell(config, Cell("vllm-cpu", "tiny-target", d, "ngram-k3", 2)) for d in ("code-edit", "code-edit.t1.0")]
    group = {"cells": specs, "prompts": {s["cell"]["dataset"]: str(tmp_path / "prompts.parquet") for s in specs}}
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = tmp_path / "group"
    proc = subprocess.run(
        [sys.executable, "-m", "sdbench.cli", "run-group", "--spec", json.dumps(group), "--model-dir", str(model),
         "--output-dir", str(out), "--quiet-guard", "disabled"],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    greedy, sampled = (pd.read_parquet(out / "ngram-k3" / d / "bs2" / "summary.parquet").iloc[0] for d in ("code-edit", "code-edit.t1.0"))
    assert (greedy["temperature"], sampled["temperature"]) == (0.0, 1.0)
    # Greedy outputs repeat exactly. Sampled SD outputs usually do (fixed seeds) but a near-tie in an
    # acceptance test can flip between trials on this engine (sdbench.engine.measure.sampling): recorded, not asserted.
    assert greedy["outputs_stable"]
    assert sampled["num_trials"] == 2 and sampled["paired_speedup"] > 0
    rate = [s["num_accepted_tokens"] / (s["output_len_mean"] * s["num_sequences"] * s["num_trials"]) for s in (greedy, sampled)]
    assert sampled["num_drafts"] > 0 and rate[0] != rate[1], rate  # the sampled SD arm drafted and verified
    assert greedy["mean_acceptance_length"] != sampled["mean_acceptance_length"]
    requests = expand_outputs(pd.read_parquet(out / "ngram-k3" / "code-edit.t1.0" / "bs2" / "requests.parquet"))
    for _, replicas in requests.groupby("request_id"):  # the two slots of a prompt sample differently
        assert len(replicas) == 2 and list(replicas.output_token_ids.iloc[0]) != list(replicas.output_token_ids.iloc[1])
    greedy_requests = expand_outputs(pd.read_parquet(out / "ngram-k3" / "code-edit" / "bs2" / "requests.parquet"))
    for _, replicas in greedy_requests.groupby("request_id"):
        assert list(replicas.output_token_ids.iloc[0]) == list(replicas.output_token_ids.iloc[1])
    print(f"\n[temperature] outputs_stable at T=1.0: {bool(sampled['outputs_stable'])}; "
          f"accepted per output token: greedy {rate[0]:.3f}, T=1.0 {rate[1]:.3f}; "
          f"mean acceptance length {greedy['mean_acceptance_length']:.2f} / {sampled['mean_acceptance_length']:.2f}")
