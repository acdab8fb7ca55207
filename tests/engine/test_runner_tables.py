"""SD counter arithmetic, summaries and the joined cell table (no engine needed)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from vllm.v1.metrics.reader import Counter, Vector

from sdbench.analysis.endtoend import generation_length_table, join_cells, render_length_table, speedup_markdown
from sdbench.engine.measure.counters import SDCounters, acceptance_stats, read_counters
from sdbench.engine.measure.engine import build_llm_kwargs


def _metrics(drafts: int, tokens: int, accepted: int, per_pos: list[int]) -> list:
    labels = {"model_name": "m", "engine": "0"}
    return [
        Counter("vllm:spec_decode_num_drafts", labels, drafts),
        Counter("vllm:spec_decode_num_draft_tokens", labels, tokens),
        Counter("vllm:spec_decode_num_accepted_tokens", labels, accepted),
        Vector("vllm:spec_decode_num_accepted_tokens_per_pos", labels, per_pos),
        Counter("vllm:prompt_tokens", labels, 999),
    ]


def test_counters_are_differenced() -> None:
    before = read_counters(_metrics(10, 30, 12, [6, 4, 2]))
    after = read_counters(_metrics(30, 90, 42, [18, 14, 10]))
    delta = after - before
    assert delta == SDCounters(20, 60, 30, (12, 10, 8))
    stats = acceptance_stats(delta)
    assert stats["mean_acceptance_length"] == pytest.approx(1 + 30 / 20)
    assert stats["acceptance_rate"] == pytest.approx(0.5)
    assert stats["acceptance_rate_per_pos"] == pytest.approx([0.6, 0.5, 0.4])


def test_no_drafts_gives_nan() -> None:
    stats = acceptance_stats(read_counters([]))
    assert math.isnan(stats["mean_acceptance_length"])
    assert stats["acceptance_rate_per_pos"] == []


def test_llm_kwargs_follow_the_cell() -> None:
    spec = {
        "cell": {"batch_size": 8},
        "seed": 7,
        "engine": {"vllm_version": "0.32.0", "device": "cpu", "llm_kwargs": {"enforce_eager": True}},
        "model": {"dtype": "float32", "max_model_len": 1024},
        "method": {"method": "draft_model", "num_speculative_tokens": 3},
        "run": {},
    }
    kwargs = build_llm_kwargs(spec, "/t", "/d")
    assert kwargs["max_num_seqs"] == 8
    assert kwargs["enable_prefix_caching"] is False
    assert kwargs["disable_log_stats"] is False
    assert kwargs["enforce_eager"] is True
    assert kwargs["speculative_config"] == {"method": "draft_model", "num_speculative_tokens": 3, "model": "/d"}


def test_trace_group_refuses_datasets_needing_another_engine() -> None:
    """One engine traces every dataset of a group only if their engine arguments agree:
    a mismatch is named before any engine starts."""
    from sdbench.engine.tracegroup import trace_group

    def spec(dataset: str, max_model_len: int) -> dict:
        return {
            "cell": {"dataset": dataset, "method": "ngram-k3", "batch_size": 1},
            "seed": 7,
            "engine": {"vllm_version": "0.32.0", "device": "cpu", "llm_kwargs": {}},
            "model": {"dtype": "float32", "max_model_len": max_model_len},
            "method": {"method": "ngram", "num_speculative_tokens": 3},
            "dataset": {"max_tokens": 8},
            "run": {},
        }

    with pytest.raises(ValueError, match="dataset 'b' needs other engine arguments than 'a'"):
        trace_group([spec("a", 1024), spec("b", 2048)], {}, "/t", None, 20, 8, "/nonexistent")


def _summary(method: str, bs: int, tps: float) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "engine": "e",
                "model": "m",
                "dataset": "d",
                "method": method,
                "batch_size": bs,
                "tokens_per_s": tps,
                "tokens_per_s_pooled": tps / 2,
            }
        ]
    )


def test_speedup_is_over_the_same_batch_size_baseline() -> None:
    table = join_cells(
        [_summary("none", 1, 100.0), _summary("ngram", 1, 150.0), _summary("none", 4, 300.0), _summary("ngram", 4, 330.0)],
        baseline="none",
    )
    speedups = table.set_index(["method", "batch_size"])["speedup"]
    assert speedups[("ngram", 1)] == pytest.approx(1.5)
    assert speedups[("ngram", 4)] == pytest.approx(1.1)
    assert speedups[("none", 4)] == pytest.approx(1.0)
    assert list(table["method"]) == ["ngram", "ngram", "none", "none"]


def test_duplicate_cells_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate cells"):
        join_cells([_summary("none", 1, 1.0), _summary("none", 1, 2.0)], baseline="none")


def test_generation_length_table() -> None:
    requests = pd.DataFrame(
        {
            "engine": "e",
            "model": "m",
            "dataset": "d",
            "method": ["none", "none", "ngram", "ngram"],
            "batch_size": 1,
            "num_output_tokens": [10, 20, 10, 10],
        }
    )
    table = generation_length_table(requests)
    row = table.set_index("method").loc["none"]
    assert (row.output_len_mean, row.output_len_std, row.n) == (15.0, 5.0, 2)
    assert "15 ± 5" in render_length_table(table)


def test_output_divergence_against_smallest_batch_greedy() -> None:
    from sdbench.analysis.endtoend import output_divergence

    def row(method: str, bs: int, slot: int, rid: str, ids: list[int]) -> dict:
        return {"engine": "e", "model": "m", "dataset": "d", "method": method, "batch_size": bs,
                "slot": slot, "request_id": rid, "output_token_ids": ids}

    requests = pd.DataFrame(
        [
            row("none", 1, 0, "a", [1, 2, 3]),
            row("none", 1, 0, "b", [4, 5]),
            row("none", 4, 0, "a", [1, 2, 3]),
            row("none", 4, 1, "a", [1, 9, 3]),  # batch-size nondeterminism
            row("ngram", 1, 0, "a", [1, 2, 3]),
            row("ngram", 1, 0, "b", [4, 5, 6]),  # longer: differs at the shorter length
        ]
    )
    table = output_divergence(requests, "none").set_index(["method", "batch_size"])
    assert table.loc[("none", 1), "share_differs"] == 0.0
    assert table.loc[("none", 4), "share_differs"] == 0.5
    assert table.loc[("none", 4), "first_diff_mean"] == 1.0
    assert table.loc[("ngram", 1), "share_differs"] == 0.5
    assert table.loc[("ngram", 1), "first_diff_mean"] == 2.0


def test_atomic_writes_get_ordinary_permissions(tmp_path) -> None:
    """Results written through a temp file are readable like any other file (umask)."""
    import os

    from sdbench.io import write_text

    old = os.umask(0o022)
    try:
        write_text("x", tmp_path / "out.txt")
    finally:
        os.umask(old)
    assert (tmp_path / "out.txt").stat().st_mode & 0o777 == 0o644


def _start_tables(level: float, outputs: list[list[int]], contamination: str = "") -> dict[str, pd.DataFrame]:
    """One engine start's tables of a 2-prompt cell (2 trials), as measure_cell writes them."""
    from sdbench.engine.measure.summary import summarise

    keys = {"engine": "e", "model": "m", "dataset": "d", "method": "none", "batch_size": 1}
    calls = pd.DataFrame(
        [
            {**keys, "trial": t, "call_index": i, "request_id": str(i), "num_seqs": 1, "duration_s": 1.0,
             "num_output_tokens": 10, "tokens_per_s": level + t, "num_drafts": 0, "num_draft_tokens": 0,
             "num_accepted_tokens": 0, "accepted_per_pos": [], "contaminated": bool(contamination)}
            for t in range(2) for i in range(2)
        ]
    )  # fmt: skip
    requests = pd.DataFrame(
        [{**keys, "call_index": i, "request_id": str(i), "output_token_ids": out, "num_output_tokens": len(out),
          "finish_reason": "length"} for i, out in enumerate(outputs)]
    )  # fmt: skip
    spec = {"seed": 1, "cell": keys, "method": {"method": "none"}, "run": {}}
    summary = summarise(keys, spec, calls, requests).assign(
        outputs_stable=True, contaminated=bool(contamination), contamination=contamination,
        guard_load_max=0.5, guard_samples=3, startup_s=10.0 + level / 100, warmup_s=1.0,
        peak_rss_gib=level / 100, peak_device_gib=float("nan"),
    )  # fmt: skip
    return {"requests": requests, "calls": calls, "baseline_calls": calls.iloc[0:0], "summary": summary}


def test_engine_starts_merge_into_one_cell() -> None:
    from sdbench.engine.groups import merge_engine_starts

    spec = {"seed": 1, "cell": {}, "method": {"method": "none"}, "run": {}}
    starts = [_start_tables(100.0, [[1, 2], [3]]), _start_tables(200.0, [[1, 2], [3]], "busy processes: 9 x")]
    for start, resumes in zip(starts, (0, 2)):  # the second start's job was killed twice inside the cell
        start["summary"] = start["summary"].assign(resumed=resumes > 0, num_resumes=resumes)
    merged = merge_engine_starts(starts, spec)
    s = merged["summary"].iloc[0]
    assert s["resumed"] and s["num_resumes"] == 2
    assert list(merged["summary"].columns) == list(starts[0]["summary"].columns)
    assert s["num_engine_starts"] == 2 and s["num_trials"] == 4 and len(merged["calls"]) == 8
    assert sorted(merged["calls"]["engine_start"].unique()) == [0, 1]
    assert s["tokens_per_s_ci_low"] < 150 < s["tokens_per_s_ci_high"]
    assert s["contaminated"] and s["contamination"] == "engine start 1: busy processes: 9 x"
    assert merged["calls"]["contaminated"].all() and s["outputs_stable"]
    assert s["startup_s"] == pytest.approx(11.5) and s["peak_rss_gib"] == 2.0
    differ = merge_engine_starts([starts[0], _start_tables(100.0, [[1, 2], [4]])], spec)
    assert not differ["summary"].iloc[0]["outputs_stable"]


def test_paired_starts_cancel_the_process_factor() -> None:
    """Two engine processes, one twice as fast as the other; in each the SD arm runs 1.5x its
    paired baseline. The merged paired speedup is 1.5 with a narrow interval, although each
    arm's own throughput interval spans both processes."""
    from sdbench.engine.groups import merge_engine_starts
    from sdbench.engine.measure.paired import PAIRED_COLUMNS

    spec = {"seed": 1, "cell": {}, "method": {"method": "ngram"}, "run": {}, "paired_baseline": {"key": "none"}}
    starts = []
    for level in (100.0, 200.0):
        sd = _start_tables(1.5 * level, [[1, 2], [3]])
        base = _start_tables(level, [[1, 2], [3]])
        sd["summary"] = sd["summary"].assign(**{c: float("nan") for c in PAIRED_COLUMNS})
        starts.append({**sd, "baseline_calls": base["calls"]})
    merged = merge_engine_starts(starts, spec)
    s = merged["summary"].iloc[0]
    assert s["tokens_per_s_ci_high"] / s["tokens_per_s_ci_low"] > 1.5
    assert s["paired_speedup"] == pytest.approx(1.5, rel=0.01)
    assert 1.45 < s["paired_speedup_ci_low"] <= s["paired_speedup_ci_high"] < 1.55
    assert len(merged["baseline_calls"]) == 8 and sorted(merged["baseline_calls"]["engine_start"].unique()) == [0, 1]


def test_paired_speedup_replaces_the_independent_one() -> None:
    paired = _summary("ngram", 1, 150.0).assign(
        paired_speedup=1.4, paired_speedup_ci_low=1.35, paired_speedup_ci_high=1.45, paired_baseline_tokens_per_s=107.0
    )
    unpaired = _summary("ngram", 4, 330.0).assign(
        paired_speedup=float("nan"), paired_speedup_ci_low=float("nan"), paired_speedup_ci_high=float("nan"),
        paired_baseline_tokens_per_s=float("nan"),
    )  # fmt: skip
    table = join_cells([_summary("none", 1, 100.0), paired, _summary("none", 4, 300.0), unpaired], baseline="none")
    rows = table.set_index(["method", "batch_size"])
    assert rows.loc[("ngram", 1), ["speedup", "speedup_design"]].tolist() == [pytest.approx(1.4), "paired"]
    assert rows.loc[("ngram", 1), "baseline_tokens_per_s"] == 100.0
    assert rows.loc[("ngram", 4), "speedup"] == pytest.approx(1.1) and rows.loc[("ngram", 4), "speedup_design"] == "independent"
    assert rows.loc[("none", 4), "speedup_design"] == ""
    # One engine start per arm: the trials' bootstrap (1.35-1.45) is no interval of a repeat; none is given.
    assert rows[["speedup_ci_low", "speedup_ci_high"]].isna().all().all()
    assert rows["speedup_replicates"].tolist() == [1, 1, 1, 1]
    # The Markdown speedup table: SD cells only, both designs named, no interval where there is none.
    text = speedup_markdown(table)
    assert "| ngram    | 1.40 [nan," in text and "none" not in text.split("\n", 1)[1]
    assert text.startswith("### e / m / d (independent, paired)")


def _calls(per_start: list[list[float]]) -> pd.DataFrame:
    """A calls table: per engine start, each prompt's one trial at the given tokens/s."""
    return pd.DataFrame([{"engine_start": s, "call_index": p, "trial": 0, "tokens_per_s": v}
                         for s, row in enumerate(per_start) for p, v in enumerate(row)])  # fmt: skip


def test_the_interval_is_a_t_interval_over_engine_starts() -> None:
    """Paired: per start, SD's mean over prompts over no SD's: 2, 2.2, 1.8 (logs 0.6931, 0.7885,
    0.5878: mean 0.68980, sd 0.10038); t(0.975, 2) = 4.302653: exp(0.68980 -+ 0.24935) = [1.5534,
    2.5578], point exp(0.68980) = 1.99331 (the geometric mean of the three). Independent: SD cells'
    starts 330, 363, 297 tok/s against no SD's 300, 300, 300 (no spread): Welch's df is SD's 2."""
    base = _calls([[100.0, 100.0]] * 3)
    sd = _calls([[150.0, 250.0], [200.0, 240.0], [120.0, 240.0]])
    paired = _summary("ngram", 1, 200.0).assign(paired_speedup=2.0, num_engine_starts=3)
    none1, none4 = (_summary("none", bs, t).assign(num_engine_starts=3) for bs, t in ((1, 100.0), (4, 300.0)))
    unpaired = _summary("ngram", 4, 330.0).assign(paired_speedup=float("nan"), num_engine_starts=3)
    empty = pd.DataFrame(columns=["engine_start", "call_index", "trial", "tokens_per_s"])
    calls = [(base, empty), (sd, base), (_calls([[300.0]] * 3), empty), (_calls([[330.0], [363.0], [297.0]]), empty)]
    with pytest.raises(ValueError, match="measured in 3 engine starts: its interval needs its calls tables"):
        join_cells([none1, paired, none4, unpaired], baseline="none")
    with pytest.raises(ValueError, match="aggregate: 3 calls tables for 4 cell summaries"):
        join_cells([none1, paired, none4, unpaired], "none", calls[:3])
    rows = join_cells([none1, paired, none4, unpaired], "none", calls).set_index(["method", "batch_size"])
    assert rows.loc[("ngram", 1), ["speedup", "speedup_ci_low", "speedup_ci_high"]].tolist() == pytest.approx(
        [1.99331, 1.5534, 2.5578], abs=2e-4)
    logs = np.log([1.1, 1.21, 0.99])
    half = 4.302653 * logs.std(ddof=1) / math.sqrt(3)
    assert rows.loc[("ngram", 4), ["speedup", "speedup_ci_low", "speedup_ci_high"]].tolist() == pytest.approx(
        [math.exp(logs.mean()), math.exp(logs.mean() - half), math.exp(logs.mean() + half)], rel=1e-6)
    assert rows["speedup_replicates"].tolist() == [3, 3, 3, 3]


def test_a_paired_cell_joins_without_its_no_sd_cell() -> None:
    """A partial run (a group measured, the no-SD group not yet): the paired cell keeps its own
    speedup and interval; the independent one is NaN, not an error."""
    paired = _summary("ngram", 1, 150.0).assign(
        paired_speedup=1.4, paired_speedup_ci_low=1.35, paired_speedup_ci_high=1.45, paired_baseline_tokens_per_s=107.0
    )
    row = join_cells([paired], baseline="none").iloc[0]
    assert (round(row["speedup"], 12), row["speedup_design"]) == (1.4, "paired")
    assert pd.isna(row["baseline_tokens_per_s"])


def test_preemptions_are_read_and_differenced() -> None:
    labels = {"model_name": "m", "engine": "0"}
    before = read_counters([*_metrics(1, 3, 1, [1]), Counter("vllm:num_preemptions", labels, 2)])
    after = read_counters([*_metrics(2, 6, 2, [2]), Counter("vllm:num_preemptions", labels, 7)])
    assert (after - before).num_preemptions == 5


def test_a_speedup_whose_arms_ran_in_different_layouts_is_refused() -> None:
    base = _summary("none", 4, 300.0).assign(engine_layout="inprocess")
    sd = _summary("ngram", 4, 330.0).assign(engine_layout="multiprocess")
    with pytest.raises(ValueError, match=r"^cell e/m/d/ngram/bs4: its speedup divides a multiprocess engine by a inprocess"):
        join_cells([base, sd], baseline="none")
    table = join_cells([base, sd.assign(engine_layout="inprocess")], baseline="none")
    assert set(table["engine_layout"]) == {"inprocess"}


def test_preempted_cells_and_the_speedups_over_them_are_flagged() -> None:
    table = join_cells(
        [_summary("none", 1, 100.0), _summary("ngram", 1, 150.0).assign(num_preemptions=0),
         _summary("none", 4, 300.0).assign(num_preemptions=3), _summary("ngram", 4, 330.0),
         _summary("none", 8, 300.0), _summary("ngram", 8, 330.0).assign(paired_baseline_num_preemptions=1,
                                                                       paired_speedup=1.1, paired_speedup_ci_low=1.0,
                                                                       paired_speedup_ci_high=1.2)],
        baseline="none",
    )  # fmt: skip
    flagged = table.set_index(["method", "batch_size"])["preempted"]
    assert not flagged[("ngram", 1)] and not flagged[("none", 1)]
    assert flagged[("none", 4)] and flagged[("ngram", 4)]  # the no-SD cell its speedup divides by
    assert flagged[("ngram", 8)] and not flagged[("none", 8)]  # its paired no-SD arm


def test_a_speedup_over_a_contaminated_no_sd_cell_is_contaminated_too() -> None:
    """A speedup divides by its no-SD cell: a busy machine under either arm flags the SD cell."""
    flags = {("none", 1): True, ("ngram", 1): False, ("none", 4): False, ("ngram", 4): True, ("none", 8): False,
             ("ngram", 8): False}  # fmt: skip
    tps = {"none": 100.0, "ngram": 150.0}
    table = join_cells([_summary(m, bs, tps[m]).assign(contaminated=busy) for (m, bs), busy in flags.items()], "none")
    flagged = table.set_index(["method", "batch_size"])["contaminated"].to_dict()
    assert flagged == {("ngram", 1): True, ("ngram", 4): True, ("ngram", 8): False,
                       ("none", 1): True, ("none", 4): False, ("none", 8): False}  # fmt: skip


def test_aggregate_refuses_calls_tables_that_do_not_match_its_summaries(tmp_path: Path, capsys) -> None:
    from sdbench.cli import main

    _summary("none", 1, 100.0).to_parquet(tmp_path / "s.parquet")
    _calls([[100.0]]).to_parquet(tmp_path / "c.parquet")
    argv = ["aggregate", "--summaries", str(tmp_path / "s.parquet"), "--calls", str(tmp_path / "c.parquet"),
            "--baseline", "none", "--cells", str(tmp_path / "cells.parquet")]  # fmt: skip
    assert main(argv) != 0
    assert "aggregate: --calls and --baseline-calls need one table per summary (1)" in capsys.readouterr().err
    assert not (tmp_path / "cells.parquet").exists()


def test_a_cell_that_timed_nothing_joins_without_an_interval() -> None:
    """A cell whose throughput is 0 (nothing generated) has no log to take: no speedup, no error."""
    row = join_cells([_summary("none", 1, 100.0), _summary("ngram", 1, 0.0)], "none").set_index("method").loc["ngram"]
    assert math.isnan(row["speedup"]) and math.isnan(row["speedup_ci_low"]) and row["speedup_replicates"] == 0
