# Server mode (config `server`; sdbench.servermode): per engine x model x method one job starts
# vLLM's OpenAI-compatible server `starts` times and measures every dataset x concurrency on each;
# with `interleave` one job per engine x model alternates every method's starts and writes each
# arm's directory (the outputs come from the plan: the grid is data).


rule serve_group:
    input:
        unpack(lambda w: PLAN.server_inputs(_server_group(w))),
        model=target_dir,
    output:
        [directory(p) for p in PLAN.server_output_patterns()],
    log:
        main=PLAN.server_log_pattern(".log"),
        server=PLAN.server_log_pattern(".server.log"),
    benchmark:
        PLAN.server_log_pattern(".tsv", root="benchmarks")
    priority: FIRST  # the verdict reads server mode
    container:
        cell_container
    threads: TIMED_THREADS
    resources:
        # One node: a tensor-parallel engine's GPUs must not be split across nodes (sbatch --nodes=1).
        nodes=1,
        gpu=lambda w: scheduling.cell_gpus(config, PLAN.server_cell(_server_group(w))),
        mem_mb=server_mem_mb,
        runtime=server_runtime,
    params:
        code=SERVER_MEASUREMENT_CODE,
        image=cell_image,
        spec=lambda w: spec_ref(PLAN.server_group_spec(_server_group(w))),
        prompts=server_prompts_arg,
        drafters=server_drafters_arg,
        outputs=server_output_args,
    shell:
        "sdbench serve-group --spec @{params.spec} --prompts {params.prompts} "
        "--model-dir {input.model} {params.drafters} --threads {threads} --output-dir {params.outputs} "
        "--server-log {log.server} > {log.main} 2>&1"


rule ext11_latency_throughput:
    input:
        PLAN.server_group_dirs(),
    output:
        table=P.SERVER_TABLE,
        markdown=paper_report("ext11_latency_throughput", ".md"),
        figure=paper_report("ext11_latency_throughput", ".png"),
        drawn=drawn_table("ext11_latency_throughput"),
    log:
        "logs/ext11_latency_throughput.log",
    priority: FIRST
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.latency"),
        prices=quoted(PLAN.cost_prices()),
        devices=quoted(PLAN.model_devices()),
        currency=COST.get("currency", "USD"),
        source=COST.get("source", ""),
        slo=quoted(PLAN.server_slos()),
        seed=config["seed"],
    shell:
        "sdbench latency --groups {input} --prices {params.prices} --devices {params.devices} "
        "--currency={params.currency:q} --source={params.source:q} --slo {params.slo} "
        "--seed {params.seed} --output {output.table} "
        "--markdown {output.markdown} --figure {output.figure} > {log} 2>&1"


# Goodput without a hand-picked target (ext17): over every TTFT x TPOT target, where each SD arm's
# goodput is higher than no SD's at the same concurrency; each arm's highest load at 90% attainment.
# The user's targets (server.slo) are one point on it.
rule ext17_goodput_frontier:
    input:
        PLAN.server_group_dirs(),
    output:
        table=P.table("goodput_frontier"),
        max_load=P.table("goodput_max_load"),
        markdown=paper_report("ext17_goodput_frontier", ".md"),
        figure=paper_report("ext17_goodput_frontier", ".png"),
        drawn=drawn_table("ext17_goodput_frontier"),
    log:
        "logs/ext17_goodput_frontier.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.goodputfrontier"),
        slo=quoted(PLAN.server_slos()),
        labels=quoted(PLAN.method_labels()),
        seed=config["seed"],
    shell:
        "sdbench goodput-frontier --groups {input} --slo {params.slo} --labels {params.labels} "
        "--seed {params.seed} --output {output.table} --max-load {output.max_load} "
        "--markdown {output.markdown} --figure {output.figure} > {log} 2>&1"
