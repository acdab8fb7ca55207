# How far from the ceiling, measured on the engine: the forced-acceptance sweep's cells
# (sdbench.sweeps) as curves and ceilings, the gap to the ideal split into system and
# acceptance, and the simulator's cost model checked and refitted at those points.


rule ext13_forced_acceptance:
    input:
        cells=P.CELLS_TABLE,
    output:
        table=P.table("forced_acceptance"),
        gap_table=P.table("sd_gap"),
        markdown=paper_report("ext13_forced_acceptance", ".md"),
        figure=paper_report("ext13_forced_acceptance", ".png"),
        drawn=drawn_table("ext13_forced_acceptance"),
        gap_markdown=paper_report("ext14_sd_gap", ".md"),
        gap_figure=paper_report("ext14_sd_gap", ".png"),
        gap_drawn=drawn_table("ext14_sd_gap"),
    log:
        "logs/ext13_forced_acceptance.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.analysis.cli", "sdbench.analysis.forced"),
        methods=quoted(config["methods"]),
    shell:
        "sdbench forced-acceptance --cells {input.cells} --methods {params.methods} "
        "--table {output.table} --gap-table {output.gap_table} --markdown {output.markdown} "
        "--gap-markdown {output.gap_markdown} --figure {output.figure} "
        "--gap-figure {output.gap_figure} > {log} 2>&1"


rule ext15_simulator_at_forced:
    input:
        forced=P.table("forced_acceptance"),
        prompts=PLAN.forced_prompt_tables(),
        cost_model=P.MEASURED_COST_MODEL,
    output:
        refitted=P.FORCED_COST_MODEL,
        table=P.FORCED_CHECK,
        markdown=paper_report("ext15_simulator_at_forced", ".md"),
        figure=paper_report("ext15_simulator_at_forced", ".png"),
        drawn=drawn_table("ext15_simulator_at_forced"),
    log:
        "logs/ext15_simulator_at_forced.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.forcedcheck"),
        num_requests=PLAN.forced.get("num_requests") or 0,
        labels=quoted(PLAN.method_labels()),
    shell:
        "sdbench simulate forced-check --forced {input.forced} --prompts {input.prompts} "
        "--num-requests {params.num_requests} --cost-model {input.cost_model} "
        "--refitted {output.refitted} --labels {params.labels} --output {output.table} "
        "--markdown {output.markdown} --figure {output.figure} > {log} 2>&1"
