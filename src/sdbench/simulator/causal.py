"""Causal (deployable) proposal policies: ``dynamic-k``, ``ngram-else-eagle``, ``trust``,
``goodput``, ``goodput-fitted``, ``learned`` (and ``adaptive``, the best of them, see
:func:`sdbench.simulator.policies.make_policy`).

They see only an :class:`Observation` (position, prompt length, batch size and the length of the
n-gram draft available now) and, after each step, a :class:`Feedback` (what a real engine learns
from verification). :func:`run_causal` is the only code that reads the trace for them, so they
cannot peek at future acceptance.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from sdbench.simulator.policytypes import (
    DRAFT,
    MAX_DRAFT_TOKENS,
    NGRAM,
    NONE,
    Fidelity,
    Policy,
    PolicyContext,
    TraceArrays,
    Trajectories,
)


# ----------------------------------------------------------------------------- causal policies
@dataclass(frozen=True)
class Observation:
    """What an engine knows when it decides a step, before verification.

    ``ngram_proposal_len`` is the length of the n-gram draft for the current context (0: no
    match): the lookup is cheap and runs before the decision.
    """

    position: int
    prompt_len: int
    batch_size: int
    ngram_proposal_len: int


@dataclass(frozen=True)
class Feedback:
    """What verification of one step reveals.

    ``accepted = min(true matches, proposed)`` and ``rejected`` (a draft was rejected) for the
    drafter used. The n-gram draft, when there was one, can always be checked against the
    emitted tokens: ``ngram_matches`` of its tokens matched, ``ngram_rejected`` whether a mismatch
    was seen (None when there was no n-gram draft). The learned drafter is only observed when used.
    """

    drafter: int
    proposed: int
    accepted: int
    rejected: bool
    emitted: int
    ngram_matches: int | None
    ngram_rejected: bool | None


class CausalPolicy(Policy):
    """A deployable policy: decides from :class:`Observation` and past :class:`Feedback` only."""

    causal = True
    batch_dependent = True

    def check(self, proposer: str, fidelity: Fidelity) -> None:
        super().check(proposer, fidelity)
        if not (fidelity.true_ngram_proposals and fidelity.aligned_positions):
            raise ValueError(f"policy {self.name!r} needs exact mode (true n-gram proposals, aligned positions)")

    def train(self, traces: Sequence[TraceArrays], ctx: PolicyContext) -> None:
        """Fit on training traces (data of other datasets); a no-op for untrained policies."""

    def reset(self) -> None:
        """Forget what is shared across requests (a fresh engine); a no-op for per-request policies."""

    @abstractmethod
    def start(self, prompt_len: int, ctx: PolicyContext) -> Any:
        """Fresh per-request state."""

    @abstractmethod
    def decide(self, state: Any, obs: Observation, ctx: PolicyContext) -> tuple[int, int]:
        """``(drafter, k)`` for this step."""

    def update(self, state: Any, obs: Observation, fb: Feedback, ctx: PolicyContext) -> None:
        """Learn from one step's verification (default: nothing)."""

    def trajectories(self, traces: TraceArrays, ctx: PolicyContext, fidelity: Fidelity) -> Trajectories:
        """Run every request through :func:`run_causal`."""
        parts = [run_causal(self, traces.request(r), ctx) for r in range(traces.num_requests)]
        counts = [len(p[0]) for p in parts]
        req = np.repeat(np.arange(traces.num_requests), counts)

        def cat(i: int, dtype: Any) -> np.ndarray:
            return np.concatenate([np.asarray(p[i], dtype=dtype) for p in parts] + [np.empty(0, dtype)])

        return Trajectories(req, cat(0, np.int64), cat(1, np.int8), cat(2, np.int64), cat(3, np.int64))


def run_causal(
    policy: CausalPolicy,
    trace: TraceArrays,
    ctx: PolicyContext,
    record: list[tuple[Observation, int, int]] | None = None,
) -> tuple[list[int], list[int], list[int], list[int]]:
    """Replay one request under a causal policy: ``(gen, drafter, k, emitted)`` per step.

    The only place a causal policy's trace is read. Decisions are clipped to what is possible
    (n-gram: its draft length; any drafter: :data:`MAX_DRAFT_TOKENS`). ``record`` collects
    ``(observation, drafter, k)`` per step (used by the causality test and for training).
    """
    acc_n = trace.acc_ngram.tolist() if trace.acc_ngram is not None else None
    prop_n = trace.proposed_ngram.tolist() if trace.proposed_ngram is not None else None
    acc_d = trace.acc_draft.tolist() if trace.acc_draft is not None else None
    if prop_n is None and acc_n is not None:
        raise ValueError("causal policies need n-gram proposal lengths (proposed_len)")
    end, prompt_len = int(trace.length[0]), int(trace.prompt_len[0])
    state = policy.start(prompt_len, ctx)
    gens: list[int] = []
    drafters: list[int] = []
    ks: list[int] = []
    emitted: list[int] = []
    g = 1
    while g < end:
        p = prop_n[g] if prop_n is not None else 0
        obs = Observation(g, prompt_len, ctx.batch_size, p)
        drafter, k = policy.decide(state, obs, ctx)
        if drafter == NGRAM:
            k = min(k, p)
        elif drafter == DRAFT and acc_d is None:
            raise ValueError(f"policy {policy.name!r} chose a learned drafter, but the traces have none")
        k = max(0, min(k, MAX_DRAFT_TOKENS))
        if k == 0:
            drafter = NONE
        if record is not None:
            record.append((obs, drafter, k))
        true = (acc_n[g] if drafter == NGRAM else acc_d[g]) - 1 if drafter != NONE else 0
        accepted = min(true, k)
        a = accepted + 1
        if p > 0:  # the n-gram draft is checked against the tokens verified (its own k) or emitted
            window, c = (k if drafter == NGRAM else a), acc_n[g] - 1
            ng_matches, ng_rejected = min(c, window), c < min(p, window)
        else:
            ng_matches = ng_rejected = None
        policy.update(state, obs, Feedback(drafter, k, accepted, accepted < k, a, ng_matches, ng_rejected), ctx)
        gens.append(g)
        drafters.append(drafter)
        ks.append(k)
        emitted.append(a)
        g += a
    return gens, drafters, ks, emitted


# --- estimators and cost terms shared by the causal policies
@dataclass
class AcceptModel:
    """Per-request acceptance model of one drafter, learned from censored verification outcomes.

    Two stages, because n-gram drafts are "all or nothing" (a wrong match fails at once, a right
    one is usually a copy that runs on): ``q`` = P(first draft accepted), ``r`` = P(next draft
    accepted | all before it were). Each is a decayed Beta-Bernoulli estimate shrunk to its prior
    with weight ``prior_weight``. Then ``E[emitted | k drafts] = 1 + q (1 - r^k) / (1 - r)``.
    """

    q_prior: float
    r_prior: float
    prior_weight: float = 4.0
    decay: float = 0.9
    q_hits: float = 0.0
    q_misses: float = 0.0
    r_hits: float = 0.0
    r_misses: float = 0.0

    def observe(self, matches: int, rejected: bool) -> None:
        """Record a verified draft: ``matches`` leading drafts accepted, then a rejection if
        ``rejected`` (otherwise the draft ran out first: censored)."""
        self.forget()
        if matches == 0:
            self.q_misses += 1.0 if rejected else 0.0
            return
        self.q_hits += 1.0
        self.r_hits += matches - 1
        self.r_misses += 1.0 if rejected else 0.0

    def forget(self) -> None:
        """Decay the evidence by one step. Also called on steps without an observation, so an
        estimate that made the policy stop using a drafter drifts back to the prior and the
        drafter is tried again (no lock-in after one bad observation)."""
        d = self.decay
        self.q_hits, self.q_misses, self.r_hits, self.r_misses = (
            d * self.q_hits,
            d * self.q_misses,
            d * self.r_hits,
            d * self.r_misses,
        )

    @property
    def q(self) -> float:
        """P(first draft accepted)."""
        w = self.prior_weight
        return (self.q_hits + w * self.q_prior) / (self.q_hits + self.q_misses + w)

    @property
    def r(self) -> float:
        """P(a further draft accepted | the previous ones were)."""
        w = self.prior_weight
        return (self.r_hits + w * self.r_prior) / (self.r_hits + self.r_misses + w)


def expected_emitted(q: float, r: float, k: int) -> float:
    """``E[min(acc_len, k + 1)]`` under the two-stage model (``q`` first, ``r`` after)."""
    if k <= 0:
        return 1.0
    if r >= 1.0:
        return 1.0 + q * k
    return 1.0 + q * (1.0 - r**k) / (1.0 - r)


def step_cost(ctx: PolicyContext, obs: Observation, drafter: int) -> tuple[float, float]:
    """``(t0, t_token)``: seconds of a step attributable to one request of ``ctx.batch_size``
    all doing the same, when it proposes ``k >= 1`` tokens, is ``t0 + k * t_token``; with
    ``drafter`` NONE, ``t0`` is the plain decoding step. The step's fixed costs are shared by the
    batch; per-token costs are the request's own.
    """
    cm, b = ctx.cost_model, ctx.batch_size
    kv = obs.prompt_len + obs.position
    t = cm.target
    # A hinged target (knee): the plain step's hinge shared by the batch, and per draft token the
    # chord from b to 2b batched tokens (every request's first draft); both 0.0 without a knee.
    verify0 = t.c_fixed / b + t.c_kv * kv + t.c_compute + t.hinge(b) / b
    t0, per_token = verify0 + cm.overhead_per_step / b, t.c_compute + (t.hinge(2 * b) - t.hinge(b)) / b
    if drafter == NONE:
        return t0, 0.0
    d = cm.drafter(NGRAM_COST_KEY if drafter == NGRAM else ctx.draft_method)
    if d.kind == "fraction_of_verify":
        return t0 + d.fraction * verify0, per_token * (1.0 + d.fraction)
    return t0 + d.c_fixed / b + d.c_kv * kv, per_token + d.c_spec


NGRAM_COST_KEY = "ngram"


def step_seconds(ctx: PolicyContext, obs: Observation, drafter: int, k: int) -> float:
    """Per-request share of a step's seconds (see :func:`step_cost`)."""
    if k <= 0:
        drafter = NONE
    t0, per_token = step_cost(ctx, obs, drafter)
    return t0 + k * per_token


# Acceptance priors (first draft, continuation) before a request has been observed, rounded
# from GSM8K and InstructCoder (Llama-3.1-8B): EAGLE is close to geometric and does better where
# n-gram finds a draft (repetitive text); n-gram given a draft varies most across datasets.
DRAFT_PRIOR = (0.7, 0.7)
DRAFT_PRIOR_AT_NGRAM = (0.75, 0.7)
NGRAM_PRIOR = (0.6, 0.8)


def batch_fixed_k(
    ctx: PolicyContext, obs: Observation, prior: tuple[float, float] = DRAFT_PRIOR, choices: Sequence[int] = (1, 3, 5)
) -> int:
    """The fixed ``k`` among ``choices`` of best expected goodput for the learned drafter under
    the cost model at this batch size (acceptance at its prior)."""
    return max(choices, key=lambda k: expected_emitted(*prior, k) / step_seconds(ctx, obs, DRAFT, k))


@dataclass
class DynamicK(CausalPolicy):
    """Single drafter; ``k`` = recent mean accepted drafts + 1 (an EMA): it grows while drafts
    are fully accepted and shrinks on rejection."""

    name: str = "dynamic-k"
    proposers: tuple[str, ...] = ("ngram", "eagle")
    decay: float = 0.7
    k_max: int = 8

    def start(self, prompt_len: int, ctx: PolicyContext) -> Any:
        return {"ema": 2.0}

    def decide(self, state: Any, obs: Observation, ctx: PolicyContext) -> tuple[int, int]:
        k = max(1, min(self.k_max, round(state["ema"]) + 1))
        return (NGRAM, k) if ctx.proposer == "ngram" else (DRAFT, k)

    def update(self, state: Any, obs: Observation, fb: Feedback, ctx: PolicyContext) -> None:
        if fb.drafter != NONE:
            state["ema"] = self.decay * state["ema"] + (1 - self.decay) * fb.accepted


@dataclass
class NgramElseDraft(CausalPolicy):
    """n-gram whenever it has a draft (all of it, up to ``k_max``), else the learned drafter with
    the fixed ``k`` (of 1, 3, 5) the cost model favours at this batch size."""

    name: str = "ngram-else-eagle"
    proposers: tuple[str, ...] = ("combined",)
    k_max: int = MAX_DRAFT_TOKENS

    def start(self, prompt_len: int, ctx: PolicyContext) -> Any:
        return {}

    def decide(self, state: Any, obs: Observation, ctx: PolicyContext) -> tuple[int, int]:
        if obs.ngram_proposal_len > 0:
            return NGRAM, min(obs.ngram_proposal_len, self.k_max)
        return DRAFT, batch_fixed_k(ctx, obs)


@dataclass
class Trust(CausalPolicy):
    """Per-request EMA trust score of n-gram: n-gram when it has a draft and is trusted, else the
    learned drafter with the best fixed ``k`` for the batch size (the issue author's baseline)."""

    name: str = "trust"
    proposers: tuple[str, ...] = ("combined",)
    decay: float = 0.7
    threshold: float = 0.5

    def start(self, prompt_len: int, ctx: PolicyContext) -> Any:
        return {"trust": 1.0}

    def decide(self, state: Any, obs: Observation, ctx: PolicyContext) -> tuple[int, int]:
        if obs.ngram_proposal_len > 0 and state["trust"] >= self.threshold:
            return NGRAM, obs.ngram_proposal_len
        return DRAFT, batch_fixed_k(ctx, obs)

    def update(self, state: Any, obs: Observation, fb: Feedback, ctx: PolicyContext) -> None:
        if fb.ngram_matches is not None:
            hit = 1.0 if fb.ngram_matches > 0 else 0.0
            state["trust"] = self.decay * state["trust"] + (1 - self.decay) * hit


@dataclass
class GoodputState:
    """Per-request state of :class:`Goodput`: acceptance models keyed by (drafter, whether
    n-gram has a draft now)."""

    models: dict[tuple[int, bool], AcceptModel]


@dataclass
class Goodput(CausalPolicy):
    """Maximise expected tokens per second under the cost model, per request and step.

    Keeps an :class:`AcceptModel` per drafter: n-gram is observed at every step it has a draft
    (its draft is checked against the emitted tokens), the learned drafter only when used, and
    separately where n-gram has a draft (repetitive text is easier for it too). Each step takes
    the drafter and ``k`` (0: no drafting) maximising ``E[emitted] / step seconds``
    (:func:`expected_emitted`, :func:`step_seconds`). The cost model makes it batch-size aware:
    at large batches verification costs relatively more, so ``k`` shrinks and weak drafts are
    skipped.

    With ``engine_wide`` (the default) a new request's estimates start from engine-wide ones,
    learned from every earlier request's verifications (an engine sees those; the fixed priors
    only seed them), instead of from the fixed priors: a workload where n-gram rarely pays is
    recognised after a few requests rather than re-learned by each. Earlier = the order requests
    are replayed in (sample order); the engine-wide state is reset per :meth:`trajectories` call.
    """

    name: str = "goodput"
    ngram_prior: tuple[float, float] = NGRAM_PRIOR
    draft_prior: tuple[float, float] = DRAFT_PRIOR
    draft_prior_at_ngram: tuple[float, float] = DRAFT_PRIOR_AT_NGRAM
    prior_weight: float = 20.0
    decay: float = 0.9
    engine_wide: bool = True
    engine_prior_weight: float = 50.0
    _engine: dict[tuple[int, bool], AcceptModel] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def _priors(self) -> dict[tuple[int, bool], tuple[float, float]]:
        return {
            (NGRAM, True): self.ngram_prior,
            (DRAFT, False): self.draft_prior,
            (DRAFT, True): self.draft_prior_at_ngram,
        }

    def reset(self) -> None:
        """Forget the engine-wide estimates (a fresh engine)."""
        w = self.engine_prior_weight
        self._engine = {key: AcceptModel(*prior, w, 1.0) for key, prior in self._priors().items()}

    def trajectories(self, traces: TraceArrays, ctx: PolicyContext, fidelity: Fidelity) -> Trajectories:
        self.reset()
        return super().trajectories(traces, ctx, fidelity)

    def start(self, prompt_len: int, ctx: PolicyContext) -> Any:
        w, d = self.prior_weight, self.decay
        if self.engine_wide and not self._engine:
            self.reset()
        priors = {k: (m.q, m.r) for k, m in self._engine.items()} if self.engine_wide else self._priors()
        return GoodputState({key: AcceptModel(*prior, w, d) for key, prior in priors.items()})

    def qr(self, state: GoodputState, drafter: int, obs: Observation) -> tuple[float, float]:
        """Predicted ``(q, r)`` of ``drafter`` at this step."""
        m = state.models[drafter, obs.ngram_proposal_len > 0]
        return m.q, m.r

    def options(self, obs: Observation, ctx: PolicyContext) -> list[tuple[int, int]]:
        """``(drafter, max k)`` the proposer allows at this step."""
        opts = []
        if ctx.proposer in ("ngram", "combined") and obs.ngram_proposal_len > 0:
            opts.append((NGRAM, obs.ngram_proposal_len))
        if ctx.proposer in ("eagle", "combined"):
            opts.append((DRAFT, MAX_DRAFT_TOKENS))
        return opts

    def emitted_by_k(self, state: GoodputState, drafter: int, obs: Observation, k_max: int) -> list[float]:
        """Predicted emitted tokens of ``drafter`` proposing ``k`` = 1..``k_max`` tokens."""
        q, r = self.qr(state, drafter, obs)
        return [expected_emitted(q, r, k) for k in range(1, k_max + 1)]

    def decide(self, state: Any, obs: Observation, ctx: PolicyContext) -> tuple[int, int]:
        best = (NONE, 0, 1.0 / step_seconds(ctx, obs, NONE, 0))
        for drafter, k_max in self.options(obs, ctx):
            t0, per_token = step_cost(ctx, obs, drafter)
            for k, emitted in enumerate(self.emitted_by_k(state, drafter, obs, k_max), start=1):
                rate = emitted / (t0 + k * per_token)
                if rate > best[2]:
                    best = (drafter, k, rate)
        return best[0], best[1]

    def update(self, state: Any, obs: Observation, fb: Feedback, ctx: PolicyContext) -> None:
        observed = []
        if fb.ngram_matches is not None:
            observed.append(((NGRAM, True), fb.ngram_matches, bool(fb.ngram_rejected)))
        key = (DRAFT, obs.ngram_proposal_len > 0)
        if fb.drafter == DRAFT:
            observed.append((key, fb.accepted, fb.rejected))
        else:
            state.models[key].forget()
        for key, matches, rejected in observed:
            state.models[key].observe(matches, rejected)
            if self.engine_wide:
                self._engine[key].observe(matches, rejected)


def measure_priors(traces: Sequence[TraceArrays]) -> dict[str, tuple[float, float]]:
    """:class:`Goodput`'s acceptance priors ``(q, r)`` measured on ``traces`` (every output
    position after the prefill): n-gram where it has a draft, the learned drafter where n-gram has
    no draft / has one. ``q`` = share of positions whose first draft token is accepted; ``r`` =
    the censored geometric estimate of continuing, accepted continuations / (accepted continuations
    + rejections before the draft ran out; n-gram drafts run out at their proposal length, the
    learned drafter's at :data:`MAX_DRAFT_TOKENS`). Keys are :class:`Goodput`'s prior fields; a
    prior the traces cannot measure (a drafter absent, no accepted draft) is left out."""
    tallies = {key: np.zeros(4) for key in ("ngram_prior", "draft_prior", "draft_prior_at_ngram")}
    for t in traces:
        n = int(t.length.sum())  # requests are concatenated
        after_prefill = np.ones(n, bool)
        after_prefill[t.start] = False
        # Without n-gram proposal lengths no position is known to have an n-gram draft.
        prop = t.proposed_ngram if t.proposed_ngram is not None else np.zeros(n, np.int64)
        has_draft, full = prop > 0, np.full(n, MAX_DRAFT_TOKENS)
        parts = []
        if t.acc_ngram is not None and t.proposed_ngram is not None:
            parts.append(("ngram_prior", t.acc_ngram - 1, prop, has_draft))
        if t.acc_draft is not None:
            c = t.acc_draft - 1
            parts += [("draft_prior", c, full, ~has_draft), ("draft_prior_at_ngram", c, full, has_draft)]
        for key, c, cap, m in parts:
            m = m & after_prefill
            c, cap = np.minimum(c[m], cap[m]), cap[m]
            hit = c >= 1
            tallies[key] += [len(c), hit.sum(), (c[hit] - 1).sum(), (c[hit] < cap[hit]).sum()]
    return {
        key: (float(hits / count), float(cont / (cont + stops)))
        for key, (count, hits, cont, stops) in tallies.items()
        if hits > 0 and cont + stops > 0
    }


@dataclass
class FittedGoodput(Goodput):
    """:class:`Goodput` with its acceptance priors measured on training traces
    (:func:`measure_priors`) instead of the rounded :data:`NGRAM_PRIOR` / :data:`DRAFT_PRIOR`.

    Nothing else is tuned (the priors only seed the engine-wide estimates), so trained on one
    dataset and replayed on another it is goodput cross-validated: ``adaptive-report`` trains it on
    the other trace sets, or on ``--train-traces``.
    """

    name: str = "goodput-fitted"
    needs_training: bool = True

    def train(self, traces: Sequence[TraceArrays], ctx: PolicyContext) -> None:
        """Measure the priors on ``traces`` (data of other datasets)."""
        if not traces:
            raise ValueError(f"policy {self.name!r} needs training traces (other datasets)")
        priors = measure_priors(traces)
        if not priors:
            raise ValueError(f"policy {self.name!r}: the training traces have no accepted drafts to measure")
        for key, prior in priors.items():  # a prior the traces cannot measure keeps its default
            setattr(self, key, prior)


def _logit(p: float) -> float:
    p = min(max(p, 1e-4), 1 - 1e-4)
    return math.log(p / (1 - p))


def fit_logistic(x: np.ndarray, y: np.ndarray, w: np.ndarray, l2: float = 1e-3, iters: int = 25) -> np.ndarray:
    """Weighted L2-regularised logistic regression by Newton's method (tiny dense problems)."""
    beta = np.zeros(x.shape[1])
    reg = l2 * w.sum() * np.eye(x.shape[1])
    reg[0, 0] = 0.0  # do not shrink the intercept
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(x @ beta)))
        grad = x.T @ (w * (p - y)) + reg @ beta
        hess = (x * (w * p * (1 - p))[:, None]).T @ x + reg
        step = np.linalg.solve(hess, grad)
        beta -= step
        if np.abs(step).max() < 1e-8:
            break
    return beta


@dataclass
class Learned(Goodput):
    """:class:`Goodput` whose acceptance predictions come from a small learned model.

    Per drafter and stage (first draft, continuation), a logistic regression maps causal
    features (the request's running :class:`AcceptModel` estimates, whether and how long an
    n-gram draft is available, log position) to the acceptance probability. It is trained on
    other datasets' traces (:meth:`train`): :class:`Goodput` is replayed there at batch size 1
    and every decision's features are labelled with the true acceptance of both drafters at
    that position (offline training may read the training traces; the policy never reads the
    evaluated ones).
    """

    name: str = "learned"
    prior_weight: float = 4.0
    min_training_rows: int = 10
    engine_wide: bool = False  # its features are per-request estimates from the fixed priors
    needs_training: bool = True
    weights: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)

    @staticmethod
    def features(m: AcceptModel, obs: Observation) -> list[float]:
        """Causal features of one drafter's prediction."""
        return [1.0, _logit(m.q), _logit(m.r), float(obs.ngram_proposal_len > 0)]

    def qr(self, state: GoodputState, drafter: int, obs: Observation) -> tuple[float, float]:
        """Predicted ``(q, r)``; a stage without a fitted model keeps the running estimate."""
        m = state.models[drafter, obs.ngram_proposal_len > 0]
        x = np.asarray(self.features(m, obs))

        def predict(stage: str, estimate: float) -> float:
            beta = self.weights.get((drafter, stage))
            return estimate if beta is None else 1.0 / (1.0 + math.exp(-float(x @ beta)))

        return predict("q", m.q), predict("r", m.r)

    def train(self, traces: Sequence[TraceArrays], ctx: PolicyContext) -> None:
        """Fit the four logistic models on ``traces`` (see the class docstring)."""
        if not traces:
            raise ValueError(f"policy {self.name!r} needs training traces (other datasets)")
        self.weights = {}
        rows: dict[tuple[int, str], list[tuple[list[float], float, float]]] = {
            (d, s): [] for d in (NGRAM, DRAFT) for s in ("q", "r")
        }
        behaviour = Goodput(
            ngram_prior=self.ngram_prior,
            draft_prior=self.draft_prior,
            draft_prior_at_ngram=self.draft_prior_at_ngram,
            prior_weight=self.prior_weight,
            decay=self.decay,
            engine_wide=False,
        )
        train_ctx = replace(ctx, batch_size=1)
        for arrays in traces:
            for r in range(arrays.num_requests):
                req = arrays.request(r)
                states: list[tuple[Observation, dict]] = []
                recorder = _Recorder(behaviour, states)
                run_causal(recorder, req, train_ctx)
                for obs, snapshot in states:
                    g = obs.position
                    for drafter, cap in ((NGRAM, obs.ngram_proposal_len), (DRAFT, MAX_DRAFT_TOKENS)):
                        acc = req.acc_ngram if drafter == NGRAM else req.acc_draft
                        if acc is None or cap <= 0 or (drafter, obs.ngram_proposal_len > 0) not in snapshot:
                            continue
                        x = self.features(snapshot[drafter, obs.ngram_proposal_len > 0], obs)
                        c = min(int(acc[g]) - 1, cap)
                        rows[drafter, "q"].append((x, 1.0 if c >= 1 else 0.0, 1.0))
                        if c >= 1:
                            if c > 1:
                                rows[drafter, "r"].append((x, 1.0, float(c - 1)))
                            if c < cap:
                                rows[drafter, "r"].append((x, 0.0, 1.0))
        for key, data in rows.items():
            # Too little data (e.g. short outputs, no n-gram match in training): that stage keeps
            # the running estimate (see :meth:`qr`).
            if len(data) < self.min_training_rows or len({d[1] for d in data}) < 2:
                continue
            x = np.array([d[0] for d in data])
            y = np.array([d[1] for d in data])
            w = np.array([d[2] for d in data])
            self.weights[key] = fit_logistic(x, y, w)


class _Recorder(CausalPolicy):
    """Wraps a policy, snapshotting its acceptance models at every decision (for training)."""

    def __init__(self, inner: Goodput, out: list) -> None:
        self.inner, self.out, self.name = inner, out, inner.name

    def start(self, prompt_len: int, ctx: PolicyContext) -> Any:
        return self.inner.start(prompt_len, ctx)

    def decide(self, state: Any, obs: Observation, ctx: PolicyContext) -> tuple[int, int]:
        self.out.append((obs, {key: replace(m) for key, m in state.models.items()}))
        return self.inner.decide(state, obs, ctx)

    def update(self, state: Any, obs: Observation, fb: Feedback, ctx: PolicyContext) -> None:
        self.inner.update(state, obs, fb, ctx)
