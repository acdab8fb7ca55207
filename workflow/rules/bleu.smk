# BLEU bucketing (paper Sec. 7): prompt/output overlap of the no-SD outputs, and
# n-gram's speedup relative to a learned/draft-model method per bucket (Fig. 8).


rule bleu_buckets:
    input:
        unpack(baseline_outputs),
    output:
        P.BLEU_BUCKETS,
    log:
        "logs/bleu_buckets/{engine}/{model}/{dataset}.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.bleu"),
        order=BLEU.get("order", 4),
    shell:
        "sdbench bleu buckets --input {input.requests} --prompts {input.prompts} "
        "--output {output} --order {params.order} > {log} 2>&1"


rule fig08_bleu_measured:
    input:
        calls=lambda w: PLAN.bleu_calls(w.engine, w.model, w.dataset),
        baseline_calls=lambda w: PLAN.bleu_calls(
            w.engine, w.model, w.dataset, "baseline_calls"
        ),
        buckets=P.BLEU_BUCKETS,
    output:
        table=P.BLEU_MEASURED,
        figure=paper_report("fig08_bleu_measured"),
        drawn=drawn_table("fig08_bleu_measured"),
    log:
        "logs/fig08_bleu_measured/{engine}/{model}/{dataset}.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.bleu"),
        baseline=PLAN.baseline,
        ngram=BLEU.get("ngram", ""),
        versus=BLEU.get("versus", ""),
    shell:
        "sdbench bleu measured --calls {input.calls} --baseline-calls {input.baseline_calls} "
        "--buckets {input.buckets} "
        "--baseline {params.baseline} --ngram {params.ngram} --versus {params.versus} "
        "--output {output.table} --figure {output.figure} > {log} 2>&1"


rule bleu_buckets_published:
    input:
        P.PUBLISHED_JSONL,
    output:
        P.BLEU_PUBLISHED_BUCKETS,
    log:
        "logs/bleu_buckets_published/{published}.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.bleu"),
        order=BLEU.get("order", 4),
    shell:
        "sdbench bleu buckets --input {input} --output {output} --order {params.order} > {log} 2>&1"


rule fig08_bleu_simulated:
    input:
        traces=P.PUBLISHED_JSONL,
        buckets=P.BLEU_PUBLISHED_BUCKETS,
    output:
        table=P.BLEU_SIMULATED,
        figure=paper_report("fig08_bleu_simulated"),
        drawn=drawn_table("fig08_bleu_simulated"),
    log:
        "logs/fig08_bleu_simulated/{published}/{ngram_policy}.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=simulation_runtime(
            lambda w: [w.ngram_policy, BLEU.get("published_versus_policy", "fixed-3")],
            lambda w: SIMULATOR.get("batch_sizes", []),
        ),
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.bleu"),
        versus=BLEU.get("published_versus_policy", "fixed-3"),
        batch_sizes=" ".join(map(str, SIMULATOR.get("batch_sizes", []))),
        cost_model=SIMULATOR.get("published_cost_model", "llama3.1-8b-h100"),
    shell:
        "sdbench bleu simulated --traces {input.traces} --buckets {input.buckets} "
        "--ngram-policy {wildcards.ngram_policy} --versus-policy {params.versus} "
        "--batch-sizes {params.batch_sizes} --cost-model {params.cost_model} --mode exact "
        "--output {output.table} --figure {output.figure} > {log} 2>&1"
