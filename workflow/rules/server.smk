# Server mode (config `server`; sdbench.servermode): per engine x model x method one job
# starts vLLM's OpenAI-compatible server and measures every dataset x concurrency on it.


rule serve_group:
    input:
        unpack(server_inputs),
        model=target_dir,
    output:
        directory(SERVER_GROUP_DIR),
    log:
        main="logs/serve_group/{engine}/{model}/{method}.log",
        server="logs/serve_group/{engine}/{model}/{method}.server.log",
    benchmark:
        "benchmarks/serve_group/{engine}/{model}/{method}.tsv"
    container:
        cell_container
    threads: TIMED_THREADS
    resources:
        gpu=server_gpus,
        mem_mb=server_mem_mb,
        runtime=server_runtime,
    params:
        code=code_digest(
            "sdbench.engine.cli",
            "sdbench.engine.servegroup",
            "sdbench.engine.server",
            "sdbench.engine.loadgen",
        ),
        image=cell_image,
        spec=server_group_spec,
        prompts=server_prompts_arg,
        drafter=drafter_arg,
    shell:
        "sdbench serve-group --spec {params.spec} --prompts {params.prompts} "
        "--model-dir {input.model} {params.drafter} --output-dir {output} "
        "--server-log {log.server} > {log.main} 2>&1"


rule ext11_latency_throughput:
    input:
        server_group_dirs(),
    output:
        table="results/tables/server.parquet",
        markdown=paper_report("ext11_latency_throughput", ".md"),
        figure=paper_report("ext11_latency_throughput", ".png"),
    log:
        "logs/ext11_latency_throughput.log",
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.latency"),
        prices=cost_prices(),
        devices=model_devices(),
        currency=COST.get("currency", "USD"),
        source=COST.get("source", ""),
    shell:
        "sdbench latency --groups {input} --prices {params.prices} --devices {params.devices} "
        "--currency={params.currency:q} --source={params.source:q} --output {output.table} "
        "--markdown {output.markdown} --figure {output.figure} > {log} 2>&1"
