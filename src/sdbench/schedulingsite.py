"""Engine jobs fitted to a site: groups split until each fits the engine partition's limit
(:func:`split_to_fit`), what cannot finish there (:func:`unfinishable`, :func:`site_problems`), and
every engine job of a plan with what it asks (:func:`engine_jobs`, ``sdbench plan --jobs``).

Split from :mod:`sdbench.scheduling` (the estimates and the site's limits, :func:`site_limits`) so
that each stays short; the functions moved unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from sdbench.grid import Cell
from sdbench.scheduling import (
    SITE_MARGIN,
    JobEstimate,
    SiteLimits,
    _capped,
    cell_gpus,
    estimate_breakdown,
    job_mem_mb,
    site_limits,
)

# ----------------------------------------------------------------------------- splitting groups to fit
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


def unfinishable(limits: SiteLimits, splits: list[Split], unsplit: list[tuple[str, int]]) -> list[str]:
    """What cannot finish at the site, one line each: a single cell whose estimate is past the limit
    times the attempts (it resumes from its progress after each kill), and a trace or server group
    (``unsplit``: (name, estimate); neither resumes) past one limit."""
    if limits.max_runtime is None:
        return []
    out = [f"cell {cell} (estimated {minutes:,} min) cannot finish in {limits.attempts} attempt(s) of "
           f"{limits.max_runtime:,} min (site.attempts x partition {limits.partition}'s max_runtime)"
           for split in splits for cell, minutes in split.oversized if minutes > (limits.reach or 0)]  # fmt: skip
    out += [f"{name} (estimated {minutes:,} min) cannot finish in one job of {limits.max_runtime:,} min: it does "
            "not resume" for name, minutes in unsplit if minutes > limits.max_runtime]  # fmt: skip
    return out


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


# ----------------------------------------------------------------------------- every engine job of a plan
@dataclass(frozen=True)
class EngineJob:
    """One engine job of a plan: its rule and wildcards, GPUs, host memory, estimate and request."""

    rule: str
    wildcards: dict[str, str]
    gpus: int
    mem_mb: int
    estimate: JobEstimate
    runtime: int  # first attempt, within the site's limit

    def row(self) -> dict[str, Any]:
        """A flat row: rule, wildcards, gpus, mem_mb, each part in minutes, runtime."""
        parts = {f"{k}_min" if k not in ("trials", "minutes") else k: v
                 for k, v in self.estimate.parts_minutes().items()}  # fmt: skip
        return {"rule": self.rule, **self.wildcards, "gpus": self.gpus, "mem_mb": self.mem_mb, **parts,
                "runtime": self.runtime}  # fmt: skip


def engine_jobs(plan: Any) -> list[EngineJob]:
    """Every engine job of a plan (:class:`sdbench.workflow.plan.Plan`) with what it asks, as the
    workflow's resource functions compute it: run, breakdown, trace and server groups."""
    config = plan.config
    kinds: list[tuple[str, str, Any, list[Cell]]] = [
        *(("run_engine", "run", g, cs) for g, cs in plan.groups.items()),
        *(("breakdown_group", "breakdown", g, cs) for g, cs in plan.breakdown_groups.items()),
        *(("trace_group", "trace", g, plan.trace_cells(g)) for g in plan.trace_groups),
        *(("serve_group", "server", g, [plan.server_cell(g)]) for g in plan.server_groups),
    ]
    jobs = []
    for rule, kind, group, cells_ in kinds:
        est = estimate_breakdown(config, kind, cells_)
        sizing = max(cells_, key=lambda c: c.batch_size)
        jobs.append(EngineJob(rule, dict(group.as_dict()), cell_gpus(config, sizing), job_mem_mb(config, kind, cells_),
                              est, _capped(config, est.minutes, 1)))  # fmt: skip
    return jobs


def engine_jobs_table(jobs: list[EngineJob], limit: int | None) -> list[str]:
    """:func:`engine_jobs` as a tab-separated table (header first) and a totals line: jobs,
    how many ask the site's full limit, GPU-hours asked at the first attempt."""
    header = ["rule", "job", "gpus", "mem_mb", "startup", "warmup", "prefill", "decode", "calls", "trials",
              "expected", "estimate", "runtime"]  # fmt: skip
    lines = ["\t".join(header)]
    for job in jobs:
        p = job.estimate.parts_minutes()
        name = "/".join(job.wildcards.values())
        lines.append("\t".join([job.rule, name, str(job.gpus), str(job.mem_mb),
                                *(f"{p[k]:.1f}" for k in ("startup", "warmup", "prefill", "decode", "call")),
                                f"{p['trials']:.1f}", f"{p['expected']:.1f}", str(job.estimate.minutes),
                                str(job.runtime)]))  # fmt: skip
    full = sum(limit is not None and j.runtime >= limit for j in jobs)
    hours = sum(j.runtime * max(j.gpus, 1) for j in jobs) / 60
    device = "GPU" if any(j.gpus for j in jobs) else "device"
    cap = f"the full limit ({limit} min)" if limit is not None else "the full limit (no site limit)"
    lines.append(f"engine jobs: {len(jobs)}; asking {cap}: {full}; "
                 f"{device}-hours asked at the first attempt: {hours:,.0f}")  # fmt: skip
    return lines
