# Join every cell; speedups over no-SD; Tab. 1, Fig. 1/2, memory (Tab. 2/3). The grid's own
# cells are joined apart as soon as they are measured (priority FIRST): the verdict and Fig. 1
# read them, and are written before the extensions' engines start.


rule join_grid_cells:
    input:
        summaries=PLAN.grid_cell_outputs("summary"),
        calls=PLAN.grid_cell_outputs("calls"),
        baseline_calls=PLAN.grid_cell_outputs("baseline_calls"),
    output:
        cells=P.GRID_CELLS_TABLE,
    log:
        "logs/join_grid_cells.log",
    priority: FIRST
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.endtoend"),
        baseline=PLAN.baseline,
        sweeps=quoted(PLAN.sweep_variants()),
    shell:
        "sdbench aggregate --summaries {input.summaries} --calls {input.calls} "
        "--baseline-calls {input.baseline_calls} --baseline {params.baseline} "
        "--sweeps {params.sweeps} --cells {output.cells} > {log} 2>&1"


rule aggregate:
    input:
        summaries=PLAN.cell_outputs("summary"),
        calls=PLAN.cell_outputs("calls"),
        baseline_calls=PLAN.cell_outputs("baseline_calls"),
        requests=PLAN.cell_outputs("requests"),
    output:
        cells=P.CELLS_TABLE,
        speedups=paper_report("ext01_speedups"),
        lengths=P.table("generation_lengths"),
        lengths_md=paper_report("tab01_generation_length"),
        divergence=P.table("output_divergence"),
        divergence_md=paper_report("ext06_output_divergence"),
    log:
        "logs/aggregate.log",
    resources:
        mem_mb=streamed_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.endtoend"),
        baseline=PLAN.baseline,
        sweeps=quoted(PLAN.sweep_variants()),
    shell:
        "sdbench aggregate --summaries {input.summaries} --calls {input.calls} "
        "--baseline-calls {input.baseline_calls} --requests {input.requests} "
        "--baseline {params.baseline} --sweeps {params.sweeps} --cells {output.cells} "
        "--speedups-md {output.speedups} --lengths {output.lengths} "
        "--lengths-md {output.lengths_md} --divergence {output.divergence} "
        "--divergence-md {output.divergence_md} > {log} 2>&1"


# The paper's question per model x method x dataset: does SD pay, up to which load (ext00).
rule ext00_verdict:
    input:
        # Server mode: the frontier and max-load table (ext17) beside the goodput squares.
        unpack(lambda w: PLAN.verdict_page_inputs()),
    output:
        table=P.table("verdict"),
        markdown=paper_report("ext00_verdict", ".md"),
        figure=paper_report("ext00_verdict", ".png"),
        drawn=drawn_table("ext00_verdict"),
    log:
        "logs/ext00_verdict.log",
    priority: FIRST
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest(
            "sdbench.analysis.cli",
            "sdbench.analysis.verdict",
            "sdbench.analysis.goodputfrontier",
            "sdbench.analysis.modeparity",
        ),
        labels=quoted(PLAN.method_labels()),
        margin=PLAN.equivalence_margin,
        server=lambda wildcards, input: (
            f"--server {input.server}" if "server" in input.keys() else ""
        ),
        frontier=lambda wildcards, input: (
            f"--frontier {input.frontier} --max-load {input.max_load}"
            if "frontier" in input.keys()
            else ""
        ),
    shell:
        "sdbench verdict --cells {input.cells} {params.server} {params.frontier} --labels {params.labels} "
        "--equivalence-margin {params.margin} --output {output.table} "
        "--markdown {output.markdown} --figure {output.figure} > {log} 2>&1"


# Offline vs served speedup at the same load, side by side, with the stream-off control and the
# measured reason they differ (ext18; issue #50 item 4).
rule ext18_offline_vs_served:
    input:
        unpack(lambda w: PLAN.verdict_inputs()),
    output:
        table=P.table("offline_vs_served"),
        markdown=paper_report("ext18_offline_vs_served", ".md"),
    log:
        "logs/ext18_offline_vs_served.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest(
            "sdbench.analysis.cli",
            "sdbench.analysis.modeparity",
            "sdbench.analysis.verdict",
        ),
        labels=quoted(PLAN.method_labels()),
    shell:
        "sdbench mode-parity --cells {input.cells} --server {input.server} --labels {params.labels} "
        "--output {output.table} --markdown {output.markdown} > {log} 2>&1"


rule fig01_end_to_end:
    input:
        cells=P.GRID_CELLS_TABLE,
    output:
        figure=paper_report("fig01_end_to_end"),
        drawn=drawn_table("fig01_end_to_end"),
    log:
        "logs/fig01_end_to_end.log",
    priority: FIRST
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.endtoend"),
    shell:
        "sdbench plot-throughput --cells {input.cells} --output {output.figure} > {log} 2>&1"


rule ext02_acceptance_per_position:
    input:
        cells=P.CELLS_TABLE,
    output:
        figure=paper_report("ext02_acceptance_per_position"),
        drawn=drawn_table("ext02_acceptance_per_position"),
    log:
        "logs/ext02_acceptance_per_position.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.endtoend"),
    shell:
        "sdbench plot-throughput --cells {input.cells} --acceptance {output.figure} > {log} 2>&1"


rule tab02_memory:
    input:
        cells=P.CELLS_TABLE,
        models=PLAN.built_model_dirs(),
    output:
        table=P.table("memory"),
        markdown=paper_report("tab02_memory", ".md"),
        figure=paper_report("tab02_memory", ".png"),
        drawn=drawn_table("tab02_memory"),
    log:
        "logs/tab02_memory.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.memory"),
        models=quoted(PLAN.memory_model_names()),
    shell:
        "sdbench memory-table --cells {input.cells} --models {params.models} "
        "--output {output.table} --markdown {output.markdown} --figure {output.figure} > {log} 2>&1"


# Cost per 1M output tokens (config `cost`; without it, not a target).
rule ext07_cost:
    input:
        cells=P.CELLS_TABLE,
    output:
        table=P.table("cost"),
        markdown=paper_report("ext07_cost", ".md"),
        figure=paper_report("ext07_cost", ".png"),
        drawn=drawn_table("ext07_cost"),
    log:
        "logs/ext07_cost.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.cost"),
        prices=quoted(PLAN.cost_prices()),
        devices=quoted(PLAN.model_devices()),
        currency=COST.get("currency", "USD"),
        source=COST.get("source", ""),
    shell:
        "sdbench cost --cells {input.cells} --prices {params.prices} --devices {params.devices} "
        "--currency {params.currency:q} --source {params.source:q} --output {output.table} "
        "--markdown {output.markdown} --figure {output.figure} > {log} 2>&1"


# Joules per output token beside tokens/s, and SD's energy ratio (the meter of every timed call).
rule ext16_energy_per_token:
    input:
        cells=P.CELLS_TABLE,
    output:
        table=P.table("energy"),
        markdown=paper_report("ext16_energy_per_token", ".md"),
        figure=paper_report("ext16_energy_per_token", ".png"),
        drawn=drawn_table("ext16_energy_per_token"),
    log:
        "logs/ext16_energy_per_token.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.energy"),
    shell:
        "sdbench energy --cells {input.cells} --output {output.table} "
        "--markdown {output.markdown} --figure {output.figure} > {log} 2>&1"


rule ext08_proposal_length:
    input:
        cells=P.CELLS_TABLE,
        memory=P.table("memory"),
    output:
        table=P.table("proposal_length"),
        markdown=paper_report("ext08_proposal_length", ".md"),
        figure=paper_report("ext08_proposal_length", ".png"),
        drawn=drawn_table("ext08_proposal_length"),
    log:
        "logs/ext08_proposal_length.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.proposal"),
        points=quoted(PLAN.proposal_length_points()),
        scope=quoted(PLAN.proposal_length_scope()),
    shell:
        "sdbench proposal-length --cells {input.cells} --memory {input.memory} "
        "--points {params.points} --scope {params.scope} --output {output.table} "
        "--markdown {output.markdown} "
        "--figure {output.figure} > {log} 2>&1"


rule ext09_random_inputs:
    input:
        cells=P.CELLS_TABLE,
    output:
        table=P.table("random_inputs"),
        markdown=paper_report("ext09_random_inputs", ".md"),
        figure=paper_report("ext09_random_inputs", ".png"),
        drawn=drawn_table("ext09_random_inputs"),
    log:
        "logs/ext09_random_inputs.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.randominputs"),
        pairs=quoted(PLAN.random_pairs),
    shell:
        "sdbench random-inputs --cells {input.cells} --pairs {params.pairs} "
        "--output {output.table} --markdown {output.markdown} --figure {output.figure} > {log} 2>&1"


# Temperature sweep (config `temperature`; without it, not a target).
rule ext10_temperature:
    input:
        cells=P.CELLS_TABLE,
    output:
        table=P.table("temperature"),
        recommendation=P.table("temperature_recommendation"),
        markdown=paper_report("ext10_temperature", ".md"),
        figure=paper_report("ext10_temperature", ".png"),
        drawn=drawn_table("ext10_temperature"),
    log:
        "logs/ext10_temperature.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.temperature"),
        points=quoted(PLAN.temperature_points()),
        scope=quoted(PLAN.temperature_scope()),
    shell:
        "sdbench temperature --cells {input.cells} --points {params.points} "
        "--scope {params.scope} --output {output.table} "
        "--recommendation {output.recommendation} --markdown {output.markdown} "
        "--figure {output.figure} > {log} 2>&1"


# Acceptance per SPEED-Bench category (datasets with builder speed_bench).
rule ext12_speed_bench_categories:
    input:
        unpack(lambda w: PLAN.speed_bench_inputs()),
    output:
        table=P.table("category_acceptance"),
        markdown=paper_report("ext12_speed_bench_categories", ".md"),
        figure=paper_report("ext12_speed_bench_categories", ".png"),
        drawn=drawn_table("ext12_speed_bench_categories"),
    log:
        "logs/ext12_speed_bench_categories.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.categories"),
        seed=config["seed"],
        counters=lambda w, input: " ".join(
            [f"--requests {' '.join(input.requests)}"] * bool(input.requests)
            + [f"--calls {' '.join(input.calls)}"] * bool(input.calls)
        ),
    shell:
        "sdbench category-acceptance {params.counters} --prompts {input.prompts} "
        "--seed {params.seed} --table {output.table} --markdown {output.markdown} "
        "--figure {output.figure} > {log} 2>&1"
