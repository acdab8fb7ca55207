"""A calibrated cost model checked against a run (``sdbench calibrate check``), priced into a
rehearsal (``rehearsal_cost_model``) and shown by the doctor (``--cost-model``): fast, on small
synthetic tables whose expected values are worked out by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from sdbench.simulator import calibratecheck as chk
from sdbench.simulator.costmodel import CostModel, DrafterCost, TargetCost, save_cost_model

# 1 ms + 0.1 ms per batched token (no KV term); n-gram drafting 10% of verify; 0.2 ms overhead.
MODEL = CostModel(
    name="synthetic", target=TargetCost(c_kv=0.0, c_compute=1e-4, c_fixed=1e-3),
    drafters={"ngram": DrafterCost("fraction_of_verify", fraction=0.1)}, overhead_per_step=2e-4,
)  # fmt: skip


def _steps() -> pd.DataFrame:
    row = dict(engine="e", model="m", dataset="d", num_kv_tokens=10, num_proposed_tokens=0)
    return pd.DataFrame([
        # no SD, batch 1: predicted verify 1.1 ms; measured 1.1 ms and 2.2 ms
        {**row, "method": "none", "batch_size": 1, "sd_method": "none", "num_batched_tokens": 1,
         "verify_s": 1.1e-3, "step_s": 1.3e-3},
        {**row, "method": "none", "batch_size": 1, "sd_method": "none", "num_batched_tokens": 1,
         "verify_s": 2.2e-3, "step_s": 2.4e-3},
        # n-gram: predicted verify 1.4 ms, step 1.4 + 0.14 + 0.2 = 1.74 ms against 2.0 ms
        {**row, "method": "ngram-k3", "batch_size": 1, "sd_method": "ngram", "num_batched_tokens": 4,
         "num_proposed_tokens": 3, "verify_s": 1.4e-3, "step_s": 2.0e-3},
        # EAGLE-3: the model has no such drafter: its target is priced, its step is not
        {**row, "method": "eagle3-k3", "batch_size": 1, "sd_method": "eagle3", "num_batched_tokens": 4,
         "num_proposed_tokens": 3, "verify_s": 2.8e-3, "step_s": 4.0e-3},
    ])  # fmt: skip


def test_step_errors_price_the_target_and_the_whole_step_per_step_and_per_cell() -> None:
    per_step, cells = chk.step_errors(MODEL, _steps())
    assert per_step["verify_error"].tolist() == pytest.approx([0.0, -0.5, 0.0, -0.5])
    assert per_step["step_error"].iloc[:3].tolist() == pytest.approx([1.3 / 1.3 - 1, 1.3 / 2.4 - 1, 1.74 / 2.0 - 1])
    assert math.isnan(per_step["step_error"].iloc[3]) and not per_step["priced"].iloc[3]
    by = cells.set_index("method")
    # the cell mean: 1.1 ms predicted against (1.1 + 2.2) / 2 = 1.65 ms measured
    assert by.loc["none", "verify_error"] == pytest.approx(1.1 / 1.65 - 1)
    assert by.loc["none", "steps"] == 2 and by.loc["none", "priced"]
    assert by.loc["ngram-k3", "step_error"] == pytest.approx(1.74 / 2.0 - 1)
    assert not by.loc["eagle3-k3", "priced"]
    assert list(cells.columns) == list(chk.STEP_CHECK_COLUMNS)
    # without a propose_s column the measured overhead is not known; the model's is 0.2 ms
    assert cells["overhead_measured_ms"].isna().all() and by.loc["none", "overhead_model_ms"] == pytest.approx(0.2)


def test_the_measured_overhead_is_the_step_less_verify_and_propose() -> None:
    steps = _steps().assign(propose_s=[None, None, 0.3e-3, 0.5e-3])
    per_step, cells = chk.step_errors(MODEL, steps)
    # 1.3 - 1.1, 2.4 - 2.2, 2.0 - 1.4 - 0.3, 4.0 - 2.8 - 0.5 ms (no proposal: nothing subtracted)
    assert (per_step["overhead_measured_s"] * 1e3).tolist() == pytest.approx([0.2, 0.2, 0.3, 0.7])
    by = cells.set_index("method")
    assert by.loc["ngram-k3", "overhead_measured_ms"] == pytest.approx(0.3)
    assert by.loc["eagle3-k3", "overhead_measured_ms"] == pytest.approx(0.7)


def test_the_summary_gives_median_and_largest_with_its_sign() -> None:
    assert chk.error_summary(pd.Series([0.02, -0.30, 0.10, float("nan")])) == \
        "median |error| 10.0%, largest 30.0% (under), n=3"  # fmt: skip
    assert chk.error_summary(pd.Series([float("nan")])) == "none priced"


def test_a_cell_without_an_interval_is_not_judged() -> None:
    table = pd.DataFrame({"agrees": [True, False, None, True]}, dtype=object)
    assert chk.inside_count(table) == (2, 3)


def test_a_simulation_file_names_its_cell_and_proposer() -> None:
    assert chk._sim_key("results/simulator/cells/E/M/D/ngram.csv") == ("E", "M", "D", "ngram", None)
    assert chk._sim_key("results/simulator/cells/E/M/D/drafters/eagle3-k3.csv") == ("E", "M", "D", "eagle", "eagle3-k3")


# ----------------------------------------------------------------------------- the rehearsal and the doctor
HINGED = CostModel(
    name="calibrated", target=TargetCost(c_kv=1e-8, c_compute=2e-5, c_fixed=3e-3, knee_tokens=64.0, c_above_knee=5e-5),
    drafters={"ngram": DrafterCost("fraction_of_verify", fraction=0.05),
              "eagle3": DrafterCost("linear", c_kv=0.0, c_spec=1e-4, c_fixed=4e-4)},
    overhead_per_step=7e-4, source="sdbench calibrate fit cal.parquet",
    fit={"device": "cuda:0: NVIDIA H200", "time": {"chosen": "hinge", "shapes": {
        "hinge": {"heldout_median": 0.01, "heldout_max": 0.094}}}},
)  # fmt: skip


@pytest.fixture()
def calibrated(tmp_path: Path) -> str:
    path = tmp_path / "calibrated.yaml"
    save_cost_model(HINGED, path)
    return str(path)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    from sdbench.rehearsal.prepare import write_standin_model

    out = tmp_path_factory.mktemp("hub") / "llama3.2-1b"  # not the base model's shape: scaling would show
    write_standin_model("meta-llama/Llama-3.2-1B-Instruct", "main", out)
    return str(out)


def _spec(method: str, cost_model: str | None) -> dict:
    rehearsal = {"published_traces": {}} | ({"cost_model": cost_model} if cost_model else {})
    return {"engine": {"vllm_version": "0.10.1.1"}, "model": {"hf_id": "meta-llama/Llama-3.2-1B-Instruct"},
            "method": {"method": method, "num_speculative_tokens": 3}, "engine_mode": "rehearsal",
            "rehearsal": rehearsal}  # fmt: skip


def test_a_calibrated_model_prices_the_rehearsal_as_it_is_and_is_recorded(calibrated: str, llama: str,
                                                                          tmp_path: Path) -> None:  # fmt: skip
    from sdbench.rehearsal.costs import step_cost
    from sdbench.rehearsal.totals import write_job_total

    cost = step_cost(_spec("eagle3", calibrated), llama)
    # unscaled, the hinge kept: 3 ms + 2e-5 x 100 + 1e-8 x 1000 + 5e-5 x (100 - 64)
    assert cost.verify(1000, 100) == pytest.approx(3e-3 + 2e-3 + 1e-5 + 1.8e-3)
    assert cost.overhead == 7e-4 and cost.ngram_fraction == 0.05
    assert cost.draft(cost.verify(1000, 4), 1000, 3, 1) == pytest.approx(4e-4 + 3e-4)  # its own eagle3 drafter
    base = step_cost(_spec("eagle3", None), llama)  # the paper's H100 model scaled: a different price
    assert base.verify(1000, 100) != pytest.approx(cost.verify(1000, 100))
    write_job_total(tmp_path, "engine", 1.0, 2.0, 1, spec=_spec("eagle3", calibrated))
    record = json.loads((tmp_path / "rehearsal.json").read_text())
    assert record["cost_model"] == "calibrated" and record["cost_model_source"] == calibrated
    assert record["cost_model_sha256"] == HINGED.digest() and record["cost_model_scaled"] is False


def test_the_doctor_names_a_cost_models_source_device_and_held_out_error(calibrated: str, tmp_path: Path) -> None:
    from sdbench.doctorcostmodel import cost_model_checks

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntarget: {c_kv: -1, c_compute: 0, c_fixed: 0}\n"
                   "drafters: {ngram: {kind: fraction_of_verify, fraction: 0.1}}\noverhead_per_step: 0\n")  # fmt: skip
    site = SimpleNamespace(cost_model=calibrated, config={"rehearsal_cost_model": str(bad)})
    good, failed = cost_model_checks(site)
    assert good.status == "ok" and "device cuda:0: NVIDIA H200" in good.check
    assert "hinge held-out median 1.0%, largest 9.4% (within 5% / 10%)" in good.check
    assert failed.failed and "target.c_kv" in failed.why
    assert cost_model_checks(SimpleNamespace(cost_model=None, config=None)) == []
    from dataclasses import replace

    from sdbench.doctorcostmodel import describe

    shapes = {"hinge": {"heldout_median": 0.014, "heldout_max": 0.109}}  # the H100 table's: largest misses
    h100 = replace(HINGED, fit={"time": {"chosen": "hinge", "shapes": shapes}})
    assert "largest 10.9% (outside 5% / 10%)" in describe(h100)


def test_a_rehearsal_config_names_its_cost_model_in_every_engine_spec(calibrated: str) -> None:
    import yaml

    from sdbench.config import validate_config
    from sdbench.workflow.plan import Plan

    raw = yaml.safe_load((Path(__file__).parents[2] / "config" / "paper.yaml").read_text())
    plan = Plan(validate_config({**raw, "engine_mode": "rehearsal", "rehearsal_cost_model": calibrated}, source="t"))
    spec = plan.with_mode({"cell": {}})
    assert spec["rehearsal"]["cost_model"] == calibrated
    assert spec["rehearsal"]["cost_model_sha256"] == HINGED.digest()  # a changed file: a changed spec, a rerun
    measured = Plan(validate_config({**raw, "rehearsal_cost_model": calibrated}, source="t"))
    assert measured.with_mode({"cell": {}}) == {"cell": {}}


def test_the_check_reads_every_breakdown_table_of_the_plan_and_says_what_it_could_not_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Synthetic steps where the plan puts them (the default config's breakdown): every target pass
    measured 10% slower than the model prices it; no joined cells yet, so no speedup check."""
    from sdbench.cli import main
    from sdbench.config import load_config
    from sdbench.workflow.plan import Plan

    repo = Path(__file__).parents[2]
    model = tmp_path / "model.yaml"
    save_cost_model(MODEL, model)
    for path in Plan(load_config(repo / "config" / "config.yaml")).breakdown_steps():
        method = Path(path).parts[-3]
        sd = {"none": "none", "ngram-k3": "ngram", "draft-k3": "draft_model"}.get(method, method.split("-")[0])
        batch = int(Path(path).parts[-2].removeprefix("bs"))
        steps = pd.DataFrame({"engine": "e", "model": "m", "dataset": "d", "method": method, "batch_size": batch,
                              "sd_method": sd, "num_batched_tokens": [1, 4], "num_kv_tokens": 10,
                              "num_proposed_tokens": 0, "verify_s": [1.1e-3 * 1.1, 1.4e-3 * 1.1],
                              "step_s": 5e-3})  # fmt: skip
        steps["propose_s"] = steps["step_s"] - steps["verify_s"] - 2e-3  # 2 ms of the step is neither
        (tmp_path / path).parent.mkdir(parents=True)
        steps.to_parquet(tmp_path / path)
    argv = ["calibrate", "check", "--cost-model", str(model), "--results", str(tmp_path / "results"),
            "--config", str(repo / "config" / "config.yaml"), "--steps-output", str(tmp_path / "steps.parquet")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "step times: 20 steps in 10 breakdown cells (10 tables)" in out
    assert f"per step: median |error| {1 - 1 / 1.1:.1%}, largest {1 - 1 / 1.1:.1%} (under), n=20" in out
    assert "not priced (no such drafter in the model): draft_model, eagle, eagle3" in out
    assert "per-step overhead (step - verify - propose, median): measured 2 ms (by batch size: 1: 2, 8: 2); " \
        "the model's overhead_per_step 0.2 ms" in out
    assert "speedups: not checked:" in out and "cells.parquet does not exist" in out
    assert len(pd.read_parquet(tmp_path / "steps.parquet")) == 10
