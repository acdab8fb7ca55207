# Prompt sets, tokenized with each target model's tokenizer (and chat template).


rule prepare_dataset:
    input:
        unpack(prepare_inputs),
    output:
        PROMPTS,
    log:
        "logs/prepare_dataset/{model}/{dataset}.log",
    params:
        code=code_digest(
            "sdbench.datasets.cli",
            "sdbench.datasets.prompts",
            "sdbench.datasets.randomtokens",
        ),
        entry=dataset_entry,
        chat=chat_template_kwargs,
        seed=config["seed"],
        matched=matched_arg,
    shell:
        "sdbench prepare-dataset --name {wildcards.dataset} --entry {params.entry} "
        "--tokenizer {input.tokenizer} --seed {params.seed} {params.matched} "
        "--chat-template-kwargs {params.chat} --output {output} > {log} 2>&1"
