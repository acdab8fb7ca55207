"""The plan: everything the DAG needs that depends only on the validated config.

:class:`Plan` is built once from the config (``workflow/rules/common.smk``: ``PLAN = Plan(config)``)
and answers, with plain values a fast test can check: the cells and how they share engines
(engine, trace, breakdown and server groups), which figure-index items are drawn and for which
scopes (:meth:`Plan.final_outputs`, driven by :data:`sdbench.figureindex.ITEMS`), the inputs of
each step, and every params payload (resolved cell specs, labels, prices, sweep points). The rule
files keep only thin adapters from Snakemake's wildcards to these methods.

A site's runtime limit splits engine groups (their ``share`` names the parts, and their jobs'
directories); it never changes a cell's measurement: a split group keeps its unsplit group's
engine arguments and every group of an engine x model x method shares one checkpoint store
(:meth:`Plan.group_checkpoint_dir`), so a group split differently finds its cells measured.

Specs of engine jobs stay out of shell lines: :func:`spec_file` writes a spec once, under a name
that is its digest (:data:`sdbench.workflow.paths.SPEC_FILE`), and the rule passes that path: the
param changes exactly when the spec does, and a log shows a short command.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sdbench import scheduling, schedulingsite, sweeps
from sdbench.config import ConfigError
from sdbench.figureindex import BY_NAME, ITEMS, paper_path
from sdbench.grid import (
    Cell,
    EngineGroup,
    baseline_cells,
    baseline_method,
    breakdown_cells,
    breakdown_groups,
    cells,
    design_line,
    drafter_of,
    engine_groups,
    models_used,
    resolve_breakdown_cell,
    resolve_cell,
    tokenizer_model,
    trace_groups,
    trace_targets,
)
from sdbench.servermode import (
    INTERLEAVED,
    ServerGroup,
    resolve_server_group,
    server_groups,
    server_groups_interleaved,
    server_slos,
)
from sdbench.workflow import paths as P
from sdbench.workflow.plansim import SimulatorPlan
from sdbench.workflow.plantraces import OFFLINE_SUFFIX_METHOD, TracePlan
from sdbench.workflow.rulenames import NETWORK_RULES

# Snakemake priority of the jobs the verdict and Fig. 1 wait for; every other job has 0, so among
# jobs ready at once these run first (Plan.engine_priority).
FIRST = 10


def quoted(value: Any) -> str:
    """A JSON value as one shell word (params of a rule's shell line)."""
    return shlex.quote(json.dumps(value, sort_keys=True))


def spec_file(spec: Any, root: str | os.PathLike[str] = ".") -> str:
    """Write ``spec`` (JSON) to its content-addressed file under ``root`` once; return the path.

    The file's name is the first 16 hex digits of the spec's sha256, so the path changes exactly
    when the spec does and an existing file is never rewritten (a job reading it meanwhile is safe).
    """
    text = json.dumps(spec, sort_keys=True)
    path = P.SPEC_FILE.format(digest=hashlib.sha256(text.encode()).hexdigest()[:16])
    full = Path(root) / path
    if not full.is_file():
        full.parent.mkdir(parents=True, exist_ok=True)
        tmp = full.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(full)
    return path


class Plan(TracePlan, SimulatorPlan):
    """What the DAG of one validated config consists of (see the module docstring)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        #: ``engine_mode: rehearsal``: every engine job runs on the rehearsal engine (sdbench.rehearsal),
        #: hub models are stand-ins and hub datasets rehearsal prompt sets (nothing is downloaded).
        self.rehearsal = config.get("engine_mode", "measured") == "rehearsal"
        self.cells = cells(config)
        self.baseline = baseline_method(config)
        models = config["models"]
        self.built_models = sorted(k for k, m in models.items() if "build" in m)
        self.hub_models = sorted(k for k, m in models.items() if "hf_id" in m)
        self.heads = sorted(k for k, m in models.items() if "head" in m)
        # Hub datasets without a local copy of their own: downloaded by a local rule first (a
        # temperature variant reads its base's prompt table).
        self.hub_datasets = sorted(
            k
            for k, d in config["datasets"].items()
            if d["source"] == "huggingface" and not d.get("local_path") and sweeps.prompt_dataset(config, k) == k
            and not self.rehearsal
        )
        problems = schedulingsite.site_problems(config, self.cells)
        if problems:
            raise ConfigError("config: " + "; ".join(problems))
        # Engine and breakdown groups, split where a site's runtime limit needs it.
        unsplit = engine_groups(config)
        self.groups, splits = schedulingsite.split_to_fit(config, unsplit, scheduling.group_estimate_minutes)
        unsplit_breakdown = breakdown_groups(config)
        self.breakdown_groups, breakdown_splits = schedulingsite.split_to_fit(
            config, unsplit_breakdown, scheduling.breakdown_estimate_minutes
        )
        limits = scheduling.site_limits(config)
        #: One line per split group (``sdbench check-config --profile``, the DAG's log).
        self.site_notes = [s.describe(limits) for s in splits + breakdown_splits]
        self._group_of = {c: g for g, cs in self.groups.items() for c in cs}
        self._breakdown_group_of = {c: g for g, cs in self.breakdown_groups.items() for c in cs}
        # A split group's engine keeps the unsplit group's max_num_seqs: the same engine arguments.
        self._max_num_seqs = {
            g: max(c.batch_size for c in everything[EngineGroup(g.engine, g.model, g.method, g.share.split(".")[0])])
            for split, everything in ((self.groups, unsplit), (self.breakdown_groups, unsplit_breakdown))
            for g in split
            if g not in everything
        }
        self.traces = trace_targets(config)
        self.trace_settings = config.get("traces", {})
        self.trace_groups = trace_groups(config)
        if limits is not None and limits.budget is not None:  # one engine per traced method: not split
            for group in self.trace_groups:
                minutes = scheduling.trace_estimate_minutes(config, self.trace_cells(group))
                self._note_unsplit("trace", group, minutes, limits)
        self.offline_tracers = self.trace_settings.get("offline", ["ngram"])
        self.baseline_cells = {(c.engine, c.model, c.dataset): c for c in baseline_cells(config)}
        self.published = config.get("published_traces", {})
        self.server = config.get("server", {})
        self.server_groups = server_groups(config)
        if limits is not None and limits.budget is not None:  # one server per method: not split
            for sgroup in self.server_groups:
                minutes = scheduling.server_estimate_minutes(config, self.server_cell(sgroup))
                self._note_unsplit("server", sgroup, minutes, limits)
        if limits is not None:
            self._refuse_unfinishable(limits, splits + breakdown_splits)
        self.cost = config.get("cost", {})
        self.bleu = config.get("bleu")
        self.breakdown = breakdown_cells(config)
        grid_datasets = {c.dataset for c in self.cells}
        self.random_pairs = {
            name: d["matched_to"]
            for name, d in config["datasets"].items()
            if d["source"] == "random_tokens" and name in grid_datasets
        }
        self._refuse_unpriced_drafters()

    def _refuse_unfinishable(self, limits: Any, splits: list[Any]) -> None:
        """Refuse, before any job, what the site cannot finish (:func:`sdbench.schedulingsite.unfinishable`):
        every attempt of such a job would be GPU-hours with no number at the end."""
        unsplit = [(f"trace group {g.engine}/{g.model}/{g.method}",
                    scheduling.trace_estimate_minutes(self.config, self.trace_cells(g))) for g in self.trace_groups]
        unsplit += [(f"server group {g.engine}/{g.model}/{g.label}",
                     scheduling.server_estimate_minutes(self.config, self.server_cell(g))) for g in self.server_groups]
        found = schedulingsite.unfinishable(limits, splits, unsplit)
        if found:
            more = f" ({len(found) - 1} more like it: sdbench check-config --profile lists them)" if len(found) > 1 else ""
            raise ConfigError(f"config: site: {found[0]}{more}; drop it from the grid, or raise the limit or attempts")

    def _refuse_unpriced_drafters(self) -> None:
        """The grid's simulations replay each dataset's preferred drafter, priced by the cost model
        the breakdown's steps fit: a drafter the breakdown does not time has no price, and its
        simulation jobs would fail mid-run ("cost model 'measured' has no drafter ...")."""
        timed = {self.config["methods"][m]["method"] for m in self.config.get("breakdown", {}).get("methods", [])}
        missing = sorted({(self.config["methods"][t["drafter"]]["method"], t["drafter"], "/".join(k))
                          for k, t in self.priced_targets().items()
                          if self.config["methods"][t["drafter"]]["method"] not in timed})  # fmt: skip
        if missing:
            method, key, where = missing[0]
            raise ConfigError(
                f"config: breakdown.methods: the simulations of {where} replay the drafter of {key!r} "
                f"(vLLM method {method!r}), which no breakdown method times: add one with method {method!r}"
                + (f" ({len(missing) - 1} more like it)" if len(missing) > 1 else "")
            )

    # ------------------------------------------------------------------ models and datasets

    def _note_unsplit(self, kind: str, group: Any, minutes: int, limits: Any) -> None:
        """A ``site:`` line for a trace or server group (one engine or server per method, never
        split) whose estimate is over the site's budget: its job asks for the whole limit."""
        if minutes > limits.budget:
            self.site_notes.append(
                f"site: {kind} group {group.engine}/{group.model}/{getattr(group, 'label', None) or group.method} "
                f"(estimated {minutes:,} min "
                f"> {limits.budget:,}) is not split: its job asks for the limit, {limits.max_runtime:,} min"
            )
    def model_dir(self, key: str) -> str:
        """Directory of a model: built by the pipeline or downloaded from the hub."""
        built = key in self.built_models or key in self.heads
        return (P.BUILT_MODEL if built else P.HUB_MODEL).format(key=key)

    def built_model_dirs(self) -> list[str]:
        """The built models (and heads) the grid uses."""
        used = models_used(self.config)
        return [self.model_dir(k) for k in self.built_models + self.heads if k in used]

    def tokenizer_dir(self, model: str) -> str:
        """The directory whose tokenizer tokenizes a model's prompts."""
        return self.model_dir(tokenizer_model(self.config, model))

    def drafter_dir(self, method: str, model: str) -> str | None:
        """The drafter of a method for a target, if it has one."""
        drafter = drafter_of(self.config, method, model)
        return self.model_dir(drafter) if drafter else None

    def build_args(self, model: str) -> str:
        """CLI options of ``sdbench train-model`` from a model's build entry."""
        build = self.config["models"][model]["build"]
        return " ".join(f"--{k.replace('_', '-')} {cli_value(v)}" for k, v in sorted(build.items()))

    def build_threads(self, model: str) -> int:
        # One thread: a second barely shortens a step of the small models (and spins when
        # the cores are shared), while the target and draft train side by side on two cores.
        return int(self.config["models"][model]["build"].get("threads", 1))

    def head_target(self, head: str) -> str:
        return self.model_dir(self.config["models"][head]["head"]["target"])

    def head_args(self, head: str) -> str:
        """CLI options of ``sdbench train-head`` from a head's entry (its target is an input)."""
        entry = {k: v for k, v in self.config["models"][head]["head"].items() if k not in ("target", "threads")}
        return " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(cli_value, v)) if isinstance(v, list) else cli_value(v)}"
            for k, v in sorted(entry.items())
        )

    def head_threads(self, head: str) -> int:
        return int(self.config["models"][head]["head"].get("threads", 1))

    def hub_id(self, model: str) -> str:
        return self.config["models"][model]["hf_id"]

    def hub_revision(self, model: str) -> str:
        return self.config["models"][model].get("revision", "main")

    def prompt_table(self, model: str, dataset: str) -> str:
        return P.PROMPTS.format(model=model, dataset=dataset)

    def prepare_inputs(self, model: str, dataset: str) -> dict[str, str]:
        """The tokenizer, for a random_tokens dataset the same model's matched prompt table, the
        SPEED-Bench stand-in directory when the dataset reads it, and a user's prompts file."""
        inputs = {"tokenizer": self.tokenizer_dir(model)}
        entry = self.config["datasets"][dataset]
        if entry["source"] == "random_tokens":
            inputs["matched"] = self.prompt_table(model, entry["matched_to"])
        if entry.get("local_path") == P.SPEED_BENCH_SAMPLE:
            inputs["sample"] = P.SPEED_BENCH_SAMPLE
        if entry["source"] == "file":  # your prompts file: an edit reruns its prompt tables
            inputs["prompts_file"] = entry["path"]
        if dataset in self.hub_datasets:
            inputs["hub_copy"] = self.dataset_copy(dataset)
        return {**inputs, **self.rehearsal_inputs()}

    # ------------------------------------------------------------------ rehearsal mode
    def rehearsal_traces(self) -> dict[str, str]:
        """Published trace name -> its local copy, which a rehearsal replays ({} when measured)."""
        from sdbench.rehearsal.standins import PUBLISHED

        return {d: P.PUBLISHED_JSONL.format(published=d) for d in PUBLISHED} if self.rehearsal else {}

    def rehearsal_inputs(self) -> dict[str, str]:
        """Inputs every engine and prompt job gets in rehearsal mode: the published traces."""
        return {f"rehearsal_{d}": path for d, path in self.rehearsal_traces().items()}

    def rehearsal_prepare_arg(self) -> str:
        """The ``rehearsal prepare-dataset`` option (a shell template over its inputs); "" when measured."""
        if not self.rehearsal:
            return ""
        return " --rehearsal-traces " + " ".join(f"{d}={{input.rehearsal_{d}}}" for d in self.rehearsal_traces())

    def with_mode(self, spec: dict[str, Any]) -> dict[str, Any]:
        """An engine job's spec with its engine mode: unchanged when measured (so a measured run's
        specs, and what Snakemake reruns, do not change), else ``engine_mode`` and the traces."""
        if not self.rehearsal:
            return spec
        rehearsal: dict[str, Any] = {"published_traces": self.rehearsal_traces()}
        if self.config.get("rehearsal_cost_model"):  # a calibrated model prices the steps (sdbench.rehearsal.costs)
            from sdbench.simulator.costmodel import load_cost_model

            name = str(self.config["rehearsal_cost_model"])  # its digest in the spec: a changed file reruns the job
            rehearsal.update(cost_model=name, cost_model_sha256=load_cost_model(name).digest())
        return {**spec, "engine_mode": "rehearsal", "rehearsal": rehearsal}

    def dataset_copy(self, dataset: str) -> str:
        """The local copy of a hub dataset's repository files (``download_dataset``)."""
        return P.HUB_DATASET.format(key=dataset)

    def dataset_entry(self, dataset: str) -> dict[str, Any]:
        """A dataset's entry as ``prepare-dataset`` reads it: a hub dataset's ``local_path`` is the
        copy ``download_dataset`` made, so the compute job needs no network. The keys that only size
        jobs (:data:`sdbench.expectedlengths.SIZING_KEYS`) are left out: re-estimating reruns nothing; but
        in a rehearsal the expected output length is the mean of the stand-in outputs
        (:func:`sdbench.rehearsal.prepare.expected_outputs`)."""
        kept = {"expected_output_tokens"} if self.rehearsal else set()
        entry = {k: v for k, v in self.config["datasets"][dataset].items()
                 if k not in scheduling.SIZING_KEYS or k in kept}  # fmt: skip
        if dataset in self.hub_datasets:
            return {**entry, "local_path": self.dataset_copy(dataset)}
        return entry

    def prepare_outside(self, dataset: str) -> tuple[str, ...]:
        """Modules a dataset's prompt table does not depend on, left out of ``prepare_dataset``'s code
        digest: the tiny models' corpus, but for the builders that read it
        (:data:`sdbench.datasets.prompts.CORPUS_BUILDERS`)."""
        from sdbench.datasets.prompts import CORPUS_BUILDERS

        return () if self.config["datasets"][dataset].get("builder") in CORPUS_BUILDERS else ("sdbench.datasets.corpus",)

    def download_entry(self, dataset: str) -> dict[str, Any]:
        """What ``download-dataset`` needs of a hub dataset's entry (what selects its files)."""
        entry = self.config["datasets"][dataset]
        return {k: entry[k] for k in ("hf_id", "revision", "hf_config", "split", "data_files") if k in entry}

    def containers(self) -> list[str]:
        """The images of the engines this run starts (their ``container``), sorted."""
        groups = [*self.cells, *self.trace_groups, *self.server_groups]
        engines = {g.engine for g in groups}
        return sorted({c for e in engines if (c := self.config["engines"][e].get("container"))})

    def network_rules(self) -> tuple[str, ...]:
        """The rules that run locally on the submitting host (:data:`NETWORK_RULES`)."""
        return NETWORK_RULES

    def chat_template_kwargs(self, model: str) -> dict[str, Any]:
        return self.config["models"][model].get("chat_template_kwargs", {})

    def context_arg(self, model: str) -> str:
        """``--max-model-len N`` when the model entry caps its context (the engine's max_model_len;
        prompts that do not fit are dropped at prepare time), else "" (the model's config.json)."""
        cap = self.config["models"][model].get("max_model_len")
        return f"--max-model-len {int(cap)}" if cap is not None else ""

    def memory_model_names(self) -> dict[str, str]:
        """Model key -> what ``sdbench memory`` loads: the repo id, or the built model's directory."""
        return {
            k: self.model_dir(k) if k in self.built_models or k in self.heads else m["hf_id"]
            for k, m in self.config["models"].items()
        }

    def model_devices(self) -> dict[str, int]:
        """Model key -> devices one engine instance holds (its tensor_parallel_size)."""
        return {k: int(m.get("tensor_parallel_size", 1)) for k, m in self.config["models"].items()}

    @property
    def equivalence_margin(self) -> float:
        """The verdict's break-even margin (config ``verdict.equivalence_margin``)."""
        return float(self.config["verdict"]["equivalence_margin"])

    def method_labels(self) -> dict[str, str]:
        """Method key -> the config's label."""
        return {k: m.get("label", k) for k, m in sorted(self.config["methods"].items())}

    # ------------------------------------------------------------------ engine cells
    def cell_file(self, cell: Cell, name: str) -> str:
        """A per-cell table (requests, calls, summary, ...) of one cell."""
        return P.CELL_TABLE.format(**asdict(cell), name=name)

    def cell_outputs(self, name: str) -> list[str]:
        """Paths of one per-cell table for every cell of the grid."""
        return [self.cell_file(c, name) for c in self.cells]

    # ------------------------------------------------------------------ the verdict first
    @functools.cached_property
    def _grid_cells(self) -> list[Cell]:
        variants = sweeps.variant_keys(self.config)
        # The A/A control's cells belong to the verdict (it counts them), so they come first too.
        methods = {k for k, sweep in variants["methods"].items() if sweep != sweeps.AA_CONTROL}
        return [c for c in self.cells if c.method not in methods and c.dataset not in variants["datasets"]]

    def grid_cells(self) -> list[Cell]:
        """The grid's own cells (no sweep variant): what the verdict and Fig. 1 read."""
        return list(self._grid_cells)

    @functools.cached_property
    def _grid_set(self) -> frozenset[Cell]:
        return frozenset(self._grid_cells)

    def grid_cell_outputs(self, name: str) -> list[str]:
        """Paths of one per-cell table for every cell of :meth:`grid_cells`."""
        return [self.cell_file(c, name) for c in self.grid_cells()]

    def engine_priority(self, group: EngineGroup) -> int:
        """Snakemake priority of an engine group's job: :data:`FIRST` when it measures a cell the
        verdict reads (so that the verdict and Fig. 1 are written before the extensions are measured)."""
        return FIRST if any(c in self._grid_set for c in self.groups[group]) else 0

    def cell_priority(self, cell: Cell) -> int:
        """Snakemake priority of a cell's table job (see :meth:`engine_priority`)."""
        return FIRST if cell in self._grid_set else 0

    def prompt_tables(self, cells_: list[Cell]) -> dict[str, str]:
        """Dataset -> prompt table of each cell (a temperature variant reads its base's)."""
        return {c.dataset: self.prompt_table(c.model, sweeps.prompt_dataset(self.config, c.dataset)) for c in cells_}

    def engine_job_inputs(self, cells_: list[Cell], method: str, model: str) -> dict[str, str]:
        """Inputs of a job running ``cells_`` on one engine: their prompt tables, the drafter and the
        engine image's gate."""
        inputs = {f"prompts_{Path(t).stem}": t for t in self.prompt_tables(cells_).values()}
        drafter = self.drafter_dir(method, model)
        gate = self.gate_input(cells_[0].engine)
        return {**inputs, **({"drafter": drafter} if drafter else {}), **self.rehearsal_inputs(), **gate}

    def image_of(self, engine: str) -> str | None:
        """The image a CUDA engine runs in (its container's name), or None (a CPU engine, or one
        run without a container)."""
        entry = self.config["engines"][engine]
        container = entry.get("container")
        return Path(container).stem if entry.get("device") == "cuda" and container else None

    def gate_input(self, engine: str) -> dict[str, str]:
        """``{"gate": ...}``: the gate an engine job of ``engine`` waits for (:mod:`sdbench.imagegate`),
        or nothing for an engine without a CUDA image."""
        image = self.image_of(engine)
        return {"gate": P.IMAGE_GATE.format(image=image)} if image else {}

    def image_container(self, image: str) -> str:
        """The container path of a gated image (the first engine that names it)."""
        return next(e["container"] for k, e in sorted(self.config["engines"].items()) if self.image_of(k) == image)

    def _job_spec(
        self, specs: list[dict[str, Any]], cells_: list[Cell], group: EngineGroup | None = None
    ) -> dict[str, Any]:
        spec = {"cells": [self.with_mode(s) for s in specs], "prompts": self.prompt_tables(cells_)}
        if group in self._max_num_seqs:  # split: the unsplit group's engine arguments
            spec["max_num_seqs"] = self._max_num_seqs[group]
        return spec

    @property
    def shares(self) -> list[str]:
        """Every ``share`` of an engine or breakdown group (the wildcard's values)."""
        return sorted({g.share for g in [*self.groups, *self.breakdown_groups]})

    def group_spec(self, group: EngineGroup) -> dict[str, Any]:
        """Resolved cell specs of an engine group and their prompt tables (``sdbench run-group``)."""
        cells_ = self.groups[group]
        return self._job_spec([resolve_cell(self.config, c) for c in cells_], cells_, group)

    def group_dir_of_cell(self, cell: Cell) -> str:
        return P.GROUP_DIR.format(**self._group_of[cell].as_dict())

    def group_checkpoint_dir(self, group: EngineGroup) -> str:
        """Where an engine or breakdown group keeps the cells it measured: one store per engine x
        model x method, not per share, so that a group split differently (another site limit, or
        none: ``--report``, ``-n`` without the profile) finds the cells measured before. A split
        changes which jobs run (their directories are named by share), never a cell's key; a
        re-split group's job re-uses its cells and measures none (sdbench.engine.groups)."""
        return P.GROUP_CHECKPOINT_DIR.format(engine=group.engine, model=group.model, method=group.method)

    def speed_bench_cells(self) -> list[Cell]:
        """SD cells on SPEED-Bench datasets (builder speed_bench): the per-category table's inputs."""
        return [
            c for c in self.cells
            if self.config["datasets"][c.dataset].get("builder") == "speed_bench"
            and self.config["methods"][c.method]["method"] != "none"
        ]  # fmt: skip

    def _per_request_counters(self, cell: Cell) -> bool:
        from sdbench.engine.release.versions import quirks_for

        return quirks_for(self.config["engines"][cell.engine]["vllm_version"]).per_request_spec_metrics

    def speed_bench_inputs(self) -> dict[str, list[str]]:
        """Per-request counters where the engine records them (vLLM >= 0.32), else the cells'
        replicate-mode calls (one prompt per call); and the datasets' prompt tables."""
        cells_ = self.speed_bench_cells()
        return {
            "requests": [self.cell_file(c, "requests") for c in cells_ if self._per_request_counters(c)],
            "calls": [self.cell_file(c, "calls") for c in cells_ if not self._per_request_counters(c)],
            "prompts": sorted({self.prompt_table(c.model, c.dataset) for c in cells_}),
        }

    def verdict_inputs(self) -> dict[str, str]:
        """The grid's joined cells, and the server-mode table when the config has a server section."""
        inputs = {"cells": P.GRID_CELLS_TABLE}
        if self.server_groups:
            inputs["server"] = P.SERVER_TABLE
        return inputs

    def verdict_page_inputs(self) -> dict[str, str]:
        """The verdict page's: :meth:`verdict_inputs`, and with a server section ext17's frontier and
        max-load tables (the goodput verdict without a hand-picked target)."""
        inputs = self.verdict_inputs()
        if self.server_groups:
            inputs.update(frontier=P.table("goodput_frontier"), max_load=P.table("goodput_max_load"))
        return inputs

    def sweep_variants(self) -> dict[str, dict[str, str]]:
        return sweeps.variant_keys(self.config)

    def cost_prices(self) -> dict[str, float]:
        return self.cost.get("price_per_device_hour", {})

    def proposal_length_points(self) -> dict[str, list[Any]]:
        """Method key -> [base method, k] of the proposal-length sweep."""
        return {k: list(v) for k, v in sweeps.proposal_length_methods(self.config).items()}

    def proposal_length_scope(self) -> dict[str, Any]:
        sweep = self.config.get("proposal_length", {})
        return {k: sweep.get(k) for k in ("engine", "models", "datasets", "batch_sizes")}

    def temperature_points(self) -> dict[str, list[Any]]:
        """Dataset key -> [base dataset, temperature] of the temperature sweep."""
        return {k: list(v) for k, v in sweeps.temperature_datasets(self.config).items()}

    def temperature_scope(self) -> dict[str, Any]:
        sweep = self.config.get("temperature", {})
        return {k: sweep.get(k) for k in ("engine", "models", "methods", "batch_sizes")}

    # ------------------------------------------------------------------ forced acceptance
    @property
    def forced(self) -> dict[str, Any]:
        """The forced-acceptance sweep's section ({} when the config has none)."""
        return self.config.get(sweeps.FORCED_ACCEPTANCE) or {}

    def forced_check_enabled(self) -> bool:
        """The simulator is checked (and its cost model refitted) at the forced points: it needs
        the step-timing fit, i.e. breakdown cells."""
        return bool(self.forced) and bool(self.breakdown)

    def forced_prompt_tables(self) -> list[str]:
        """The prompt tables of the forced cells (their prompt lengths price the simulator's check)."""
        return [self.prompt_table(m, d) for m in sorted(self.forced.get("models", []))
                for d in sorted(self.forced.get("datasets", []))]  # fmt: skip

    def sim_cost_model(self) -> str:
        """The cost model that prices the grid's simulations: refitted at the forced points when
        there are any, else the step-timing fit."""
        return P.FORCED_COST_MODEL if self.forced_check_enabled() else P.MEASURED_COST_MODEL

    def sim_power_cells(self) -> str:
        """``--engine E [--model M]``: the grid cells that fit the simulations' power model, those
        of the engine (and model, where there is one) whose breakdown steps fitted the cost model;
        a breakdown over several models fits one cost model over them all, and so one power model."""
        engines = sorted({c.engine for c in self.breakdown})
        models = sorted({c.model for c in self.breakdown})
        args = f"--engine {engines[0]}" if len(engines) == 1 else ""
        return args + (f" --model {models[0]}" if len(models) == 1 else "")

    # ------------------------------------------------------------------ breakdown
    def breakdown_group_spec(self, group: EngineGroup) -> dict[str, Any]:
        cells_ = self.breakdown_groups[group]
        return self._job_spec([resolve_breakdown_cell(self.config, c) for c in cells_], cells_, group)

    def breakdown_group_dir_of_cell(self, cell: Cell) -> str:
        return P.BREAKDOWN_GROUP_DIR.format(**self._breakdown_group_of[cell].as_dict())

    def breakdown_steps(self) -> list[str]:
        return [P.BREAKDOWN_STEPS.format(**asdict(c)) for c in self.breakdown]

    # ------------------------------------------------------------------ server mode
    def server_cell(self, group: ServerGroup) -> Cell:
        """The group's largest cell, of its first arm (sizes the job like an engine cell at that batch
        size; an interleaved job's estimate adds its other arms, sdbench.scheduling)."""
        return Cell(group.engine, group.model, self.server["datasets"][0], group.methods[0],
                    max(self.server["concurrency"]))  # fmt: skip

    def server_cells(self, group: ServerGroup) -> list[Cell]:
        """:meth:`server_cell` of each arm: an interleaved job's memory is its largest arm's."""
        cell = self.server_cell(group)
        return [Cell(cell.engine, cell.model, cell.dataset, m, cell.batch_size) for m in group.methods]

    def server_group_of(self, wildcards: dict[str, str]) -> ServerGroup:
        """The server job of a serve_group rule's wildcards."""
        for group in self.server_groups:
            if group.as_dict() == {k: wildcards.get(k) for k in group.as_dict()}:
                return group
        raise KeyError(f"no server job has wildcards {dict(wildcards)}")

    def server_output_patterns(self) -> list[str]:
        """The serve_group rule's outputs: the arm's directory (``{method}`` a wildcard), or with
        ``server.interleave`` every arm's (one job per engine x model writes them all)."""
        if not server_groups_interleaved(self.config):
            return [P.SERVER_GROUP_DIR]
        return [P.SERVER_GROUP_DIR.replace("{method}", m) for m in self.server["methods"]]

    def server_log_pattern(self, suffix: str, root: str = "logs") -> str:
        """A serve_group log's pattern: named by the method, or ``interleaved`` (servermode.INTERLEAVED)."""
        name = INTERLEAVED if server_groups_interleaved(self.config) else "{method}"
        return f"{root}/serve_group/{{engine}}/{{model}}/{name}{suffix}"

    def server_inputs(self, group: ServerGroup) -> dict[str, str]:
        """Prompt tables of the server section's datasets, each arm's drafter (``drafter_<method>``),
        the image's gate."""
        inputs = {f"prompts_{d}": self.prompt_table(group.model, d) for d in self.server["datasets"]}
        drafters = {f"drafter_{m}": self.drafter_dir(m, group.model) for m in group.methods}
        return {**inputs, **{k: v for k, v in drafters.items() if v}, **self.rehearsal_inputs(),
                **self.gate_input(group.engine)}  # fmt: skip

    def server_group_spec(self, group: ServerGroup) -> dict[str, Any]:
        return self.with_mode(resolve_server_group(self.config, group))

    def server_arm_dirs(self, group: ServerGroup) -> list[str]:
        """The job's output directories, one per arm, in its methods' order."""
        return [P.SERVER_GROUP_DIR.format(**group.arm_keys(m)) for m in group.methods]

    def server_group_dirs(self) -> list[str]:
        """Every arm's directory of every server job (what the analyses read)."""
        return [d for g in self.server_groups for d in self.server_arm_dirs(g)]

    def server_slos(self) -> dict[str, dict[str, float]]:
        """Dataset -> the latency targets its server cells' goodput is judged on (``server.slo``)."""
        return server_slos(self.config)

    # ------------------------------------------------------------------ the figure index
    def item_scopes(self, name: str) -> list[dict[str, str]]:
        """The wildcard values for which figure-index item ``name`` is drawn ([] if it is not)."""
        one: list[dict[str, str]] = [{}]
        sources = (["grid"] if self.traces else []) + (["published"] if self.published.get("datasets") else [])
        sim_scopes: list[str] = []
        adaptive_scopes: list[str] = []
        if self.priced_targets():
            sim_scopes += [f"{e}/{m}/{d}" for (e, m, d) in self.priced_targets()]
            adaptive_scopes += [f"{e}/{m}" for (e, m) in self.adaptive_cell_targets()]
        if self.published.get("datasets"):
            sim_scopes += ["published/exact", "published/compat"]
            adaptive_scopes.append("published")
        scopes: dict[str, list[dict[str, str]]] = {
            "ext00_verdict": one,
            "fig01_end_to_end": one,
            "tab01_generation_length": one,
            "ext01_speedups": one,
            "ext06_output_divergence": one,
            "ext02_acceptance_per_position": one,
            "tab02_memory": one,
            "fig03_runtime_breakdown": one if self.breakdown else [],
            "tab04_generated_length": [{"source": s} for s in sources],
            "fig06_request_acceptance": [{"source": s} for s in sources],
            "fig04_acceptance_heatmap": [{"scope": s} for s in self.acceptance_scopes()],
            "fig05_position_deciles": [{"scope": s} for s in self.acceptance_scopes()],
            "fig10_ngram_minus_eagle": [{"scope": s} for s in self.difference_scopes()],
            "fig08_bleu_measured": [{"engine": e, "model": m, "dataset": d} for (e, m, d) in self.bleu_targets()],
            "fig08_bleu_simulated": [
                {"published": d, "ngram_policy": p}
                for d in (self.published.get("datasets", []) if self.bleu else [])
                for p in (self.bleu or {}).get("published_ngram_policies", [])
            ],
            "fig09_fixed_vs_oracle": [{"scope": s} for s in sim_scopes],
            "fig11_oracle_combine": [{"scope": s} for s in sim_scopes],
            "ext03_compat_vs_exact": one if self.published.get("datasets") else [],
            "ext04_adaptive_policies": [{"scope": s} for s in adaptive_scopes],
            "ext05_simulated_vs_measured": one if self.priced_targets() else [],
            "ext07_cost": one if self.cost else [],
            "ext16_energy_per_token": one,
            "ext08_proposal_length": one if self.config.get("proposal_length") else [],
            "ext09_random_inputs": one if self.random_pairs else [],
            "ext10_temperature": one if self.config.get("temperature") else [],
            "ext11_latency_throughput": one if self.server_groups else [],
            "ext17_goodput_frontier": one if self.server_groups else [],
            "ext18_offline_vs_served": one if self.server_groups else [],
            "ext12_speed_bench_categories": one if self.speed_bench_cells() else [],
            "ext13_forced_acceptance": one if self.forced else [],
            "ext14_sd_gap": one if self.forced else [],
            "ext15_simulator_at_forced": one if self.forced_check_enabled() else [],
        }
        if name not in scopes:
            raise KeyError(f"figure-index item {name!r} has no scope rule in the plan")
        return scopes[name]

    def final_outputs(self) -> list[str]:
        """Every file of every figure-index item this config draws, in index order, and the
        offline traces (targets of their own)."""
        outputs = [
            paper_path(item.name, suffix, **scope)
            for item in ITEMS
            for scope in self.item_scopes(item.name)
            for suffix in item.files
        ]
        return outputs + self.offline_ngram_files() + self.offline_suffix_files()


def cli_value(value: Any) -> str:
    """A config value as a CLI word: YAML booleans (``compile: true``) become on / off."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return shlex.quote(str(value))


def profile_config(profile_dir: str) -> dict[str, Any]:
    """The ``config:`` entries (``KEY=VALUE``, YAML values) a Snakemake profile passes."""
    import yaml

    path = Path(profile_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"--profile {profile_dir}: no config.yaml there")
    entries = (yaml.safe_load(path.read_text()) or {}).get("config") or []
    out: dict[str, Any] = {}
    for entry in [entries] if isinstance(entries, str) else entries:
        key, sep, value = str(entry).partition("=")
        if not sep:
            raise ConfigError(f"{path}: config entry {entry!r} is not KEY=VALUE")
        out[key.strip()] = yaml.safe_load(value)
    return out


def _cmd_check_config(args: Any) -> int:
    """``sdbench check-config FILE [--profile DIR] [--jobs]``: validate and count; with a profile, also
    apply its config entries (a site's limits) and print how engine groups are split to fit; with
    ``--jobs``, every engine job's estimate and request (:func:`sdbench.schedulingsite.engine_jobs_table`)."""
    import yaml

    from sdbench.config import load_config, validate_config
    from sdbench.grid import _cmd_check

    if not args.profile and not args.jobs:
        return _cmd_check(args)
    load_config(args.config)  # errors name the file and key
    raw = yaml.safe_load(Path(args.config).read_text())
    entries = profile_config(args.profile) if args.profile else {}
    config = validate_config({**raw, **entries}, source=" + ".join(filter(None, [args.config, args.profile])))
    plan = Plan(config)
    for line in plan.site_notes:
        print(line)
    if args.jobs:
        limits = scheduling.site_limits(config)
        for line in schedulingsite.engine_jobs_table(schedulingsite.engine_jobs(plan), limits and limits.max_runtime):
            print(line)
    where = f" with {args.profile}" if args.profile else ""
    print(design_line(config))
    print(f"{args.config}{where}: valid; {len(plan.cells)} cells on {len(plan.groups)} engine groups")
    return 0


__all__ = ["BY_NAME", "NETWORK_RULES", "OFFLINE_SUFFIX_METHOD", "Plan", "cli_value", "quoted", "spec_file"]
