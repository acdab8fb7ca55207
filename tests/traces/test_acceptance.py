"""Acceptance analyses on synthetic trace tables and on the published traces."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from sdbench.analysis.acceptance import (
    difference_summary,
    heatmap_matrix,
    length_class_labels,
    load_traces,
    markdown_table,
    ngram_minus_eagle,
    position_deciles,
    request_box_stats,
    table4,
)
from sdbench.cli import main
from sdbench.io import write_parquet
from sdbench.traces.table import MethodTrace, make_trace_table, published_trace_table


def traces(spec: dict[str, dict[str, list[int]]], dataset: str = "toy") -> pd.DataFrame:
    """Trace table with a dataset column from {method: {request_id: acc_len list}}."""
    table = make_trace_table(
        MethodTrace(rid, method, np.asarray(acc))
        for method, reqs in spec.items()
        for rid, acc in reqs.items()
    )
    return table.assign(dataset=pd.array([dataset] * len(table), dtype="string"))


TOY = {"ngram": {"a": [1, 3], "b": [2, 2, 2, 6]}, "eagle": {"a": [1, 2, 3], "b": [4, 4]}}


def test_table4_is_over_per_request_means():
    tab = table4(traces(TOY))
    assert tab[["dataset", "method"]].values.tolist() == [["toy", "ngram"], ["toy", "eagle"]]
    ngram = tab.iloc[0]
    assert ngram["n_requests"] == 2
    assert ngram["mean"] == pytest.approx(2.5)  # request means 2 and 3 (position mean would be 8/3)
    assert ngram["median"] == pytest.approx(2.5)
    assert ngram["std"] == pytest.approx(math.sqrt(0.5))


def test_request_box_stats_percentiles():
    means = np.arange(1, 102, dtype=float)  # 101 requests with acc_len constant = 1..101
    spec = {"ngram": {f"r{i}": [int(m)] * 3 for i, m in enumerate(means)}}
    box = request_box_stats(traces(spec)).iloc[0]
    assert (box["p5"], box["p25"], box["p50"], box["p75"], box["p95"]) == (6, 26, 51, 76, 96)
    assert box["n_requests"] == 101


def test_length_class_labels():
    assert length_class_labels() == ["<4K", "4K-8K", "8K-13K", ">=13K"]
    assert length_class_labels((10, 20)) == ["<10", "10-20", ">=20"]


def test_position_deciles_intervals_classes_and_ci():
    spec = {"ngram": {"short": list(range(1, 11)), "short2": [5] * 10, "long": [2] * 20}}
    dec = position_deciles(traces(spec), bins=(15,), per_class=None)
    short = dec[dec["length_class"] == "<15"]
    assert short["interval"].tolist() == list(range(10))
    assert short["n_requests"].tolist() == [2] * 10
    # Interval 0: request means 1 and 5 -> mean 3, CI 3 +- 1.96 * std([1, 5]) / sqrt(2).
    first = short.iloc[0]
    half = 1.959963984540054 * np.std([1, 5], ddof=1) / math.sqrt(2)
    assert first["mean"] == pytest.approx(3)
    assert (first["mean_ci_low"], first["mean_ci_high"]) == pytest.approx((3 - half, 3 + half))
    long = dec[dec["length_class"] == ">=15"]
    assert long["mean"].tolist() == [2.0] * 10 and (long["mean_ci_low"] == long["mean_ci_high"]).all()


def test_position_deciles_samples_per_class_deterministically():
    spec = {"ngram": {f"r{i}": [1 + i % 3] * 12 for i in range(30)}}
    a = position_deciles(traces(spec), per_class=7, seed=3)
    b = position_deciles(traces(spec), per_class=7, seed=3)
    assert (a["n_requests"] == 7).all()
    pd.testing.assert_frame_equal(a, b)


def test_heatmap_matrix_sorts_by_length_and_cuts():
    spec = {"ngram": {"long": [5, 6, 7], "short": [2], "mid": [3, 4]}}
    mat, ids = heatmap_matrix(traces(spec))
    assert ids == ["short", "mid", "long"]
    np.testing.assert_array_equal(mat, [[2, np.nan, np.nan], [3, 4, np.nan], [5, 6, 7]])
    mat, _ = heatmap_matrix(traces(spec), max_position=2)
    assert mat.shape == (3, 2)


def test_ngram_minus_eagle_aligns_on_common_positions():
    diff = ngram_minus_eagle(traces(TOY))
    assert diff[["request_id", "position", "diff"]].values.tolist() == [
        ["a", 0, 0],
        ["a", 1, 1],
        ["b", 0, -2],
        ["b", 1, -2],
    ]
    summary = difference_summary(diff).iloc[0]
    assert summary["n_positions"] == 4
    assert (summary["share_ngram_better"], summary["share_eagle_better"], summary["share_equal"]) == (
        0.25,
        0.5,
        0.25,
    )
    assert summary["mean_diff"] == pytest.approx(-0.75)


def test_load_traces_labels_and_errors(tmp_path):
    table = traces(TOY).drop(columns="dataset")
    write_parquet(table, tmp_path / "combined_toy.parquet")
    assert load_traces([tmp_path / "combined_toy.parquet"])["dataset"].unique().tolist() == ["toy"]
    assert load_traces([tmp_path / "combined_toy.parquet"], ["x"])["dataset"].unique().tolist() == ["x"]
    with pytest.raises(ValueError, match="2 labels for 1 trace files"):
        load_traces([tmp_path / "combined_toy.parquet"], ["x", "y"])
    with pytest.raises(ValueError, match="method 'ngram' already read"):
        load_traces([tmp_path / "combined_toy.parquet"] * 2)
    write_parquet(table.drop(columns="acc_len"), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="bad.parquet.*acc_len"):
        load_traces([tmp_path / "bad.parquet"])


def test_markdown_table():
    md = markdown_table(pd.DataFrame({"a": ["x"], "b": [1.234]}))
    assert md == "| a | b |\n|---|---|\n| x | 1.23 |\n"


def test_cli_table4_and_figures(tmp_path):
    rng = np.random.default_rng(0)
    spec = {
        m: {f"r{i}": rng.integers(1, 22, int(rng.integers(5, 40))).tolist() for i in range(12)}
        for m in ("ngram", "eagle")
    }
    src = tmp_path / "toy.parquet"
    write_parquet(traces(spec).drop(columns="dataset"), src)
    out = tmp_path / "tab4.parquet"
    md = tmp_path / "tab4.md"
    assert (
        main(["acceptance", "table4", "--traces", str(src), "--output", str(out), "--markdown", str(md)]) == 0
    )
    assert pd.read_parquet(out)["method"].tolist() == ["ngram", "eagle"]
    assert md.read_text().startswith("| dataset | method |")

    figs = tmp_path / "figs"
    assert main(["acceptance", "figures", "--traces", str(src), "--outdir", str(figs)]) == 0
    names = sorted(p.name for p in figs.iterdir())
    assert names == sorted(
        [
            "fig4_heatmap_toy.png",
            "fig5_position_deciles_toy.png",
            "fig6_request_means.png",
            "fig10_difference_toy.png",
            "fig5_position_deciles.parquet",
            "fig6_request_box.parquet",
            "fig10_difference_summary.parquet",
            *(f"{name}.csv" for name in ("fig4_heatmap_toy", "fig5_position_deciles_toy", "fig6_request_means",
                                         "fig10_difference_toy")),
        ]
    )
    assert all((figs / n).read_bytes()[:4] == b"\x89PNG" for n in names if n.endswith(".png"))


# Per-request means over the published Llama-3.1-8B files (paper Tab. 4 averages 8B and 70B).
PUBLISHED_TAB4 = {
    ("gsm8k", "ngram"): (1.42, 1.34, 0.33),
    ("gsm8k", "eagle"): (3.03, 2.91, 0.51),
    ("instructcoder", "ngram"): (7.79, 7.27, 4.27),
    ("instructcoder", "eagle"): (4.20, 4.11, 1.05),
}


def test_table4_on_published_traces(published_traces_dir):
    frames = []
    for dataset in ("gsm8k", "instructcoder"):
        table = published_trace_table(published_traces_dir / f"combined_{dataset}.jsonl")
        frames.append(table.assign(dataset=pd.array([dataset] * len(table), dtype="string")))
    tab = table4(pd.concat(frames, ignore_index=True))
    got = {(r.dataset, r.method): (r.mean, r.median, r.std) for r in tab.itertuples()}
    assert got.keys() == PUBLISHED_TAB4.keys()
    for key, want in PUBLISHED_TAB4.items():
        assert got[key] == pytest.approx(want, abs=0.005), key


def test_trace_with_zero_acceptance_length_is_refused(tmp_path) -> None:
    """acc_len counts the verified token too: 0 is corrupt input (it would stall a replay)."""
    import pandas as pd
    import pytest

    from sdbench.traces.table import read_trace_table

    path = tmp_path / "bad.parquet"
    pd.DataFrame({"request_id": ["r"], "position": [0], "method": ["ngram"], "acc_len": [0],
                  "proposed_len": [3], "censored": [False]}).to_parquet(path)
    with pytest.raises(ValueError, match=r"acc_len must be >= 1 \(request 'r', position 0"):
        read_trace_table(path)
