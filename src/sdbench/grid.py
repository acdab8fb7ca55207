"""The benchmark grid: config blocks expanded into cells.

A cell is engine x model x method x dataset x batch size. The Snakemake DAG and
the aggregation both derive from :func:`cells`, so adding a model or method is a
config edit only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from sdbench.config import DRAFTER_METHODS, ConfigError, load_config
from sdbench import sweeps
from sdbench.sweeps import is_sampled
from sdbench.engine.release.versions import unsupported_reason

CELL_KEYS = ("engine", "model", "dataset", "method", "batch_size")


@dataclass(frozen=True, order=True)
class Cell:
    """One benchmark cell."""

    engine: str
    model: str
    dataset: str
    method: str
    batch_size: int

    def as_dict(self) -> dict[str, Any]:
        """The cell's keys as a plain dict (Snakemake wildcards use these names)."""
        return asdict(self)


def cells(config: dict[str, Any]) -> list[Cell]:
    """All cells of a validated config, deduplicated and sorted.

    Raises :class:`ConfigError` naming the grid block when a method cannot run on
    its engine (e.g. draft_model on upstream vLLM 0.10.1.1).
    """
    out: set[Cell] = set()
    problems: list[str] = []
    for i, block in enumerate(config["grid"]):
        engine = config["engines"][block["engine"]]
        for method_name in block["methods"]:
            reason = unsupported_reason(engine, config["methods"][method_name]["method"])
            if reason:
                problems.append(f"grid[{i}]: method {method_name!r} on engine {block['engine']!r}: {reason}")
        for model in block["models"]:
            for dataset in block["datasets"]:
                for method in block["methods"]:
                    for bs in block["batch_sizes"]:
                        out.add(Cell(block["engine"], model, dataset, method, int(bs)))
    if problems:
        raise ConfigError("config: invalid grid:\n  " + "\n  ".join(problems))
    trimmed: set[tuple[str, str, str, str, int]] = set()
    if config.get("kv_capacity") == "trim":  # cells whose batch cannot fit the KV cache
        from sdbench.analysis.memory import trimmed_cells

        trimmed = trimmed_cells(config)
    return sorted(c for c in out if (c.engine, c.model, c.dataset, c.method, c.batch_size) not in trimmed)


def cells_frame(config: dict[str, Any]) -> pd.DataFrame:
    """The cells as a DataFrame with columns :data:`CELL_KEYS`."""
    return pd.DataFrame([c.as_dict() for c in cells(config)], columns=list(CELL_KEYS))


def drafter_of(config: dict[str, Any], method: str, model: str) -> str | None:
    """The draft model key a method uses with target ``model`` (``None`` if it has none)."""
    entry = config["methods"][method]
    if entry["method"] not in DRAFTER_METHODS:
        return None
    return entry["drafter"][model]


def tokenizer_model(config: dict[str, Any], model: str) -> str:
    """The model whose tokenizer tokenizes ``model``'s prompts: an MTP model's target (its MiMo
    config says model type qwen2, for which transformers substitutes its own Qwen2 tokenizer
    class, which splits text differently), else the model itself."""
    head = config["models"][model].get("head", {})
    return head["target"] if head.get("kind") == "mtp" else model


def baseline_method(config: dict[str, Any]) -> str:
    """The key of the no-SD method entry (``method: none``)."""
    names = [k for k, v in config["methods"].items() if v["method"] == "none" and "sweep_of" not in v]
    if len(names) != 1:
        raise ConfigError(f"methods: exactly one entry must have method 'none' (found {names})")
    return names[0]


def models_used(config: dict[str, Any]) -> list[str]:
    """Every model key a cell needs, targets and drafters, sorted."""
    used: set[str] = set()
    for cell in cells(config):
        used.add(cell.model)
        drafter = drafter_of(config, cell.method, cell.model)
        if drafter:
            used.add(drafter)
    return sorted(used)


def resolve_cell(config: dict[str, Any], cell: Cell, pairing: bool = True) -> dict[str, Any]:
    """Everything a run-cell job needs, resolved from the config (JSON-serialisable).

    Snakemake passes this as a rule param, so editing any entry a cell uses
    (its engine, model, method, dataset or run settings) reruns exactly that cell.
    Model directories are rule inputs, not part of the spec. With ``pairing`` (and
    ``run.paired_baseline``) an SD cell's spec names the no-SD entry it is timed against.
    A dataset's ``temperature`` enters the spec only where its entry sets one, so greedy
    cells keep the spec (and the Snakemake params) they had before temperatures existed.
    """
    dataset = config["datasets"][cell.dataset]
    spec = {
        "cell": cell.as_dict(),
        "seed": config.get("seed", 42),
        "engine": config["engines"][cell.engine],
        "model": config["models"][cell.model],
        "method": config["methods"][cell.method],
        "drafter": drafter_of(config, cell.method, cell.model),
        "dataset": {k: dataset[k] for k in ("max_tokens", "num_prompts", "temperature") if k in dataset},
        "run": config.get("run", {}),
    }
    forced = sweeps.forced_run(config, cell.method)
    if forced:  # forced acceptance: outputs are not the greedy ones; both arms run to max_tokens
        spec["run"] = {**spec["run"], **forced}
    base = baseline_method(config)
    if pairing and config.get("run", {}).get("paired_baseline") and cell.method != base:
        # Timed in pairs with a no-SD engine in the same process (sdbench.engine.measure.paired).
        spec["paired_baseline"] = {"key": base, "method": config["methods"][base]}
    return spec


def resolve_breakdown_cell(config: dict[str, Any], cell: Cell) -> dict[str, Any]:
    """A breakdown cell's spec: the cell's, with ``breakdown.repeats`` trials and no pairing.

    Its per-step stage timings are what it is for (the grid measures its throughput), so
    it runs alone on its engine and the pairing and trial settings of ``run`` do not apply.
    """
    spec = resolve_cell(config, cell, pairing=False)
    skip = ("paired_baseline", "engine_starts", "target_half_width")
    run = {k: v for k, v in spec["run"].items() if k not in skip}
    spec["run"] = {**run, "repeats": config["breakdown"].get("repeats", 1), "min_measured_s": 0}
    return spec


@dataclass(frozen=True, order=True)
class EngineGroup:
    """Cells measured on one engine: same engine, model and method (and engine arguments); a
    method's forced-acceptance points have one group of their own (:func:`engine_group_of`).

    In replicate mode (the paper's protocol, as in the authors' driver
    ``scripts/bench_latency.py``: one ``LLM`` per configuration, batch sizes looped
    over by replicating each prompt batch-size times) every dataset and batch size
    shares the engine, started with ``max_num_seqs`` = the largest batch size. In
    distinct mode ``max_num_seqs`` is what bounds the running batch, so each batch
    size needs its own engine (``share`` = ``bs<N>``).
    """

    engine: str
    model: str
    method: str
    share: str  # "all" or "bs<N>"

    def as_dict(self) -> dict[str, str]:
        """The group's keys (Snakemake wildcards use these names)."""
        return asdict(self)


#: Suffix of the ``share`` of the group a sweep's cells run in beside their method's own group.
SWEEP_SHARES = {sweeps.FORCED_ACCEPTANCE: "-forced", sweeps.TEMPERATURE: "-temperature"}


def engine_group_of(config: dict[str, Any], cell: Cell) -> EngineGroup:
    """The engine group a cell is measured in.

    A sweep's cells that run with their method's engine arguments get one engine per method
    beside the method's own group (share ``<share>-forced``, ``<share>-temperature``), so that
    the grid's cells, and the verdict written from them, never wait for a sweep. A method's forced
    points share that engine: sdbench.engine.measure.forcing switches the length cell by cell.
    """
    distinct = config.get("run", {}).get("batch_mode", "replicate") == "distinct"
    share = f"bs{cell.batch_size}" if distinct else "all"
    base = sweeps.forced_base(config, cell.method)
    if base != cell.method:
        share += SWEEP_SHARES[sweeps.FORCED_ACCEPTANCE]
    elif "sweep_of" in config["datasets"][cell.dataset]:  # a temperature variant
        share += SWEEP_SHARES[sweeps.TEMPERATURE]
    return EngineGroup(cell.engine, cell.model, base, share)


def engine_groups(config: dict[str, Any]) -> dict[EngineGroup, list[Cell]]:
    """Every engine group of the grid with its cells (sorted by method, dataset, batch size)."""
    groups: dict[EngineGroup, list[Cell]] = {}
    for cell in cells(config):
        groups.setdefault(engine_group_of(config, cell), []).append(cell)
    return {g: sorted(cs, key=lambda c: (c.method, c.dataset, c.batch_size)) for g, cs in sorted(groups.items())}


@dataclass(frozen=True, order=True)
class TraceTarget:
    """An in-engine trace: one SD method on one engine x model x dataset."""

    engine: str
    model: str
    dataset: str
    method: str


def trace_targets(config: dict[str, Any]) -> list[TraceTarget]:
    """Traced methods (``traces.methods``) wherever the grid runs them on greedy datasets, sorted
    (a trace commits the greedy token; sampled datasets are not traced)."""
    wanted = set(config.get("traces", {}).get("methods", []))
    return sorted(
        {
            TraceTarget(c.engine, c.model, c.dataset, c.method)
            for c in cells(config)
            if c.method in wanted and not is_sampled(config, c.dataset)
        }
    )


@dataclass(frozen=True, order=True)
class TraceGroup:
    """In-engine traces sharing one engine: one SD method on one engine x model, every traced
    dataset (a trace engine's arguments -- ``traces.num_speculative_tokens`` and
    ``max_num_seqs`` -- do not depend on the dataset)."""

    engine: str
    model: str
    method: str

    def as_dict(self) -> dict[str, str]:
        """The group's keys (Snakemake wildcards use these names)."""
        return asdict(self)


def trace_group_of(target: TraceTarget) -> TraceGroup:
    """The trace group a trace is run in."""
    return TraceGroup(target.engine, target.model, target.method)


def trace_groups(config: dict[str, Any]) -> dict[TraceGroup, list[TraceTarget]]:
    """Every trace group with its traces (sorted by dataset)."""
    groups: dict[TraceGroup, list[TraceTarget]] = {}
    for target in trace_targets(config):
        groups.setdefault(trace_group_of(target), []).append(target)
    return {g: sorted(ts) for g, ts in sorted(groups.items())}


def baseline_cells(config: dict[str, Any]) -> list[Cell]:
    """Per engine x model x greedy dataset, the no-SD cell at the smallest batch size (its
    greedy outputs feed the offline tracer and BLEU; sampled datasets have none)."""
    base = baseline_method(config)
    smallest: dict[tuple[str, str, str], Cell] = {}
    for c in cells(config):
        if is_sampled(config, c.dataset):
            continue
        key = (c.engine, c.model, c.dataset)
        if c.method == base and (key not in smallest or c.batch_size < smallest[key].batch_size):
            smallest[key] = c
    return [smallest[k] for k in sorted(smallest)]


def breakdown_cells(config: dict[str, Any]) -> list[Cell]:
    """Grid cells re-run in breakdown mode: those matching ``breakdown`` methods, datasets, batch
    sizes and (when given) engine and models, on greedy datasets (the cost model is fitted to
    greedy steps)."""
    spec = config.get("breakdown")
    if not spec:
        return []
    chosen = [
        c
        for c in cells(config)
        if c.method in spec["methods"]
        and c.dataset in spec["datasets"]
        and c.batch_size in spec["batch_sizes"]
        and c.model in spec.get("models", [c.model])
        and c.engine == spec.get("engine", c.engine)
        and not is_sampled(config, c.dataset)
    ]
    # Their step timings fit one cost model, of one target (sdbench.simulator.costmodel.one_target).
    pairs = sorted({(c.engine, c.model) for c in chosen})
    if len(pairs) > 1:
        named = ", ".join(f"{e}/{m}" for e, m in pairs)
        raise ConfigError(
            f"config: breakdown: its cells are of {len(pairs)} engine x model pairs ({named}); the step timings fit "
            "one cost model, of one engine and one model: set breakdown.engine and one breakdown.models entry"
        )
    return chosen


def breakdown_groups(config: dict[str, Any]) -> dict[EngineGroup, list[Cell]]:
    """Breakdown cells by the engine they share (grouped as the grid's cells are, see
    :class:`EngineGroup`), sorted by dataset and batch size."""
    groups: dict[EngineGroup, list[Cell]] = {}
    for cell in breakdown_cells(config):
        groups.setdefault(engine_group_of(config, cell), []).append(cell)
    # The group's own method first, then its forced-acceptance points.
    return {
        g: sorted(cs, key=lambda c: (c.method != g.method, c.method, c.dataset, c.batch_size))
        for g, cs in sorted(groups.items())
    }


def design_line(config: dict[str, Any]) -> str:
    """What the config's replication supports (``sdbench check-config``): the speedup's interval is
    taken over engine starts (sdbench.analysis.intervals), so one start per arm gives none."""
    run = config.get("run", {})
    starts, trials = int(run.get("engine_starts", 1)), int(run.get("repeats", 1))
    more = f" to {run.get('max_repeats')}" if run.get("target_half_width") else ""
    paired = "paired (no SD in the same process)" if run.get("paired_baseline") else "unpaired"
    margin = float(config.get("verdict", {}).get("equivalence_margin", 0.03))
    head = f"design: {starts} engine start(s) per group x {trials}{more} trial(s) per start, {paired}"
    if starts < 2:
        return (f"{head}: no interval over starts, every SD point is 'not judged' "
                "(run.engine_starts >= 3 gives one; sdbench bench coverage)")  # fmt: skip
    return (f"{head}: speedups with a t interval on {starts - 1} degree(s) of freedom; "
            f"break-even inside [{1 / (1 + margin):.3f}, {1 + margin:.3f}]")  # fmt: skip


def _cmd_check(args: Any) -> int:
    config = load_config(args.config)
    import sys

    from sdbench.analysis.memory import check_kv_capacity

    mode = config.get("kv_capacity", "refuse")
    short = check_kv_capacity(config)
    for line in short:  # one line per cell
        print(f"{args.config}: kv_capacity {mode}: {line}", file=sys.stderr if mode == "refuse" else sys.stdout)
    if short and mode == "refuse":
        print(f"error: {args.config}: {len(short)} cell(s) cannot fit the KV cache (kv_capacity: refuse; "
              "kv_capacity: trim drops them)", file=sys.stderr)
        return 1
    grid = cells(config)
    print(design_line(config))
    print(f"{args.config}: valid; {len(grid)} cells")
    return 0
