"""Scheduler requests: GPUs, host memory and wall time of engine and analysis jobs.

Expected minutes are worked out by hand from the stated constants (written out below), never
from the functions under test.
"""

from __future__ import annotations

import math
from copy import deepcopy
from pathlib import Path

import pytest
import yaml

from sdbench.grid import Cell, EngineGroup
from sdbench.scheduling import (
    MIN_MINUTES,
    cell_gpus,
    cell_mem_mb,
    cell_runtime_minutes,
    estimate_breakdown,
    group_runtime_minutes,
    server_runtime_minutes,
    trace_runtime_minutes,
)

# The CPU costs, as docs/cluster.md states them: 0.02 s a step, 0.02/32 s per token computed,
# 3 minutes per engine start, 0.1 s per call; no KV term, no model scaling.
CPU_STEP, CPU_TOKEN, CPU_START, CPU_CALL = 0.02, 0.02 / 32, 180.0, 0.1

CONFIG = {
    "engines": {
        "gpu": {"device": "cuda"},
        "cpu": {"device": "cpu", "llm_kwargs": {"kv_cache_memory_bytes": 2**30}},
    },
    "models": {"small": {}, "big": {"tensor_parallel_size": 4}},
    "methods": {"none": {"method": "none"}, "ng": {"method": "ngram", "num_speculative_tokens": 3}},
    "datasets": {
        "d": {"num_prompts": 100, "max_tokens": 8192, "expected_output_tokens": 512, "expected_prompt_tokens": 64},
        "tiny": {"num_prompts": 2, "max_tokens": 16, "expected_prompt_tokens": 8},
    },
    "run": {"warmup_requests": 5, "batch_mode": "replicate"},
}


def minutes(seconds: float) -> int:
    """The request for an expected time: twice it, in whole minutes, at least 10."""
    return max(10, math.ceil(2 * seconds / 60))


def test_gpus_follow_tensor_parallel_size() -> None:
    assert cell_gpus(CONFIG, Cell("gpu", "small", "d", "none", 1)) == 1
    assert cell_gpus(CONFIG, Cell("gpu", "big", "d", "none", 1)) == 4
    assert cell_gpus(CONFIG, Cell("cpu", "big", "d", "none", 1)) == 0


def test_a_cpu_cell_by_hand() -> None:
    """Per call at batch b: prefill b x 64 tokens (one chunk: one step), 512 decode steps of
    b sequences, one call overhead; 5 warm-up + 100 timed calls, one engine start."""

    def call(b: int) -> float:
        prefill = CPU_TOKEN * b * 64 + CPU_STEP
        decode = 512 * (CPU_STEP + CPU_TOKEN * b)
        return prefill + decode + CPU_CALL

    assert call(1) == pytest.approx(10.72) and call(8) == pytest.approx(13.24)
    assert cell_runtime_minutes(CONFIG, Cell("cpu", "small", "d", "none", 1)) == minutes(CPU_START + 105 * 10.72) == 44
    assert cell_runtime_minutes(CONFIG, Cell("cpu", "small", "d", "none", 8)) == minutes(CPU_START + 105 * 13.24) == 53
    assert cell_runtime_minutes(CONFIG, Cell("cpu", "small", "d", "none", 1), attempt=3) == 3 * 44
    assert cell_runtime_minutes(CONFIG, Cell("cpu", "small", "tiny", "none", 1)) == MIN_MINUTES


def _published_cost_model() -> dict:
    from sdbench.packagedata import data_file

    return yaml.safe_load(data_file("cost_models", "llama3.1-8b-h100.yaml").read_text())


def test_the_gpu_step_costs_are_the_published_cost_model() -> None:
    from sdbench.scheduling import DEVICE_COSTS, HEAD_DRAFT, LOOKUP_DRAFT_FRACTION

    model, cuda = _published_cost_model(), DEVICE_COSTS["cuda"]
    assert (cuda.step_fixed_s, cuda.step_overhead_s, cuda.token_s, cuda.kv_token_s) == (
        model["target"]["c_fixed"], model["overhead_per_step"], model["target"]["c_compute"], model["target"]["c_kv"]
    )
    eagle = model["drafters"]["eagle"]
    assert HEAD_DRAFT == {"fixed_s": eagle["c_fixed"], "spec_token_s": eagle["c_spec"], "kv_token_s": eagle["c_kv"]}
    assert LOOKUP_DRAFT_FRACTION == model["drafters"]["ngram"]["fraction"]


def test_prefill_counts_a_32k_prompt_longer_than_a_1k_one() -> None:
    """A GPU cell of the reference model (no architecture config: Llama-3.1-8B's), 200 prompts of
    256 output tokens, at batch 1, no warm-up. Per call: P prompt tokens at c_compute each, causal
    attention c_compute x (32 layers x 4,096 query width / 8,030,261,248 parameters) x P**2, one step
    per 8,192-token chunk; 256 steps of c_fixed + overhead + c_compute + c_kv x (P + 128); 0.2 s."""
    m = _published_cost_model()
    c, kv, step = m["target"]["c_compute"], m["target"]["c_kv"], m["target"]["c_fixed"] + m["overhead_per_step"]
    attention = 32 * 4096 / 8_030_261_248

    def call(prompt: int) -> float:
        prefill = c * prompt + c * attention * prompt**2 + math.ceil(prompt / 8192) * step
        return prefill + 256 * (step + c + kv * (prompt + 128)) + 0.2

    config = deepcopy(CONFIG)
    config["run"] = {"warmup_requests": 0}
    for name, prompt in (("short", 1024), ("long", 32768)):
        config["datasets"][name] = {"num_prompts": 200, "max_tokens": 256, "expected_prompt_tokens": prompt}
    short, long = (cell_runtime_minutes(config, Cell("gpu", "small", d, "none", 1)) for d in ("short", "long"))
    assert (short, long) == (minutes(1200 + 200 * call(1024)), minutes(1200 + 200 * call(32768))) == (54, 63)
    parts = {d: estimate_breakdown(config, "run", [Cell("gpu", "small", d, "none", 64)]) for d in ("short", "long")}
    assert parts["long"].prefill_s > 40 * parts["short"].prefill_s  # 32x the tokens, and attention grows as P**2


def test_repeats_and_the_stopping_rule_multiply_the_timed_part() -> None:
    from sdbench.scheduling import trial_bound

    cell = [Cell("cpu", "small", "d", "none", 8)]
    once = estimate_breakdown(CONFIG, "run", cell)
    config = deepcopy(CONFIG)
    config["run"]["repeats"] = 3
    thrice = estimate_breakdown(config, "run", cell)
    assert thrice.trials == 3 and thrice.warmup_s == once.warmup_s
    assert thrice.decode_s == pytest.approx(3 * once.decode_s) and thrice.prefill_s == pytest.approx(3 * once.prefill_s)
    assert thrice.decode_s == pytest.approx(3 * 100 * 512 * 0.025)  # 3 trials x 100 calls x 512 steps at batch 8
    # A half-width target may take every trial up to max_repeats.
    config["run"].update(target_half_width=0.05, max_repeats=8)
    assert estimate_breakdown(config, "run", cell).decode_s == pytest.approx(8 * once.decode_s)
    # min_measured_s: trials until the fastest arm has that much, plus the one that crosses it.
    assert trial_bound({"repeats": 2, "min_measured_s": 100}, 30.0, 10.0) == 11  # 100 / 10 + 1
    assert trial_bound({"repeats": 2, "min_measured_s": 100, "max_repeats": 5}, 30.0, 10.0) == 5
    assert trial_bound({"repeats": 4, "min_measured_s": 5}, 30.0, 10.0) == 4
    assert trial_bound({"repeats": 3}, 30.0, 10.0) == 3


def test_paired_sd_cells_time_both_arms_and_start_two_engines() -> None:
    sd = [Cell("cpu", "small", "d", "ng", bs) for bs in (1, 8)]
    single = estimate_breakdown(CONFIG, "run", sd)
    base = estimate_breakdown(CONFIG, "run", [Cell("cpu", "small", "d", "none", bs) for bs in (1, 8)])
    config = deepcopy(CONFIG)
    config["run"]["paired_baseline"] = True
    paired = estimate_breakdown(config, "run", sd)
    assert paired.startups == 2 and paired.startup_s == 2 * CPU_START
    assert paired.decode_s == pytest.approx(single.decode_s + base.decode_s)
    assert paired.warmup_s == pytest.approx(single.warmup_s + base.warmup_s)
    # An SD step verifies 1 + k tokens a sequence and pays the lookup: n-gram k=3 at batch 1.
    assert single.decode_s - base.decode_s == pytest.approx(
        100 * 512 * (CPU_TOKEN * 3 + 0.005875 * (CPU_STEP + CPU_TOKEN * 4))
        + 100 * 512 * (CPU_TOKEN * 8 * 3 + 0.005875 * (CPU_STEP + CPU_TOKEN * 8 * 4))
    )
    config["run"]["engine_starts"] = 2
    assert estimate_breakdown(config, "run", sd).expected_s == pytest.approx(2 * paired.expected_s)


def test_a_trace_group_is_one_trace_pass_not_replicate_calls() -> None:
    """100 prompts (64 tokens) in one call, 8 running: prefill 6,400 tokens (one chunk), 13 waves x
    512 steps of 8 sequences verifying 1 + 20 tokens each, plus the n-gram lookup (0.5875% of a
    verify step); one call, one engine start."""
    config = {**deepcopy(CONFIG), "traces": {"num_speculative_tokens": 20, "max_num_seqs": 8}}
    cells = [Cell("cpu", "small", "d", "ng", 8)]
    verify = CPU_STEP + CPU_TOKEN * 8 * 21
    seconds = CPU_START + (CPU_TOKEN * 6400 + CPU_STEP) + 13 * 512 * verify * 1.005875 + CPU_CALL
    assert trace_runtime_minutes(config, cells) == minutes(seconds) == 35
    assert group_runtime_minutes(config, cells) > 2 * trace_runtime_minutes(config, cells)  # as replicate calls


def test_a_server_group_decodes_the_expected_output_not_max_tokens() -> None:
    """82 requests (2 warm-up + 2 rounds x 40) per level; at concurrency 1: 82 x 512 steps of one
    sequence; at 4: 21 waves x 512 steps of four; a prefill chunk and a call per request each."""
    config = deepcopy(CONFIG)
    config["server"] = {"datasets": ["d"], "concurrency": [1, 4], "requests_per_level": 40, "rounds": 2,
                        "warmup_requests": 2}  # fmt: skip
    prefill = CPU_TOKEN * 82 * 64 + CPU_STEP
    level1 = prefill + 82 * 512 * (CPU_STEP + CPU_TOKEN) + 82 * CPU_CALL
    level4 = prefill + 21 * 512 * (CPU_STEP + 4 * CPU_TOKEN) + 82 * CPU_CALL
    cell = Cell("cpu", "small", "d", "none", 4)
    assert server_runtime_minutes(config, cell) == minutes(CPU_START + level1 + level4) == 44
    del config["datasets"]["d"]["expected_output_tokens"]  # then every request may run to max_tokens
    assert server_runtime_minutes(config, cell) > 10 * 44
    config["server"]["startup_timeout_s"] = 3600  # a server that may take an hour to start asks for it
    assert estimate_breakdown(config, "server", [cell]).startup_s == 3600


def test_the_model_size_scales_a_gpu_step() -> None:
    """Llama-3-70B on 4 GPUs: 70.55B parameters against Llama-3.1-8B's 8.03B (weights and
    compute), 80 layers x 8 KV heads against 32 x 8 (KV), over 4 GPUs at 80% efficiency. GLM-4.5-Air:
    every expert's weights are read (106.85B), 13.4B active parameters compute."""
    from sdbench.scheduling import model_scale

    config = deepcopy(CONFIG)
    config["models"] = {
        "l8": {"hf_id": "meta-llama/Llama-3.1-8B-Instruct"},
        "l70": {"hf_id": "meta-llama/Meta-Llama-3-70B-Instruct", "tensor_parallel_size": 4},
        "glm": {"hf_id": "zai-org/GLM-4.5-Air", "tensor_parallel_size": 4},
    }
    l8, l70, glm = (model_scale(config, m, "gpu") for m in ("l8", "l70", "glm"))
    assert (l8.weights, l8.compute, l8.kv) == (1.0, 1.0, 1.0)
    assert l70.weights == pytest.approx(70.55 / 8.03 / 3.2, rel=1e-3) and l70.kv == pytest.approx(80 / 32 / 3.2)
    assert glm.weights == pytest.approx(106.85 / 8.03 / 3.2, rel=1e-3)
    assert glm.compute == pytest.approx(13.42 / 8.03 / 3.2, rel=1e-3)
    assert model_scale(config, "l70", "cpu").weights == 1.0  # CPU costs are not scaled
    cell = {m: [Cell("gpu", m, "d", "none", 16)] for m in ("l8", "l70")}
    decode = {m: estimate_breakdown(config, "run", cs).decode_s for m, cs in cell.items()}
    assert decode["l70"] > 2 * decode["l8"]


# ------------------------------------------------------------------ host memory
def test_memory_follows_gpus_prompt_length_and_batch_size() -> None:
    """64 GB per GPU, and the cell's requests table: 1,536 prompts x 64 copies, each a 512 B row,
    the output ids it stores as int32 (greedy: a call's 64 equal outputs once; sampled: every
    sequence's), twice at the peak, and the prompt table (1,536 x 32,768 ids at 16 B). A row
    refers to its prompt by id: the prompt length enters once per prompt, not once per copy."""
    config = deepcopy(CONFIG)
    long = {"num_prompts": 1536, "max_tokens": 8192, "expected_output_tokens": 512, "expected_prompt_tokens": 32768}
    config["datasets"]["long"] = long
    config["datasets"]["sampled"] = {**long, "temperature": 1.0}
    rows, prompt_table = 1536 * 64, 1536 * 32768 * 16
    greedy = 2 * (rows * 512 + 1536 * 512 * 4) + prompt_table
    sampled = 2 * (rows * 512 + rows * 512 * 4) + prompt_table
    long64 = cell_mem_mb(config, Cell("gpu", "small", "long", "none", 64))
    assert long64 == math.ceil((64000 + greedy / 2**20) / 100) * 100 == 64900
    assert cell_mem_mb(config, Cell("gpu", "small", "sampled", "none", 64)) == math.ceil(
        (64000 + sampled / 2**20) / 100
    ) * 100 == 65300
    assert cell_mem_mb(config, Cell("gpu", "big", "long", "none", 64)) == 4 * 64000 + 900  # the same cell, 4 GPUs
    assert cell_mem_mb(config, Cell("gpu", "small", "long", "none", 8)) < long64
    assert cell_mem_mb(config, Cell("gpu", "small", "d", "none", 64)) == 64100 < long64  # 64-token prompts
    # CPU: 16,000 MB for the process and its 1 GiB KV cache, twice the cache with a paired no-SD
    # engine, and a few KB of tables: rounded up to 100 MB.
    assert cell_mem_mb(CONFIG, Cell("cpu", "small", "tiny", "none", 1)) == 17_100  # 16,000 + 1,024 + tables
    config["run"]["paired_baseline"] = True
    assert cell_mem_mb(config, Cell("cpu", "small", "tiny", "ng", 1)) == 18_100  # 16,000 + 2 x 1,024 + tables


def test_a_job_holds_its_largest_cell_and_a_trace_group_every_dataset() -> None:
    from sdbench.scheduling import job_mem_mb

    cells = [Cell("gpu", "small", "d", "none", bs) for bs in (1, 64)]
    assert job_mem_mb(CONFIG, "run", cells) == cell_mem_mb(CONFIG, cells[1])
    config = deepcopy(CONFIG)
    config["datasets"]["long"] = {"num_prompts": 1000, "max_tokens": 4096, "expected_prompt_tokens": 2048}
    traces = [Cell("gpu", "small", d, "ng", 8) for d in ("d", "long")]
    # Prompt, output and two trace arrays per position, kept until the group ends, at 44 B:
    # 100 x (64 + 3 x 512) + 1,000 x (2,048 + 3 x 4,096) token ids.
    held = (100 * (64 + 3 * 512) + 1000 * (2048 + 3 * 4096)) * 44
    assert job_mem_mb(config, "trace", traces) == math.ceil((64000 + held / 2**20) / 100) * 100 == 64700


# ------------------------------------------------------------------ analysis jobs
def test_analysis_resources_follow_what_their_inputs_hold() -> None:
    """A sampled requests table of 1,000 prompts x 64 copies: 512 B of columns a row and every
    sequence's 4,096 output ids (16 B each in memory; no prompt ids: a row refers to its prompt);
    twice that while concatenated, over a 1,000 MB base. Greedy, a call's 64 equal outputs are
    stored once. Time: 60 s, 50 us a row, 1 us a token id, doubled."""
    from sdbench.schedulinganalysis import analysis_mem_mb, analysis_runtime_minutes, input_reads, total_reads

    config = deepcopy(CONFIG)
    greedy = {"num_prompts": 1000, "max_tokens": 4096, "expected_prompt_tokens": 32768}
    config["datasets"]["big"] = {**greedy, "temperature": 0.7}
    config["datasets"]["greedy"] = greedy
    path = "results/runs/cpu/small/big/none/bs64/requests.parquet"
    rows, tokens = 64_000, 64_000 * 4096
    reads = input_reads(config, path)
    assert (reads.rows, reads.tokens, reads.nbytes) == (rows, tokens, rows * 512 + tokens * 16)
    assert input_reads(config, path.replace("/big/", "/greedy/")).tokens == 1000 * 4096
    assert analysis_mem_mb(reads) == math.ceil((1000 + 2 * (rows * 512 + tokens * 16) / 2**20) / 100) * 100 == 9100
    assert analysis_runtime_minutes(config, reads) == math.ceil(2 * (60 + rows / 2e4 + tokens / 1e6) / 60) == 11
    assert analysis_runtime_minutes(config, reads, passes=6) > 5 * 11  # a simulation: a pass per policy and batch size
    assert analysis_runtime_minutes({**config, "site": _site(15)}, reads, attempt=2) == 15  # within the site
    both = [path, path.replace("/none/", "/ng/")]
    assert total_reads(config, both).nbytes == 2 * reads.nbytes
    streamed = total_reads(config, both, streamed=True)  # rows of both, token ids of one at a time
    assert streamed.nbytes == 2 * rows * 512 + tokens * 16
    # The offline tracers list token ids as Python ints: 44 B each instead of 16.
    from sdbench.schedulinganalysis import parsed

    assert parsed(reads).nbytes == rows * 512 + tokens * 44
    # aggregate reads file by file: 50 KB a cell and five copies of its largest file.
    from sdbench.schedulinganalysis import streamed_mem_mb

    largest = rows * 512 + tokens * 16
    assert streamed_mem_mb(config, both, num_cells=2) == math.ceil((1000 + (2 * 50_000 + 5 * largest) / 2**20) / 100) * 100 == 21200
    assert input_reads(config, "results/runs/cpu/small/big/none/bs64/summary.parquet").rows == 1
    assert input_reads(config, "results/paper/fig01_end_to_end.png").nbytes == 0
    assert input_reads(config, "results/tables/cells.parquet", num_cells=786).rows == 786
    trace = input_reads(config, "results/traces/cpu/small/big/ng/engine_trace.parquet")
    assert (trace.rows, trace.nbytes) == (1000 * 4097, 1000 * 4097 * 200)  # a row per output position


# ------------------------------------------------------------------ a site's runtime limit
SPLIT = {
    **deepcopy(CONFIG),
    "datasets": {
        "long": {"num_prompts": 10, "max_tokens": 1000},
        "short": {"num_prompts": 2, "max_tokens": 100},
    },
}
# A stand-in estimate for the split rule alone: 30 minutes a job, plus each cell's minutes.
CELL_MINUTES = {("long", 1): 30, ("long", 8): 35, ("long", 64): 90, ("short", 1): 5, ("short", 8): 5, ("short", 64): 8}


def stand_in_estimate(config: dict, cells: list[Cell]) -> int:
    return 30 + sum(CELL_MINUTES[(c.dataset, c.batch_size)] for c in cells)


def _site(max_runtime, gpus_per_node=None) -> dict:
    entry = {"max_runtime": max_runtime, **({"gpus_per_node": gpus_per_node} if gpus_per_node else {})}
    return {"engine_partition": "gpu", "partitions": {"gpu": entry, "cpu": {"max_runtime": 60}}}


def _groups(config):
    cells = [Cell("gpu", "small", d, "none", bs) for d in ("long", "short") for bs in (1, 8, 64)]
    return {EngineGroup("gpu", "small", "none", "all"): cells}


def test_without_a_site_nothing_is_split_or_capped_below_a_week() -> None:
    from sdbench.scheduling import group_estimate_minutes
    from sdbench.schedulingsite import split_to_fit

    groups = _groups(SPLIT)
    assert split_to_fit(SPLIT, groups, group_estimate_minutes) == (groups, [])


def test_groups_split_by_dataset_then_batch_size_until_each_fits() -> None:
    from sdbench.scheduling import SITE_MARGIN, site_limits
    from sdbench.schedulingsite import split_to_fit

    groups = _groups(SPLIT)
    # 130 minutes: budget 104 -- 'short' fits whole (48), 'long' in runs of batch sizes; bs64 alone (120) does not.
    config = {**SPLIT, "site": _site(130)}
    assert site_limits(config).budget == int(SITE_MARGIN * 130) == 104
    out, splits = split_to_fit(config, groups, stand_in_estimate)
    assert {g.share: [c.batch_size for c in cs] for g, cs in out.items()} == {
        "all.long.bs1-8": [1, 8], "all.long.bs64": [64], "all.short": [1, 8, 64],
    }  # fmt: skip
    (split,) = splits
    assert split.parts == (("all.long.bs1-8", 95), ("all.long.bs64", 120), ("all.short", 48))
    assert split.oversized == (("gpu/small/long/none/bs64", 120),)
    line = split.describe(site_limits(config))
    assert line.startswith("site: engine group gpu/small/none/all (estimated 203 min > 104 = 80% of partition gpu's 130)")
    assert "all.long.bs64 (120*)" in line and "1 single cell(s)" in line
    # Enough room: the group stays whole, with its unsplit name.
    roomy = {**SPLIT, "site": _site(400)}
    assert split_to_fit(roomy, groups, stand_in_estimate) == (groups, [])


def test_no_request_exceeds_the_limit_not_even_a_retry() -> None:
    cell = Cell("gpu", "small", "long", "none", 64)
    first = cell_runtime_minutes(SPLIT, cell)  # no site: uncapped
    assert [cell_runtime_minutes(SPLIT, cell, attempt=a) for a in (1, 2, 3)] == [first, 2 * first, 3 * first]
    limit = 2 * first - 1  # the first attempt fits, the retry would not
    config = {**SPLIT, "site": _site(str(limit))}  # --config site={...} passes strings
    assert [cell_runtime_minutes(config, cell, attempt=a) for a in (1, 2, 3)] == [first, limit, limit]
    assert group_runtime_minutes(config, next(iter(_groups(SPLIT).values())), 3) == limit


def test_a_model_wider_than_a_node_is_refused() -> None:
    from sdbench.schedulingsite import site_problems

    config = {**SPLIT, "site": _site(150, gpus_per_node=2)}
    cells = [Cell("gpu", "big", "long", "none", 1), Cell("gpu", "small", "long", "none", 1)]
    assert site_problems(config, cells) == [
        "site: model 'big' needs 4 GPUs (tensor_parallel_size) but a node of partition gpu has 2 "
        "(site.partitions.gpu.gpus_per_node)"
    ]


def test_sizing_keys_stay_out_of_every_job_param() -> None:
    """expected_output_tokens and expected_prompt_tokens size jobs only: the prompt-table job's
    entry (its params) leaves them out, so re-estimating re-measures nothing."""
    from conftest import REPO
    from sdbench.config import load_config
    from sdbench.workflow.plan import Plan

    plan = Plan(load_config(Path(REPO) / "config" / "paper.yaml"))
    entry = plan.dataset_entry("gsm8k")
    assert "expected_prompt_tokens" not in entry and "expected_output_tokens" not in entry
    assert plan.config["datasets"]["gsm8k"]["expected_prompt_tokens"] == 100
