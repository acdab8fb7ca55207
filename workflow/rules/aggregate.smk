# Join every cell; speedups over no-SD; Tab. 1 and Fig. 1/2.


rule aggregate:
    input:
        summaries=cell_outputs("summary"),
        requests=cell_outputs("requests"),
    output:
        cells="results/tables/cells.parquet",
        lengths="results/tables/generation_lengths.parquet",
        lengths_md="results/tables/generation_lengths.md",
        divergence="results/tables/output_divergence.parquet",
    log:
        "logs/aggregate.log",
    params:
        code=code_digest("sdbench.endtoend"),
        baseline=BASELINE,
    shell:
        "sdbench aggregate --summaries {input.summaries} --requests {input.requests} "
        "--baseline {params.baseline} --cells {output.cells} --lengths {output.lengths} "
        "--lengths-md {output.lengths_md} --divergence {output.divergence} > {log} 2>&1"


rule plot_throughput:
    input:
        cells="results/tables/cells.parquet",
    output:
        throughput="results/figures/throughput.png",
        acceptance="results/figures/acceptance_per_position.png",
    log:
        "logs/plot_throughput.log",
    params:
        code=code_digest("sdbench.endtoend"),
    shell:
        "sdbench plot-throughput --cells {input.cells} --output {output.throughput} "
        "--acceptance {output.acceptance} > {log} 2>&1"


rule memory_table:
    input:
        cells="results/tables/cells.parquet",
        models=built_model_dirs(),
    output:
        table="results/tables/memory.parquet",
        figure="results/figures/memory.png",
    log:
        "logs/memory_table.log",
    params:
        code=code_digest("sdbench.memory"),
        models=memory_model_names(),
    shell:
        "sdbench memory-table --cells {input.cells} --models {params.models} "
        "--output {output.table} --figure {output.figure} > {log} 2>&1"
