"""What an engine job asks of a batch scheduler: GPUs, host memory and wall time.

Snakemake rules call these as resource functions; the SLURM executor plugin turns
``gpu`` into ``--gpus``, ``mem_mb`` into ``--mem`` and ``runtime`` (minutes) into
``-t``. CPUs are a site setting (``cpus_per_gpu`` / ``set-threads`` in the profile).

The wall-time estimate is deliberately generous (a job killed at its limit loses the
cell it was measuring; one that asked for too much only waits longer in the queue) and
grows with each retry. A site's limits (``site`` in the config, which the SLURM profiles pass:
the longest runtime of the engine jobs' partition, its GPUs per node) cap every request, and
:func:`split_to_fit` splits engine groups until each fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

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
# An engine group is split until its estimate is at most this share of the site's limit: a
# job up to 25% slower than its (already doubled) estimate still ends before SLURM kills it.
SITE_MARGIN = 0.8
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


@dataclass(frozen=True)
class SiteLimits:
    """What a site allows an engine job (``site`` in the config; ``None`` fields: no limit)."""

    partition: str
    max_runtime: int | None
    gpus_per_node: int | None

    @property
    def budget(self) -> int | None:
        """The estimate (minutes) an engine job may have: :data:`SITE_MARGIN` of the limit."""
        return None if self.max_runtime is None else int(SITE_MARGIN * self.max_runtime)


def site_limits(config: dict[str, Any]) -> SiteLimits | None:
    """The engine partition's limits of ``config["site"]`` (``None`` without a site block).

    Values may be strings: ``--config site={...}`` parses nested YAML without types.
    """
    from sdbench.config import ConfigError

    site = config.get("site")
    if not site:
        return None
    name = str(site["engine_partition"])
    partitions = site.get("partitions") or {}
    if name not in partitions:
        raise ConfigError(
            f"site.engine_partition: partition {name!r} has no entry in site.partitions "
            f"(defined: {', '.join(sorted(partitions)) or 'none'})"
        )
    entry = partitions[name] or {}

    def number(key: str) -> int | None:
        return int(entry[key]) if entry.get(key) not in (None, "") else None

    return SiteLimits(name, number("max_runtime"), number("gpus_per_node"))


def _capped(config: dict[str, Any], first: int, attempt: int) -> int:
    """A job's request: its first-attempt limit times the attempt, within MAX_MINUTES and the
    site's limit (a retry cannot ask for more than the partition allows)."""
    limits = site_limits(config)
    cap = MAX_MINUTES if limits is None or limits.max_runtime is None else min(MAX_MINUTES, limits.max_runtime)
    return int(min(cap, first * max(1, attempt)))


def _cell_minutes(config: dict[str, Any], cell: Cell) -> int:
    """A cell's first-attempt estimate in minutes, uncapped."""
    device = config["engines"][cell.engine]["device"]
    dataset = config["datasets"][cell.dataset]
    run = config.get("run", {})
    requests = int(dataset["num_prompts"]) + int(run.get("warmup_requests", 1))
    if run.get("batch_mode", "replicate") == "distinct":
        requests = math.ceil(requests / cell.batch_size)
    steps = requests * int(dataset["max_tokens"])
    step_s = STEP_SECONDS.get(device, STEP_SECONDS["cuda"]) * (1 + cell.batch_size / BATCH_KNEE)
    minutes = STARTUP_MINUTES.get(device, STARTUP_MINUTES["cuda"]) + steps * step_s / 60
    return max(MIN_MINUTES, math.ceil(SAFETY * minutes))


def cell_runtime_minutes(config: dict[str, Any], cell: Cell, attempt: int = 1) -> int:
    """Wall-time limit of a cell's job in minutes, scaled by output length and batch size.

    Steps = (warm-up + timed requests) x ``max_tokens`` (replicated batches decode
    one step per output token for the whole batch); each step costs more at larger
    batch sizes. Retry ``attempt`` n gets n times the first limit (within the site's limit).
    """
    return _capped(config, _cell_minutes(config, cell), attempt)


def _one_engine_minutes(config: dict[str, Any], cells: list[Cell]) -> int:
    """The cells' limits added up with a single engine start-up."""
    device = config["engines"][cells[0].engine]["device"]
    startup = math.ceil(SAFETY * STARTUP_MINUTES.get(device, STARTUP_MINUTES["cuda"]))
    return sum(_cell_minutes(config, c) for c in cells) - startup * (len(cells) - 1)


def one_engine_estimate_minutes(config: dict[str, Any], cells: list[Cell]) -> int:
    """First-attempt estimate of cells run one after the other on one engine, uncapped."""
    return max(MIN_MINUTES, _one_engine_minutes(config, cells))


def one_engine_runtime_minutes(config: dict[str, Any], cells: list[Cell], attempt: int = 1) -> int:
    """Wall-time limit of cells run one after the other on one engine, each once, unpaired: a
    trace group (its traces as cells at the trace batch size) or a breakdown group."""
    return _capped(config, one_engine_estimate_minutes(config, cells), attempt)


def group_estimate_minutes(config: dict[str, Any], cells: list[Cell]) -> int:
    """First-attempt estimate of an engine group in minutes, uncapped (see
    :func:`group_runtime_minutes`)."""
    total = _one_engine_minutes(config, cells) * int(config.get("run", {}).get("engine_starts", 1))
    if config.get("run", {}).get("paired_baseline") and config["methods"][cells[0].method]["method"] != "none":
        total *= 2  # every call is also timed on the paired no-SD engine (sdbench.engine.paired)
    return max(MIN_MINUTES, total)


def group_runtime_minutes(config: dict[str, Any], cells: list[Cell], attempt: int = 1) -> int:
    """Wall-time limit of an engine group: its cells' limits with one engine start-up, per engine
    start, twice that for an SD group timed in pairs with a no-SD engine."""
    return _capped(config, group_estimate_minutes(config, cells), attempt)


@dataclass(frozen=True)
class Split:
    """How one engine group was split to fit the site's limit (:func:`split_to_fit`)."""

    group: str  # engine/model/method/share of the unsplit group
    estimate: int  # its estimate, minutes
    parts: tuple[tuple[str, int], ...]  # (share, estimate) of each part
    oversized: tuple[tuple[str, int], ...]  # (cell, estimate) of single cells beyond the limit

    def describe(self, limits: SiteLimits) -> str:
        """One line: the split, its parts' estimates, and which parts are single cells that cannot
        fit even alone (marked ``*``: each runs in a job of its own that asks for the limit)."""
        parts = ", ".join(f"{share} ({minutes:,}{'*' if minutes > limits.budget else ''})" for share, minutes in self.parts)
        line = (
            f"site: engine group {self.group} (estimated {self.estimate:,} min > {limits.budget:,} = "
            f"{SITE_MARGIN:.0%} of partition {limits.partition}'s {limits.max_runtime:,}) split into "
            f"{len(self.parts)} jobs: {parts}"
        )
        if self.oversized:
            line += (
                f"; * {len(self.oversized)} single cell(s) estimated beyond {limits.budget:,} min: each runs "
                f"alone in a job asking for the limit, {limits.max_runtime:,} min"
            )
        return line


def split_to_fit(
    config: dict[str, Any],
    groups: dict[Any, list[Cell]],
    estimate: Callable[[dict[str, Any], list[Cell]], int],
) -> tuple[dict[Any, list[Cell]], list[Split]]:
    """Engine groups split until each one's ``estimate`` fits the site's budget.

    A group over the budget (:attr:`SiteLimits.budget`) becomes one group per dataset
    (share ``<share>.<dataset>``); a dataset still over it is cut into runs of consecutive
    batch sizes, each as long as fits (``<share>.<dataset>.bs<lo>-<hi>``, ``.bs<n>`` for one).
    A cell over the budget on its own gets a group of its own and is named in the split's
    ``oversized``. Without a site limit the groups are returned unchanged.
    """
    limits = site_limits(config)
    if limits is None or limits.budget is None:
        return groups, []
    budget = limits.budget
    out: dict[Any, list[Cell]] = {}
    splits: list[Split] = []
    for group, cells_ in groups.items():
        total = estimate(config, cells_)
        if total <= budget:
            out[group] = cells_
            continue
        parts: list[tuple[str, list[Cell]]] = []
        oversized: list[tuple[str, int]] = []
        for dataset in sorted({c.dataset for c in cells_}):
            mine = sorted((c for c in cells_ if c.dataset == dataset), key=lambda c: c.batch_size)
            name = f"{group.share}.{dataset}"
            if estimate(config, mine) <= budget:
                parts.append((name, mine))
                continue
            runs: list[list[Cell]] = []
            for cell in mine:
                if runs and estimate(config, [*runs[-1], cell]) <= budget:
                    runs[-1].append(cell)
                else:
                    runs.append([cell])
            for run in runs:
                lo, hi = run[0].batch_size, run[-1].batch_size
                parts.append((f"{name}.bs{lo}" + (f"-{hi}" if hi != lo else ""), run))
                alone = estimate(config, run)
                if len(run) == 1 and alone > budget:
                    c = run[0]
                    oversized.append((f"{c.engine}/{c.model}/{c.dataset}/{c.method}/bs{c.batch_size}", alone))
        for share, part in parts:
            out[type(group)(group.engine, group.model, group.method, share)] = part
        key = f"{group.engine}/{group.model}/{group.method}/{group.share}"
        splits.append(
            Split(key, total, tuple((s, estimate(config, p)) for s, p in parts), tuple(oversized))
        )
    return dict(sorted(out.items())), splits


def site_problems(config: dict[str, Any], cells: list[Cell]) -> list[str]:
    """Cells a site cannot run: a CUDA target sharded over more GPUs than a node of the engine
    partition has (one engine stays on one node)."""
    limits = site_limits(config)
    if limits is None or limits.gpus_per_node is None:
        return []
    wide = sorted({(c.model, cell_gpus(config, c)) for c in cells if cell_gpus(config, c) > limits.gpus_per_node})
    return [
        f"site: model {model!r} needs {gpus} GPUs (tensor_parallel_size) but a node of partition "
        f"{limits.partition} has {limits.gpus_per_node} (site.partitions.{limits.partition}.gpus_per_node)"
        for model, gpus in wide
    ]


def server_runtime_minutes(config: dict[str, Any], cell: Cell, attempt: int = 1) -> int:
    """Wall-time limit of a server group (sdbench.servermode) whose largest cell is ``cell``
    (:func:`server_estimate_minutes`, times the attempt, within the site's limit)."""
    return _capped(config, server_estimate_minutes(config, cell), attempt)


def server_estimate_minutes(config: dict[str, Any], cell: Cell) -> int:
    """First-attempt estimate of a server group whose largest cell is ``cell``, uncapped.

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
    return max(MIN_MINUTES, math.ceil(SAFETY * (startup + seconds / 60)))
