"""``sdbench bench modes`` times its loads under the quiet-machine guard and writes its verdict
(sdbench.bench.modes.measure_load, arm_summary).

Fast: a synthetic client and server (no vLLM); the guard reads the real /proc, beside a busy
process of the test's making.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import pandas as pd

from sdbench.bench.modes import arm_summary, measure_load, new_part
from sdbench.engine.measure.counters import SDCounters
from sdbench.engine.serving.loadgen import RequestResult
from sdbench.engine.site.quietguard import merge_reports


class _Client:
    """Round r of a level: 1 + r seconds of wall, 10 tokens per request (a control's: 20 in 1 s)."""

    def __init__(self) -> None:
        self.rounds: list[tuple[int, bool]] = []

    def run_level(self, num_requests: int, round_: int, stream: bool = True, **level: Any):
        self.rounds.append((round_, stream))
        tokens = 10 if stream else 20
        results = [RequestResult(round_, i, f"r{i}", 3, tokens, 0.0, 0.1 if stream else math.nan, 0.5,
                                 0.01 if stream else math.nan, 3 if stream else 1, [0.1] if stream else [])
                   for i in range(num_requests)]  # fmt: skip
        return results, (1.0 + round_ if round_ >= 0 and stream else 1.0)

    def read_metrics(self, base_url: str) -> SDCounters:
        n = len(self.rounds)
        return SDCounters(n, 3 * n, 2 * n, (n,))


SERVER = SimpleNamespace(base_url="http://127.0.0.1:1", check_alive=lambda: None)
LEVEL = {"base_url": SERVER.base_url, "prompts": [("p0", [1, 2, 3])], "max_tokens": 10, "concurrency": 2}
KEYS = {"engine": "e", "model": "m", "dataset": "d", "method": "ngram-k3", "concurrency": 2}


def _summary(part: dict[str, Any], guard: Any = None) -> pd.Series:
    rows = pd.DataFrame(part["rows"]).assign(**KEYS)
    return arm_summary(KEYS, {"method": "ngram", "num_speculative_tokens": 3}, rows, part["walls"],
                       part["round_start"], [0], "j", part["off_walls"], part["off_tokens"], part["drafts"],
                       part["accepted"], guard).iloc[0]  # fmt: skip


def test_a_load_beside_a_busy_process_is_written_contaminated() -> None:
    out = subprocess.run(
        ["bash", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, check=True,
    )  # outside the test's family (re-parented to init)
    burner = int(out.stdout.strip())
    try:
        time.sleep(0.3)
        part, client = new_part(), _Client()
        streamed = measure_load(SERVER, LEVEL, part, 0, 1, 2, 2, "flag", client)
    finally:
        os.kill(burner, signal.SIGKILL)
    assert client.rounds == [(-1, True), (0, True), (1, True), (1000, False)]
    assert streamed == 40 / 3 and part["drafts"] == 2  # 2 rounds x 2 requests x 10 tokens over 1 s + 2 s
    (report,) = part["guards"]
    assert report.mode == "flag" and report.samples >= 2 and report.contaminated
    assert any(name.startswith(f"{burner} ") for name in report.busy), report.busy
    row = _summary(part, merge_reports(part["guards"]))
    assert bool(row["contaminated"]) and "busy processes" in row["contamination"]
    assert row["quiet_guard"] == "flag" and row["guard_samples"] == report.samples
    assert {"guard_other_cpu_s", "guard_cpu_pressure_s", "guard_steal_s", "guard_scope"} <= set(row.index)


def test_a_disabled_guard_is_written_as_such() -> None:
    part = new_part()
    measure_load(SERVER, LEVEL, part, 0, 0, 1, 1, "disabled", _Client())
    row = _summary(part, merge_reports(part["guards"]))
    assert row["quiet_guard"] == "disabled" and not bool(row["contaminated"]) and row["guard_samples"] == 0
    assert _summary(part)["quiet_guard"] == "disabled"  # no report given: no guard ran
