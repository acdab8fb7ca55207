"""The plan (sdbench.workflow.plan): what the DAG derives from the config, without Snakemake."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO
from sdbench.config import load_config
from sdbench.figureindex import ITEMS
from sdbench.grid import Cell, EngineGroup, TraceGroup
from sdbench.workflow import paths as P
from sdbench.workflow.plan import Plan, spec_file


@pytest.fixture(scope="module")
def default() -> Plan:
    return Plan(load_config(REPO / "config" / "config.yaml"))


@pytest.fixture(scope="module")
def paper() -> Plan:
    return Plan(load_config(REPO / "config" / "paper.yaml"))


def test_default_counts(default: Plan) -> None:
    # 83 of the grid and its sweeps + 24 forced-acceptance cells + 7 A/A cells (each model x dataset
    # of the grid's own blocks at its smallest batch size: 5 on the target, 2 on its MiMo form).
    assert len(default.cells) == 114
    # One group per method for its forced points (4, not one per method and length: 12), one per
    # method for its temperature points (3) and one A/A group per model (2): the grid's groups never
    # wait for a sweep.
    assert (len(default.groups), len(default.trace_groups), len(default.breakdown_groups)) == (23, 5, 5)
    assert len(default.server_groups) == 1 and default.baseline == "none"  # 3 arms interleaved in one job
    assert default.built_models == ["tiny-draft", "tiny-target"]
    assert default.heads == ["tiny-target-eagle", "tiny-target-eagle3", "tiny-target-medusa", "tiny-target-mtp"]


def test_paper_counts(paper: Plan) -> None:
    # The breakdown (Fig. 3a) re-runs 24 of the grid's cells in 4 groups, one per method. 786 cells
    # less the 11 its expected KV residency trims (tests/analysis/test_kvcapacity.py PAPER_TRIMMED).
    assert len(paper.cells) == 775
    assert (len(paper.groups), len(paper.trace_groups), len(paper.breakdown_groups)) == (46, 15, 4)
    assert len(paper.server_groups) == 1  # server.interleave: every method an arm of one job
    assert paper.model_dir("llama3.1-8b") == "resources/hub/llama3.1-8b"


def test_a_few_exact_outputs(default: Plan, paper: Plan) -> None:
    out = default.final_outputs()
    assert out[:2] == ["results/paper/ext00_verdict.md", "results/paper/ext00_verdict.png"]  # the answer first
    assert "results/paper/fig04_acceptance_heatmap/vllm-cpu/tiny-target/code-edit.png" in out
    assert "results/paper/ext04_adaptive_policies/published.md" in out
    assert "results/traces/vllm-cpu/tiny-target/code-edit/offline_suffix.parquet" in out
    assert len(out) == len(set(out)) == 163  # 100 + the 63 figures' drawn tables
    pngs = [p for p in out if p.endswith(".png")]
    assert [p for p in out if p.startswith("results/paper/") and p.endswith(".csv")] == [
        p.removesuffix(".png") + ".csv" for p in pngs
    ]  # every figure's drawn table beside it, and only theirs
    assert "results/paper/ext15_simulator_at_forced.md" in out
    assert default.sim_cost_model() == P.FORCED_COST_MODEL and paper.sim_cost_model() == P.MEASURED_COST_MODEL
    assert "results/paper/fig03_runtime_breakdown.png" in paper.final_outputs()  # Fig. 3a
    # 218 + 159 drawn tables: the breakdown adds Fig. 3a, ext05, and the simulator's figures and
    # adaptive-policy report for the grid's Llama3.1-8B (priced by the breakdown's cost model).
    assert len(paper.final_outputs()) == 377


def test_every_index_item_has_a_scope_rule(default: Plan) -> None:
    for item in ITEMS:
        default.item_scopes(item.name)  # KeyError for an item the plan does not know
    with pytest.raises(KeyError, match="no scope rule"):
        default.item_scopes("fig99_new")


def test_group_spec_and_inputs(default: Plan) -> None:
    group = EngineGroup("vllm-cpu", "tiny-target", "eagle3-k3", "all")
    spec = default.group_spec(group)
    assert {c["cell"]["dataset"] for c in spec["cells"]} >= {"code-edit", "code-write", "my-chat"}
    assert not any(".t" in c["cell"]["dataset"] for c in spec["cells"])  # temperature points: a group apart
    sampled = default.group_spec(EngineGroup("vllm-cpu", "tiny-target", "eagle3-k3", "all-temperature"))
    assert {c["cell"]["dataset"] for c in sampled["cells"]} == {"code-edit.t0.5", "code-edit.t1.0", "code-edit.t1.5"}
    assert sampled["prompts"]["code-edit.t0.5"] == "results/prompts/tiny-target/code-edit.parquet"  # a variant reads its base
    inputs = default.engine_job_inputs(default.groups[group], "eagle3-k3", "tiny-target")
    assert inputs["drafter"] == "results/models/built/tiny-target-eagle3"
    cell = Cell("vllm-cpu", "tiny-target", "code-edit", "eagle3-k3", 4)
    assert default.group_dir_of_cell(cell) == "results/engines/vllm-cpu/tiny-target/eagle3-k3/all"
    traces = default.trace_cells(TraceGroup("vllm-cpu", "tiny-target", "ngram-k3"))
    assert {c.batch_size for c in traces} == {8}


def test_forced_acceptance_cells_run_to_max_tokens_on_one_engine_per_method(default: Plan) -> None:
    """A method's forced points share one engine with the method's engine arguments (the length is
    switched in the engine, sdbench.engine.measure.forcing), in a group apart from the method's own cells."""
    assert not any(".a" in g.method and not g.method.endswith(".aa") for g in default.groups)
    group = EngineGroup("vllm-cpu", "tiny-target", "eagle3-k3", "all-forced")
    spec = default.group_spec(group)
    methods = sorted({c["cell"]["method"] for c in spec["cells"]})
    assert methods == ["eagle3-k3.a1", "eagle3-k3.a2.5", "eagle3-k3.a4"]
    own = default.group_spec(EngineGroup("vllm-cpu", "tiny-target", "eagle3-k3", "all"))["cells"][0]
    cell = next(c for c in spec["cells"] if c["cell"]["method"] == "eagle3-k3.a2.5")
    assert cell["method"]["speculative_config"] == own["method"]["speculative_config"]  # the base's engine arguments
    assert cell["method"]["forced_acceptance_length"] == 2.5
    assert default.group_dir_of_cell(Cell("vllm-cpu", "tiny-target", "code-edit", "eagle3-k3.a2.5", 8)) == \
        "results/engines/vllm-cpu/tiny-target/eagle3-k3/all-forced"
    # The verdict's groups come first; the forced ones after (Snakemake priority).
    assert default.engine_priority(EngineGroup("vllm-cpu", "tiny-target", "eagle3-k3", "all")) > \
        default.engine_priority(group) == 0
    assert cell["run"]["ignore_eos"] is True and cell["run"]["num_requests"] == 4
    assert cell["paired_baseline"]["key"] == "none"
    full = default.config["methods"]["ngram-k3.a4"]
    assert full["forced_acceptance_length"] == 4.0 and full["sweep_of"] == "ngram-k3"
    assert default.sweep_variants()["methods"]["draft-k3.a1"] == "forced_acceptance"
    assert default.prompt_tables([Cell("vllm-cpu", "tiny-target", "code-edit", "draft-k3.a1", 8)]) == {
        "code-edit": "results/prompts/tiny-target/code-edit.parquet"
    }


def test_prepare_inputs_name_a_users_prompts_file(default: Plan) -> None:
    assert default.prepare_inputs("tiny-target", "my-chat")["prompts_file"] == "tests/data/chat-prompts.jsonl"
    assert default.prepare_inputs("tiny-target", "code-edit-random")["matched"] == P.PROMPTS.format(
        model="tiny-target", dataset="code-edit"
    )


def test_prepare_gets_the_engines_context_cap(default: Plan, paper: Plan) -> None:
    """A model entry's max_model_len reaches prepare-dataset (prompts that do not fit are dropped
    there); without one, the model's config.json decides."""
    assert default.context_arg("tiny-target") == "--max-model-len 1024"
    assert paper.context_arg("llama3.1-8b") == ""


def test_spec_files_are_content_addressed(tmp_path: Path) -> None:
    a = spec_file({"x": 1, "y": [2]}, tmp_path)
    assert a == spec_file({"y": [2], "x": 1}, tmp_path)  # key order does not matter
    b = spec_file({"x": 2}, tmp_path)
    assert a != b and a.startswith(".snakemake/sdbench/specs/") and a.endswith(".json")
    assert json.loads((tmp_path / a).read_text()) == {"x": 1, "y": [2]}


def test_paths_are_formatted_in_one_place() -> None:
    cell = {"engine": "e", "model": "m", "dataset": "d", "method": "x", "batch_size": 4}
    assert P.CELL_TABLE.format(**cell, name="summary") == "results/runs/e/m/d/x/bs4/summary.parquet"
    assert P.table("verdict") == "results/tables/verdict.parquet"
    smk = "".join(p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk"))
    assert '"results/' not in smk and "'results/" not in smk  # every output path comes from sdbench.workflow.paths


# ------------------------------------------------------------------ a site's runtime limit
def _with_profile(name: str, profile: str) -> dict:
    """A config with the site limits a profile passes (its `config:` entries), as Snakemake merges them."""
    import yaml

    from sdbench.config import validate_config
    from sdbench.workflow.plan import profile_config

    raw = yaml.safe_load((REPO / "config" / name).read_text())
    return validate_config({**raw, **profile_config(str(REPO / "profiles" / profile))}, source=name)


@pytest.fixture(scope="module")
def paper_at_site() -> Plan:
    return Plan(_with_profile("paper.yaml", "slurm"))


def test_the_shipped_slurm_profile_limits_engine_jobs_to_2880_minutes(paper: Plan, paper_at_site: Plan) -> None:
    from sdbench import scheduling

    config = paper_at_site.config
    limits = scheduling.site_limits(config)
    assert (limits.partition, limits.max_runtime, limits.gpus_per_node, limits.budget) == ("gpu", 2880, 8, 2304)
    # The same cells; 46 engine groups before the split, 196 after it (by dataset, then by runs
    # of batch sizes; runtimes estimated by sdbench.scheduling.estimate_breakdown).
    assert paper_at_site.cells == paper.cells
    assert (len(paper.groups), len(paper_at_site.groups)) == (46, 196)
    assert sorted(c for cs in paper_at_site.groups.values() for c in cs) == sorted(paper.cells)
    asks = [
        *(scheduling.group_runtime_minutes(config, cs, a) for cs in paper_at_site.groups.values() for a in (1, 2, 3)),
        *(scheduling.trace_runtime_minutes(config, paper_at_site.trace_cells(g), a)
          for g in paper_at_site.trace_groups for a in (1, 2, 3)),
        *(scheduling.server_runtime_minutes(config, paper_at_site.server_cell(g), a)
          for g in paper_at_site.server_groups for a in (1, 2, 3)),
    ]  # fmt: skip
    assert max(asks) == 2880
    # Every group over the budget fitted (one job each) but single cells beyond it, which ask for the limit.
    for cells_ in paper_at_site.groups.values():
        assert len(cells_) == 1 or scheduling.group_estimate_minutes(config, cells_) <= limits.budget
    # The plan says which groups were split, one line each, and which unsplit groups ask for the limit.
    splits = [n for n in paper_at_site.site_notes if n.startswith("site: engine group ")]
    assert len(splits) == 26
    assert "vllm-0.10.1.1/llama3-70b/eagle-k3/all (estimated 5,924 min > 2,304 = 80% of partition gpu's 2,880) " \
           "split into 5 jobs: all.cnn (1,954), all.gsm8k (430), " in "\n".join(splits)  # fmt: skip
    # Trace and server groups fit: none asks for the limit.
    assert not [n for n in paper_at_site.site_notes if n.startswith(("site: trace group ", "site: server group "))]


def test_split_groups_keep_the_unsplit_engine_and_their_cells_paths(paper: Plan, paper_at_site: Plan) -> None:
    cell = Cell("vllm-0.10.1.1", "qwen3-8b-thinking", "aime", "eagle3-k3", 2)
    assert paper.group_dir_of_cell(cell) == "results/engines/vllm-0.10.1.1/qwen3-8b-thinking/eagle3-k3/all"
    assert paper_at_site.group_dir_of_cell(cell) == (
        "results/engines/vllm-0.10.1.1/qwen3-8b-thinking/eagle3-k3/all.aime.bs1-8"
    )
    gsm8k = Cell("vllm-0.10.1.1", "qwen3-8b-thinking", "gsm8k", "eagle3-k3", 8)  # a whole dataset fits one job
    assert paper_at_site.group_dir_of_cell(gsm8k) == (
        "results/engines/vllm-0.10.1.1/qwen3-8b-thinking/eagle3-k3/all.gsm8k"
    )
    group = EngineGroup("vllm-0.10.1.1", "qwen3-8b-thinking", "eagle3-k3", "all.aime.bs1-8")
    spec = paper_at_site.group_spec(group)
    # max_num_seqs of the unsplit group (its largest batch size): the same engine arguments.
    assert spec["max_num_seqs"] == 128 and [s["cell"]["batch_size"] for s in spec["cells"]] == [1, 2, 4, 8]
    whole = EngineGroup("vllm-0.10.1.1", "qwen3-8b-thinking", "eagle3-k3", "all")
    assert "max_num_seqs" not in paper.group_spec(whole)  # unsplit specs (and digests) as before
    assert "all.aime.bs1-8" in paper_at_site.shares and paper.shares == ["all", "all-temperature"]
    assert paper_at_site.group_checkpoint_dir(group) == (
        "results/engine_checkpoints/vllm-0.10.1.1/qwen3-8b-thinking/eagle3-k3"
    )


def test_a_cells_checkpoint_does_not_depend_on_the_site(paper: Plan, paper_at_site: Plan) -> None:
    """With the shipped site (2,880 min), at 1,440 min and without a site (``--report``, ``-n``
    without the profile) the groups and their directories differ, but every cell has the same
    checkpoint store, resolved spec and engine max_num_seqs: the same checkpoint key."""
    from sdbench.engine.groups import checkpoint_key

    half = _with_profile("paper.yaml", "slurm")
    for partition in half["site"]["partitions"].values():
        partition["max_runtime"] = 1440
    half["site"]["attempts"] = 4  # at 3, two single cells (4,955 min and more) could not finish
    at_1440 = Plan(half)
    plans = {"none": paper, "2880": paper_at_site, "1440": at_1440}
    # As a job builds it: the prompt tables of its group's datasets (fewer in a split group), the
    # rest the same for every split.
    def context(cells_: list[Cell]) -> dict[str, object]:
        return {"code": "fixed", "prompts": {d: f"digest of {d}" for d in sorted({c.dataset for c in cells_})}}

    def keys(plan: Plan) -> dict[Cell, tuple[str, str]]:
        out = {}
        for group, cells_ in plan.groups.items():
            spec = plan.group_spec(group)
            max_num_seqs = spec.get("max_num_seqs") or max(c.batch_size for c in cells_)  # as run_group takes it
            for cell, cell_spec in zip(cells_, spec["cells"], strict=True):
                out[cell] = (plan.group_checkpoint_dir(group), checkpoint_key(cell_spec, context(cells_), max_num_seqs, None))
        return out

    found = {name: keys(plan) for name, plan in plans.items()}
    assert len(found["none"]) == 775 and found["2880"] == found["none"] == found["1440"]
    moved = [c for c in paper.cells if paper_at_site.group_dir_of_cell(c) != at_1440.group_dir_of_cell(c)]
    assert moved  # cells whose group the edit re-splits (most of the 775): their jobs re-run and re-use them


def test_the_cpu_profile_leaves_the_default_plan_alone(default: Plan) -> None:
    at_site = Plan(_with_profile("config.yaml", "slurm-cpu"))
    assert at_site.groups == default.groups and at_site.site_notes == []
    assert at_site.breakdown_groups == default.breakdown_groups


def test_check_config_with_a_profile_prints_the_splits(capsys) -> None:
    from sdbench.cli import main

    assert main(["check-config", str(REPO / "config" / "paper.yaml"), "--profile", str(REPO / "profiles" / "slurm")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].endswith("paper.yaml with " + str(REPO / "profiles" / "slurm") + ": valid; 775 cells on 196 engine groups")
    assert sum(line.startswith("site: engine group ") for line in lines) == 26
    assert main(["check-config", str(REPO / "config" / "config.yaml"), "--profile", str(REPO / "profiles" / "local")]) == 0
    assert capsys.readouterr().out.endswith("valid; 114 cells on 23 engine groups\n")  # no site: no split


def test_one_published_dataset_leaves_out_the_policy_trained_on_another(default: Plan) -> None:
    """The learned policy trains on the other datasets' traces: with two published datasets the
    adaptive report takes the command's defaults (learned included); with one it is left out, as
    on a grid scope with one traced dataset (else ext04 fails at run time)."""
    assert default.adaptive_options("published") is None  # gsm8k and instructcoder
    config = load_config(REPO / "config" / "config.yaml")
    config["published_traces"] = {**config["published_traces"], "datasets": ["gsm8k"]}
    sizes, policies = Plan(config).adaptive_options("published")
    assert sizes == [] and "combined:learned" not in policies
    assert {"combined:adaptive", "combined:trust", "combined:ngram-else-eagle"} <= set(policies)


def test_what_cannot_finish_at_the_site_is_refused_before_any_job() -> None:
    """A single cell estimated past max_runtime x attempts (resuming after each kill), or a trace or
    server group past one max_runtime (neither resumes), is refused in one line."""
    from sdbench.errors import ConfigError
    from sdbench.scheduling import SiteLimits
    from sdbench.schedulingsite import Split, unfinishable

    limits = SiteLimits("gpu", 1000, 8, attempts=3)
    split = Split("e/m/k/all", 5000, (("all.d", 3001), ("all.d2", 2999)), (("e/m/d/k/bs64", 3001), ("e/m/d2/k/bs8", 3000)))
    assert unfinishable(limits, [split], [("trace group e/m/k", 1000), ("server group e/m/k", 1001)]) == [
        "cell e/m/d/k/bs64 (estimated 3,001 min) cannot finish in 3 attempt(s) of 1,000 min (site.attempts x "
        "partition gpu's max_runtime)",
        "server group e/m/k (estimated 1,001 min) cannot finish in one job of 1,000 min: it does not resume",
    ]
    assert unfinishable(SiteLimits("gpu", None, 8), [split], [("trace group e/m/k", 10**6)]) == []
    # The shipped grid at its site: nothing past 2,880 x 3; at 1,440 x 3 two SPEED-Bench 1K cells at batch 64.
    at_site = _with_profile("paper.yaml", "slurm")
    assert at_site["site"]["attempts"] == 3 and Plan(at_site).cells
    for partition in at_site["site"]["partitions"].values():
        partition["max_runtime"] = 1440
    with pytest.raises(ConfigError) as refused:
        Plan(at_site)
    assert str(refused.value) == (
        "config: site: cell vllm-0.11.1/llama3.1-8b/speed-bench-throughput-1k/eagle3-k3/bs64 (estimated 4,955 min) "
        "cannot finish in 3 attempt(s) of 1,440 min (site.attempts x partition gpu's max_runtime) (1 more like it: "
        "sdbench check-config --profile lists them); drop it from the grid, or raise the limit or attempts")


def test_the_shipped_profiles_state_their_attempts() -> None:
    """``site.attempts`` is what the profile's ``retries`` gives a job (the rehearsal overlay, which
    retries nothing, plans the real profile's attempts)."""
    import yaml

    for profile in ("slurm", "slurm-cpu"):
        raw = yaml.safe_load((REPO / "profiles" / profile / "config.yaml").read_text())
        assert _with_profile("config.yaml", profile)["site"]["attempts"] == raw["retries"] + 1, profile


def test_a_rehearsal_prepares_its_prompt_sets_with_the_expected_output() -> None:
    """The sizing keys stay out of prepare_dataset's entry (re-estimating reruns nothing), but a
    rehearsal's stand-in outputs take their mean from expected_output_tokens, so there it is kept."""
    config = load_config(REPO / "config" / "paper.yaml")
    assert "expected_output_tokens" not in Plan(config).dataset_entry("sharegpt")
    rehearsal = Plan({**config, "engine_mode": "rehearsal"}).dataset_entry("sharegpt")
    assert rehearsal["expected_output_tokens"] == 737 and "expected_prompt_tokens" not in rehearsal


def test_the_verdict_page_reads_the_frontier_only_with_a_server_section(default: Plan) -> None:
    assert default.verdict_page_inputs() == {
        "cells": "results/tables/grid_cells.parquet",
        "server": "results/tables/server.parquet",
        "frontier": "results/tables/goodput_frontier.parquet",
        "max_load": "results/tables/goodput_max_load.parquet",
    }
    config = load_config(REPO / "config" / "config.yaml")
    del config["server"]
    assert Plan(config).verdict_page_inputs() == {"cells": "results/tables/grid_cells.parquet"}


def test_the_adaptive_report_sweeps_its_own_models_batch_sizes() -> None:
    config = load_config(REPO / "config" / "config.yaml")
    mtp = next(e for e in config["grid"] if e["models"] == ["tiny-target-mtp"])
    mtp["batch_sizes"] = [2]  # another model's sizes: not the tiny target's report
    assert Plan(config).adaptive_options("vllm-cpu/tiny-target")[0] == [1, 4, 8]  # config.yaml's grid


def test_check_config_says_what_the_design_can_judge(capsys) -> None:
    """The default (three paired processes) gets a t interval on 2 degrees of freedom; the paper
    config (one process per arm) none: every point not judged, said before any GPU-hour is spent."""
    from sdbench.cli import main

    assert main(["check-config", str(REPO / "config/config.yaml")]) == 0
    assert ("design: 3 engine start(s) per group x 1 trial(s) per start, paired (no SD in the same process): speedups "
            "with a t interval on 2 degree(s) of freedom; break-even inside [0.971, 1.030]") in capsys.readouterr().out
    assert main(["check-config", str(REPO / "config/paper.yaml")]) == 0
    assert ("design: 1 engine start(s) per group x 1 trial(s) per start, unpaired: no interval over starts, every SD "
            "point is 'not judged'") in capsys.readouterr().out


def test_the_design_line_names_a_precision_stop_and_its_cap() -> None:
    """The e2e config: one start, 2 trials and more up to 3 while wider than its target."""
    from sdbench.grid import design_line

    line = design_line(load_config(REPO / ".test" / "config" / "e2e.yaml"))
    assert line.startswith("design: 1 engine start(s) per group x 2 to 3 trial(s) per start, paired (no SD in")
