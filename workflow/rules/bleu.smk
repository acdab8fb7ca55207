# BLEU bucketing (paper Sec. 7): prompt/output overlap of the no-SD outputs, and
# n-gram's speedup relative to a learned/draft-model method per bucket (Fig. 8).


rule bleu_buckets:
    input:
        baseline_requests,
    output:
        "results/bleu/{engine}/{model}/{dataset}/buckets.parquet",
    log:
        "logs/bleu_buckets/{engine}/{model}/{dataset}.log",
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.bleu"),
        order=BLEU["order"] if BLEU else 4,
    shell:
        "sdbench bleu buckets --input {input} --output {output} --order {params.order} > {log} 2>&1"


rule fig08_bleu_measured:
    input:
        calls=bleu_calls,
        buckets="results/bleu/{engine}/{model}/{dataset}/buckets.parquet",
    output:
        table="results/bleu/{engine}/{model}/{dataset}/fig8_measured.parquet",
        figure=paper_report("fig08_bleu_measured"),
    log:
        "logs/fig08_bleu_measured/{engine}/{model}/{dataset}.log",
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.bleu"),
        baseline=BASELINE,
        ngram=BLEU["ngram"] if BLEU else "",
        versus=BLEU["versus"] if BLEU else "",
    shell:
        "sdbench bleu measured --calls {input.calls} --buckets {input.buckets} "
        "--baseline {params.baseline} --ngram {params.ngram} --versus {params.versus} "
        "--output {output.table} --figure {output.figure} > {log} 2>&1"


rule bleu_buckets_published:
    input:
        PUBLISHED_JSONL,
    output:
        "results/bleu/published/{published}/buckets.parquet",
    log:
        "logs/bleu_buckets_published/{published}.log",
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.bleu"),
        order=BLEU["order"] if BLEU else 4,
    shell:
        "sdbench bleu buckets --input {input} --output {output} --order {params.order} > {log} 2>&1"


rule fig08_bleu_simulated:
    input:
        traces=PUBLISHED_JSONL,
        buckets="results/bleu/published/{published}/buckets.parquet",
    output:
        table="results/bleu/published/{published}/fig8_ngram-{ngram_policy}.parquet",
        figure=paper_report("fig08_bleu_simulated"),
    log:
        "logs/fig08_bleu_simulated/{published}/{ngram_policy}.log",
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.bleu"),
        versus=BLEU.get("published_versus_policy", "fixed-3") if BLEU else "fixed-3",
        batch_sizes=" ".join(map(str, SIMULATOR.get("batch_sizes", []))),
        cost_model=SIMULATOR.get("published_cost_model", "llama3.1-8b-h100"),
    shell:
        "sdbench bleu simulated --traces {input.traces} --buckets {input.buckets} "
        "--ngram-policy {wildcards.ngram_policy} --versus-policy {params.versus} "
        "--batch-sizes {params.batch_sizes} --cost-model {params.cost_model} --mode exact "
        "--output {output.table} --figure {output.figure} > {log} 2>&1"
