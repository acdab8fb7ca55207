"""What proposal policies work on: drafter codes, fidelity, trace arrays, trajectories, the
policy interface.

A policy (:mod:`sdbench.simulator.policies`, :mod:`sdbench.simulator.causal`) turns a request's
per-position acceptance trace (:class:`TraceArrays`) into a trajectory (:class:`Trajectories`):
the steps the request takes, each with its drafter, number of proposed tokens ``k`` and emitted
tokens ``min(acc_len, k + 1)`` (accepted drafts + the bonus token). The simulator then prices the
trajectories with a cost model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from sdbench.simulator.costmodel import CostModel

# Drafter codes of a step. DRAFT is the proposer's learned drafter (EAGLE, draft model, MTP...).
NONE, NGRAM, DRAFT = 0, 1, 2
DRAFTER_NAMES = {NONE: "none", NGRAM: "ngram", DRAFT: "draft"}
PROPOSERS: tuple[str, ...] = ("ngram", "eagle", "combined")
# The published traces were recorded with 20 speculative tokens: acceptance beyond is unknown.
MAX_DRAFT_TOKENS = 20


# ----------------------------------------------------------------------------- data
@dataclass(frozen=True)
class Fidelity:
    """Which of the published simulator's simplifications are corrected (all True: exact mode).

    - ``true_ngram_proposals``: n-gram proposes ``min(k, proposal length at the position)`` tokens
      (no match: no draft), instead of ``k`` everywhere with a random "no match" where nothing
      would be accepted;
    - ``aligned_positions``: the step after ``g`` generated tokens reads trace position ``g``
      (the published simulator reads ``g - 1``, so its first decode step replays the prefill);
    - ``drafter_cost``: a step pays for the drafter it used, only when it proposes (the published
      simulator charges the n-gram cost to every step of ``combined`` and the EAGLE cost to
      every EAGLE step, even when nothing is proposed);
    - ``batch_draft_cost``: drafting is priced once per step from the batch's KV and proposed
      tokens, as ``costmodel fit`` measures it (the published simulator prices it per request,
      with the KV count drifting while it loops over the batch).
    """

    true_ngram_proposals: bool = True
    aligned_positions: bool = True
    drafter_cost: bool = True
    batch_draft_cost: bool = True

    @property
    def offset(self) -> int:
        """Trace index = tokens generated - offset."""
        return 0 if self.aligned_positions else 1


COMPAT = Fidelity(False, False, False, False)
EXACT = Fidelity()


@dataclass(frozen=True)
class TraceArrays:
    """Acceptance traces of a request set, concatenated.

    Request ``r`` occupies flat indices ``[start[r], start[r] + length[r])``; index ``start[r] + j``
    is output position ``j`` (0 = prefill). ``length`` is the generation length for the proposer
    (for ``combined`` the shorter of the two traces). ``proposed_ngram`` is the n-gram draft
    length available at each position (with :data:`MAX_DRAFT_TOKENS` speculative tokens).
    """

    start: np.ndarray
    length: np.ndarray
    prompt_len: np.ndarray
    acc_ngram: np.ndarray | None = None
    proposed_ngram: np.ndarray | None = None
    acc_draft: np.ndarray | None = None

    @property
    def num_requests(self) -> int:
        """Number of requests."""
        return len(self.start)

    def request(self, r: int) -> TraceArrays:
        """Request ``r`` alone (flat arrays sliced, ``start`` = 0)."""
        s, n = int(self.start[r]), int(self.length[r])

        def cut(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[s : s + n]

        return TraceArrays(
            np.zeros(1, np.int64),
            self.length[r : r + 1],
            self.prompt_len[r : r + 1],
            cut(self.acc_ngram),
            cut(self.proposed_ngram),
            cut(self.acc_draft),
        )


@dataclass(frozen=True)
class Trajectories:
    """Decode steps of every request of a :class:`TraceArrays`, concatenated in request order.

    ``gen``: tokens generated before the step (>= 1); ``drafter``/``k``: who proposed how many
    tokens; ``emitted``: tokens the step produced; ``rng``: compat n-gram steps whose "match" the
    published simulator draws at random per batch copy (None if there are none).
    """

    req: np.ndarray
    gen: np.ndarray
    drafter: np.ndarray
    k: np.ndarray
    emitted: np.ndarray
    rng: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        """Total steps over all requests."""
        return len(self.req)


@dataclass(frozen=True)
class PolicyContext:
    """What a policy knows about the run, fixed for all requests."""

    proposer: str
    batch_size: int
    cost_model: CostModel
    draft_method: str = "eagle"  # the cost-model drafter of DRAFT steps


# ----------------------------------------------------------------------------- policies
class Policy(ABC):
    """A proposal policy for one proposer (see the module docstring)."""

    name: str = ""
    proposers: tuple[str, ...] = PROPOSERS
    causal: bool = False
    batch_dependent: bool = False  # trajectories depend on PolicyContext.batch_size

    def check(self, proposer: str, fidelity: Fidelity) -> None:
        """Raise ``ValueError`` if this policy cannot run for ``proposer`` under ``fidelity``."""
        if proposer not in self.proposers:
            raise ValueError(
                f"policy {self.name!r} does not apply to proposer {proposer!r} "
                f"(valid for: {', '.join(self.proposers)})"
            )

    @abstractmethod
    def trajectories(self, traces: TraceArrays, ctx: PolicyContext, fidelity: Fidelity) -> Trajectories:
        """The decode steps of every request."""
