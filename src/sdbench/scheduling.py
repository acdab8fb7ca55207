"""What an engine job asks of a batch scheduler: GPUs, host memory and wall time.

Snakemake rules call these as resource functions; the SLURM executor plugin turns
``gpu`` into ``--gpus``, ``mem_mb`` into ``--mem`` and ``runtime`` (minutes) into
``-t``. CPUs are a site setting (``cpus_per_gpu`` / ``set-threads`` in the profile).

The wall-time estimate is deliberately generous (a job killed at its limit loses
all of its work; one that asked for too much only waits longer in the queue) and
grows with each retry.
"""

from __future__ import annotations

import math
from typing import Any

from sdbench.grid import Cell

# Engine start-up (model load, torch.compile, CUDA graph capture) in minutes, and
# seconds per engine step of decoding, by device. A GPU step of an 8B-70B model at
# batch size 1 takes ~10-40 ms on an H100; larger batches cost more per step.
STARTUP_MINUTES = {"cuda": 20.0, "cpu": 3.0}
STEP_SECONDS = {"cuda": 0.05, "cpu": 0.25}
# A step at batch size b costs (1 + b / BATCH_KNEE) times a step at batch size 1.
BATCH_KNEE = 32
SAFETY = 2.0
MIN_MINUTES = 10
MAX_MINUTES = 7 * 24 * 60
HOST_MEM_MB_PER_GPU = 64_000
CPU_ENGINE_MEM_MB = 16_000


def cell_gpus(config: dict[str, Any], cell: Cell) -> int:
    """GPUs of a cell: the target's tensor-parallel size on CUDA engines, 0 on CPU."""
    if config["engines"][cell.engine]["device"] != "cuda":
        return 0
    return int(config["models"][cell.model].get("tensor_parallel_size", 1))


def cell_mem_mb(config: dict[str, Any], cell: Cell) -> int:
    """Host memory of a cell's job: weights pass through host RAM while loading."""
    gpus = cell_gpus(config, cell)
    if gpus:
        return HOST_MEM_MB_PER_GPU * gpus
    kv = config["engines"][cell.engine].get("llm_kwargs", {}).get("kv_cache_memory_bytes", 0)
    return CPU_ENGINE_MEM_MB + math.ceil(kv / 2**20)


def cell_runtime_minutes(config: dict[str, Any], cell: Cell, attempt: int = 1) -> int:
    """Wall-time limit of a cell's job in minutes, scaled by output length and batch size.

    Steps = (warm-up + timed requests) x ``max_tokens`` (replicated batches decode
    one step per output token for the whole batch); each step costs more at larger
    batch sizes. Retry ``attempt`` n gets n times the first limit.
    """
    device = config["engines"][cell.engine]["device"]
    dataset = config["datasets"][cell.dataset]
    run = config.get("run", {})
    requests = int(dataset["num_prompts"]) + int(run.get("warmup_requests", 1))
    if run.get("batch_mode", "replicate") == "distinct":
        requests = math.ceil(requests / cell.batch_size)
    steps = requests * int(dataset["max_tokens"])
    step_s = STEP_SECONDS.get(device, STEP_SECONDS["cuda"]) * (1 + cell.batch_size / BATCH_KNEE)
    minutes = STARTUP_MINUTES.get(device, STARTUP_MINUTES["cuda"]) + steps * step_s / 60
    first = max(MIN_MINUTES, math.ceil(SAFETY * minutes))
    return int(min(MAX_MINUTES, first * max(1, attempt)))


def _one_engine_minutes(config: dict[str, Any], cells: list[Cell]) -> int:
    """The cells' limits added up with a single engine start-up."""
    device = config["engines"][cells[0].engine]["device"]
    startup = math.ceil(SAFETY * STARTUP_MINUTES.get(device, STARTUP_MINUTES["cuda"]))
    return sum(cell_runtime_minutes(config, c) for c in cells) - startup * (len(cells) - 1)


def one_engine_runtime_minutes(config: dict[str, Any], cells: list[Cell], attempt: int = 1) -> int:
    """Wall-time limit of cells run one after the other on one engine, each once, unpaired: a
    trace group (its traces as cells at the trace batch size) or a breakdown group."""
    return int(min(MAX_MINUTES, max(MIN_MINUTES, _one_engine_minutes(config, cells)) * max(1, attempt)))


def group_runtime_minutes(config: dict[str, Any], cells: list[Cell], attempt: int = 1) -> int:
    """Wall-time limit of an engine group: its cells' limits with one engine start-up, per engine
    start, twice that for an SD group timed in pairs with a no-SD engine."""
    total = _one_engine_minutes(config, cells) * int(config.get("run", {}).get("engine_starts", 1))
    if config.get("run", {}).get("paired_baseline") and config["methods"][cells[0].method]["method"] != "none":
        total *= 2  # every call is also timed on the paired no-SD engine (sdbench.engine.paired)
    return int(min(MAX_MINUTES, max(MIN_MINUTES, total) * max(1, attempt)))


def server_runtime_minutes(config: dict[str, Any], cell: Cell, attempt: int = 1) -> int:
    """Wall-time limit of a server group (sdbench.servermode) whose largest cell is ``cell``.

    Per dataset and concurrency level c: (warm-up + rounds x requests) requests of up to
    ``max_tokens`` steps each, c of them decoding together; plus the server's start-up
    (``server.startup_timeout_s`` if longer than the device's usual start).
    """
    device = config["engines"][cell.engine]["device"]
    section = config["server"]
    requests = int(section.get("warmup_requests", 2)) + int(section.get("rounds", 2)) * int(
        section.get("requests_per_level", 16)
    )
    step_s = STEP_SECONDS.get(device, STEP_SECONDS["cuda"])
    seconds = 0.0
    for name in section["datasets"]:
        tokens = int(config["datasets"][name]["max_tokens"])
        for c in section["concurrency"]:
            seconds += max(requests, c) * tokens / c * step_s * (1 + c / BATCH_KNEE)
    startup = max(STARTUP_MINUTES.get(device, STARTUP_MINUTES["cuda"]), float(section.get("startup_timeout_s", 0)) / 60)
    first = max(MIN_MINUTES, math.ceil(SAFETY * (startup + seconds / 60)))
    return int(min(MAX_MINUTES, first * max(1, attempt)))
