"""Every join of the analysis and simulator stages keeps engines and models apart.

The paper grid measures several models (and engines) on one dataset: gsm8k and cnn on four
models, instructcoder and sharegpt on five, llama3.1-8b on instructcoder under two engines. Each
test here gives a join two models (or two engines) on one dataset whose numbers differ, and checks
each row against its own model's, with values written out by hand.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import yaml

MODELS = ("llama3-70b", "qwen3-8b")


# ----------------------------------------------------------------------------- simulator
def _validation_inputs() -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """gsm8k measured and simulated on two models and, for one of them, a second engine."""
    methods = {"none": {"method": "none"}, "ng3": {"method": "ngram", "num_speculative_tokens": 3},
               "e3": {"method": "eagle", "num_speculative_tokens": 3}}  # fmt: skip
    keys = [("vllm-a", "llama3-70b"), ("vllm-a", "qwen3-8b"), ("vllm-b", "qwen3-8b")]
    measured = {("vllm-a", "llama3-70b"): 1.5, ("vllm-a", "qwen3-8b"): 0.8, ("vllm-b", "qwen3-8b"): 1.1}
    cells = pd.DataFrame([
        {"engine": e, "model": m, "dataset": "gsm8k", "method": meth, "batch_size": 8,
         "speedup": measured[(e, m)] * (1.0 if meth == "ng3" else 1.2),
         "speedup_ci_low": measured[(e, m)] * (1.0 if meth == "ng3" else 1.2) - 0.05,
         "speedup_ci_high": measured[(e, m)] * (1.0 if meth == "ng3" else 1.2) + 0.05}
        for e, m in keys for meth in ("ng3", "e3")
    ])  # fmt: skip
    # Each engine x model's own simulation says what that cell measured; the others say otherwise.
    simulated = pd.DataFrame([
        {"engine": e, "model": m, "dataset": "gsm8k", "proposer": p, "drafter": x, "policy": "fixed-3",
         "batch_size": 8, "speedup": measured[(e, m)] * (1.0 if p == "ngram" else 1.2)}
        for e, m in keys for p, x in (("ngram", ""), ("eagle", "eagle"))
    ])  # fmt: skip
    return cells, simulated, methods


def test_simulated_vs_measured_matches_each_cell_to_its_own_engine_and_model() -> None:
    from sdbench.simulator.validation import compare

    cells, simulated, methods = _validation_inputs()
    table = compare(cells, simulated, methods).set_index(["engine", "model", "method"])
    assert len(table) == 6
    # By hand: every cell's own simulation equals its measurement, so each ratio is 1 and agrees.
    assert table.loc[("vllm-a", "qwen3-8b", "ng3"), "simulated_speedup"] == 0.8
    assert table.loc[("vllm-a", "llama3-70b", "ng3"), "simulated_speedup"] == 1.5
    assert table.loc[("vllm-b", "qwen3-8b", "e3"), "simulated_speedup"] == pytest.approx(1.1 * 1.2)
    assert np.allclose(table["ratio"], 1.0) and table["agrees"].astype(bool).all()


def test_simulated_rows_without_engine_and_model_cannot_be_matched() -> None:
    from sdbench.simulator.validation import compare

    cells, simulated, methods = _validation_inputs()
    with pytest.raises(ValueError, match=r"simulated rows lack column\(s\) engine, model"):
        compare(cells, simulated.drop(columns=["engine", "model"]), methods)
    twice = pd.concat([simulated, simulated.iloc[[0]]], ignore_index=True)
    with pytest.raises(ValueError, match="cell vllm-a/llama3-70b/gsm8k/ng3/bs8: 2 simulated rows match it"):
        compare(cells, twice, methods)


def test_the_grid_simulations_are_written_with_their_engine_and_model() -> None:
    """The two rules whose outputs validation reads pass their engine and model to sdbench simulate."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "workflow" / "rules" / "simulator.smk").read_text()
    for rule in ("simulate_cells", "simulate_drafter_cells"):
        body = text.split(f"rule {rule}:", 1)[1].split("\nrule ", 1)[0]
        assert "--engine {wildcards.engine} --model {wildcards.model}" in body, rule


def _paper(breakdown: dict | None = None, shipped: bool = False):
    """config/paper.yaml as the workflow validates it, and its plan: its own breakdown (``shipped``),
    else ``breakdown`` in its place (None: none)."""
    from pathlib import Path

    from sdbench.config import validate_config
    from sdbench.workflow.plan import Plan

    config = yaml.safe_load((Path(__file__).resolve().parents[2] / "config" / "paper.yaml").read_text())
    if not shipped:
        config.pop("breakdown", None)
        if breakdown is not None:
            config["breakdown"] = breakdown
    validate_config(config, source="paper.yaml")
    return Plan(config)


def test_the_paper_plan_simulates_one_engine_and_model_with_its_own_cost_model() -> None:
    """config/paper.yaml traces gsm8k on four models: without a breakdown no cost model of this
    run exists, so nothing is simulated against the measured cells; with one, only the engine x
    model whose steps fitted it is, each file named by engine, model and dataset."""
    from sdbench.config import ConfigError

    plan = _paper()
    gsm8k = sorted((e, m) for e, m, d in plan.validation_targets() if d == "gsm8k")
    assert gsm8k == [("vllm-0.10.1.1", "llama3-70b"), ("vllm-0.10.1.1", "llama3.1-8b"),
                     ("vllm-0.10.1.1", "qwen3-8b"), ("vllm-0.10.1.1", "qwen3-8b-thinking")]  # fmt: skip
    assert plan.sim_cell_files() == [] and plan.item_scopes("ext05_simulated_vs_measured") == []
    breakdown = {"methods": ["none", "ngram-k3", "eagle3-k3"], "datasets": ["gsm8k"], "batch_sizes": [1]}
    with pytest.raises(ConfigError, match=r"breakdown: its cells are of \d+ engine x model pairs"):
        _paper(breakdown)
    with pytest.raises(ConfigError, match="breakdown.engine: unknown engine 'vllm-9'"):
        _paper({**breakdown, "engine": "vllm-9"})
    plan = _paper({**breakdown, "engine": "vllm-0.10.1.1", "models": ["qwen3-8b"]})
    files = plan.sim_cell_files()
    keyed = sorted({tuple(f.split("/")[3:6]) for f in files})
    assert keyed == [("vllm-0.10.1.1", "qwen3-8b", d) for d in ("cnn", "gsm8k", "instructcoder", "sharegpt")]
    assert len(files) == 2 * 4  # n-gram and the EAGLE-3 drafter per dataset
    assert plan.item_scopes("ext05_simulated_vs_measured") == [{}]
    # A breakdown that does not time the drafter a simulation replays is refused before any job
    # (found by the CI slice: its EAGLE-3 simulations failed mid-run on the cost model).
    no_eagle3 = {**breakdown, "engine": "vllm-0.10.1.1", "models": ["qwen3-8b"], "methods": ["none", "ngram-k3"]}
    with pytest.raises(ConfigError, match=r"breakdown.methods: the simulations of vllm-0.10.1.1/qwen3-8b/\w+ replay "
                                          r"the drafter of 'eagle3-k3' \(vLLM method 'eagle3'\)"):
        _paper(no_eagle3)
    # The shipped config's breakdown (Fig. 3a) is Llama3.1-8B's on vLLM 0.10.1.1: only it is simulated.
    shipped = _paper(shipped=True)
    assert sorted({tuple(f.split("/")[3:5]) for f in shipped.sim_cell_files()}) == [("vllm-0.10.1.1", "llama3.1-8b")]


# ----------------------------------------------------------------------------- analysis
def _summaries() -> list[pd.DataFrame]:
    """Two models on one dataset: llama3-70b 100 -> 150 tokens/s with n-gram, qwen3-8b 10 -> 8."""
    tps = {("llama3-70b", "none"): 100.0, ("llama3-70b", "ng3"): 150.0, ("qwen3-8b", "none"): 10.0,
           ("qwen3-8b", "ng3"): 8.0}  # fmt: skip
    return [pd.DataFrame([{"engine": "vllm-a", "model": m, "dataset": "gsm8k", "method": meth, "batch_size": 8,
                           "tokens_per_s": v, "tokens_per_s_pooled": v}])
            for (m, meth), v in tps.items()]  # fmt: skip


def test_speedups_divide_by_the_same_models_no_sd_cell() -> None:
    from sdbench.analysis.endtoend import join_cells

    cells = join_cells(_summaries(), "none").set_index(["model", "method"])
    assert cells.loc[("llama3-70b", "ng3"), "speedup"] == pytest.approx(1.5, rel=1e-12)
    assert cells.loc[("qwen3-8b", "ng3"), "speedup"] == pytest.approx(0.8, rel=1e-12)
    assert cells.loc[("qwen3-8b", "ng3"), "baseline_tokens_per_s"] == 10.0


def test_output_divergence_compares_with_the_same_models_reference() -> None:
    from sdbench.analysis.endtoend import output_divergence

    outputs = {"llama3-70b": [1, 2, 3], "qwen3-8b": [7, 8, 9]}  # the models decode differently
    requests = pd.DataFrame([
        {"engine": "vllm-a", "model": m, "dataset": "gsm8k", "method": meth, "batch_size": 1, "slot": 0,
         "request_id": "r0", "output_token_ids": out}
        for m, out in outputs.items() for meth in ("none", "ng3")
    ])  # fmt: skip
    table = output_divergence(requests, "none")
    assert table["share_differs"].tolist() == [0.0, 0.0, 0.0, 0.0]  # each SD output equals its own no-SD one


def test_cost_divides_each_models_no_sd_cost_by_its_own_speedup() -> None:
    from sdbench.analysis.cost import cost_table

    cells = pd.DataFrame([
        {"engine": "vllm-a", "model": m, "dataset": "gsm8k", "method": meth, "sd_method": sd, "batch_size": 1,
         "tokens_per_s": base, "tokens_per_s_ci_low": base, "tokens_per_s_ci_high": base, "output_len_mean": 100.0,
         "speedup": sp, "speedup_ci_low": sp, "speedup_ci_high": sp}
        for m, base, sp in (("llama3-70b", 1000.0, 2.0), ("qwen3-8b", 100.0, 0.5))
        for meth, sd in (("none", "none"), ("ng3", "ngram"))
    ])  # fmt: skip
    table = cost_table(cells, {"vllm-a": 3.6}, {}, "USD").set_index(["model", "method"])
    # 3.6 per hour = 1e-3 per second; 1e6 tokens at T tokens/s cost 1e3 / T.
    assert table.loc[("llama3-70b", "none"), "cost_per_1m_tokens"] == pytest.approx(1.0)
    assert table.loc[("llama3-70b", "ng3"), "cost_per_1m_tokens"] == pytest.approx(0.5)  # 2000 tokens/s
    assert table.loc[("qwen3-8b", "ng3"), "cost_per_1m_tokens"] == pytest.approx(20.0)  # 50 tokens/s


def test_proposal_length_takes_each_models_memory_and_no_sd_cell() -> None:
    from sdbench.analysis.proposal import proposal_length_table

    keys = ["engine", "model", "dataset", "method", "batch_size"]
    rows, memory = [], []
    for m, static in (("llama3-70b", 140.0), ("qwen3-8b", 16.0)):
        for meth, sd, extra in (("none", "none", 0.0), ("ng3.k1", "ngram", 0.0), ("e3.k2", "eagle", 1.5)):
            rows.append({"engine": "vllm-a", "model": m, "dataset": "gsm8k", "method": meth, "sd_method": sd,
                         "batch_size": 4, "mean_acceptance_length": 2.0, "acceptance_rate": 0.5,
                         "speedup": 1.0 if sd == "none" else (1.3 if m == "qwen3-8b" else 1.1)})  # fmt: skip
            memory.append({"engine": "vllm-a", "model": m, "dataset": "gsm8k", "method": meth, "batch_size": 4,
                           "analytical_static_gib": static + extra, "analytical_per_token_kib": static,
                           "peak_memory_gib": static * 2})  # fmt: skip
    points = {"ng3.k1": ("ng3", 1), "e3.k2": ("e3", 2)}
    scope = {"engine": "vllm-a", "models": list(MODELS), "datasets": ["gsm8k"], "batch_sizes": [4]}
    table = proposal_length_table(pd.DataFrame(rows), pd.DataFrame(memory), points, scope)
    got = table.set_index(["model", "method"])
    assert got.loc[("qwen3-8b", "e3.k2"), "extra_static_gib"] == pytest.approx(1.5)  # 17.5 - 16, not 17.5 - 140
    assert got.loc[("llama3-70b", "e3.k2"), "extra_static_gib"] == pytest.approx(1.5)
    # 4 sequences x k=2 x 16 KiB per token, in GiB.
    assert got.loc[("qwen3-8b", "e3.k2"), "draft_kv_gib"] == pytest.approx(4 * 2 * 16.0 / 2**20)
    assert got.loc[("qwen3-8b", "ng3.k1"), "speedup"] == 1.3 and got.loc[("llama3-70b", "ng3.k1"), "speedup"] == 1.1
    assert set(keys) - {"method"} <= set(table.columns)


def test_random_inputs_pair_each_models_random_and_real_cells() -> None:
    from sdbench.analysis.randominputs import random_vs_real

    rows = []
    for m, real, rnd in (("llama3-70b", 2.0, 1.0), ("qwen3-8b", 1.5, 0.5)):
        for dataset, sp in (("sharegpt", real), ("sharegpt-random", rnd)):
            rows.append({"engine": "vllm-a", "model": m, "dataset": dataset, "method": "ng3", "sd_method": "ngram",
                         "batch_size": 1, "mean_acceptance_length": sp, "speedup": sp, "speedup_ci_low": sp,
                         "speedup_ci_high": sp, "tokens_per_s": sp, "output_len_mean": 10.0})  # fmt: skip
    table = random_vs_real(pd.DataFrame(rows), {"sharegpt-random": "sharegpt"}).set_index("model")
    assert table.loc["llama3-70b", "speedup_ratio"] == 0.5 and table.loc["qwen3-8b", "speedup_ratio"] == 1 / 3


def test_server_verdict_divides_by_the_same_models_no_sd_rounds() -> None:
    from sdbench.analysis.verdict import server_points

    rows = []
    for m, base, sd in (("llama3-70b", 100.0, 150.0), ("qwen3-8b", 10.0, 8.0)):
        for meth, sd_method, tps in (("none", "none", base), ("ng3", "ngram", sd)):
            rows.append({"engine": "vllm-a", "model": m, "dataset": "gsm8k", "method": meth, "sd_method": sd_method,
                         "concurrency": 4, "tokens_per_s": tps, "tokens_per_s_min": tps * 0.9,
                         "tokens_per_s_max": tps * 1.1, "mean_acceptance_length": 2.0})  # fmt: skip
    points = server_points(pd.DataFrame(rows)).set_index("model")
    assert points.loc["llama3-70b", "speedup"] == 1.5 and points.loc["qwen3-8b", "speedup"] == 0.8
    # Range over rounds: SD's min over no SD's max.
    assert points.loc["qwen3-8b", "speedup_min"] == pytest.approx(8.0 * 0.9 / (10.0 * 1.1))


def test_measured_bleu_speedups_refuse_two_models_at_once() -> None:
    from sdbench.analysis.bleu import _paired_arm, measured_bucket_speedups

    calls = pd.DataFrame([
        {"engine": "vllm-a", "model": m, "dataset": "gsm8k", "method": "ng3", "batch_size": 1, "engine_start": 0,
         "trial": 0, "call_index": 0, "request_id": "r0", "tokens_per_s": tps}
        for m, tps in (("llama3-70b", 150.0), ("qwen3-8b", 8.0))
    ])  # fmt: skip
    base = calls.assign(method="none", tokens_per_s=[100.0, 10.0])
    # The paired arm of each model's call is that model's no-SD call (the rows in reverse order).
    aligned = _paired_arm(calls, base.iloc[::-1], "ng3")
    assert aligned["tokens_per_s"].tolist() == [100.0, 10.0]
    buckets = pd.DataFrame({"request_id": ["r0"], "bleu_order": 4, "bleu": 0.1, "bucket": ["0-20"]})
    with pytest.raises(ValueError, match="one engine x model x dataset at a time, got 2"):
        measured_bucket_speedups(calls, buckets, "none", "ng3", "e3")


def test_category_acceptance_keeps_each_models_sequences_apart() -> None:
    from sdbench.analysis.categories import category_acceptance

    requests = pd.DataFrame([
        {"engine": "vllm-a", "model": m, "dataset": "speed", "method": "e3", "batch_size": 1, "request_id": rid,
         "sd_num_steps": 10, "sd_num_draft_tokens": 30, "sd_num_accepted_tokens": acc}
        for m, acc in (("llama3-70b", 20), ("qwen3-8b", 5)) for rid in ("r0", "r1")
    ])  # fmt: skip
    prompts = pd.DataFrame({"dataset": "speed", "request_id": ["r0", "r1"], "category": ["code", "math"]})
    table = category_acceptance(requests, prompts, resamples=10).set_index(["model", "category"])
    assert len(table) == 4
    assert table.loc[("llama3-70b", "code"), "mean_acceptance_length"] == 3.0  # 1 + 20 / 10
    assert table.loc[("qwen3-8b", "math"), "mean_acceptance_length"] == 1.5  # 1 + 5 / 10


def test_the_forced_gap_reads_each_models_own_cell() -> None:
    from sdbench.analysis.forced import gap_table

    forced, cells = [], []
    for m, measured, tau in (("llama3-70b", 1.8, 3.0), ("qwen3-8b", 0.9, 2.0)):
        for length, sp in ((1.0, 0.5), (4.0, 2.5)):
            forced.append({"engine": "vllm-a", "model": m, "dataset": "gsm8k", "base_method": "e3", "batch_size": 1,
                           "method": f"e3.a{length:g}", "sd_method": "eagle", "num_speculative_tokens": 3,
                           "forced_acceptance_length": length, "mean_acceptance_length": length, "speedup": sp,
                           "speedup_ci_low": sp - 0.1, "speedup_ci_high": sp + 0.1})  # fmt: skip
        cells.append({"engine": "vllm-a", "model": m, "dataset": "gsm8k", "method": "e3", "batch_size": 1,
                      "sweep": "", "mean_acceptance_length": tau, "speedup": measured, "speedup_ci_low": measured,
                      "speedup_ci_high": measured})  # fmt: skip
    gap = gap_table(pd.DataFrame(forced), pd.DataFrame(cells)).set_index("model")
    assert gap.loc["qwen3-8b", "measured_speedup"] == 0.9 and gap.loc["llama3-70b", "measured_speedup"] == 1.8
    # At tau on the line through (1, 0.5) and (4, 2.5): 0.5 + (tau - 1) * 2 / 3.
    assert gap.loc["qwen3-8b", "at_real_speedup"] == pytest.approx(0.5 + 2 / 3)
    assert gap.loc["llama3-70b", "at_real_speedup"] == pytest.approx(0.5 + 4 / 3)


def test_the_forced_check_summary_counts_each_model_apart() -> None:
    from sdbench.simulator.costmodel import load_cost_model
    from sdbench.simulator.forcedcheck import check_markdown

    cm = load_cost_model("llama3.1-8b-h100")
    table = pd.DataFrame([
        {"engine": "vllm-a", "model": m, "dataset": "gsm8k", "base_method": "e3", "method": "e3.a4",
         "sd_method": "eagle", "batch_size": 1, "forced_acceptance_length": 4.0, "mean_acceptance_length": 4.0,
         "speedup": 2.0, "speedup_ci_low": 1.9, "speedup_ci_high": 2.1, "predicted": pred, "error": pred / 2 - 1,
         "inside": 1.9 <= pred <= 2.1, "predicted_refit": 2.0, "error_refit": 0.0, "inside_refit": True}
        for m, pred in (("llama3-70b", 2.0), ("qwen3-8b", 3.0))
    ])  # fmt: skip
    text = check_markdown(table, cm, cm, {})
    assert "| llama3-70b (vllm-a) | e3 | 1 | 1 of 1 |" in text
    assert "| qwen3-8b (vllm-a) | e3 | 1 | 0 of 1 |" in text


def test_run_versus_run_compares_each_models_cell_with_its_own() -> None:
    from sdbench.analysis.runcompare import compare

    def run(shift: float) -> pd.DataFrame:
        return pd.DataFrame([
            {"engine": "vllm-a", "model": m, "dataset": "gsm8k", "method": "ng3", "batch_size": 1, "speedup": sp + shift,
             "speedup_ci_low": sp + shift - 0.05, "speedup_ci_high": sp + shift + 0.05, "tokens_per_s": 10 * sp,
             "tokens_per_s_ci_low": 10 * sp - 1, "tokens_per_s_ci_high": 10 * sp + 1, "mean_acceptance_length": 2.0}
            for m, sp in (("llama3-70b", 1.5), ("qwen3-8b", 0.8))
        ])  # fmt: skip

    table = compare(run(0.0), run(0.0).iloc[::-1]).set_index("model")
    assert table.loc["qwen3-8b", "speedup_b"] == 0.8 and (table["verdict"] == "inside").all()


def test_temperature_recommendation_is_per_model() -> None:
    from sdbench.analysis.temperature import recommendation_table, temperature_table

    rows = []
    for m, speedups in (("llama3-70b", (1.5, 1.2)), ("qwen3-8b", (1.2, 0.7))):
        for (dataset, t), sp in zip((("gsm8k", 0.0), ("gsm8k.t1", 1.0)), speedups):
            rows.append({"engine": "vllm-a", "model": m, "dataset": dataset, "method": "ng3", "batch_size": 1,
                         "mean_acceptance_length": 2.0, "acceptance_rate": 0.5, "output_len_mean": 10.0,
                         "tokens_per_s": 1.0, "baseline_tokens_per_s": 1.0, "speedup": sp,
                         "speedup_ci_low": sp - 0.1, "speedup_ci_high": sp + 0.1})  # fmt: skip
    points = {"gsm8k": ("gsm8k", 0.0), "gsm8k.t1": ("gsm8k", 1.0)}
    scope = {"engine": "vllm-a", "models": list(MODELS), "methods": ["ng3"], "batch_sizes": [1]}
    rec = recommendation_table(temperature_table(pd.DataFrame(rows), points, scope)).set_index("model")
    assert math.isnan(rec.loc["llama3-70b", "stops_paying_at"]) and rec.loc["qwen3-8b", "stops_paying_at"] == 1.0


def test_the_grid_acceptance_tables_name_engine_model_and_dataset() -> None:
    """Tab. 4 / Fig. 6 of the grid's traces: one label per engine x model x dataset (the paper
    grid traces llama3.1-8b on instructcoder under two engines)."""
    from pathlib import Path

    from sdbench.config import load_config
    from sdbench.workflow.plan import Plan

    plan = Plan(load_config(str(Path(__file__).resolve().parents[2] / "config" / "paper.yaml")))
    labels, traces = plan.acceptance_labels("grid"), plan.acceptance_traces("grid")
    assert len(labels) == len(traces)
    for label, trace in zip(labels, traces):
        assert trace.split("/")[2:5] == label.split("/"), (label, trace)
    by_label: dict[str, list[str]] = {}
    for label, trace in zip(labels, traces):
        by_label.setdefault(label, []).append(trace.split("/")[5])
    assert all(len(set(methods)) == len(methods) for methods in by_label.values())  # one trace per label x method
    assert {"vllm-0.10.1.1/llama3.1-8b/instructcoder", "vllm-0.11.1/llama3.1-8b/instructcoder"} <= set(labels)


def test_fig3_and_the_cost_model_refuse_two_models_steps() -> None:
    from sdbench.analysis.breakdown import breakdown_table
    from sdbench.simulator.costmodel import one_target

    steps = pd.DataFrame([
        {"engine": "vllm-a", "model": m, "method": "none", "batch_size": 1, "step_s": s, "propose_s": 0.0,
         "verify_s": s / 2, "sample_s": 0.0}
        for m, s in (("llama3-70b", 1.0), ("qwen3-8b", 0.1))
    ])  # fmt: skip
    table = breakdown_table(steps).set_index("model")
    assert table.loc["qwen3-8b", "total_s"] == 0.1 and table.loc["llama3-70b", "total_s"] == 1.0
    with pytest.raises(ValueError, match="steps of 2 engine x model pairs"):
        one_target(steps)
