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
        order=BLEU["order"] if BLEU else 4,
    shell:
        "sdbench bleu buckets --input {input} --output {output} --order {params.order} > {log} 2>&1"


rule bleu_measured:
    input:
        calls=bleu_calls,
        buckets="results/bleu/{engine}/{model}/{dataset}/buckets.parquet",
    output:
        table="results/bleu/{engine}/{model}/{dataset}/fig8_measured.parquet",
        figure="results/bleu/{engine}/{model}/{dataset}/fig8_measured.png",
    log:
        "logs/bleu_measured/{engine}/{model}/{dataset}.log",
    params:
        baseline=BASELINE,
        ngram=BLEU["ngram"] if BLEU else "",
        versus=BLEU["versus"] if BLEU else "",
    shell:
        "sdbench bleu measured --calls {input.calls} --buckets {input.buckets} "
        "--baseline {params.baseline} --ngram {params.ngram} --versus {params.versus} "
        "--output {output.table} --figure {output.figure} > {log} 2>&1"
