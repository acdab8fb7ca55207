"""``sdbench bench aggregate-inputs``: synthetic per-cell ``summary`` and ``requests`` tables of a
config's grid at their real row counts, to measure ``sdbench aggregate`` at paper size.

Each cell gets ``num_prompts x batch_size`` request rows in replicate mode (one call per prompt,
the prompt replicated batch-size times). Lengths and outputs are a stated stand-in, seeded:

- prompt and output lengths per request: gamma-distributed (coefficient of variation 0.5) around
  a per-dataset mean, :data:`PROMPT_MEANS` / :data:`OUTPUT_MEANS` (the published Llama-3.1-8B traces'
  means where they exist: gsm8k 94 / 166 and instructcoder 171 / 262 tokens; SPEED-Bench's nominal
  input lengths; otherwise the config's ``expected_output_tokens`` or a stated allowance), capped at
  the dataset's ``max_tokens``;
- outputs: per engine x model x dataset a reference output per request; each call's slot 0 equals it
  except in a share :data:`DIVERGED_CALLS` of calls (SD cells, or no-SD cells above the smallest
  batch size), where it continues with other tokens from a random position; each other slot
  equals slot 0 except in a share :data:`DIVERGED_SLOTS`; a sampled dataset (``temperature`` > 0)
  draws every sequence on its own. Token ids are uniform below 128,000; text is 4 characters per token.

``--full-rows`` writes every row with its prompt's token ids and its own output ids and text as
int64 lists (the table as written before sdbench.requesttable); otherwise the table is written as
the engine writes it now (no prompt ids, a call's equal outputs stored once, int32). The same
seed gives the same content both ways, so the two aggregates' tables can be compared.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sdbench.config import load_config
from sdbench.workflow.plan import Plan

# Mean prompt / output tokens per dataset (the base dataset of a temperature variant).
PROMPT_MEANS = {"gsm8k": 94, "instructcoder": 171, "sharegpt": 300, "sharegpt-random": 300, "cnn": 800,
                "aime": 150, "gpqa": 250, "speed-bench-qualitative": 600, "speed-bench-throughput-1k": 1024,
                "speed-bench-throughput-8k": 8192, "speed-bench-throughput-32k": 32768}  # fmt: skip
OUTPUT_MEANS = {"gsm8k": 166, "instructcoder": 262, "aime": 8192, "gpqa": 8192}
DEFAULT_PROMPT_MEAN = 300
DEFAULT_OUTPUT_MEAN = 512  # the paper config's allowance for chat outputs
FIXED_PROMPTS = ("speed-bench-throughput-",)  # the nominal length, not drawn
DIVERGED_CALLS = 0.1
DIVERGED_SLOTS = 0.02
VOCAB = 128_000
CHARS_PER_TOKEN = 4
BOOTSTRAP_DRAWS = 2000  # sdbench.analysis.stats.NUM_RESAMPLES
# Rows written per row group: bounds the generator's memory on long prompts.
MAX_TOKENS_PER_CHUNK = 20_000_000


def _digest(*parts: str) -> int:
    """A seed from names: a cell's content does not depend on which other cells are written."""
    import zlib

    return zlib.crc32("/".join(parts).encode())


def _lengths(rng: np.random.Generator, mean: float, n: int, cap: int) -> np.ndarray:
    return np.clip(np.rint(mean * rng.gamma(4.0, 0.25, n)), 1, cap).astype(np.int64)


def _tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, VOCAB, n, dtype=np.int32)


def _diverge(rng: np.random.Generator, ref: np.ndarray, mean: float, cap: int) -> np.ndarray:
    """``ref`` up to a random position, then other tokens (another length)."""
    cut = int(rng.integers(0, len(ref)))
    rest = max(1, int(_lengths(rng, mean, 1, cap)[0]) - cut)
    return np.concatenate([ref[:cut], _tokens(rng, min(rest, cap - cut) if cap > cut else 1)])


class Workload:
    """Prompts and reference outputs of one engine x model x dataset."""

    def __init__(self, dataset: str, entry: dict[str, Any], seed: list[int]) -> None:
        base = entry.get("sweep_of", dataset)
        self.rng = np.random.default_rng(seed)
        self.n = int(entry["num_prompts"])
        self.cap = int(entry["max_tokens"])
        self.temperature = float(entry.get("temperature", 0.0))
        prompt_mean = PROMPT_MEANS.get(base, DEFAULT_PROMPT_MEAN)
        self.output_mean = float(OUTPUT_MEANS.get(base, entry.get("expected_output_tokens", DEFAULT_OUTPUT_MEAN)))
        if base.startswith(FIXED_PROMPTS):
            plens = np.full(self.n, prompt_mean, dtype=np.int64)
        else:
            plens = _lengths(self.rng, prompt_mean, self.n, 10 * prompt_mean)
        self.prompts = [_tokens(self.rng, int(k)) for k in plens]
        self.references = [_tokens(self.rng, int(k)) for k in _lengths(self.rng, self.output_mean, self.n, self.cap)]

    def call(self, rng: np.random.Generator, i: int, batch_size: int, diverge: bool) -> list[np.ndarray]:
        """The outputs of the call of prompt ``i``, slot by slot (slots equal to slot 0 are the same object)."""
        if self.temperature > 0:
            return [_tokens(rng, int(k)) for k in _lengths(rng, self.output_mean, batch_size, self.cap)]
        first = self.references[i]
        if diverge and rng.random() < DIVERGED_CALLS:
            first = _diverge(rng, first, self.output_mean, self.cap)
        out = [first]
        for _ in range(1, batch_size):
            out.append(_diverge(rng, first, self.output_mean, self.cap) if rng.random() < DIVERGED_SLOTS else first)
        return out


def _list_array(arrays: list[np.ndarray | None], dtype: pa.DataType) -> pa.Array:
    lengths = np.array([0 if a is None else len(a) for a in arrays], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32 if lengths.sum() < 2**31 else np.int64)
    present = [a for a in arrays if a is not None]
    values = np.concatenate(present).astype(dtype.to_pandas_dtype()) if present else np.empty(0, dtype.to_pandas_dtype())
    mask = pa.array([a is None for a in arrays])
    kind = pa.ListArray if offsets.dtype == np.int32 else pa.LargeListArray
    return kind.from_arrays(pa.array(offsets), pa.array(values, type=dtype), mask=mask)


_TEXT = "".join(chr(0x61 + i % 26) for i in range(1 << 16))


def _text(n_tokens: int) -> str:
    k = n_tokens * CHARS_PER_TOKEN
    return (_TEXT * (k // len(_TEXT) + 1))[:k]


def _request_chunk(keys: dict[str, Any], w: Workload, calls: list[tuple[int, list[np.ndarray]]],
                   full_rows: bool) -> pa.Table:  # fmt: skip
    """Request rows of ``calls`` ((prompt index, per-slot outputs)) in either layout."""
    cols: dict[str, list[Any]] = {c: [] for c in ("call_index", "slot", "request_id", "output_slot", "output",
                                                  "num_prompt_tokens", "num_output_tokens")}  # fmt: skip
    for i, outputs in calls:
        first: dict[int, int] = {}  # id of an output -> the first slot that has it
        for slot, out in enumerate(outputs):
            output_slot = first.setdefault(id(out), slot)
            cols["call_index"].append(i)
            cols["slot"].append(slot)
            cols["request_id"].append(str(i))
            cols["output_slot"].append(output_slot)
            cols["output"].append(out if full_rows or output_slot == slot else None)
            cols["num_prompt_tokens"].append(len(w.prompts[i]))
            cols["num_output_tokens"].append(len(out))
    n = len(cols["slot"])
    table = {k: pa.array([v] * n) for k, v in keys.items()}
    table.update(call_index=pa.array(cols["call_index"], pa.int64()), slot=pa.array(cols["slot"], pa.int64()),
                 request_id=pa.array(cols["request_id"]))  # fmt: skip
    ids_type = pa.int64() if full_rows else pa.int32()
    if full_rows:
        table["prompt_token_ids"] = _list_array([w.prompts[int(r)] for r in cols["request_id"]], pa.int64())
    else:
        table["output_slot"] = pa.array(cols["output_slot"], pa.int64())
    table["output_token_ids"] = _list_array(cols["output"], ids_type)
    table["output_text"] = pa.array([None if o is None else _text(len(o)) for o in cols["output"]], pa.string())
    table["num_prompt_tokens"] = pa.array(cols["num_prompt_tokens"], pa.int64())
    table["num_output_tokens"] = pa.array(cols["num_output_tokens"], pa.int64())
    table["finish_reason"] = pa.array(["stop"] * n)
    for c in ("sd_num_steps", "sd_num_draft_tokens", "sd_num_accepted_tokens", "sd_mean_acceptance_length"):
        table[c] = pa.nulls(n)
    return pa.table(table)


def _summary(keys: dict[str, Any], w: Workload, lengths: list[int], rng: np.random.Generator) -> pa.Table:
    tps = float(100.0 * keys["batch_size"] ** 0.7 * rng.uniform(0.8, 1.2))
    draws = (tps * rng.normal(1.0, 0.02, BOOTSTRAP_DRAWS)).tolist()
    row = {**keys, "sd_method": keys["method"], "temperature": w.temperature, "batch_mode": "replicate",
           "num_sequences": len(lengths), "tokens_per_s": tps, "tokens_per_s_ci_low": float(np.percentile(draws, 2.5)),
           "tokens_per_s_ci_high": float(np.percentile(draws, 97.5)), "tokens_per_s_boot": draws,
           "tokens_per_s_pooled": tps, "output_len_mean": float(np.mean(lengths)),
           "output_len_std": float(np.std(lengths)), "contaminated": False, "engine_layout": "inprocess",
           "num_preemptions": 0, "paired_baseline_num_preemptions": 0}  # fmt: skip
    return pa.Table.from_pylist([row])


def write_inputs(config: dict[str, Any], out: Path, full_rows: bool, seed: int,
                 select: dict[str, list[str]]) -> dict[str, Any]:  # fmt: skip
    """Write the selected cells' ``summary.parquet`` and ``requests.parquet`` under ``out`` (laid out
    as results/runs/) and the lists ``summaries.txt`` / ``requests.txt``; returns counts."""
    plan = Plan(config)
    cells = [c for c in plan.cells if all(not v or str(getattr(c, k)) in v for k, v in select.items())]
    if not cells:
        raise ValueError(f"aggregate-inputs: no cell of the config matches {select}")
    smallest: dict[tuple[str, str, str], int] = {}
    for c in cells:
        if c.method == plan.baseline:
            key = (c.engine, c.model, c.dataset)
            smallest[key] = min(smallest.get(key, c.batch_size), c.batch_size)
    workloads: dict[tuple[str, str, str], Workload] = {}
    totals = {"cells": 0, "rows": 0, "output_tokens_stored": 0, "prompt_tokens_in_rows": 0}
    summaries, requests = [], []
    for c in sorted(cells):
        key = (c.engine, c.model, c.dataset)
        if key not in workloads:  # cells come sorted: one workload in memory at a time
            workloads = {key: Workload(c.dataset, config["datasets"][c.dataset], [seed, _digest(*key)])}
        w = workloads[key]
        rng = np.random.default_rng([seed, _digest(*key, c.method, str(c.batch_size))])
        keys = {"engine": c.engine, "model": c.model, "dataset": c.dataset, "method": c.method, "batch_size": c.batch_size}
        diverge = not (c.method == plan.baseline and c.batch_size == smallest.get(key))
        cell_dir = out / c.engine / c.model / c.dataset / c.method / f"bs{c.batch_size}"
        cell_dir.mkdir(parents=True, exist_ok=True)
        lengths: list[int] = []
        writer = None
        chunk: list[tuple[int, list[np.ndarray]]] = []
        held = 0
        try:
            for i in range(w.n):
                outputs = w.call(rng, i, c.batch_size, diverge)
                chunk.append((i, outputs))
                lengths += [len(o) for o in outputs]
                held += sum(len(o) for o in outputs) + (len(w.prompts[i]) * c.batch_size if full_rows else 0)
                distinct = outputs if full_rows else list({id(o): o for o in outputs}.values())
                totals["output_tokens_stored"] += sum(len(o) for o in distinct)
                totals["prompt_tokens_in_rows"] += len(w.prompts[i]) * c.batch_size if full_rows else 0
                if held >= MAX_TOKENS_PER_CHUNK or i == w.n - 1:
                    table = _request_chunk(keys, w, chunk, full_rows)
                    if writer is None:
                        writer = pq.ParquetWriter(cell_dir / "requests.parquet", table.schema, compression="zstd")
                    writer.write_table(table)
                    chunk, held = [], 0
        finally:
            if writer is not None:
                writer.close()
        pq.write_table(_summary(keys, w, lengths, rng), cell_dir / "summary.parquet", compression="zstd")
        summaries.append(str(cell_dir / "summary.parquet"))
        requests.append(str(cell_dir / "requests.parquet"))
        totals["cells"] += 1
        totals["rows"] += len(lengths)
    (out / "summaries.txt").write_text("\n".join(summaries) + "\n")
    (out / "requests.txt").write_text("\n".join(requests) + "\n")
    return totals


def _cmd_aggregate_inputs(args: argparse.Namespace) -> int:
    select = {"engine": args.engines, "model": args.models, "dataset": args.datasets, "method": args.methods,
              "batch_size": [str(b) for b in args.batch_sizes or []]}  # fmt: skip
    totals = write_inputs(load_config(args.config), Path(args.output_dir), args.full_rows, args.seed, select)
    print(json.dumps({"output_dir": args.output_dir, "full_rows": args.full_rows, **totals}))
    return 0
