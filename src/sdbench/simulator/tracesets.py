"""Acceptance traces as the simulator reads them: one :class:`TraceSet` per dataset.

A trace set comes from a published-trace JSONL (SpecDecode-Bench/simulator) or a trace table
(:mod:`sdbench.traces.table`); :func:`trace_arrays` flattens the requests a simulation samples
into the :class:`~sdbench.simulator.policytypes.TraceArrays` the policies read.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from sdbench.simulator.policytypes import TraceArrays
from sdbench.traces import published

NGRAM_METHOD = "ngram"


@dataclass(frozen=True)
class RequestTrace:
    """One request: prompt length and, per method, ``acc_len`` (and n-gram draft lengths when
    known) per output position; token ids when the source has them (to trace n-gram)."""

    request_id: str
    prompt_len: int
    acc: dict[str, np.ndarray]
    proposed: dict[str, np.ndarray]
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] | None = None


@dataclass(frozen=True)
class TraceSet:
    """The requests of one dataset, in source order."""

    dataset: str
    source: str
    requests: tuple[RequestTrace, ...]

    @property
    def methods(self) -> tuple[str, ...]:
        """Methods present, in order of first appearance."""
        return tuple(dict.fromkeys(m for r in self.requests for m in r.acc))


def _load_published(path: Path) -> TraceSet:
    reqs = tuple(
        RequestTrace(
            r.request_id,
            len(r.prompt_token_ids),
            {NGRAM_METHOD: np.asarray(r.acc_ngram, np.int64), "eagle": np.asarray(r.acc_eagle, np.int64)},
            {},
            r.prompt_token_ids,
            r.generated_token_ids,
        )
        for r in published.read_published_jsonl(path)
    )
    return TraceSet(published.dataset_name(path), str(path), reqs)


def _load_trace_table(path: Path, token_requests: dict[str, tuple[list[int], list[int]]]) -> TraceSet:
    """A trace table (``sdbench trace ...``); prompt lengths from a ``prompt_len`` column or from
    ``token_requests`` (request id -> (prompt ids, output ids))."""
    import pyarrow.parquet as pq

    from sdbench.io import read_parquet
    from sdbench.traces.table import read_trace_table

    df = read_trace_table(path)
    extra_cols = [c for c in ("prompt_len", "dataset") if c in pq.read_schema(path).names]
    extra = read_parquet(path, columns=extra_cols) if extra_cols else pd.DataFrame(index=df.index)
    dataset = published.dataset_name(path)
    if "dataset" in extra and extra["dataset"].nunique() == 1:
        dataset = str(extra["dataset"].iloc[0])
    order = {rid: i for i, rid in enumerate(dict.fromkeys(df["request_id"]))}
    df = df.assign(_r=df["request_id"].map(order), _pl=extra["prompt_len"] if "prompt_len" in extra else -1)
    df = df.sort_values(["_r", "method", "position"], kind="stable")
    acc: dict[str, dict[str, np.ndarray]] = {}
    proposed: dict[str, dict[str, np.ndarray]] = {}
    prompt_len: dict[str, int] = {}
    for (rid, method), g in df.groupby(["request_id", "method"], sort=False):
        pos = g["position"].to_numpy()
        if not np.array_equal(pos, np.arange(len(pos))):
            raise ValueError(f"{path}: request {rid!r} method {method!r}: positions are not 0..{len(pos) - 1}")
        acc.setdefault(rid, {})[method] = g["acc_len"].to_numpy(np.int64)
        if g["proposed_len"].notna().all():
            proposed.setdefault(rid, {})[method] = g["proposed_len"].to_numpy(np.int64)
        if int(g["_pl"].iloc[0]) >= 0:
            prompt_len[rid] = int(g["_pl"].iloc[0])
    reqs = []
    for rid in order:
        tokens = token_requests.get(rid)
        if rid not in prompt_len:
            if tokens is None:
                raise ValueError(
                    f"{path}: no prompt length for request {rid!r}: add a prompt_len column or pass "
                    "its requests table (--requests)"
                )
            prompt_len[rid] = len(tokens[0])
        reqs.append(
            RequestTrace(
                rid, prompt_len[rid], acc[rid], proposed.get(rid, {}), *(tokens if tokens is not None else (None, None))
            )
        )
    return TraceSet(dataset, str(path), tuple(reqs))


def _token_requests(paths: Sequence[str | os.PathLike[str]]) -> dict[str, tuple[list[int], list[int]]]:
    from sdbench.traces.table import read_token_requests

    return {r.request_id: (r.prompt_token_ids, r.output_token_ids) for p in paths for r in read_token_requests(p)}


def load_traces(path: str | os.PathLike[str], requests: Sequence[str | os.PathLike[str]] = ()) -> TraceSet:
    """Read a published-trace ``.jsonl`` or a trace-table ``.parquet`` (token ids of its requests,
    for prompt lengths and n-gram tracing, from ``requests`` tables if it lacks them)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace file {path} does not exist")
    if path.suffix == ".jsonl":
        return _load_published(path)
    if path.suffix == ".parquet":
        return _load_trace_table(path, _token_requests(requests))
    raise ValueError(f"{path}: expected a published-trace .jsonl or a trace-table .parquet")


def with_ngram_proposals(ts: TraceSet) -> TraceSet:
    """``ts`` with n-gram draft lengths at every position, traced from token ids where missing
    (:func:`sdbench.traces.ngram.trace_ngram`, 20 speculative tokens, lookup 3..7)."""
    if all(NGRAM_METHOD in r.proposed for r in ts.requests if NGRAM_METHOD in r.acc):
        return ts
    from sdbench.traces.ngram import trace_ngram

    out = []
    for r in ts.requests:
        if NGRAM_METHOD in r.acc and NGRAM_METHOD not in r.proposed:
            if r.prompt_token_ids is None or r.output_token_ids is None:
                raise ValueError(
                    f"{ts.source}: request {r.request_id!r} has no n-gram proposal lengths and no token ids "
                    "to trace them (pass its requests table with --requests)"
                )
            tr = trace_ngram(r.prompt_token_ids, r.output_token_ids)
            prop = tr.proposed_len.astype(np.int64)
            n = len(r.acc[NGRAM_METHOD])
            prop = np.concatenate([prop, np.zeros(max(0, n - len(prop)), np.int64)])[:n]
            r = replace(r, proposed={**r.proposed, NGRAM_METHOD: prop})
        out.append(r)
    return replace(ts, requests=tuple(out))


def draft_method_of(ts: TraceSet, drafter: str | None = None) -> str:
    """The learned drafter standing for proposer ``eagle``: ``drafter`` if given, else ``eagle``
    if present, else the only non-n-gram method."""
    learned = [m for m in ts.methods if m != NGRAM_METHOD]
    if drafter is not None:
        if drafter not in learned:
            raise ValueError(f"{ts.source}: no method {drafter!r} (learned drafters: {', '.join(learned) or 'none'})")
        return drafter
    if "eagle" in learned:
        return "eagle"
    if len(learned) == 1:
        return learned[0]
    raise ValueError(
        f"{ts.source}: {'no learned drafter' if not learned else 'several learned drafters: ' + ', '.join(learned)}"
        " (choose one with --drafter)"
    )


def _gen_len(r: RequestTrace, proposer: str, draft_method: str) -> int:
    if proposer == NGRAM_METHOD:
        return len(r.acc.get(NGRAM_METHOD, ()))
    if proposer == "eagle":
        return len(r.acc.get(draft_method, ()))
    # Outputs of the two runs can differ; the published simulator cuts to the shorter one.
    return min(len(r.acc.get(NGRAM_METHOD, ())), len(r.acc.get(draft_method, ())))


def trace_arrays(ts: TraceSet, indices: Sequence[int], proposer: str, draft_method: str) -> TraceArrays:
    """Flat per-position arrays of the requests ``indices`` (see :class:`TraceArrays`)."""
    reqs = [ts.requests[i] for i in indices]
    length = np.array([_gen_len(r, proposer, draft_method) for r in reqs], np.int64)
    start = np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64)

    def cat(get: Callable[[RequestTrace], np.ndarray | None]) -> np.ndarray | None:
        parts = [get(r) for r in reqs]
        if any(p is None for p in parts):
            return None
        return np.concatenate([np.asarray(p[:n], np.int64) for p, n in zip(parts, length)])

    use_ngram = proposer in (NGRAM_METHOD, "combined")
    use_draft = proposer in ("eagle", "combined")
    return TraceArrays(
        start=start,
        length=length,
        prompt_len=np.array([r.prompt_len for r in reqs], np.int64),
        acc_ngram=cat(lambda r: r.acc.get(NGRAM_METHOD)) if use_ngram else None,
        proposed_ngram=cat(lambda r: r.proposed.get(NGRAM_METHOD)) if use_ngram else None,
        acc_draft=cat(lambda r: r.acc.get(draft_method)) if use_draft else None,
    )
