"""The step energy model (sdbench.simulator.stepenergy): energy per step from B, q and L fitted on
joules alone, held out against the old watts model, and priced by the simulator.

Hand cases use the simulator's one-request trace of tests/simulator/test_simulator_energy.py (a 2-token
prompt, 3 output tokens; target step 10 ms + 1 ms per batched token, no KV term) and a model
E = 1 J + 0.1 J x n + 0.01 J x kv whose joules are worked out below.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sdbench.simulator.core import simulate, simulate_prepared
from sdbench.simulator.policytypes import EXACT
from sdbench.simulator.powermodel import PowerModel, load_power_model, save_power_model
from sdbench.simulator.stepenergy import (
    StepEnergyModel,
    every_4th,
    fit_form,
    fit_step_energy,
    implied_watts,
)
from sdbench.simulator.stepenergyreport import heldout_errors
from sdbench.simulator.tracesets import load_traces
from tests.conftest import SHARED
from tests.support.require import shared_file
from tests.simulator.test_simulator_energy import CM, HAND, _hand_cost

HANDMODEL = StepEnergyModel(1.0, 0.1, 0.01, source="by hand")


@pytest.mark.parametrize(
    "batch, draft_s, base_j, sd_j",
    [
        # No SD: prefill n = 2, kv = 0: 1.2 J; two steps of 1 token at kv 3 and 4: 1.13 + 1.14 J.
        # SD (fixed-1): prefill 1.2 J, one step verifying 2 tokens at kv 3: 1.23 J.
        (1, 0.0, 1.2 + 1.13 + 1.14, 1.2 + 1.23),
        # A 2 ms draft on SD's 12 ms step: its seconds at that step's power, 1.23 J x 14 / 12.
        (1, 0.002, 1.2 + 1.13 + 1.14, 1.2 + 1.23 * 14 / 12),
        # Batch 2: prefill n = 4: 1.4 J; no SD steps n = 2 at kv 6 and 8: 1.26 + 1.28 J; SD n = 4 at kv 6: 1.46 J.
        (2, 0.0, 1.4 + 1.26 + 1.28, 1.4 + 1.46),
    ],
)
def test_the_simulator_prices_each_step_at_the_models_joules(
    batch: int, draft_s: float, base_j: float, sd_j: float
) -> None:
    for batching in ("replicated", "continuous") if batch == 1 else ("replicated",):
        row = simulate_prepared(HAND, ["fixed-1"], [batch], _hand_cost(draft_s), EXACT, batching=batching,
                                power=HANDMODEL).iloc[0]  # fmt: skip
        assert 3 * batch / row["baseline_tokens_per_j"] == pytest.approx(base_j, rel=1e-9), batching
        assert 3 * batch / row["sd_tokens_per_j"] == pytest.approx(sd_j, rel=1e-9), batching
        assert row["power_model"].startswith("by hand: E = 1 J + 0.1 J x n + 0.01 J x kv per step (line")


@pytest.mark.parametrize("proposer, policy, mode, batching", [("eagle", "fixed-3", "exact", "replicated"),
                                                             ("eagle", "fixed-3", "exact", "continuous"),
                                                             ("ngram", "fixed-3", "compat", "replicated")])  # fmt: skip
def test_energy_proportional_to_the_cost_models_time_is_a_flat_power(
    published_traces_dir: Path, proposer: str, policy: str, mode: str, batching: str
) -> None:
    """E = 300 W x the target's time (no knee in this cost model): every step, drafting, overhead and
    the random n-gram model's steps included, costs what a flat 300 W power model makes it cost."""
    assert CM.target.c_above_knee == 0
    t = CM.target
    flat_e = StepEnergyModel(300 * t.c_fixed, 300 * t.c_compute, 300 * t.c_kv)
    traces = [load_traces(published_traces_dir / "combined_gsm8k.jsonl")]
    args = (traces, proposer, [policy], [1, 16], CM, mode)
    by_e = simulate(*args, batching=batching, num_requests=20, power=flat_e)
    by_p = simulate(*args, batching=batching, num_requests=20, power=PowerModel(300.0, 0.0, 10.0, 1.0))
    for column in ("baseline_tokens_per_j", "sd_tokens_per_j", "energy_ratio"):
        np.testing.assert_allclose(by_e[column], by_p[column], rtol=1e-9)


def table(model: StepEnergyModel, noise: float = 0.0) -> pd.DataFrame:
    """The shared tables' grid (B 1..128, q 1..5, 8 at L = 1024; six points at L = 4096), joules by ``model``."""
    rows = [(b, q, 1024) for b in (1, 2, 4, 8, 16, 32, 64, 128) for q in (1, 2, 3, 4, 5, 8)]
    rows += [(b, q, 4096) for b in (1, 8, 32) for q in (1, 4)]
    t = pd.DataFrame(rows, columns=["B", "q", "L"])
    wobble = 1 + noise * np.where(np.arange(len(t)) % 2 == 0, 1.0, -1.0)
    joules = model.joules(t["B"] * t["q"], t["B"] * t["L"]) * wobble
    return t.assign(joules=joules, ms=joules / 0.5)  # 500 W


def test_the_fit_recovers_a_known_model_and_chooses_its_form() -> None:
    line = StepEnergyModel(2.6, 0.016, 3e-5)
    got = fit_step_energy(table(line), "synthetic")
    assert got.form == "line" and got.heldout_max < 1e-9
    assert (got.e_fixed, got.e_token, got.e_kv) == pytest.approx((2.6, 0.016, 3e-5), rel=1e-6)
    assert got.source == "fitted to 54 rows, joules alone of synthetic"
    ramp = StepEnergyModel(2.8, 0.014, 3e-5, 0.02, 64.0, "ramp")
    t = table(ramp)
    got = fit_step_energy(t, "synthetic")
    assert got.form == "ramp" and got.knee_tokens == pytest.approx(64.0, rel=0.06)
    assert got.e_ramp == pytest.approx(0.02, rel=0.1) and got.heldout_median < 0.01
    # Fitted as a line it errs by more than the tie: the ramp is kept.
    line_fit = fit_form(t["B"] * t["q"], t["B"] * t["L"], t["joules"], "line")
    err = np.abs(line_fit.joules(t["B"] * t["q"], t["B"] * t["L"]) - t["joules"]) / t["joules"]
    assert np.median(err) > 0.01
    # Every 4th row in (L, B, q) order: rows 3, 7, ... of the grid as listed (already in that order).
    assert np.flatnonzero(every_4th(t)).tolist() == list(range(3, 54, 4))


def test_the_held_out_errors_compare_the_old_watts_and_the_new_joules() -> None:
    """Joules from a step time that grows with the context and a power that rises with tokens: the old
    model (watts against batched tokens) cannot see the context; the new one has it."""
    truth = StepEnergyModel(2.5, 0.015, 4e-4)
    t = table(truth)
    t = t.assign(ms=5.0 + 0.01 * t["B"] * t["q"] + 2e-4 * t["B"] * t["L"])
    out = heldout_errors(t).set_index(["rule", "model"])
    assert out.loc[("every 4th", "after"), "heldout_rows"] == 13
    assert out.loc[("context out", "after"), "heldout_rows"] == 6
    assert out.loc[("every 4th", "after"), "largest"] < 1e-9 and out.loc[("context out", "after"), "largest"] < 1e-9
    assert out.loc[("context out", "before"), "median"] > 0.01
    assert set(out["quantity"]) == {"watts = joules / ms", "joules"}


def test_one_window_rows_are_preferred_and_their_time_gives_the_watts() -> None:
    model = StepEnergyModel(2.0, 0.02, 1e-5)
    t = table(model).assign(component="target", same_window=True)
    other = t.iloc[:3].assign(joules=99.0, same_window=False)  # another window's energy: not fitted on
    got = fit_step_energy(pd.concat([t, other], ignore_index=True), "cal.csv")
    assert got.source == "fitted to 54 same-window rows of cal.csv" and got.e_fixed == pytest.approx(2.0, rel=1e-6)
    watts, what = implied_watts(got, t)
    assert watts == pytest.approx(np.full(len(t), 500.0), rel=1e-6) and what == "model joules / ms of the same window"
    _, what = implied_watts(got, t.drop(columns="same_window"))
    assert what.startswith("model joules / ms of another window")


def test_the_model_file_round_trips_and_old_files_still_load(tmp_path: Path) -> None:
    ramp = StepEnergyModel(2.8, 0.014, 3e-5, 0.02, 64.0, "ramp", 0.02, 0.07, "fitted to x")
    save_power_model(ramp, tmp_path / "e.json")
    assert load_power_model(tmp_path / "e.json") == (ramp, "")
    old = {"p_idle_w": 400.0, "p_span_w": 300.0, "n_half": 20.0, "h": 2.0, "r2": 0.9, "source": "old", "reason": ""}
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert load_power_model(tmp_path / "old.json")[0] == PowerModel(400.0, 300.0, 20.0, 2.0, 0.9, "old")
    for bad, message in (({"kind": "watts"}, "kind 'watts' is not known"),
                         ({**ramp.to_dict(), "form": "cubic"}, "form 'cubic' is not one of line, ramp"),
                         ({**ramp.to_dict(), "e_kv": -1.0}, "e_kv = -1.0, needs a number >= 0")):  # fmt: skip
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=message):
            load_power_model(tmp_path / "bad.json")


def test_on_the_shared_tables_the_fit_follows_the_measured_joules() -> None:
    """Energy alone from the shared H100/H200 tables: the model's joules of the smallest and largest
    steps within 8% of what the table measured (2.517 / 23.589 J on the H200, 2.773 / 23.550 J on the
    H100; the H200's line is 5% high at one token)."""
    for gpu, small, large in (("h200", 2.517, 23.58854), ("h100", 2.77343, 23.5504)):
        model = fit_step_energy(pd.read_csv(shared_file(SHARED / "data" / f"{gpu}-step-cost-energy.csv")), gpu)
        assert model.joules(1, 1024) == pytest.approx(small, rel=0.08)
        assert model.joules(128 * 8, 128 * 1024) == pytest.approx(large, rel=0.08)
        assert not math.isnan(model.heldout_median) and model.heldout_max < 0.15


def test_the_random_ngram_steps_are_priced_at_their_batchs_kv() -> None:
    """The compat random-match steps (sdbench.simulator.compat): one request, two such steps at 3 and
    4 KV tokens per copy; a 10 ms target step of no compute or KV cost and free drafts, an energy of
    0.01 J per KV token: at batch 4 the steps cost 0.01 x 4 x (3 + 4) = 0.28 J, whatever matched."""
    import random

    from sdbench.simulator.compat import compat_random_energy
    from sdbench.simulator.costmodel import CostModel, DrafterCost, TargetCost
    from sdbench.simulator.policytypes import COMPAT, NGRAM, TraceArrays, Trajectories

    arrays = TraceArrays(np.array([0]), np.array([3]), np.array([2]), acc_draft=np.array([1, 2, 2]))
    traj = Trajectories(np.array([0, 0]), np.array([1, 2]), np.array([NGRAM, NGRAM], np.int8), np.array([3, 3]),
                        np.array([1, 1]), rng=np.array([True, True]))  # fmt: skip
    cm = CostModel("kv", TargetCost(0.0, 0.0, 0.010), {"ngram": DrafterCost("linear")}, 0.0)
    joules = compat_random_energy(traj, arrays, cm, COMPAT, 4, random.Random(0).getstate(), 0.5,
                                  StepEnergyModel(0.0, 0.0, 0.01))  # fmt: skip
    assert joules.tolist() == pytest.approx([0.28], rel=1e-9)


def test_a_hinged_cost_models_seconds_price_the_draft_at_the_steps_power() -> None:
    """Target 10 ms + 1 ms per token + 1 ms per token above a knee at 1 token, a 2 ms draft: SD's step
    (2 tokens, kv 3) takes 13 ms of target and 15 ms in all: 1.23 J x 15 / 13; the prefill (2 tokens,
    kv 0) costs its 1.2 J; no SD's steps (1 token) have no hinge: 1.13 + 1.14 J."""
    from sdbench.simulator.costmodel import CostModel, DrafterCost, TargetCost

    cm = CostModel("hinged", TargetCost(0.0, 0.001, 0.010, knee_tokens=1.0, c_above_knee=0.001),
                   {"eagle": DrafterCost("linear", c_fixed=0.002)}, 0.0)  # fmt: skip
    for batching in ("replicated", "continuous"):
        row = simulate_prepared(HAND, ["fixed-1"], [1], cm, EXACT, batching=batching, power=HANDMODEL).iloc[0]
        assert 3 / row["sd_tokens_per_j"] == pytest.approx(1.2 + 1.23 * 15 / 13, rel=1e-9), batching
        assert 3 / row["baseline_tokens_per_j"] == pytest.approx(1.2 + 1.13 + 1.14, rel=1e-9), batching


def test_the_command_fits_a_model_file_and_reports_before_and_after(tmp_path: Path, capsys) -> None:
    from sdbench.simulator.stepenergyreport import main

    t = table(StepEnergyModel(2.6, 0.016, 3e-5)).assign(ms=lambda d: d["joules"] / 0.75)  # 750 W: over the limit
    t.to_csv(tmp_path / "t.csv", index=False)
    assert main(["fit", str(tmp_path / "t.csv"), "--output", str(tmp_path / "m.json")]) == 0
    model, _ = load_power_model(tmp_path / "m.json")
    assert isinstance(model, StepEnergyModel) and model.e_token == pytest.approx(0.016, rel=1e-6)
    assert main(["report", str(tmp_path / "t.csv")]) == 0
    text = capsys.readouterr().out
    assert "| t.csv | every 4th | after (line) | joules | 13 | 0.0% | 0.0% |" in text
    assert "750-750 W, 54 of 54 rows above the 700 W board limit (for those rows the energy window's steps must " \
           "have run at least 7% slower" in text  # fmt: skip
