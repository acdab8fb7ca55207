"""Simulator: compat mode against the published simulator, exact-mode pricing, inputs, CLI."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sdbench.cli import main
from sdbench.simulator.costmodel import load_cost_model
from sdbench.bench.simulator import run_paper_grid
from sdbench.simulator.core import RESULT_COLUMNS, prepare, simulate, simulate_prepared
from sdbench.simulator.policies import make_policy
from sdbench.simulator.policytypes import COMPAT, EXACT, PolicyContext, TraceArrays
from sdbench.simulator.pricing import baseline_trajectories, continuous_makespan, replicated_latency
from sdbench.simulator.reports import COMPARE_VARIANTS, adaptive_report, adaptive_summary
from sdbench.simulator.tracesets import load_traces, with_ngram_proposals

FIXTURE = Path(__file__).parents[1] / "fixtures" / "simulator_compat.csv"
CM = load_cost_model("llama3.1-8b-h100")
KEYS = ["dataset", "proposer", "policy", "batch_size"]


@pytest.fixture(scope="module")
def paths(published_traces_dir: Path) -> list[Path]:
    return [published_traces_dir / "combined_gsm8k.jsonl", published_traces_dir / "combined_instructcoder.jsonl"]


@pytest.fixture(scope="module")
def traced(paths: list[Path]) -> dict:
    """Both published datasets with n-gram drafts traced (done once)."""
    return {ts.dataset: ts for ts in (with_ngram_proposals(load_traces(p)) for p in paths)}


# ----------------------------------------------------------------------------- compat
def test_compat_reproduces_the_published_simulator(paths: list[Path]) -> None:
    """Every configuration of the published grid, to the printed two decimals (speedup from its
    CSV, tokens/s from its log), numbers from running SpecDecode-Bench/simulator@2fdccbd."""
    expected = pd.read_csv(FIXTURE, dtype=str)
    expected["batch_size"] = expected["batch_size"].astype(int)
    ours = run_paper_grid(paths, CM)
    merged = expected.merge(ours, on=KEYS, how="left", suffixes=("_published", ""), validate="one_to_one")
    assert len(merged) == len(expected) == 108
    for col in ("speedup", "baseline_tokens_per_s", "sd_tokens_per_s"):
        got = merged[col].map(lambda x: f"{x:.2f}")
        bad = merged.loc[got != merged[f"{col}_published"], [*KEYS, col, f"{col}_published"]]
        assert bad.empty, f"{col} differs from the published simulator:\n{bad}"


def test_compat_example_from_the_paper(paths: list[Path]) -> None:
    df = simulate([load_traces(paths[1])], "ngram", ["fixed-5", "oracle"], [1], CM, "compat")
    assert df["speedup"].map(lambda x: f"{x:.2f}").tolist() == ["2.10", "2.73"]


# ----------------------------------------------------------------------------- exact
@pytest.mark.parametrize(
    "dataset, proposer, policy, batch, variant, compat, corrected",
    [
        # Charging EAGLE's own draft cost where it wins (the issue author's calibration).
        ("gsm8k", "combined", "oracle", 1, "+drafter_cost", "2.80", "2.38"),
        ("instructcoder", "combined", "oracle", 1, "+drafter_cost", "4.89", "4.34"),
        # True n-gram proposal lengths instead of the random "no match" model.
        ("instructcoder", "ngram", "fixed-5", 128, "+ngram_proposals", "1.02", "1.35"),
    ],
)
def test_exact_corrections_match_calibration(traced, dataset, proposer, policy, batch, variant, compat, corrected):
    prep = prepare(traced[dataset], proposer)
    got = [
        simulate_prepared(prep, [policy], [batch], CM, COMPARE_VARIANTS[v])["speedup"].iloc[0]
        for v in ("compat", variant)
    ]
    assert [f"{x:.2f}" for x in got] == [compat, corrected]


def _brute_force_replicated(arrays: TraceArrays, r: int, batch: int, k: int) -> float:
    """Latency of request ``r`` replicated ``batch`` times, EAGLE fixed-k, exact mode, step by step."""
    t, d = CM.target, CM.drafter("eagle")
    p, n = int(arrays.prompt_len[r]), int(arrays.length[r])
    acc = arrays.acc_draft[arrays.start[r] : arrays.start[r] + n]
    lat = t.time(0, batch * p) + CM.overhead_per_step
    g = 1
    while g < n:
        kv = batch * (p + g)
        verify = t.time(kv, batch * (1 + k))
        lat += verify + d.time(verify, kv, batch * k) + CM.overhead_per_step
        g += min(int(acc[g]), k + 1)
    return lat


def test_replicated_pricing_matches_step_by_step(traced) -> None:
    prep = prepare(traced["gsm8k"], "eagle", num_requests=5)
    traj = make_policy("fixed-3", "eagle").trajectories(prep.arrays, PolicyContext("eagle", 1, CM), EXACT)
    lat = replicated_latency(traj, prep.arrays, "eagle", CM, EXACT, "eagle", [1, 8, 128])
    for r in range(5):
        for j, b in enumerate([1, 8, 128]):
            assert lat[r, j] == pytest.approx(_brute_force_replicated(prep.arrays, r, b, 3), rel=1e-12)


def _brute_force_continuous(arrays: TraceArrays, batch: int) -> float:
    """Makespan of oracle-combine under continuous batching, one engine step at a time."""
    t, frac, d = CM.target, CM.drafter("ngram").fraction, CM.drafter("eagle")
    queue, running, total = list(range(arrays.num_requests)), [], 0.0
    gen: dict[int, int] = {}
    while queue or running:
        admitted = []
        while queue and len(running) + len(admitted) < batch:
            admitted.append(queue.pop(0))
        kv = batched = 0
        ng_used, e_kv, e_k, e_used, moves = False, 0, 0, False, {}
        for r in running:
            s, g, p = arrays.start[r], gen[r], arrays.prompt_len[r]
            an, ad = int(arrays.acc_ngram[s + g]), int(arrays.acc_draft[s + g])
            k = max(an, ad) - 1
            kv += p + g
            batched += 1 + k
            if k > 0 and an >= ad:
                ng_used = True
            elif k > 0:
                e_used, e_kv, e_k = True, e_kv + p + g, e_k + k
            moves[r] = k + 1
        batched += sum(int(arrays.prompt_len[r]) for r in admitted)
        verify = t.time(kv, batched)
        total += verify + CM.overhead_per_step + (frac * verify if ng_used else 0.0)
        total += d.time(verify, e_kv, e_k) if e_used else 0.0
        for r, a in moves.items():
            gen[r] += a
        for r in admitted:
            gen[r] = 1
        running = [r for r in running + admitted if gen[r] < arrays.length[r]]
    return total


def test_continuous_batching_matches_step_by_step(traced) -> None:
    prep = prepare(traced["instructcoder"], "combined", num_requests=12)
    traj = make_policy("oracle-combine", "combined").trajectories(prep.arrays, PolicyContext("combined", 1, CM), EXACT)
    for b in (1, 4, 64):
        assert continuous_makespan(traj, prep.arrays, CM, "eagle", b) == pytest.approx(
            _brute_force_continuous(prep.arrays, b), rel=1e-12
        )


def test_continuous_at_batch_one_is_sequential_replay(traced) -> None:
    prep = prepare(traced["gsm8k"], "eagle", num_requests=30)
    lat = replicated_latency(baseline_trajectories(prep.arrays), prep.arrays, None, CM, EXACT, "eagle", [1])
    assert continuous_makespan(baseline_trajectories(prep.arrays), prep.arrays, CM, "eagle", 1) == pytest.approx(
        lat.sum(), rel=1e-12
    )


def test_exact_mode_runs_every_policy(traced) -> None:
    ts = [traced["gsm8k"]]
    for proposer, policies in (
        ("eagle", ["fixed-3", "oracle", "adaptive"]),
        ("combined", ["oracle-combine", "adaptive"]),
    ):
        for batching in ("replicated", "continuous"):
            df = simulate(ts, proposer, policies, [1, 32], CM, "exact", batching=batching, num_requests=40)
            assert len(df) == 2 * len(policies) and (df["speedup"] > 1).all()
            assert list(df.columns) == list(RESULT_COLUMNS)


def test_oracle_combine_bounds_the_adaptive_policies(traced) -> None:
    report = adaptive_report(
        [traced["instructcoder"], traced["gsm8k"]],
        CM,
        [1, 64],
        ["combined:adaptive", "combined:learned"],
        num_requests=40,
    )
    assert len(report) == 2 * 2 * 2
    assert (report["speedup"] <= report["oracle_combine"]).all()
    ic = report[(report["dataset"] == "instructcoder") & (report["policy"] == "combined:adaptive")]
    assert (ic["gap_closed"] > 0.25).all()  # the n-gram-heavy dataset: a large share of the gap
    summary = adaptive_summary(report)
    worst = summary[summary["batch_size"] == "min vs best fixed"]["combined:adaptive"]
    assert len(worst) == 2 and all(len(v.split(".")[1]) == 3 for v in worst)


# ----------------------------------------------------------------------------- inputs and CLI
def test_trace_table_input_equals_jsonl(tmp_path: Path, paths: list[Path]) -> None:
    from sdbench.traces.table import published_trace_table

    table = tmp_path / "combined_gsm8k.parquet"
    published_trace_table(paths[0]).to_parquet(table)
    with pytest.raises(ValueError, match=r"combined_gsm8k\.parquet.*prompt length"):
        load_traces(table)
    from_table = load_traces(table, requests=[paths[0]])
    assert from_table.dataset == "gsm8k"
    args = (["eagle", ["fixed-3", "oracle"], [1, 64], CM, "compat"], ["ngram", ["fixed-5"], [8], CM, "exact"])
    for a in args:
        pd.testing.assert_frame_equal(simulate([from_table], *a), simulate([load_traces(paths[0])], *a))


def test_cli_simulate_is_deterministic(tmp_path: Path, paths: list[Path]) -> None:
    outs = []
    for i in range(2):
        out = tmp_path / f"run{i}.csv"
        argv = [
            "simulate",
            "--traces",
            str(paths[0]),
            "--proposer",
            "eagle",
            "--policy",
            "oracle",
            "fixed-1",
            "--batch-sizes",
            "8",
            "1",
            "--cost-model",
            "llama3.1-8b-h100",
            "--mode",
            "compat",
            "--output",
            str(out),
        ]
        assert main(argv) == 0
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    df = pd.read_csv(tmp_path / "run0.csv")
    assert df[KEYS].values.tolist() == [["gsm8k", "eagle", p, b] for p in ("fixed-1", "oracle") for b in (1, 8)]
    assert {"speedup", "baseline_tokens_per_s", "sd_tokens_per_s"} <= set(df.columns)


def test_cli_simulate_names_the_engine_and_model_of_its_traces(tmp_path: Path, paths: list[Path], capsys) -> None:
    """The grid's simulations say whose traces they replayed (validation matches cells by it)."""
    base = ["simulate", "--traces", str(paths[0]), "--proposer", "ngram", "--policy", "fixed-3", "--batch-sizes", "1",
            "--cost-model", "llama3.1-8b-h100", "--output"]  # fmt: skip
    assert main([*base, str(tmp_path / "plain.csv")]) == 0
    assert main([*base, str(tmp_path / "named.csv"), "--engine", "vllm-a", "--model", "qwen3-8b"]) == 0
    plain, named = pd.read_csv(tmp_path / "plain.csv"), pd.read_csv(tmp_path / "named.csv")
    assert "engine" not in plain and list(named.columns[:2]) == ["engine", "model"]
    assert named[["engine", "model"]].drop_duplicates().values.tolist() == [["vllm-a", "qwen3-8b"]]
    pd.testing.assert_frame_equal(named.drop(columns=["engine", "model"]), plain)
    assert main([*base, str(tmp_path / "half.csv"), "--engine", "vllm-a"]) != 0
    assert "the following arguments are required: --model" in capsys.readouterr().err


def test_cli_figures(tmp_path: Path, paths: list[Path]) -> None:
    csvs = []
    for proposer, policies in (
        ("eagle", ["fixed-1", "fixed-3", "oracle"]),
        ("ngram", ["fixed-3", "oracle"]),
        ("combined", ["oracle"]),
    ):
        csvs.append(tmp_path / f"{proposer}.csv")
        assert (
            main(
                [
                    "simulate",
                    "--traces",
                    str(paths[0]),
                    "--proposer",
                    proposer,
                    "--policy",
                    *policies,
                    "--batch-sizes",
                    "1",
                    "16",
                    "--mode",
                    "compat",
                    "--output",
                    str(csvs[-1]),
                ]
            )
            == 0
        )
    fig9, fig11 = tmp_path / "fig" / "fig9.png", tmp_path / "fig" / "fig11.png"
    args = ["simulate", "figures", "--results", *map(str, csvs)]
    assert main([*args, "--fixed-vs-oracle", str(fig9), "--combining", str(fig11)]) == 0
    for path in (fig9, fig11):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(args) == 2  # neither figure asked for


def test_cli_errors_name_the_problem(tmp_path: Path, paths: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    # Bad input ends the command with one `error:` line on stderr and exit code 2 (sdbench.cli.main).
    assert (
        main(
            [
                "simulate",
                "--traces",
                str(paths[0]),
                "--proposer",
                "combined",
                "--policy",
                "fixed-3",
                "--output",
                str(tmp_path / "x.csv"),
            ]
        )
        == 2
    )
    assert "does not apply" in capsys.readouterr().err
    assert (
        main(
            [
                "simulate",
                "--traces",
                str(tmp_path / "nope.jsonl"),
                "--proposer",
                "eagle",
                "--output",
                str(tmp_path / "x.csv"),
            ]
        )
        == 2
    )
    assert "nope.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


def test_fidelity_variants_are_single_corrections() -> None:
    for name, f in COMPARE_VARIANTS.items():
        if name.startswith("+"):
            assert sum(a != b for a, b in zip(vars(f).values(), vars(COMPAT).values())) == 1
    assert (
        replace(COMPAT, true_ngram_proposals=True, aligned_positions=True, drafter_cost=True, batch_draft_cost=True)
        == EXACT
    )


def test_validation_judges_each_drafter_on_its_own_trace() -> None:
    from sdbench.simulator.validation import compare

    methods = {
        "ng": {"method": "ngram", "num_speculative_tokens": 3},
        "e1": {"method": "eagle", "num_speculative_tokens": 3},
        "e3": {"method": "eagle3", "num_speculative_tokens": 3},
        "dm": {"method": "draft_model", "num_speculative_tokens": 3},
    }
    cells = pd.DataFrame(
        [{"engine": "e", "model": "m", "dataset": "d", "method": m, "batch_size": 1, "speedup": 1.0,
          "speedup_ci_low": 0.9, "speedup_ci_high": 1.1} for m in methods]
    )  # fmt: skip
    simulated = pd.DataFrame(
        [{"engine": "e", "model": "m", "dataset": "d", "proposer": p, "drafter": x, "policy": "fixed-3",
          "batch_size": 1, "speedup": s}
         for p, x, s in (("ngram", "", 1.05), ("eagle", "eagle", 0.5), ("eagle", "eagle3", 1.5))]
    )  # fmt: skip
    table = compare(cells, simulated, methods).set_index("method")
    assert set(table.index) == {"ng", "e1", "e3"}  # the draft model was not traced: not judged
    assert table.loc["e1", "simulated_speedup"] == 0.5 and table.loc["e3", "simulated_speedup"] == 1.5
    assert list(table["agrees"]) == [False, False, True]


def test_policy_choices_come_from_the_config() -> None:
    from sdbench.config import load_config
    from sdbench.simulator import choices

    config = load_config(str(Path(__file__).parents[2] / "config" / "config.yaml"))
    assert choices.published_policies(config, "combined", "exact") == ["oracle", "adaptive"]
    assert choices.published_policies(config, "combined", "compat") == ["oracle"]
    assert choices.cell_policies(config, "combined") == ["oracle"]
    assert "combined:learned" in choices.adaptive_policies(config, 2)
    assert "combined:learned" not in choices.adaptive_policies(config, 1)
