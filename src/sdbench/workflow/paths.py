"""Every output path of the workflow, in one place.

Templates hold Snakemake wildcards in braces (``{engine}``) and are formatted with
``str.format`` where a concrete path is needed: the rules (``workflow/rules/*.smk``), the plan
(:mod:`sdbench.workflow.plan`), the bundle (:mod:`sdbench.bundle`) and the docs all read them
from here. The figure index's items (``results/paper/<item>...``) live in
:mod:`sdbench.figureindex`, re-exported below. Standard library only: the Snakefile imports it
while it builds the DAG.
"""

from __future__ import annotations

from sdbench.figureindex import PAPER_DIR, paper_path  # noqa: F401 - re-exported: the paper items' paths

RESULTS = "results"

# Models and datasets.
BUILT_MODEL = "results/models/built/{key}"
HUB_MODEL = "resources/hub/{key}"
# A hub dataset repository's files that an entry selects (read offline by prepare_dataset).
HUB_DATASET = "resources/datasets/{key}"
TOKENIZER = "results/models/tokenizer"
PROMPTS = "results/prompts/{model}/{dataset}.parquet"
# SPEED-Bench's layout with the pipeline's own prompts, for a dataset whose local_path names it.
SPEED_BENCH_SAMPLE = "results/datasets/speed-bench-sample"

# Engine cells: one engine per group (GROUP_DIR, named by the site's split: `share`), each cell's
# own tables (CELL_DIR).
GROUP_DIR = "results/engines/{engine}/{model}/{method}/{share}"
# Every cell an engine or breakdown group measured, under its checkpoint key, whatever the split:
# kept when a job fails (Snakemake deletes GROUP_DIR then) and after it succeeds, so that any
# later group holding the cell (a rerun, another split) re-uses it (sdbench.engine.groups).
GROUP_CHECKPOINT_DIR = "results/engine_checkpoints/{engine}/{model}/{method}"
CELL_DIR = "results/runs/{engine}/{model}/{dataset}/{method}/bs{batch_size}"
CELL_TABLE = CELL_DIR + "/{name}.parquet"

# Acceptance traces.
TRACE_GROUP_DIR = "results/trace_groups/{engine}/{model}/{method}"
# Each traced dataset of a trace group as it finishes (sdbench trace-group --checkpoint-dir).
TRACE_CHECKPOINT_DIR = "results/trace_checkpoints/{engine}/{model}/{method}"
TRACE_DIR = "results/traces/{engine}/{model}/{dataset}"
ENGINE_TRACE = TRACE_DIR + "/{method}/engine_trace.parquet"
ENGINE_REQUESTS = TRACE_DIR + "/{method}/engine_requests.parquet"
OFFLINE_NGRAM = TRACE_DIR + "/offline_ngram.parquet"
OFFLINE_SUFFIX = TRACE_DIR + "/offline_suffix.parquet"
PUBLISHED_TRACE = "results/traces/published/{published}.parquet"
PUBLISHED_JSONL = "resources/published-traces/llama3.1-8B/combined_{published}.jsonl"

# Runtime breakdown.
BREAKDOWN_GROUP_DIR = "results/breakdown_groups/{engine}/{model}/{method}/{share}"
BREAKDOWN_DIR = "results/breakdown/{engine}/{model}/{dataset}/{method}/bs{batch_size}"
BREAKDOWN_STEPS = BREAKDOWN_DIR + "/steps.parquet"

# Server mode.
SERVER_GROUP_DIR = "results/server/{engine}/{model}/{method}"
# A CUDA engine image's gate (sdbench.imagegate), read by every engine job of the image.
IMAGE_GATE = "results/gates/{image}.json"

# Simulator.
SIM_PUBLISHED = "results/simulator/published/{mode}/{proposer}.csv"
SIM_CELL_DIR = "results/simulator/cells/{engine}/{model}/{dataset}"
SIM_CELL = SIM_CELL_DIR + "/{proposer}.csv"
SIM_DRAFTER = SIM_CELL_DIR + "/drafters/{method}.csv"
# Named <dataset>.parquet: the simulator takes a trace file's dataset from its name.
SIM_STACKED = "results/simulator/traces/{engine}/{model}/{dataset}.parquet"
MEASURED_COST_MODEL = "results/cost_models/measured.yaml"
# The step-timing model refitted at the forced-acceptance points (sdbench.simulator.forcedcheck).
FORCED_COST_MODEL = "results/cost_models/forced.yaml"
# The power model beside them (sdbench costmodel power): the simulations' energy bound.
POWER_MODEL = "results/cost_models/power.json"
FORCED_CHECK = "results/simulator/forced_check.parquet"

# Joined tables.
TABLES = "results/tables"
CELLS_TABLE = TABLES + "/cells.parquet"
# The grid's own cells (no sweep variant), joined as soon as they are measured: the verdict and
# Fig. 1 read them, so they are written before the extensions are measured.
GRID_CELLS_TABLE = TABLES + "/grid_cells.parquet"
SERVER_TABLE = TABLES + "/server.parquet"

# Engine job specs, content-addressed (sdbench.workflow.plan.spec_file): the shell line passes
# the path, whose name is the spec's digest, so a job reruns exactly when its spec changes.
SPEC_FILE = ".snakemake/sdbench/specs/{digest}.json"

# Per-stage data tables and directories the rules write (beside results/paper/).
TOKENIZER_DIR = TOKENIZER
BUILT_MODEL_RULE = "results/models/built/{built_model}"
BUILT_HEAD_RULE = "results/models/built/{head}"
HUB_MODEL_RULE = "resources/hub/{hub_model}"
HUB_DATASET_RULE = "resources/datasets/{hub_dataset}"
ACCEPTANCE_TABLE4 = "results/acceptance/{source}/table4.parquet"
ACCEPTANCE_DECILES = "results/acceptance/{scope}/position_deciles.parquet"
ACCEPTANCE_BOXES = "results/acceptance/{source}/request_box.parquet"
ACCEPTANCE_DIFFERENCE = "results/acceptance/{scope}/difference_summary.parquet"
BLEU_BUCKETS = "results/bleu/{engine}/{model}/{dataset}/buckets.parquet"
BLEU_MEASURED = "results/bleu/{engine}/{model}/{dataset}/fig8_measured.parquet"
BLEU_PUBLISHED_BUCKETS = "results/bleu/published/{published}/buckets.parquet"
BLEU_SIMULATED = "results/bleu/published/{published}/fig8_ngram-{ngram_policy}.parquet"
SIM_COMPAT_VS_EXACT = "results/simulator/compat_vs_exact.csv"
SIM_ADAPTIVE = "results/simulator/adaptive/{scope}.csv"
BUNDLE_DIR = "results/bundle"


def table(name: str) -> str:
    """A joined data table: ``results/tables/<name>.parquet`` (schemas in docs/schema.md)."""
    return f"{TABLES}/{name}.parquet"


def stage_dir(template: str) -> str:
    """The directory under ``results/`` a template writes in (``GROUP_DIR`` -> ``engines``)."""
    head, _, rest = template.partition("/")
    if head != RESULTS or not rest:
        raise ValueError(f"{template!r} is not under {RESULTS}/")
    return rest.split("/", 1)[0]
