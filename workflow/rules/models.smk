# Models: small Llama models trained on CPU for the embedded default, or
# Hugging Face snapshots (pinned revision) for the cluster grid.


rule build_tokenizer:
    output:
        directory("results/models/tokenizer"),
    log:
        "logs/build_tokenizer.log",
    params:
        code=code_digest(
            "sdbench.models.cli", "sdbench.models.tokenizer", "sdbench.models.training"
        ),
        seed=config["seed"],
    shell:
        "sdbench build-tokenizer --output {output} --seed {params.seed} > {log} 2>&1"


rule build_model:
    input:
        tokenizer="results/models/tokenizer",
    output:
        directory("results/models/built/{built_model}"),
    log:
        "logs/build_model/{built_model}.log",
    benchmark:
        "benchmarks/build_model/{built_model}.tsv"
    threads: build_threads
    params:
        code=code_digest(
            "sdbench.models.cli", "sdbench.models.tokenizer", "sdbench.models.training"
        ),
        args=build_args,
        seed=config["seed"],
    shell:
        "sdbench train-model --tokenizer {input.tokenizer} --output {output} "
        "--seed {params.seed} --threads {threads} {params.args} > {log} 2>&1"


rule build_head:
    input:
        target=head_target,
        tokenizer="results/models/tokenizer",
    output:
        directory("results/models/built/{head}"),
    log:
        "logs/build_head/{head}.log",
    benchmark:
        "benchmarks/build_head/{head}.tsv"
    threads: head_threads
    params:
        code=code_digest("sdbench.models.cli", "sdbench.models.eagle"),
        args=head_args,
        seed=config["seed"],
    shell:
        "sdbench train-head --target {input.target} --tokenizer {input.tokenizer} "
        "--output {output} --seed {params.seed} --threads {threads} {params.args} > {log} 2>&1"


rule download_model:
    output:
        directory("resources/hub/{hub_model}"),
    log:
        "logs/download_model/{hub_model}.log",
    params:
        code=code_digest("sdbench.models.cli", "sdbench.models.hub"),
        repo=hub_id,
        revision=hub_revision,
    shell:
        "sdbench download-model --repo {params.repo} --revision {params.revision} "
        "--output {output} > {log} 2>&1"
