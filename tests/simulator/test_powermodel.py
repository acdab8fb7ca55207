"""The power model beside the time cost model (sdbench.simulator.powermodel), checked against the
shape of a step table: verifying more tokens costs more energy than time at mid batch sizes, and the
two agree at the smallest and largest batches. The table is one the test builds from a known power
curve, and the shared H200 table where the checkout has it beside it (a user's clone skips that one)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sdbench.simulator.powermodel import PowerModel, cell_power_points, energy_ratio, fit_power_model
from tests.conftest import SHARED
from tests.support.require import shared_file

H200 = SHARED / "data" / "h200-step-cost-energy.csv"
# The built table's board: flat power up to a few tokens, half its 270 W span at 40 tokens, 730 W
# saturated; a step's time flat at small batches (5 ms + 10 us per token).
BUILT = PowerModel(460.0, 270.0, 40.0, 2.5)


def built_table() -> pd.DataFrame:
    """Rows of B x q at one KV length, as the shared table lays them out: P(8) = 464.7 W, P(32) = 558 W,
    so at batch 8 verifying 4 tokens costs +4.7% time and +26% energy; at batch 128 +61% and +64%."""
    b, q = (a.ravel() for a in np.meshgrid([1, 2, 4, 8, 16, 32, 64, 128], [1, 2, 4, 8]))
    ms = 5.0 + 0.01 * b * q
    return pd.DataFrame({"B": b, "q": q, "L": 1024, "ms": ms, "joules": BUILT.watts(b * q) * ms / 1000})


@pytest.fixture(scope="module", params=["built", "shared-h200"])
def h200(request: pytest.FixtureRequest) -> pd.DataFrame:
    """A step table's rows at a 1024-token KV cache, with each step's power (W)."""
    t = built_table() if request.param == "built" else pd.read_csv(shared_file(H200))
    t = t[t["L"] == 1024]
    return t.assign(watts=t["joules"] / t["ms"] * 1000, tokens=t["B"] * t["q"])


def ratios(t: pd.DataFrame, b: int) -> tuple[float, float, pd.Series, pd.Series]:
    """(time ratio, energy ratio) of 4 over 1 verified tokens per sequence at batch ``b``, and the rows."""
    one, four = (t[(t["B"] == b) & (t["q"] == q)].iloc[0] for q in (1, 4))
    return four["ms"] / one["ms"], four["joules"] / one["joules"], one, four


def test_the_table_spends_more_energy_than_time_at_mid_batch_sizes(h200: pd.DataFrame) -> None:
    for b in (8, 16):  # H200: +5% / +6% time, +18% / +32% energy
        time, energy, *_ = ratios(h200, b)
        assert energy > time + 0.1
    for b in (1, 128):  # they agree at the ends; H200: +6% / +6%, +73% / +70%
        time, energy, *_ = ratios(h200, b)
        assert abs(energy - time) < 0.05


def test_the_fitted_power_model_has_that_shape(h200: pd.DataFrame) -> None:
    model = fit_power_model(h200["tokens"], h200["watts"])
    assert model.r2 > 0.9
    # Idle near the power of one token per step (461 W), saturated near that of 512 (724 W).
    assert model.watts(1) == pytest.approx(h200.loc[h200["tokens"] == 1, "watts"].iloc[0], rel=0.05)
    assert model.p_idle_w + model.p_span_w == pytest.approx(ratios(h200, 128)[3]["watts"], rel=0.05)
    for b, mid in ((1, False), (8, True), (16, True), (128, False)):
        time, _, one, four = ratios(h200, b)
        predicted = float(energy_ratio(model, four["ms"], one["ms"], b, 3, 1.0))
        if mid:
            assert predicted > time + 0.1, (b, predicted, time)
        else:
            assert abs(predicted - time) < 0.05, (b, predicted, time)


def test_fit_recovers_a_known_model_and_the_ratio_is_time_times_power() -> None:
    truth = PowerModel(400.0, 300.0, 20.0, 2.0)
    tokens = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    fit = fit_power_model(tokens, truth.watts(tokens))
    assert (fit.p_idle_w, fit.p_span_w, fit.n_half, fit.h) == pytest.approx((400.0, 300.0, 20.0, 2.0), rel=0.02)
    assert fit.r2 == pytest.approx(1.0, abs=1e-6)
    # Hand: P(20) = 400 + 300 * 400 / 800 = 550 W, P(5) = 400 + 300 * 25 / 425 = 417.647 W;
    # batch 5, k = 3, tau = 2: time ratio 8 ms / (2 x 5 ms) = 0.8, energy ratio 0.8 x 550 / 417.647.
    assert float(energy_ratio(truth, 8.0, 5.0, 5, 3, 2.0)) == pytest.approx(0.8 * 550 / (400 + 300 * 25 / 425))
    with pytest.raises(ValueError, match="need 3 at 2 or more"):
        fit_power_model([4, 4, 4], [1.0, 2.0, 3.0])


def test_cells_give_power_against_batched_tokens_per_step() -> None:
    cells = pd.DataFrame({"batch_size": [1, 4, 4, 8], "num_speculative_tokens": [0, 0, 3, 3],
                          "mean_power_w": [100.0, 120.0, 150.0, float("nan")]})  # fmt: skip
    points = cell_power_points(cells)
    assert points["tokens_per_step"].tolist() == [1.0, 4.0, 16.0]  # SD verifies k + 1 per sequence
    assert points["mean_power_w"].tolist() == [100.0, 120.0, 150.0]  # the unmeasured cell left out
