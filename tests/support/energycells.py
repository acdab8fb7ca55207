"""Cells measured on the LLM double with an energy meter double, with costs known by hand.

Two prompts (ids ``[0]`` and ``[1]``) of 10 and 20 output tokens per sequence, batch sizes 1 and 2
(replicate mode: a call holds ``batch`` copies of one prompt), an SD method timed in pairs with its
no-SD arm and a no-SD cell of its own. Per call (seconds, joules of prompt 0, joules of prompt 1):

=========  ==========  =====================  =========================
arm        batch size  per call               joules / token (p0, p1)
=========  ==========  =====================  =========================
SD         1           0.5 s, 6 J / 12 J      0.6, 0.6  -> 0.6
no SD      1           1.0 s, 4 J / 12 J      0.4, 0.6  -> 0.5
SD         2           0.5 s, 4 J / 8 J       0.2, 0.2  -> 0.2
no SD      2           1.0 s, 8 J / 16 J      0.4, 0.4  -> 0.4
=========  ==========  =====================  =========================

So SD's speedup is 2 at both batch sizes (tokens/s 30 vs 15, and 60 vs 30), its energy ratio 1.2
at batch size 1 (it pays in time, not in energy) and 0.5 at batch size 2. Every trial repeats the
same costs, so each interval is its point.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from tests.support.doubles.llm import Bench, LLMDouble, engine
from tests.support.doubles.nvml import NVMLDouble

TOKENS = {0: 10, 1: 20}
COSTS = {("sd", 1): (0.5, 6.0, 12.0), ("none", 1): (1.0, 4.0, 12.0),
         ("sd", 2): (0.5, 4.0, 8.0), ("none", 2): (1.0, 8.0, 16.0)}  # fmt: skip
SD_METHOD = "ngram-k3"
PROMPTS = pd.DataFrame({"request_id": ["p0", "p1"], "prompt_token_ids": [[0], [1]]})


def spec(method: str, batch_size: int, device: str, paired: bool) -> dict[str, Any]:
    """A cell spec as sdbench.grid.resolve_cell writes it (the keys the timed part reads)."""
    sd = method != "none"
    out: dict[str, Any] = {
        "seed": 7,
        "cell": {"engine": "e", "model": "m", "dataset": "d", "method": method, "batch_size": batch_size},
        "engine": {"device": device, "vllm_version": "0.32.0"},
        "model": {"tensor_parallel_size": 2},
        "method": {"method": "ngram", "num_speculative_tokens": 3} if sd else {"method": "none"},
        "dataset": {"max_tokens": 32},
        "run": {"repeats": 3, "warmup_requests": 1, "batch_mode": "replicate"},
        "drafter": None,
    }
    if paired:
        out["paired_baseline"] = {"key": "none", "method": {"method": "none"}}
    return out


def llm(bench: Bench, arm: str, batch_size: int) -> LLMDouble:
    seconds, *joules = COSTS[(arm, batch_size)]
    return LLMDouble(bench, TOKENS.__getitem__, lambda p, b: seconds, lambda p, b: joules[p])


def measure(meter: Callable[[Bench], Any], device: str = "cuda", paired: bool = True) -> list[dict[str, pd.DataFrame]]:
    """The tables (``calls``, ``summary``, and ``baseline_calls`` when paired) of the no-SD cells and
    the SD cells at batch sizes 1 and 2; ``meter(bench)`` makes an engine's meter over the bench its
    cell's engines share (None: no meter). Unpaired, the SD cell runs alone on its own engine."""
    from sdbench.engine.measure.paired import measure_paired
    from sdbench.engine.measure.trials import measure_cell

    cells = []
    for bs in (1, 2):
        bench = Bench()
        _, calls, summary, _ = measure_cell(engine(llm(bench, "none", bs), meter(bench)),
                                            spec("none", bs, device, False), PROMPTS, guard_mode="disabled")  # fmt: skip
        cells.append({"calls": calls, "summary": summary})
        bench = Bench()
        sd = engine(llm(bench, "sd", bs), meter(bench))
        if paired:
            arm = engine(llm(bench, "none", bs), meter(bench))
            cells.append(measure_paired(sd, arm, spec(SD_METHOD, bs, device, True), PROMPTS, "disabled"))
        else:
            _, calls, summary, _ = measure_cell(sd, spec(SD_METHOD, bs, device, False), PROMPTS, guard_mode="disabled")
            cells.append({"calls": calls, "summary": summary})
    return cells


def joined(cells: list[dict[str, pd.DataFrame]]) -> pd.DataFrame:
    """The cells joined as ``sdbench aggregate`` joins them (speedups, energy ratios), each as if
    measured in two engine starts (the bench repeats exactly: two identical starts), so that every
    speedup has its interval over starts, of zero width."""
    from sdbench.analysis.endtoend import join_cells

    def twice(t: pd.DataFrame) -> pd.DataFrame:
        return pd.concat([t.assign(engine_start=0), t.assign(engine_start=1)], ignore_index=True) if len(t) else t

    calls = [(twice(c["calls"]), twice(c.get("baseline_calls", pd.DataFrame()))) for c in cells]
    return join_cells([c["summary"].assign(num_engine_starts=2) for c in cells], "none", calls)


def nvml_meter(bench: Bench) -> Any:
    """An NVML meter (the NVML double) over GPUs 0 and 1, the engine's (tensor-parallel 2): GPU 0
    spends three quarters of the bench's energy, GPU 1 a quarter; GPU 2 is another job's and must not count."""
    from sdbench.engine.measure.energy import meter_for

    def counter(i: int) -> float:
        return (5_000_000 + 750 * bench.joules, 250 * bench.joules, 10**9 + 10**6 * bench.t)[i]

    nvml = NVMLDouble([("GPU-a", [], 1e3), ("GPU-b", [], 1e3), ("GPU-c", [], 1e3)], energy_mj=counter)
    return meter_for({"device": "cuda"}, 2, nvml=nvml, env={"CUDA_VISIBLE_DEVICES": "0,1"})
