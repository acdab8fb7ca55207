"""The end-to-end figure checks (tests/support/drawncheck.py) on a small hand-made run directory:
they pass on figures drawn from the run's tables, and fail on a drawn table that says otherwise."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.support import drawncheck

METHODS = {"none": {"method": "none", "label": "w/o SD"}, "ngram-k3": {"method": "ngram", "num_speculative_tokens": 3},
           "eagle-k2": {"method": "eagle", "num_speculative_tokens": 2, "label": "EAGLE (2)"}}  # fmt: skip


def _cells() -> pd.DataFrame:
    """Two models on one dataset, no SD and two SD methods at three batch sizes; the verdicts
    cover pays, break-even and loses, and one cell was timed on a busy machine."""
    rows = []
    for model, scale in (("m-big", 1.0), ("m-small", 10.0)):
        for method, sd, k in (("none", "none", 0), ("ngram-k3", "ngram", 3), ("eagle-k2", "eagle", 2)):
            for i, b in enumerate((1, 4, 16)):
                sp = 1.0 if sd == "none" else [1.5, 1.02, 0.7][(i + k) % 3]
                tps = scale * (10 + b) * sp
                rows.append(dict(engine="vllm-cpu", model=model, dataset="chat", method=method, sd_method=sd,
                                 num_speculative_tokens=k, batch_size=b, tokens_per_s=tps, tokens_per_s_ci_low=tps - 1,
                                 tokens_per_s_ci_high=tps + 2, speedup=sp,
                                 speedup_ci_low=np.nan if sd == "none" else sp - 0.1,
                                 speedup_ci_high=np.nan if sd == "none" else sp + 0.1,
                                 speedup_design="" if sd == "none" else "paired",
                                 contaminated=(model == "m-small" and method == "ngram-k3" and b == 4), preempted=False,
                                 acceptance_rate_per_pos=[] if sd == "none" else [0.9, 0.5, 0.25][:k],
                                 mean_acceptance_length=1.0 if sd == "none" else 1.5 + b / 100, sweep=""))  # fmt: skip
    return pd.DataFrame(rows)


def _server() -> pd.DataFrame:
    """Server mode for m-small: no SD and n-gram at concurrency 1 and 4, tokens/s over two rounds of one
    server start per arm: the rounds' range is no interval, so neither point is judged."""
    rows = [("none", "none", 0, c, tps, lo, hi, np.nan) for c, tps, lo, hi in ((1, 10.5, 10, 11), (4, 13, 12, 14))]
    rows += [("ngram-k3", "ngram", 3, c, tps, lo, hi, 2.5) for c, tps, lo, hi in ((1, 15, 14, 16), (4, 13.5, 12.5, 14.5))]
    frame = pd.DataFrame(rows, columns=["method", "sd_method", "num_speculative_tokens", "concurrency", "tokens_per_s",
                                        "tokens_per_s_min", "tokens_per_s_max", "mean_acceptance_length"])  # fmt: skip
    return frame.assign(engine="vllm-cpu", model="m-small", dataset="chat", hardware="cpu")


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    """A run directory: its config, cells and verdict tables, simulations, and the figures drawn from them."""
    from sdbench.analysis import verdict
    from sdbench.analysis.endtoend import plot_acceptance_per_position, plot_throughput
    from sdbench.simulator.figures import figure_fixed_vs_oracle

    root = tmp_path / "run"
    (root / "config").mkdir(parents=True)
    (root / "config" / "config.yaml").write_text(yaml.safe_dump({"methods": METHODS}))
    tables, paper = root / "results/tables", root / "results/paper"
    tables.mkdir(parents=True)
    cells = _cells()
    cells.to_parquet(tables / "cells.parquet")
    server = _server()
    server.to_parquet(tables / "server.parquet")
    points = verdict.points_table(cells, server)
    lines = verdict.lines_table(points)
    points.merge(lines[[*verdict.LINE, *verdict.LINE_RESULTS]], on=verdict.LINE).to_parquet(tables / "verdict.parquet")
    plot_throughput(cells, paper / "fig01_end_to_end.png")
    plot_acceptance_per_position(cells, paper / "ext02_acceptance_per_position.png")
    verdict.plot_verdict(points, paper / "ext00_verdict.png", {k: m.get("label", k) for k, m in METHODS.items()})
    sims = root / "results/simulator/cells/vllm-cpu/m-small/chat"
    sims.mkdir(parents=True)
    for proposer, policies in (("ngram", ("fixed-3", "oracle")), ("eagle", ("fixed-2", "oracle")), ("combined", ("oracle",))):
        pd.DataFrame([dict(engine="vllm-cpu", model="m-small", dataset="chat", proposer=proposer, policy=p,
                           batch_size=b, speedup=1 + j / 10 + b / 100) for j, p in enumerate(policies)
                      for b in (1, 4, 16)]).to_csv(sims / f"{proposer}.csv", index=False)  # fmt: skip
    (paper / "fig09_fixed_vs_oracle/vllm-cpu/m-small").mkdir(parents=True)
    results = pd.concat([pd.read_csv(p) for p in sorted(sims.glob("*.csv"))])
    figure_fixed_vs_oracle(results, paper / "fig09_fixed_vs_oracle/vllm-cpu/m-small/chat.png")
    return root


def test_every_figure_of_a_run_matches_its_tables(run: Path) -> None:
    checked = drawncheck.check_run(run)
    assert set(checked) == {"fig01_end_to_end", "ext02_acceptance_per_position", "ext00_verdict",
                            "fig09_fixed_vs_oracle/vllm-cpu/m-small/chat"}  # fmt: skip
    # By hand: 2 models x 3 methods x 3 batch sizes per row of Fig. 1, the 12 SD points of the verdict
    # and its 2 server points, 2 models x (3 + 2) draft positions, 2 proposers x 2 policies x 3 batch
    # sizes of Fig. 9.
    assert {k: v[1] for k, v in checked.items()} == {"fig01_end_to_end": 36, "ext02_acceptance_per_position": 10,
                                                     "ext00_verdict": 14,
                                                     "fig09_fixed_vs_oracle/vllm-cpu/m-small/chat": 12}  # fmt: skip


def _tamper(csv: Path, where: dict, column: str, value: object) -> None:
    frame = pd.read_csv(csv, keep_default_na=False, na_values=[""], dtype={"x": str})
    mask = np.ones(len(frame), dtype=bool)
    for key, want in where.items():
        mask &= (frame[key].astype(str) == str(want)).to_numpy()
    assert mask.sum() >= 1
    frame.loc[np.flatnonzero(mask)[0], column] = value
    frame.to_csv(csv, index=False)


@pytest.mark.parametrize(
    ("name", "where", "column", "value", "message"),
    [
        ("fig01_end_to_end", {"series": "ngram-k3", "mark": "line"}, "y", 123.0, "fig01 output tokens / s"),
        ("fig01_end_to_end", {"series": "ngram-k3", "mark": "line", "panel": "m-small / chat / vllm-cpu"}, "panel",
         "m-big / chat / vllm-cpu", "drawn marks at"),
        ("fig01_end_to_end", {"mark": "ring"}, "y", 0.5, "ring"),
        ("ext00_verdict", {"mark": "square", "color": "#f4b6b0"}, "color", "#b7e4b0", "colour #b7e4b0, rule loses"),
        ("ext00_verdict", {"mark": "square", "series": "eagle-k2"}, "label", "n-gram k=3", "on the row of n-gram k=3"),
        # The server panel has the offline panel's title; its squares are told apart by their x label.
        ("ext00_verdict", {"mark": "square", "xlabel": "concurrency", "x": "4"}, "color", "#b7e4b0",
         "concurrency 4: colour #b7e4b0, rule not judged"),
        ("ext00_verdict", {"mark": "square", "xlabel": "concurrency", "x": "1"}, "y", 1.0, "concurrency 1: drawn 1.0"),
        ("ext02_acceptance_per_position", {"series": "eagle-k2"}, "y", 0.1, "ext02"),
    ],
)
def test_a_drawn_table_that_disagrees_with_the_data_fails(run: Path, name, where, column, value, message) -> None:
    _tamper(run / "results/paper" / f"{name}.csv", where, column, value)
    with pytest.raises(AssertionError, match=message):
        drawncheck.check_run(run)


def test_a_figure_without_its_drawn_table_or_its_check_fails(run: Path) -> None:
    (run / "results/paper/ext02_acceptance_per_position.csv").unlink()
    with pytest.raises(AssertionError, match="no drawn table beside it"):
        drawncheck.check_run(run)
    shutil.copy(run / "results/paper/fig01_end_to_end.png", run / "results/paper/ext99_new.png")
    (run / "results/paper/ext02_acceptance_per_position.png").unlink()
    shutil.copy(run / "results/paper/fig01_end_to_end.csv", run / "results/paper/ext99_new.csv")
    with pytest.raises(AssertionError, match="no check of item 'ext99_new'"):
        drawncheck.check_run(run)


def test_the_verdict_rule_and_labels_are_written_out_by_hand() -> None:
    assert [drawncheck.verdict_rule(lo, hi) for lo, hi in ((1.01, 2), (0.9, 1.1), (0.5, 0.99), (1.0, 1.0), (0.98, 1.02),
                                                           (float("nan"), 1.0))] == [
        "pays", "undecided", "loses", "break-even", "break-even", "not judged"]  # fmt: skip
    assert drawncheck.method_label("eagle3", 3) == "EAGLE-3 k=3" and drawncheck.method_label("none", 0) == "w/o SD"


# ----------------------------------------------------------------------------- every checker
E2E = Path(__file__).resolve().parents[2] / ".test" / "config" / "e2e.yaml"


def _trace(rng: np.random.Generator, method: str, n_requests: int = 3) -> pd.DataFrame:
    from sdbench.traces.table import MethodTrace, make_trace_table

    return make_trace_table(MethodTrace(f"r{i}", method, rng.integers(1, 5, int(rng.integers(6, 20))))
                            for i in range(n_requests))  # fmt: skip


@pytest.fixture()
def full_run(tmp_path: Path) -> Path:
    """The end-to-end test's config and, at its paths, hand-made tables of every kind its figures
    read; each figure drawn from them by the function its rule calls."""
    from sdbench.analysis import (acceptance, bleu, breakdown, cost, energy, forced, memory, proposal, randominputs,
                                  temperature)
    from sdbench.config import validate_config
    from sdbench.simulator import figures, forcedcheck
    from sdbench.workflow.plan import Plan

    root = tmp_path / "run"
    (root / "config").mkdir(parents=True)
    config = yaml.safe_load(E2E.read_text())
    (root / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    plan = Plan(validate_config(yaml.safe_load(E2E.read_text())))
    paper, tables = root / "results/paper", root / "results/tables"
    tables.mkdir(parents=True)
    rng = np.random.default_rng(5)
    vllm = {k: m["method"] for k, m in config["methods"].items()}
    # Acceptance: a trace table at every path the plan reads, each figure drawn as its rule does.
    for path in plan.acceptance_traces("grid"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        _trace(rng, vllm[Path(path).parent.name]).to_parquet(root / path)
    for scope in plan.acceptance_scopes():
        traces = acceptance.load_traces([root / p for p in plan.acceptance_traces(scope)], plan.acceptance_labels(scope))
        kinds = [("heatmap", "fig04_acceptance_heatmap"), ("deciles", "fig05_position_deciles")]
        kinds += [("difference", "fig10_ngram_minus_eagle")] if scope in plan.difference_scopes() else []
        for kind, item in kinds:
            (paper / item / scope).parent.mkdir(parents=True, exist_ok=True)
            acceptance.write_figure(kind, traces, paper / item / f"{scope}.png")
    grid = acceptance.load_traces([root / p for p in plan.acceptance_traces("grid")], plan.acceptance_labels("grid"))
    (paper / "fig06_request_acceptance").mkdir(parents=True)
    acceptance.write_figure("requests", grid, paper / "fig06_request_acceptance/grid.png")
    # Fig. 3 from step tables, Tab. 2 from a memory table.
    steps = []
    for method, bs in (("none", 1), ("ngram-k3", 1), ("eagle-k2", 1)):
        s = pd.DataFrame({"engine": "vllm-cpu", "model": "tiny-target", "dataset": "code-edit", "method": method,
                          "batch_size": bs, "step_s": rng.uniform(1, 2, 5), "verify_s": rng.uniform(0.3, 0.5, 5),
                          "propose_s": 0.0 if method == "none" else rng.uniform(0.1, 0.3, 5),
                          "sample_s": rng.uniform(0, 0.1, 5)})  # fmt: skip
        s["other_s"] = s["step_s"] - s[["verify_s", "propose_s", "sample_s"]].sum(axis=1)
        out = root / f"results/breakdown/vllm-cpu/tiny-target/code-edit/{method}/bs{bs}/steps.parquet"
        out.parent.mkdir(parents=True)
        s.to_parquet(out)
        steps.append(s)
    breakdown.plot_breakdown(breakdown.breakdown_table(pd.concat(steps)), paper / "fig03_runtime_breakdown.png")
    mem = pd.DataFrame({"engine": "vllm-cpu", "model": "tiny-target", "dataset": "code-edit",
                        "method": ["none", "none", "eagle-k3"], "batch_size": [1, 2, 1],
                        "analytical_static_gib": [1.0, 1.0, 1.2], "analytical_per_token_kib": [36.0, 36.0, 40.0],
                        "peak_memory_gib": [2.0, 2.5, 3.0], "measured_weights_gib": [np.nan, 0.9, 1.1],
                        "measured_kv_cache_gib": 0.25})  # fmt: skip
    mem.to_parquet(tables / "memory.parquet")
    per = memory.per_configuration(mem)
    memory.plot_memory(per.assign(cell=per["model"] + " | " + per["method"]), paper / "tab02_memory.png")
    # Fig. 8 measured, Fig. 11 and the adaptive report from their data tables.
    table8 = pd.DataFrame([dict(bucket=bk, batch_size=b, relative_speedup=0.9 + 0.1 * i + 0.01 * b, n=2,
                                ngram_speedup=1.0, versus_speedup=1.0, design="paired")
                           for i, bk in enumerate(bleu.BUCKET_LABELS[:3]) for b in (1, 2)])  # fmt: skip
    folder = root / "results/bleu/vllm-cpu/tiny-target/code-edit"
    folder.mkdir(parents=True)
    table8.to_parquet(folder / "fig8_measured.parquet")
    buckets = pd.DataFrame({"request_id": ["r0", "r1"], "bleu_order": 4, "bleu": 0.1, "bucket": bleu.BUCKET_LABELS[:2]})
    (paper / "fig08_bleu_measured/vllm-cpu/tiny-target").mkdir(parents=True)
    bleu.plot_heatmap(table8, buckets, paper / "fig08_bleu_measured/vllm-cpu/tiny-target/code-edit.png")
    sims = root / "results/simulator/cells/vllm-cpu/tiny-target/code-edit"
    sims.mkdir(parents=True)
    for proposer, policies in (("ngram", ("fixed-1", "fixed-3", "oracle")), ("eagle", ("fixed-3", "oracle")),
                               ("combined", ("oracle",))):  # fmt: skip
        pd.DataFrame([dict(engine="vllm-cpu", model="tiny-target", dataset="code-edit", proposer=proposer, policy=p,
                           batch_size=b, speedup=float(rng.uniform(0.5, 2))) for p in policies
                      for b in (1, 2)]).to_csv(sims / f"{proposer}.csv", index=False)  # fmt: skip
    (paper / "fig11_oracle_combine/vllm-cpu/tiny-target").mkdir(parents=True)
    figures.figure_combining(pd.concat([pd.read_csv(p) for p in sorted(sims.glob("*.csv"))]),
                             paper / "fig11_oracle_combine/vllm-cpu/tiny-target/code-edit.png")  # fmt: skip
    report = pd.DataFrame([dict(dataset=d, policy=p, batch_size=b, speedup=1 + i / 10 + b / 100, best_fixed=1 + b / 50,
                                oracle_combine=2 + b / 50) for d in ("code-edit", "code-write")
                           for i, p in enumerate(("combined:adaptive", "eagle:dynamic-k")) for b in (1, 2)])  # fmt: skip
    (root / "results/simulator/adaptive/vllm-cpu").mkdir(parents=True)
    report.to_csv(root / "results/simulator/adaptive/vllm-cpu/tiny-target.csv", index=False)
    (paper / "ext04_adaptive_policies/vllm-cpu").mkdir(parents=True)
    figures.figure_adaptive(report, paper / "ext04_adaptive_policies/vllm-cpu/tiny-target.png")
    # The production questions, the forced sweep and the simulator check.
    cells = _cells().assign(model="tiny-target", engine="vllm-cpu")
    cells = cells[cells["model"] == "tiny-target"].drop_duplicates(["method", "batch_size"]).assign(output_len_mean=16.0)
    cells.to_parquet(tables / "cells.parquet")
    cost_t = cost.cost_table(cells, {"vllm-cpu": 0.1}, {}, "USD")
    cost_t.to_parquet(tables / "cost.parquet")
    cost.plot_cost(cost_t, paper / "ext07_cost.png")
    # Energy: one cell without a meter (NaN, "not measured"), the others metered.
    jpt = 1.0 / cells["tokens_per_s"]
    metered = cells.assign(energy_meter="nvml", mean_power_w=50.0, joules_per_token=jpt, joules_per_token_ci_low=jpt * 0.9,
                           joules_per_token_ci_high=jpt * 1.1, energy_ratio=np.nan, energy_ratio_ci_low=np.nan,
                           energy_ratio_ci_high=np.nan)  # fmt: skip
    metered.loc[metered.index[0], ["energy_meter", "joules_per_token"]] = ["not measured", np.nan]
    metered.to_parquet(tables / "cells.parquet")
    energy_t = energy.energy_table(metered)
    energy_t.to_parquet(tables / "energy.parquet")
    energy.plot_energy(energy_t, paper / "ext16_energy_per_token.png")
    plen = pd.DataFrame([dict(engine="vllm-cpu", model="tiny-target", dataset="code-edit", batch_size=1,
                              base_method="ngram-k3", num_speculative_tokens=k, method=f"ngram-k3.k{k}",
                              mean_acceptance_length=1 + k / 3, acceptance_rate=0.5, speedup=1 + k / 10,
                              speedup_ci_low=1 + k / 10 - 0.05, speedup_ci_high=1 + k / 10 + 0.05)
                         for k in (1, 3)])  # fmt: skip
    plen.to_parquet(tables / "proposal_length.parquet")
    proposal.plot_proposal_length(plen, paper / "ext08_proposal_length.png")
    temp = pd.DataFrame([dict(engine="vllm-cpu", model="tiny-target", base_dataset="code-edit", dataset=d, method="ngram-k3",
                              batch_size=1, temperature=t, mean_acceptance_length=2 - t / 2, speedup=1.5 - t / 3,
                              speedup_ci_low=1.4 - t / 3, speedup_ci_high=1.6 - t / 3)
                         for d, t in (("code-edit", 0.0), ("code-edit.t1.0", 1.0))])  # fmt: skip
    temp.to_parquet(tables / "temperature.parquet")
    temperature.plot_temperature(temp, paper / "ext10_temperature.png")
    real = cells.assign(dataset="code-edit", output_len_mean=16.0)
    both = pd.concat([real, real.assign(dataset="code-edit-random", speedup=real["speedup"] * 0.8,
                                        speedup_ci_low=real["speedup_ci_low"] * 0.8)])  # fmt: skip
    random = randominputs.random_vs_real(both, {"code-edit-random": "code-edit"})
    random.to_parquet(tables / "random_inputs.parquet")
    randominputs.plot_random_vs_real(random, paper / "ext09_random_inputs.png")
    forced_t = pd.DataFrame([dict(engine="vllm-cpu", model="tiny-target", dataset="code-edit", base_method="eagle3-k3",
                                  batch_size=1, num_speculative_tokens=3, forced_acceptance_length=f,
                                  mean_acceptance_length=f, speedup=0.5 + f / 4, speedup_ci_low=0.45 + f / 4,
                                  speedup_ci_high=0.55 + f / 4) for f in (1.0, 4.0)])  # fmt: skip
    forced_t.to_parquet(tables / "forced_acceptance.parquet")
    gap = pd.DataFrame([dict(engine="vllm-cpu", model="tiny-target", dataset="code-edit", base_method="eagle3-k3",
                             batch_size=1, num_speculative_tokens=3, real_acceptance_length=2.0, measured_speedup=0.8,
                             measured_speedup_ci_low=0.7, measured_speedup_ci_high=0.9, at_real_speedup=1.0,
                             at_real_speedup_ci_low=0.9, at_real_speedup_ci_high=1.1, ceiling_speedup=1.5,
                             ceiling_speedup_ci_low=1.4, ceiling_speedup_ci_high=1.6, ideal_speedup=4.0,
                             system_loss=2.5)])  # fmt: skip
    gap.to_parquet(tables / "sd_gap.parquet")
    labels = {k: m.get("label", k) for k, m in config["methods"].items()}
    forced.plot_forced(forced_t, gap, paper / "ext13_forced_acceptance.png", labels)
    forced.plot_gap(gap, paper / "ext14_sd_gap.png", labels)
    check = pd.DataFrame(dict(speedup=[0.8, 1.2], speedup_ci_low=[0.7, 1.1], speedup_ci_high=[0.9, 1.3],
                              predicted=[0.9, np.nan], predicted_refit=[0.82, 1.18]))  # fmt: skip
    (root / "results/simulator").mkdir(parents=True, exist_ok=True)
    check.to_parquet(root / "results/simulator/forced_check.parquet")
    forcedcheck.plot_check(check, str(paper / "ext15_simulator_at_forced.png"))
    return root


def test_every_checker_on_an_end_to_end_shaped_run(full_run: Path) -> None:
    checked = drawncheck.check_run(full_run)
    items = {name.split("/")[0] for name in checked}
    assert items == set(drawncheck.CHECKS) - {"ext00_verdict", "fig01_end_to_end", "ext02_acceptance_per_position",
                                              "fig09_fixed_vs_oracle", "ext03_compat_vs_exact", "fig08_bleu_simulated",
                                              "ext11_latency_throughput", "ext12_speed_bench_categories",
                                              "ext17_goodput_frontier"}  # fmt: skip
    assert all(n > 0 for _, n in checked.values()), checked
    # By hand: Fig. 3 has a bar per stage x (3 methods at batch size 1); ext14 the gap's 4 bars; ext15 one
    # point of the step-timing fit (the other predicted nothing) and two of the refit.
    assert checked["fig03_runtime_breakdown"][1] == 4 * 3 and checked["ext14_sd_gap"][1] == 4
    assert checked["ext15_simulator_at_forced"][1] == 3


def test_a_misplaced_acceptance_cell_fails(full_run: Path) -> None:
    csv = full_run / "results/paper/fig04_acceptance_heatmap/vllm-cpu/tiny-target/code-edit.csv"
    _tamper(csv, {"x": "0"}, "y", 99.0)
    with pytest.raises(AssertionError, match="fig04 vllm-cpu/tiny-target/code-edit"):
        drawncheck.check_run(full_run)


def test_the_fig05_check_goes_class_by_class_and_bounds_a_sampled_class(full_run: Path) -> None:
    """60 short requests (over the 50 the figure samples per class) and 2 of 4,100 tokens (the 4K-8K
    class): every mark of both classes is checked, and a sampled decile drawn outside its requests'
    means fails, as does an exact one drawn off its mean."""
    from sdbench.analysis import acceptance
    from sdbench.config import validate_config
    from sdbench.traces.table import MethodTrace, make_trace_table
    from sdbench.workflow.plan import Plan

    plan = Plan(validate_config(yaml.safe_load(E2E.read_text())))
    scope = "vllm-cpu/tiny-target/code-edit"
    paths = [full_run / p for p in plan.acceptance_traces(scope)]
    method = pd.read_parquet(paths[0])["method"].iloc[0]
    rng = np.random.default_rng(11)
    lengths = [int(n) for n in rng.integers(6, 20, 60)] + [4100, 4100]
    make_trace_table(MethodTrace(f"r{i}", method, rng.integers(1, 5, n)) for i, n in enumerate(lengths)).to_parquet(paths[0])
    png = full_run / "results/paper/fig05_position_deciles" / f"{scope}.png"
    acceptance.write_figure("deciles", acceptance.load_traces(paths, plan.acceptance_labels(scope)), png)
    drawn = drawncheck.read_drawn(png.with_suffix(".csv"))
    assert drawncheck.check_fig05(full_run, scope, drawn) == len(drawn)
    assert {p.split(": outputs ")[1] for p in drawn["panel"]} == {"<4K tokens", "4K-8K tokens"}
    for panel, message in (("<4K", "outside the requests' means"), ("4K-8K", "drawn 99")):
        bad = drawn.copy()
        row = bad.index[(bad["series"] == method) & (bad["mark"] == "line") & bad["panel"].str.endswith(f"{panel} tokens")][0]
        bad.loc[row, "y"] = 99.0
        with pytest.raises(AssertionError, match=message):
            drawncheck.check_fig05(full_run, scope, bad)


def test_a_verdict_table_that_disagrees_with_the_rule_fails(run: Path) -> None:
    """The verdict's table (not its figure) against the rule on the cell's interval: m-big's n-gram
    at batch size 1 pays (1.5 [1.4, 1.6]); a table that says it loses fails."""
    path = run / "results/tables/verdict.parquet"
    table = pd.read_parquet(path)
    at = (table["model"] == "m-big") & (table["method"] == "ngram-k3") & (table["load_kind"] == "batch size") \
        & (table["load"] == 1)  # fmt: skip
    assert table.loc[at, "verdict"].tolist() == ["pays"]
    table.loc[at, "verdict"] = "loses"
    table.to_parquet(path)
    with pytest.raises(AssertionError, match="^verdict m-big / chat / vllm-cpu ngram-k3 bs1$"):
        drawncheck.check_run(run)


def _off(drawn: pd.DataFrame, mark: str, column: str, by: float) -> pd.DataFrame:
    """``drawn`` with the first ``mark`` row's ``column`` moved by ``by``."""
    bad = drawn.copy()
    row = bad.index[bad["mark"] == mark][0]
    bad.loc[row, column] = float(bad.loc[row, column]) + by
    return bad


def test_each_checked_value_fails_when_off_its_data(full_run: Path) -> None:
    """Per check, a drawn table moved off its data fails and the honest one passes: a stage's share
    of Fig. 3 by 1e-4 (a share is checked to 1e-6), each of Fig. 6's box and whisker ends, a point of
    the cost figure (the production questions' lines). And ext16's table, whose joules per token are
    NaN exactly where no meter was read: a metered cell marked not measured fails, as does the
    unmetered cell (NaN) marked metered."""
    paper = full_run / "results/paper"
    for item, scope, check, mark, column, by, message in (
        ("fig03_runtime_breakdown", "", drawncheck.check_fig03, "bar", "y", 1e-4, r"^fig03 \S+ bs1 \w+: drawn"),
        *(("fig06_request_acceptance/grid", "grid", drawncheck.check_fig06, mark, column, 0.5, r"^fig06 .+: drawn")
          for mark, column in (("box", "y"), ("box", "lo"), ("box", "hi"), ("whisker", "lo"), ("whisker", "hi"))),
        ("ext07_cost", "", drawncheck.check_ext07, "line", "y", 1.0, r"^ext07 .+ batch_size=\d+: drawn"),
    ):  # fmt: skip
        drawn = drawncheck.read_drawn(paper / f"{item}.csv")
        assert check(full_run, scope, drawn) > 0, item
        with pytest.raises(AssertionError, match=message):
            check(full_run, scope, _off(drawn, mark, column, by))
    path = full_run / "results/tables/energy.parquet"
    honest = pd.read_parquet(path)
    drawn = drawncheck.read_drawn(paper / "ext16_energy_per_token.csv")
    assert drawncheck.check_ext16(full_run, "", drawn) > 0
    unmetered = honest.index[honest["energy_meter"] == "not measured"][0]
    metered = honest.index[honest["energy_meter"] == "nvml"][0]
    for row, meter in ((metered, "not measured"), (unmetered, "nvml")):
        honest.assign(energy_meter=honest["energy_meter"].where(honest.index != row, meter)).to_parquet(path)
        with pytest.raises(AssertionError, match=r"^ext16 \S+: meter$"):
            drawncheck.check_ext16(full_run, "", drawn)


def test_a_flagged_point_drawn_as_paying_fails(run: Path) -> None:
    """m-big's n-gram at batch size 1 pays on its interval; once its cell is preempted the rule
    makes it flagged, and a table (and square) that still say pays fail."""
    assert drawncheck.verdict_rule(1.4, 1.6, flagged=True) == "flagged"
    path = run / "results/tables/cells.parquet"
    cells = pd.read_parquet(path)
    at = (cells["model"] == "m-big") & (cells["method"] == "ngram-k3") & (cells["batch_size"] == 1)
    cells["preempted"] = at
    cells.to_parquet(path)
    with pytest.raises(AssertionError, match="^verdict m-big / chat / vllm-cpu ngram-k3 bs1$"):
        drawncheck.check_run(run)
