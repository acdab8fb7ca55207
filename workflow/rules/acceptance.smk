# Acceptance tracing (paper Sec. 6): in-engine traces of the grid's SD methods,
# offline n-gram traces of the no-SD outputs, the published traces, and the
# acceptance tables and figures drawn from trace tables only.


rule trace_cell:
    input:
        unpack(drafter_inputs),
        prompts="results/prompts/{model}/{dataset}.parquet",
        model=target_dir,
    output:
        trace=f"{TRACE_DIR}/{{method}}/engine_trace.parquet",
        requests=f"{TRACE_DIR}/{{method}}/engine_requests.parquet",
    log:
        "logs/trace_cell/{engine}/{model}/{dataset}/{method}.log",
    benchmark:
        "benchmarks/trace_cell/{engine}/{model}/{dataset}/{method}.tsv"
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
        spec=trace_spec,
        drafter=drafter_arg,
        k=TRACE_SETTINGS.get("num_speculative_tokens", 20),
        seqs=TRACE_SETTINGS.get("max_num_seqs", 8),
    shell:
        "sdbench trace-cell --spec {params.spec} --prompts {input.prompts} "
        "--model-dir {input.model} {params.drafter} --num-speculative-tokens {params.k} "
        "--max-num-seqs {params.seqs} --output {output.trace} --requests {output.requests} "
        "> {log} 2>&1"


rule trace_ngram_offline:
    input:
        baseline_requests,
    output:
        f"{TRACE_DIR}/offline_ngram.parquet",
    log:
        "logs/trace_ngram_offline/{engine}/{model}/{dataset}.log",
    params:
        code=code_digest("sdbench.traces.cli", "sdbench.traces.table"),
        k=TRACE_SETTINGS.get("num_speculative_tokens", 20),
    shell:
        "sdbench trace ngram --input {input} --output {output} "
        "--num-speculative-tokens {params.k} > {log} 2>&1"


rule acceptance_grid:
    input:
        engine_trace_files(),
    output:
        table=report(
            "results/acceptance/grid/table4.parquet",
            caption="../report/table4_grid.rst",
            category="Sec. 6 Acceptance",
            subcategory="In-engine traces of this run",
        ),
        markdown=report(
            "results/acceptance/grid/table4.md",
            caption="../report/table4_grid.rst",
            category="Sec. 6 Acceptance",
            subcategory="In-engine traces of this run",
        ),
        figures=report(
            directory("results/acceptance/grid/figures"),
            caption="../report/acceptance_figures_grid.rst",
            category="Sec. 6 Acceptance",
            subcategory="In-engine traces of this run",
            patterns=["{name}.png"],
        ),
    log:
        "logs/acceptance_grid.log",
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.acceptance"),
        labels=engine_trace_labels(),
    shell:
        "(sdbench acceptance table4 --traces {input} --labels {params.labels} "
        "--output {output.table} --markdown {output.markdown} && "
        "sdbench acceptance figures --traces {input} --labels {params.labels} "
        "--outdir {output.figures}) > {log} 2>&1"


rule fetch_published_traces:
    output:
        "resources/published-traces/llama3.1-8B/combined_{published}.jsonl",
    log:
        "logs/fetch_published_traces/{published}.log",
    params:
        code=code_digest("sdbench.traces.cli", "sdbench.traces.fetch"),
        local=published_local_arg,
    shell:
        "sdbench fetch published-traces --dataset {wildcards.published} "
        "--output {output} {params.local} > {log} 2>&1"


rule published_trace_table:
    input:
        "resources/published-traces/llama3.1-8B/combined_{published}.jsonl",
    output:
        "results/traces/published/{published}.parquet",
    log:
        "logs/published_trace_table/{published}.log",
    params:
        code=code_digest("sdbench.traces.cli", "sdbench.traces.table"),
    shell:
        "sdbench trace published --input {input} --output {output} > {log} 2>&1"


rule acceptance_published:
    input:
        published_trace_files(),
    output:
        table=report(
            "results/acceptance/published/table4.parquet",
            caption="../report/table4_published.rst",
            category="Sec. 6 Acceptance",
            subcategory="Published Llama-3.1-8B traces",
        ),
        markdown=report(
            "results/acceptance/published/table4.md",
            caption="../report/table4_published.rst",
            category="Sec. 6 Acceptance",
            subcategory="Published Llama-3.1-8B traces",
        ),
        figures=report(
            directory("results/acceptance/published/figures"),
            caption="../report/acceptance_figures_published.rst",
            category="Sec. 6 Acceptance",
            subcategory="Published Llama-3.1-8B traces",
            patterns=["{name}.png"],
        ),
    log:
        "logs/acceptance_published.log",
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.acceptance"),
    shell:
        "(sdbench acceptance table4 --traces {input} --output {output.table} "
        "--markdown {output.markdown} && "
        "sdbench acceptance figures --traces {input} --outdir {output.figures}) > {log} 2>&1"
