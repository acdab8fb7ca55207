"""Server mode in a rehearsal: no HTTP server, the rehearsal engine serves each level.

:class:`RehearsalClient` stands in for the streaming client (:mod:`sdbench.engine.serving.loadgen`) and the
server's ``/metrics``: a level keeps ``concurrency`` requests in flight, the next one sent when one
finishes (a closed loop, prompts cycled in order), on the rehearsal engine with ``max_num_seqs`` =
the group's largest concurrency; its requests' times come from the modelled steps
(:func:`sdbench.rehearsal.steps.run`): TTFT = first token - send, latency = last token - send,
TPOT = (latency - TTFT) / (tokens - 1), one streamed chunk per step that emits tokens. HTTP,
detokenisation and the client's own time are not modelled. The real level loop, summary and
tables (:func:`sdbench.engine.serving.servegroup.measure_levels`) run unchanged on it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sdbench.engine.measure.counters import SDCounters, read_counters
from sdbench.engine.serving.loadgen import RequestResult
from sdbench.rehearsal.steps import Plan, counters, run
from sdbench.rehearsal.workload import budget, prompt_key


class RehearsalClient:
    """A rehearsal server and its client in one (see the module docstring)."""

    base_url = "rehearsal://"
    measured = False

    def __init__(self, engine: Any, log_path: str | Path) -> None:
        self.engine, self.llm = engine, engine.llm
        self.startup_s = engine.startup_s
        self.log_path = Path(log_path)
        self.level_s = 0.0  # modelled seconds of the current level: warm-up and rounds
        self._last_round: int | None = None

    def check_alive(self, grace_s: float = 0.0) -> None:
        """The rehearsal's server never dies."""

    def read_metrics(self, base_url: str) -> SDCounters:
        """The engine's SD counters (``/metrics``); a read before a level's rounds starts its clock."""
        return read_counters(self.llm.get_metrics())

    def run_level(self, base_url: str, prompts: list[tuple[Any, ...]], max_tokens: int, concurrency: int,
                  num_requests: int, ignore_eos: bool = False, timeout_s: float = 600.0, round_: int = 0,
                  model: str = "", stream: bool = True) -> tuple[list[RequestResult], float]:  # fmt: skip
        """``num_requests`` requests, ``concurrency`` at a time (as :func:`sdbench.engine.serving.loadgen.run_level`;
        ``stream`` False, the stream-off control: the same steps, TTFT, TPOT and chunk gaps NaN/empty)."""
        if concurrency < 1 or num_requests < 1 or not prompts:
            raise ValueError(f"concurrency {concurrency}, num_requests {num_requests}, {len(prompts)} prompts: need >= 1 each")
        if round_ == -1 or (round_ == 0 and self._last_round != -1):  # a new level (warm-up first, if any)
            self.level_s = 0.0
        self._last_round = round_
        llm = self.llm
        t0 = llm.clock()
        sent: dict[int, tuple[int, str, Any, int, bool, Plan]] = {}

        def request(i: int, at: float) -> Plan:
            rid, ids, *own = prompts[i % len(prompts)]
            cap = min(int(own[0]), max_tokens) if own and own[0] else max_tokens
            info = llm.workload.lookup(ids)
            n, stopped = budget(info, cap, ignore_eos)
            decode, proposed = llm._schedule(info, prompt_key(ids), n)
            plan = Plan(len(ids), decode, proposed, copies=1, arrival=at)
            sent[id(plan)] = (i, str(rid), ids, n, stopped, plan)
            return plan

        first = [request(i, t0) for i in range(min(concurrency, num_requests))]
        next_index = len(first)

        def on_finish(plan: Plan, t: float) -> list[Plan]:
            nonlocal next_index
            if next_index >= num_requests:
                return []
            next_index += 1
            return [request(next_index - 1, t)]

        result = run(first, llm.cost, llm.max_num_seqs, start=t0, on_finish=on_finish)
        llm.clock.advance(result.seconds)
        llm.modelled_s += result.seconds
        self.level_s += result.seconds
        out = []
        for i, rid, ids, n, stopped, plan in sorted(sent.values(), key=lambda r: r[0]):
            llm._count(counters(plan, llm.k))
            ttft = plan.first_token_s - plan.arrival
            latency = plan.finish_s - plan.arrival
            tpot = (latency - ttft) / (n - 1) if n > 1 else math.nan
            # One chunk per step; the run keeps a request's first and last token times only, so its
            # steps' gaps are taken as equal (a stand-in for vLLM's itl: their mean is exact).
            steps = len(plan.decode)
            gaps = [(plan.finish_s - plan.first_token_s) / steps] * steps if steps else []
            if not stream:  # one answer at the end, as loadgen's plain completion
                ttft, tpot, steps, gaps = math.nan, math.nan, 0, []
            out.append(RequestResult(round_, i, rid, len(ids), n, plan.arrival - t0, ttft, latency, tpot,
                                     1 + steps, gaps))  # fmt: skip
        return out, result.seconds

