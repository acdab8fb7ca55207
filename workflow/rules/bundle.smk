# Frozen artifact bundle of the default run: `snakemake bundle` (not part of `all`) writes one
# checksummed RO-Crate archive of the results, the HTML report, the resolved config, package
# versions and container digests. Logic: src/sdbench/bundle.py.
import mimetypes

from snakemake_interface_executor_plugins.settings import DeploymentMethod

from sdbench.bundle import installed_packages_digest

# The report attaches tables as downloads: give them their media types instead of text/plain.
mimetypes.add_type("application/vnd.apache.parquet", ".parquet")
mimetypes.add_type("application/yaml", ".yaml")

BUNDLE_DIR = P.BUNDLE_DIR
WORKFLOW_ROOT = os.path.dirname(os.path.abspath(workflow.main_snakefile))
# Digests of the container images; the bundle accepts the file's absence.
CONTAINER_IMAGES = os.path.join(WORKFLOW_ROOT, "containers", "images.yaml")
# The report job runs the Snakemake of this very interpreter.
PYTHON = shlex.quote(sys.executable)


rule bundle_config:
    output:
        f"{BUNDLE_DIR}/config.resolved.yaml",
    log:
        "logs/bundle/config.log",
    localrule: True
    params:
        # The config as Snakemake holds it: --config overrides and schema defaults included.
        config=shlex.quote(json.dumps(config, sort_keys=True)),
        code=code_digest("sdbench.bundle"),
    shell:
        "sdbench bundle config --json {params.config} --output {output} > {log} 2>&1"


rule bundle_freeze:
    output:
        f"{BUNDLE_DIR}/host-freeze.txt",
    log:
        "logs/bundle/freeze.log",
    localrule: True
    params:
        # A changed environment re-freezes it.
        packages=lambda wildcards: installed_packages_digest(),
    shell:
        "PIP_DISABLE_PIP_VERSION_CHECK=1 python -m pip freeze --all > {output} 2> {log}"


# The report of the default target, by a nested Snakemake of this interpreter on the same workflow
# and working directory, configured by the resolved config (so it sees exactly this run's DAG).
# It needs Snakemake itself, which the analysis image lacks: a host-side run block.
rule bundle_report:
    input:
        PLAN.final_outputs(),
        config=f"{BUNDLE_DIR}/config.resolved.yaml",
    output:
        f"{BUNDLE_DIR}/report.html",
    log:
        "logs/bundle/report.log",
    localrule: True
    container:
        None
    params:
        python=PYTHON,
        snakefile=shlex.quote(os.path.abspath(workflow.main_snakefile)),
    run:
        shell(
            "{params.python} -m snakemake --snakefile {params.snakefile} --directory . "
            "--configfile {input.config} --report {output} --nolock > {log} 2>&1"
        )


rule bundle:
    input:
        PLAN.final_outputs(),
        config=f"{BUNDLE_DIR}/config.resolved.yaml",
        report=f"{BUNDLE_DIR}/report.html",
        freeze=f"{BUNDLE_DIR}/host-freeze.txt",
    output:
        f"{BUNDLE_DIR}/sdbench-bundle.tar.gz",
    log:
        "logs/bundle/bundle.log",
    localrule: True
    params:
        snakefile=shlex.quote(os.path.abspath(workflow.main_snakefile)),
        sources=shlex.quote(os.path.join(WORKFLOW_ROOT, "workflow")),
        images=shlex.quote(CONTAINER_IMAGES),
        code=code_digest("sdbench.bundle"),
        # Snakemake records each rule's image with or without --sdm apptainer: the bundle, made
        # with the run's own options, claims the images for the run only when they were used.
        containers_used=lambda wildcards: (
            "--containers-used"
            if DeploymentMethod.APPTAINER
            in workflow.deployment_settings.deployment_method
            else ""
        ),
        # A rehearsal's cells (measured = false) are refused unless the config allows them.
        allow_rehearsal="--allow-rehearsal" if config.get("allow_rehearsal") else "",
    shell:
        "sdbench bundle create --output {output} --results results "
        "--workflow {params.snakefile} --workflow-files {params.sources} "
        "--config {input.config} --report {input.report} --containers {params.images} "
        "--environment host={input.freeze} --snakemake-dir .snakemake {params.containers_used} "
        "{params.allow_rehearsal} > {log} 2>&1"
