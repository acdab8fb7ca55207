"""The engine steps of a rehearsal call: continuous batching, as vLLM's V1 scheduler runs it.

At most ``max_seqs`` sequences run; a waiting request is admitted when it has arrived and its
copies fit. Each step schedules every running sequence's verification first (``1 + drafts`` tokens
each, its context in the KV cache), then prefill chunks of admitted requests in admission order
within :data:`~sdbench.rehearsal.standins.MAX_NUM_BATCHED_TOKENS` (chunked prefill, no prefix
caching). A prefill's last chunk emits the request's first token; each verification step then
emits what its plan says. A step costs the target pass over all its tokens and KV, the drafting
of its verifying sequences and the per-step overhead (:class:`~sdbench.rehearsal.costs.StepCost`).

The copies of a replicated prompt are one plan with ``copies`` > 1: they are prefilled together
and decode in lock step (greedy copies emit the same tokens), which :func:`run` prices in closed
form when a call holds nothing else.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from sdbench.rehearsal import standins
from sdbench.rehearsal.costs import StepCost

STEP_FIELDS = ("num_reqs", "num_batched_tokens", "num_kv_tokens", "num_proposed_tokens",
               "verify_s", "propose_s", "sample_s", "other_s", "step_s")  # fmt: skip


@dataclass(eq=False)
class Plan:
    """One request (``copies`` identical sequences): its prompt, the tokens each verification step
    emits after the prefill step's first one, and the drafts it verifies per step."""

    prompt_len: int
    decode: np.ndarray
    proposed: int
    copies: int = 1
    arrival: float = 0.0
    # Filled in by run(): when the first token and the last one were emitted.
    first_token_s: float = math.nan
    finish_s: float = math.nan

    @property
    def num_tokens(self) -> int:
        return 1 + int(self.decode.sum())


@dataclass
class Result:
    """What a run of steps took: seconds, and every step's counts and times (when recorded)."""

    seconds: float
    steps: list[dict[str, float]] = field(default_factory=list)


def _record(steps: list[dict[str, float]] | None, **values: float) -> None:
    if steps is not None:
        steps.append({k: values[k] for k in STEP_FIELDS})


def _price(cost: StepCost, kv: float, batched: float, kv_draft: float, proposed: float, seqs_draft: float,
           reqs: float, steps: list[dict[str, float]] | None) -> float:  # fmt: skip
    verify = float(cost.verify(kv, batched))
    propose = float(cost.draft(verify, kv_draft, proposed, seqs_draft))
    step = verify + propose + cost.overhead
    _record(steps, num_reqs=reqs, num_batched_tokens=batched, num_kv_tokens=kv, num_proposed_tokens=proposed,
            verify_s=verify, propose_s=propose, sample_s=0.0, other_s=cost.overhead, step_s=step)  # fmt: skip
    return step


def _alone(plan: Plan, cost: StepCost, start: float, record: bool) -> Result:
    """One plan on an idle engine, in closed form (vectorised over its steps)."""
    steps: list[dict[str, float]] | None = [] if record else None
    budget = standins.MAX_NUM_BATCHED_TOKENS
    total = plan.copies * plan.prompt_len
    chunks = np.minimum(budget, total - budget * np.arange(math.ceil(total / budget)))
    done = np.concatenate([[0], np.cumsum(chunks)[:-1]])
    seconds = 0.0
    for chunk, kv in zip(chunks, done):
        seconds += _price(cost, float(kv), float(chunk), 0.0, 0.0, 0.0, plan.copies, steps)
    plan.first_token_s = start + seconds
    n = len(plan.decode)
    if n:
        generated = 1 + np.concatenate([[0], np.cumsum(plan.decode)[:-1]])
        kv = plan.copies * (plan.prompt_len + generated).astype(float)
        batched = float(plan.copies * (1 + plan.proposed))
        proposed = float(plan.copies * plan.proposed)
        verify = cost.verify(kv, batched)
        propose = cost.draft(verify, kv, proposed, float(plan.copies))
        step = verify + propose + cost.overhead
        seconds += float(step.sum())
        if steps is not None:
            for j in range(n):
                steps.append({"num_reqs": plan.copies, "num_batched_tokens": batched, "num_kv_tokens": float(kv[j]),
                              "num_proposed_tokens": proposed, "verify_s": float(verify[j]),
                              "propose_s": float(propose[j]), "sample_s": 0.0, "other_s": cost.overhead,
                              "step_s": float(step[j])})  # fmt: skip
    plan.finish_s = start + seconds
    return Result(seconds, steps or [])


@dataclass(eq=False)
class _Running:
    plan: Plan
    prefilled: int = 0
    step: int = 0
    generated: int = 0


def run(
    plans: list[Plan],
    cost: StepCost,
    max_seqs: int,
    start: float = 0.0,
    record: bool = False,
    on_finish: Callable[[Plan, float], list[Plan]] | None = None,
) -> Result:
    """Run ``plans`` (in arrival order) to completion from time ``start``; fills each plan's
    ``first_token_s`` / ``finish_s``. ``on_finish(plan, t)`` returns the plans that arrive when
    ``plan`` finishes at ``t`` (a closed-loop client); ``record`` keeps every step's :data:`STEP_FIELDS`."""
    if len(plans) == 1 and on_finish is None and plans[0].copies <= max_seqs and plans[0].arrival <= start:
        return _alone(plans[0], cost, start, record)
    steps: list[dict[str, float]] | None = [] if record else None
    waiting: deque[Plan] = deque(plans)
    running: list[_Running] = []
    now = start
    budget_per_step = standins.MAX_NUM_BATCHED_TOKENS
    while waiting or running:
        if not running and waiting and waiting[0].arrival > now:
            now = waiting[0].arrival
        seqs = sum(r.plan.copies for r in running)
        while waiting and waiting[0].arrival <= now and seqs + waiting[0].copies <= max_seqs:
            plan = waiting.popleft()
            if plan.copies > max_seqs:
                raise ValueError(f"rehearsal: {plan.copies} copies of a request exceed max_num_seqs {max_seqs}")
            running.append(_Running(plan))
            seqs += plan.copies
        if not running:
            if waiting and waiting[0].copies > max_seqs:
                raise ValueError(f"rehearsal: {waiting[0].copies} copies of a request exceed max_num_seqs {max_seqs}")
            continue
        kv = batched = kv_draft = proposed = seqs_draft = 0.0
        budget = budget_per_step
        decoding = [r for r in running if r.generated > 0]
        for r in decoding:
            c = r.plan.copies
            batched += c * (1 + r.plan.proposed)
            kv += c * (r.plan.prompt_len + r.generated)
            kv_draft += c * (r.plan.prompt_len + r.generated)
            proposed += c * r.plan.proposed
            seqs_draft += c
        budget -= int(batched)
        chunks: list[tuple[_Running, int]] = []
        for r in running:
            if r.generated > 0 or budget <= 0:
                continue
            chunk = min(r.plan.copies * r.plan.prompt_len - r.prefilled, budget)
            chunks.append((r, chunk))
            batched += chunk
            kv += r.prefilled
            budget -= chunk
        now += _price(cost, kv, batched, kv_draft, proposed, seqs_draft, seqs, steps)
        finished: list[_Running] = []
        for r in decoding:
            r.generated += int(r.plan.decode[r.step])
            r.step += 1
            if r.step == len(r.plan.decode):
                finished.append(r)
        for r, chunk in chunks:
            r.prefilled += chunk
            if r.prefilled == r.plan.copies * r.plan.prompt_len:
                r.generated = 1
                r.plan.first_token_s = now
                if len(r.plan.decode) == 0:
                    finished.append(r)
        for r in finished:
            running.remove(r)
            r.plan.finish_s = now
            if on_finish is not None:
                waiting.extend(on_finish(r.plan, now))
    return Result(now - start, steps or [])


def counters(plan: Plan, width: int) -> dict[str, Any]:
    """The SD counters one plan adds (each of its copies drafts and accepts alike): drafts, draft
    tokens, accepted tokens and accepted per draft position (``width`` positions)."""
    if plan.proposed == 0 or len(plan.decode) == 0:
        return {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_pos": [0] * width}
    accepted = plan.decode - 1
    per_pos = [int(plan.copies * np.count_nonzero(accepted > i)) for i in range(width)]
    return {
        "num_drafts": plan.copies * len(plan.decode),
        "num_draft_tokens": plan.copies * len(plan.decode) * plan.proposed,
        "num_accepted_tokens": int(plan.copies * accepted.sum()),
        "accepted_per_pos": per_pos,
    }
