"""Forced acceptance: the curves, ceilings and gap split (sdbench.analysis.forced) and the
simulator's check and refit at those points (sdbench.simulator.forcedcheck)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sdbench.analysis import forced
from sdbench.simulator import forcedcheck
from sdbench.simulator.costmodel import CostModel, DrafterCost, TargetCost
from sdbench.simulator.lstsq import nonnegative_lstsq

METHODS = {
    "none": {"method": "none"},
    "eagle3-k3": {"method": "eagle3", "num_speculative_tokens": 3, "label": "EAGLE-3 k=3"},
    **{f"eagle3-k3.a{a:g}": {"method": "eagle3", "num_speculative_tokens": 3, "sweep_of": "eagle3-k3",
                            "forced_acceptance_length": a} for a in (1.0, 2.5, 4.0)},
}  # fmt: skip


def _cell(method: str, bs: int, tau: float, speedup: float, half: float = 0.05, sweep: str = "") -> dict:
    return {
        "engine": "e", "model": "m", "dataset": "d", "method": method, "batch_size": bs, "sweep": sweep,
        "sd_method": "eagle3", "num_speculative_tokens": 3, "mean_acceptance_length": tau,
        "num_drafts": 100, "num_draft_tokens": 300, "num_accepted_tokens": int(round(100 * (tau - 1))),
        "tokens_per_s_pooled": 100.0, "generate_s": 10.0, "output_len_mean": 128.0, "num_calls": 12,
        "tokens_per_s": 100.0, "tokens_per_s_ci_low": 95.0, "tokens_per_s_ci_high": 105.0,
        "paired_baseline_tokens_per_s": 100.0 / speedup, "speedup": speedup,
        "speedup_ci_low": speedup - half, "speedup_ci_high": speedup + half, "contaminated": False,
    }  # fmt: skip


@pytest.fixture
def cells() -> pd.DataFrame:
    rows = []
    for bs, curve in ((1, (0.7, 1.3, 1.9)), (8, (0.5, 0.9, 1.2))):
        for a, s in zip((1.0, 2.5, 4.0), curve):
            rows.append(_cell(f"eagle3-k3.a{a:g}", bs, a, s, sweep="forced_acceptance"))
    rows.append(_cell("eagle3-k3", 1, 3.25, 1.5))  # the real cell: halfway between 2.5 and 4
    rows.append(_cell("eagle3-k3", 8, 1.75, 0.7))
    return pd.DataFrame(rows)


def test_forced_table_reads_the_counters(cells: pd.DataFrame) -> None:
    table = forced.forced_table(cells, METHODS)
    assert len(table) == 6 and set(table["base_method"]) == {"eagle3-k3"}
    row = table[(table.batch_size == 1) & (table.forced_acceptance_length == 2.5)].iloc[0]
    assert row.drafts_per_step == 3.0
    # 1000 output tokens, 150 accepted: 850 steps, of which 100 drafted.
    assert row.draft_step_share == pytest.approx(100 / 850)
    assert row.baseline_tokens_per_s == pytest.approx(100 / 1.3)


def test_gap_splits_into_system_acceptance_and_residual(cells: pd.DataFrame) -> None:
    gap = forced.gap_table(forced.forced_table(cells, METHODS), cells).set_index("batch_size")
    one = gap.loc[1]
    assert one.ideal_speedup == 4.0 and one.ceiling_speedup == 1.9
    assert one.at_real_speedup == pytest.approx((1.3 + 1.9) / 2)  # linear between the forced points
    assert one.at_real_speedup_ci_low == pytest.approx((1.25 + 1.85) / 2)
    assert one.system_loss == pytest.approx(2.1) and one.acceptance_loss == pytest.approx(0.3)
    assert one.residual == pytest.approx(0.1) and not one.explained  # 1.5 is outside [1.55, 1.65]
    eight = gap.loc[8]
    assert eight.at_real_speedup == pytest.approx(0.5 + 0.75 / 1.5 * 0.4) and eight.explained
    total = one.system_loss + one.acceptance_loss + one.residual
    assert total == pytest.approx(one.ideal_speedup - one.measured_speedup)


def test_reports_and_figures(cells: pd.DataFrame, tmp_path: Path) -> None:
    from PIL import Image

    table = forced.forced_table(cells, METHODS)
    gap = forced.gap_table(table, cells)
    labels = {k: m.get("label", k) for k, m in METHODS.items()}
    assert "| EAGLE-3 k=3 | 1 | 2.5 | 2.50 | 3.00 | 1.30 [1.25, 1.35] |" in forced.forced_markdown(table, labels)
    assert "1 of 2 measured speedups lie inside" in forced.gap_markdown(gap, labels)
    for plot, name in ((lambda p: forced.plot_forced(table, gap, p, labels), "f.png"),
                       (lambda p: forced.plot_gap(gap, p, labels), "g.png")):  # fmt: skip
        plot(tmp_path / name)
        w, h = Image.open(tmp_path / name).size
        assert w <= 3000 and w / h <= 4


def test_no_forced_cell_is_a_clear_error(cells: pd.DataFrame) -> None:
    with pytest.raises(ValueError, match="no forced-acceptance cell"):
        forced.forced_table(cells[cells["sweep"] == ""], METHODS)


# ----------------------------------------------------------------------------- simulator check
TRUE = CostModel(
    name="true",
    target=TargetCost(c_kv=1e-6, c_compute=2e-4, c_fixed=4e-3),
    drafters={"eagle3": DrafterCost("linear", c_kv=5e-7, c_spec=3e-4, c_fixed=2e-3),
              "ngram": DrafterCost("linear", c_kv=0.0, c_spec=1e-5, c_fixed=5e-4)},  # fmt: skip
    overhead_per_step=0.0,
)
PROMPTS = {("m", "d"): np.array([40, 60, 80, 100])}


def _forced_rows(cm: CostModel) -> pd.DataFrame:
    """Forced cells whose measured latencies are exactly what ``cm`` predicts."""
    rows = []
    for sd in ("eagle3", "ngram"):
        for bs in (1, 8):
            for tau in (1.0, 2.5, 4.0):
                row = dict(engine="e", model="m", dataset="d", base_method=f"{sd}-k3", method=f"{sd}-k3.a{tau:g}",
                           sd_method=sd, num_speculative_tokens=3, batch_size=bs, forced_acceptance_length=tau,
                           mean_acceptance_length=tau, drafts_per_step=3.0,
                           draft_step_share=1.0 if sd == "eagle3" else 0.6, output_len_mean=128.0, num_calls=4)  # fmt: skip
                sd_lat, base_lat = forcedcheck.predicted_latencies(cm, pd.Series(row), PROMPTS[("m", "d")])
                speedup = base_lat / sd_lat
                rows.append({**row, "generate_s": 4 * sd_lat, "speedup": speedup,
                             "speedup_ci_low": speedup * 0.97, "speedup_ci_high": speedup * 1.03})  # fmt: skip
    return pd.DataFrame(rows)


def test_trajectories_emit_the_output_at_the_forced_rate() -> None:
    arrays, traj = forcedcheck.forced_trajectories(np.array([10, 20]), 129, 4.0, 1.0, 3)
    per_request = np.bincount(traj.req, traj.emitted)
    assert per_request.tolist() == [128, 128]  # the prefill made token 1
    assert traj.num_steps == 2 * 32 and (traj.k == 3).all()
    _, half = forcedcheck.forced_trajectories(np.array([10]), 1001, 2.5, 0.5, 3)
    drafting = half.k > 0
    assert half.emitted[~drafting].tolist() == [1] * int((~drafting).sum())
    assert half.emitted[drafting].mean() == pytest.approx(2.5, abs=0.01)
    assert drafting.mean() == pytest.approx(0.5, abs=0.01)


def test_prediction_without_drafting_cost_is_the_step_count_ratio() -> None:
    flat = CostModel("flat", TargetCost(0.0, 0.0, 1.0), {"eagle3": DrafterCost("linear")}, 0.0)
    row = pd.Series(dict(sd_method="eagle3", drafts_per_step=3.0, num_speculative_tokens=3, output_len_mean=121.0,
                         mean_acceptance_length=4.0, draft_step_share=1.0, batch_size=8))  # fmt: skip
    sd, base = forcedcheck.predicted_latencies(flat, row, np.array([50]))
    assert (sd, base) == (1 + 30, 1 + 120)  # the prefill, then 30 steps of 4 tokens vs 120 of one


def test_refit_recovers_the_model_that_made_the_latencies() -> None:
    table = _forced_rows(TRUE)
    start = replace(TRUE, target=replace(TRUE.target, c_compute=1e-3, c_fixed=1e-4), overhead_per_step=2e-3,
                    drafters={"eagle3": DrafterCost("linear", c_kv=5e-7, c_spec=0.0, c_fixed=0.0),
                              "ngram": DrafterCost("fraction_of_verify", fraction=0.5)})  # fmt: skip
    fitted = forcedcheck.refit(start, table, PROMPTS, "forced")
    assert fitted.target.c_compute == pytest.approx(2e-4, rel=1e-6)
    assert fitted.target.c_fixed == pytest.approx(4e-3, rel=1e-6) and fitted.overhead_per_step == 0.0
    assert fitted.drafters["eagle3"].c_spec == pytest.approx(3e-4, rel=1e-6)
    assert fitted.drafters["ngram"].kind == "linear" and fitted.drafters["ngram"].c_fixed == pytest.approx(5e-4)
    assert fitted.fit["refit"]["relative_rms_error"] < 1e-9
    check = forcedcheck.check_table(table, start, fitted, PROMPTS)
    assert check["inside_refit"].all() and not check["inside"].all()
    assert np.allclose(check["predicted_refit"], table["speedup"])


def test_a_drafter_the_step_timing_fit_lacks_is_not_priced_before_the_refit() -> None:
    # The default's Medusa cells: the breakdown does not time Medusa, so only the refit prices them.
    table = _forced_rows(TRUE)
    before = replace(TRUE, drafters={"eagle3": TRUE.drafters["eagle3"]})
    fitted = forcedcheck.refit(before, table, PROMPTS, "forced")
    check = forcedcheck.check_table(table, before, fitted, PROMPTS)
    ngram = check["sd_method"] == "ngram"
    assert check.loc[ngram, "predicted"].isna().all() and not check.loc[ngram, "inside"].any()
    assert check.loc[~ngram, "predicted"].notna().all() and check["predicted_refit"].notna().all()
    text = forcedcheck.check_markdown(check, before, fitted, {})
    assert "| ngram-k3 | 1 | not priced |" in text and "| — | — |" in text
    assert "of 6 priced inside before the refit" in text and "Not priced before the refit: ngram" in text


def test_nonnegative_least_squares_drops_a_negative_coefficient() -> None:
    x = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    y = np.array([3.0, 2.0, 1.0])  # the unconstrained slope is -1
    coef = nonnegative_lstsq(x, y)
    assert coef[1] == 0.0 and coef[0] == pytest.approx(2.0)
