# One job per cell: engine x model x dataset x SD method x batch size.


rule run_cell:
    input:
        unpack(drafter_inputs),
        prompts="results/prompts/{model}/{dataset}.parquet",
        model=target_dir,
    output:
        requests=f"{CELL_DIR}/requests.parquet",
        calls=f"{CELL_DIR}/calls.parquet",
        summary=f"{CELL_DIR}/summary.parquet",
    log:
        "logs/run_cell/{engine}/{model}/{dataset}/{method}/bs{batch_size}.log",
    benchmark:
        "benchmarks/run_cell/{engine}/{model}/{dataset}/{method}/bs{batch_size}.tsv"
    container:
        cell_container
    threads: TIMED_THREADS
    resources:
        gpu=cell_gpus,
        mem_mb=cell_mem_mb,
        runtime=cell_runtime,
    params:
        code=code_digest("sdbench.runner"),
        image=cell_image,
        spec=cell_spec,
        drafter=drafter_arg,
        outdir=subpath(output.summary, parent=True),
    shell:
        "sdbench run-cell --spec {params.spec} --prompts {input.prompts} "
        "--model-dir {input.model} {params.drafter} --output-dir {params.outdir} > {log} 2>&1"
