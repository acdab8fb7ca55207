"""``sdbench bench tracer``: the fast n-gram tracer (:func:`sdbench.traces.ngram.trace_ngram`)
against its quadratic reference (:func:`~sdbench.traces.ngram.trace_ngram_reference`).

Both trace every request in this process; the reference runs on a seeded random subset until
its time budget is spent and is extrapolated per output position. The fast tracer is also timed
as the pipeline runs it, one ``sdbench trace ngram`` process per file (start-up included).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sdbench.bench.processes import run_sdbench
from sdbench.traces.ngram import trace_ngram, trace_ngram_reference
from sdbench.traces.table import TokenRequest, read_token_requests


def _time_tracer(tracer, requests: Sequence[TokenRequest]) -> tuple[float, list]:
    start = time.perf_counter()
    out = [tracer(r.prompt_token_ids, r.output_token_ids) for r in requests]
    return time.perf_counter() - start, out


def _cmd_bench_tracer(args: argparse.Namespace) -> int:
    requests = [r for path in args.traces for r in read_token_requests(path)]
    positions = sum(len(r.output_token_ids) for r in requests)
    fast_s, fast = _time_tracer(trace_ngram, requests)
    print(f"fast tracer: {len(requests)} requests, {positions} positions, {fast_s:.2f} s")

    # Reference on a seeded random subset, request by request, until the budget is spent.
    order = list(range(len(requests)))
    random.Random(args.seed).shuffle(order)
    ref_s, subset = 0.0, []
    for i in order:  # at least one request, then until the budget is spent
        seconds, (ref,) = _time_tracer(trace_ngram_reference, [requests[i]])
        ref_s += seconds
        subset.append(i)
        f = fast[i]
        if not (
            np.array_equal(ref.acc_len, f.acc_len)
            and np.array_equal(ref.proposed_len, f.proposed_len)
            and np.array_equal(ref.censored, f.censored)
        ):
            raise RuntimeError(f"fast and reference tracers disagree on request {requests[i].request_id}")
        if ref_s >= args.reference_budget:
            break
    sub_reqs = [requests[i] for i in subset]
    sub_positions = sum(len(r.output_token_ids) for r in sub_reqs)
    if len(subset) == len(requests):
        est, how = ref_s, "measured on all requests"
    else:
        # Per position: the scan stops at the leftmost match, so its cost tracks positions far
        # better than context length (checked against a full run: 23 s predicted, 26 s measured).
        est = ref_s * positions / max(sub_positions, 1)
        how = f"extrapolated per position from {len(subset)} requests / {sub_positions} positions ({ref_s:.1f} s)"
    print(f"reference tracer: {est:.1f} s ({how}); identical output on the {len(subset)} requests run")
    print(f"speed-up fast vs reference: {est / max(fast_s, 1e-9):.0f}x")
    # Whole processes: `sdbench trace ngram` per file (what the pipeline runs), start-up, reading
    # and writing included. A reference process would do the same around its own tracing.
    with tempfile.TemporaryDirectory(prefix="sdbench-bench-tracer-") as tmp:
        whole_s = sum(
            run_sdbench(["trace", "ngram", "--input", path, "--output", Path(tmp) / f"{i}.parquet"])
            for i, path in enumerate(args.traces)
        )
    around_s = max(whole_s - fast_s, 0.0)
    print(
        f"fast tracer as whole processes (`sdbench trace ngram` per file, start-up and I/O included): {whole_s:.2f} s"
    )
    print(
        f"speed-up fast vs reference as whole processes: {(est + around_s) / max(whole_s, 1e-9):.0f}x "
        f"(a reference process: the same {around_s:.2f} s of start-up and I/O around its tracing)"
    )
    return 0
