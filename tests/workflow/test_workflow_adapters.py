"""sdbench.workflow.adapters: what common.smk's one-line adapters hand Snakemake, on the default
config's plan (CPU engines) and on inputs whose sizes are counted by hand from the documented
constants of sdbench.scheduling (ANALYSIS_BASE_S 60 s, ANALYSIS_ROWS_PER_S 2e4, SAFETY 2)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sdbench.config import load_config
from sdbench.grid import EngineGroup, TraceGroup
from sdbench.workflow import paths as P
from sdbench.workflow.adapters import AnalysisJobs, EngineJobs
from sdbench.workflow.plan import Plan

REPO = Path(__file__).resolve().parents[2]


class Wildcards(SimpleNamespace):
    """Snakemake's wildcards as the adapters read them: attributes and keys()."""

    def keys(self) -> Any:
        return vars(self).keys()


@pytest.fixture(scope="module")
def engine() -> EngineJobs:
    return EngineJobs(Plan(load_config(REPO / "config" / "config.yaml")), REPO / "containers")


def test_an_engine_job_is_sized_by_its_largest_cell_or_its_first_trace(engine: EngineJobs) -> None:
    run = Wildcards(engine="vllm-cpu", model="tiny-target", method="draft-k3", share="all-forced")
    assert engine.group(run) == EngineGroup("vllm-cpu", "tiny-target", "draft-k3", "all-forced")
    assert engine.engine_cell(run).batch_size == 8  # the group's batch sizes are 1 and 8
    trace = Wildcards(engine="vllm-cpu", model="tiny-target", method="draft-k3")
    assert engine.trace_group(trace) == TraceGroup("vllm-cpu", "tiny-target", "draft-k3")
    assert engine.engine_cell(trace).dataset == "code-edit"  # its traces: code-edit, then code-write
    assert engine.gpus(run) == 0  # a CPU engine asks for no GPU


def test_a_retry_asks_for_more_time(engine: EngineJobs) -> None:
    run = Wildcards(engine="vllm-cpu", model="tiny-target", method="draft-k3", share="all")
    first = engine.group_runtime(run, 1)
    assert engine.group_runtime(run, 3) == 3 * first  # no site limit in the default config
    trace = Wildcards(engine="vllm-cpu", model="tiny-target", method="draft-k3")
    assert engine.trace_group_runtime(trace, 2) == 2 * engine.trace_group_runtime(trace, 1)
    assert engine.drafter_arg(run, Wildcards(drafter="m/d x")) == "--drafter-dir 'm/d x'"  # quoted for the shell
    assert engine.drafter_arg(run, Wildcards()) == ""


def test_analysis_jobs_ask_from_what_their_inputs_hold() -> None:
    config = load_config(REPO / "config" / "config.yaml")
    jobs = AnalysisJobs(config, num_cells=10**8)
    cells = [P.CELLS_TABLE]  # 1e8 rows: 5,000 s a pass at 2e4 rows/s
    # (60 s + 5,000 s) x 2 = 169 min; three policies x two batch sizes: (60 + 30,000) x 2 = 1,002 min
    assert jobs.runtime(None, cells, 1) == 169
    assert jobs.runtime(None, cells, 2) == 2 * 169
    simulate = jobs.simulation_runtime(lambda w: ["a", "b", "c"], lambda w: [1, 8])
    assert simulate(None, cells, 1) == 1002
    # Nothing counted: the base, 1,000 MB. 1e8 rows: two copies of 512 bytes a row on top,
    # 97,656.25 MiB, rounded up to 100 MB: 98,700.
    assert jobs.mem_mb(None, []) == 1000
    assert jobs.mem_mb(None, cells) == 98_700
    w = Wildcards(model="tiny-target", dataset="code-edit")
    assert jobs.prompt_table_mem_mb(w, []) > jobs.mem_mb(w, [])  # the table it writes is counted
