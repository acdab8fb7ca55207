# Simulator (paper Sec. 8): upper bounds on the published traces (compat and exact
# modes, compat-vs-exact, adaptive policies), and validation against the grid's own
# runs with a cost model fitted from this machine's breakdown step timings.


rule simulate_published:
    input:
        published_jsonl(),
    output:
        report(
            "results/simulator/published/{mode}/{proposer}.csv",
            caption="../report/simulate_published.rst",
            category="Sec. 8 Simulator",
            subcategory="Published traces, {mode} mode",
        ),
    log:
        "logs/simulate_published/{mode}/{proposer}.log",
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.commands"),
        policies=sim_policies,
        batch_sizes=" ".join(map(str, SIMULATOR.get("batch_sizes", []))),
        cost_model=SIMULATOR.get("published_cost_model", "llama3.1-8b-h100"),
    shell:
        "sdbench simulate --traces {input} --proposer {wildcards.proposer} "
        "--policy {params.policies} --batch-sizes {params.batch_sizes} "
        "--cost-model {params.cost_model} --mode {wildcards.mode} --output {output} > {log} 2>&1"


rule simulate_published_figures:
    input:
        expand(
            "results/simulator/published/{{mode}}/{proposer}.csv",
            proposer=["ngram", "eagle", "combined"],
        ),
    output:
        report(
            directory("results/simulator/published/{mode}/figures"),
            caption="../report/simulator_figures.rst",
            category="Sec. 8 Simulator",
            subcategory="Published traces, {mode} mode",
            patterns=["{name}.png"],
        ),
    log:
        "logs/simulate_published_figures/{mode}.log",
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.commands"),
    shell:
        "sdbench simulate figures --results {input} --output-dir {output} > {log} 2>&1"


rule simulate_compare:
    input:
        published_jsonl(),
    output:
        report(
            directory("results/simulator/published/compare"),
            caption="../report/simulate_compare.rst",
            category="Sec. 8 Simulator",
            subcategory="Published traces, compat vs exact",
            patterns=["{name}.png", "{name}.md", "{name}.csv"],
        ),
    log:
        "logs/simulate_compare.log",
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.commands"),
        cost_model=SIMULATOR.get("published_cost_model", "llama3.1-8b-h100"),
    shell:
        "sdbench simulate compare --traces {input} --cost-model {params.cost_model} "
        "--output-dir {output} > {log} 2>&1"


rule simulate_adaptive:
    input:
        published_jsonl(),
    output:
        report(
            directory("results/simulator/published/adaptive"),
            caption="../report/simulate_adaptive.rst",
            category="Sec. 8 Simulator",
            subcategory="Published traces, adaptive policies",
            patterns=["{name}.png", "{name}.md", "{name}.csv"],
        ),
    log:
        "logs/simulate_adaptive.log",
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.commands"),
    shell:
        "sdbench simulate adaptive-report --traces {input} --output-dir {output} > {log} 2>&1"


rule fit_cost_model:
    input:
        breakdown_steps(),
    output:
        report(
            "results/cost_models/measured.yaml",
            caption="../report/cost_model.rst",
            category="Sec. 8 Simulator",
            subcategory="Validation on this run",
        ),
    log:
        "logs/fit_cost_model.log",
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.costmodel"),
    shell:
        "sdbench costmodel fit --steps {input} --method-column sd_method "
        "--output {output} --name measured > {log} 2>&1"


rule simulation_traces:
    input:
        unpack(sim_trace_inputs),
    output:
        "results/simulator/cells/{engine}/{model}/{dataset}/{dataset}.parquet",
    log:
        "logs/simulation_traces/{engine}/{model}/{dataset}.log",
    params:
        code=code_digest("sdbench.traces.cli", "sdbench.traces.table"),
    shell:
        "sdbench trace stack --inputs {input.traces} --output {output} > {log} 2>&1"


rule simulate_cells:
    input:
        unpack(sim_trace_inputs),
        stacked="results/simulator/cells/{engine}/{model}/{dataset}/{dataset}.parquet",
        cost_model="results/cost_models/measured.yaml",
    output:
        report(
            "results/simulator/cells/{engine}/{model}/{dataset}/{proposer}.csv",
            caption="../report/simulate_cells.rst",
            category="Sec. 8 Simulator",
            subcategory="Validation on this run",
        ),
    log:
        "logs/simulate_cells/{engine}/{model}/{dataset}/{proposer}.log",
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.commands"),
        batch_sizes=sim_cell_batch_sizes,
        policies=sim_cell_policies,
        drafter=sim_preferred_drafter,
    shell:
        "sdbench simulate --traces {input.stacked} --requests {input.requests} "
        "--proposer {wildcards.proposer} --drafter {params.drafter} --policy {params.policies} "
        "--batch-sizes {params.batch_sizes} --cost-model {input.cost_model} --mode exact "
        "--output {output} > {log} 2>&1"


rule simulate_drafter_cells:
    input:
        unpack(sim_trace_inputs),
        stacked="results/simulator/cells/{engine}/{model}/{dataset}/{dataset}.parquet",
        cost_model="results/cost_models/measured.yaml",
    output:
        "results/simulator/cells/{engine}/{model}/{dataset}/drafters/{method}.csv",
    log:
        "logs/simulate_drafter_cells/{engine}/{model}/{dataset}/{method}.log",
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.commands"),
        batch_sizes=sim_cell_batch_sizes,
        drafter=sim_drafter,
        policies=sim_drafter_policies,
    shell:
        "sdbench simulate --traces {input.stacked} --requests {input.requests} "
        "--proposer eagle --drafter {params.drafter} --policy {params.policies} "
        "--batch-sizes {params.batch_sizes} --cost-model {input.cost_model} --mode exact "
        "--output {output} > {log} 2>&1"


rule validate_simulator:
    input:
        cells="results/tables/cells.parquet",
        simulated=sim_cell_files(),
    output:
        table=report(
            "results/tables/simulated_vs_measured.parquet",
            caption="../report/simulated_vs_measured.rst",
            category="Sec. 8 Simulator",
            subcategory="Validation on this run",
        ),
        markdown=report(
            "results/tables/simulated_vs_measured.md",
            caption="../report/simulated_vs_measured.rst",
            category="Sec. 8 Simulator",
            subcategory="Validation on this run",
        ),
    log:
        "logs/validate_simulator.log",
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.validation"),
        methods=methods_json(),
    shell:
        "sdbench validate-simulator --cells {input.cells} --simulated {input.simulated} "
        "--methods {params.methods} "
        "--output {output.table} --markdown {output.markdown} > {log} 2>&1"


rule simulate_cells_figures:
    input:
        expand(
            "results/simulator/cells/{{engine}}/{{model}}/{{dataset}}/{proposer}.csv",
            proposer=["ngram", "eagle", "combined"],
        ),
    output:
        report(
            directory("results/simulator/cells/{engine}/{model}/{dataset}/figures"),
            caption="../report/simulator_figures.rst",
            category="Sec. 8 Simulator",
            subcategory="Validation on this run",
            patterns=["{name}.png"],
        ),
    log:
        "logs/simulate_cells_figures/{engine}/{model}/{dataset}.log",
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.commands"),
    shell:
        "sdbench simulate figures --results {input} --output-dir {output} > {log} 2>&1"


rule simulate_adaptive_cells:
    input:
        unpack(adaptive_cell_inputs),
        cost_model="results/cost_models/measured.yaml",
    output:
        report(
            directory("results/simulator/cells/{engine}/{model}/adaptive"),
            caption="../report/adaptive_cells.rst",
            category="Sec. 8 Simulator",
            subcategory="Validation on this run",
            patterns=["{name}.png", "{name}.md", "{name}.csv"],
        ),
    log:
        "logs/simulate_adaptive_cells/{engine}/{model}.log",
    params:
        code=code_digest("sdbench.simulator.cli", "sdbench.simulator.commands"),
        args=adaptive_cell_args,
    shell:
        "sdbench simulate adaptive-report --traces {input.stacked} --requests {input.requests} "
        "--cost-model {input.cost_model} {params.args} --output-dir {output} > {log} 2>&1"
