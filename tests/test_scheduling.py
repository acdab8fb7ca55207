"""Scheduler requests of engine jobs: GPUs, host memory, wall time."""

from __future__ import annotations

from copy import deepcopy

from sdbench.grid import Cell
from sdbench.scheduling import MIN_MINUTES, cell_gpus, cell_mem_mb, cell_runtime_minutes

CONFIG = {
    "engines": {
        "gpu": {"device": "cuda"},
        "cpu": {"device": "cpu", "llm_kwargs": {"kv_cache_memory_bytes": 2**30}},
    },
    "models": {"small": {}, "big": {"tensor_parallel_size": 4}},
    "datasets": {"d": {"num_prompts": 100, "max_tokens": 8192}, "tiny": {"num_prompts": 2, "max_tokens": 16}},
    "run": {"warmup_requests": 5, "batch_mode": "replicate"},
}


def test_gpus_follow_tensor_parallel_size() -> None:
    assert cell_gpus(CONFIG, Cell("gpu", "small", "d", "none", 1)) == 1
    assert cell_gpus(CONFIG, Cell("gpu", "big", "d", "none", 1)) == 4
    assert cell_gpus(CONFIG, Cell("cpu", "big", "d", "none", 1)) == 0


def test_memory_scales_with_gpus_and_kv_cache() -> None:
    one = cell_mem_mb(CONFIG, Cell("gpu", "small", "d", "none", 1))
    assert cell_mem_mb(CONFIG, Cell("gpu", "big", "d", "none", 1)) == 4 * one
    cpu = cell_mem_mb(CONFIG, Cell("cpu", "small", "d", "none", 1))
    assert cpu >= 1024 + 8000


def test_runtime_grows_with_output_length_batch_size_and_attempt() -> None:
    base = cell_runtime_minutes(CONFIG, Cell("gpu", "small", "d", "none", 1))
    assert cell_runtime_minutes(CONFIG, Cell("gpu", "small", "d", "none", 128)) > base
    longer = deepcopy(CONFIG)
    longer["datasets"]["d"]["max_tokens"] = 32768
    assert cell_runtime_minutes(longer, Cell("gpu", "small", "d", "none", 1)) > base
    assert cell_runtime_minutes(CONFIG, Cell("gpu", "small", "d", "none", 1), attempt=3) == 3 * base
    assert cell_runtime_minutes(CONFIG, Cell("cpu", "small", "tiny", "none", 1)) == MIN_MINUTES


def test_distinct_batches_need_fewer_steps() -> None:
    distinct = deepcopy(CONFIG)
    distinct["run"]["batch_mode"] = "distinct"
    cell = Cell("gpu", "small", "d", "none", 32)
    assert cell_runtime_minutes(distinct, cell) < cell_runtime_minutes(CONFIG, cell)


def test_paired_sd_groups_get_twice_the_time() -> None:
    from sdbench.scheduling import group_runtime_minutes

    config = deepcopy(CONFIG)
    config["methods"] = {"none": {"method": "none"}, "ng": {"method": "ngram"}}
    sd = [Cell("gpu", "small", "d", "ng", bs) for bs in (1, 8)]
    single = group_runtime_minutes(config, sd)
    config["run"] = {**config["run"], "paired_baseline": True}
    assert group_runtime_minutes(config, sd) == 2 * single
    none = [Cell("gpu", "small", "d", "none", bs) for bs in (1, 8)]
    assert group_runtime_minutes(config, none) == single


# ------------------------------------------------------------------ a site's runtime limit
SPLIT = {
    **deepcopy(CONFIG),
    "methods": {"none": {"method": "none"}},
    "datasets": {
        "long": {"num_prompts": 10, "max_tokens": 1000},
        "short": {"num_prompts": 2, "max_tokens": 100},
    },
}


def _site(max_runtime, gpus_per_node=None) -> dict:
    entry = {"max_runtime": max_runtime, **({"gpus_per_node": gpus_per_node} if gpus_per_node else {})}
    return {"engine_partition": "gpu", "partitions": {"gpu": entry, "cpu": {"max_runtime": 60}}}


def _groups(config):
    from sdbench.grid import EngineGroup

    cells = [Cell("gpu", "small", d, "none", bs) for d in ("long", "short") for bs in (1, 8, 64)]
    return {EngineGroup("gpu", "small", "none", "all"): cells}


def test_without_a_site_nothing_is_split_or_capped_below_a_week() -> None:
    from sdbench.scheduling import group_estimate_minutes, split_to_fit

    groups = _groups(SPLIT)
    assert split_to_fit(SPLIT, groups, group_estimate_minutes) == (groups, [])


def test_groups_split_by_dataset_then_batch_size_until_each_fits() -> None:
    from sdbench.scheduling import SITE_MARGIN, group_estimate_minutes, site_limits, split_to_fit

    groups = _groups(SPLIT)
    cells = next(iter(groups.values()))
    per_cell = {(c.dataset, c.batch_size): group_estimate_minutes(SPLIT, [c]) for c in cells}
    assert per_cell == {("long", 1): 66, ("long", 8): 72, ("long", 64): 116,
                        ("short", 1): 42, ("short", 8): 42, ("short", 64): 44}  # fmt: skip
    # 130 minutes: budget 104 -- 'short' fits whole (48), 'long' in runs of batch sizes; bs64 alone does not.
    config = {**SPLIT, "site": _site(130)}
    assert site_limits(config).budget == int(SITE_MARGIN * 130) == 104
    out, splits = split_to_fit(config, groups, group_estimate_minutes)
    assert {g.share: [c.batch_size for c in cs] for g, cs in out.items()} == {
        "all.long.bs1-8": [1, 8], "all.long.bs64": [64], "all.short": [1, 8, 64],
    }  # fmt: skip
    (split,) = splits
    assert split.parts == (("all.long.bs1-8", 98), ("all.long.bs64", 116), ("all.short", 48))
    assert split.oversized == (("gpu/small/long/none/bs64", 116),)
    line = split.describe(site_limits(config))
    assert line.startswith("site: engine group gpu/small/none/all (estimated 182 min > 104 = 80% of partition gpu's 130)")
    assert "all.long.bs64 (116*)" in line and "1 single cell(s)" in line
    # Enough room: the group stays whole, with its unsplit name.
    roomy = {**SPLIT, "site": _site(400)}
    assert split_to_fit(roomy, groups, group_estimate_minutes) == (groups, [])


def test_no_request_exceeds_the_limit_not_even_a_retry() -> None:
    from sdbench.scheduling import cell_runtime_minutes, group_runtime_minutes

    config = {**SPLIT, "site": _site("130")}  # --config site={...} passes strings
    cell = Cell("gpu", "small", "long", "none", 64)
    assert cell_runtime_minutes(SPLIT, cell, attempt=3) == 3 * 116
    assert [cell_runtime_minutes(config, cell, attempt=a) for a in (1, 2)] == [116, 130]
    assert group_runtime_minutes(config, next(iter(_groups(SPLIT).values())), 1) == 130


def test_a_model_wider_than_a_node_is_refused() -> None:
    from sdbench.scheduling import site_problems

    config = {**SPLIT, "site": _site(150, gpus_per_node=2)}
    cells = [Cell("gpu", "big", "long", "none", 1), Cell("gpu", "small", "long", "none", 1)]
    assert site_problems(config, cells) == [
        "site: model 'big' needs 4 GPUs (tensor_parallel_size) but a node of partition gpu has 2 "
        "(site.partitions.gpu.gpus_per_node)"
    ]
