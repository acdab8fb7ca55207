# Models: small Llama models trained on CPU for the embedded default, or
# Hugging Face snapshots (pinned revision) for the cluster grid.


rule build_tokenizer:
    output:
        directory(P.TOKENIZER_DIR),
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
        tokenizer=P.TOKENIZER_DIR,
    output:
        directory(P.BUILT_MODEL_RULE),
    log:
        "logs/build_model/{built_model}.log",
    benchmark:
        "benchmarks/build_model/{built_model}.tsv"
    threads: lambda w: PLAN.build_threads(w.built_model)
    params:
        code=code_digest(
            "sdbench.models.cli", "sdbench.models.tokenizer", "sdbench.models.training"
        ),
        args=lambda w: PLAN.build_args(w.built_model),
        seed=config["seed"],
    shell:
        "sdbench train-model --tokenizer {input.tokenizer} --output {output} "
        "--seed {params.seed} --threads {threads} {params.args} > {log} 2>&1"


rule build_head:
    input:
        target=lambda w: PLAN.head_target(w.head),
        tokenizer=P.TOKENIZER_DIR,
    output:
        directory(P.BUILT_HEAD_RULE),
    log:
        "logs/build_head/{head}.log",
    benchmark:
        "benchmarks/build_head/{head}.tsv"
    threads: lambda w: PLAN.head_threads(w.head)
    params:
        code=code_digest("sdbench.models.cli", "sdbench.models.eagle"),
        args=lambda w: PLAN.head_args(w.head),
        seed=config["seed"],
    shell:
        "sdbench train-head --target {input.target} --tokenizer {input.tokenizer} "
        "--output {output} --seed {params.seed} --threads {threads} {params.args} > {log} 2>&1"


# A local rule (common.smk): runs on the submitting host, online whatever the image exports, with
# the hub token and the site's network settings in its command's environment only.
rule download_model:
    output:
        directory(P.HUB_MODEL_RULE),
    log:
        "logs/download_model/{hub_model}.log",
    params:
        # A rehearsal's stand-in model is written by sdbench.rehearsal.prepare, whose prompt-set
        # code (the tiny models' corpus among it) writes no model.
        code=code_digest(
            "sdbench.models.cli",
            "sdbench.models.hub",
            *REHEARSAL_CODE,
            outside=("sdbench.datasets.corpus",),
        ),
        repo=lambda w: PLAN.hub_id(w.hub_model),
        revision=lambda w: PLAN.hub_revision(w.hub_model),
    run:
        shell(
            f"{DOWNLOAD_MODEL} "
            "--repo {params.repo} --revision {params.revision} "
            "--output {output} > {log} 2>&1",
            additional_envvars=download_job_env(),
        )
