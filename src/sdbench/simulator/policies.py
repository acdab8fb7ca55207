"""Proposal policies: at each decoding step of a request, which drafter proposes how many tokens.

A policy turns a request's per-position acceptance trace into a *trajectory* (the types are in
:mod:`sdbench.simulator.policytypes`); :func:`make_policy` builds one by name. Two kinds of policy:

- position policies (``fixed-K``, ``oracle``, ``oracle-combine``) decide from the trace at each
  position, vectorised over every position of every request; the oracles read the future and are
  upper bounds, not deployable;
- causal policies (``dynamic-k``, ``ngram-else-eagle``, ``trust``, ``goodput``,
  ``goodput-fitted``, ``learned``, ``adaptive``) see only an :class:`Observation` (position,
  prompt length, batch size and the length of the n-gram draft available now) and, after each
  step, a :class:`Feedback` (what a real engine learns from verification); they live in
  :mod:`sdbench.simulator.causal`, whose :func:`~sdbench.simulator.causal.run_causal` is the only
  code that reads the trace for them, so they cannot peek at future acceptance.

Between the two, ``hindsight-first`` and ``hindsight-ngram`` (:class:`Hindsight`) are goodput told
part of the realised acceptance: yardsticks of how much of the oracle's lead that knowledge is
worth, not deployable.
"""

from __future__ import annotations

import re
from abc import abstractmethod
from dataclasses import dataclass, field, replace

import numpy as np

from sdbench.simulator.causal import (
    CausalPolicy,
    DynamicK,
    FittedGoodput,
    Goodput,
    GoodputState,
    Learned,
    NgramElseDraft,
    Observation,
    Trust,
    expected_emitted,
)
from sdbench.simulator.policytypes import (
    DRAFT,
    EXACT,
    MAX_DRAFT_TOKENS,
    NGRAM,
    NONE,
    PROPOSERS,
    Fidelity,
    Policy,
    PolicyContext,
    TraceArrays,
    Trajectories,
)


def walk(emitted_at: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Flat indices visited from each ``starts[r]`` by jumping ``emitted_at[i]`` until ``ends[r]``.

    A scalar pointer chase per request (each jump depends on the last); plain-list access is
    the fastest way to do it in Python.
    """
    em = emitted_at.tolist()
    out: list[int] = []
    append = out.append
    for i, end in zip(starts.tolist(), ends.tolist()):
        while i < end:
            append(i)
            i += em[i]
    return np.asarray(out, dtype=np.int64)


class PositionPolicy(Policy):
    """A policy whose choice at a position depends only on the trace at that position."""

    @abstractmethod
    def choose(self, traces: TraceArrays, ctx: PolicyContext, fidelity: Fidelity) -> tuple[np.ndarray, ...]:
        """Flat per-position ``(drafter, k, emitted, rng-or-None)`` arrays."""

    def trajectories(self, traces: TraceArrays, ctx: PolicyContext, fidelity: Fidelity) -> Trajectories:
        """Walk every request through its per-position choices."""
        drafter, k, emitted, rng = self.choose(traces, ctx, fidelity)
        off = fidelity.offset
        idx = walk(emitted, traces.start + 1 - off, traces.start + traces.length - off)
        counts = np.diff(np.searchsorted(idx, np.append(traces.start, np.iinfo(np.int64).max)))
        req = np.repeat(np.arange(traces.num_requests), counts)
        return Trajectories(
            req=req,
            gen=idx - traces.start[req] + off,
            drafter=drafter[idx],
            k=k[idx],
            emitted=emitted[idx],
            rng=None if rng is None else rng[idx],
        )


def _require(arr: np.ndarray | None, what: str) -> np.ndarray:
    if arr is None:
        raise ValueError(f"traces lack {what}")
    return arr


def _with_drafter(k: np.ndarray, code: int) -> np.ndarray:
    return np.where(k > 0, code, NONE).astype(np.int8)


@dataclass
class FixedK(PositionPolicy):
    """Propose ``k`` tokens at every step (n-gram: at most its draft length)."""

    k: int = 3
    proposers: tuple[str, ...] = ("ngram", "eagle")

    def __post_init__(self) -> None:
        if not 1 <= self.k <= MAX_DRAFT_TOKENS:
            raise ValueError(f"fixed-k needs 1 <= k <= {MAX_DRAFT_TOKENS}, got {self.k}")
        self.name = f"fixed-{self.k}"

    def choose(self, traces: TraceArrays, ctx: PolicyContext, fidelity: Fidelity) -> tuple[np.ndarray, ...]:
        if ctx.proposer == "ngram":
            acc = _require(traces.acc_ngram, "n-gram acceptance")
            if fidelity.true_ngram_proposals:
                k = np.minimum(self.k, _require(traces.proposed_ngram, "n-gram proposal lengths (proposed_len)"))
                return _with_drafter(k, NGRAM), k, np.minimum(acc, k + 1), None
            # Published model: k everywhere; where nothing is accepted, "no match" is random.
            k = np.full(len(acc), self.k)
            return np.full(len(acc), NGRAM, np.int8), k, np.minimum(acc, k + 1), acc == 1
        acc = _require(traces.acc_draft, "learned-drafter acceptance")
        k = np.full(len(acc), self.k)
        return np.full(len(acc), DRAFT, np.int8), k, np.minimum(acc, k + 1), None


@dataclass
class Oracle(PositionPolicy):
    """Propose exactly the tokens that will be accepted (``combined``: see :class:`OracleCombine`)."""

    name: str = "oracle"

    def choose(self, traces: TraceArrays, ctx: PolicyContext, fidelity: Fidelity) -> tuple[np.ndarray, ...]:
        if ctx.proposer == "combined":
            return OracleCombine().choose(traces, ctx, fidelity)
        code = NGRAM if ctx.proposer == "ngram" else DRAFT
        acc = _require(traces.acc_ngram if code == NGRAM else traces.acc_draft, f"{ctx.proposer} acceptance")
        k = np.minimum(acc - 1, MAX_DRAFT_TOKENS)
        return _with_drafter(k, code), k, k + 1, None


@dataclass
class OracleCombine(PositionPolicy):
    """Per position, the drafter that gets more tokens accepted (ties: n-gram, the cheaper), proposing
    exactly what it gets accepted."""

    name: str = "oracle-combine"
    proposers: tuple[str, ...] = ("combined",)

    def choose(self, traces: TraceArrays, ctx: PolicyContext, fidelity: Fidelity) -> tuple[np.ndarray, ...]:
        acc_n = _require(traces.acc_ngram, "n-gram acceptance")
        acc_d = _require(traces.acc_draft, "learned-drafter acceptance")
        use_ngram = acc_n >= acc_d
        k = np.minimum(np.where(use_ngram, acc_n, acc_d) - 1, MAX_DRAFT_TOKENS)
        drafter = np.where(k > 0, np.where(use_ngram, NGRAM, DRAFT), NONE).astype(np.int8)
        return drafter, k, k + 1, None


@dataclass
class Hindsight(Goodput):
    """Goodput told part of the realised acceptance at each step (an upper bound, not causal).

    ``knows="first"``: whether each drafter's first draft token will be accepted (``q`` is 0 or 1;
    the continuation stays goodput's estimate). ``knows="ngram"``: exactly how many n-gram draft
    tokens will be accepted (the learned drafter stays estimated). The rest is goodput's rule.
    They measure how much of oracle-combine's lead needs that knowledge.
    """

    name: str = "hindsight-first"
    proposers: tuple[str, ...] = ("combined",)
    knows: str = "first"
    causal = False  # reads the realised acceptance of the step it decides
    _acc: dict[int, np.ndarray] = field(default_factory=dict, init=False, repr=False, compare=False)
    _next: int = field(default=0, init=False, repr=False, compare=False)
    _traces: TraceArrays | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.knows not in ("first", "ngram"):
            raise ValueError(f"Hindsight.knows must be 'first' or 'ngram', got {self.knows!r}")

    def trajectories(self, traces: TraceArrays, ctx: PolicyContext, fidelity: Fidelity) -> Trajectories:
        self._traces, self._next = traces, 0
        return super().trajectories(traces, ctx, fidelity)

    def start(self, prompt_len: int, ctx: PolicyContext) -> GoodputState:
        # Requests are replayed in order (CausalPolicy.trajectories): the n-th start is request n.
        assert self._traces is not None, "Hindsight runs through trajectories() only"
        t = self._traces.request(self._next)
        self._next += 1
        self._acc = {
            NGRAM: _require(t.acc_ngram, "n-gram acceptance"),
            DRAFT: _require(t.acc_draft, "learned-drafter acceptance"),
        }
        return super().start(prompt_len, ctx)

    def emitted_by_k(self, state: GoodputState, drafter: int, obs: Observation, k_max: int) -> list[float]:
        c = int(self._acc[drafter][obs.position]) - 1
        if self.knows == "ngram" and drafter == NGRAM:
            return [1.0 + min(c, k) for k in range(1, k_max + 1)]
        if self.knows == "first":
            _, r = self.qr(state, drafter, obs)
            return [expected_emitted(1.0 if c >= 1 else 0.0, r, k) for k in range(1, k_max + 1)]
        return super().emitted_by_k(state, drafter, obs, k_max)


def _causal_classes() -> dict[str, type[CausalPolicy]]:
    return {c.name: c for c in (DynamicK, NgramElseDraft, Trust, Goodput, FittedGoodput, Learned)}


HINDSIGHT = {"hindsight-first": "first", "hindsight-ngram": "ngram"}
ADAPTIVE_DEFAULT = "goodput"
FIXED_RE = re.compile(r"^fixed-(\d+)$")


def make_policy(name: str, proposer: str, fidelity: Fidelity = EXACT) -> Policy:
    """The policy called ``name`` (``fixed-K``, ``oracle``, ``oracle-combine``, ``hindsight-*`` or a
    causal policy), checked against ``proposer`` and ``fidelity``. ``adaptive`` is the best causal
    policy."""
    if proposer not in PROPOSERS:
        raise ValueError(f"unknown proposer {proposer!r} (choose from {', '.join(PROPOSERS)})")
    m = FIXED_RE.match(name)
    causal = _causal_classes()
    if m:
        policy: Policy = FixedK(int(m.group(1)))
    elif name == "oracle":
        policy = Oracle()
    elif name == "oracle-combine":
        policy = OracleCombine()
    elif name == "adaptive":
        policy = replace(causal[ADAPTIVE_DEFAULT](), name="adaptive")
    elif name in causal:
        policy = causal[name]()
    elif name in HINDSIGHT:
        policy = Hindsight(name=name, knows=HINDSIGHT[name])
    else:
        raise ValueError(
            f"unknown policy {name!r} (choose from fixed-K, oracle, oracle-combine, adaptive, "
            f"{', '.join(sorted([*causal, *HINDSIGHT]))})"
        )
    policy.check(proposer, fidelity)
    return policy
