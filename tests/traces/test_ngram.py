"""The n-gram tracer: proposer semantics, fast vs reference, and the published traces."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sdbench.cli import main
from sdbench.traces.ngram import propose_reference, trace_ngram, trace_ngram_reference
from sdbench.traces.published import read_published_jsonl
from sdbench.traces.table import TRACE_COLUMNS, TRACE_DTYPES, read_trace_table

DATASETS = ("gsm8k", "instructcoder")


# ----------------------------------------------------------------------------- proposer semantics
def test_docstring_example_from_vllm():
    # vLLM's own example: [4,2,3] has no match, [2,3] matches at 1, draft truncated at the end.
    assert propose_reference([1, 2, 3, 4, 2, 3], k=4, min_n=2, max_n=3) == [4, 2, 3]


def test_longest_n_wins_over_earlier_shorter_match():
    ctx = [9, 5, 6, 1, 2, 3, 7, 8, 1, 2, 3]  # [2,3] at 4; [1,2,3] at 3 (longer)
    assert propose_reference(ctx, k=2, min_n=2, max_n=3) == [7, 8]


def test_ties_go_to_leftmost_occurrence():
    ctx = [1, 2, 10, 1, 2, 20, 1, 2]
    assert propose_reference(ctx, k=1, min_n=2, max_n=2) == [10]


def test_overlapping_occurrence_is_allowed():
    # Suffix [1,1,1] starts at 3; the occurrence at 2 overlaps it.
    assert propose_reference([0, 0, 1, 1, 1, 1], k=5, min_n=3, max_n=3) == [1]


def test_no_fallback_below_min():
    assert propose_reference([1, 2, 3, 9, 2, 3], k=3, min_n=3, max_n=5) == []


def test_max_model_len_caps_draft():
    assert propose_reference([1, 2, 3, 4, 1, 2, 3], k=5, min_n=3, max_n=3, max_model_len=9) == [4, 1]
    assert propose_reference([1, 2, 3, 4, 1, 2, 3], k=5, min_n=3, max_n=3, max_model_len=7) == []


def test_trace_positions_and_censoring():
    prompt = [1, 2, 3, 4, 5, 6]
    output = [1, 2, 3, 4, 5]
    tr = trace_ngram(prompt, output, num_speculative_tokens=20)
    # Position 0 is prefill. At j=3 the context ends [..,1,2,3], draft = [4,5,6,1,2,3] (6 tokens):
    # output[3:] = [4,5] matches and the draft runs past the end -> censored, acc_len = 2 + 1.
    # At j=4 the 4-gram [1,2,3,4] wins; draft [5,6,1,2,3,4] vs output[4:] = [5].
    assert tr.acc_len.tolist() == [1, 1, 1, 3, 2]
    assert tr.proposed_len.tolist() == [0, 0, 0, 6, 6]
    assert tr.censored.tolist() == [False, False, False, True, True]
    assert tr.acc_len.dtype == np.int32 and tr.proposed_len.dtype == np.int32 and tr.censored.dtype == bool


def test_empty_and_single_outputs():
    assert len(trace_ngram([1, 2, 3], []).acc_len) == 0
    assert trace_ngram([1, 2, 3, 1, 2, 3], [1]).acc_len.tolist() == [1]


def test_bad_parameters_rejected():
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        trace_ngram([1], [1, 2], prompt_lookup_min=4, prompt_lookup_max=3)


def test_fast_matches_reference_on_random_cases():
    rng = np.random.default_rng(20251122)
    for case in range(400):
        vocab = int(rng.integers(1, 5))  # small vocabulary: many matches
        prompt = rng.integers(0, vocab, int(rng.integers(0, 30))).tolist()
        output = rng.integers(0, vocab, int(rng.integers(0, 60))).tolist()
        min_n = int(rng.integers(1, 4))
        max_n = min_n + int(rng.integers(0, 5))
        k = int(rng.integers(1, 10))
        mml = None if case % 2 else int(rng.integers(len(prompt), len(prompt) + len(output) + 5))
        args = (prompt, output, k, min_n, max_n)
        fast = trace_ngram(*args, max_model_len=mml)
        ref = trace_ngram_reference(*args, max_model_len=mml)
        for field in ("acc_len", "proposed_len", "censored"):
            assert np.array_equal(getattr(fast, field), getattr(ref, field)), (case, field, args)


# ----------------------------------------------------------------------------- published traces
@pytest.mark.parametrize("dataset", DATASETS)
def test_reproduces_published_ngram_traces(published_traces_dir, dataset):
    requests = read_published_jsonl(published_traces_dir / f"combined_{dataset}.jsonl")
    positions = censored = 0
    for req in requests:
        tr = trace_ngram(req.prompt_token_ids, req.generated_token_ids)
        published = np.asarray(req.acc_ngram)
        assert len(published) == len(tr.acc_len), req.request_id
        exact = ~tr.censored
        bad = np.nonzero(exact & (published != tr.acc_len))[0]
        assert bad.size == 0, f"{dataset} request {req.request_id}: mismatch at positions {bad[:10]}"
        # Censored rows are lower bounds: the engine kept verifying past the recorded end.
        assert (published[tr.censored] >= tr.acc_len[tr.censored]).all(), req.request_id
        positions += len(published)
        censored += int(tr.censored.sum())
    assert 0 < censored <= 0.002 * positions  # 10 / 49,848 (gsm8k), 61 / 130,989 (instructcoder)


def test_trace_ngram_cli_schema_and_determinism(published_traces_dir, tmp_path):
    src = published_traces_dir / "combined_gsm8k.jsonl"
    out1, out2 = tmp_path / "a.parquet", tmp_path / "b.parquet"
    for out in (out1, out2):
        assert main(["trace", "ngram", "--input", str(src), "--output", str(out)]) == 0
    assert out1.read_bytes() == out2.read_bytes()

    schema = pq.read_schema(out1)
    assert tuple(schema.names) == (*TRACE_COLUMNS, "measured")  # stamped by the command (sdbench.provenance)
    assert pa.types.is_string(schema.field("request_id").type) or pa.types.is_large_string(
        schema.field("request_id").type
    )
    assert schema.field("position").type == pa.int32()
    assert schema.field("acc_len").type == pa.int32()
    assert schema.field("proposed_len").type == pa.int32()
    assert schema.field("censored").type == pa.bool_()

    df = read_trace_table(out1)
    assert dict(df.dtypes.astype(str)) == TRACE_DTYPES
    assert (df["method"] == "ngram").all()
    requests = read_published_jsonl(src)
    assert len(df) == sum(len(r.generated_token_ids) for r in requests)
    assert df["request_id"].drop_duplicates().tolist() == [r.request_id for r in requests]
    assert (df.groupby("request_id", sort=False)["position"].diff().dropna() == 1).all()
    assert df["proposed_len"].notna().all()


def test_trace_ngram_cli_reads_requests_parquet(tmp_path, capsys):
    import pandas as pd

    from sdbench.io import write_parquet

    table = pd.DataFrame(
        {
            "request_id": ["r1", "r0"],
            "prompt_token_ids": [[1, 2, 3, 4, 5, 6], [7, 7, 7]],
            "output_token_ids": [[1, 2, 3, 4, 5], [7, 7]],
            "extra": [0.5, 1.5],  # ignored
        }
    )
    src, out = tmp_path / "requests.parquet", tmp_path / "trace.parquet"
    write_parquet(table, src)
    args = ["trace", "ngram", "--input", str(src), "--output", str(out), "--prompt-lookup-min", "2"]
    assert main(args) == 0
    df = read_trace_table(out)
    assert df["request_id"].tolist() == ["r1"] * 5 + ["r0"] * 2
    # With min 2, r1 already matches [1,2] at j=2 (draft [3,4,5,6,1,2], 3 of 3 left match).
    assert df["acc_len"].tolist() == [1, 1, 4, 3, 2, 1, 2]
    assert df["censored"].tolist() == [False, False, True, True, True, False, False]

    write_parquet(table.drop(columns="output_token_ids"), src)
    # Bad input: one `error:` line on stderr, exit code 2 (sdbench.cli.main).
    assert main(["trace", "ngram", "--input", str(src), "--output", str(out)]) == 2
    assert re.search("requests.parquet.*output_token_ids", capsys.readouterr().err)


def test_trace_published_cli(published_traces_dir, tmp_path):
    src = published_traces_dir / "combined_gsm8k.jsonl"
    out = tmp_path / "pub.parquet"
    assert main(["trace", "published", "--input", str(src), "--output", str(out)]) == 0
    df = read_trace_table(out)
    requests = read_published_jsonl(src)
    assert df["method"].drop_duplicates().tolist() == ["ngram", "eagle"]
    eagle = df[df["method"] == "eagle"]
    assert len(eagle) == sum(len(r.acc_eagle) for r in requests)
    assert eagle["acc_len"].tolist()[: len(requests[0].acc_eagle)] == requests[0].acc_eagle
    assert df["proposed_len"].isna().all() and not df["censored"].any()


def test_bench_tracer_smoke(tmp_path, capsys):
    import pandas as pd

    from sdbench.io import write_parquet

    rng = np.random.default_rng(1)
    table = pd.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(4)],
            "prompt_token_ids": [rng.integers(0, 3, 20).tolist() for _ in range(4)],
            "output_token_ids": [rng.integers(0, 3, 30).tolist() for _ in range(4)],
        }
    )
    src = tmp_path / "requests.parquet"
    write_parquet(table, src)
    assert main(["bench", "tracer", "--traces", str(src), "--reference-budget", "0"]) == 0
    out = capsys.readouterr().out
    assert "extrapolated per position from 1 requests" in out and "speed-up" in out
