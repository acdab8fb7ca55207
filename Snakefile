# sdbench: speculative-decoding benchmark pipeline.
# The grid comes from the config (default: config/config.yaml, the embedded CPU
# run); the paper's grid: --configfile config/paper.yaml.
from snakemake.utils import min_version

min_version("9.0")


# --configfile replaces the embedded default instead of being merged into it
# (--config KEY=VALUE still applies on top of either).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


# Analysis steps run in the sdbench image (containers/sdbench-analysis.def);
# run-cell jobs use their engine's image instead. Used only with --sdm apptainer.
container: "containers/sif/sdbench-analysis.sif"


# Front page of the HTML report (`snakemake --report`; captions in workflow/report/).
report: "workflow/report/workflow.rst"


# PATH is extended with this interpreter's bin/ (common.smk) so jobs find `sdbench`.
envvars:
    "PATH",


include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/datasets.smk"
include: "workflow/rules/gates.smk"
include: "workflow/rules/runs.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/acceptance.smk"
include: "workflow/rules/bleu.smk"
include: "workflow/rules/breakdown.smk"
include: "workflow/rules/simulator.smk"
include: "workflow/rules/forced.smk"
include: "workflow/rules/server.smk"
include: "workflow/rules/bundle.smk"


rule all:
    default_target: True
    input:
        PLAN.final_outputs(),
