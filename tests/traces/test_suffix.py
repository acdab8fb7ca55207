"""The offline SuffixDecoding tracer and the gating of vLLM's ``method: suffix``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sdbench.cli import main
from sdbench.engine.release.versions import unsupported_reason
from sdbench.io import write_parquet
from sdbench.traces.suffix import SuffixParams, SuffixTrie, propose_suffix_reference, trace_suffix
from sdbench.traces.table import (
    TRACE_DTYPES,
    TokenRequest,
    ngram_trace_table,
    read_trace_table,
    suffix_trace_table,
)


def _draft(prompt, output, earlier=(), **kw):
    return propose_suffix_reference(prompt, output, earlier, SuffixParams(**kw))


# ----------------------------------------------------------------------------- the trie
def test_trie_counts_every_substring_up_to_max_depth():
    t = SuffixTrie(max_depth=2)
    t.extend(0, [1, 2, 1, 2])
    assert t.root.count == 4
    assert t.match([1]).count == 2 and t.match([1, 2]).count == 2 and t.match([2, 1]).count == 1
    assert t.match([1, 2, 1]) is None  # deeper than max_depth


def test_sibling_order_ties_follow_arcticinference():
    # After [5, 7, 5, 9]: 5 -> {7: 1, 9: 1}; the child created first stays first.
    t = SuffixTrie(4)
    t.extend(0, [5, 7, 5, 9])
    assert t.head_child(t.match([5])).token == 7
    # Another 5 9 moves 9 to count 2: head.
    t.extend(0, [5, 9])
    assert t.head_child(t.match([5])).token == 9


# ----------------------------------------------------------------------------- hand-computed drafts
def test_per_request_match_copies_from_the_prompt():
    # Pattern suffix [1, 2] (L=2) occurs once before, followed by 3 4; L=3 ([0,1,2]) too.
    # Budget = L * factor: L=3 gives 3 tokens [3, 4, 0] but the prompt ends after 0 ... here
    # the continuation of [0, 1, 2] is [3, 4] then the end of the known text ([0, 1, 2] again).
    prompt = [0, 1, 2, 3, 4, 0, 1]
    assert _draft(prompt, [2], max_cached_requests=0, min_token_prob=0.0) == [3, 4, 0]


def test_min_token_prob_cuts_the_draft():
    # [7] occurs 3 times before its last occurrence: followed by 1, 1, 2 (and once by nothing).
    prompt = [7, 1, 7, 1, 7, 2, 7]
    # Match L=1 ([7]): counts 7 -> {1: 2, 2: 1}, count(7) = 4: p(1) = 0.5.
    assert _draft(prompt, [], max_cached_requests=0, min_token_prob=0.4) == [1]
    assert _draft(prompt, [], max_cached_requests=0, min_token_prob=0.6) == []


def test_spec_factor_budget_limits_the_draft():
    prompt = [9, 8, 1, 2, 3, 4, 5, 6, 9, 8]
    # Longest match [9, 8] (L=2): continuation 1 2 3 4 5 6 with probability 0.5 each (the
    # pattern's own occurrence has no continuation).
    assert _draft(prompt, [], max_cached_requests=0, max_spec_factor=1.0, min_token_prob=0.0) == [1, 2]
    assert _draft(prompt, [], max_cached_requests=0, max_spec_factor=2.0, min_token_prob=0.0) == [1, 2, 3, 4]
    assert _draft(prompt, [], max_cached_requests=0, max_spec_factor=2.0, num_speculative_tokens=3,
                  min_token_prob=0.0) == [1, 2, 3]


def test_global_tree_supplies_an_earlier_requests_output():
    # The prompt says nothing about what follows [4, 5]; an earlier output does.
    earlier = [[4, 5, 6, 7, 8]]
    assert _draft([1, 4], [5], earlier, max_spec_factor=4.0) == [6, 7, 8]
    assert _draft([1, 4], [5], earlier, max_spec_factor=4.0, max_cached_requests=0) == []


def test_trace_uses_earlier_requests_in_table_order():
    a = ([1], [4, 5, 6, 7, 8])
    b = ([2], [4, 5, 6, 7, 8])
    first, second = trace_suffix([a, b], SuffixParams(max_spec_factor=4.0))
    # b at position 2 (context ... 4 5): a's output proposes 6 7 8, all accepted.
    assert second.proposed_len[2] == 3 and second.acc_len[2] == 4
    assert first.acc_len[2] == 1  # a saw nothing before it
    # The same requests the other way round give a different trace for a.
    again = trace_suffix([b, a], SuffixParams(max_spec_factor=4.0))[1]
    assert again.acc_len[2] == 4


def test_trace_matches_the_from_scratch_reference():
    rng = np.random.default_rng(0)
    reqs = [(list(rng.integers(0, 4, 30)), list(rng.integers(0, 4, 25))) for _ in range(3)]
    params = SuffixParams(num_speculative_tokens=5, max_tree_depth=6, min_token_prob=0.05)
    traces = trace_suffix(reqs, params)
    for r, (prompt, output) in enumerate(reqs):
        earlier = [o for _, o in reqs[:r]]
        for j in range(1, len(output)):
            draft = propose_suffix_reference(prompt, output[:j], earlier, params)
            assert traces[r].proposed_len[j] == len(draft)
            acc = 0
            while acc < len(draft) and j + acc < len(output) and draft[acc] == output[j + acc]:
                acc += 1
            assert traces[r].acc_len[j] == acc + 1


# ----------------------------------------------------------------------------- tables
def _requests() -> list[TokenRequest]:
    rng = np.random.default_rng(1)
    return [
        TokenRequest(f"r{i}", [int(t) for t in rng.integers(0, 5, 40)], [int(t) for t in rng.integers(0, 5, 30)])
        for i in range(4)
    ]


def test_table_schema_equals_the_ngram_tracers():
    reqs = _requests()
    suffix, ngram = suffix_trace_table(reqs), ngram_trace_table(reqs)
    assert list(suffix.columns) == list(ngram.columns)
    assert dict(suffix.dtypes.astype(str)) == dict(ngram.dtypes.astype(str)) == TRACE_DTYPES
    assert suffix[["request_id", "position"]].equals(ngram[["request_id", "position"]])
    assert set(suffix["method"]) == {"suffix"}
    assert (suffix.loc[suffix["position"] == 0, "acc_len"] == 1).all()


def test_cli_is_deterministic_and_writes_a_trace_table(tmp_path):
    reqs = _requests()
    table = pd.DataFrame(
        {
            "request_id": [r.request_id for r in reqs],
            "prompt_token_ids": [r.prompt_token_ids for r in reqs],
            "output_token_ids": [r.output_token_ids for r in reqs],
        }
    )
    write_parquet(table, tmp_path / "requests.parquet")
    outs = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.parquet"
        args = ["trace", "suffix", "--input", str(tmp_path / "requests.parquet"), "--output", str(out),
                "--num-speculative-tokens", "7", "--method", "suffix (offline)"]
        assert main(args) == 0
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    df = read_trace_table(tmp_path / "a.parquet")
    assert set(df["method"]) == {"suffix (offline)"} and df["proposed_len"].max() <= 7


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--min-token-prob", "1.5", "--min-token-prob must be in [0, 1], got 1.5"),
        ("--max-tree-depth", "0", "--max-tree-depth must be >= 1, got 0"),
        ("--num-speculative-tokens", "0", "--num-speculative-tokens must be >= 1, got 0"),
        ("--max-spec-factor", "-1", "--max-spec-factor must be >= 0, got -1.0"),
    ],
)
def test_cli_bad_option_is_one_line(tmp_path, capsys, option, value, message):
    args = ["trace", "suffix", "--input", str(tmp_path / "none.parquet"), "--output", str(tmp_path / "o.parquet"),
            option, value]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err
    assert not (tmp_path / "o.parquet").exists()


def test_cli_bad_input_names_the_file(tmp_path, capsys):
    bad = tmp_path / "req.parquet"
    write_parquet(pd.DataFrame({"request_id": ["r0"], "prompt_token_ids": [[1]]}), bad)
    assert main(["trace", "suffix", "--input", str(bad), "--output", str(tmp_path / "o.parquet")]) == 2
    err = capsys.readouterr().err.strip()
    assert str(bad) in err and "output_token_ids" in err and "\n" not in err


def test_too_many_requests_for_the_global_cache_are_refused():
    with pytest.raises(ValueError, match="max_cached_requests=1"):
        trace_suffix([([1], [2]), ([1], [2])], SuffixParams(max_cached_requests=1))


# ----------------------------------------------------------------------------- engine gating
CPU = {"vllm_version": "0.32.0", "device": "cpu"}
GPU_0_10 = {"vllm_version": "0.10.1.1", "device": "cuda"}
GPU_0_11 = {"vllm_version": "0.11.1", "device": "cuda"}


def test_suffix_gating_per_version():
    assert "added in 0.11" in unsupported_reason(GPU_0_10, "suffix")
    assert "added in 0.11" in unsupported_reason({**GPU_0_10, "patches": ["arctic_inference"]}, "suffix")
    reason = unsupported_reason(GPU_0_11, "suffix")
    assert "arctic-inference==0.1.1" in reason and "patches: [arctic_inference]" in reason
    assert unsupported_reason({**GPU_0_11, "patches": ["arctic_inference"]}, "suffix") is None
    reason = unsupported_reason(CPU, "suffix")
    assert "sdist" in reason and "lock.txt" in reason
    # Nothing else changes for an engine that carries arctic-inference.
    assert unsupported_reason({**GPU_0_11, "patches": ["arctic_inference"]}, "draft_model") is not None
