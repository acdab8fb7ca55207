"""What an analysis job asks of a batch scheduler: host memory and wall time from the rows and
token ids its inputs hold, which the plan knows before any of them exists (:func:`input_reads`,
:func:`analysis_mem_mb`, :func:`analysis_runtime_minutes`). Snakemake's analysis rules call these
as resource functions (``workflow/rules/common.smk``).

Split from :mod:`sdbench.scheduling`, whose constants (bytes per row and token, throughput,
:data:`~sdbench.scheduling.SAFETY`) these use; the functions moved unchanged.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, replace
from typing import Any, Iterable

from sdbench.expectedlengths import DEFAULT_PROMPT_TOKENS, output_tokens, prompt_tokens
from sdbench.grid import Cell
from sdbench.scheduling import (
    ANALYSIS_BASE_MB,
    ANALYSIS_BASE_S,
    ANALYSIS_ROWS_PER_S,
    ANALYSIS_TOKENS_PER_S,
    ARROW_TOKEN_BYTES,
    CONCAT_COPIES,
    MAX_MINUTES,
    MIN_MINUTES,
    PY_TOKEN_BYTES,
    ROW_BYTES,
    SAFETY,
    SD_TOKENS_PER_STEP,
    TRACE_ROW_BYTES,
    _cell_run,
    _mem_mb,
    _num_prompts,
    _partition_number,
    cell_estimate,
    request_rows,
    stored_output_tokens,
)

# ----------------------------------------------------------------------------- analysis jobs
@dataclass(frozen=True)
class Reads:
    """What an analysis job reads from its inputs: table rows and token ids, and the bytes each
    takes in memory (rows x :data:`ROW_BYTES` or :data:`TRACE_ROW_BYTES`; token ids x
    :data:`ARROW_TOKEN_BYTES` or, parsed from JSON, x :data:`PY_TOKEN_BYTES`)."""

    rows: int = 0
    tokens: int = 0
    row_bytes: int = 0
    token_bytes: int = 0

    @property
    def nbytes(self) -> int:
        return self.row_bytes + self.token_bytes

    def __add__(self, other: Reads) -> Reads:
        return Reads(self.rows + other.rows, self.tokens + other.tokens, self.row_bytes + other.row_bytes,
                     self.token_bytes + other.token_bytes)  # fmt: skip


def _reads(rows: float, tokens: float = 0, token_bytes: int = ARROW_TOKEN_BYTES, row_bytes: int = ROW_BYTES) -> Reads:
    rows, tokens = int(math.ceil(rows)), int(math.ceil(tokens))
    return Reads(rows, tokens, rows * row_bytes, tokens * token_bytes)


def _trace_rows(rows: float) -> Reads:
    return _reads(rows, row_bytes=TRACE_ROW_BYTES)


def _regex(template: str) -> re.Pattern[str]:
    """A path template of :mod:`sdbench.workflow.paths` as a regex of its wildcards."""
    parts = re.split(r"\{(\w+)\}", template)
    body = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+?)" for i, p in enumerate(parts))
    return re.compile(body + "$")


@functools.lru_cache(maxsize=1)
def _input_patterns() -> tuple[tuple[str, re.Pattern[str]], ...]:
    from sdbench.workflow import paths as P

    named = {
        "cell": P.CELL_TABLE, "breakdown": P.BREAKDOWN_DIR + "/{name}.parquet", "engine_trace": P.ENGINE_TRACE,
        "engine_requests": P.ENGINE_REQUESTS, "offline": P.TRACE_DIR + "/offline_{tracer}.parquet",
        "published_jsonl": P.PUBLISHED_JSONL, "published_trace": P.PUBLISHED_TRACE, "prompts": P.PROMPTS,
        "stacked": P.SIM_STACKED, "server": P.SERVER_GROUP_DIR, "cells": P.CELLS_TABLE,
        "grid_cells": P.GRID_CELLS_TABLE, "buckets": P.BLEU_BUCKETS,
    }  # fmt: skip
    return tuple((name, _regex(t)) for name, t in named.items())


# The published traces (sdbench fetch published-traces): requests, mean prompt and output tokens.
# gsm8k and instructcoder counted in the published files; sharegpt and cnn
# are held out here: config/paper.yaml's request counts and allowances, outputs at the 8K cap.
PUBLISHED_TRACES = {"gsm8k": (300, 95, 167), "instructcoder": (500, 172, 262), "sharegpt": (500, 1024, 8192),
                    "cnn": (500, 1100, 8192)}  # fmt: skip


def _dataset_shape(config: dict[str, Any], dataset: str) -> tuple[int, int, int]:
    """(requests, prompt tokens, output tokens) a dataset's tables have per cell or trace."""
    return (_num_prompts(config, dataset, config.get("run", {})), prompt_tokens(config, dataset),
            output_tokens(config, dataset))  # fmt: skip


def _cell_of(config: dict[str, Any], w: dict[str, str]) -> Cell | None:
    try:
        cell = Cell(w["engine"], w["model"], w["dataset"], w["method"], int(w["batch_size"]))
    except (KeyError, ValueError):
        return None
    return cell if cell.dataset in config["datasets"] and cell.method in config["methods"] else None


def input_reads(config: dict[str, Any], path: str, num_cells: int = 0) -> Reads:
    """What an analysis job reads from ``path`` (an input of the plan), from the config alone:

    - a cell's ``requests``: :func:`request_rows` rows and the output ids it stores
      (:func:`stored_output_tokens`);
      ``calls`` / ``baseline_calls``: one row per call and trial (the trial bound); ``summary``: one;
      a breakdown cell's ``steps``: one row per engine step of every trial;
    - an in-engine trace / offline trace: one row per request and output position; a trace
      group's requests: one row per request with its prompt and output token ids;
    - a published JSONL (parsed into Python ints): prompt, output and two acceptance arrays per request
      (:data:`PUBLISHED_TRACES`); its trace table: a row per position of both methods;
    - a prompt table: one row per prompt with its token ids; a stacked simulator trace: four traces
      of the dataset; a server group: one row per served request;
    - ``cells.parquet`` / ``grid_cells.parquet``: ``num_cells`` rows;
    - anything else (figures' small tables, cost models, simulator results): nothing counted.
    """
    for name, pattern in _input_patterns():
        m = pattern.match(str(path))
        if m is None:
            continue
        w = m.groupdict()
        if name in ("cells", "grid_cells"):
            return _reads(num_cells)
        if name == "server":
            return _server_reads(config)
        if name in ("published_jsonl", "published_trace"):
            n, p, o = PUBLISHED_TRACES.get(w["published"], (500, DEFAULT_PROMPT_TOKENS, 8192))
            if name == "published_jsonl":  # parsed into Python ints
                return _reads(n, n * (p + 3 * o), PY_TOKEN_BYTES)
            return _trace_rows(2 * n * (o + 1))
        if w.get("dataset") not in config["datasets"]:
            return Reads()
        n, p, o = _dataset_shape(config, w["dataset"])
        if name in ("engine_trace", "offline"):
            return _trace_rows(n * (o + 1))
        if name == "stacked":
            return _trace_rows(4 * n * (o + 1))
        if name == "engine_requests":
            return _reads(n, n * (p + o))
        if name == "prompts":
            return _reads(n, n * p)
        if name == "buckets":
            return _reads(n)
        cell = _cell_of(config, w)
        if cell is None:
            return Reads()
        table = w.get("name")
        if table == "requests":
            return _reads(request_rows(config, cell), stored_output_tokens(config, cell))
        if table in ("calls", "baseline_calls", "steps"):
            run = _cell_run(config, cell)
            if name == "breakdown":
                from sdbench.grid import resolve_breakdown_cell

                run = resolve_breakdown_cell(config, cell)["run"]
            est = cell_estimate(config, cell, run)
            calls = n if run.get("batch_mode", "replicate") == "replicate" else 1
            per_call = math.ceil(o / SD_TOKENS_PER_STEP) if table == "steps" else 1
            return _reads(calls * per_call * est.trials)
        return _reads(1)
    return Reads()


def _server_reads(config: dict[str, Any]) -> Reads:
    """A server group's tables: one row per served request of every dataset and level."""
    section = config["server"]
    per_level = int(section.get("warmup_requests", 2)) + int(section.get("rounds", 2)) * int(
        section.get("requests_per_level", 16)
    )
    return _reads(per_level * len(section["concurrency"]) * len(section["datasets"]))


def total_reads(config: dict[str, Any], paths: Iterable[str], num_cells: int = 0, streamed: bool = False) -> Reads:
    """:func:`input_reads` of every path, added up: what a job holds that reads every input into
    memory. ``streamed``: a job that reads its inputs one at a time and keeps their rows but not
    their token ids holds every row and the largest input's token ids."""
    reads = [input_reads(config, p, num_cells) for p in paths]
    total = sum(reads, Reads())
    if streamed and reads:
        return replace(total, token_bytes=max(r.token_bytes for r in reads))
    return total


def parsed(reads: Reads) -> Reads:
    """``reads`` held as Python ints (:data:`PY_TOKEN_BYTES` a token id): a job that lists them."""
    return replace(reads, token_bytes=reads.tokens * PY_TOKEN_BYTES)


def _analysis_cap(config: dict[str, Any]) -> int:
    """The longest runtime any partition of the site allows (an analysis job may go to any of them;
    the shortest limit), else :data:`MAX_MINUTES`."""
    site = config.get("site") or {}
    limits = [_partition_number(entry or {}, "max_runtime") for entry in (site.get("partitions") or {}).values()]
    return min([MAX_MINUTES, *(x for x in limits if x is not None)])


def analysis_mem_mb(reads: Reads) -> int:
    """Host memory (MB) of an analysis job reading ``reads``: :data:`ANALYSIS_BASE_MB` and
    :data:`CONCAT_COPIES` copies of what it reads."""
    return _mem_mb(CONCAT_COPIES * reads.nbytes, ANALYSIS_BASE_MB)


# A job that streams its inputs file by file (sdbench aggregate): per cell it keeps its keys and
# lengths (50 KB, an allowance over the 0.15 GiB + 50 KB per cell measured on the paper grid's
# 786 cells: docs/results/2026-11-27-aggregate-memory.md), and at most this many copies of one file.
STREAMED_CELL_BYTES = 50_000
STREAMED_FILE_COPIES = 5


def streamed_mem_mb(config: dict[str, Any], paths: Iterable[str], num_cells: int) -> int:
    """Host memory (MB) of a job that reads its inputs one at a time (``aggregate``): what it keeps
    per cell (:data:`STREAMED_CELL_BYTES`) and :data:`STREAMED_FILE_COPIES` copies of its largest input."""
    largest = max((input_reads(config, p, num_cells).nbytes for p in paths), default=0)
    return _mem_mb(num_cells * STREAMED_CELL_BYTES + STREAMED_FILE_COPIES * largest, ANALYSIS_BASE_MB)


def analysis_runtime_minutes(config: dict[str, Any], reads: Reads, attempt: int = 1, passes: int = 1) -> int:
    """Wall time (minutes) of an analysis job reading ``reads``, ``passes`` times over (a simulation:
    one pass per policy and batch size): :data:`ANALYSIS_BASE_S` plus its rows and token ids at
    :data:`ANALYSIS_ROWS_PER_S` / :data:`ANALYSIS_TOKENS_PER_S`, :data:`SAFETY` times, at least
    :data:`MIN_MINUTES`, times the attempt, within the shortest partition limit of the site."""
    seconds = ANALYSIS_BASE_S + passes * (reads.rows / ANALYSIS_ROWS_PER_S + reads.tokens / ANALYSIS_TOKENS_PER_S)
    first = max(MIN_MINUTES, math.ceil(SAFETY * seconds / 60))
    return int(min(_analysis_cap(config), first * max(1, attempt)))
