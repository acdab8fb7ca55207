# Acceptance tracing (paper Sec. 6): in-engine traces of the grid's SD methods,
# offline n-gram and suffix-decoding traces of the no-SD outputs, the published traces, and the
# acceptance tables and figures drawn from trace tables only.


rule trace_group:
    input:
        unpack(trace_group_inputs),
        model=target_dir,
    output:
        directory(P.TRACE_GROUP_DIR),
    log:
        "logs/trace_group/{engine}/{model}/{method}.log",
    benchmark:
        "benchmarks/trace_group/{engine}/{model}/{method}.tsv"
    container:
        cell_container
    threads: TIMED_THREADS
    resources:
        # One node: a tensor-parallel engine's GPUs must not be split across nodes (sbatch --nodes=1).
        nodes=1,
        gpu=cell_gpus,
        mem_mb=trace_group_mem_mb,
        runtime=trace_group_runtime,
    params:
        code=MEASUREMENT_CODE,
        image=cell_image,
        spec=lambda w: spec_ref(PLAN.trace_group_spec(_trace_group(w))),
        drafter=drafter_arg,
        k=TRACE_SETTINGS.get("num_speculative_tokens", 20),
        seqs=TRACE_SETTINGS.get("max_num_seqs", 8),
        checkpoints=lambda w: P.TRACE_CHECKPOINT_DIR.format(**w),
    shell:
        "sdbench trace-group --spec @{params.spec} --model-dir {input.model} {params.drafter} "
        "--num-speculative-tokens {params.k} --max-num-seqs {params.seqs} --threads {threads} "
        "--checkpoint-dir {params.checkpoints} --output-dir {output} > {log} 2>&1"


rule trace_cell:
    input:
        lambda w: PLAN.trace_group_dir(
            TraceTarget(w.engine, w.model, w.dataset, w.method)
        ),
    output:
        trace=P.ENGINE_TRACE,
        requests=P.ENGINE_REQUESTS,
    log:
        "logs/trace_cell/{engine}/{model}/{dataset}/{method}.log",
    localrule: True
    params:
        code=MEASUREMENT_CODE,
    shell:
        "sdbench trace-tables --group-dir {input} --dataset {wildcards.dataset} "
        "--trace {output.trace} --requests {output.requests} > {log} 2>&1"


rule trace_ngram_offline:
    input:
        unpack(baseline_outputs),
    output:
        P.OFFLINE_NGRAM,
    log:
        "logs/trace_ngram_offline/{engine}/{model}/{dataset}.log",
    resources:
        mem_mb=parsed_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.traces.cli", "sdbench.traces.table"),
        k=TRACE_SETTINGS.get("num_speculative_tokens", 20),
    shell:
        "sdbench trace ngram --input {input.requests} --prompts {input.prompts} --output {output} "
        "--num-speculative-tokens {params.k} > {log} 2>&1"


rule trace_suffix_offline:
    input:
        unpack(baseline_outputs),
    output:
        P.OFFLINE_SUFFIX,
    log:
        "logs/trace_suffix_offline/{engine}/{model}/{dataset}.log",
    resources:
        mem_mb=parsed_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.traces.cli", "sdbench.traces.table"),
        k=TRACE_SETTINGS.get("num_speculative_tokens", 20),
        settings=PLAN.suffix_trace_args(),
    shell:
        "sdbench trace suffix --input {input.requests} --prompts {input.prompts} --output {output} "
        "--num-speculative-tokens {params.k} {params.settings} > {log} 2>&1"


# A local rule (common.smk): the download runs on the submitting host, with the site's network
# settings in its command's environment only.
rule fetch_published_traces:
    output:
        P.PUBLISHED_JSONL,
    log:
        "logs/fetch_published_traces/{published}.log",
    params:
        code=code_digest("sdbench.traces.cli", "sdbench.traces.fetch"),
        local=published_local_arg,
    run:
        shell(
            "sdbench fetch published-traces --dataset {wildcards.published} "
            "--output {output} {params.local} > {log} 2>&1",
            additional_envvars=download_job_env(),
        )


rule published_trace_table:
    input:
        P.PUBLISHED_JSONL,
    output:
        P.PUBLISHED_TRACE,
    log:
        "logs/published_trace_table/{published}.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.traces.cli", "sdbench.traces.table"),
    shell:
        "sdbench trace published --input {input} --output {output} > {log} 2>&1"


# The acceptance items of the figure index (sdbench.figureindex), each over a
# {source} (grid | published) or a per-dataset {scope} (<engine>/<model>/<dataset> |
# published/<dataset>).


rule tab04_generated_length:
    input:
        acceptance_traces,
    output:
        table=P.ACCEPTANCE_TABLE4,
        markdown=paper_report("tab04_generated_length"),
    log:
        "logs/tab04_generated_length/{source}.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.acceptance"),
        labels=acceptance_labels,
    shell:
        "sdbench acceptance table4 --traces {input} {params.labels} "
        "--output {output.table} --markdown {output.markdown} > {log} 2>&1"


rule fig04_acceptance_heatmap:
    input:
        acceptance_traces,
    output:
        figure=paper_report("fig04_acceptance_heatmap"),
        drawn=drawn_table("fig04_acceptance_heatmap"),
    log:
        "logs/fig04_acceptance_heatmap/{scope}.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.acceptance"),
        labels=acceptance_labels,
    shell:
        "sdbench acceptance figure heatmap --traces {input} {params.labels} "
        "--output {output.figure} > {log} 2>&1"


rule fig05_position_deciles:
    input:
        acceptance_traces,
    output:
        figure=paper_report("fig05_position_deciles"),
        drawn=drawn_table("fig05_position_deciles"),
        data=P.ACCEPTANCE_DECILES,
    log:
        "logs/fig05_position_deciles/{scope}.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.acceptance"),
        labels=acceptance_labels,
    shell:
        "sdbench acceptance figure deciles --traces {input} {params.labels} "
        "--output {output.figure} --data {output.data} > {log} 2>&1"


rule fig06_request_acceptance:
    input:
        acceptance_traces,
    output:
        figure=paper_report("fig06_request_acceptance"),
        drawn=drawn_table("fig06_request_acceptance"),
        data=P.ACCEPTANCE_BOXES,
    log:
        "logs/fig06_request_acceptance/{source}.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.acceptance"),
        labels=acceptance_labels,
    shell:
        "sdbench acceptance figure requests --traces {input} {params.labels} "
        "--output {output.figure} --data {output.data} > {log} 2>&1"


rule fig10_ngram_minus_eagle:
    input:
        acceptance_traces,
    output:
        figure=paper_report("fig10_ngram_minus_eagle"),
        drawn=drawn_table("fig10_ngram_minus_eagle"),
        data=P.ACCEPTANCE_DIFFERENCE,
    log:
        "logs/fig10_ngram_minus_eagle/{scope}.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.acceptance"),
        labels=acceptance_labels,
    shell:
        "sdbench acceptance figure difference --traces {input} {params.labels} "
        "--output {output.figure} --data {output.data} > {log} 2>&1"
