# Prompt sets, tokenized with each target model's tokenizer (and chat template).


# The files of a hub dataset's repository its entry selects, at its revision: a local rule
# (common.smk) on the submitting host, with the hub token and the site's network settings in its
# command's environment only; prepare_dataset reads the copy offline (its local_path).
rule download_dataset:
    output:
        directory(P.HUB_DATASET_RULE),
    log:
        "logs/download_dataset/{hub_dataset}.log",
    params:
        code=code_digest("sdbench.models.cli", "sdbench.models.hub"),
        entry=lambda w: quoted(PLAN.download_entry(w.hub_dataset)),
    run:
        shell(
            "sdbench download-dataset --name {wildcards.hub_dataset} --entry {params.entry} "
            "--output {output} > {log} 2>&1",
            additional_envvars=download_job_env(),
        )


rule prepare_dataset:
    input:
        unpack(lambda w: PLAN.prepare_inputs(w.model, w.dataset)),
    output:
        P.PROMPTS,
    log:
        "logs/prepare_dataset/{model}/{dataset}.log",
    resources:
        mem_mb=prompt_table_mem_mb,
        runtime=analysis_runtime,
    params:
        code=lambda w: code_digest(
            "sdbench.datasets.cli",
            "sdbench.datasets.prompts",
            "sdbench.datasets.randomtokens",
            "sdbench.datasets.speedbench",
            "sdbench.datasets.userprompts",
            *REHEARSAL_CODE,
            outside=PLAN.prepare_outside(w.dataset),
        ),
        entry=lambda w: quoted(PLAN.dataset_entry(w.dataset)),
        chat=lambda w: quoted(PLAN.chat_template_kwargs(w.model)),
        context=lambda w: PLAN.context_arg(w.model),
        seed=config["seed"],
        matched=lambda w, input: (
            f"--matched {shlex.quote(input.matched)}"
            if "matched" in input.keys()
            else ""
        ),
    shell:
        f"{PREPARE_DATASET} "
        "--name {wildcards.dataset} --entry {params.entry} "
        "--tokenizer {input.tokenizer} --seed {params.seed} {params.matched} {params.context} "
        "--chat-template-kwargs {params.chat} --output {output}"
        f"{REHEARSAL_PREPARE} > {{log}} 2>&1"


# SPEED-Bench's file layout with the pipeline's own prompts (a stand-in: no hub access here).
rule speed_bench_sample:
    output:
        directory(P.SPEED_BENCH_SAMPLE),
    log:
        "logs/speed_bench_sample.log",
    params:
        code=code_digest("sdbench.datasets.cli", "sdbench.datasets.speedbenchsample"),
        seed=config["seed"],
    shell:
        "sdbench speed-bench-sample --output {output} --per-category 8 --seed {params.seed} "
        "> {log} 2>&1"
