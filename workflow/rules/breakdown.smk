# Runtime breakdown (paper Sec. 5.1, Fig. 3): selected cells re-run with per-step
# stage timing (drafting, verification, sampling, other), one engine per engine x model x
# method (as the grid's engine groups); each cell then gets its own tables under BREAKDOWN_DIR.
# Finished cells are kept in the same checkpoint store as the grid's (their keys differ).


rule breakdown_group:
    input:
        unpack(breakdown_group_inputs),
        model=target_dir,
    output:
        directory(P.BREAKDOWN_GROUP_DIR),
    log:
        "logs/breakdown_group/{engine}/{model}/{method}/{share}.log",
    benchmark:
        "benchmarks/breakdown_group/{engine}/{model}/{method}/{share}.tsv"
    container:
        cell_container
    threads: TIMED_THREADS
    resources:
        # One node: a tensor-parallel engine's GPUs must not be split across nodes (sbatch --nodes=1).
        nodes=1,
        gpu=cell_gpus,
        mem_mb=breakdown_group_mem_mb,
        runtime=breakdown_group_runtime,
    params:
        code=MEASUREMENT_CODE,
        image=cell_image,
        spec=lambda w: spec_ref(PLAN.breakdown_group_spec(_group(w))),
        drafter=drafter_arg,
        checkpoints=lambda w: PLAN.group_checkpoint_dir(_group(w)),
    shell:
        "sdbench run-group --breakdown --spec @{params.spec} --model-dir {input.model} "
        "{params.drafter} --threads {threads} --checkpoint-dir {params.checkpoints} --output-dir {output} > {log} 2>&1"


rule breakdown_cell:
    input:
        lambda w: PLAN.breakdown_group_dir_of_cell(_cell(w)),
    output:
        steps=P.BREAKDOWN_STEPS,
        summary=f"{P.BREAKDOWN_DIR}/summary.parquet",
        requests=f"{P.BREAKDOWN_DIR}/requests.parquet",
        calls=f"{P.BREAKDOWN_DIR}/calls.parquet",
        baseline_calls=f"{P.BREAKDOWN_DIR}/baseline_calls.parquet",
    log:
        "logs/breakdown_cell/{engine}/{model}/{dataset}/{method}/bs{batch_size}.log",
    localrule: True
    params:
        code=MEASUREMENT_CODE,
        outdir=subpath(output.summary, parent=True),
    shell:
        "sdbench cell-tables --steps --group-dir {input} --method {wildcards.method} "
        "--dataset {wildcards.dataset} "
        "--batch-size {wildcards.batch_size} --output-dir {params.outdir} > {log} 2>&1"


rule fig03_runtime_breakdown:
    input:
        PLAN.breakdown_steps(),
    output:
        figure=paper_report("fig03_runtime_breakdown"),
        drawn=drawn_table("fig03_runtime_breakdown"),
        table=P.table("breakdown"),
    log:
        "logs/fig03_runtime_breakdown.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.breakdown"),
    shell:
        "sdbench breakdown plot --steps {input} --output {output.figure} "
        "--table {output.table} > {log} 2>&1"
