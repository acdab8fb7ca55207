"""Offline replay of vLLM 0.10.1.1's V1 n-gram proposer over a greedy output.

The paper's acceptance traces force one committed token per step, so the context at output
position ``j`` is always ``prompt + output[:j]`` and the n-gram draft at that step depends on
nothing but token ids. Replaying the proposer therefore recomputes ``acc_ngram.acc_len`` from
``prompt_token_ids`` and ``generated_token_ids`` alone.

Proposer semantics (``vllm/v1/spec_decode/ngram_proposer.py``,
``_find_longest_matched_ngram_and_propose_tokens``): take the longest ``n <= prompt_lookup_max``
whose last-``n``-token suffix occurs earlier in the context (the occurrence must start before the
suffix but may overlap it); ties go to the leftmost occurrence; if that ``n < prompt_lookup_min``
there is no draft (no fallback to a shorter ``n``); the draft is ``tokens[s+n : s+n+k]``, truncated
at the end of the context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NgramTrace:
    """Per-output-position replay of one request; every array has ``len(output)`` entries.

    ``acc_len``: tokens the target emits at that step (accepted drafts + 1).
    ``proposed_len``: draft length (0: no draft, including the prefill step at position 0).
    ``censored``: the draft ran past the end of the recorded output with every recorded token
    matched, so ``acc_len`` is only a lower bound (what the target does after its last
    token is unknown).
    """

    acc_len: np.ndarray  # int32
    proposed_len: np.ndarray  # int32
    censored: np.ndarray  # bool


def _check_params(num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
    if num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
    if not 1 <= prompt_lookup_min <= prompt_lookup_max:
        raise ValueError(
            "need 1 <= prompt_lookup_min <= prompt_lookup_max, "
            f"got min={prompt_lookup_min} max={prompt_lookup_max}"
        )


def _effective_k(k: int, context_len: int, max_model_len: int | None) -> int:
    """vLLM never drafts past ``max_model_len``."""
    return k if max_model_len is None else min(k, max_model_len - context_len)


def propose_reference(
    context: Sequence[int], k: int, min_n: int, max_n: int, max_model_len: int | None = None
) -> list[int]:
    """The proposer's draft for ``context`` by a direct quadratic scan ([] means no draft)."""
    total = len(context)
    k = _effective_k(k, total, max_model_len)
    if total < min_n or k <= 0:
        return []
    ctx = list(context)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = ctx[total - n :]
        for s in range(total - n):  # leftmost occurrence first
            if ctx[s : s + n] == suffix:
                return ctx[s + n : s + n + min(k, total - (s + n))]
    return []


def _trace_from_drafts(output: Sequence[int], drafts: list[list[int]]) -> NgramTrace:
    """Score ``drafts[j]`` (the draft at output position ``j``) against ``output[j:]``."""
    m = len(output)
    acc_len = np.ones(m, dtype=np.int32)
    proposed_len = np.zeros(m, dtype=np.int32)
    censored = np.zeros(m, dtype=bool)
    for j in range(1, m):
        draft = drafts[j]
        acc = 0
        while acc < len(draft) and j + acc < m and draft[acc] == output[j + acc]:
            acc += 1
        remaining = m - j
        acc_len[j] = acc + 1
        proposed_len[j] = len(draft)
        censored[j] = len(draft) > remaining and acc == remaining
    return NgramTrace(acc_len, proposed_len, censored)


def trace_ngram_reference(
    prompt_token_ids: Sequence[int],
    output_token_ids: Sequence[int],
    num_speculative_tokens: int = 20,
    prompt_lookup_min: int = 3,
    prompt_lookup_max: int = 7,
    *,
    max_model_len: int | None = None,
) -> NgramTrace:
    """Same result as :func:`trace_ngram`, by calling :func:`propose_reference` at every step.

    Quadratic in the context length per step; kept as the readable specification for tests and
    for ``sdbench bench tracer``.
    """
    _check_params(num_speculative_tokens, prompt_lookup_min, prompt_lookup_max)
    tokens = list(prompt_token_ids) + list(output_token_ids)
    p = len(prompt_token_ids)
    drafts = [[]] + [
        propose_reference(
            tokens[: p + j], num_speculative_tokens, prompt_lookup_min, prompt_lookup_max, max_model_len
        )
        for j in range(1, len(output_token_ids))
    ]
    return _trace_from_drafts(list(output_token_ids), drafts)


def _first_occurrence(tokens: np.ndarray, max_n: int) -> list[np.ndarray]:
    """``first[n][i]`` = leftmost start of the n-gram ``tokens[i:i+n]``, for n = 1..max_n.

    Exact (no hashing): the id of an n-gram is the rank of the pair (id of its leading
    (n-1)-gram, its last token), so equal ids mean equal n-grams. ``first[0]`` is unused.
    """
    vocab, tok = np.unique(tokens, return_inverse=True)
    base = np.int64(len(vocab))
    first: list[np.ndarray] = [np.empty(0, dtype=np.int64)]
    ids = tok.astype(np.int64)
    for n in range(1, max_n + 1):
        count = len(tokens) - n + 1
        if count <= 0:
            first.append(np.empty(0, dtype=np.int64))
            continue
        key = ids if n == 1 else ids[:count] * base + tok[n - 1 :]
        # return_index: first index of each distinct key; ids < len(tokens), so no overflow.
        _, first_idx, ids = np.unique(key, return_index=True, return_inverse=True)
        first.append(first_idx[ids].astype(np.int64))
    return first


def trace_ngram(
    prompt_token_ids: Sequence[int],
    output_token_ids: Sequence[int],
    num_speculative_tokens: int = 20,
    prompt_lookup_min: int = 3,
    prompt_lookup_max: int = 7,
    *,
    max_model_len: int | None = None,
) -> NgramTrace:
    """Replay the n-gram proposer at every output position of one greedy request.

    Position 0 is the prefill step (``acc_len`` 1, no draft). At ``j >= 1`` the context is
    ``prompt + output[:j]``, the draft is the proposer's proposal for it, and ``acc_len`` is
    1 + the longest prefix of the draft equal to ``output[j:]``. Where the draft is longer than
    the remaining output and all remaining tokens match, ``acc_len = len(output) - j + 1`` and
    ``censored`` is True. ``max_model_len`` (None: unlimited) caps drafts as vLLM does.

    Vectorised with numpy: O(L log L + m k) for L = prompt + m output tokens, versus the per-step scan of
    :func:`trace_ngram_reference`.
    """
    _check_params(num_speculative_tokens, prompt_lookup_min, prompt_lookup_max)
    k, min_n, max_n = num_speculative_tokens, prompt_lookup_min, prompt_lookup_max
    prompt = np.asarray(prompt_token_ids, dtype=np.int64).reshape(-1)
    output = np.asarray(output_token_ids, dtype=np.int64).reshape(-1)
    m, p = len(output), len(prompt)
    acc_len = np.ones(m, dtype=np.int32)
    proposed_len = np.zeros(m, dtype=np.int32)
    censored = np.zeros(m, dtype=bool)
    if m <= 1:
        return NgramTrace(acc_len, proposed_len, censored)

    tokens = np.concatenate([prompt, output])
    total = len(tokens)
    first = _first_occurrence(tokens, max_n)
    ctx_len = p + np.arange(1, m, dtype=np.int64)  # context length N at positions j = 1..m-1

    # Longest n wins: matches are nested (an n-match implies an (n-1)-match), so scanning n
    # upwards and overwriting leaves the largest matching n, with its leftmost start.
    best_n = np.zeros(m - 1, dtype=np.int64)
    best_s = np.zeros(m - 1, dtype=np.int64)
    for n in range(min_n, max_n + 1):
        start = ctx_len - n  # where the suffix n-gram starts
        ok = start >= 1  # an earlier occurrence needs start > 0
        s = np.full(m - 1, -1, dtype=np.int64)
        s[ok] = first[n][start[ok]]
        hit = ok & (s < start)  # leftmost occurrence lies strictly before the suffix
        best_n[hit] = n
        best_s[hit] = s[hit]

    k_eff = np.full(m - 1, k, dtype=np.int64)
    if max_model_len is not None:
        k_eff = np.minimum(k_eff, max_model_len - ctx_len)
    has = (best_n > 0) & (k_eff > 0)
    draft_start = best_s + best_n
    draft_len = np.where(has, np.minimum(k_eff, ctx_len - draft_start), 0)

    # Compare draft token i (tokens[draft_start + i]) with target token tokens[N + i].
    offs = np.arange(k, dtype=np.int64)
    draft_idx = draft_start[:, None] + offs
    target_idx = ctx_len[:, None] + offs
    valid = (offs < draft_len[:, None]) & (target_idx < total)
    eq = valid & (tokens[np.minimum(draft_idx, total - 1)] == tokens[np.minimum(target_idx, total - 1)])
    acc = np.cumprod(eq, axis=1).sum(axis=1)
    remaining = total - ctx_len

    acc_len[1:] = acc + 1
    proposed_len[1:] = draft_len
    censored[1:] = (draft_len > remaining) & (acc == remaining)
    return NgramTrace(acc_len, proposed_len, censored)
