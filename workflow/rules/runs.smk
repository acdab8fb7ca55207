# Engine cells: one engine per engine x model x method (sdbench.grid.EngineGroup),
# measuring every dataset x batch size of the grid on it; each cell then gets its
# own tables under results/runs/ (CELL_DIR).


rule run_engine:
    input:
        unpack(group_inputs),
        model=target_dir,
    output:
        directory(GROUP_DIR),
    log:
        "logs/run_engine/{engine}/{model}/{method}/{share}.log",
    benchmark:
        "benchmarks/run_engine/{engine}/{model}/{method}/{share}.tsv"
    container:
        cell_container
    threads: TIMED_THREADS
    resources:
        gpu=cell_gpus,
        mem_mb=cell_mem_mb,
        runtime=group_runtime,
    params:
        code=code_digest("sdbench.engine.cli", "sdbench.engine.commands"),
        image=cell_image,
        spec=group_spec,
        drafter=drafter_arg,
    shell:
        "sdbench run-group --spec {params.spec} --model-dir {input.model} {params.drafter} "
        "--output-dir {output} > {log} 2>&1"


rule run_cell:
    input:
        group_dir_of_cell,
    output:
        requests=f"{CELL_DIR}/requests.parquet",
        calls=f"{CELL_DIR}/calls.parquet",
        baseline_calls=f"{CELL_DIR}/baseline_calls.parquet",
        summary=f"{CELL_DIR}/summary.parquet",
    log:
        "logs/run_cell/{engine}/{model}/{dataset}/{method}/bs{batch_size}.log",
    localrule: True
    params:
        code=code_digest("sdbench.engine.cli", "sdbench.engine.commands"),
        outdir=subpath(output.summary, parent=True),
    shell:
        "sdbench cell-tables --group-dir {input} --dataset {wildcards.dataset} "
        "--batch-size {wildcards.batch_size} --output-dir {params.outdir} > {log} 2>&1"
