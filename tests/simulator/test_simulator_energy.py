"""The simulator's energy bound beside its time bound (sdbench simulate --power-model): each
simulated step's seconds, as the time bound prices them, times the power of the tokens it batches
(sdbench.simulator.powermodel); with no power model NaN and the reason, never 0."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sdbench.cli import main
from sdbench.simulator.core import Prepared, simulate, simulate_prepared
from sdbench.simulator.costmodel import CostModel, DrafterCost, TargetCost, load_cost_model
from sdbench.simulator.policytypes import EXACT, TraceArrays
from sdbench.simulator.powermodel import (
    NO_CELL_ENERGY,
    NO_POWER_MODEL_GIVEN,
    PowerModel,
    cells_power_model,
    fit_power_model,
    load_power_model,
    save_power_model,
)
from sdbench.simulator.tracesets import load_traces
from tests.conftest import SHARED
from tests.support.require import shared_file

H200 = SHARED / "data" / "h200-step-cost-energy.csv"
CM = load_cost_model("llama3.1-8b-h100")
ENERGY = ["baseline_tokens_per_j", "sd_tokens_per_j", "energy_ratio"]


# ----------------------------------------------------------------------------- by hand
# One request: a 2-token prompt, 3 output tokens (the prefill's and two more); EAGLE's trace
# accepts its one draft at position 1, so fixed-1 ends in one step where plain decoding takes two.
# Target step: 10 ms + 1 ms per batched token (no KV term, no overhead).
HAND = Prepared("hand", "eagle", "eagle", TraceArrays(np.array([0]), np.array([3]), np.array([2]),
                                                      acc_draft=np.array([1, 2, 2])), None)  # fmt: skip
POWER = PowerModel(100.0, 100.0, 2.0, 1.0, source="by hand")  # P(n) = 100 + 100 n / (n + 2) W


def _hand_cost(draft_s: float) -> CostModel:
    return CostModel("hand", TargetCost(0.0, 0.001, 0.010), {"eagle": DrafterCost("linear", c_fixed=draft_s)}, 0.0)


@pytest.mark.parametrize(
    "batch, draft_s, base_j, sd_j",
    [
        # P(1) = 400/3 W, P(2) = 150 W. Prefill: 12 ms at P(2) = 1.8 J. No SD: two 11 ms steps at
        # P(1), 2 x 1.46667 J: 4.73333 J in all. SD: one 12 ms step verifying 2 tokens at P(2),
        # 1.8 J: 3.6 J in all. The same 3 tokens: ratio 3.6 / 4.73333 = 0.760563 (time 24 / 34 ms = 0.706).
        (1, 0.0, 1.8 + 2 * 0.011 * 400 / 3, 1.8 + 0.012 * 150),
        # Batch 2, P(4) = 166.667 W: prefill 14 ms at P(4) = 2.33333 J; no SD two 12 ms steps at
        # P(2), 3.6 J: 5.93333 J; SD one 14 ms step verifying 4 tokens at P(4): 4.66667 J. Ratio 0.786517.
        (2, 0.0, 0.014 * 500 / 3 + 2 * 0.012 * 150, 0.014 * 500 / 3 + 0.014 * 500 / 3),
        # A 2 ms draft counts as the time bound counts it, at its step's power: SD's step 14 ms at
        # P(2) = 2.1 J, 3.9 J in all: 3.9 / 4.73333 = 0.823944.
        (1, 0.002, 1.8 + 2 * 0.011 * 400 / 3, 1.8 + 0.014 * 150),
    ],
)
def test_a_hand_computed_energy_ratio(batch: int, draft_s: float, base_j: float, sd_j: float) -> None:
    # One request alone runs the same steps with continuous batching (the KV term is 0 here).
    for batching in ("replicated", "continuous") if batch == 1 else ("replicated",):
        row = simulate_prepared(HAND, ["fixed-1"], [batch], _hand_cost(draft_s), EXACT, batching=batching,
                                power=POWER).iloc[0]  # fmt: skip
        assert row["energy_ratio"] == pytest.approx(sd_j / base_j, rel=1e-9), batching
        assert row["baseline_tokens_per_j"] == pytest.approx(3 * batch / base_j, rel=1e-9), batching
        assert row["sd_tokens_per_j"] == pytest.approx(3 * batch / sd_j, rel=1e-9), batching
        assert row["power_model"].startswith("by hand: P(n) = 100 W")


# ----------------------------------------------------------------------------- published traces
@pytest.fixture(scope="module")
def gsm8k(published_traces_dir: Path):
    return load_traces(published_traces_dir / "combined_gsm8k.jsonl")


@pytest.mark.parametrize(
    "proposer, policies, mode, batching",
    [
        ("eagle", ["fixed-3", "oracle"], "exact", "replicated"),
        ("eagle", ["fixed-3", "adaptive"], "exact", "continuous"),
        ("ngram", ["fixed-3", "oracle"], "compat", "replicated"),  # the random n-gram match model
        ("combined", ["oracle-combine"], "exact", "replicated"),
    ],
)
def test_a_constant_power_gives_the_time_ratio(gsm8k, proposer, policies, mode, batching) -> None:
    """Energy is the time bound's seconds times the power: a flat power model leaves its ratio."""
    flat = PowerModel(300.0, 0.0, 10.0, 1.0)
    df = simulate([gsm8k], proposer, policies, [1, 16, 128], CM, mode, batching=batching, num_requests=30, power=flat)
    np.testing.assert_allclose(df["energy_ratio"], 1 / df["speedup"], rtol=1e-9)
    np.testing.assert_allclose(df["sd_tokens_per_j"], df["sd_tokens_per_s"] / 300.0, rtol=1e-9)


@pytest.fixture(scope="module")
def h200_power() -> PowerModel:
    """The power model fitted to the shared H200 table (1024-token KV cache): watts = J / s."""
    t = pd.read_csv(shared_file(H200))
    t = t[t["L"] == 1024]
    return fit_power_model(t["B"] * t["q"], t["joules"] / t["ms"] * 1000)


def test_with_the_h200_power_the_energy_ratio_has_the_tables_shape(gsm8k, h200_power: PowerModel) -> None:
    """Above the time ratio at mid batch sizes, where a step's power still climbs with its tokens,
    within a few percent of it at batch 128, where it has saturated."""
    df = simulate([gsm8k], "eagle", ["fixed-1", "fixed-3"], [8, 16, 128], CM, "exact", num_requests=40,
                  power=h200_power).set_index(["policy", "batch_size"])  # fmt: skip
    time = 1 / df["speedup"]
    for policy in ("fixed-1", "fixed-3"):
        for b in (8, 16):  # fixed-3: 0.573 / 0.602 in time, 0.715 / 0.810 in energy
            assert df.loc[(policy, b), "energy_ratio"] > time[(policy, b)] * 1.05, (policy, b)
        # fixed-3: 0.848 in time, 0.856 in energy
        assert df.loc[(policy, 128), "energy_ratio"] == pytest.approx(time[(policy, 128)], rel=0.03), policy
    assert (df["energy_ratio"] >= time).all()  # the power rises with the tokens: never below time


# ----------------------------------------------------------------------------- no power model
def test_no_power_model_gives_nan_and_the_reason(gsm8k) -> None:
    df = simulate([gsm8k], "eagle", ["fixed-3"], [1, 8], CM, "exact", num_requests=10)
    assert df[ENERGY].isna().all().all()
    assert set(df["power_model"]) == {NO_POWER_MODEL_GIVEN}
    df = simulate([gsm8k], "eagle", ["fixed-3"], [8], CM, "exact", num_requests=10, no_power=NO_CELL_ENERGY)
    assert df[ENERGY].isna().all().all() and df["power_model"].tolist() == [NO_CELL_ENERGY]


def _cells(power: list[float], meter: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"batch_size": [1, 8, 1, 8], "num_speculative_tokens": [0, 0, 3, 3],
                         "mean_power_w": power, "energy_meter": meter})  # fmt: skip


def test_the_cells_fit_it_or_say_why_not() -> None:
    none = _cells([math.nan] * 4, ["not measured"] * 4)
    assert cells_power_model(none) == (None, NO_CELL_ENERGY)
    assert cells_power_model(none.drop(columns="mean_power_w")) == (None, NO_CELL_ENERGY)
    model, reason = cells_power_model(_cells([400.0, 520.0, 450.0, 600.0], ["nvml"] * 4), "t.parquet")
    assert reason == "" and model is not None and model.source == "fitted to 4 metered cell(s) (nvml) of t.parquet"
    assert model.watts(32) > model.watts(1)
    mixed = cells_power_model(_cells([400.0, 520.0, 45.0, 60.0], ["nvml", "nvml", "rapl", "rapl"]))
    assert mixed == (None, "no power model: the cells were measured by several meters (nvml, rapl)")
    few = cells_power_model(_cells([400.0, math.nan, math.nan, math.nan], ["nvml"] + ["not measured"] * 3))
    assert few[0] is None and "1 cell(s) measured energy" in few[1]


def test_the_model_file_round_trips_and_keeps_the_reason(tmp_path: Path) -> None:
    save_power_model(POWER, tmp_path / "p.json")
    back, reason = load_power_model(tmp_path / "p.json")
    assert reason == "" and (back.p_idle_w, back.p_span_w, back.n_half, back.h, back.source) == (
        100.0, 100.0, 2.0, 1.0, "by hand")  # fmt: skip
    save_power_model(None, tmp_path / "none.json", NO_CELL_ENERGY)
    assert load_power_model(tmp_path / "none.json") == (None, NO_CELL_ENERGY)
    (tmp_path / "bad.json").write_text(json.dumps({"p_idle_w": 1.0}))
    with pytest.raises(ValueError, match="p_span_w, n_half, h missing"):
        load_power_model(tmp_path / "bad.json")


def test_the_commands_fit_from_cells_and_simulate_with_it(gsm8k, tmp_path: Path, published_traces_dir) -> None:
    """costmodel power on unmetered cells writes the reason; simulate --power-model carries it;
    on metered cells the energy columns are filled."""
    traces = str(published_traces_dir / "combined_gsm8k.jsonl")
    for name, cells in (("none", _cells([math.nan] * 4, ["not measured"] * 4)),
                        ("nvml", _cells([400.0, 520.0, 450.0, 600.0], ["nvml"] * 4))):  # fmt: skip
        cells.to_parquet(tmp_path / f"{name}.parquet")
        pm, out = tmp_path / f"{name}.json", tmp_path / f"{name}.csv"
        assert main(["costmodel", "power", "--cells", str(tmp_path / f"{name}.parquet"), "--output", str(pm)]) == 0
        assert main(["simulate", "--traces", traces, "--proposer", "eagle", "--policy", "fixed-3",
                     "--batch-sizes", "1", "16", "--num-requests", "5", "--power-model", str(pm),
                     "--output", str(out)]) == 0  # fmt: skip
        df = pd.read_csv(out)
        if name == "none":
            assert df[ENERGY].isna().all().all() and set(df["power_model"]) == {NO_CELL_ENERGY}
        else:
            assert (df["energy_ratio"] > 0).all() and df["power_model"].str.startswith("fitted to 4 metered").all()


# ----------------------------------------------------------------------------- the workflow
def test_the_grid_simulations_read_the_power_model_of_their_engine_and_models_cells() -> None:
    """fit_power_model fits it from the grid's cells of the engine x model whose steps fitted the
    cost model; simulate_cells and simulate_drafter_cells pass it to sdbench simulate."""
    from sdbench.config import load_config
    from sdbench.workflow import paths as P
    from sdbench.workflow.plan import Plan
    from tests.conftest import REPO

    text = (REPO / "workflow" / "rules" / "simulator.smk").read_text()
    body = lambda rule: text.split(f"rule {rule}:", 1)[1].split("\nrule ", 1)[0]  # noqa: E731
    assert "cells=P.GRID_CELLS_TABLE" in body("fit_power_model") and "P.POWER_MODEL" in body("fit_power_model")
    assert "sdbench costmodel power --cells {input.cells} {params.cells}" in body("fit_power_model")
    for rule in ("simulate_cells", "simulate_drafter_cells"):
        assert "power_model=P.POWER_MODEL" in body(rule) and "--power-model {input.power_model}" in body(rule), rule
    assert "--power-model" not in body("simulate_published")  # the paper's H100 cost model: no power of ours
    assert Plan(load_config(REPO / "config" / "config.yaml")).sim_power_cells() == "--engine vllm-cpu --model tiny-target"
    # A breakdown over two models fits one cost model over both: one power model too, no --model.
    from types import SimpleNamespace

    two = SimpleNamespace(breakdown=[SimpleNamespace(engine="e", model=m) for m in ("a", "b", "a")])
    assert Plan.sim_power_cells(two) == "--engine e"
    assert P.POWER_MODEL == "results/cost_models/power.json"


def test_costmodel_power_keeps_one_engine_and_models_cells(tmp_path: Path) -> None:
    cells = pd.concat([_cells([400.0, 520.0, 450.0, 600.0], ["nvml"] * 4).assign(engine="e", model="a"),
                       _cells([40.0, 52.0, 45.0, 60.0], ["rapl"] * 4).assign(engine="e", model="b")])  # fmt: skip
    cells.to_parquet(tmp_path / "cells.parquet")
    args = ["costmodel", "power", "--cells", str(tmp_path / "cells.parquet"), "--output", str(tmp_path / "p.json")]
    assert main(args) == 0
    assert load_power_model(tmp_path / "p.json")[1].startswith("no power model: the cells were measured by several")
    assert main([*args, "--engine", "e", "--model", "b"]) == 0
    model, _ = load_power_model(tmp_path / "p.json")
    assert model.source == f"fitted to 4 metered cell(s) (rapl) of e/b in {tmp_path / 'cells.parquet'}"
    assert model.watts(1) < 60


def test_a_power_model_fitted_to_rehearsal_cells_marks_the_simulation(tmp_path: Path, published_traces_dir) -> None:
    cells = _cells([400.0, 520.0, 450.0, 600.0], ["nvml"] * 4).assign(measured=False)
    cells.to_parquet(tmp_path / "cells.parquet")
    args = ["costmodel", "power", "--cells", str(tmp_path / "cells.parquet"), "--output", str(tmp_path / "p.json")]
    assert main(args) == 0
    assert json.loads((tmp_path / "p.json").read_text())["measured"] is False
    assert main(["simulate", "--traces", str(published_traces_dir / "combined_gsm8k.jsonl"), "--proposer", "eagle",
                 "--policy", "fixed-1", "--batch-sizes", "1", "--num-requests", "3",
                 "--power-model", str(tmp_path / "p.json"), "--output", str(tmp_path / "s.csv")]) == 0  # fmt: skip
    assert not pd.read_csv(tmp_path / "s.csv")["measured"].any()
