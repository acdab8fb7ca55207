"""``sdbench bench modes``' pieces without a server: the interleaved start order, an arm's summary
row (timed streamed rounds only; the stream-off control apart), and the widths it reports."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from sdbench.bench.modes import arm_summary, width_rows
from sdbench.servermode import start_order


def test_start_s_of_every_method_runs_before_start_s_plus_one() -> None:
    assert start_order(["none", "ngram-k3"], 2, True) == [(0, "none"), (0, "ngram-k3"), (1, "ngram-k3"), (1, "none")]


def test_an_arm_summary_counts_timed_streamed_rounds_and_keeps_the_control_apart() -> None:
    """Rounds 0 and 1 (4 s and 2 s walls, 2 x 100 tokens each): 50 and 100 tok/s, median 75. The
    control round (1000, stream off) of 2 x 150 tokens in 3 s: 100 tok/s, never in the timed figures."""
    rows = pd.DataFrame([dict(round=r, index=i, num_output_tokens=t, num_prompt_tokens=5, ttft_s=0.01, tpot_s=0.001,
                              latency_s=0.2, chunk_gaps_s=[], stream=s)
                         for r, t, s in ((0, 100, True), (1, 100, True), (1000, 150, False)) for i in range(2)])  # fmt: skip
    keys = dict(engine="e", model="m", dataset="d", method="ngram-k3", concurrency=2)
    s = arm_summary(keys, {"method": "ngram", "num_speculative_tokens": 3}, rows, [4.0, 2.0], [0, 1], [1, 3], "j",
                    [3.0], [300], 10, 15).iloc[0]  # fmt: skip
    assert (s["tokens_per_s"], s["tokens_per_s_min"], s["tokens_per_s_max"]) == (75.0, 50.0, 100.0)
    assert s["stream_off_tokens_per_s"] == 100.0 and s["mean_output_tokens"] == 100.0
    assert s["mean_acceptance_length"] == pytest.approx(2.5) and s["starts"] == 2 and bool(s["interleaved"])
    assert list(s["round_start"]) == [0, 1] and list(s["start_sequence"]) == [1, 3] and s["job_id"] == "j"


def test_widths_compare_the_same_data_drawn_both_ways() -> None:
    """Both arms slow down alike from start to start (x1, x2, x4), SD 1.5 x no SD in each: drawn by
    joint starts the ratio's interval is the point; drawn as rounds only (independently per arm) it is wide."""
    from tests.analysis.test_goodput_starts import arm

    base, sd = arm("none", [100.0, 200.0, 400.0], sequence=[0, 2, 4]), arm("ngram-k3", [150.0, 300.0, 600.0],
                                                                          sequence=[1, 3, 5])  # fmt: skip
    cells = pd.DataFrame([base[0], sd[0]])
    rows = {r["resample"]: r for r in width_rows(cells, pd.concat([base[1], sd[1]]), {"d": {"ttft_ms": 100}}, 42)}
    assert rows["starts"]["pairing"] == "paired" and rows["rounds"]["pairing"] == "unpaired"
    assert (rows["starts"]["speedup_ci_low"], rows["starts"]["speedup_ci_high"]) == pytest.approx((1.5, 1.5))
    assert rows["rounds"]["speedup_ci_high"] - rows["rounds"]["speedup_ci_low"] > 1.0
    assert rows["rounds"]["goodput_ratio_ci_low"] < 1.0 < rows["rounds"]["goodput_ratio_ci_high"]
    assert not any(math.isnan(v) for v in (rows["starts"]["goodput_ratio"], rows["rounds"]["speedup"]))
    assert np.isclose(rows["starts"]["speedup"], 1.5)
