"""Trace tables (per-request, per-output-position acceptance): schema, reader, builders.

A trace table has one row per (request, output position, method) with columns
:data:`TRACE_COLUMNS`; :func:`read_trace_table` validates one. Commands (registered in
:mod:`sdbench.traces.cli`):

- ``sdbench trace ngram``: replay vLLM's n-gram proposer (:mod:`sdbench.traces.ngram`) over the
  greedy outputs of a published-trace JSONL or a run-cell ``requests`` parquet table;
- ``sdbench trace suffix``: replay SuffixDecoding (:mod:`sdbench.traces.suffix`) over the same
  inputs, requests in table order;
- ``sdbench trace published``: convert a published-trace JSONL (n-gram and EAGLE) to a trace table;
- ``sdbench trace stack``: concatenate trace tables.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sdbench.io import read_parquet, write_parquet
from sdbench.traces.records import TRACE_COLUMNS, TRACE_DTYPES, MethodTrace, make_trace_table  # noqa: F401
from sdbench.traces.ngram import trace_ngram
from sdbench.traces.published import read_published_jsonl
from sdbench.traces.suffix import SuffixParams, trace_suffix

REQUESTS_COLUMNS = ("request_id", "prompt_token_ids", "output_token_ids")


@dataclass(frozen=True)
class TokenRequest:
    """The token ids a tracer needs for one request."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]


def read_token_requests(
    path: str | os.PathLike[str], prompts: str | os.PathLike[str] | None = None, distinct: bool = False
) -> list[TokenRequest]:
    """Requests from a published-trace JSONL (``.jsonl``) or a ``requests`` parquet table.

    The parquet table needs columns ``request_id``, ``prompt_token_ids``, ``output_token_ids``
    (a run cell's table has no prompt ids: they come from its prompt table ``prompts`` by
    ``request_id``, and a sequence stored by reference gets its slot's output,
    sdbench.requesttable); other columns are ignored. ``distinct``: a run cell's equal copies of
    one output once (a per-request tracer's traces of them are the same). Raises ``ValueError``
    naming the file on bad input.
    """
    path = Path(path)
    if path.suffix == ".jsonl":
        return [
            TokenRequest(r.request_id, r.prompt_token_ids, r.generated_token_ids)
            for r in read_published_jsonl(path)
        ]
    if path.suffix == ".parquet":
        from sdbench.requesttable import PROMPTS_HINT, read_with_prompts

        df = read_with_prompts(path, prompts, distinct=distinct)
        missing = [c for c in REQUESTS_COLUMNS if c not in df.columns]
        if missing:
            hint = f"; {PROMPTS_HINT}" if missing == ["prompt_token_ids"] else ""
            raise ValueError(
                f"{path}: requests table lacks column(s) {', '.join(missing)} "
                f"(has: {', '.join(df.columns) or 'none'}{hint})"
            )
        if df.empty:
            raise ValueError(f"{path}: requests table has no rows (expected one row per request)")
        return [
            TokenRequest(str(rid), [int(t) for t in prompt], [int(t) for t in output])
            for rid, prompt, output in zip(
                df["request_id"], df["prompt_token_ids"], df["output_token_ids"], strict=True
            )
        ]
    raise ValueError(f"{path}: expected a published-trace .jsonl or a requests .parquet file")


def ngram_trace_table(
    requests: Sequence[TokenRequest],
    num_speculative_tokens: int = 20,
    prompt_lookup_min: int = 3,
    prompt_lookup_max: int = 7,
) -> pd.DataFrame:
    """Trace table (method ``ngram``) replaying the n-gram proposer over every request."""
    traces = []
    for req in requests:
        tr = trace_ngram(
            req.prompt_token_ids,
            req.output_token_ids,
            num_speculative_tokens,
            prompt_lookup_min,
            prompt_lookup_max,
        )
        traces.append(MethodTrace(req.request_id, "ngram", tr.acc_len, tr.proposed_len, tr.censored))
    return make_trace_table(traces)


def suffix_trace_table(
    requests: Sequence[TokenRequest], params: SuffixParams | None = None, method: str = "suffix"
) -> pd.DataFrame:
    """Trace table (method ``method``) replaying SuffixDecoding over the requests in the given
    order (earlier requests' outputs feed the global tree of later ones)."""
    if not method:
        raise ValueError("the method label must not be empty")
    replays = trace_suffix([(r.prompt_token_ids, r.output_token_ids) for r in requests], params)
    return make_trace_table(
        MethodTrace(r.request_id, method, tr.acc_len, tr.proposed_len, tr.censored)
        for r, tr in zip(requests, replays, strict=True)
    )


def published_trace_table(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Trace table of a published-trace JSONL: all ``ngram`` rows, then all ``eagle`` rows.

    ``proposed_len`` is null (not published) and ``censored`` False (the recorded values are what
    the engine measured, also past the end of the output).
    """
    requests = read_published_jsonl(path)
    traces = [MethodTrace(r.request_id, "ngram", np.asarray(r.acc_ngram)) for r in requests]
    traces += [MethodTrace(r.request_id, "eagle", np.asarray(r.acc_eagle)) for r in requests]
    return make_trace_table(traces)


def read_trace_table(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a trace table parquet and check its columns; dtypes are normalised to
    :data:`TRACE_DTYPES`. Raises ``ValueError`` naming the file on a bad table."""
    df = read_parquet(path, what="trace table")
    missing = [c for c in TRACE_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"{path}: not a trace table, lacks column(s) {', '.join(missing)} (has: {', '.join(df.columns) or 'none'})"
        )
    df = df[list(TRACE_COLUMNS)]
    try:
        df = df.astype(TRACE_DTYPES)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: trace table column of the wrong type ({exc})") from exc
    bad = df.index[df["acc_len"] < 1]
    if len(bad):
        # A step emits at least the verified token; 0 would stall any replay.
        row = df.loc[bad[0]]
        raise ValueError(
            f"{path}: acc_len must be >= 1 (request {row['request_id']!r}, position {row['position']} "
            f"has {row['acc_len']})"
        )
    return df


def _cmd_trace_ngram(args: argparse.Namespace) -> int:
    # Each request's trace is its own (n-gram lookups within it): equal copies are traced once.
    requests = read_token_requests(args.input, args.prompts, distinct=True)
    table = ngram_trace_table(
        requests, args.num_speculative_tokens, args.prompt_lookup_min, args.prompt_lookup_max
    )
    write_parquet(table, args.output)
    return 0


def _cmd_trace_suffix(args: argparse.Namespace) -> int:
    params = SuffixParams(
        num_speculative_tokens=args.num_speculative_tokens,
        max_tree_depth=args.max_tree_depth,
        max_spec_factor=args.max_spec_factor,
        min_token_prob=args.min_token_prob,
        max_cached_requests=args.max_cached_requests,
    )
    try:
        params.check()  # before reading the input: a bad option is named as such
    except ValueError as exc:
        name, rest = str(exc).split(" ", 1)  # messages start with the setting's name
        raise ValueError(f"sdbench trace suffix: --{name.replace('_', '-')} {rest}") from None
    table = suffix_trace_table(read_token_requests(args.input, args.prompts), params, args.method)
    write_parquet(table, args.output)
    return 0


def _cmd_trace_published(args: argparse.Namespace) -> int:
    write_parquet(published_trace_table(args.input), args.output)
    return 0


def _cmd_trace_stack(args: argparse.Namespace) -> int:
    tables = [read_trace_table(p) for p in args.inputs]
    write_parquet(pd.concat(tables, ignore_index=True).astype(TRACE_DTYPES), args.output)
    return 0

