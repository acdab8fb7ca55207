"""The timed part of a cell (sdbench.engine.measure.trials.timed_part): call order and stopping rules.

The arms here are test doubles of ``sdbench.engine.measure.trials.CellRun`` (which times real
``generate`` calls on a started vLLM engine; the slow end-to-end test runs that): each fake
call logs its order, advances the arm's timed seconds by a given duration (the clock the
``min_measured_s`` rule reads) and records a call row with a given tokens/s (what the
``target_half_width`` rule bootstraps). The quiet-machine guard is the real one, disabled.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from sdbench.analysis import stats
from sdbench.engine.measure.summary import cell_seed
from sdbench.engine.measure.trials import timed_part


class FakeArm:
    """Test double of CellRun: ``num_calls`` calls per trial, each taking ``duration(trial, call)``
    seconds of the fake clock at ``tps(trial, call)`` tokens/s."""

    def __init__(
        self,
        name: str,
        log: list[tuple[int, int, str]],
        num_calls: int = 3,
        duration: Callable[[int, int], float] = lambda t, c: 1.0,
        tps: Callable[[int, int], float] = lambda t, c: 100.0,
    ) -> None:
        self.name, self.log, self.num_calls = name, log, num_calls
        self.duration, self.tps = duration, tps
        cell = {"engine": "vllm-cpu", "model": "tiny", "dataset": "code-edit", "method": name, "batch_size": 1}
        self.spec: dict[str, Any] = {"seed": 0, "cell": cell}
        self.engine = SimpleNamespace(layout="inprocess")  # both arms' engines in one layout
        self.timed_s = 0.0
        self.call_rows: list[dict[str, Any]] = []

    def time_call(self, trial: int, call_index: int) -> float:
        seconds = self.duration(trial, call_index)
        self.log.append((trial, call_index, self.name))
        self.timed_s += seconds
        self.call_rows.append({"trial": trial, "call_index": call_index, "tokens_per_s": self.tps(trial, call_index)})
        return seconds

    def trials(self) -> int:
        return len({row["trial"] for row in self.call_rows})


def run(arms: list[FakeArm], **plan: Any) -> int:
    """Trials the timed part ran (the same in every arm)."""
    report = timed_part(arms, {"repeats": 1, **plan}, "disabled")
    assert report.mode == "disabled" and not report.contaminated
    counts = {arm.trials() for arm in arms}
    assert len(counts) == 1, counts
    return counts.pop()


def test_arms_alternate_call_by_call_so_neither_always_goes_second() -> None:
    log: list[tuple[int, int, str]] = []
    base, sd = FakeArm("none", log), FakeArm("ngram", log)
    assert run([base, sd], repeats=2, max_repeats=2) == 2
    expected = []
    for trial in range(2):
        for call in range(3):
            first, second = ("none", "ngram") if (trial + call) % 2 == 0 else ("ngram", "none")
            expected += [(trial, call, first), (trial, call, second)]
    assert log == expected
    # Each pair is adjacent (the same call, same trial, back to back), and each arm leads half the time.
    leads = [log[i][2] for i in range(0, len(log), 2)]
    assert leads.count("none") == leads.count("ngram") == 3
    # One arm alone times its calls in plan order.
    solo: list[tuple[int, int, str]] = []
    assert run([FakeArm("none", solo)], repeats=2, max_repeats=2) == 2
    assert solo == [(t, c, "none") for t in range(2) for c in range(3)]


def test_repeats_is_the_minimum_and_the_slowest_arm_decides_min_measured_s() -> None:
    log: list[tuple[int, int, str]] = []
    # 3 calls per trial: the SD arm times 3 x 0.5 s = 1.5 s per trial, the no-SD arm 3 s.
    base = FakeArm("none", log, duration=lambda t, c: 1.0)
    sd = FakeArm("ngram", log, duration=lambda t, c: 0.5)
    assert run([base, sd], repeats=2, min_measured_s=4.0, max_repeats=50) == 3  # 4.5 s >= 4 after trial 3
    assert (base.timed_s, sd.timed_s) == (9.0, 4.5)
    fresh = [FakeArm("none", []), FakeArm("ngram", [], duration=lambda t, c: 0.5)]
    assert run(fresh, repeats=5, min_measured_s=4.0, max_repeats=50) == 5  # repeats, though 4 s came sooner
    assert run([FakeArm("none", [])], repeats=1, min_measured_s=0.0) == 1


def test_max_repeats_caps_every_other_rule_but_never_undercuts_repeats() -> None:
    assert run([FakeArm("none", []), FakeArm("ngram", [])], repeats=2, min_measured_s=1e9, max_repeats=4) == 4
    noisy = lambda t, c: 100.0 + 10 * ((t * 7 + c * 3) % 5)  # noqa: E731
    arms = [FakeArm("none", [], tps=noisy), FakeArm("ngram", [], tps=lambda t, c: 2 * noisy(t + 1, c))]
    assert run(arms, repeats=2, target_half_width=1e-9, max_repeats=5) == 5
    assert run([FakeArm("none", [])], repeats=6, min_measured_s=1e9, max_repeats=3) == 6


def _first_precise_trial(tps_base: np.ndarray, tps_sd: np.ndarray, target: float, seed: int, repeats: int) -> int:
    """The rule, replayed: the first trial count >= repeats whose paired half-width is <= target."""
    calls = []
    for arm in (tps_base, tps_sd):
        calls.append(
            pd.DataFrame(
                [
                    {"call_index": c, "trial": t, "tokens_per_s": arm[t, c]}
                    for t in range(arm.shape[0])
                    for c in range(arm.shape[1])
                ]
            )
        )
    for n in range(repeats, tps_base.shape[0] + 1):
        if stats.relative_half_width([frame[frame["trial"] < n] for frame in calls], seed) <= target:
            return n
    return tps_base.shape[0]


def test_target_half_width_stops_at_the_first_trial_whose_paired_interval_is_narrow_enough() -> None:
    rng = np.random.default_rng(7)
    max_repeats, calls_per_trial = 12, 3
    # A shared process speed per trial (both arms), and each arm's own noise on top.
    speed = rng.uniform(0.7, 1.3, size=(max_repeats, 1))
    base = 100.0 * speed * rng.uniform(0.95, 1.05, size=(max_repeats, calls_per_trial))
    sd = 180.0 * speed * rng.uniform(0.95, 1.05, size=(max_repeats, calls_per_trial))
    arms = [
        FakeArm("none", [], tps=lambda t, c: float(base[t, c])),
        FakeArm("ngram", [], tps=lambda t, c: float(sd[t, c])),
    ]
    target = 0.035
    trials = run(arms, repeats=3, target_half_width=target, max_repeats=max_repeats)
    assert trials == _first_precise_trial(base, sd, target, cell_seed(arms[-1].spec), 3)
    assert trials == 8  # the rule decided, neither bound (3, 12)
    # The paired ratio is what is judged: the shared speed cancels, so the throughput alone
    # (one arm, far noisier) needs more trials for the same target.
    alone = [FakeArm("ngram", [], tps=lambda t, c: float(sd[t, c]))]
    assert run(alone, repeats=3, target_half_width=target, max_repeats=max_repeats) == max_repeats
    # Steady arms meet any target at the minimum.
    steady = [FakeArm("none", []), FakeArm("ngram", [], tps=lambda t, c: 150.0)]
    assert run(steady, repeats=3, target_half_width=1e-9, max_repeats=max_repeats) == 3


@pytest.mark.parametrize("plan", [{}, {"repeats": 2}, {"repeats": 2, "max_repeats": 1}])
def test_without_time_or_precision_rules_the_cell_runs_exactly_repeats_trials(plan: dict[str, Any]) -> None:
    arms = [FakeArm("none", []), FakeArm("ngram", [])]
    assert run(arms, **plan) == max(1, plan.get("repeats", 1))
