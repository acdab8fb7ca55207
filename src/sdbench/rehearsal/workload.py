"""What each request of a rehearsal does: its output and, per output position, how many tokens a
verification step emits.

A prompt table row names its acceptance record (``rehearsal_trace``: ``<published dataset>:<index>``
of the published trace file, :mod:`sdbench.rehearsal.prepare`) and its greedy output length
(``rehearsal_output_tokens``); a table prepared for real (no such columns) takes the record of its
dataset or category (:data:`~sdbench.rehearsal.standins.TRACE_BY_DATASET`) at a stable hash of
the request id, and that record's output length. Accepted lengths per position are the record's
(:func:`accepted_lengths`), a verification step emits ``min(accepted, k + 1, tokens left)``
(:func:`decode_steps`), so a request needs as many steps as its trace says.

Outputs are token ids drawn from a generator seeded by the prompt (the same for every method,
batch size and engine start: greedy outputs, no divergence), ending at the model's end-of-sequence
id unless the budget cuts them (``finish_reason`` ``length``).
"""

from __future__ import annotations

import ast
import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sdbench.rehearsal import standins
from sdbench.traces.published import PublishedRequest, read_published_jsonl

# A published trace records up to 20 drafts per step: at most 21 tokens emitted.
MAX_EMITTED = 21
TRACE_COLUMN = "rehearsal_trace"
OUTPUT_COLUMN = "rehearsal_output_tokens"


@functools.cache
def _read(path: str) -> tuple[PublishedRequest, ...]:
    return tuple(read_published_jsonl(path))


def load_traces(paths: dict[str, str]) -> dict[str, tuple[PublishedRequest, ...]]:
    """The published traces by dataset name (read once per process); held-out names are refused."""
    unknown = sorted(set(paths) - set(standins.PUBLISHED))
    if unknown:
        raise ValueError(f"rehearsal: published traces {', '.join(unknown)} are not replayed "
                         f"(only {', '.join(standins.PUBLISHED)}; the others are held out)")  # fmt: skip
    missing = [f"{name}: {p}" for name, p in sorted(paths.items()) if not Path(p).is_file()]
    if missing:
        raise FileNotFoundError(f"rehearsal: published trace file(s) missing ({'; '.join(missing)})")
    return {name: _read(str(p)) for name, p in sorted(paths.items())}


def trace_for(dataset: str, category: str) -> str:
    """The published trace a dataset's requests replay (by key, then category, else the default)."""
    return standins.TRACE_BY_DATASET.get(dataset) or standins.TRACE_BY_CATEGORY.get(category) or standins.DEFAULT_TRACE


def stable_index(key: str, n: int) -> int:
    """A record index from a request id: the same in every process and run."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") % n


def prompt_key(token_ids: Any) -> bytes:
    """Identity of a prompt: a digest of its token ids (what the engine is handed)."""
    return hashlib.blake2b(np.asarray(token_ids, dtype=np.int64).tobytes(), digest_size=16).digest()


def tree_depth(tree: str) -> int:
    """Depth of a ``speculative_token_tree`` (its longest path)."""
    return max(len(node) for node in ast.literal_eval(tree))


def draft_cap(method: dict[str, Any]) -> int:
    """Most tokens one verification step emits: k + 1 for a chain of k drafts, depth + 1 for a tree."""
    if "speculative_token_tree" in method:
        return tree_depth(method["speculative_token_tree"]) + 1
    return int(method.get("num_speculative_tokens", 0)) + 1


def _seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


def accepted_lengths(record: PublishedRequest, method: str, n: int) -> np.ndarray:
    """Tokens a step at output position p would emit with up to 20 drafts, p = 0 .. n-1 (0: prefill, 1).

    Replayed from the record's trace (positions 1.. cycled past its end), or drawn with the
    method's conditional rates (:data:`~sdbench.rehearsal.standins.METHOD_ACCEPTANCE`).
    """
    how = standins.METHOD_ACCEPTANCE.get(method)
    if how is None:
        raise ValueError(f"rehearsal: no acceptance stand-in for method {method!r} "
                         f"(known: {', '.join(sorted(standins.METHOD_ACCEPTANCE))})")  # fmt: skip
    if how.trace is not None:
        base = np.asarray(getattr(record, how.trace), dtype=np.int64)
        if n > len(base):
            tail = base[1:] if len(base) > 1 else np.ones(1, np.int64)
            base = np.concatenate([base, np.resize(tail, n - len(base))])
        acc = base[:n].copy()
        if how.uplift:
            acc = np.where(acc >= 2, np.minimum(acc + how.uplift, MAX_EMITTED), acc)
    else:
        rates = np.resize(np.asarray(how.rates, float), MAX_EMITTED - 1)
        rates[len(how.rates):] = how.rates[-1]
        draws = np.random.default_rng(_seed(record.request_id, method)).random((n, MAX_EMITTED - 1))
        acc = 1 + np.cumprod(draws < rates, axis=1).sum(axis=1)
    if n:
        acc[0] = 1  # the prefill step emits the first token
    return acc.astype(np.int64)


def decode_steps(acc: np.ndarray, cap: int, n: int) -> np.ndarray:
    """Tokens each verification step emits after the prefill step: ``min(acc[p], cap, left)`` at
    position p, then p moves on by that many; ``n`` output tokens in all (the prefill emits one)."""
    out: list[int] = []
    p = 1
    while p < n:
        e = int(min(acc[p], cap, n - p))
        out.append(e)
        p += e
    return np.asarray(out, dtype=np.int64)


@dataclass(frozen=True)
class RequestInfo:
    """One prompt's rehearsal facts (from its prompt table row)."""

    dataset: str
    request_id: str
    prompt_len: int
    natural_len: int  # the greedy output's length with the end-of-sequence token, uncapped
    record: PublishedRequest


class Workload:
    """The requests of an engine job's prompt tables, looked up by prompt (what ``generate`` gets)."""

    def __init__(self, prompts: dict[str, pd.DataFrame], traces: dict[str, tuple[PublishedRequest, ...]],
                 vocab_size: int, eos_token_id: int, seed: int) -> None:  # fmt: skip
        self.vocab_size, self.eos, self.seed = int(vocab_size), int(eos_token_id), int(seed)
        self.traces = traces
        self._by_key: dict[bytes, RequestInfo] = {}
        for dataset, table in sorted(prompts.items()):
            for row in table.itertuples(index=False):
                info = self._info(dataset, row)
                self._by_key.setdefault(prompt_key(row.prompt_token_ids), info)

    def _record(self, name: str, index: int) -> PublishedRequest:
        if name not in self.traces:
            raise ValueError(f"rehearsal: the published {name} trace was not given to the engine job")
        records = self.traces[name]
        return records[index % len(records)]

    def _info(self, dataset: str, row: Any) -> RequestInfo:
        rid = str(row.request_id)
        source = getattr(row, TRACE_COLUMN, None)
        if source:
            name, _, index = str(source).partition(":")
            record = self._record(name, int(index))
        else:
            name = trace_for(str(getattr(row, "dataset", dataset)), str(getattr(row, "category", "") or ""))
            record = self._record(name, stable_index(f"{dataset}/{rid}", len(self.traces[name])))
        natural = getattr(row, OUTPUT_COLUMN, None)
        natural = int(natural) if natural is not None and not pd.isna(natural) else len(record.generated_token_ids)
        return RequestInfo(dataset, rid, len(row.prompt_token_ids), max(1, natural), record)

    def lookup(self, token_ids: Any, key: bytes | None = None) -> RequestInfo:
        """The request whose prompt these are (``key``: their :func:`prompt_key`, when known);
        ``KeyError`` for a prompt of no table."""
        try:
            return self._by_key[prompt_key(token_ids) if key is None else key]
        except KeyError:
            raise KeyError(f"rehearsal: a prompt of {len(token_ids)} tokens is in none of the job's prompt tables") from None

    def output_ids(self, info: RequestInfo, n: int, stopped: bool) -> list[int]:
        """The greedy output's first ``n`` token ids (the end-of-sequence id last when ``stopped``)."""
        rng = np.random.default_rng(_seed(self.seed, info.dataset, info.request_id))
        ids = rng.integers(0, self.vocab_size - 1, size=n)
        ids[ids >= self.eos] += 1  # never the end-of-sequence id inside the output
        if stopped and n:
            ids[-1] = self.eos
        return ids.tolist()  # Python ints, as vLLM returns them


def budget(info: RequestInfo, max_tokens: int, ignore_eos: bool) -> tuple[int, bool]:
    """(output tokens, stopped at end-of-sequence) of a request under its sampling budget."""
    if ignore_eos or info.natural_len > max_tokens:
        return int(max_tokens), False
    return info.natural_len, True
