"""End to end: the real Snakemake workflow with real vLLM (CPU) on a reduced grid.

One module-scoped run builds tiny models, prepares prompts, runs 29 cells and
aggregates; the tests then check the outputs and Snakemake's rerun behaviour.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sdbench.requesttable import expand_outputs
from tests.support.drawncheck import verdict_rule

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow

REDUCED = yaml.safe_load((REPO / ".test" / "config" / "e2e.yaml").read_text())


def snakemake(workdir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the repository's workflow in ``workdir`` with its config/config.yaml."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **(env or {})}
    cmd = [str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--cores", "2", *args]
    return subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=1800)


def write_config(workdir: Path, config: dict) -> None:
    (workdir / "config").mkdir(exist_ok=True)
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def planned_jobs(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    """Job counts from a dry run's "Job stats" table ({} when nothing is to be done)."""
    jobs: dict[str, int] = {}
    block = result.stdout.split("Job stats:", 1)
    if len(block) < 2:
        return jobs
    for line in block[1].splitlines()[3:]:
        match = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not match:
            break
        jobs[match.group(1)] = int(match.group(2))
    jobs.pop("total", None)
    return jobs


def planned_outputs(result: subprocess.CompletedProcess[str], rule: str) -> list[str]:
    """The ``output:`` line of every planned job of ``rule`` in a dry run."""
    outputs, in_rule = [], False
    for line in result.stdout.splitlines():
        if line.startswith("rule ") or line.startswith("localrule "):
            in_rule = line.split()[1].rstrip(":") == rule
        elif in_rule and line.strip().startswith("output:"):
            outputs.append(line.strip())
    return outputs


def reduced_plan() -> tuple[dict, object]:
    """The fixture's config as the workflow validates it, and its plan (the rules' params)."""
    from sdbench.config import validate_config
    from sdbench.workflow.plan import Plan

    config = yaml.safe_load(yaml.safe_dump(REDUCED))
    validate_config(config, source="config")
    return config, Plan(config)


def as_param(value: object) -> object:
    """A rule's params payload as its command reads it (JSON on the shell line, sdbench.workflow.plan.quoted)."""
    return json.loads(json.dumps(value, sort_keys=True))


def cell_table(pipeline: Path, cell: object, name: str) -> pd.DataFrame:
    from sdbench.workflow import paths as P

    keys = {k: getattr(cell, k) for k in ("engine", "model", "dataset", "method", "batch_size")}
    return pd.read_parquet(pipeline / P.CELL_TABLE.format(**keys, name=name))


def assert_same_table(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    """Equal tables: the same columns, rows and values (floats to 1e-12 relative). A written table's
    ``measured`` column, which the command stamps (sdbench.provenance), says a measurement."""
    if "measured" in got and "measured" not in expected:
        assert got["measured"].all(), "a measured run's table says rehearsal"
        got = got.drop(columns="measured")
    pd.testing.assert_frame_equal(
        got.reset_index(drop=True), expected.reset_index(drop=True), check_dtype=False, rtol=1e-12, atol=0
    )


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("pipeline")
    write_config(workdir, REDUCED)
    result = snakemake(workdir)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-6000:]
    return workdir


def test_outputs_are_complete(pipeline: Path) -> None:
    cells = pd.read_parquet(pipeline / "results/tables/cells.parquet")
    # 22 + the proposal-length sweep's n-gram k=1 cell + 2 random-token cells + 2 cells at T = 1.0
    assert len(cells) == 29
    assert set(cells["method"]) == {"none", "ngram-k3", "ngram-k3.k1", "draft-k3", "eagle-k3", "eagle3-k3", "mtp-k3",
                                    "eagle3-k3.a1", "eagle3-k3.a4"}  # fmt: skip
    assert (cells.loc[cells.method == "none", "speedup"] == 1.0).all()
    sd = cells[cells.method != "none"]
    # Every throughput and paired speedup, recomputed by hand from the cell's own calls and its
    # paired no-SD arm's (same processes, engine starts and trials): per prompt (call) the median
    # over its trials of every start, then the mean over prompts.
    def point_estimate(calls: pd.DataFrame) -> float:
        return float(calls.groupby("call_index")["tokens_per_s"].median().mean())

    for cell in cells.itertuples():
        calls, base_calls = cell_table(pipeline, cell, "calls"), cell_table(pipeline, cell, "baseline_calls")
        assert cell.tokens_per_s == pytest.approx(point_estimate(calls), rel=1e-12), cell
        if cell.method == "none":
            assert base_calls.empty
            continue
        assert cell.paired_baseline_tokens_per_s == pytest.approx(point_estimate(base_calls), rel=1e-12), cell
        assert cell.speedup == pytest.approx(cell.paired_speedup, rel=1e-12) and cell.paired_speedup == pytest.approx(
            point_estimate(calls) / point_estimate(base_calls), rel=1e-12
        ), cell
    # Real SD counters from the engine: drafts happened and acceptance is a sane length.
    assert (sd.loc[sd.method.isin(["draft-k3", "eagle-k3", "eagle3-k3", "mtp-k3"]), "num_drafts"] > 0).all()
    # An acceptance length exactly where drafts were made (NaN only without any draft).
    assert (sd["mean_acceptance_length"].isna() == (sd["num_drafts"] == 0)).all()
    assert sd["mean_acceptance_length"].dropna().between(1.0, 4.0).all()
    assert (pipeline / "results/paper/fig01_end_to_end.png").stat().st_size > 10_000
    # Two trials, and a third because no cell met the 1e-9 half-width target
    # (max_repeats 3): every throughput has a 95% interval around it; the speedup, taken over engine
    # starts (sdbench.analysis.intervals), has none with one start (tests/engine/test_enginestarts.py: two).
    assert (cells["num_trials"] == 3).all() and (cells["num_engine_starts"] == 1).all()
    assert (sd["speedup_replicates"] == 1).all() and sd[["speedup_ci_low", "speedup_ci_high"]].isna().all().all()
    # Greedy outputs repeat exactly; a sampled SD cell may not (sdbench.engine.measure.sampling).
    assert cells.loc[cells["temperature"] == 0, "outputs_stable"].all()  # forced at 1 and k + 1: no draw decides
    assert (cells["tokens_per_s_ci_low"] <= cells["tokens_per_s"]).all()
    assert (cells["tokens_per_s"] <= cells["tokens_per_s_ci_high"]).all()
    assert {"contaminated", "contamination", "guard_load_max"} <= set(cells.columns)
    calls = pd.read_parquet(pipeline / "results/runs/vllm-cpu/tiny-target/code-edit/none/bs1/calls.parquet")
    # 1 engine start x 3 trials x 2 prompts (two starts: tests/engine/test_enginestarts.py)
    assert sorted(set(calls["trial"])) == [0, 1, 2] and len(calls) == 6
    assert "engine_start" not in calls  # one start: merged starts carry the column
    # Paired no-SD arm: every SD cell's calls were also timed on a no-SD engine in its process.
    assert (sd["speedup_design"] == "paired").all()
    base_calls = pd.read_parquet(
        pipeline / "results/runs/vllm-cpu/tiny-target/code-edit/ngram-k3/bs1/baseline_calls.parquet"
    )
    assert len(base_calls) == 6 and set(base_calls["method"]) == {"none"}
    assert "±" in (pipeline / "results/paper/tab01_generation_length.md").read_text()
    assert "paired" in (pipeline / "results/paper/ext01_speedups.md").read_text()
    requests = pd.read_parquet(
        pipeline / "results/runs/vllm-cpu/tiny-target/code-edit/draft-k3/bs2/requests.parquet"
    )
    assert len(requests) == 2 * 2  # 2 prompts, each replicated batch-size times
    assert "prompt_token_ids" not in requests  # named by request_id in the prompt table
    assert expand_outputs(requests)["output_token_ids"].map(len).between(1, 16).all()


def test_learned_drafters_keep_greedy_outputs_and_report_per_request_counters(pipeline: Path) -> None:
    """Every request of every EAGLE / EAGLE-3 / draft-model cell decodes exactly as no SD does."""
    runs = pipeline / "results/runs/vllm-cpu/tiny-target"
    compared = 0
    for dataset in ("code-edit", "code-write"):
        for bs in (1, 2):
            baseline = expand_outputs(pd.read_parquet(runs / dataset / "none" / f"bs{bs}" / "requests.parquet"))
            assert baseline["sd_num_steps"].isna().all()
            for method in ("eagle-k3", "eagle3-k3", "draft-k3"):
                requests = expand_outputs(pd.read_parquet(runs / dataset / method / f"bs{bs}" / "requests.parquet"))
                assert [list(x) for x in requests.output_token_ids] == [list(x) for x in baseline.output_token_ids]
                # The engine's per-request counters add up to the cell's aggregate counters' scale.
                assert (requests["sd_num_steps"] > 0).all()
                assert requests["sd_mean_acceptance_length"].between(1.0, 4.0).all()
                assert (requests["sd_num_accepted_tokens"] <= requests["sd_num_draft_tokens"]).all()
                compared += len(requests)
    assert compared == 3 * 2 * (2 + 4)
    head = pipeline / "results/models/built/tiny-target-eagle3"
    info = json.loads((head / "training.json").read_text())
    assert info["kind"] == "eagle3" and len(info["heldout_top1_agreement_per_step"]) == 2


def test_mtp_runs_on_the_targets_mimo_form_with_greedy_outputs_unchanged(pipeline: Path) -> None:
    """The MTP cell decodes exactly as its model's no-SD cell, which decodes as the Llama target does."""
    runs = pipeline / "results/runs/vllm-cpu"
    llama = pd.read_parquet(runs / "tiny-target/code-edit/none/bs1/requests.parquet")
    mimo = pd.read_parquet(runs / "tiny-target-mtp/code-edit/none/bs1/requests.parquet")
    mtp = pd.read_parquet(runs / "tiny-target-mtp/code-edit/mtp-k3/bs1/requests.parquet")
    outputs = [list(x) for x in llama.output_token_ids]
    assert [list(x) for x in mimo.output_token_ids] == outputs
    assert [list(x) for x in mtp.output_token_ids] == outputs
    assert (mtp["sd_num_steps"] > 0).all() and mtp["sd_mean_acceptance_length"].between(1.0, 4.0).all()
    info = json.loads((pipeline / "results/models/built/tiny-target-mtp/training.json").read_text())
    assert info["kind"] == "mtp" and info["vllm_method"] == "mtp"
    assert info["mimo_max_logit_difference"] < 1e-3
    trace = pd.read_parquet(pipeline / "results/traces/vllm-cpu/tiny-target-mtp/code-edit/mtp-k3/engine_trace.parquet")
    assert set(trace.method) == {"mtp"} and trace.acc_len.between(1, 21).all()
    memory = pd.read_parquet(pipeline / "results/tables/memory.parquet")
    row = memory[(memory.model == "tiny-target-mtp") & (memory.method == "mtp-k3")]
    assert len(row) == 1 and (row["analytical_static_gib"] > 0).all()


def test_in_engine_ngram_trace_equals_offline_trace(pipeline: Path) -> None:
    from sdbench.traces.ngram import trace_ngram

    base = pipeline / "results/traces/vllm-cpu/tiny-target"
    for dataset in ("code-edit", "code-write"):
        engine = pd.read_parquet(base / dataset / "ngram-k3" / "engine_trace.parquet")
        requests = pd.read_parquet(base / dataset / "ngram-k3" / "engine_requests.parquet")
        baseline = pd.read_parquet(
            pipeline / f"results/runs/vllm-cpu/tiny-target/{dataset}/none/bs1/requests.parquet"
        )
        # One committed token per step: the traced run's output is plain greedy decoding.
        assert [list(x) for x in requests.output_token_ids] == [list(x) for x in baseline.output_token_ids]
        compared = 0
        for req in requests.itertuples():
            offline = trace_ngram(list(req.prompt_token_ids), list(req.output_token_ids), 20, 3, 7)
            got = engine[engine.request_id == req.request_id].sort_values("position")
            assert list(got.position) == list(range(len(req.output_token_ids)))
            exact = ~offline.censored
            assert list(got.acc_len.to_numpy()[exact]) == list(offline.acc_len[exact])
            assert list(got.proposed_len.to_numpy()[exact]) == list(offline.proposed_len[exact])
            # Past the recorded output the engine can only have matched more.
            assert (got.acc_len.to_numpy()[~exact] >= offline.acc_len[~exact]).all()
            compared += int(exact.sum())
        assert compared > 0
    draft = pd.read_parquet(base / "code-edit" / "draft-k3" / "engine_trace.parquet")
    assert set(draft.method) == {"draft_model"}
    learned = pd.read_parquet(base / "code-edit" / "eagle-k3" / "engine_trace.parquet")
    assert set(learned.method) == {"eagle"} and learned.acc_len.between(1, 21).all()
    assert draft.acc_len.between(1, 21).all() and (draft.proposed_len.dropna() <= 20).all()
    # The figure index: every acceptance item of the grid's traces, one file each.
    paper = pipeline / "results/paper"
    assert (paper / "tab04_generated_length/grid.md").exists()
    assert (paper / "fig06_request_acceptance/grid.png").exists()
    for dataset in ("code-edit", "code-write"):
        scope = f"vllm-cpu/tiny-target/{dataset}.png"
        for item in ("fig04_acceptance_heatmap", "fig05_position_deciles", "fig10_ngram_minus_eagle"):
            assert (paper / item / scope).stat().st_size > 1000, (item, scope)


def test_breakdown_memory_bleu_and_simulator_validation(pipeline: Path) -> None:
    breakdown = pd.read_parquet(pipeline / "results/tables/breakdown.parquet")
    fractions = breakdown[["propose_frac", "verify_frac", "sample_frac", "other_frac"]].sum(axis=1)
    assert len(breakdown) == 5 and ((fractions - 1.0).abs() < 1e-6).all(), breakdown
    assert (pipeline / "results/cost_models/measured.yaml").exists()
    validation = pd.read_parquet(pipeline / "results/tables/simulated_vs_measured.parquet")
    # datasets x batch sizes x (n-gram k=3 and each traced drafter, judged on its own trace), and
    # the proposal-length sweep's n-gram k=1 (code-edit, bs 1); sampled cells are not simulated.
    traced = {"ngram-k3", "draft-k3", "eagle-k3", "eagle3-k3"}
    assert len(validation) == 2 * 2 * 4 + 1 and set(validation["method"]) == traced | {"ngram-k3.k1"}
    assert dict(zip(validation["method"], validation["drafter"])) == {
        "ngram-k3": "", "draft-k3": "draft_model", "eagle-k3": "eagle", "eagle3-k3": "eagle3", "ngram-k3.k1": ""
    }
    # Each row's simulated speedup read by hand from its own engine x model x dataset's simulation
    # (the file's path names them, and so do its engine/model columns) at the cell's proposer, fixed
    # draft length, drafter and batch size; `agrees` from its definition: inside the measured interval.
    config, plan = reduced_plan()
    cells = pd.read_parquet(pipeline / "results/tables/cells.parquet")
    for row in validation.itertuples():
        method = config["methods"][row.method]
        folder = pipeline / "results/simulator/cells" / row.engine / row.model / row.dataset
        path = folder / "ngram.csv" if method["method"] == "ngram" else folder / "drafters" / f"{row.method}.csv"
        sim = pd.read_csv(path)
        assert set(sim["engine"]) == {row.engine} and set(sim["model"]) == {row.model}, path
        at = sim[(sim["policy"] == f"fixed-{method['num_speculative_tokens']}") & (sim["batch_size"] == row.batch_size)]
        assert len(at) == 1 and row.simulated_speedup == at["speedup"].iloc[0], (row, at)
        assert row.drafter == ("" if method["method"] == "ngram" else method["method"]) or pd.isna(row.drafter), row
    measured = validation.merge(cells, on=["engine", "model", "dataset", "method", "batch_size"], validate="one_to_one")
    assert (validation["measured_speedup"] == measured["speedup"]).all()
    inside = (measured["speedup_ci_low"] <= validation["simulated_speedup"]) & (
        validation["simulated_speedup"] <= measured["speedup_ci_high"]
    )
    # One engine start: no interval over starts, so agreement is not judged (NaN), never true or false.
    assert validation["agrees"].isna().all() and not inside.any()
    memory = pd.read_parquet(pipeline / "results/tables/memory.parquet")
    # The KV cache is what the config asked for (kv_cache_memory_bytes: 256 MiB), per engine, read
    # from the workers (sdbench.engine.release.workerprobe); the weights the config implies are what loaded.
    # Whole blocks: what fits in the 256 MiB, at most one block short (0.24994 GiB with a drafter's layers).
    assert memory["measured_kv_cache_gib"].between(0.25 * (1 - 1e-3), 0.25).all(), memory["measured_kv_cache_gib"].unique()
    none = memory[memory["method"] == "none"]
    # The engine's own modules counted (sdbench.engine.release.workerprobe): the config's count exactly (the
    # vocabulary, 2048, needs no padding to a multiple of 64).
    assert (none["measured_weights_gib"] == none["analytical_static_gib"]).all(), none
    assert_fig8_measured_is_paired(pipeline)
    for item in ("fig09_fixed_vs_oracle", "fig11_oracle_combine"):
        assert (pipeline / "results/paper" / item / "vllm-cpu/tiny-target/code-write.png").exists()
    # Forced acceptance on the real engine: nothing accepted is exactly 1 token per step, every
    # draft accepted exactly k + 1 (EAGLE-3 always drafts k); both arms ran to max_tokens.
    forced = pd.read_parquet(pipeline / "results/tables/forced_acceptance.parquet").set_index("method")
    assert forced.loc["eagle3-k3.a1", "mean_acceptance_length"] == 1.0
    assert forced.loc["eagle3-k3.a4", "mean_acceptance_length"] == 4.0
    assert (forced["output_len_mean"] == REDUCED["datasets"]["code-edit"]["max_tokens"]).all()
    gap = pd.read_parquet(pipeline / "results/tables/sd_gap.parquet")
    assert len(gap) == 1 and gap["ceiling_speedup"].iloc[0] == forced.loc["eagle3-k3.a4", "speedup"]
    assert (pipeline / "results/cost_models/forced.yaml").exists()
    check = pd.read_parquet(pipeline / "results/simulator/forced_check.parquet")
    assert len(check) == 2 and check["predicted_refit"].gt(0).all()
    divergence = pd.read_parquet(pipeline / "results/tables/output_divergence.parquet")
    assert len(divergence) == 27 and divergence["share_differs"].between(0, 1).all()
    assert set(divergence.loc[divergence.dataset == "code-edit.t1.0", "reference"]) == {"no-SD sampled at T=1, same seeds"}
    adaptive = pd.read_csv(pipeline / "results/simulator/adaptive/vllm-cpu/tiny-target.csv")
    assert (pipeline / "results/paper/ext04_adaptive_policies/vllm-cpu/tiny-target.md").exists()
    assert set(adaptive["dataset"]) == {"code-edit", "code-write"} and set(adaptive["batch_size"]) == {1, 2}
    # No bound against oracle-combine here: it picks the drafter accepting more tokens, which is
    # not the faster one when the drafter costs more than the target's own step (tiny CPU models).
    # The ratios from the columns they divide (the CSV keeps 6 decimals: 1e-5 relative).
    vs_best = (adaptive["speedup"] / adaptive["best_fixed"]).rename("vs_best_fixed").to_frame()
    pd.testing.assert_frame_equal(adaptive[["vs_best_fixed"]], vs_best, rtol=1e-5, atol=0)
    # gap_closed is defined where oracle-combine beats the best fixed policy (sdbench.simulator.reports),
    # NaN elsewhere. On these tiny CPU models it is mostly equal or below (learned drafters cost more
    # than they save); where it is above, it is by a hair (0.024 in a run of 2026-11-29).
    has_gap = adaptive["oracle_combine"] > adaptive["best_fixed"]
    gap = adaptive[has_gap]
    den = gap["oracle_combine"] - gap["best_fixed"]
    closed = (gap["speedup"] - gap["best_fixed"]) / den
    # Each column is rounded to 6 decimals (off by <= 5e-7), so a difference of two is off by <= 1e-6
    # and the ratio by <= (1e-6 + |closed| 1e-6) / |den|, plus the stored value's own rounding: where
    # oracle-combine beats the best fixed policy by a hair, a relative tolerance is not enough.
    bound = (1e-6 + closed.abs() * 1e-6) / den.abs() + 5e-7
    assert ((gap["gap_closed"] - closed).abs() <= bound).all(), pd.DataFrame({"stored": gap["gap_closed"],
                                                                             "recomputed": closed, "bound": bound})
    assert adaptive.loc[~has_gap, "gap_closed"].isna().all()


def test_cost_proposal_length_random_input_temperature_and_verdict_tables(pipeline: Path) -> None:
    """Every derived table equals what its package function makes of cells.parquet (and memory)."""
    from sdbench.analysis.cost import cost_table
    from sdbench.analysis.endtoend import grid_cells
    from sdbench.analysis.proposal import proposal_length_table
    from sdbench.analysis.randominputs import random_vs_real
    from sdbench.analysis.temperature import recommendation_table, temperature_table

    config, plan = reduced_plan()
    tables = pipeline / "results/tables"
    cells = pd.read_parquet(tables / "cells.parquet")
    cost = pd.read_parquet(tables / "cost.parquet")
    # The grid's own cells (the sweeps' variants are priced in their own items): 29 - 5.
    assert len(cost) == (cells["sweep"] == "").sum() == 24
    prices, devices = as_param(plan.cost_prices()), as_param(plan.model_devices())
    assert prices == {"vllm-cpu": 0.10}
    assert_same_table(cost, cost_table(grid_cells(cells), prices, devices, config["cost"]["currency"]))
    # An SD cell costs the no-SD cost over its speedup (cost_table takes the paired speedup).
    base = cost[cost.sd_method == "none"].set_index(["engine", "model", "dataset", "batch_size"])["cost_per_1m_tokens"]
    for row in cost[cost.sd_method != "none"].itertuples():
        speedup = cells.set_index(["engine", "model", "dataset", "method", "batch_size"]).loc[
            (row.engine, row.model, row.dataset, row.method, row.batch_size), "speedup"
        ]
        expected = base[(row.engine, row.model, row.dataset, row.batch_size)] / speedup
        assert row.cost_per_1m_tokens == pytest.approx(expected, rel=1e-12), row
    assert (cost.loc[cost.sd_method == "none", "cost_vs_no_sd"] == 1.0).all()
    # No SD's cost has its throughput's interval; an SD cell's also its speedup's: none with one start.
    plain = cost["sd_method"] == "none"
    assert (cost.loc[plain, "cost_per_1m_tokens_ci_low"] <= cost.loc[plain, "cost_per_1m_tokens"]).all()
    assert cost.loc[~plain, "cost_per_1m_tokens_ci_low"].isna().all()
    assert "(test price)" in (pipeline / "results/paper/ext07_cost.md").read_text()

    lengths = pd.read_parquet(tables / "proposal_length.parquet")
    assert list(lengths["num_speculative_tokens"]) == [1, 3] and set(lengths["method"]) == {"ngram-k3.k1", "ngram-k3"}
    points = {k: (v[0], int(v[1])) for k, v in as_param(plan.proposal_length_points()).items()}
    memory = pd.read_parquet(tables / "memory.parquet")
    assert_same_table(lengths, proposal_length_table(cells, memory, points, as_param(plan.proposal_length_scope())))
    measured = cells.set_index(["dataset", "method", "batch_size"])
    for row in lengths.itertuples():
        assert row.speedup == measured.loc[(row.dataset, row.method, row.batch_size), "speedup"], row

    random_inputs = pd.read_parquet(tables / "random_inputs.parquet")
    assert set(random_inputs["method"]) == {"none", "ngram-k3"}
    assert_same_table(random_inputs, random_vs_real(cells, as_param(plan.random_pairs)))
    for row in random_inputs.itertuples():
        assert row.speedup_random == measured.loc[("code-edit-random", row.method, row.batch_size), "speedup"], row
    prompts = {
        d: pd.read_parquet(pipeline / f"results/prompts/tiny-target/{d}.parquet") for d in ("code-edit", "code-edit-random")
    }
    prompt_lengths = [p["prompt_token_ids"].map(len).tolist() for p in prompts.values()]
    assert prompt_lengths[0] == prompt_lengths[1]  # random prompts as long as the real ones they match

    temperature = pd.read_parquet(tables / "temperature.parquet")
    assert temperature[["dataset", "temperature"]].values.tolist() == [["code-edit", 0.0], ["code-edit.t1.0", 1.0]]
    assert set(temperature["method"]) == {"ngram-k3"}
    t_points = {k: (v[0], float(v[1])) for k, v in as_param(plan.temperature_points()).items()}
    expected = temperature_table(cells, t_points, as_param(plan.temperature_scope()))
    assert_same_table(temperature, expected)
    for row in temperature.itertuples():
        assert row.speedup == measured.loc[(row.dataset, row.method, row.batch_size), "speedup"], row
    recommendation = pd.read_parquet(tables / "temperature_recommendation.parquet")
    assert len(recommendation) == 1
    assert_same_table(recommendation, recommendation_table(expected))
    assert "Recommendation" in (pipeline / "results/paper/ext10_temperature.md").read_text()

    # The verdict: every SD point of the grid (no server section here), from the grid's own cells,
    # joined apart so that the verdict is written before the sweeps are measured: the same rows
    # as cells.parquet's grid cells.
    assert plan.verdict_inputs() == {"cells": "results/tables/grid_cells.parquet"}
    grid = pd.read_parquet(tables / "grid_cells.parquet")
    assert set(grid["sweep"]) == {""} and len(grid) == (cells["sweep"] == "").sum()
    assert_same_table(grid, cells[cells["sweep"] == ""])
    # Each point by hand: the SD grid cell's speedup and interval, its verdict by the rule on the
    # interval, and its line's largest paying batch size.
    table = pd.read_parquet(tables / "verdict.parquet")
    sd_grid = grid[grid["sd_method"] != "none"]
    assert len(table) == len(sd_grid) and set(table["load_kind"]) == {"batch size"}
    keys = ["engine", "model", "dataset", "method"]
    joined = table.merge(sd_grid, left_on=[*keys, "load"], right_on=[*keys, "batch_size"], suffixes=("", "_cell"),
                         validate="one_to_one")  # fmt: skip
    assert (joined["speedup"] == joined["speedup_cell"]).all()
    # A point whose cell was preempted, contaminated (the quiet guard saw other work) or measured on
    # another kind of machine than its no-SD arm is flagged, whatever its interval.
    def on(value: object) -> bool:
        return value is not None and value == value and bool(value)  # NaN: off

    flagged = [any(on(row.get(c)) for c in ("preempted_cell", "contaminated", "hardware_mismatch"))
               for _, row in joined.iterrows()]  # fmt: skip
    rule = [verdict_rule(lo, hi, bad)
            for lo, hi, bad in zip(joined["speedup_ci_low_cell"], joined["speedup_ci_high_cell"], flagged)]  # fmt: skip
    assert joined["verdict"].tolist() == rule and set(rule) <= {"flagged", "not judged"}  # one start: no interval
    for _, line in joined.groupby(keys):
        paying = line.loc[line["verdict"] == "pays", "load"]
        want = float(paying.max()) if len(paying) else float("nan")
        assert set(line["largest_paying_load"].fillna(-1)) == {-1 if want != want else want}, line
    for item in ("ext07_cost", "ext08_proposal_length", "ext09_random_inputs", "ext10_temperature"):
        assert (pipeline / "results/paper" / f"{item}.png").stat().st_size > 5_000


def assert_fig8_measured_is_paired(pipeline: Path) -> None:
    """Fig. 8 measured: the package's table from the cells' calls and paired no-SD arms, and the
    same numbers recomputed by hand (per bucket: mean over prompts of each prompt's median
    tokens/s over trials, SD over its own process's no-SD arm; n-gram over EAGLE)."""
    from sdbench.analysis.bleu import measured_bucket_speedups, read_paired_calls
    from sdbench.workflow import paths as P

    _, plan = reduced_plan()
    scope = {"engine": "vllm-cpu", "model": "tiny-target", "dataset": "code-edit"}
    assert (pipeline / "results/paper/fig08_bleu_measured/vllm-cpu/tiny-target/code-edit.png").stat().st_size > 5_000
    table = pd.read_parquet(pipeline / P.BLEU_MEASURED.format(**scope))
    buckets = pd.read_parquet(pipeline / P.BLEU_BUCKETS.format(**scope))
    calls_files = [str(pipeline / f) for f in plan.bleu_calls(*scope.values())]
    base_files = [str(pipeline / f) for f in plan.bleu_calls(*scope.values(), "baseline_calls")]
    calls = pd.concat([pd.read_parquet(f) for f in calls_files], ignore_index=True)
    paired = read_paired_calls(calls_files, base_files)
    assert_same_table(table, measured_bucket_speedups(calls, buckets, "none", "ngram-k3", "eagle-k3", paired))
    assert set(table["design"]) == {"paired"} and sorted(table["batch_size"].unique()) == [1, 2]
    assert table.groupby("batch_size")["n"].sum().tolist() == [2, 2]
    bucket_of = dict(zip(buckets["request_id"], buckets["bucket"]))
    keys = ["trial", "call_index"]  # one engine start
    for row in table.itertuples():
        speedup = {}
        for method in ("ngram-k3", "eagle-k3"):
            sd = calls[(calls.method == method) & (calls.batch_size == row.batch_size)]
            base = paired[(paired.paired_with == method) & (paired.batch_size == row.batch_size)]
            pairs = sd.merge(base, on=[*keys, "request_id"], suffixes=("", "_base"), validate="one_to_one")
            assert len(pairs) == len(sd) == len(base) == 3 * 2  # trials x prompts
            pairs = pairs[pairs["request_id"].map(bucket_of) == row.bucket]
            medians = pairs.groupby("request_id")[["tokens_per_s", "tokens_per_s_base"]].median()
            speedup[method] = medians["tokens_per_s"].mean() / medians["tokens_per_s_base"].mean()
        expected = (speedup["ngram-k3"], speedup["eagle-k3"])
        assert (row.ngram_speedup, row.versus_speedup) == pytest.approx(expected, rel=1e-12)
        assert row.relative_speedup == pytest.approx(speedup["ngram-k3"] / speedup["eagle-k3"], rel=1e-12)


def test_every_figure_matches_the_runs_tables(pipeline: Path) -> None:
    """Every figure the run drew, as read back from the figure (its drawn table), against the run's
    data tables by hand formulas (tests/support/drawncheck.py): the plan's every PNG, every mark."""
    from tests.support.drawncheck import check_run

    _, plan = reduced_plan()
    checked = check_run(pipeline)
    drawn = {o.removeprefix("results/paper/").removesuffix(".png") for o in plan.final_outputs() if o.endswith(".png")}
    assert set(checked) == drawn
    print("\nfigure | marks drawn | marks checked")
    for name, (marks, n) in sorted(checked.items()):
        print(f"{name} | {marks} | {n}")
        assert marks > 0 and n > 0, name


def test_rerun_does_nothing(pipeline: Path) -> None:
    result = snakemake(pipeline, "-n")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Nothing to be done" in result.stdout + result.stderr, result.stdout[-3000:]
    assert planned_jobs(result) == {}, result.stdout[-3000:]


def dry_run_with(pipeline: Path, edit) -> subprocess.CompletedProcess[str]:
    """Dry run of the finished pipeline with ``edit`` applied to a copy of its config."""
    changed = yaml.safe_load(yaml.safe_dump(REDUCED))
    edit(changed)
    write_config(pipeline, changed)
    try:
        result = snakemake(pipeline, "-n")
    finally:
        write_config(pipeline, REDUCED)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_changing_one_batch_size_reruns_only_its_cells(pipeline: Path) -> None:
    result = dry_run_with(pipeline, lambda c: c["grid"][0].update(batch_sizes=[1, 3]))
    jobs = planned_jobs(result)
    # Every engine group of the block's cell list changed: each engine runs again (one start per
    # method), all its cells are copied out (20, and the random-token cells of the no-SD and
    # n-gram groups); the sweeps' groups beside them (T = 1.0, forced, k = 1) keep their cells; no
    # model, prompt, trace or breakdown job.
    assert jobs["run_engine"] == 5 and jobs["run_cell"] == 22, jobs
    built = {"build_model", "build_head", "build_tokenizer", "prepare_dataset", "trace_group", "trace_cell"}
    built |= {"breakdown_group", "breakdown_cell"}
    assert not built & set(jobs), jobs
    outputs = planned_outputs(result, "run_cell")
    assert sum("/bs3/" in o for o in outputs) == 10 and not any("/bs2/" in o for o in outputs), outputs


def test_changing_one_method_reruns_only_its_cells(pipeline: Path) -> None:
    result = dry_run_with(pipeline, lambda c: c["methods"]["ngram-k3"].update(prompt_lookup_max=6))
    jobs = planned_jobs(result)
    # The method's engine (4 cells + 1 random-token cell), its temperature engine (1 cell at
    # T = 1.0), the sweep's k=1 copy of it (1 cell), its trace engine (3 traced datasets, copied
    # out) and 1 breakdown cell, and what reads them.
    assert jobs["run_engine"] == 3 and jobs["run_cell"] == 7, jobs
    assert jobs["trace_group"] == 1 and jobs["trace_cell"] == 3, jobs
    assert jobs["breakdown_group"] == 1 and jobs["breakdown_cell"] == 1, jobs
    assert all("/ngram-k3/" in o or "/ngram-k3.k1/" in o for o in planned_outputs(result, "run_cell"))
    assert not {"build_model", "build_head", "build_tokenizer", "prepare_dataset", "trace_ngram_offline"} & set(jobs), jobs
    assert "params have changed" in result.stdout.lower()


def test_changing_the_no_sd_entry_reruns_every_group_it_is_paired_in(pipeline: Path) -> None:
    """The no-SD entry is measured by its own group and, paired, inside every SD group."""
    result = dry_run_with(pipeline, lambda c: c["methods"]["none"].update(label="baseline"))
    jobs = planned_jobs(result)
    # 6 groups of the Llama target (5 paired, with the sweep's n-gram k=1) + the two temperature
    # groups (no SD, paired n-gram) + the MTP model's no-SD and (paired) MTP groups + the
    # forced-acceptance group (paired; both lengths on one engine): every cell.
    assert jobs["run_engine"] == 11 and jobs["run_cell"] == 29, jobs
    # Traces and breakdown cells are not paired: only the no-SD breakdown group (one cell) reruns.
    assert jobs.get("breakdown_group") == 1 and jobs.get("breakdown_cell") == 1, jobs
    assert not {"trace_group", "trace_cell", "build_model", "build_head"} & set(jobs), jobs


def test_code_change_in_one_analysis_step_reruns_that_step(pipeline: Path, tmp_path: Path) -> None:
    """Editing the memory accounting code reruns the memory table and the one table reading it."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    module = src / "sdbench" / "analysis" / "memory.py"
    module.write_text(module.read_text() + "\n_CODE_CHANGE_PROBE = 1\n")
    result = snakemake(pipeline, "-n", env={"PYTHONPATH": str(src)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert planned_jobs(result) == {"tab02_memory": 1, "ext08_proposal_length": 1, "all": 1}, result.stdout[-3000:]


def test_bad_config_fails_before_any_job(tmp_path: Path) -> None:
    bad = yaml.safe_load(yaml.safe_dump(REDUCED))
    bad["grid"][0]["methods"].append("ngarm-k3")
    write_config(tmp_path, bad)
    result = snakemake(tmp_path)
    assert result.returncode != 0
    assert "grid[0].methods: unknown method 'ngarm-k3'" in result.stdout + result.stderr
    assert not (tmp_path / "results").exists()
