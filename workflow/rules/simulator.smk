# Simulator (paper Sec. 8): upper bounds on the published traces (compat and exact
# modes, compat-vs-exact, adaptive policies), and validation against the grid's own
# runs with a cost model fitted from this machine's breakdown step timings (and the
# energy bound beside it, with a power model fitted from the grid's metered cells).


rule simulate_published:
    input:
        PLAN.published_jsonl(),
    output:
        P.SIM_PUBLISHED,
    log:
        "logs/simulate_published/{mode}/{proposer}.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=simulation_runtime(
            lambda w: PLAN.sim_policies(w.proposer, w.mode),
            lambda w: SIMULATOR.get("batch_sizes", []),
        ),
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.commands"),
        policies=lambda w: " ".join(PLAN.sim_policies(w.proposer, w.mode)),
        batch_sizes=" ".join(map(str, SIMULATOR.get("batch_sizes", []))),
        cost_model=SIMULATOR.get("published_cost_model", "llama3.1-8b-h100"),
    shell:
        "sdbench simulate --traces {input} --proposer {wildcards.proposer} "
        "--policy {params.policies} --batch-sizes {params.batch_sizes} "
        "--cost-model {params.cost_model} --mode {wildcards.mode} --output {output} > {log} 2>&1"


rule ext03_compat_vs_exact:
    input:
        PLAN.published_jsonl(),
    output:
        table=P.SIM_COMPAT_VS_EXACT,
        markdown=paper_report("ext03_compat_vs_exact", ".md"),
        figure=paper_report("ext03_compat_vs_exact", ".png"),
        drawn=drawn_table("ext03_compat_vs_exact"),
    log:
        "logs/ext03_compat_vs_exact.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.commands"),
        cost_model=SIMULATOR.get("published_cost_model", "llama3.1-8b-h100"),
    shell:
        "sdbench simulate compare --traces {input} --cost-model {params.cost_model} "
        "--table {output.table} --markdown {output.markdown} --figure {output.figure} "
        "> {log} 2>&1"


rule fit_cost_model:
    input:
        PLAN.breakdown_steps(),
    output:
        P.MEASURED_COST_MODEL,
    log:
        "logs/fit_cost_model.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.costmodel"),
    shell:
        "sdbench costmodel fit --steps {input} --method-column sd_method "
        "--output {output} --name measured > {log} 2>&1"


rule fit_power_model:
    input:
        cells=P.GRID_CELLS_TABLE,
    output:
        P.POWER_MODEL,
    log:
        "logs/fit_power_model.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.powermodel"),
        cells=lambda w: PLAN.sim_power_cells(),
    shell:
        "sdbench costmodel power --cells {input.cells} {params.cells} --output {output} > {log} 2>&1"


rule simulation_traces:
    input:
        unpack(sim_trace_inputs),
    output:
        P.SIM_STACKED,
    log:
        "logs/simulation_traces/{engine}/{model}/{dataset}.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.traces.cli", "sdbench.traces.table"),
    shell:
        "sdbench trace stack --inputs {input.traces} --output {output} > {log} 2>&1"


rule simulate_cells:
    input:
        unpack(sim_trace_inputs),
        stacked=P.SIM_STACKED,
        cost_model=PLAN.sim_cost_model(),
        power_model=P.POWER_MODEL,
    output:
        P.SIM_CELL,
    log:
        "logs/simulate_cells/{engine}/{model}/{dataset}/{proposer}.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=simulation_runtime(
            lambda w: PLAN.sim_cell_policies(w.proposer),
            lambda w: PLAN.sim_cell_batch_sizes(w.engine, w.model, w.dataset),
        ),
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.commands"),
        batch_sizes=sim_cell_batch_sizes,
        policies=lambda w: " ".join(PLAN.sim_cell_policies(w.proposer)),
        drafter=lambda w: PLAN.sim_preferred_drafter(w.engine, w.model, w.dataset),
    shell:
        "sdbench simulate --traces {input.stacked} --requests {input.requests} "
        "--engine {wildcards.engine} --model {wildcards.model} "
        "--proposer {wildcards.proposer} --drafter {params.drafter} --policy {params.policies} "
        "--batch-sizes {params.batch_sizes} --cost-model {input.cost_model} --mode exact "
        "--power-model {input.power_model} "
        "--output {output} > {log} 2>&1"


rule simulate_drafter_cells:
    input:
        unpack(sim_trace_inputs),
        stacked=P.SIM_STACKED,
        cost_model=PLAN.sim_cost_model(),
        power_model=P.POWER_MODEL,
    output:
        P.SIM_DRAFTER,
    log:
        "logs/simulate_drafter_cells/{engine}/{model}/{dataset}/{method}.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=simulation_runtime(
            lambda w: PLAN.sim_cell_policies("eagle"),
            lambda w: PLAN.sim_cell_batch_sizes(w.engine, w.model, w.dataset),
        ),
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.commands"),
        batch_sizes=sim_cell_batch_sizes,
        drafter=lambda w: PLAN.sim_drafter(w.method),
        policies=" ".join(PLAN.sim_cell_policies("eagle")),
    shell:
        "sdbench simulate --traces {input.stacked} --requests {input.requests} "
        "--engine {wildcards.engine} --model {wildcards.model} "
        "--proposer eagle --drafter {params.drafter} --policy {params.policies} "
        "--batch-sizes {params.batch_sizes} --cost-model {input.cost_model} --mode exact "
        "--power-model {input.power_model} "
        "--output {output} > {log} 2>&1"


rule ext05_simulated_vs_measured:
    input:
        cells=P.CELLS_TABLE,
        simulated=PLAN.sim_cell_files(),
    output:
        table=P.table("simulated_vs_measured"),
        markdown=paper_report("ext05_simulated_vs_measured"),
    log:
        "logs/ext05_simulated_vs_measured.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.validation"),
        methods=quoted(config["methods"]),
    shell:
        "sdbench validate-simulator --cells {input.cells} --simulated {input.simulated} "
        "--methods {params.methods} "
        "--output {output.table} --markdown {output.markdown} > {log} 2>&1"


# Fig. 9/11 and the adaptive-policy report of a {scope}: the published traces
# (published/<mode>, resp. published) or this run's (<engine>/<model>/<dataset>,
# resp. <engine>/<model>).


rule fig09_fixed_vs_oracle:
    input:
        lambda w: PLAN.sim_figure_inputs(w.scope),
    output:
        figure=paper_report("fig09_fixed_vs_oracle"),
        drawn=drawn_table("fig09_fixed_vs_oracle"),
    log:
        "logs/fig09_fixed_vs_oracle/{scope}.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.commands"),
    shell:
        "sdbench simulate figures --results {input} --fixed-vs-oracle {output.figure} > {log} 2>&1"


rule fig11_oracle_combine:
    input:
        lambda w: PLAN.sim_figure_inputs(w.scope),
    output:
        figure=paper_report("fig11_oracle_combine"),
        drawn=drawn_table("fig11_oracle_combine"),
    log:
        "logs/fig11_oracle_combine/{scope}.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.commands"),
    shell:
        "sdbench simulate figures --results {input} --combining {output.figure} > {log} 2>&1"


rule ext04_adaptive_policies:
    input:
        unpack(lambda w: PLAN.adaptive_inputs(w.scope)),
    output:
        table=P.SIM_ADAPTIVE,
        markdown=paper_report("ext04_adaptive_policies", ".md"),
        figure=paper_report("ext04_adaptive_policies", ".png"),
        drawn=drawn_table("ext04_adaptive_policies"),
    log:
        "logs/ext04_adaptive_policies/{scope}.log",
    resources:
        mem_mb=analysis_mem_mb,
        runtime=analysis_runtime,
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.commands"),
        args=adaptive_args,
    shell:
        "sdbench simulate adaptive-report --traces {input.traces} {params.args} "
        "--table {output.table} --markdown {output.markdown} --figure {output.figure} "
        "> {log} 2>&1"
