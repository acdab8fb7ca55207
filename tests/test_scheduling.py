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
