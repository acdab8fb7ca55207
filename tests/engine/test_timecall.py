"""What a timed call records (sdbench.engine.measure.trials.CellRun.time_call) and when the trials stop.

A stand-in engine through the real seam (``sdbench.engine.measure.engine.Engine``: its ``clock`` and
``prompt``): a test double of ``vllm.LLM`` (no engine can decode here in a fast test) whose
outputs have known token counts per sequence, whose SD counters grow by known amounts, and whose
clock advances by a known number of seconds per ``generate`` call. The timing, counting and
stopping code is the package's, unchanged. Expected values are hand arithmetic.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

from tests.support.require import import_or_fail


class FakeClock:
    """Seconds that move only when the fake engine generates."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeLLM:
    """Test double of ``vllm.LLM``: ``generate`` returns, for the sequence in slot ``s``,
    ``lengths[s % len(lengths)]`` output tokens, advances ``clock`` by the next of ``durations``
    and adds ``drafts``/``accepted`` to its cumulative SD counters."""

    def __init__(self, clock: FakeClock, lengths: list[int], durations: list[float], drafts: int = 0,
                 accepted: int = 0) -> None:  # fmt: skip
        self.clock, self.lengths, self.durations = clock, lengths, list(durations)
        self.drafts, self.accepted = drafts, accepted
        self.totals = {"drafts": 0, "accepted": 0}
        self.calls: list[list[Any]] = []

    def generate(self, prompts: list[Any], sampling: Any, use_tqdm: bool = False) -> list[Any]:
        self.calls.append(prompts)
        self.clock.now += self.durations.pop(0)
        self.totals["drafts"] += self.drafts
        self.totals["accepted"] += self.accepted
        outputs = []
        for slot, prompt in enumerate(prompts):
            n = self.lengths[slot % len(self.lengths)]
            tokens = [int(prompt[0]) + k for k in range(n)]
            outputs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=tokens, text="x" * n, finish_reason="length")]))
        return outputs

    def get_metrics(self) -> list[Any]:
        return [SimpleNamespace(name="vllm:spec_decode_num_drafts", value=self.totals["drafts"]),
                SimpleNamespace(name="vllm:spec_decode_num_draft_tokens", value=3 * self.totals["drafts"]),
                SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens", value=self.totals["accepted"])]  # fmt: skip


def fake_engine(llm: FakeLLM) -> Any:
    """An ``Engine`` around the fake LLM: its clock, and prompts as plain token-id lists."""
    from sdbench.engine.measure.engine import Engine

    class StandIn(Engine):
        def prompt(self, token_ids: Any) -> Any:
            return [int(t) for t in token_ids]

    return StandIn(llm=llm, kwargs={}, startup_s=0.0, clock=llm.clock, layout="inprocess")


def spec(method: str, batch_size: int, **run: Any) -> dict[str, Any]:
    cell = {"engine": "vllm-cpu", "model": "tiny", "dataset": "d", "method": method, "batch_size": batch_size}
    return {"seed": 0, "cell": cell, "run": {"batch_mode": "replicate", **run}, "dataset": {"max_tokens": 16},
            "method": {"method": method}}  # fmt: skip


PROMPTS = pd.DataFrame({"request_id": ["r0", "r1"], "prompt_token_ids": [[10, 11, 12], [20, 21]]})


@pytest.fixture(scope="module", autouse=True)
def _vllm() -> None:
    import_or_fail("vllm")  # the sampling parameters a call is given are vLLM's own


def test_a_call_counts_every_sequence_of_its_batch_and_is_timed_by_the_engines_clock() -> None:
    from sdbench.engine.measure.trials import CellRun

    clock = FakeClock()
    llm = FakeLLM(clock, lengths=[4, 6, 5], durations=[0.5, 0.25], drafts=7, accepted=9)
    run = CellRun(fake_engine(llm), spec("ngram-k3", 3), PROMPTS)
    assert run.time_call(0, 0) == 0.5
    assert run.time_call(0, 1) == 0.25
    # Replicate mode: each call is one prompt, batch-size times.
    assert [[p[0] for p in call] for call in llm.calls] == [[10, 10, 10], [20, 20, 20]]
    first, second = run.call_rows
    # 4 + 6 + 5 = 15 tokens: every sequence of the batch, not one of them.
    assert first["num_output_tokens"] == 15 and first["num_seqs"] == 3
    assert first["duration_s"] == 0.5 and first["tokens_per_s"] == 30.0  # 15 / 0.5
    assert second["duration_s"] == 0.25 and second["tokens_per_s"] == 60.0  # 15 / 0.25
    assert (first["trial"], first["call_index"], first["request_id"], second["request_id"]) == (0, 0, "r0", "r1")
    # The counters are what this call added (7 drafts, 21 draft tokens, 9 accepted), not the totals.
    assert [second[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")] == [7, 21, 9]
    assert run.timed_s == 0.75
    # The first trial's sequences, one row each, with their own lengths.
    assert [(r.call_index, r.slot, r.num_output_tokens) for r in run.request_rows.frame().itertuples()] == [
        (0, 0, 4), (0, 1, 6), (0, 2, 5), (1, 0, 4), (1, 1, 6), (1, 2, 5)]  # fmt: skip


def test_a_distinct_call_counts_every_prompts_sequence() -> None:
    from sdbench.engine.measure.trials import CellRun

    clock = FakeClock()
    llm = FakeLLM(clock, lengths=[3, 8], durations=[2.0])
    run = CellRun(fake_engine(llm), spec("none", 2, batch_mode="distinct"), PROMPTS)
    run.time_call(0, 0)
    row = run.call_rows[0]
    assert (row["num_seqs"], row["num_output_tokens"], row["request_id"]) == (2, 11, "*")
    assert row["tokens_per_s"] == 5.5  # 11 tokens in 2 s


def test_trials_stop_when_the_paired_speedups_interval_is_narrow_enough() -> None:
    """One prompt, so the paired bootstrap over two trials has three outcomes, each drawn often
    enough in 2000 resamples to be its 2.5th or 97.5th percentile: both trials' own ratio and
    the pooled one. By hand: no SD 100 tokens/s in both trials, SD 150 then 250; the speedup
    ratios are 1.5, 2.5 and 400/200 = 2.0, the point (median of 150 and 250 over 100) 2.0, so the
    95% interval is [1.5, 2.5] and its relative half-width (2.5 - 1.5) / 2 / 2.0 = 0.25. Judged
    the wrong way round (no SD over SD): [0.4, 2/3] around 0.5, (2/3 - 0.4) / 2 / 0.5 = 0.267."""
    from sdbench.engine.measure.trials import CellRun, timed_part

    def arms() -> list[Any]:
        base = FakeLLM(FakeClock(), lengths=[100], durations=[1.0, 1.0, 1.0])
        sd = FakeLLM(FakeClock(), lengths=[150], durations=[1.0, 0.6, 1.0])  # 150, then 250 tokens/s, then 150
        one = PROMPTS.iloc[:1]
        return [CellRun(fake_engine(base), spec("none", 1), one), CellRun(fake_engine(sd), spec("ngram-k3", 1), one)]

    hw, hw_reversed = (2.5 - 1.5) / 2 / 2.0, (1 / 1.5 - 1 / 2.5) / 2 / 0.5
    assert hw == 0.25 and hw_reversed == pytest.approx(0.2667, abs=1e-4)
    for target, trials in ((0.26, 2), (0.24, 3)):  # between the two ways round, and below both
        runs = arms()
        timed_part(runs, {"repeats": 2, "max_repeats": 3, "target_half_width": target}, "disabled")
        assert {len({r["trial"] for r in run.call_rows}) for run in runs} == {trials}, target
    # The SD arm's throughput per call, as its clock timed it.
    runs = arms()
    timed_part(runs, {"repeats": 2, "max_repeats": 3, "target_half_width": 0.26}, "disabled")
    assert [r["tokens_per_s"] for r in runs[1].call_rows] == pytest.approx([150.0, 250.0])


def test_one_arm_stops_when_its_throughputs_interval_is_narrow_enough() -> None:
    """One arm, one prompt, two trials at 150 and 250 tokens/s: the interval is [150, 250]
    around the median 200, relative half-width 50 / 200 = 0.25."""
    from sdbench.engine.measure.trials import CellRun, timed_part

    for target, trials in ((0.26, 2), (0.24, 3)):
        llm = FakeLLM(FakeClock(), lengths=[150], durations=[1.0, 0.6, 1.0])
        run = CellRun(fake_engine(llm), spec("none", 1), PROMPTS.iloc[:1])
        timed_part([run], {"repeats": 2, "max_repeats": 3, "target_half_width": target}, "disabled")
        assert len(run.call_rows) == trials, target


def test_a_calls_prompts_are_built_before_its_clock_starts() -> None:
    """Building the engine's prompts (vLLM's ``TokensPrompt``: every token id made a Python int)
    is the runner's work, not the engine's: an engine whose prompt building moves the clock by
    1 s per prompt still times its 0.5 s call at 0.5 s, and every sequence gets its own prompt."""
    from sdbench.engine.measure.engine import Engine
    from sdbench.engine.measure.trials import CellRun

    clock = FakeClock()
    llm = FakeLLM(clock, lengths=[2], durations=[0.5])

    class SlowPrompts(Engine):
        def prompt(self, token_ids: Any) -> Any:
            clock.now += 1.0
            return [int(t) for t in token_ids]

    run = CellRun(SlowPrompts(llm=llm, kwargs={}, startup_s=0.0, clock=clock, layout="inprocess"),
                  spec("none", 3), PROMPTS)  # fmt: skip
    assert run.time_call(0, 0) == 0.5
    assert run.call_rows[0]["duration_s"] == 0.5
    (call,) = llm.calls
    assert [p for p in call] == [[10, 11, 12]] * 3 and len({id(p) for p in call}) == 3
