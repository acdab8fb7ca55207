"""Test double of a started ``vllm.LLM`` for the timed part of a cell: no engine, known costs.

``LLMDouble`` answers the calls :class:`sdbench.engine.measure.trials.CellRun` makes (``generate``,
``get_metrics``): each prompt of a call gets ``tokens(prompt)`` output tokens, and the call advances
a shared :class:`Bench` by ``seconds(prompt, batch)`` of its clock and ``joules(prompt, batch)`` of
its energy account, where ``prompt`` is the call's first prompt's first token id (tests give prompt
``i`` the token ids ``[i]``) and ``batch`` the number of sequences. An energy meter double (the NVML
double, a RAPL tree) reads the account; :func:`engine` wraps the double as an
:class:`sdbench.engine.measure.engine.Engine` timed by the bench's clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


@dataclass
class Bench:
    """The world the doubles share: a clock (seconds) and the energy spent (joules); each of
    ``listeners`` is called after every call (a RAPL tree writes its counters then)."""

    t: float = 0.0
    joules: float = 0.0
    listeners: list[Callable[[Bench], None]] = field(default_factory=list)

    def clock(self) -> float:
        return self.t

    def spend(self, seconds: float, joules: float) -> None:
        self.t += seconds
        self.joules += joules
        for listener in self.listeners:
            listener(self)


class LLMDouble:
    """Stands in for ``vllm.LLM`` (see the module docstring)."""

    def __init__(
        self,
        bench: Bench,
        tokens: Callable[[int], int],
        seconds: Callable[[int, int], float],
        joules: Callable[[int, int], float],
    ) -> None:
        self.bench, self.tokens, self.seconds, self.joules = bench, tokens, seconds, joules

    def generate(self, prompts: list[Any], sampling: Any, use_tqdm: bool = False) -> list[SimpleNamespace]:
        prompt = int(prompts[0]["prompt_token_ids"][0])
        self.bench.spend(self.seconds(prompt, len(prompts)), self.joules(prompt, len(prompts)))
        return [
            SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(range(self.tokens(int(p["prompt_token_ids"][0])))),
                                                     text="", finish_reason="length")])
            for p in prompts
        ]  # fmt: skip

    def get_metrics(self) -> list[Any]:
        return []

    def collective_rpc(self, method: Any, args: tuple[Any, ...] = ()) -> list[Any]:
        return []  # no workers: no memory report (sdbench.engine.release.versions.engine_memory)


def engine(llm: LLMDouble, meter: Any = None) -> Any:
    """An ``Engine`` around the double, timed by its bench's clock, reading ``meter`` (None: no meter)."""
    from sdbench.engine.measure.engine import Engine
    from sdbench.engine.measure.energy import NoMeter

    return Engine(llm, {}, 0.0, layout="inprocess", clock=llm.bench.clock, meter=meter or NoMeter())
