# Prompt sets, tokenized with each target model's tokenizer (and chat template).


rule prepare_dataset:
    input:
        tokenizer=prompt_tokenizer_dir,
    output:
        "results/prompts/{model}/{dataset}.parquet",
    log:
        "logs/prepare_dataset/{model}/{dataset}.log",
    params:
        code=code_digest("sdbench.datasets.cli", "sdbench.datasets.prompts"),
        entry=dataset_entry,
        chat=chat_template_kwargs,
        seed=config["seed"],
    shell:
        "sdbench prepare-dataset --name {wildcards.dataset} --entry {params.entry} "
        "--tokenizer {input.tokenizer} --seed {params.seed} "
        "--chat-template-kwargs {params.chat} --output {output} > {log} 2>&1"
