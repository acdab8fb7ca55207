"""Offline replay of SuffixDecoding (vLLM ``method: suffix``) over greedy outputs.

SuffixDecoding (Oliaro et al., arXiv 2411.04975) drafts from suffix trees instead of a model.
vLLM 0.11.1 (``vllm/v1/spec_decode/suffix_decoding.py``) calls ArcticInference's
``SuffixDecodingCache`` (``arctic_inference/suffix_decoding/cache.py`` over the C++
``csrc/suffix_decoding/suffix_tree.cc``; identical in arctic-inference 0.1.1, the version vLLM
0.11.1 asks for, and 0.3.0). As in :mod:`sdbench.traces.ngram`, a paper-style trace commits one
token per step, so the context at output position ``j`` is ``prompt + output[:j]`` and the draft
depends only on token ids and on which earlier outputs the global tree holds.

What is replayed, per request in the order of the input table:

- a **per-request tree** over the prompt and the output so far, and a **global tree** over the
  outputs of every earlier request plus this request's output so far (ArcticInference adds an
  active request's tokens to both trees; ``start_request`` / ``add_active_response``);
- each tree holds every substring of length <= ``max_tree_depth`` with its number of
  occurrences (the C++ tree is a path-compressed form of exactly this trie);
- at output position ``j >= 1`` the pattern is the last ``max_tree_depth`` context tokens. For
  every match length ``L = 1 .. len(pattern) - 1`` whose pattern suffix occurs in the tree, the
  draft walks greedily to the most frequent child (ties: ArcticInference's sibling order,
  reproduced below), multiplying ``prob`` by ``count(child) / count(node)`` and stopping when
  ``prob < min_token_prob``, at ``min(K, int(L * max_spec_factor + 1e-6))`` tokens, or at the
  tree depth. Its score is the sum of its tokens' ``prob``; the best score over ``L`` wins
  (ties: the longer match), then the per-request draft wins over the global one unless the
  global one scores strictly higher (``SuffixDecodingCache.speculate``). Float32 arithmetic as
  in the C++ code, so ties are decided as there;
- ``acc_len`` / ``proposed_len`` / ``censored`` are scored as for the n-gram tracer.

Simplifications (documented, not hidden):

- **Order of the global tree.** The engine serves requests concurrently; which earlier outputs
  (and how much of concurrently running ones) the global tree holds depends on scheduling. Here
  request ``r`` sees the *complete* outputs of requests ``0 .. r-1`` of the table and nothing of
  later ones: a fixed order, as with ``max_num_seqs = 1``. The whole output of a request goes
  into the global tree (the engine adds the last sampled token too).
- **No eviction.** With more requests than ``max_cached_requests`` the engine evicts the oldest
  outputs (FIFO); the tracer refuses such inputs rather than approximate (default 10000).
- ``max_model_len`` is not modelled (vLLM also caps drafts at ``max_model_len - len - 1``).
- Path drafts only (``use_tree_spec=False``, what vLLM 0.11.1 calls).

Cost: O((P + m) * max_tree_depth) trie updates per request and O(max_tree_depth^2 + K) per
position for matching; memory O(distinct substrings up to ``max_tree_depth``), i.e. up to
``max_tree_depth`` Python nodes per token (fine for thousands of tokens per request, too much for
millions of tokens in the global tree).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from sdbench.traces.ngram import NgramTrace, _trace_from_drafts

# vLLM 0.11.1 SpeculativeConfig defaults (vllm/config/speculative.py).
DEFAULT_MAX_TREE_DEPTH = 24
DEFAULT_MAX_CACHED_REQUESTS = 10000
DEFAULT_MAX_SPEC_FACTOR = 1.0
DEFAULT_MIN_TOKEN_PROB = 0.1

_F32 = np.float32


@dataclass(frozen=True)
class SuffixParams:
    """SuffixDecoding settings; defaults are vLLM 0.11.1's ``suffix_decoding_*`` defaults.

    ``num_speculative_tokens`` is the tracer's draft cap (vLLM passes it as ``max_spec_tokens``).
    ``max_cached_requests`` 0 disables the global tree (as in vLLM).
    """

    num_speculative_tokens: int = 20
    max_tree_depth: int = DEFAULT_MAX_TREE_DEPTH
    max_spec_factor: float = DEFAULT_MAX_SPEC_FACTOR
    min_token_prob: float = DEFAULT_MIN_TOKEN_PROB
    max_cached_requests: int = DEFAULT_MAX_CACHED_REQUESTS

    def check(self) -> None:
        """Raise ``ValueError`` naming the first bad setting (vLLM's own bounds)."""
        if self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}")
        if self.max_tree_depth < 1:
            raise ValueError(f"max_tree_depth must be >= 1, got {self.max_tree_depth}")
        if self.max_cached_requests < 0:
            raise ValueError(f"max_cached_requests must be >= 0, got {self.max_cached_requests}")
        if not self.max_spec_factor >= 0:  # also refuses NaN
            raise ValueError(f"max_spec_factor must be >= 0, got {self.max_spec_factor}")
        if not 0 <= self.min_token_prob <= 1:
            raise ValueError(f"min_token_prob must be in [0, 1], got {self.min_token_prob}")


class _Node:
    """A trie node: the substring spelled by its path occurs ``count`` times.

    Children are ordered as ArcticInference orders siblings: by count, descending; within one
    count by ``key`` ascending (a child entering a count group at its front gets a negative key,
    at its back a positive one). ``groups[c]`` is a lazily cleaned heap of (key, token).
    """

    __slots__ = ("count", "token", "key", "children", "groups", "max_child")

    def __init__(self, token: int, key: int) -> None:
        self.count = 1
        self.token = token
        self.key = key
        self.children: dict[int, _Node] | None = None
        self.groups: dict[int, list[tuple[int, int]]] | None = None
        self.max_child = 0


@dataclass(frozen=True)
class SuffixDraft:
    """A proposal: tokens, score (sum of their float32 probabilities) and match length."""

    token_ids: list[int]
    score: float
    match_len: int


class SuffixTrie:
    """Occurrence-counting trie of all substrings up to ``max_depth`` of several sequences.

    Same counts and child order as ArcticInference's ``SuffixTree`` (append-only: no removal).
    """

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.root = _Node(-1, 0)
        self.root.count = 0
        self._active: dict[int, list[_Node]] = {}  # seq id -> nodes of its last suffixes
        self._tick = 0

    def _group_head(self, parent: _Node, count: int) -> _Node | None:
        heap = parent.groups.get(count) if parent.groups else None
        while heap:
            key, token = heap[0]
            child = parent.children[token]  # type: ignore[index]
            if child.key == key:  # keys change on every move, so this entry is current
                return child
            heapq.heappop(heap)
        return None

    def head_child(self, node: _Node) -> _Node | None:
        """The first child in sibling order (most frequent), or None for a leaf."""
        return self._group_head(node, node.max_child) if node.children else None

    def _add_child(self, parent: _Node, token: int) -> _Node:
        # A new child goes to the tail of the sibling list (count 1, after any other count-1).
        self._tick += 1
        child = _Node(token, self._tick)
        if parent.children is None:
            parent.children, parent.groups = {}, {}
        parent.children[token] = child
        parent.groups.setdefault(1, []).append((child.key, token))  # type: ignore[union-attr]
        parent.max_child = max(parent.max_child, 1)
        return child

    def _increment(self, parent: _Node, child: _Node) -> None:
        # suffix_tree.cc _increment_count: the head of its count group moves to the front of
        # the next group, any other member to that group's back.
        count = child.count
        was_head = self._group_head(parent, count) is child
        self._tick += 1
        child.count = count + 1
        child.key = -self._tick if was_head else self._tick
        heapq.heappush(parent.groups.setdefault(count + 1, []), (child.key, child.token))  # type: ignore[union-attr]
        if count + 1 > parent.max_child:
            parent.max_child = count + 1

    def append(self, seq_id: int, token: int) -> None:
        """Append ``token`` to sequence ``seq_id``: every suffix of length <= max_depth ending
        at it is counted once more."""
        active = self._active.setdefault(seq_id, [])
        active.append(self.root)
        self.root.count += 1
        if len(active) > self.max_depth:
            del active[0]
        for i, node in enumerate(active):
            child = node.children.get(token) if node.children else None
            if child is None:
                child = self._add_child(node, token)
            else:
                self._increment(node, child)
            active[i] = child

    def extend(self, seq_id: int, tokens: Iterable[int]) -> None:
        """Append every token of ``tokens`` to sequence ``seq_id``."""
        for token in tokens:
            self.append(seq_id, token)

    def match(self, pattern: Sequence[int]) -> _Node | None:
        """The node spelling ``pattern``, or None if it does not occur."""
        node = self.root
        for token in pattern:
            child = node.children.get(token) if node.children else None
            if child is None:
                return None
            node = child
        return node

    def speculate(
        self, context: Sequence[int], max_spec_tokens: int, max_spec_factor: float, min_token_prob: float
    ) -> SuffixDraft:
        """``SuffixTree::speculate`` (path mode, ``max_spec_offset`` 0) for ``context``."""
        best = SuffixDraft([], 0.0, 0)
        best_score = _F32(0.0)
        factor, min_prob = _F32(max_spec_factor), _F32(min_token_prob)
        n = len(context)
        for match_len in range(1, n):
            node = self.match(context[n - match_len :])
            if node is None:
                break  # a longer suffix cannot occur either
            # C++: static_cast<int>(match_len * max_spec_factor + max_spec_offset + 1e-6)
            budget = max(0, min(max_spec_tokens, int(float(_F32(match_len) * factor) + 1e-6)))
            tokens: list[int] = []
            prob, score = _F32(1.0), _F32(0.0)
            while len(tokens) < budget and prob >= min_prob:
                child = self.head_child(node)
                if child is None:
                    break
                prob = _F32(prob * (_F32(child.count) / _F32(node.count)))
                if not prob >= min_prob:
                    break
                tokens.append(child.token)
                score = _F32(score + prob)
                node = child
            if score >= best_score:  # ties go to the longer match
                best, best_score = SuffixDraft(tokens, float(score), match_len), score
        return best


def _check_requests(num_requests: int, params: SuffixParams) -> None:
    if params.max_cached_requests and num_requests > params.max_cached_requests:
        raise ValueError(
            f"{num_requests} requests exceed max_cached_requests={params.max_cached_requests}: the engine "
            "would evict the oldest outputs from the global tree, which the tracer does not model"
        )


def trace_suffix(
    requests: Sequence[tuple[Sequence[int], Sequence[int]]], params: SuffixParams | None = None
) -> list[NgramTrace]:
    """Replay SuffixDecoding over ``(prompt_token_ids, output_token_ids)`` pairs, in order.

    Request ``r``'s drafts see its own prompt and output so far (per-request tree) and the
    outputs of requests ``0 .. r-1`` plus its own output so far (global tree). Position 0 is
    the prefill step (no draft). Returns one trace per request, in the given order.
    """
    params = params or SuffixParams()
    params.check()
    _check_requests(len(requests), params)
    depth, k = params.max_tree_depth, params.num_speculative_tokens
    global_tree = SuffixTrie(depth)
    traces = []
    for seq_id, (prompt, output) in enumerate(requests):
        prompt, output = [int(t) for t in prompt], [int(t) for t in output]
        local = SuffixTrie(depth)
        local.extend(0, prompt)
        context = list(prompt)
        drafts: list[list[int]] = [[]]
        for j, token in enumerate(output[:-1]):
            # output[j] was just sampled; propose for position j + 1.
            local.append(0, token)
            if params.max_cached_requests:
                global_tree.append(seq_id, token)
            context.append(token)
            pattern = context[-depth:]
            mine = local.speculate(pattern, k, params.max_spec_factor, params.min_token_prob)
            other = global_tree.speculate(pattern, k, params.max_spec_factor, params.min_token_prob)
            drafts.append(mine.token_ids if mine.score >= other.score else other.token_ids)
        if params.max_cached_requests and output:
            global_tree.append(seq_id, output[-1])  # later requests see the whole output
        traces.append(_trace_from_drafts(output, drafts[: len(output)]))
    return traces


def propose_suffix_reference(
    prompt: Sequence[int],
    output_so_far: Sequence[int],
    earlier_outputs: Sequence[Sequence[int]],
    params: SuffixParams | None = None,
) -> list[int]:
    """The draft after ``prompt + output_so_far``, built from scratch (for tests and checks).

    Builds both trees anew each call: O(context * depth); :func:`trace_suffix` updates them
    incrementally instead.
    """
    params = params or SuffixParams()
    params.check()
    local, global_tree = SuffixTrie(params.max_tree_depth), SuffixTrie(params.max_tree_depth)
    local.extend(0, [*prompt, *output_so_far])
    if params.max_cached_requests:
        for seq_id, out in enumerate(earlier_outputs):
            global_tree.extend(seq_id, out)
        global_tree.extend(len(earlier_outputs), output_so_far)
    pattern = [*prompt, *output_so_far][-params.max_tree_depth :]
    args = (params.num_speculative_tokens, params.max_spec_factor, params.min_token_prob)
    mine, other = local.speculate(pattern, *args), global_tree.speculate(pattern, *args)
    return mine.token_ids if mine.score >= other.score else other.token_ids
