"""A cell's requests table (sdbench.requesttable): no prompt token ids, a call's equal outputs
stored once, and every consumer (aggregate's Tab. 1 and divergence, BLEU buckets, the offline
tracers, the engine-start merge) still computing per-sequence values, checked against hand values.

The cell here is timed through the real CellRun code on a stand-in engine: ``StandInLLM`` is a
test double of ``vllm.LLM`` (the slow end-to-end tests run the real one) that returns given
outputs, through the ``Engine`` seam a stand-in engine uses (its own clock and prompt builder).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from sdbench.engine.measure.engine import Engine
from sdbench.engine.measure.trials import CellRun, timed_part
from sdbench.io import write_parquet
from sdbench.requesttable import expand_outputs, same_outputs

KEYS = {"engine": "e", "model": "m", "dataset": "d"}
REPO = Path(__file__).resolve().parents[2]


class StandInLLM:
    """Test double of ``vllm.LLM``: ``outputs(trial, prompt ids, slot)`` gives each sequence's tokens."""

    def __init__(self, outputs: Any) -> None:
        self.outputs, self.calls = outputs, 0

    def generate(self, prompts: list[list[int]], sampling: Any, use_tqdm: bool = False) -> list[Any]:
        trial = self.calls // 2  # two prompts, one call each, per trial
        self.calls += 1
        done = []
        for slot, ids in enumerate(prompts):
            tokens = self.outputs(trial, ids, slot)
            completion = SimpleNamespace(token_ids=tokens, text=" ".join(map(str, tokens)), finish_reason="length")
            done.append(SimpleNamespace(outputs=[completion]))
        return done

    def get_metrics(self) -> list[Any]:
        return []


def _timed_cell(outputs: Any, trials: int = 2) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(requests, summary) of a 2-prompt cell at batch size 4 in replicate mode, ``trials`` trials."""
    ticks = itertools.count()
    engine = Engine(StandInLLM(outputs), {}, 0.0, clock=lambda: float(next(ticks)))
    engine.prompt = lambda ids: [int(t) for t in ids]  # type: ignore[method-assign]
    prompts = pd.DataFrame({"request_id": ["a", "b"], "prompt_token_ids": [[11, 12, 13, 14], [21, 22, 23]],
                            "max_tokens": [8, 8]})  # fmt: skip
    spec = {"seed": 1, "cell": {**KEYS, "method": "none", "batch_size": 4}, "method": {"method": "none"},
            "run": {"repeats": trials, "batch_mode": "replicate"}, "dataset": {"max_tokens": 8}}  # fmt: skip
    run = CellRun(engine, spec, prompts)
    requests, _, summary, _ = run.tables(timed_part([run], spec["run"], "disabled"))
    return requests, summary


def _slot2_differs(trial: int, ids: list[int], slot: int) -> list[int]:
    """Each prompt's first two tokens; slot 2 of every call adds a token (its replica diverged)."""
    return ids[:2] + ([99] if slot == 2 else [])


def test_a_replicated_calls_equal_outputs_are_stored_once(tmp_path: Path) -> None:
    requests, summary = _timed_cell(_slot2_differs)
    assert "prompt_token_ids" not in requests
    assert list(requests["num_prompt_tokens"]) == [4] * 4 + [3] * 4
    assert list(requests["output_slot"]) == [0, 0, 2, 0] * 2
    stored = requests["output_token_ids"].notna()
    assert list(stored) == [True, False, True, False] * 2 and requests.loc[~stored, "output_text"].isna().all()
    assert list(requests["num_output_tokens"]) == [2, 2, 3, 2] * 2
    full = expand_outputs(requests)
    assert [list(x) for x in full["output_token_ids"]] == [[11, 12], [11, 12], [11, 12, 99], [11, 12],
                                                           [21, 22], [21, 22], [21, 22, 99], [21, 22]]  # fmt: skip
    assert list(full["output_text"]) == ["11 12", "11 12", "11 12 99", "11 12", "21 22", "21 22", "21 22 99", "21 22"]
    row = summary.iloc[0]
    assert row["outputs_stable"] and row["num_sequences"] == 8 and row["output_len_mean"] == pytest.approx(18 / 8)
    write_parquet(requests, tmp_path / "requests.parquet")
    assert str(pq.read_schema(tmp_path / "requests.parquet").field("output_token_ids").type) == "list<element: int32>"


def test_an_output_that_changes_in_a_later_trial_is_seen_through_the_stored_one() -> None:
    """Trial 1's slot 3 of prompt b differs from trial 0's, which is stored by reference to slot 0."""

    def outputs(trial: int, ids: list[int], slot: int) -> list[int]:
        return ids[:2] + ([7] if (trial, ids[0], slot) == (1, 21, 3) else [])

    requests, summary = _timed_cell(outputs)
    assert list(requests["output_slot"]) == [0] * 8
    assert not summary.iloc[0]["outputs_stable"]
    _, stable = _timed_cell(lambda trial, ids, slot: ids[:2])
    assert stable.iloc[0]["outputs_stable"]


def _cell_rows(method: str, bs: int, calls: list[tuple[str, list[tuple[int, list[int] | None]]]]) -> pd.DataFrame:
    """Requests rows of one cell: per call (request id, [(output_slot, ids or None)] by slot)."""
    rows = []
    for call_index, (rid, slots) in enumerate(calls):
        for slot, (output_slot, ids) in enumerate(slots):
            own = next(x for s, (o, x) in enumerate(slots) if s == output_slot)
            rows.append({**KEYS, "method": method, "batch_size": bs, "call_index": call_index, "slot": slot,
                         "request_id": rid, "output_slot": output_slot,
                         "output_token_ids": None if ids is None else np.asarray(ids, dtype=np.int32),
                         "output_text": None if ids is None else "x", "num_prompt_tokens": 4,
                         "num_output_tokens": len(own or []), "finish_reason": "length"})  # fmt: skip
    return pd.DataFrame(rows)


def _summary(method: str, bs: int) -> pd.DataFrame:
    return pd.DataFrame([{**KEYS, "method": method, "batch_size": bs, "tokens_per_s": 10.0, "tokens_per_s_pooled": 5.0}])


def test_aggregate_streams_lengths_and_divergence_file_by_file(tmp_path: Path) -> None:
    """Two cells in two files: the no-SD reference at batch 1, n-gram at batch 2 whose replicas of
    request b are stored once and differ from the reference at position 1."""
    from sdbench.analysis.endtoend import output_divergence
    from sdbench.cli import main

    none = _cell_rows("none", 1, [("a", [(0, [1, 2, 3])]), ("b", [(0, [4, 5])])])
    ngram = _cell_rows("ngram", 2, [("a", [(0, [1, 2, 3]), (0, None)]), ("b", [(0, [4, 6, 7]), (0, None)])])
    paths = []
    for name, (requests, summary) in {"none": (none, _summary("none", 1)), "ngram": (ngram, _summary("ngram", 2))}.items():
        write_parquet(requests, tmp_path / f"{name}_requests.parquet")
        write_parquet(summary, tmp_path / f"{name}_summary.parquet")
        paths.append(name)
    out = {n: tmp_path / f"{n}.parquet" for n in ("cells", "lengths", "divergence")}
    assert main(["aggregate", "--summaries", *[str(tmp_path / f"{n}_summary.parquet") for n in paths],
                 "--requests", *[str(tmp_path / f"{n}_requests.parquet") for n in paths], "--baseline", "none",
                 "--cells", str(out["cells"]), "--lengths", str(out["lengths"]),
                 "--divergence", str(out["divergence"])]) == 0  # fmt: skip
    lengths = pd.read_parquet(out["lengths"]).set_index("method")
    # none: lengths 3, 2 -> mean 2.5, population std 0.5; ngram: 3, 3, 3, 3.
    assert (lengths.loc["none", "output_len_mean"], lengths.loc["none", "output_len_std"], lengths.loc["none", "n"]) == (2.5, 0.5, 2)
    assert (lengths.loc["ngram", "output_len_mean"], lengths.loc["ngram", "output_len_std"], lengths.loc["ngram", "n"]) == (3.0, 0.0, 4)
    divergence = pd.read_parquet(out["divergence"]).set_index("method")
    # ngram: a's two sequences equal the reference, b's two differ first at position 1.
    assert (divergence.loc["ngram", "n"], divergence.loc["ngram", "share_differs"]) == (4, 0.5)
    assert divergence.loc["ngram", "first_diff_mean"] == 1.0
    assert (divergence.loc["none", "share_differs"], np.isnan(divergence.loc["none", "first_diff_mean"])) == (0.0, True)
    assert divergence.loc["ngram", "reference"] == "greedy no-SD"
    in_memory = output_divergence(pd.concat([none, ngram], ignore_index=True), "none").set_index("method")
    assert (in_memory.loc["ngram", "n"], in_memory.loc["ngram", "share_differs"]) == (4, 0.5)


def test_a_cell_in_two_requests_tables_is_refused(tmp_path: Path) -> None:
    from sdbench.analysis.endtoend import aggregate_requests

    cell = _cell_rows("none", 1, [("a", [(0, [1, 2])])])
    for name in ("one", "two"):
        write_parquet(cell, tmp_path / f"{name}.parquet")
    with pytest.raises(ValueError, match=r"in more than one requests table \(.*one\.parquet, .*two\.parquet\)"):
        aggregate_requests([str(tmp_path / "one.parquet"), str(tmp_path / "two.parquet")], "none")


def _prompt_table(path: Path) -> Path:
    write_parquet(pd.DataFrame({"request_id": ["a", "b"], "prompt_token_ids": [[1, 2, 3, 4], [8, 9]],
                                "prompt_text": ["one two", "three"]}), path)  # fmt: skip
    return path


def test_bleu_and_the_offline_tracers_take_prompt_ids_from_the_prompt_table(tmp_path: Path) -> None:
    """Request a's output repeats its prompt (BLEU 1), b's shares no token with its prompt (BLEU 0);
    b's second replica is stored by reference and still gets its own row."""
    from sdbench.analysis.bleu import compute_buckets, read_requests
    from sdbench.traces.table import read_token_requests

    prompts = _prompt_table(tmp_path / "prompts.parquet")
    cell = _cell_rows("none", 2, [("a", [(0, [1, 2, 3, 4]), (1, [1, 2])]), ("b", [(0, [5, 6, 7]), (0, None)])])
    write_parquet(cell, tmp_path / "requests.parquet")
    tokens = read_token_requests(tmp_path / "requests.parquet", prompts)
    assert [(r.request_id, r.prompt_token_ids, r.output_token_ids) for r in tokens] == [
        ("a", [1, 2, 3, 4], [1, 2, 3, 4]), ("a", [1, 2, 3, 4], [1, 2]),
        ("b", [8, 9], [5, 6, 7]), ("b", [8, 9], [5, 6, 7])]  # fmt: skip
    write_parquet(cell.iloc[[0, 2]].reset_index(drop=True), tmp_path / "bs1.parquet")  # one row per request
    requests = read_requests(tmp_path / "bs1.parquet", prompts)
    assert "prompt_text" not in requests  # the prompt table's text would switch BLEU to text
    buckets = compute_buckets(requests, order=4)
    assert buckets.attrs["bleu_basis"] == "token_ids" and list(buckets["bleu"]) == [1.0, 0.0]
    with pytest.raises(ValueError, match=r"requests\.parquet: requests table lacks column\(s\) prompt_token_ids .*"
                                         r"give --prompts, its prompt table"):  # fmt: skip
        read_token_requests(tmp_path / "requests.parquet")


def test_a_request_missing_from_the_prompt_table_is_named(tmp_path: Path) -> None:
    from sdbench.traces.table import read_token_requests

    write_parquet(_cell_rows("none", 1, [("z", [(0, [1])])]), tmp_path / "requests.parquet")
    with pytest.raises(ValueError, match=r"requests\.parquet \(prompts .*prompts\.parquet\): request\(s\) z not in"):
        read_token_requests(tmp_path / "requests.parquet", _prompt_table(tmp_path / "prompts.parquet"))


def test_engine_starts_compare_outputs_sequence_by_sequence() -> None:
    """One start stored b's replica by reference, the other on its own row: the same outputs."""
    by_reference = _cell_rows("none", 2, [("b", [(0, [4, 5]), (0, None)])])
    own_rows = _cell_rows("none", 2, [("b", [(0, [4, 5]), (1, [4, 5])])])
    changed = _cell_rows("none", 2, [("b", [(0, [4, 5]), (1, [4, 6])])])
    assert same_outputs(by_reference, own_rows) and not same_outputs(by_reference, changed)


def test_a_reference_to_a_slot_without_an_output_is_refused() -> None:
    broken = _cell_rows("none", 2, [("b", [(1, None), (0, None)])])
    with pytest.raises(ValueError, match="call 0 refers to slot 1, which holds no output"):
        expand_outputs(broken)


def test_the_synthetic_grid_gives_the_same_tables_in_both_layouts(tmp_path: Path) -> None:
    """``bench aggregate-inputs``: every cell at num_prompts x batch size rows (code-edit: 8 prompts;
    batch sizes 1, 4, 8; two methods: 8 x 13 x 2 = 208), the same contents with and without the
    copied prompts; aggregate's tables of the two agree."""
    from sdbench.analysis.endtoend import aggregate_requests
    from sdbench.cli import main

    tables = {}
    for layout in ("compact", "full"):
        out = tmp_path / layout
        args = ["bench", "aggregate-inputs", "--config", str(REPO / "config" / "config.yaml"), "--output-dir", str(out),
                "--models", "tiny-target", "--datasets", "code-edit", "--methods", "none", "ngram-k3"]  # fmt: skip
        assert main(args + ["--full-rows"] * (layout == "full")) == 0
        paths = (out / "requests.txt").read_text().split()
        frames = [pd.read_parquet(p) for p in paths]
        assert len(paths) == 6 and sum(len(f) for f in frames) == 208
        assert all(("prompt_token_ids" in f) == (layout == "full") for f in frames)
        tables[layout] = aggregate_requests(paths, "none")
    for compact, full in zip(tables["compact"], tables["full"], strict=True):
        pd.testing.assert_frame_equal(compact, full, check_exact=True)


def test_the_ngram_tracer_reads_a_calls_equal_copies_once(tmp_path) -> None:
    """Three copies of one prompt, two of them equal: the per-request n-gram tracer reads the two
    distinct outputs (the equal copy's trace would be its slot's); every copy without ``distinct``."""
    import pandas as pd

    from sdbench.requesttable import RequestRows
    from sdbench.traces.table import read_token_requests

    rows = RequestRows()
    for slot, tokens in enumerate(([5, 6, 7], [5, 6, 7], [5, 6, 8])):
        rows.add(0, slot, "r0", tokens, "", 2, "stop", {})
    rows.frame().to_parquet(tmp_path / "requests.parquet")
    pd.DataFrame({"request_id": ["r0"], "prompt_token_ids": [[1, 2]]}).to_parquet(tmp_path / "prompts.parquet")
    distinct = read_token_requests(tmp_path / "requests.parquet", tmp_path / "prompts.parquet", distinct=True)
    assert [r.output_token_ids for r in distinct] == [[5, 6, 7], [5, 6, 8]]
    every = read_token_requests(tmp_path / "requests.parquet", tmp_path / "prompts.parquet")
    assert [r.output_token_ids for r in every] == [[5, 6, 7], [5, 6, 7], [5, 6, 8]]
    assert all(r.prompt_token_ids == [1, 2] for r in every)
