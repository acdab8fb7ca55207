# Config loading and the thin adapters from Snakemake's wildcards to the plan. What depends
# only on the config (cells, groups, scopes, final outputs, params payloads) is
# sdbench.workflow.plan; every output path is sdbench.workflow.paths (P).
import json
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

from snakemake_interface_executor_plugins.settings import DeploymentMethod

from sdbench import scheduling
from sdbench.analysis.memory import refuse_kv_shortfalls
from sdbench.codedigest import code_digest, use_cache
from sdbench.engine.scope import measurement_digest
from sdbench.config import validate_config
from sdbench.containers import image_identity, refuse_stale_images
from sdbench.figureindex import BY_NAME as PAPER_ITEMS
from sdbench.grid import EngineGroup, TraceTarget
from sdbench.lifeline import export_workflow_env
from sdbench.models.hub import download_env, withhold_download_env
from sdbench.workflow import paths as P
from sdbench.workflow.adapters import AnalysisJobs, EngineJobs
from sdbench.workflow.plan import FIRST, Plan, quoted, spec_file

# Every job loads this workflow (a SLURM job twice): the rules' code digests are parsed once per
# state of the package, then read from here.
use_cache(".snakemake/sdbench/code-digests")

# Jobs call the `sdbench` CLI: make the one beside this interpreter (.venv/bin)
# visible even when the virtualenv is not activated.
os.environ["PATH"] = os.pathsep.join(
    [os.path.dirname(sys.executable), os.environ.get("PATH", "")]
)

# Fails before any job runs, naming the offending key (and, under kv_capacity: refuse, the
# first cell whose batch cannot fit its engine's KV cache).
validate_config(config, source="config")
refuse_kv_shortfalls(config)
# Engine jobs end when this workflow process ends (sdbench.lifeline), and their
# quiet-machine guard mode (sdbench.quietguard) comes from the config; neither is
# a param, so neither reruns anything.
export_workflow_env(config["quiet_guard"])
PLAN = Plan(config)
# The rules that reach the network run here, on the submitting host (compute nodes may have no
# internet): PLAN.network_rules(), checked by tests/site/test_hub.py. They alone get the hub token
# (HF_TOKEN, else huggingface_hub's token file, which a job in an image whose home is the working
# directory would not see) and the site's proxy, CA and hub-endpoint settings: these leave this
# process's environment, which every other job inherits (sbatch --export=ALL), and reach the
# download commands through download_job_env().
WITHHELD = withhold_download_env() if workflow.is_main_process else {}


def download_job_env():
    """The environment a download job's command gets on top of the workflow's (a run: block's
    shell(..., additional_envvars=)): the withheld settings and the token."""
    return download_env(WITHHELD if workflow.is_main_process else os.environ)


onstart:
    # The local executor runs run: jobs (the downloads) in a Snakemake subprocess of its own, which
    # sees only this process's environment: give the withheld settings back to it (not the token
    # read from the token file, which that process reads itself). Jobs in images started with
    # --cleanenv see none of them; SLURM jobs never run there.
    if workflow.local_exec and not workflow.use_threads:
        os.environ.update(WITHHELD)


# An image runs the sdbench it was built with: refuse, before any job starts, an image whose code
# is not this checkout's (one line naming both digests and the build command).
if (
    workflow.is_main_process
    and DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method
):
    refuse_stale_images(
        [
            getattr(workflow.modifier, "global_container_img", None),
            *PLAN.containers(),
        ],
        Path(workflow.basedir) / "containers",
        shutil.which("apptainer") or shutil.which("singularity"),
    )


localrules:
    download_model,
    download_dataset,
    fetch_published_traces,


# engine_mode: rehearsal (sdbench.rehearsal): engine jobs on the rehearsal engine, no GPU; hub models
# are stand-ins and hub datasets rehearsal prompt sets. The shell lines of a measured run are unchanged.
DOWNLOAD_MODEL = (
    "sdbench rehearsal standin-model" if PLAN.rehearsal else "sdbench download-model"
)
PREPARE_DATASET = (
    "sdbench rehearsal prepare-dataset" if PLAN.rehearsal else "sdbench prepare-dataset"
)
REHEARSAL_PREPARE = PLAN.rehearsal_prepare_arg()
# What the rehearsal's prompt and model rules run (sdbench.rehearsal.prepare: its prompt sets and
# stand-in models) joins their code digests in a rehearsal only: a measured run's jobs never rerun
# for it. The rehearsal's engine is in the engine jobs' measurement scope (sdbench.engine.scope).
REHEARSAL_CODE = ("sdbench.rehearsal.prepare",) if PLAN.rehearsal else ()
# What engine jobs (and their checkpoints) are keyed on: the measurement's code only
# (sdbench.engine.scope), so an edit of a trainer, a tracer or an analysis measures nothing again.
MEASUREMENT_CODE = measurement_digest(rehearsal=PLAN.rehearsal)
SERVER_MEASUREMENT_CODE = measurement_digest(rehearsal=PLAN.rehearsal, server=True)
CELLS = PLAN.cells
TRACE_SETTINGS = PLAN.trace_settings
BLEU = PLAN.bleu or {}
SIMULATOR = config.get("simulator", {})
COST = PLAN.cost
# A timed engine job takes every core Snakemake may use here (--cores), so that
# nothing runs beside it on a workstation. Under a batch scheduler each job gets
# its own allocation: the profile sets its CPUs (set-threads / cpus_per_gpu).
TIMED_THREADS = workflow.resource_settings.cores or 1


def _alternatives(names):
    return "|".join(re.escape(n) for n in sorted(map(str, names))) or "__none__"


wildcard_constraints:
    engine=_alternatives(config["engines"]),
    dataset=_alternatives(config["datasets"]),
    method=_alternatives(config["methods"]),
    batch_size=r"\d+",
    share=_alternatives(PLAN.shares),
    built_model=_alternatives(PLAN.built_models),
    hub_model=_alternatives(PLAN.hub_models),
    hub_dataset=_alternatives(PLAN.hub_datasets),
    head=_alternatives(PLAN.heads),
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
        P.paper_path(name, suffix),
        caption=f"../report/{name}.rst",
        category=item.section,
        subcategory=subcategory or item.paper or "Beyond the paper",
    )


def drawn_table(name):
    """What figure-index item ``name``'s PNG drew, written beside it by save_png."""
    return P.paper_path(name, ".csv")


def spec_ref(spec):
    """An engine job's spec as its content-addressed file (the param changes with the spec)."""
    return spec_file(spec)


# --- wildcards -> plan keys (sdbench.workflow.adapters) ----------------------------------
ENGINE = EngineJobs(PLAN, Path(workflow.basedir) / "containers")
_cell, _group, _trace_group = ENGINE.cell, ENGINE.group, ENGINE.trace_group
_engine_cell = ENGINE.engine_cell


def _server_group(w):
    return PLAN.server_group_of(dict(w.items()))


# --- engine jobs (run, trace, breakdown and server groups) --------------------------------
target_dir, drafter_arg = ENGINE.target_dir, ENGINE.drafter_arg
cell_container, cell_image, cell_gpus = ENGINE.container, ENGINE.image, ENGINE.gpus
group_inputs, group_spec = ENGINE.group_inputs, ENGINE.group_spec
group_mem_mb, group_runtime = ENGINE.group_mem_mb, ENGINE.group_runtime
trace_group_inputs = ENGINE.trace_group_inputs
trace_group_mem_mb = ENGINE.trace_group_mem_mb
trace_group_runtime = ENGINE.trace_group_runtime
breakdown_group_inputs = ENGINE.breakdown_group_inputs
breakdown_group_mem_mb = ENGINE.breakdown_group_mem_mb
breakdown_group_runtime = ENGINE.breakdown_group_runtime


def server_runtime(w, attempt):
    cell = PLAN.server_cell(_server_group(w))
    return scheduling.server_runtime_minutes(config, cell, attempt)


def server_mem_mb(w):
    return max(
        scheduling.job_mem_mb(config, "server", [c])
        for c in PLAN.server_cells(_server_group(w))
    )


def server_prompts_arg(w, input):
    return quoted({d: input[f"prompts_{d}"] for d in PLAN.server["datasets"]})


def server_drafters_arg(w, input):
    """``--drafters`` {method: drafter dir} of the job's arms that have one (none: no argument)."""
    found = {
        k.removeprefix("drafter_"): input[k]
        for k in input.keys()
        if k.startswith("drafter_")
    }
    return f"--drafters {quoted(found)}" if found else ""


def server_output_args(w, output):
    """``--output-dir``: the job's arms' directories, in its methods' order (as its spec's)."""
    return " ".join(shlex.quote(d) for d in output)


# --- analysis jobs: memory and time from what their inputs hold (sdbench.workflow.adapters)
ANALYSIS = AnalysisJobs(config, len(CELLS))
analysis_mem_mb, parsed_mem_mb = ANALYSIS.mem_mb, ANALYSIS.parsed_mem_mb
prompt_table_mem_mb = ANALYSIS.prompt_table_mem_mb
streamed_mem_mb = ANALYSIS.streamed_mem_mb
analysis_runtime, simulation_runtime = ANALYSIS.runtime, ANALYSIS.simulation_runtime


# --- traces and acceptance items ----------------------------------------------------------
def baseline_outputs(w):
    return PLAN.baseline_outputs(w.engine, w.model, w.dataset)


def _scope_key(w):
    return w.get("scope", w.get("source"))


def acceptance_traces(w):
    return PLAN.acceptance_traces(_scope_key(w))


def acceptance_labels(w):
    names = PLAN.acceptance_labels(_scope_key(w))
    return "--labels " + " ".join(shlex.quote(n) for n in names) if names else ""


def published_local_arg(w):
    local = PLAN.published.get("local_dir")
    return f"--local-dir {shlex.quote(local)}" if local else ""


# --- simulator ----------------------------------------------------------------------------
def sim_trace_inputs(w):
    return PLAN.sim_trace_inputs(w.engine, w.model, w.dataset)


def sim_cell_batch_sizes(w):
    return " ".join(map(str, PLAN.sim_cell_batch_sizes(w.engine, w.model, w.dataset)))


def adaptive_args(w, input):
    """On the grid: requests, fitted cost model, the grid's batch sizes and the policies
    (the learned one needs another dataset); published traces take the defaults."""
    options = PLAN.adaptive_options(w.scope)
    if options is None:
        return ""
    sizes, specs = options
    if not sizes:  # the published traces, one dataset: no policy that trains on another
        return f"--policies {' '.join(specs)}"
    return (
        f"--requests {' '.join(input.requests)} --cost-model {input.cost_model} "
        f"--batch-sizes {' '.join(map(str, sizes))} --policies {' '.join(specs)}"
    )
