"""A cell checkpointed inside (sdbench.engine.progress): killed after some calls, then resumed.

The engine here is a test double (no vLLM engine can start in a fast test; the slow end-to-end
tests time real ones): ``FakeLLM`` answers ``generate`` with outputs derived from the prompt ids
and advances a fake clock by a duration that depends on the call's prompts only, so the same call
takes the same time in every run; it raises :class:`Killed` after a given number of calls, as a
job killed by its time limit stops. Everything else -- ``CellRun``, ``timed_part``, the trial
rules, the paired arms, the tables -- is the real code, through the ``Engine`` seam.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

from sdbench.engine.engine import Engine
from sdbench.engine.hardware import hardware
from sdbench.engine.paired import measure_paired
from sdbench.engine.progress import Progress
from sdbench.engine.trials import measure_cell

KEYS = {"engine": "vllm-cpu", "model": "tiny", "dataset": "d", "method": "ngram", "batch_size": 2}
PROMPTS = pd.DataFrame({"request_id": [f"r{i}" for i in range(3)], "prompt_token_ids": [[5, 6, 7], [8, 9], [10, 11, 12, 13]]})
# Hardware this machine is not (a fake provenance record).
ELSEWHERE = {"node": "gpu017", "cpu_model": "AMD EPYC 9454", "cpu_count": 96, "gpus": ["NVIDIA H100 80GB HBM3"],
             "gpu_memory_mib": [81559], "driver": "550.54.15"}  # fmt: skip


class Killed(BaseException):
    """The job's end, raised by FakeLLM: as a signal ends a process, nothing on the way catches it."""


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeLLM:
    """TEST DOUBLE of ``vllm.LLM``: deterministic outputs and durations; ``Killed`` at its first
    call (``generate``, or the memory report after the timed part) once ``calls_left`` generate
    calls are spent."""

    def __init__(self, clock: FakeClock, speed: float, calls_left: int | None = None) -> None:
        self.clock, self.speed, self.calls_left = clock, speed, calls_left

    def _alive(self) -> None:
        if self.calls_left == 0:
            raise Killed("time limit")

    def generate(self, prompts: list[list[int]], sampling: Any, use_tqdm: bool = False) -> list[Any]:
        self._alive()
        if self.calls_left is not None:
            self.calls_left -= 1
        self.clock.now += self.speed * (0.5 + 0.01 * sum(sum(p) for p in prompts))
        return [
            SimpleNamespace(outputs=[SimpleNamespace(token_ids=[(t * 7 + 3) % 101 for t in p] + [2], text="",
                                                     finish_reason="stop")])
            for p in prompts
        ]  # fmt: skip

    def get_metrics(self) -> list[Any]:
        return []

    def collective_rpc(self, *args: Any, **kwargs: Any) -> list[Any]:
        self._alive()
        return []  # no workers: memory columns NaN


class FakeEngine(Engine):
    """TEST DOUBLE engine: takes a prompt as its token ids."""

    def prompt(self, token_ids: Any) -> Any:
        return [int(t) for t in token_ids]


def spec(paired: bool = False, **run: Any) -> dict[str, Any]:
    out = {
        "cell": dict(KEYS),
        "seed": 0,
        "method": {"method": "ngram", "num_speculative_tokens": 3},
        "dataset": {"max_tokens": 8},
        "run": {"batch_mode": "replicate", "warmup_requests": 1, "repeats": 3, **run},
    }
    if paired:
        out["paired_baseline"] = {"key": "none", "method": {"method": "none"}}
    return out


def engines(calls_left: int | None) -> list[FakeEngine]:
    """[SD engine, no-SD engine] on one clock; the SD one is killed after ``calls_left`` calls."""
    clock = FakeClock()
    return [FakeEngine(FakeLLM(clock, 1.0, calls_left), {}, 0.0, clock=clock),
            FakeEngine(FakeLLM(clock, 1.7), {}, 0.0, clock=clock)]  # fmt: skip


def measure(cell_spec: dict[str, Any], calls_left: int | None, progress: Progress | None) -> dict[str, pd.DataFrame]:
    sd, base = engines(calls_left)
    if "paired_baseline" in cell_spec:
        return measure_paired(sd, base, cell_spec, PROMPTS, "disabled", progress)
    requests, calls, summary, _ = measure_cell(sd, cell_spec, PROMPTS, None, "disabled", progress)
    return {"requests": requests, "calls": calls, "summary": summary}


def killed_then_resumed(
    cell_spec: dict[str, Any], calls: int, path: Path, every_s: float = 0.0, **progress: Any
) -> dict[str, pd.DataFrame]:
    """The cell killed after ``calls`` generate calls of its SD engine (its warm-up's included),
    then measured again on fresh engines with the same partial checkpoint."""
    with pytest.raises(Killed):
        measure(cell_spec, calls, Progress(path, hardware(), "disabled", every_s))
    return measure(cell_spec, None, Progress(path, progress.pop("here", hardware()), progress.pop("mode", "disabled"), every_s))


ROW_TABLES = ("requests", "calls", "baseline_calls")
SAME_SUMMARY = ("num_trials", "num_calls", "num_sequences", "tokens_per_s", "tokens_per_s_ci_low",
                "tokens_per_s_ci_high", "generate_s", "outputs_stable", "warmup_s", "paired_speedup")  # fmt: skip


def assert_same_measurement(got: dict[str, pd.DataFrame], want: dict[str, pd.DataFrame]) -> None:
    for name in ROW_TABLES:
        if name in want:
            pd.testing.assert_frame_equal(got[name], want[name])
    for column in SAME_SUMMARY:
        if column in want["summary"]:
            assert got["summary"].at[0, column] == pytest.approx(want["summary"].at[0, column], nan_ok=True), column


@pytest.mark.parametrize("paired", [False, True])
# Timed calls done before the kill (3 per trial): within trial 0, trial 0's last, within trial 1.
@pytest.mark.parametrize("calls", [2, 3, 5])
def test_a_killed_cell_resumes_at_its_next_call_and_measures_what_an_uninterrupted_one_does(
    tmp_path: Path, paired: bool, calls: int
) -> None:
    cell_spec = spec(paired)
    whole = measure(cell_spec, None, None)
    assert len(whole["calls"]) == 9 and not whole["summary"].at[0, "resumed"]  # 3 trials x 3 calls
    path = tmp_path / ".progress" / "key"
    resumed = killed_then_resumed(cell_spec, 1 + calls, path)  # 1 warm-up call
    assert_same_measurement(resumed, whole)
    assert resumed["summary"].at[0, "resumed"] and resumed["summary"].at[0, "num_resumes"] == 1


def test_the_stopping_rule_decides_a_resumed_trial_as_it_would_have(tmp_path: Path) -> None:
    """Killed after trial 1's last call (its tables not yet written): the resumed cell judges that
    trial first and stops there (min_measured_s met), as the uninterrupted one did: no third trial."""
    # A trial times 3 calls of 0.5 + 0.01 x (prompt ids summed, 2 replicas) s: 0.86 + 0.84 + 1.42 = 3.12 s.
    cell_spec = spec(repeats=1, min_measured_s=5.0)
    whole = measure(cell_spec, None, None)
    assert whole["summary"].at[0, "num_trials"] == 2
    resumed = killed_then_resumed(cell_spec, 1 + 6, tmp_path / "p")
    assert_same_measurement(resumed, whole)
    assert resumed["summary"].at[0, "num_trials"] == 2


def test_calls_after_the_last_shard_are_timed_again(tmp_path: Path) -> None:
    """Shards every 2 s of timed calls (calls of 0.86, 0.84, 1.42 s): a kill after 5 calls keeps the
    first 3 (3.12 s; the next shard was due after call 6), and the resumed cell times calls 4-5
    again; without any shard it starts over, unflagged."""
    cell_spec = spec()
    whole = measure(cell_spec, None, None)
    resumed = killed_then_resumed(cell_spec, 1 + 5, tmp_path / "a", every_s=2.0)
    states = [json.loads((d / "state.json").read_text()) for d in sorted((tmp_path / "a").iterdir())]
    # (trial, call) of each shard: the killed run's one, then the resumed run's, every 3.12 s.
    assert [(s["position"], s["segment"]) for s in states] == [([0, 2], 0), ([1, 2], 1), ([2, 2], 1)]
    assert_same_measurement(resumed, whole)
    assert resumed["summary"].at[0, "num_resumes"] == 1
    fresh = killed_then_resumed(cell_spec, 1 + 2, tmp_path / "b", every_s=100.0)
    assert_same_measurement(fresh, whole)
    assert not fresh["summary"].at[0, "resumed"]


def test_progress_from_other_hardware_or_a_refused_guard_is_discarded(tmp_path: Path, caplog) -> None:
    cell_spec = spec()
    whole = measure(cell_spec, None, None)
    with caplog.at_level(logging.INFO, logger="sdbench.engine.progress"):
        moved = killed_then_resumed(cell_spec, 1 + 4, tmp_path / "hw", here=ELSEWHERE)
    assert_same_measurement(moved, whole)
    assert not moved["summary"].at[0, "resumed"]
    # The killed job ran here; its rerun "lands on" an H100 node.
    line = next(r.getMessage() for r in caplog.records if "ran on" in r.getMessage())
    assert f"its calls ran on node {hardware()['node']}: " in line
    assert "this job runs on node gpu017: 96 x AMD EPYC 9454, 1 x NVIDIA H100 80GB HBM3 (81,559 MiB), driver " \
           "550.54.15: not resumed" in line  # fmt: skip

    path = tmp_path / "guard"
    with pytest.raises(Killed):
        measure(cell_spec, 1 + 4, Progress(path, hardware(), "disabled", 0.0))
    for state in path.glob("*/state.json"):  # the guard of the killed process saw a neighbour
        data = json.loads(state.read_text())
        data["guard"]["reasons"] = ["busy processes: 4242 stress (98% CPU)"]
        state.write_text(json.dumps(data))
    kept = measure(cell_spec, None, Progress(path, hardware(), "flag", 0.0))
    assert kept["summary"].at[0, "resumed"]  # flag mode: resumed, and flagged (below)
    assert "engine process 1 of 2: busy processes: 4242 stress" in kept["summary"].at[0, "contamination"]
    assert kept["summary"].at[0, "contaminated"] and kept["calls"]["contaminated"].all()
    with pytest.raises(Killed):
        measure(cell_spec, 1 + 4, Progress(tmp_path / "refuse", hardware(), "disabled", 0.0))
    for state in (tmp_path / "refuse").glob("*/state.json"):
        data = json.loads(state.read_text())
        data["guard"]["reasons"] = ["busy processes: 4242 stress (98% CPU)"]
        state.write_text(json.dumps(data))
    refused = measure(cell_spec, None, Progress(tmp_path / "refuse", hardware(), "refuse", 0.0))
    assert not refused["summary"].at[0, "resumed"] and not refused["summary"].at[0, "contaminated"]
    assert_same_measurement(refused, whole)
