"""Prompt-output BLEU buckets (paper Sec. 7, Fig. 8)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from sdbench import cli
from sdbench.analysis.bleu import (
    BUCKET_LABELS,
    bleu_ids,
    bleu_text,
    bucket_counts,
    bucket_of,
    compute_buckets,
    ids_to_words,
    plot_heatmap,
    read_requests,
    sentence_bleu,
)

PROMPT = "rename the variable count to total in def f count = 0 return count"
OUTPUT = "def f total = 0 return total"


def _vocab_ids(*texts: str) -> tuple[list[int], ...]:
    vocab: dict[str, int] = {}
    return tuple([vocab.setdefault(w, 1000 + len(vocab)) for w in t.split()] for t in texts)


@pytest.mark.parametrize("order", [1, 2, 4, 10])
def test_bleu_on_ids_matches_bleu_on_equivalent_text(order: int) -> None:
    prompt_ids, output_ids = _vocab_ids(PROMPT, OUTPUT)
    on_ids = bleu_ids(prompt_ids, output_ids, order)
    assert on_ids == pytest.approx(bleu_text(PROMPT, OUTPUT, order), abs=1e-12)
    assert 0.0 < on_ids < 1.0
    assert ids_to_words([5, 17, 5]) == "5 17 5"


def test_hypothesis_is_the_output_and_reference_the_prompt() -> None:
    """An output copied verbatim from a longer prompt has perfect precision; only the brevity
    penalty (output shorter than prompt) keeps it below 1. Swapped roles would give a different score."""
    prompt = list(range(40))
    output = prompt[10:30]
    score = bleu_ids(prompt, output)
    assert score == pytest.approx(math.exp(1 - 40 / 20))
    assert bleu_ids(output, prompt) != pytest.approx(score)
    assert bleu_ids(prompt, prompt) == 1.0  # clamped: sacrebleu returns 100.00000000000001
    assert bleu_ids(prompt, []) == 0.0 and bleu_ids([], output) == 0.0


def test_smoothing_keeps_lower_order_overlap() -> None:
    """With ``exp`` smoothing an output sharing unigrams but no 4-gram with the prompt is > 0."""
    assert sentence_bleu("a b c d e f", "b a d c f e", 4) > 0.0


@pytest.mark.parametrize(
    ("score", "label"),
    [
        (0.0, "[0.0,0.2)"),
        (0.1999999, "[0.0,0.2)"),
        (0.2, "[0.2,0.4)"),
        (0.4, "[0.4,0.6)"),
        (0.6, "[0.6,0.8)"),
        (0.7999999, "[0.6,0.8)"),
        (0.8, "[0.8,1.0]"),
        (1.0, "[0.8,1.0]"),
    ],
)
def test_bucket_edges(score: float, label: str) -> None:
    assert bucket_of(score) == label


@pytest.mark.parametrize("score", [-0.01, 1.01, float("nan")])
def test_bucket_rejects_out_of_range(score: float) -> None:
    with pytest.raises(ValueError, match="not in"):
        bucket_of(score)


def _requests_parquet(path: Path, with_text: bool) -> Path:
    (p1, o1), (p2, o2) = _vocab_ids(PROMPT, OUTPUT), _vocab_ids("a b c d e", "x y z")
    df = pd.DataFrame(
        {"request_id": ["r2", "r1"], "prompt_token_ids": [p1, p2], "output_token_ids": [o1, o2], "extra": [1, 2]}
    )
    if with_text:
        df["prompt_text"] = [PROMPT, "a b c d e"]
        df["output_text"] = [OUTPUT, "x y z"]
    df.to_parquet(path, index=False)
    return path


def test_cli_buckets_on_parquet_keeps_input_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _requests_parquet(tmp_path / "requests.parquet", with_text=True)
    out = tmp_path / "buckets.parquet"
    assert cli.main(["bleu", "buckets", "--input", str(src), "--output", str(out), "--order", "2"]) == 0
    df = pd.read_parquet(out)
    assert list(df.columns) == ["request_id", "bleu_order", "bleu", "bucket", "measured"]
    assert df["request_id"].tolist() == ["r2", "r1"]
    assert df["bleu_order"].tolist() == [2, 2]
    assert df["bleu"].iloc[0] == pytest.approx(bleu_text(PROMPT, OUTPUT, 2))
    assert df["bucket"].iloc[1] == "[0.0,0.2)"
    assert json.loads(capsys.readouterr().out)["basis"] == "text_13a"


def test_parquet_input_errors_name_file_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    pd.DataFrame({"request_id": ["a"], "prompt_token_ids": [[1, 2]]}).to_parquet(bad)
    with pytest.raises(ValueError, match=r"bad\.parquet: missing column\(s\) output_token_ids"):
        read_requests(bad)
    req = read_requests(_requests_parquet(tmp_path / "ids.parquet", with_text=False))
    with pytest.raises(ValueError, match="basis 'text' needs"):
        compute_buckets(req, basis="text")
    assert compute_buckets(req).attrs["bleu_basis"] == "token_ids"


# Bucket counts of BLEU-4 (token ids, exp smoothing) on the paper's published Llama-3.1-8B traces.
PUBLISHED_COUNTS = {
    "instructcoder": {"[0.0,0.2)": 86, "[0.2,0.4)": 193, "[0.4,0.6)": 167, "[0.6,0.8)": 50, "[0.8,1.0]": 4},
    "gsm8k": {"[0.0,0.2)": 271, "[0.2,0.4)": 29, "[0.4,0.6)": 0, "[0.6,0.8)": 0, "[0.8,1.0]": 0},
}


@pytest.mark.parametrize("dataset", sorted(PUBLISHED_COUNTS))
def test_published_traces_bucket_counts(published_traces_dir: Path, dataset: str, tmp_path: Path) -> None:
    src = published_traces_dir / f"combined_{dataset}.jsonl"
    out = tmp_path / "buckets.parquet"
    assert cli.main(["bleu", "buckets", "--input", str(src), "--output", str(out)]) == 0
    df = pd.read_parquet(out)
    ids_in_file = [json.loads(line)["id"] for line in src.read_text().splitlines() if line.strip()]
    assert df["request_id"].tolist() == ids_in_file
    assert bucket_counts(df) == PUBLISHED_COUNTS[dataset]
    # Code editing copies from the prompt far more than math word problems do (Sec. 7).
    if dataset == "instructcoder":
        assert df["bleu"].median() > 0.3
    else:
        assert df["bleu"].median() < 0.2


def test_heatmap_cli(tmp_path: Path) -> None:
    buckets = pd.DataFrame(
        {
            "request_id": ["a", "b", "c"],
            "bleu_order": [4, 4, 4],
            "bleu": [0.1, 0.5, 0.9],
            "bucket": ["[0.0,0.2)", "[0.4,0.6)", "[0.8,1.0]"],
        }
    )
    rows = [(b, bs, 0.8 + 0.1 * i + 0.01 * bs) for i, b in enumerate(BUCKET_LABELS[:4]) for bs in (1, 8, 32)]
    speedups = pd.DataFrame(rows, columns=["bucket", "batch_size", "relative_speedup"])
    buckets.to_parquet(tmp_path / "b.parquet")
    speedups.to_parquet(tmp_path / "s.parquet")
    png = tmp_path / "fig8.png"
    argv = ["bleu", "heatmap", "--speedups", str(tmp_path / "s.parquet"), "--buckets", str(tmp_path / "b.parquet")]
    assert cli.main([*argv, "--output", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="unknown bucket label"):
        plot_heatmap(speedups.assign(bucket="0-0.2"), buckets, tmp_path / "x.png")


def test_simulated_fig8_on_published_instructcoder(published_traces_dir: Path, tmp_path: Path) -> None:
    """Sec. 7 on the published traces: above BLEU-4 0.6, n-gram beats EAGLE at every batch size,
    and proposing 5 tokens widens n-gram's lead in the top bucket (paper: up to +53% / +100%)."""
    src = published_traces_dir / "combined_instructcoder.jsonl"
    buckets = tmp_path / "buckets.parquet"
    assert cli.main(["bleu", "buckets", "--input", str(src), "--output", str(buckets)]) == 0
    tables = {}
    for policy in ("fixed-3", "fixed-5"):
        out, png = tmp_path / f"{policy}.parquet", tmp_path / f"{policy}.png"
        argv = ["bleu", "simulated", "--traces", str(src), "--buckets", str(buckets), "--ngram-policy", policy]
        assert cli.main([*argv, "--output", str(out), "--figure", str(png)]) == 0
        assert png.read_bytes()[:4] == b"\x89PNG"
        tables[policy] = pd.read_parquet(out).set_index(["bucket", "batch_size"])
    k3, k5 = tables["fixed-3"], tables["fixed-5"]
    assert len(k3) == 5 * 6 and k3.xs(1, level="batch_size")["n"].to_dict() == PUBLISHED_COUNTS["instructcoder"]
    high = k3.index.get_level_values("bucket").isin(["[0.6,0.8)", "[0.8,1.0]"])
    assert (k3.loc[high, "relative_speedup"] > 1.0).all()
    assert (k3.xs("[0.2,0.4)", level="bucket")["relative_speedup"] < 1.0).all()
    top = "[0.8,1.0]"
    assert k5.loc[(top, 1), "relative_speedup"] > k3.loc[(top, 1), "relative_speedup"] > 1.3
    # The EAGLE side does not depend on the n-gram policy.
    assert (k3["versus_speedup"] == k5["versus_speedup"]).all()


def test_simulated_fig8_rejects_buckets_of_other_requests(published_traces_dir: Path) -> None:
    from sdbench.analysis.bleu import simulated_bucket_speedups
    from sdbench.simulator.costmodel import load_cost_model
    from sdbench.simulator.tracesets import load_traces

    traces = load_traces(published_traces_dir / "combined_gsm8k.jsonl")
    buckets = pd.DataFrame({"request_id": ["x"], "bleu_order": [4], "bleu": [0.5], "bucket": ["[0.4,0.6)"]})
    with pytest.raises(ValueError, match="have no BLEU bucket"):
        simulated_bucket_speedups(traces, buckets, [1], load_cost_model("llama3.1-8b-h100"))


# --------------------------------------------------------------------------------------------------
# Fig. 8 from engine runs: each speedup over the no-SD calls paired in its own process.

CELL = {"engine": "vllm-cpu", "model": "tiny", "dataset": "code-edit", "batch_size": 1}


def _calls(method: str, tps: dict[str, list[float]]) -> pd.DataFrame:
    """Replicate-mode calls of one cell: per request (= call), its tokens/s in trials 0, 1, ..."""
    rows = [
        {**CELL, "method": method, "trial": t, "call_index": i, "request_id": rid, "tokens_per_s": v}
        for i, (rid, values) in enumerate(tps.items())
        for t, v in enumerate(values)
    ]
    return pd.DataFrame(rows)


def _fig8_inputs() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The n-gram process ran slow in trial 1 (both of its arms); the versus process did not."""
    calls = pd.concat(
        [
            _calls("none", {"a": [90.0, 110.0], "b": [50.0, 50.0]}),
            _calls("ngram", {"a": [200.0, 120.0], "b": [80.0, 80.0]}),
            _calls("eagle", {"a": [150.0, 150.0], "b": [60.0, 60.0]}),
        ],
        ignore_index=True,
    )
    paired = pd.concat(
        [
            _calls("none", {"a": [100.0, 60.0], "b": [40.0, 40.0]}).assign(paired_with="ngram"),
            _calls("none", {"a": [100.0, 100.0], "b": [50.0, 50.0]}).assign(paired_with="eagle"),
        ],
        ignore_index=True,
    )
    buckets = pd.DataFrame(
        {"request_id": ["a", "b"], "bleu_order": [4, 4], "bleu": [0.9, 0.1], "bucket": ["[0.8,1.0]", "[0.0,0.2)"]}
    )
    return calls, paired, buckets


def test_measured_fig8_divides_by_the_no_sd_calls_of_the_same_process_and_trial() -> None:
    from sdbench.analysis.bleu import measured_bucket_speedups

    calls, paired, buckets = _fig8_inputs()
    table = measured_bucket_speedups(calls, buckets, "none", "ngram", "eagle", paired).set_index("bucket")
    assert list(table.index) == ["[0.0,0.2)", "[0.8,1.0]"] and set(table["design"]) == {"paired"}
    assert table["n"].tolist() == [1, 1] and table["batch_size"].tolist() == [1, 1]
    # Request a: n-gram median(200, 120) / median(100, 60) = 2.0, EAGLE 150 / 100 = 1.5.
    a = table.loc["[0.8,1.0]"]
    assert (a["ngram_speedup"], a["versus_speedup"]) == pytest.approx((2.0, 1.5), abs=1e-12)
    assert a["relative_speedup"] == pytest.approx(4 / 3, abs=1e-12)
    # Request b: 80 / 40 over 60 / 50.
    assert table.loc["[0.0,0.2)", "relative_speedup"] == pytest.approx(2.0 / 1.2, abs=1e-12)
    # Every trial of one arm crossed with every trial of the no-SD cell (another process) gives another number.
    a_calls = calls[calls.request_id == "a"]
    ng, vs, base = (a_calls[a_calls.method == m] for m in ("ngram", "eagle", "none"))
    crossed = pd.Series([x / y for x in ng.tokens_per_s for y in base.tokens_per_s]).mean() / pd.Series(
        [x / y for x in vs.tokens_per_s for y in base.tokens_per_s]
    ).mean()
    assert abs(crossed - a["relative_speedup"]) > 0.2


def test_measured_fig8_one_bucket_of_every_prompt_is_the_cells_paired_speedup() -> None:
    from sdbench.analysis.bleu import measured_bucket_speedups
    from sdbench.engine.measure.paired import paired_columns

    calls, paired, buckets = _fig8_inputs()
    table = measured_bucket_speedups(calls, buckets.assign(bucket="[0.4,0.6)"), "none", "ngram", "eagle", paired)
    for method, column in (("ngram", "ngram_speedup"), ("eagle", "versus_speedup")):
        cell = paired_columns(calls[calls.method == method], paired[paired.paired_with == method], seed=0)
        assert table[column].iloc[0] == pytest.approx(cell["paired_speedup"], abs=1e-12)
    assert table["n"].tolist() == [2]


def test_measured_fig8_without_paired_arms_uses_the_no_sd_cell_and_says_so() -> None:
    from sdbench.analysis.bleu import measured_bucket_speedups, measured_title

    calls, paired, buckets = _fig8_inputs()
    # Only the n-gram cell paired: both methods fall back to the separately measured no-SD cell.
    for partial in (None, paired[paired.paired_with == "ngram"]):
        table = measured_bucket_speedups(calls, buckets, "none", "ngram", "eagle", partial).set_index("bucket")
        assert set(table["design"]) == {"independent"}
        a = table.loc["[0.8,1.0]"]
        assert (a["ngram_speedup"], a["versus_speedup"]) == pytest.approx((160 / 100, 150 / 100), abs=1e-12)
        assert "NOT paired" in measured_title(table.reset_index(), "ngram", "eagle")
    paired_table = measured_bucket_speedups(calls, buckets, "none", "ngram", "eagle", paired)
    assert "paired in its process" in measured_title(paired_table, "ngram", "eagle")


def test_measured_fig8_rejects_arms_that_timed_different_calls() -> None:
    from sdbench.analysis.bleu import measured_bucket_speedups

    calls, paired, buckets = _fig8_inputs()
    short = paired.drop(index=paired.index[(paired.paired_with == "eagle") & (paired.trial == 1)][:1])
    with pytest.raises(ValueError, match="paired no-SD calls of eagle: the two arms did not time the same calls"):
        measured_bucket_speedups(calls, buckets, "none", "ngram", "eagle", short)
    with pytest.raises(ValueError, match="one engine x model x dataset at a time"):
        measured_bucket_speedups(
            pd.concat([calls, calls.assign(dataset="other")]), buckets, "none", "ngram", "eagle", paired
        )


def test_measured_fig8_cli_pairs_each_cell_with_its_baseline_calls(tmp_path: Path) -> None:
    calls, paired, buckets = _fig8_inputs()
    args = ["bleu", "measured", "--baseline", "none", "--ngram", "ngram", "--versus", "eagle"]
    paths: dict[str, list[str]] = {"calls": [], "baseline": []}
    for method in ("none", "ngram", "eagle"):
        cell = tmp_path / method
        cell.mkdir()
        calls[calls.method == method].to_parquet(cell / "calls.parquet")
        arm = paired[paired.paired_with == method].drop(columns="paired_with")
        (arm if len(arm) else calls.iloc[0:0]).to_parquet(cell / "baseline_calls.parquet")
        paths["calls"].append(str(cell / "calls.parquet"))
        paths["baseline"].append(str(cell / "baseline_calls.parquet"))
    buckets.to_parquet(tmp_path / "buckets.parquet")
    out = tmp_path / "fig8.parquet"
    common = [*args, "--buckets", str(tmp_path / "buckets.parquet"), "--output", str(out)]
    common += ["--figure", str(tmp_path / "fig8.png"), "--calls", *paths["calls"]]
    assert cli.main([*common, "--baseline-calls", *paths["baseline"]]) == 0
    table = pd.read_parquet(out).set_index("bucket")
    assert table.loc["[0.8,1.0]", "relative_speedup"] == pytest.approx(4 / 3, abs=1e-12)
    assert set(table["design"]) == {"paired"} and (tmp_path / "fig8.png").stat().st_size > 5_000
    # Out of order (each baseline_calls beside another cell's calls) fails naming the file.
    with pytest.raises(ValueError, match=r"eagle/baseline_calls.parquet: not the paired no-SD arm of .*ngram/calls"):
        from sdbench.analysis.bleu import read_paired_calls

        read_paired_calls(paths["calls"], [paths["baseline"][0], paths["baseline"][2], paths["baseline"][1]])
