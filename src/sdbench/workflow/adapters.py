"""From Snakemake's wildcards and inputs to the plan: the functions the rules call for their inputs,
params and resources, so that ``workflow/rules/common.smk`` binds each in one line.

:class:`EngineJobs` serves the run, trace and breakdown groups (what a group's wildcards name, its
target, drafter, image, GPUs, memory, runtime and spec); :class:`AnalysisJobs` the analysis jobs'
memory and runtime from what their inputs hold (:mod:`sdbench.schedulinganalysis`). Server groups'
adapters stay in common.smk beside their rules. Wildcards are read as Snakemake passes them: an
object with the wildcards as attributes and ``keys()``; the parameter names (``input``,
``attempt``) are the ones Snakemake fills by name.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sdbench import scheduling, schedulinganalysis
from sdbench.containers import image_identity
from sdbench.grid import Cell, EngineGroup, TraceGroup
from sdbench.workflow import paths as P
from sdbench.workflow.plan import Plan, spec_file


class EngineJobs:
    """A plan's engine jobs (run, trace and breakdown groups) as their rules ask for them."""

    def __init__(self, plan: Plan, containers: str | Path) -> None:
        self.plan = plan
        self.config = plan.config
        self.containers = Path(containers)  # the image definitions (containers/), for image_identity

    # --- wildcards -> plan keys
    def cell(self, w: Any) -> Cell:
        return Cell(w.engine, w.model, w.dataset, w.method, int(w.batch_size))

    def group(self, w: Any) -> EngineGroup:
        return EngineGroup(w.engine, w.model, w.method, w.share)

    def trace_group(self, w: Any) -> TraceGroup:
        return TraceGroup(w.engine, w.model, w.method)

    def engine_cell(self, w: Any) -> Cell:
        """The cell that sizes an engine job: a group's largest (run and breakdown groups), or a
        trace group's first (its traces differ only by prompts, all at the trace batch size)."""
        if "share" in w.keys():
            group = self.group(w)
            groups = self.plan.breakdown_groups if group in self.plan.breakdown_groups else self.plan.groups
            return max(groups[group], key=lambda c: c.batch_size)
        return self.plan.trace_cells(self.trace_group(w))[0]

    # --- every engine job
    def target_dir(self, w: Any) -> str:
        return self.plan.model_dir(w.model)

    def drafter_arg(self, w: Any, input: Any) -> str:
        return f"--drafter-dir {shlex.quote(input.drafter)}" if "drafter" in input.keys() else ""

    def container(self, w: Any) -> str | None:
        return self.config["engines"][w.engine].get("container")

    def image(self, w: Any) -> str:
        """Identity of the engine's image (a param: a new image reruns exactly its cells)."""
        return image_identity(self.container(w), self.containers)

    def gpus(self, w: Any) -> int:
        """GPUs for a cell = the target's tensor-parallel size (0 on CPU engines)."""
        return scheduling.cell_gpus(self.config, self.engine_cell(w))

    # --- run groups
    def group_inputs(self, w: Any) -> dict[str, str]:
        return self.plan.engine_job_inputs(self.plan.groups[self.group(w)], w.method, w.model)

    def group_spec(self, w: Any) -> str:
        """The group's spec as its content-addressed file (the param changes with the spec)."""
        return spec_file(self.plan.group_spec(self.group(w)))

    def group_mem_mb(self, w: Any) -> int:
        return scheduling.job_mem_mb(self.config, "run", self.plan.groups[self.group(w)])

    def group_runtime(self, w: Any, attempt: int) -> int:
        return scheduling.group_runtime_minutes(self.config, self.plan.groups[self.group(w)], attempt)

    # --- trace groups
    def trace_group_inputs(self, w: Any) -> dict[str, str]:
        return self.plan.engine_job_inputs(self.plan.trace_cells(self.trace_group(w)), w.method, w.model)

    def trace_group_mem_mb(self, w: Any) -> int:
        return scheduling.job_mem_mb(self.config, "trace", self.plan.trace_cells(self.trace_group(w)))

    def trace_group_runtime(self, w: Any, attempt: int) -> int:
        return scheduling.trace_runtime_minutes(self.config, self.plan.trace_cells(self.trace_group(w)), attempt)

    # --- breakdown groups
    def breakdown_group_inputs(self, w: Any) -> dict[str, str]:
        return self.plan.engine_job_inputs(self.plan.breakdown_groups[self.group(w)], w.method, w.model)

    def breakdown_group_mem_mb(self, w: Any) -> int:
        return scheduling.job_mem_mb(self.config, "breakdown", self.plan.breakdown_groups[self.group(w)])

    def breakdown_group_runtime(self, w: Any, attempt: int) -> int:
        return scheduling.breakdown_runtime_minutes(self.config, self.plan.breakdown_groups[self.group(w)], attempt)


class AnalysisJobs:
    """Analysis jobs' memory and runtime from what their inputs hold (known from the config)."""

    def __init__(self, config: dict[str, Any], num_cells: int) -> None:
        self.config = config
        self.num_cells = num_cells  # cells.parquet's rows

    def reads(self, input: Iterable[str]) -> schedulinganalysis.Reads:
        return schedulinganalysis.total_reads(self.config, list(input), num_cells=self.num_cells)

    def mem_mb(self, w: Any, input: Iterable[str]) -> int:
        return schedulinganalysis.analysis_mem_mb(self.reads(input))

    def parsed_mem_mb(self, w: Any, input: Iterable[str]) -> int:
        """A job that turns its token ids into Python ints (the offline tracers: a SPEED-Bench 32k
        prompt table peaked at 3,320 MB on 2,900 asked at Arrow's size in the SLURM rehearsal)."""
        return schedulinganalysis.analysis_mem_mb(schedulinganalysis.parsed(self.reads(input)))

    def prompt_table_mem_mb(self, w: Any, input: Iterable[str]) -> int:
        """prepare_dataset builds its prompt table in memory (1,536 x 32K token ids peaked at 1,266 MB
        in the SLURM rehearsal): what it reads and the table it writes."""
        return schedulinganalysis.analysis_mem_mb(
            self.reads([*input, P.PROMPTS.format(model=w.model, dataset=w.dataset)])
        )

    def streamed_mem_mb(self, w: Any, input: Iterable[str]) -> int:
        """An analysis that reads its inputs file by file (aggregate): its largest file, not their sum."""
        return schedulinganalysis.streamed_mem_mb(self.config, list(input), self.num_cells)

    def runtime(self, w: Any, input: Iterable[str], attempt: int) -> int:
        return schedulinganalysis.analysis_runtime_minutes(self.config, self.reads(input), attempt)

    def simulation_runtime(self, policies: Callable[[Any], Any], batch_sizes: Callable[[Any], Any]) -> Callable[..., int]:
        """A simulation's runtime: one pass over its inputs per policy and batch size."""

        def runtime(w: Any, input: Iterable[str], attempt: int) -> int:
            passes = max(1, len(policies(w))) * max(1, len(batch_sizes(w)))
            return schedulinganalysis.analysis_runtime_minutes(self.config, self.reads(input), attempt, passes)

        return runtime
