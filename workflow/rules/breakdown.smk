# Runtime breakdown (paper Sec. 5.1, Fig. 3): selected cells re-run with per-step
# stage timing (drafting, verification, sampling, other).


rule breakdown_cell:
    input:
        unpack(drafter_inputs),
        prompts="results/prompts/{model}/{dataset}.parquet",
        model=target_dir,
    output:
        steps=os.path.join(BREAKDOWN_DIR, "steps.parquet"),
        summary=os.path.join(BREAKDOWN_DIR, "summary.parquet"),
    log:
        "logs/breakdown_cell/{engine}/{model}/{dataset}/{method}/bs{batch_size}.log",
    benchmark:
        "benchmarks/breakdown_cell/{engine}/{model}/{dataset}/{method}/bs{batch_size}.tsv"
    container:
        cell_container
    threads: TIMED_THREADS
    resources:
        gpu=cell_gpus,
        mem_mb=cell_mem_mb,
        runtime=cell_runtime,
    params:
        code=code_digest("sdbench.engine.cli", "sdbench.engine.commands"),
        image=cell_image,
        spec=breakdown_spec,
        drafter=drafter_arg,
        outdir=subpath(output.summary, parent=True),
    shell:
        "sdbench run-cell --spec {params.spec} --prompts {input.prompts} "
        "--model-dir {input.model} {params.drafter} --output-dir {params.outdir} "
        "--steps-output {output.steps} > {log} 2>&1"


rule fig03_runtime_breakdown:
    input:
        breakdown_steps(),
    output:
        figure=paper_report("fig03_runtime_breakdown"),
        table="results/tables/breakdown.parquet",
    log:
        "logs/fig03_runtime_breakdown.log",
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.breakdown"),
    shell:
        "sdbench breakdown plot --steps {input} --output {output.figure} "
        "--table {output.table} > {log} 2>&1"
