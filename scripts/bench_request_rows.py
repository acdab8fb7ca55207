"""Memory of one cell's request rows: CellRun's timed calls on a stand-in engine, Python heap peak.

    PYTHONPATH=src .venv/bin/python scripts/bench_request_rows.py --prompt-len 32768 --batch-size 64 --calls 8

Times ``--calls`` calls of a replicate-mode cell (one prompt of ``--prompt-len`` tokens replicated
``--batch-size`` times per call, every replica generating the same ``--output-len`` tokens, as greedy
replicas do) through ``sdbench.engine.measure.trials.CellRun`` and its ``tables()``, on a stand-in engine
(no vLLM: a ``generate`` that returns the outputs at once), and prints the peak of Python allocations
(``tracemalloc``) above what the prompt table holds, per call and in all. Any sdbench version whose
``Engine`` takes a clock and a prompt builder runs it, so two versions can be compared by
``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
import tracemalloc
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd


class StandInLLM:
    """Returns ``output_len`` tokens per sequence, the same for every replica of a call."""

    def __init__(self, output_len: int) -> None:
        self.output_len = output_len

    def generate(self, prompts: list[Any], sampling: Any, use_tqdm: bool = False) -> list[Any]:
        out = list(range(1000, 1000 + self.output_len))
        text = "x" * (4 * self.output_len)
        done = SimpleNamespace(token_ids=out, text=text, finish_reason="length")
        return [SimpleNamespace(outputs=[done]) for _ in prompts]

    def get_metrics(self) -> list[Any]:
        return []


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompt-len", type=int, default=32768)
    p.add_argument("--output-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--calls", type=int, default=8)
    args = p.parse_args()

    from sdbench.engine.measure.engine import Engine
    from sdbench.engine.measure.trials import CellRun

    rng = np.random.default_rng(0)
    prompts = pd.DataFrame({
        "request_id": [str(i) for i in range(args.calls)],
        "prompt_token_ids": [rng.integers(1000, 128000, args.prompt_len, dtype=np.int32) for _ in range(args.calls)],
    })
    ticks = itertools.count()
    engine = Engine(StandInLLM(args.output_len), {}, 0.0, clock=lambda: float(next(ticks)))
    engine.prompt = lambda ids: ids  # the stand-in reads no prompt: keep the engine's own copy out
    spec = {"seed": 0, "cell": {"engine": "e", "model": "m", "dataset": "d", "method": "none",
                                "batch_size": args.batch_size},
            "method": {"method": "none"}, "run": {"batch_mode": "replicate"},
            "dataset": {"max_tokens": args.output_len}}
    run = CellRun(engine, spec, prompts)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    for call in range(run.num_calls):
        run.time_call(0, call)
    held = tracemalloc.get_traced_memory()[0] - base
    requests, *_ = run.tables(SimpleNamespace(contaminated=False, columns=lambda: {}))
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    print(json.dumps({
        "prompt_len": args.prompt_len, "output_len": args.output_len, "batch_size": args.batch_size,
        "calls": args.calls, "rows": len(requests), "columns": list(requests.columns),
        "held_after_calls_mib": round(held / 2**20, 1), "peak_with_tables_mib": round(peak / 2**20, 1),
        "per_call_mib": round(held / args.calls / 2**20, 2), "seconds": round(time.perf_counter() - t0, 2),
    }))


if __name__ == "__main__":
    main()
