# Config loading, validation and input functions. The DAG derives from the grid
# expanded by sdbench.grid; rules below only wire files.
import json
import os
import shlex
import sys
from pathlib import Path

from sdbench.codedigest import code_digest
from sdbench.containers import image_identity
from sdbench.lifeline import export_workflow_env
from sdbench.config import validate_config
from sdbench.grid import (
    Cell,
    baseline_cells,
    breakdown_cells,
    baseline_method,
    cells,
    drafter_of,
    engine_group_of,
    engine_groups,
    models_used,
    resolve_breakdown_cell,
    resolve_cell,
    trace_targets,
)
from sdbench import scheduling
from sdbench.simulator import choices as simulator_choices

# Jobs call the `sdbench` CLI: make the one beside this interpreter (.venv/bin)
# visible even when the virtualenv is not activated.
os.environ["PATH"] = os.pathsep.join(
    [os.path.dirname(sys.executable), os.environ.get("PATH", "")]
)

# Fails before any job runs, naming the offending key.
validate_config(config, source="config")
# Engine jobs end when this workflow process ends (sdbench.lifeline), and their
# quiet-machine guard mode (sdbench.quietguard) comes from the config; neither is
# a param, so neither reruns anything.
export_workflow_env(config["quiet_guard"])
CELLS = cells(config)
BASELINE = baseline_method(config)
BUILT_MODELS = sorted(k for k, m in config["models"].items() if "build" in m)
HUB_MODELS = sorted(k for k, m in config["models"].items() if "hf_id" in m)
HEADS = sorted(k for k, m in config["models"].items() if "head" in m)


def _alternatives(names):
    return "|".join(sorted(map(str, names))) or "__none__"


wildcard_constraints:
    engine=_alternatives(config["engines"]),
    dataset=_alternatives(config["datasets"]),
    method=_alternatives(config["methods"]),
    batch_size=r"\d+",
    share=r"all|bs\d+",
    built_model=_alternatives(BUILT_MODELS),
    hub_model=_alternatives(HUB_MODELS),
    head=_alternatives(HEADS),
    published="gsm8k|instructcoder|sharegpt|cnn",
    mode="compat|exact",
    proposer="ngram|eagle|combined",
    ngram_policy=r"fixed-\d+|oracle",


CELL_DIR = "results/runs/{engine}/{model}/{dataset}/{method}/bs{batch_size}"
GROUP_DIR = "results/engines/{engine}/{model}/{method}/{share}"
GROUPS = engine_groups(config)


def _cell(wildcards):
    return Cell(
        wildcards.engine,
        wildcards.model,
        wildcards.dataset,
        wildcards.method,
        int(wildcards.batch_size),
    )


def model_dir(key):
    """Directory of a model: built by the pipeline or downloaded from the hub."""
    if key in BUILT_MODELS or key in HEADS:
        return f"results/models/built/{key}"
    return f"resources/hub/{key}"


def target_dir(wildcards):
    return model_dir(wildcards.model)


def drafter_inputs(wildcards):
    drafter = drafter_of(config, wildcards.method, wildcards.model)
    return {"drafter": model_dir(drafter)} if drafter else {}


def drafter_arg(wildcards, input):
    return (
        f"--drafter-dir {shlex.quote(input.drafter)}"
        if "drafter" in input.keys()
        else ""
    )


def _group(wildcards):
    from sdbench.grid import EngineGroup

    return EngineGroup(
        wildcards.engine, wildcards.model, wildcards.method, wildcards.share
    )


def group_inputs(wildcards):
    """Prompt tables of the group's datasets, and its drafter."""
    datasets = sorted({c.dataset for c in GROUPS[_group(wildcards)]})
    inputs = {
        f"prompts_{d}": f"results/prompts/{wildcards.model}/{d}.parquet"
        for d in datasets
    }
    return {**inputs, **drafter_inputs(wildcards)}


def group_spec(wildcards):
    """Resolved specs of the group's cells and their prompt tables (a param: any change reruns the group)."""
    cells_ = GROUPS[_group(wildcards)]
    spec = {
        "cells": [resolve_cell(config, c) for c in cells_],
        "prompts": {
            c.dataset: f"results/prompts/{wildcards.model}/{c.dataset}.parquet"
            for c in cells_
        },
    }
    return shlex.quote(json.dumps(spec, sort_keys=True))


def group_runtime(wildcards, attempt):
    return scheduling.group_runtime_minutes(config, GROUPS[_group(wildcards)], attempt)


def group_dir_of_cell(wildcards):
    g = engine_group_of(config, _cell(wildcards))
    return f"results/engines/{g.engine}/{g.model}/{g.method}/{g.share}"


def breakdown_spec(wildcards):
    """A breakdown cell's resolved spec as a shell-quoted JSON param (a changed entry
    reruns the cell)."""
    spec = resolve_breakdown_cell(config, _cell(wildcards))
    return shlex.quote(json.dumps(spec, sort_keys=True))


def cell_container(wildcards):
    return config["engines"][wildcards.engine].get("container")


def cell_image(wildcards):
    """Identity of the engine's image (a param: a new image reruns exactly its cells)."""
    return image_identity(
        cell_container(wildcards), Path(workflow.basedir) / "containers"
    )


def _engine_cell(wildcards):
    """The (largest) cell of an engine job; trace jobs run at the trace batch size."""
    if "share" in wildcards.keys():
        return max(GROUPS[_group(wildcards)], key=lambda c: c.batch_size)
    batch_size = wildcards.get("batch_size", TRACE_SETTINGS.get("max_num_seqs", 8))
    return Cell(
        wildcards.engine,
        wildcards.model,
        wildcards.dataset,
        wildcards.method,
        int(batch_size),
    )


def cell_gpus(wildcards):
    """GPUs for a cell = the target's tensor-parallel size (0 on CPU engines)."""
    return scheduling.cell_gpus(config, _engine_cell(wildcards))


def cell_mem_mb(wildcards):
    return scheduling.cell_mem_mb(config, _engine_cell(wildcards))


def cell_runtime(wildcards, attempt):
    """Wall-time limit (minutes), scaled by output length and batch size, per retry."""
    return scheduling.cell_runtime_minutes(config, _engine_cell(wildcards), attempt)


# A timed engine job takes every core Snakemake may use here (--cores), so that
# nothing runs beside it on a workstation. Under a batch scheduler each job gets
# its own allocation: the profile sets its CPUs (set-threads / cpus_per_gpu).
TIMED_THREADS = workflow.resource_settings.cores or 1


def build_args(wildcards):
    """CLI options of `sdbench train-model` from the model's build entry."""
    build = config["models"][wildcards.built_model]["build"]
    return " ".join(
        f"--{k.replace('_', '-')} {shlex.quote(str(v))}"
        for k, v in sorted(build.items())
    )


def build_threads(wildcards):
    # One thread: a second barely shortens a step of the small models (and spins when
    # the cores are shared), while the target and draft train side by side on two cores.
    return config["models"][wildcards.built_model]["build"].get("threads", 1)


def head_target(wildcards):
    return model_dir(config["models"][wildcards.head]["head"]["target"])


def head_args(wildcards):
    """CLI options of `sdbench train-head` from the head's entry (its target is an input)."""
    head = {
        k: v
        for k, v in config["models"][wildcards.head]["head"].items()
        if k not in ("target", "threads")
    }
    return " ".join(
        f"--{k.replace('_', '-')} {' '.join(map(shlex.quote, map(str, v))) if isinstance(v, list) else shlex.quote(str(v))}"
        for k, v in sorted(head.items())
    )


def head_threads(wildcards):
    return config["models"][wildcards.head]["head"].get("threads", 1)


def dataset_entry(wildcards):
    return shlex.quote(
        json.dumps(config["datasets"][wildcards.dataset], sort_keys=True)
    )


def chat_template_kwargs(wildcards):
    kwargs = config["models"][wildcards.model].get("chat_template_kwargs", {})
    return shlex.quote(json.dumps(kwargs, sort_keys=True))


def hub_revision(wildcards):
    return config["models"][wildcards.hub_model].get("revision", "main")


def hub_id(wildcards):
    return config["models"][wildcards.hub_model]["hf_id"]


def cell_outputs(name):
    """Paths of one per-cell table for every cell of the grid."""
    return [
        f"results/runs/{c.engine}/{c.model}/{c.dataset}/{c.method}/bs{c.batch_size}/{name}.parquet"
        for c in CELLS
    ]


def final_outputs():
    outputs = [
        "results/tables/cells.parquet",
        "results/tables/generation_lengths.md",
        "results/figures/throughput.png",
        "results/tables/memory.parquet",
        "results/tables/output_divergence.parquet",
    ]
    if TRACES:
        outputs += ["results/acceptance/grid/table4.md", *offline_ngram_files()]
    outputs += [
        f"results/bleu/{e}/{m}/{d}/fig8_measured.png" for (e, m, d) in bleu_targets()
    ]
    if BREAKDOWN:
        outputs.append("results/figures/breakdown.png")
    if BREAKDOWN and validation_targets():
        outputs.append("results/tables/simulated_vs_measured.md")
        outputs += [
            f"results/simulator/cells/{e}/{m}/adaptive"
            for (e, m) in adaptive_cell_targets()
        ]
        outputs += [
            f"results/simulator/cells/{e}/{m}/{d}/figures"
            for (e, m, d) in validation_targets()
        ]
    if PUBLISHED.get("datasets"):
        outputs += [
            "results/simulator/published/exact/figures",
            "results/simulator/published/compat/figures",
            "results/simulator/published/compare",
            "results/simulator/published/adaptive",
        ]
    if PUBLISHED.get("datasets"):
        outputs.append("results/acceptance/published/table4.md")
    if PUBLISHED.get("datasets") and BLEU:
        outputs += [
            f"results/bleu/published/{d}/fig8_ngram-{p}.png"
            for d in PUBLISHED["datasets"]
            for p in BLEU.get("published_ngram_policies", [])
        ]
    return outputs


TRACES = trace_targets(config)
TRACE_SETTINGS = config.get("traces", {})
BASELINE_CELLS = {(c.engine, c.model, c.dataset): c for c in baseline_cells(config)}
PUBLISHED = config.get("published_traces", {})
TRACE_DIR = "results/traces/{engine}/{model}/{dataset}"


def trace_spec(wildcards):
    """Cell spec of a trace run: the method's entry on the grid's engine/model/dataset."""
    cell = Cell(
        wildcards.engine,
        wildcards.model,
        wildcards.dataset,
        wildcards.method,
        TRACE_SETTINGS["max_num_seqs"],
    )
    spec = resolve_cell(config, cell, pairing=False)
    return shlex.quote(json.dumps(spec, sort_keys=True))


def baseline_requests(wildcards):
    """No-SD greedy outputs (smallest batch size) of an engine x model x dataset."""
    c = BASELINE_CELLS[(wildcards.engine, wildcards.model, wildcards.dataset)]
    return f"results/runs/{c.engine}/{c.model}/{c.dataset}/{c.method}/bs{c.batch_size}/requests.parquet"


def engine_trace_files():
    return [
        f"results/traces/{t.engine}/{t.model}/{t.dataset}/{t.method}/engine_trace.parquet"
        for t in TRACES
    ]


def engine_trace_labels():
    return " ".join(shlex.quote(f"{t.model}/{t.dataset}") for t in TRACES)


def offline_ngram_files():
    return [
        f"results/traces/{e}/{m}/{d}/offline_ngram.parquet"
        for (e, m, d) in sorted(BASELINE_CELLS)
    ]


def published_trace_files():
    return [
        f"results/traces/published/{d}.parquet" for d in PUBLISHED.get("datasets", [])
    ]


def published_local_arg(wildcards):
    local = PUBLISHED.get("local_dir")
    return f"--local-dir {shlex.quote(local)}" if local else ""


def memory_model_names():
    """Model key -> what `sdbench memory` loads: the repo id, or the built model's directory."""
    names = {
        k: model_dir(k) if k in BUILT_MODELS or k in HEADS else m["hf_id"]
        for k, m in config["models"].items()
    }
    return shlex.quote(json.dumps(names, sort_keys=True))


def built_model_dirs():
    return [model_dir(k) for k in BUILT_MODELS + HEADS if k in models_used(config)]


BLEU = config.get("bleu")


def bleu_targets():
    """Engine x model x dataset where the grid runs both BLEU-compared methods."""
    if not BLEU:
        return []
    have = {(c.engine, c.model, c.dataset, c.method) for c in CELLS}
    return [
        k
        for k in sorted(BASELINE_CELLS)
        if (*k, BLEU["ngram"]) in have and (*k, BLEU["versus"]) in have
    ]


def bleu_calls(wildcards):
    methods = {BASELINE, BLEU["ngram"], BLEU["versus"]}
    return [
        f"results/runs/{c.engine}/{c.model}/{c.dataset}/{c.method}/bs{c.batch_size}/calls.parquet"
        for c in CELLS
        if (c.engine, c.model, c.dataset)
        == (wildcards.engine, wildcards.model, wildcards.dataset)
        and c.method in methods
    ]


BREAKDOWN = breakdown_cells(config)
BREAKDOWN_DIR = "results/breakdown/{engine}/{model}/{dataset}/{method}/bs{batch_size}"


def breakdown_steps():
    return [
        f"results/breakdown/{c.engine}/{c.model}/{c.dataset}/{c.method}/bs{c.batch_size}/steps.parquet"
        for c in BREAKDOWN
    ]


SIMULATOR = config.get("simulator", {})


def sim_policies(wildcards):
    return " ".join(
        simulator_choices.published_policies(config, wildcards.proposer, wildcards.mode)
    )


def published_jsonl():
    return [
        f"resources/published-traces/llama3.1-8B/combined_{d}.jsonl"
        for d in PUBLISHED.get("datasets", [])
    ]


def validation_targets():
    """Engine x model x dataset with in-engine traces of an n-gram method and of learned
    drafters: {"ngram": method, "drafters": [methods], "drafter": the preferred one}."""
    kinds = {}
    for t in TRACES:
        entry = kinds.setdefault((t.engine, t.model, t.dataset), {"drafters": []})
        if config["methods"][t.method]["method"] == "ngram":
            entry["ngram"] = t.method
        else:
            entry["drafters"].append(t.method)
    # The simulator's learned proposer is the paper's EAGLE where it was traced.
    preference = {"eagle": 0, "eagle3": 1}
    for entry in kinds.values():
        entry["drafters"].sort(
            key=lambda m: (preference.get(config["methods"][m]["method"], 2), m)
        )
        if entry["drafters"]:
            entry["drafter"] = entry["drafters"][0]
    return {k: v for k, v in sorted(kinds.items()) if "ngram" in v and "drafter" in v}


def sim_trace_inputs(wildcards):
    target = validation_targets()[
        (wildcards.engine, wildcards.model, wildcards.dataset)
    ]
    base = f"results/traces/{wildcards.engine}/{wildcards.model}/{wildcards.dataset}"
    methods = sorted([target["ngram"], *target["drafters"]])
    return {
        "traces": [f"{base}/{m}/engine_trace.parquet" for m in methods],
        "requests": f"{base}/{target['ngram']}/engine_requests.parquet",
    }


def sim_preferred_drafter(wildcards):
    """The vLLM method of the drafter the learned proposer replays on this dataset."""
    key = (wildcards.engine, wildcards.model, wildcards.dataset)
    return config["methods"][validation_targets()[key]["drafter"]]["method"]


def sim_drafter(wildcards):
    """The vLLM method of a traced drafter (what its trace rows are named)."""
    return config["methods"][wildcards.method]["method"]


def sim_cell_policies(wildcards):
    return " ".join(simulator_choices.cell_policies(config, wildcards.proposer))


def sim_drafter_policies(wildcards):
    return " ".join(simulator_choices.cell_policies(config, "eagle"))


def sim_cell_batch_sizes(wildcards):
    key = (wildcards.engine, wildcards.model, wildcards.dataset)
    return " ".join(
        str(b)
        for b in sorted(
            {c.batch_size for c in CELLS if (c.engine, c.model, c.dataset) == key}
        )
    )


def sim_cell_files():
    """Simulations validated against the measured cells: n-gram, and every traced drafter
    that the fitted cost model prices (its method ran in breakdown mode)."""
    breakdown = config.get("breakdown", {}).get("methods", [])
    priced = {config["methods"][m]["method"] for m in breakdown}
    files = []
    for (e, m, d), target in validation_targets().items():
        files.append(f"results/simulator/cells/{e}/{m}/{d}/ngram.csv")
        files += [
            f"results/simulator/cells/{e}/{m}/{d}/drafters/{x}.csv"
            for x in target["drafters"]
            if config["methods"][x]["method"] in priced
        ]
    return files


def adaptive_cell_targets():
    """Engine x model -> datasets with both in-engine traces (adaptive policies on the grid)."""
    out = {}
    for e, m, d in validation_targets():
        out.setdefault((e, m), []).append(d)
    return out


def adaptive_cell_inputs(wildcards):
    datasets = adaptive_cell_targets()[(wildcards.engine, wildcards.model)]
    base = f"results/simulator/cells/{wildcards.engine}/{wildcards.model}"
    ngram = {k: v["ngram"] for k, v in validation_targets().items()}
    return {
        "stacked": [f"{base}/{d}/{d}.parquet" for d in datasets],
        "requests": [
            f"results/traces/{wildcards.engine}/{wildcards.model}/{d}/"
            f"{ngram[(wildcards.engine, wildcards.model, d)]}/engine_requests.parquet"
            for d in datasets
        ],
    }


def adaptive_cell_args(wildcards):
    """Batch sizes of the grid and the policies (the learned one needs another dataset)."""
    key = (wildcards.engine, wildcards.model)
    sizes = sorted({c.batch_size for c in CELLS if (c.engine, c.model) == key})
    specs = simulator_choices.adaptive_policies(
        config, len(adaptive_cell_targets()[key])
    )
    return f"--batch-sizes {' '.join(map(str, sizes))} --policies {' '.join(specs)}"


def methods_json():
    return shlex.quote(json.dumps(config["methods"], sort_keys=True))
