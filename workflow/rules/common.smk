# Config loading, validation and input functions. The DAG derives from the grid
# expanded by sdbench.grid; rules below only wire files.
import json
import os
import re
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

from sdbench.codedigest import code_digest
from sdbench.containers import image_identity
from sdbench.lifeline import export_workflow_env
from sdbench.config import validate_config
from sdbench.grid import (
    Cell,
    baseline_cells,
    breakdown_cells,
    breakdown_groups,
    baseline_method,
    cells,
    drafter_of,
    engine_group_of,
    engine_groups,
    models_used,
    resolve_breakdown_cell,
    resolve_cell,
    tokenizer_model,
    TraceGroup,
    TraceTarget,
    trace_group_of,
    trace_groups,
    trace_targets,
)
from sdbench import scheduling, sweeps
from sdbench.figureindex import BY_NAME as PAPER_ITEMS
from sdbench.figureindex import paper_path, published_scope
from sdbench.servermode import ServerGroup, resolve_server_group, server_groups
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
    return "|".join(re.escape(n) for n in sorted(map(str, names))) or "__none__"


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
    source="grid|published",


def paper_report(name, suffix=None, subcategory=None):
    """An item of the figure index (sdbench.figureindex) as a report() output: its path,
    its caption workflow/report/<name>.rst and its paper section."""
    item = PAPER_ITEMS[name]
    return report(
        paper_path(name, suffix),
        caption=f"../report/{name}.rst",
        category=item.section,
        subcategory=subcategory or item.paper or "Beyond the paper",
    )


PROMPTS = "results/prompts/{model}/{dataset}.parquet"
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


def prompt_tokenizer_dir(wildcards):
    return model_dir(tokenizer_model(config, wildcards.model))


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


def _prompt_tables(cells_):
    """Dataset -> prompt table of each cell (a temperature variant reads its base's)."""
    return {
        c.dataset: PROMPTS.format(
            model=c.model, dataset=sweeps.prompt_dataset(config, c.dataset)
        )
        for c in cells_
    }


def engine_job_inputs(wildcards, cells_):
    """Inputs of a job running ``cells_`` on one engine: their prompt tables and the drafter."""
    inputs = {
        f"prompts_{Path(table).stem}": table
        for table in _prompt_tables(cells_).values()
    }
    return {**inputs, **drafter_inputs(wildcards)}


def engine_job_spec(specs, cells_):
    """A shell-quoted JSON param of resolved cell specs and their prompt tables (any change
    reruns the job)."""
    spec = {"cells": specs, "prompts": _prompt_tables(cells_)}
    return shlex.quote(json.dumps(spec, sort_keys=True))


def group_inputs(wildcards):
    return engine_job_inputs(wildcards, GROUPS[_group(wildcards)])


def group_spec(wildcards):
    cells_ = GROUPS[_group(wildcards)]
    return engine_job_spec([resolve_cell(config, c) for c in cells_], cells_)


def group_runtime(wildcards, attempt):
    return scheduling.group_runtime_minutes(config, GROUPS[_group(wildcards)], attempt)


def group_dir_of_cell(wildcards):
    g = engine_group_of(config, _cell(wildcards))
    return f"results/engines/{g.engine}/{g.model}/{g.method}/{g.share}"


def cell_container(wildcards):
    return config["engines"][wildcards.engine].get("container")


def cell_image(wildcards):
    """Identity of the engine's image (a param: a new image reruns exactly its cells)."""
    return image_identity(
        cell_container(wildcards), Path(workflow.basedir) / "containers"
    )


def _engine_cell(wildcards):
    """The cell that sizes an engine job: a group's largest (run and breakdown groups), or a
    trace group's first (its traces differ only by prompts, all at the trace batch size).
    """
    if "share" in wildcards.keys():
        return max(GROUPS[_group(wildcards)], key=lambda c: c.batch_size)
    return _trace_cells(wildcards)[0]


def cell_gpus(wildcards):
    """GPUs for a cell = the target's tensor-parallel size (0 on CPU engines)."""
    return scheduling.cell_gpus(config, _engine_cell(wildcards))


def cell_mem_mb(wildcards):
    return scheduling.cell_mem_mb(config, _engine_cell(wildcards))


# A timed engine job takes every core Snakemake may use here (--cores), so that
# nothing runs beside it on a workstation. Under a batch scheduler each job gets
# its own allocation: the profile sets its CPUs (set-threads / cpus_per_gpu).
TIMED_THREADS = workflow.resource_settings.cores or 1


def cli_value(value):
    """A config value as a CLI word: YAML booleans (`compile: true`) become on / off."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return shlex.quote(str(value))


def build_args(wildcards):
    """CLI options of `sdbench train-model` from the model's build entry."""
    build = config["models"][wildcards.built_model]["build"]
    return " ".join(
        f"--{k.replace('_', '-')} {cli_value(v)}" for k, v in sorted(build.items())
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
        f"--{k.replace('_', '-')} {' '.join(map(cli_value, v)) if isinstance(v, list) else cli_value(v)}"
        for k, v in sorted(head.items())
    )


def head_threads(wildcards):
    return config["models"][wildcards.head]["head"].get("threads", 1)


# SPEED-Bench's layout with the pipeline's own prompts (sdbench speed-bench-sample), for a
# dataset whose local_path names it.
SPEED_BENCH_SAMPLE = "results/datasets/speed-bench-sample"


def prepare_inputs(wildcards):
    """The tokenizer, for a random_tokens dataset the same model's matched prompt table, the
    SPEED-Bench stand-in directory when the dataset reads it, and a user's prompts file.
    """
    inputs = {"tokenizer": prompt_tokenizer_dir(wildcards)}
    entry = config["datasets"][wildcards.dataset]
    if entry["source"] == "random_tokens":
        inputs["matched"] = PROMPTS.format(
            model=wildcards.model, dataset=entry["matched_to"]
        )
    if entry.get("local_path") == SPEED_BENCH_SAMPLE:
        inputs["sample"] = SPEED_BENCH_SAMPLE
    if entry["source"] == "file":  # your prompts file: an edit reruns its prompt tables
        inputs["prompts_file"] = entry["path"]
    return inputs


def speed_bench_cells():
    """SD cells on SPEED-Bench datasets (builder speed_bench): the per-category acceptance
    table's inputs."""
    return [
        c
        for c in CELLS
        if config["datasets"][c.dataset].get("builder") == "speed_bench"
        and config["methods"][c.method]["method"] != "none"
    ]


def _per_request_counters(cell):
    from sdbench.engine.versions import quirks_for

    version = config["engines"][cell.engine]["vllm_version"]
    return quirks_for(version).per_request_spec_metrics


def speed_bench_inputs(wildcards):
    """Per-request counters where the engine records them (vLLM >= 0.32), else the cells'
    replicate-mode calls (one prompt per call); and the datasets' prompt tables."""
    cells_ = speed_bench_cells()
    return {
        "requests": [
            cell_file(c, "requests") for c in cells_ if _per_request_counters(c)
        ],
        "calls": [
            cell_file(c, "calls") for c in cells_ if not _per_request_counters(c)
        ],
        "prompts": sorted(
            {PROMPTS.format(model=c.model, dataset=c.dataset) for c in cells_}
        ),
    }


def category_counter_args(wildcards, input):
    args = [f"--requests {' '.join(input.requests)}" if input.requests else ""]
    args.append(f"--calls {' '.join(input.calls)}" if input.calls else "")
    return " ".join(a for a in args if a)


def matched_arg(wildcards, input):
    return (
        f"--matched {shlex.quote(input.matched)}" if "matched" in input.keys() else ""
    )


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


def cell_file(cell, name):
    """A per-cell table (requests, calls, summary, ...) of one cell."""
    return os.path.join(CELL_DIR.format(**asdict(cell)), f"{name}.parquet")


def cell_outputs(name):
    """Paths of one per-cell table for every cell of the grid."""
    return [cell_file(c, name) for c in CELLS]


def verdict_inputs(wildcards):
    """The joined cells, and the server-mode table when the config has a server section."""
    inputs = {"cells": "results/tables/cells.parquet"}
    if SERVER_GROUPS:
        inputs["server"] = "results/tables/server.parquet"
    return inputs


def method_labels():
    """Method key -> the config's label (the verdict's words), as a shell-quoted JSON param."""
    labels = {k: m.get("label", k) for k, m in sorted(config["methods"].items())}
    return shlex.quote(json.dumps(labels, sort_keys=True))


def sweep_variants():
    """Keys only a sweep runs (sdbench.sweeps.variant_keys), as a shell-quoted JSON param."""
    return shlex.quote(json.dumps(sweeps.variant_keys(config), sort_keys=True))


def final_outputs():
    """Every item of the figure index this config draws (and the offline n-gram traces)."""
    outputs = [paper_path("ext00_verdict", s) for s in (".md", ".png")]
    outputs += [
        paper_path(name)
        for name in (
            "fig01_end_to_end",
            "tab01_generation_length",
            "ext01_speedups",
            "ext02_acceptance_per_position",
            "ext06_output_divergence",
        )
    ]
    outputs += [paper_path("tab02_memory", s) for s in (".md", ".png")]
    sources = (["grid"] if TRACES else []) + (
        ["published"] if PUBLISHED.get("datasets") else []
    )
    for source in sources:
        outputs.append(paper_path("tab04_generated_length", source=source))
        outputs.append(paper_path("fig06_request_acceptance", source=source))
    for scope in acceptance_scopes():
        outputs.append(paper_path("fig04_acceptance_heatmap", scope=scope))
        outputs.append(paper_path("fig05_position_deciles", scope=scope))
    outputs += [
        paper_path("fig10_ngram_minus_eagle", scope=s) for s in difference_scopes()
    ]
    outputs += offline_ngram_files() + offline_suffix_files()
    outputs += [
        paper_path("fig08_bleu_measured", engine=e, model=m, dataset=d)
        for (e, m, d) in bleu_targets()
    ]
    if BREAKDOWN:
        outputs.append(paper_path("fig03_runtime_breakdown"))
    if COST:
        outputs += [paper_path("ext07_cost", s) for s in (".md", ".png")]
    if config.get("proposal_length"):
        outputs += [paper_path("ext08_proposal_length", s) for s in (".md", ".png")]
    if RANDOM_PAIRS:
        outputs += [paper_path("ext09_random_inputs", s) for s in (".md", ".png")]
    if SERVER_GROUPS:
        outputs += [paper_path("ext11_latency_throughput", s) for s in (".md", ".png")]
    if speed_bench_cells():
        outputs += [
            paper_path("ext12_speed_bench_categories", s) for s in (".md", ".png")
        ]
    if config.get("temperature"):
        outputs += [paper_path("ext10_temperature", s) for s in (".md", ".png")]
    sim_scopes, adaptive_scopes = [], []
    if BREAKDOWN and validation_targets():
        outputs.append(paper_path("ext05_simulated_vs_measured"))
        sim_scopes += [f"{e}/{m}/{d}" for (e, m, d) in validation_targets()]
        adaptive_scopes += [f"{e}/{m}" for (e, m) in adaptive_cell_targets()]
    if PUBLISHED.get("datasets"):
        sim_scopes += ["published/exact", "published/compat"]
        adaptive_scopes.append("published")
        outputs += [
            paper_path("ext03_compat_vs_exact", suffix)
            for suffix in PAPER_ITEMS["ext03_compat_vs_exact"].suffixes
        ]
    for scope in sim_scopes:
        outputs.append(paper_path("fig09_fixed_vs_oracle", scope=scope))
        outputs.append(paper_path("fig11_oracle_combine", scope=scope))
    for scope in adaptive_scopes:
        outputs += [
            paper_path("ext04_adaptive_policies", suffix, scope=scope)
            for suffix in PAPER_ITEMS["ext04_adaptive_policies"].suffixes
        ]
    if PUBLISHED.get("datasets") and BLEU:
        outputs += [
            paper_path("fig08_bleu_simulated", published=d, ngram_policy=p)
            for d in PUBLISHED["datasets"]
            for p in BLEU.get("published_ngram_policies", [])
        ]
    return outputs


TRACES = trace_targets(config)
TRACE_SETTINGS = config.get("traces", {})
BASELINE_CELLS = {(c.engine, c.model, c.dataset): c for c in baseline_cells(config)}
PUBLISHED = config.get("published_traces", {})
TRACE_DIR = "results/traces/{engine}/{model}/{dataset}"


TRACE_GROUPS = trace_groups(config)
# One engine per traced method (engine x model x method) traces every dataset
# (sdbench.grid.TraceGroup); each trace then gets its own tables under TRACE_DIR.
TRACE_GROUP_DIR = "results/trace_groups/{engine}/{model}/{method}"


def _trace_cells(wildcards):
    """The trace group's traces as cells at the trace batch size."""
    group = TraceGroup(wildcards.engine, wildcards.model, wildcards.method)
    return [
        Cell(t.engine, t.model, t.dataset, t.method, TRACE_SETTINGS["max_num_seqs"])
        for t in TRACE_GROUPS[group]
    ]


def trace_group_inputs(wildcards):
    return engine_job_inputs(wildcards, _trace_cells(wildcards))


def trace_group_spec(wildcards):
    cells_ = _trace_cells(wildcards)
    return engine_job_spec(
        [resolve_cell(config, c, pairing=False) for c in cells_], cells_
    )


def trace_group_runtime(wildcards, attempt):
    return scheduling.one_engine_runtime_minutes(
        config, _trace_cells(wildcards), attempt
    )


def trace_group_dir_of_trace(wildcards):
    group = trace_group_of(
        TraceTarget(
            wildcards.engine, wildcards.model, wildcards.dataset, wildcards.method
        )
    )
    return TRACE_GROUP_DIR.format(**group.as_dict())


def baseline_requests(wildcards):
    """No-SD greedy outputs (smallest batch size) of an engine x model x dataset."""
    c = BASELINE_CELLS[(wildcards.engine, wildcards.model, wildcards.dataset)]
    return f"results/runs/{c.engine}/{c.model}/{c.dataset}/{c.method}/bs{c.batch_size}/requests.parquet"


ENGINE_TRACE = os.path.join(TRACE_DIR, "{method}", "engine_trace.parquet")
ENGINE_REQUESTS = os.path.join(TRACE_DIR, "{method}", "engine_requests.parquet")
OFFLINE_NGRAM = os.path.join(TRACE_DIR, "offline_ngram.parquet")
OFFLINE_SUFFIX = os.path.join(TRACE_DIR, "offline_suffix.parquet")
OFFLINE_TRACERS = TRACE_SETTINGS.get("offline", ["ngram"])
# Method label of the offline suffix rows (distinct from an in-engine `suffix` trace).
OFFLINE_SUFFIX_METHOD = "suffix (offline)"
PUBLISHED_TRACE = "results/traces/published/{published}.parquet"


def offline_ngram_files():
    if "ngram" not in OFFLINE_TRACERS:
        return []
    return [
        OFFLINE_NGRAM.format(engine=e, model=m, dataset=d)
        for (e, m, d) in sorted(BASELINE_CELLS)
    ]


def offline_suffix_files():
    if "suffix" not in OFFLINE_TRACERS:
        return []
    return [
        OFFLINE_SUFFIX.format(engine=e, model=m, dataset=d)
        for (e, m, d) in sorted(BASELINE_CELLS)
    ]


def _offline_suffix_keys(targets):
    """(engine, model, dataset) of traced targets whose offline suffix trace joins their items."""
    if "suffix" not in OFFLINE_TRACERS:
        return []
    keys = {(t.engine, t.model, t.dataset) for t in targets}
    return sorted(k for k in keys if k in BASELINE_CELLS)


def suffix_trace_args(wildcards):
    """Options of `sdbench trace suffix`: traces.suffix settings and the method label."""
    settings = TRACE_SETTINGS.get("suffix", {})
    args = [f"--method {shlex.quote(OFFLINE_SUFFIX_METHOD)}"]
    for key in sorted(settings):
        args.append(f"--{key.replace('_', '-')} {settings[key]}")
    return " ".join(args)


def acceptance_scopes():
    """Per-dataset scopes of Fig. 4/5: <engine>/<model>/<dataset> of the grid's traces, and
    published/<dataset> (sdbench.figureindex)."""
    grid = sorted({f"{t.engine}/{t.model}/{t.dataset}" for t in TRACES})
    return grid + [f"published/{d}" for d in PUBLISHED.get("datasets", [])]


def difference_scopes():
    """Scopes of Fig. 10: traces of both n-gram and EAGLE (every published dataset)."""
    kinds = {}
    for t in TRACES:
        kinds.setdefault(f"{t.engine}/{t.model}/{t.dataset}", set()).add(
            config["methods"][t.method]["method"]
        )
    return [
        s
        for s in acceptance_scopes()
        if kinds.get(s, {"ngram", "eagle"}) >= {"ngram", "eagle"}
    ]


def _scope_traces(key):
    """(trace targets, published datasets) behind a {source} or {scope} of the index."""
    if key == "grid":
        return TRACES, []
    rest = published_scope(key)
    if rest is not None:
        return [], [rest] if rest else PUBLISHED.get("datasets", [])
    engine, model, dataset = key.split("/")
    return [
        t for t in TRACES if (t.engine, t.model, t.dataset) == (engine, model, dataset)
    ], []


def _scope_key(wildcards):
    return wildcards.get("scope", wildcards.get("source"))


def acceptance_traces(wildcards):
    """Trace tables behind an acceptance item of the index (offline suffix traces after the
    in-engine ones, in the order of acceptance_labels)."""
    targets, published = _scope_traces(_scope_key(wildcards))
    suffix = [
        OFFLINE_SUFFIX.format(engine=e, model=m, dataset=d)
        for (e, m, d) in _offline_suffix_keys(targets)
    ]
    return (
        [ENGINE_TRACE.format(**asdict(t)) for t in targets]
        + suffix
        + [PUBLISHED_TRACE.format(published=d) for d in published]
    )


def acceptance_labels(wildcards):
    """`--labels` naming the grid's traces <model>/<dataset> (published files name themselves)."""
    targets, _ = _scope_traces(_scope_key(wildcards))
    if not targets:
        return ""
    names = [f"{t.model}/{t.dataset}" for t in targets]
    names += [f"{m}/{d}" for (_, m, d) in _offline_suffix_keys(targets)]
    return "--labels " + " ".join(shlex.quote(n) for n in names)


def published_trace_files():
    return [PUBLISHED_TRACE.format(published=d) for d in PUBLISHED.get("datasets", [])]


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


SERVER = config.get("server", {})
SERVER_GROUPS = server_groups(config)
SERVER_GROUP_DIR = "results/server/{engine}/{model}/{method}"


def _server_group(wildcards):
    return ServerGroup(wildcards.engine, wildcards.model, wildcards.method)


def _server_cell(wildcards):
    """The group's largest cell (sizes the job like an engine cell at that batch size)."""
    return Cell(
        wildcards.engine,
        wildcards.model,
        SERVER["datasets"][0],
        wildcards.method,
        max(SERVER["concurrency"]),
    )


def server_inputs(wildcards):
    """Prompt tables of the server section's datasets, and the method's drafter."""
    inputs = {
        f"prompts_{d}": PROMPTS.format(model=wildcards.model, dataset=d)
        for d in SERVER["datasets"]
    }
    return {**inputs, **drafter_inputs(wildcards)}


def server_prompts_arg(wildcards, input):
    paths = {d: input[f"prompts_{d}"] for d in SERVER["datasets"]}
    return shlex.quote(json.dumps(paths, sort_keys=True))


def server_group_spec(wildcards):
    """The resolved server group (a param: any change to what it uses reruns it)."""
    spec = resolve_server_group(config, _server_group(wildcards))
    return shlex.quote(json.dumps(spec, sort_keys=True))


def server_gpus(wildcards):
    return scheduling.cell_gpus(config, _server_cell(wildcards))


def server_mem_mb(wildcards):
    return scheduling.cell_mem_mb(config, _server_cell(wildcards))


def server_runtime(wildcards, attempt):
    return scheduling.server_runtime_minutes(config, _server_cell(wildcards), attempt)


def server_group_dirs():
    return [SERVER_GROUP_DIR.format(**g.as_dict()) for g in SERVER_GROUPS]


COST = config.get("cost", {})


def cost_prices():
    """Engine key -> price per device-hour (config ``cost``), shell-quoted JSON."""
    return shlex.quote(
        json.dumps(COST.get("price_per_device_hour", {}), sort_keys=True)
    )


def model_devices():
    """Model key -> devices one engine instance holds (its tensor_parallel_size)."""
    devices = {
        k: int(m.get("tensor_parallel_size", 1)) for k, m in config["models"].items()
    }
    return shlex.quote(json.dumps(devices, sort_keys=True))


def proposal_length_points():
    """Method key -> [base method, k] of the proposal-length sweep (sdbench.sweeps)."""
    points = {k: list(v) for k, v in sweeps.proposal_length_methods(config).items()}
    return shlex.quote(json.dumps(points, sort_keys=True))


def proposal_length_scope():
    """Engine, models, datasets and batch sizes of the proposal-length sweep."""
    sweep = config.get("proposal_length", {})
    keys = ("engine", "models", "datasets", "batch_sizes")
    return shlex.quote(json.dumps({k: sweep.get(k) for k in keys}, sort_keys=True))


def temperature_points():
    """Dataset key -> [base dataset, temperature] of the temperature sweep (sdbench.sweeps)."""
    points = {k: list(v) for k, v in sweeps.temperature_datasets(config).items()}
    return shlex.quote(json.dumps(points, sort_keys=True))


def temperature_scope():
    """Engine, models, SD methods and batch sizes of the temperature sweep."""
    sweep = config.get("temperature", {})
    keys = ("engine", "models", "methods", "batch_sizes")
    return shlex.quote(json.dumps({k: sweep.get(k) for k in keys}, sort_keys=True))


RANDOM_PAIRS = {
    name: d["matched_to"]
    for name, d in config["datasets"].items()
    if d["source"] == "random_tokens" and name in {c.dataset for c in CELLS}
}


def random_pairs():
    """Random-token dataset of the grid -> the dataset it matches, shell-quoted JSON."""
    return shlex.quote(json.dumps(RANDOM_PAIRS, sort_keys=True))


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
        cell_file(c, "calls")
        for c in CELLS
        if (c.engine, c.model, c.dataset)
        == (wildcards.engine, wildcards.model, wildcards.dataset)
        and c.method in methods
    ]


BREAKDOWN = breakdown_cells(config)
BREAKDOWN_DIR = "results/breakdown/{engine}/{model}/{dataset}/{method}/bs{batch_size}"
# Breakdown cells share engines as the grid's cells do (sdbench.grid.breakdown_groups).
BREAKDOWN_GROUPS = breakdown_groups(config)
BREAKDOWN_GROUP_DIR = "results/breakdown_groups/{engine}/{model}/{method}/{share}"


def breakdown_group_inputs(wildcards):
    return engine_job_inputs(wildcards, BREAKDOWN_GROUPS[_group(wildcards)])


def breakdown_group_spec(wildcards):
    cells_ = BREAKDOWN_GROUPS[_group(wildcards)]
    return engine_job_spec([resolve_breakdown_cell(config, c) for c in cells_], cells_)


def breakdown_group_runtime(wildcards, attempt):
    return scheduling.one_engine_runtime_minutes(
        config, BREAKDOWN_GROUPS[_group(wildcards)], attempt
    )


def breakdown_group_of_cell(wildcards):
    return BREAKDOWN_GROUP_DIR.format(
        **engine_group_of(config, _cell(wildcards)).as_dict()
    )


def breakdown_steps():
    return [
        os.path.join(BREAKDOWN_DIR.format(**asdict(c)), "steps.parquet")
        for c in BREAKDOWN
    ]


SIMULATOR = config.get("simulator", {})


def sim_policies(wildcards):
    return " ".join(
        simulator_choices.published_policies(config, wildcards.proposer, wildcards.mode)
    )


PUBLISHED_JSONL = "resources/published-traces/llama3.1-8B/combined_{published}.jsonl"


def published_jsonl():
    return [PUBLISHED_JSONL.format(published=d) for d in PUBLISHED.get("datasets", [])]


def validation_targets():
    return simulator_choices.validation_targets(config, TRACES)


SIM_PUBLISHED = "results/simulator/published/{mode}/{proposer}.csv"
SIM_CELL_DIR = "results/simulator/cells/{engine}/{model}/{dataset}"
SIM_CELL = os.path.join(SIM_CELL_DIR, "{proposer}.csv")
SIM_DRAFTER = os.path.join(SIM_CELL_DIR, "drafters", "{method}.csv")
# Named <dataset>.parquet: the simulator takes a trace file's dataset from its name.
SIM_STACKED = "results/simulator/traces/{engine}/{model}/{dataset}.parquet"
SIM_PROPOSERS = ("ngram", "eagle", "combined")
MEASURED_COST_MODEL = "results/cost_models/measured.yaml"


def sim_trace_inputs(wildcards):
    key = (wildcards.engine, wildcards.model, wildcards.dataset)
    target = validation_targets()[key]
    cell = dict(zip(("engine", "model", "dataset"), key))
    return {
        "traces": [
            ENGINE_TRACE.format(**cell, method=m)
            for m in sorted([target["ngram"], *target["drafters"]])
        ],
        "requests": ENGINE_REQUESTS.format(**cell, method=target["ngram"]),
    }


def sim_figure_inputs(wildcards):
    """Simulation results behind Fig. 9/11 of a scope: published/<mode> or E/M/D."""
    mode = published_scope(wildcards.scope)
    if mode is not None:
        return [SIM_PUBLISHED.format(mode=mode, proposer=p) for p in SIM_PROPOSERS]
    engine, model, dataset = wildcards.scope.split("/")
    return [
        SIM_CELL.format(engine=engine, model=model, dataset=dataset, proposer=p)
        for p in SIM_PROPOSERS
    ]


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
        files.append(SIM_CELL.format(engine=e, model=m, dataset=d, proposer="ngram"))
        files += [
            SIM_DRAFTER.format(engine=e, model=m, dataset=d, method=x)
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


def adaptive_inputs(wildcards):
    """Traces of the adaptive-policy report of a scope: `published`, or <engine>/<model>
    (this run's traces of every validated dataset, their requests, the fitted cost model).
    """
    if published_scope(wildcards.scope) is not None:
        return {"traces": published_jsonl()}
    engine, model = wildcards.scope.split("/")
    targets = validation_targets()
    datasets = adaptive_cell_targets()[(engine, model)]
    return {
        "traces": [
            SIM_STACKED.format(engine=engine, model=model, dataset=d) for d in datasets
        ],
        "requests": [
            ENGINE_REQUESTS.format(
                engine=engine,
                model=model,
                dataset=d,
                method=targets[(engine, model, d)]["ngram"],
            )
            for d in datasets
        ],
        "cost_model": MEASURED_COST_MODEL,
    }


def adaptive_args(wildcards, input):
    """On the grid: requests, fitted cost model, the grid's batch sizes and the policies
    (the learned one needs another dataset); published traces take the defaults."""
    if published_scope(wildcards.scope) is not None:
        return ""
    key = tuple(wildcards.scope.split("/"))
    sizes = sorted({c.batch_size for c in CELLS if (c.engine, c.model) == key})
    specs = simulator_choices.adaptive_policies(
        config, len(adaptive_cell_targets()[key])
    )
    return (
        f"--requests {' '.join(input.requests)} --cost-model {input.cost_model} "
        f"--batch-sizes {' '.join(map(str, sizes))} --policies {' '.join(specs)}"
    )


def methods_json():
    return shlex.quote(json.dumps(config["methods"], sort_keys=True))
