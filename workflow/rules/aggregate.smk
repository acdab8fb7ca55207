# Join every cell; speedups over no-SD; Tab. 1 and Fig. 1/2.


rule aggregate:
    input:
        summaries=cell_outputs("summary"),
        requests=cell_outputs("requests"),
    output:
        cells=report(
            "results/tables/cells.parquet",
            caption="../report/cells.rst",
            category="Sec. 3 End-to-end throughput",
            subcategory="Tables",
        ),
        lengths=report(
            "results/tables/generation_lengths.parquet",
            caption="../report/generation_lengths.rst",
            category="Sec. 3 End-to-end throughput",
            subcategory="Tables",
        ),
        lengths_md=report(
            "results/tables/generation_lengths.md",
            caption="../report/generation_lengths.rst",
            category="Sec. 3 End-to-end throughput",
            subcategory="Tables",
        ),
        divergence=report(
            "results/tables/output_divergence.parquet",
            caption="../report/output_divergence.rst",
            category="Sec. 3 End-to-end throughput",
            subcategory="Tables",
        ),
    log:
        "logs/aggregate.log",
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.endtoend"),
        baseline=BASELINE,
    shell:
        "sdbench aggregate --summaries {input.summaries} --requests {input.requests} "
        "--baseline {params.baseline} --cells {output.cells} --lengths {output.lengths} "
        "--lengths-md {output.lengths_md} --divergence {output.divergence} > {log} 2>&1"


rule plot_throughput:
    input:
        cells="results/tables/cells.parquet",
    output:
        throughput=report(
            "results/figures/throughput.png",
            caption="../report/throughput.rst",
            category="Sec. 3 End-to-end throughput",
            subcategory="Figures",
        ),
        acceptance=report(
            "results/figures/acceptance_per_position.png",
            caption="../report/acceptance_per_position.rst",
            category="Sec. 6 Acceptance",
            subcategory="Run-cell counters",
        ),
    log:
        "logs/plot_throughput.log",
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.endtoend"),
    shell:
        "sdbench plot-throughput --cells {input.cells} --output {output.throughput} "
        "--acceptance {output.acceptance} > {log} 2>&1"


rule memory_table:
    input:
        cells="results/tables/cells.parquet",
        models=built_model_dirs(),
    output:
        table=report(
            "results/tables/memory.parquet",
            caption="../report/memory.rst",
            category="Sec. 5 Memory and runtime breakdown",
            subcategory="Memory (Sec. 5.2)",
        ),
        figure=report(
            "results/figures/memory.png",
            caption="../report/memory.rst",
            category="Sec. 5 Memory and runtime breakdown",
            subcategory="Memory (Sec. 5.2)",
        ),
    log:
        "logs/memory_table.log",
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.memory"),
        models=memory_model_names(),
    shell:
        "sdbench memory-table --cells {input.cells} --models {params.models} "
        "--output {output.table} --figure {output.figure} > {log} 2>&1"
