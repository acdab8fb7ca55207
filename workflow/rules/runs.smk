# Engine cells: one engine per engine x model x method (sdbench.grid.EngineGroup),
# measuring every dataset x batch size of the grid on it; each cell then gets its
# own tables under results/runs/ (CELL_DIR). A site's runtime limit (config `site`, which
# the SLURM profiles pass) splits groups by dataset, then batch size (sdbench.scheduling);
# each split is logged once, when the DAG is built. Every cell a group measures is kept in
# the checkpoint store of its engine x model x method (not of its share), with a long cell's
# finished calls: a failed job's rerun, or a group split differently (another max_runtime, or no
# site), re-uses them and measures only what was never measured.
from snakemake.logging import logger

if workflow.is_main_process:
    for _note in PLAN.site_notes:
        logger.info(_note)


rule run_engine:
    input:
        unpack(group_inputs),
        model=target_dir,
    output:
        directory(P.GROUP_DIR),
    log:
        "logs/run_engine/{engine}/{model}/{method}/{share}.log",
    benchmark:
        "benchmarks/run_engine/{engine}/{model}/{method}/{share}.tsv"
    priority: lambda w: PLAN.engine_priority(_group(w))
    container:
        cell_container
    threads: TIMED_THREADS
    resources:
        # One node: a tensor-parallel engine's GPUs must not be split across nodes (sbatch --nodes=1).
        nodes=1,
        gpu=cell_gpus,
        mem_mb=group_mem_mb,
        runtime=group_runtime,
    params:
        code=MEASUREMENT_CODE,
        image=cell_image,
        spec=group_spec,
        drafter=drafter_arg,
        checkpoints=lambda w: PLAN.group_checkpoint_dir(_group(w)),
    shell:
        "sdbench run-group --spec @{params.spec} --model-dir {input.model} {params.drafter} "
        "--checkpoint-dir {params.checkpoints} --threads {threads} --output-dir {output} > {log} 2>&1"


rule run_cell:
    input:
        lambda w: PLAN.group_dir_of_cell(_cell(w)),
    output:
        requests=P.CELL_TABLE.replace("{name}", "requests"),
        calls=P.CELL_TABLE.replace("{name}", "calls"),
        baseline_calls=P.CELL_TABLE.replace("{name}", "baseline_calls"),
        summary=P.CELL_TABLE.replace("{name}", "summary"),
    log:
        "logs/run_cell/{engine}/{model}/{dataset}/{method}/bs{batch_size}.log",
    priority: lambda w: PLAN.cell_priority(_cell(w))
    localrule: True
    params:
        code=MEASUREMENT_CODE,
        outdir=subpath(output.summary, parent=True),
    shell:
        "sdbench cell-tables --group-dir {input} --method {wildcards.method} "
        "--dataset {wildcards.dataset} "
        "--batch-size {wildcards.batch_size} --output-dir {params.outdir} > {log} 2>&1"
