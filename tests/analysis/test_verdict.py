"""The verdict (sdbench.analysis.verdict): one rule for "does SD pay", break-even loads, advice."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from sdbench.analysis import temperature, verdict as vd
from sdbench.analysis.intervals import T_START
from sdbench.cli import main


def test_one_rule_for_every_item() -> None:
    assert vd.verdict(1.01, 1.2) == vd.PAYS
    assert vd.verdict(0.98, 1.02) == vd.BREAK_EVEN
    assert vd.verdict(0.7, 0.99) == vd.LOSES
    assert vd.verdict(float("nan"), 1.0) == vd.NO_INTERVAL
    # The boundary: an interval that reaches 1 contains it, so pays / loses only strictly off 1;
    # holding 1 and reaching past the 3% margin is undecided, not even.
    assert vd.verdict(1.0, 1.2) == vd.UNDECIDED and vd.verdict(0.8, 1.0) == vd.UNDECIDED
    assert vd.verdict(1.0, 1.0) == vd.BREAK_EVEN
    # Even only inside [1 / 1.03, 1.03] (inclusive); a wider margin set in the config widens it.
    assert vd.verdict(1 / 1.03, 1.03) == vd.BREAK_EVEN and vd.verdict(0.97, 1.0) == vd.UNDECIDED
    assert vd.verdict(1.0, 1.031) == vd.UNDECIDED and vd.verdict(0.96, 1.04, margin=0.05) == vd.BREAK_EVEN
    with pytest.raises(ValueError, match="equivalence_margin = -0.1"):
        vd.verdict(0.9, 1.1, margin=-0.1)
    assert temperature.verdict is vd.verdict  # the temperature sweep judges with the same function


@pytest.mark.parametrize(
    "values, expected",
    [
        ([1.5, 1.2, 0.9], "6.35"),  # crosses between 4 and 8: 2 ** (2 + 0.2 / 0.3)
        ([1.5, 1.2, 1.1], ">8"),
        ([0.9, 0.8, 0.7], "<2"),
        ([1.5, 1.0, 0.8], "4"),
    ],
)
def test_break_even_is_interpolated_in_log2_load(values: list[float], expected: str) -> None:
    assert vd.crossing([2, 4, 8], values) == expected


def _cells() -> pd.DataFrame:
    rows = []
    for method, sd, k, speeds in (("ngram-k3", "ngram", 3, [2.0, 1.5, 0.95]), ("eagle3-k3", "eagle3", 3, [1.2, 0.97, 0.8])):
        for bs, s in zip((1, 4, 8), speeds):
            rows.append({"engine": "e", "model": "m", "dataset": "d", "method": method, "sd_method": sd,
                         "num_speculative_tokens": k, "batch_size": bs, "speedup": s, "speedup_ci_low": s - 0.03,
                         "speedup_ci_high": s + 0.03, "speedup_design": "paired", "mean_acceptance_length": 2.5,
                         "sweep": ""})  # fmt: skip
    rows.append({**rows[0], "method": "ngram-k3.k10", "sweep": "proposal_length"})  # a sweep variant: left out
    for bs in (1, 4, 8):
        rows.append({**rows[0], "method": "none", "sd_method": "none", "batch_size": bs, "speedup": 1.0,
                     "speedup_design": ""})  # fmt: skip
    return pd.DataFrame(rows)


def test_lines_recommendations_and_advice() -> None:
    points = vd.points_table(_cells())
    assert set(points["method"]) == {"ngram-k3", "eagle3-k3"}
    lines = vd.lines_table(points).set_index("method")
    assert lines.loc["ngram-k3", "largest_paying_load"] == 4
    assert lines.loc["eagle3-k3", "largest_paying_load"] == 1
    assert lines.loc["ngram-k3", "break_even_load"] == "7.51"  # 1.5 at 4 -> 0.95 at 8: 2 ** (2 + 0.5 / 0.55)
    low, high = lines.loc["ngram-k3", ["break_even_low", "break_even_high"]]
    assert float(low) < 7.51 < float(high)  # the lower bound crosses 1 earlier than the upper
    recs = vd.recommendations(points, {"ngram-k3": "n-gram k=3"})
    assert recs.set_index("load")["use"].to_dict() == {1: "n-gram k=3", 4: "n-gram k=3", 8: "no SD"}
    (sentence,) = vd.advice(recs)
    assert sentence == "m on d (e): batch sizes 1-4: n-gram k=3 (2.00x, 1.50x); batch size 8: run without SD (no method pays)."


def test_server_points_with_one_start_per_arm_are_not_judged() -> None:
    server = pd.DataFrame([
        {"engine": "e", "model": "m", "dataset": "d", "method": m, "sd_method": sd, "concurrency": c,
         "tokens_per_s": t, "tokens_per_s_min": t * 0.98, "tokens_per_s_max": t * 1.02,
         "mean_acceptance_length": 2.0}
        for c in (1, 4) for m, sd, t in (("none", "none", 100.0), ("ngram-k3", "ngram", 150.0 if c == 1 else 101.0))
    ])  # fmt: skip
    points = vd.server_points(server)
    assert list(points["load"]) == [1, 4] and points["load_kind"].unique().tolist() == [vd.SERVER]
    assert points["speedup"].round(2).tolist() == [1.5, 1.01]
    assert (points["interval"] == vd.ROUNDS).all() and points[["speedup_ci_low", "speedup_ci_high"]].isna().all().all()
    # One start per arm: the rounds' range is one process's spread, no interval: not judged.
    assert [vd.verdict(lo, hi) for lo, hi in zip(*vd.judged_bounds(points))] == [vd.NO_INTERVAL] * 2
    paying = points.assign(speedup_min=1.2, speedup_max=1.3, verdict=vd.PAYS)
    (sentence,) = vd.advice(vd.recommendations(paying, {"ngram-k3": "n-gram k=3"}))
    assert sentence.startswith("m on d (e): concurrencies 1-4: n-gram k=3")


def test_a_point_names_the_bounds_it_was_judged_on() -> None:
    server = pd.DataFrame([
        {"engine": "e", "model": "m", "dataset": "d", "method": m, "sd_method": sd, "concurrency": 2,
         "tokens_per_s": t, "tokens_per_s_min": t * 0.9, "tokens_per_s_max": t * 1.1, "mean_acceptance_length": 2.0}
        for m, sd, t in (("none", "none", 100.0), ("ngram-k3", "ngram", 130.0))
    ])  # fmt: skip
    points = vd.points_table(_cells(), server)
    offline, online = points[points["load_kind"] == vd.OFFLINE], points[points["load_kind"] == vd.SERVER]
    assert (offline["interval"] == T_START).all() and (online["interval"] == vd.ROUNDS).all()
    assert offline[["speedup_min", "speedup_max"]].isna().all().all()
    assert online[["speedup_ci_low", "speedup_ci_high"]].isna().all().all()
    low, high = vd.judged_bounds(points)  # one server start per arm: its range is shown, never judged
    assert low.tolist()[:-1] == offline["speedup_ci_low"].tolist() and math.isnan(low.tolist()[-1])
    assert high.tolist()[:-1] == offline["speedup_ci_high"].tolist() and math.isnan(high.tolist()[-1])
    (row,) = online.itertuples(index=False)
    assert (row.speedup_min, row.speedup_max) == pytest.approx((117 / 110, 143 / 90))
    assert row.verdict == vd.NO_INTERVAL
    text = vd.verdict_markdown(points, vd.lines_table(points), vd.recommendations(points, {}), {})
    assert "Speedup over no SD [range over rounds] and verdict; draws:" in text
    assert "| ngram-k3 | 1.30 [1.06, 1.59] not judged |" in text


def test_cli_writes_table_markdown_and_a_readable_figure(tmp_path: Path) -> None:
    cells = tmp_path / "cells.parquet"
    _cells().to_parquet(cells)
    out = {k: tmp_path / f"verdict.{k}" for k in ("parquet", "md", "png")}
    assert main(["verdict", "--cells", str(cells), "--labels", '{"ngram-k3": "n-gram k=3"}', "--output",
                 str(out["parquet"]), "--markdown", str(out["md"]), "--figure", str(out["png"])]) == 0  # fmt: skip
    text = out["md"].read_text()
    assert text.startswith("# Does speculative decoding pay here?")
    assert "| n-gram k=3 | 2.00 [1.97, 2.03] pays | 1.50 [1.47, 1.53] pays | 0.95 [0.92, 0.98] loses | 4 |" in text
    width, height = Image.open(out["png"]).size
    assert width <= 3000 and width / height <= 4
    table = pd.read_parquet(out["parquet"])
    assert not math.isnan(table["largest_paying_load"].iloc[0])


def test_where_sd_pays_in_time_an_even_energy_ratio_is_named_as_well_as_a_costly_one() -> None:
    """Energy ratios by hand per point (SD's joules per token over no SD's, its 95% interval): n-gram
    pays at batch 1 with 1 [0.95, 1.05] (even), at 4 with 0.8 [0.7, 0.9] (saves); EAGLE-3 pays at 1
    with 1.3 [1.2, 1.4] (costs). Points that do not pay are never named."""
    energy = {("ngram-k3", 1): (1.0, 0.95, 1.05), ("ngram-k3", 4): (0.8, 0.7, 0.9), ("ngram-k3", 8): (1.2, 1.1, 1.3),
              ("eagle3-k3", 1): (1.3, 1.2, 1.4), ("eagle3-k3", 4): (1.0, 0.9, 1.1),
              ("eagle3-k3", 8): (0.9, 0.8, 1.0)}  # fmt: skip
    cells = _cells()
    nan = (float("nan"),) * 3
    ratios = [energy.get((m, b), nan) for m, b in zip(cells["method"], cells["batch_size"])]
    cells[["energy_ratio", "energy_ratio_ci_low", "energy_ratio_ci_high"]] = ratios
    cells["energy_meter"] = "nvml"
    points = vd.points_table(cells).set_index(["method", "load"])
    assert points["energy"].to_dict() == {
        ("eagle3-k3", 1): "costs", ("eagle3-k3", 4): "even", ("eagle3-k3", 8): "even",
        ("ngram-k3", 1): "even", ("ngram-k3", 4): "saves", ("ngram-k3", 8): "costs"}  # fmt: skip
    assert points.index[points["time_not_energy"]].tolist() == [("eagle3-k3", 1), ("ngram-k3", 1)]
    lines = vd.time_not_energy_lines(points.reset_index(), {"ngram-k3": "n-gram k=3"})
    assert lines == [
        "- m / d (e), eagle3-k3 at batch size 1: pays in time (1.20x) but costs more energy per token "
        "(energy ratio 1.30 [1.20, 1.40], nvml).",
        "- m / d (e), n-gram k=3 at batch size 1: pays in time (2.00x) but saves no energy per token measurably "
        "(energy ratio 1.00 [0.95, 1.05], nvml).",
    ]  # fmt: skip


def test_a_flagged_point_is_drawn_but_never_pays_nor_advised() -> None:
    """Preempted, contaminated or hardware-mismatched points keep their speedup and interval but
    are judged "flagged": the advice falls to the best clean method (here n-gram, 1.10x), or no SD."""
    from sdbench.analysis.verdict import FLAGGED, advice, points_table, recommendations, verdict_markdown, lines_table

    def cell(method: str, speedup: float, **flags: bool) -> dict:
        return {"engine": "e", "model": "m", "dataset": "d", "method": method, "sd_method": method, "batch_size": 1,
                "speedup": speedup, "speedup_ci_low": speedup - 0.05, "speedup_ci_high": speedup + 0.05,
                "speedup_design": "paired", "mean_acceptance_length": 2.0, **flags}  # fmt: skip

    cells = pd.DataFrame([cell("eagle3", 1.5, preempted=True), cell("ngram", 1.1),
                          cell("eagle", 1.4, contaminated=True, hardware_mismatch=True)])  # fmt: skip
    points = points_table(cells).set_index("method")
    assert points["flags"].to_dict() == {"eagle": "contaminated, hardware mismatch", "eagle3": "preempted", "ngram": ""}
    assert points["verdict"].to_dict() == {"eagle": FLAGGED, "eagle3": FLAGGED, "ngram": "pays"}
    recs = recommendations(points.reset_index(), {})
    assert recs[["use", "speedup"]].values.tolist() == [["ngram", 1.1]]
    assert advice(recs) == ["m on d (e): batch size 1: ngram (1.10x)."]
    text = verdict_markdown(points.reset_index(), lines_table(points.reset_index()), recs, {})
    assert "- eagle3, m / d (e), batch size 1: 1.50x, preempted" in text
    assert "| eagle3 | 1.50 [1.45, 1.55] flagged |" in text
    alone = points_table(pd.DataFrame([cell("eagle3", 1.5, preempted=True)]))
    assert advice(recommendations(alone, {})) == ["m on d (e): batch size 1: run without SD (no method pays)."]


def test_an_unmetered_run_says_why_its_energy_was_not_measured() -> None:
    from sdbench.analysis.verdict import time_not_energy_lines

    points = pd.DataFrame({"energy": ["not measured"] * 3, "time_not_energy": [False] * 3,
                           "energy_reason": ["no RAPL: /sys/class/powercap does not exist", "",
                                             "no RAPL: /sys/class/powercap does not exist"]})  # fmt: skip
    assert time_not_energy_lines(points, {}) == [
        "Energy not measured on this run (no RAPL: /sys/class/powercap does not exist: `energy_meter` = not measured)."
    ]
    silent = points.assign(energy_reason="")
    assert time_not_energy_lines(silent, {}) == [
        "Energy not measured on this run (no energy meter: `energy_meter` = not measured)."
    ]


def _aa_cells(bounds: list[tuple[float, float]], contaminated: list[bool] | None = None) -> pd.DataFrame:
    """A/A cells (sweep aa_control) at batch 1 on datasets d0, d1, ... with the given intervals."""
    return pd.DataFrame([{"engine": "e", "model": "m", "dataset": f"d{i}", "method": "none.aa", "sd_method": "none",
                          "batch_size": 1, "speedup": (lo + hi) / 2, "speedup_ci_low": lo, "speedup_ci_high": hi,
                          "speedup_design": "paired", "sweep": "aa_control",
                          "contaminated": bool(contaminated and contaminated[i])}
                         for i, (lo, hi) in enumerate(bounds)])  # fmt: skip


def test_the_aa_control_counts_its_false_verdicts() -> None:
    """Three A/A cells: one above 1 (a false 'pays') is within what 95% allows (1 of 3); two are not.
    A flagged cell is neither counted nor judged."""
    one = vd.aa_points(_aa_cells([(1.01, 1.1), (0.9, 1.05), (0.99, 1.01)]))
    assert one["verdict"].tolist() == [vd.PAYS, vd.UNDECIDED, vd.BREAK_EVEN] and not vd.aa_failed(one)
    text = "\n".join(vd.aa_lines(one))
    assert "A/A: 1 of 3 judged pays or loses" in text and "95% allows 1; 3 had an interval" in text
    assert "| m / d0 (e) | 1 | 1.055 [1.010, 1.100] | pays |" in text and "not judged on this machine" not in text
    two = vd.aa_points(_aa_cells([(1.01, 1.1), (0.8, 0.95), (0.99, 1.01)]))
    assert vd.aa_failed(two) and "**The design is not judged on this machine**" in "\n".join(vd.aa_lines(two))
    flagged = vd.aa_points(_aa_cells([(1.01, 1.1), (0.8, 0.95), (0.99, 1.01)], [False, True, False]))
    assert flagged["verdict"].tolist()[1] == vd.FLAGGED and not vd.aa_failed(flagged)  # 1 of 2 clean: allowed 1
    assert vd.aa_lines(vd.aa_points(_cells().assign(sweep=""))) == []  # no control: no section


def test_a_failed_aa_control_judges_no_point(tmp_path: Path) -> None:
    cells = pd.concat([_cells().assign(sweep=""), _aa_cells([(1.01, 1.1), (0.8, 0.95), (0.99, 1.01)])],
                      ignore_index=True)  # fmt: skip
    cells.to_parquet(tmp_path / "cells.parquet")
    out = {k: tmp_path / f"v.{k}" for k in ("parquet", "md", "png")}
    argv = ["verdict", "--cells", str(tmp_path / "cells.parquet"), "--output", str(out["parquet"]),
            "--markdown", str(out["md"]), "--figure", str(out["png"])]  # fmt: skip
    assert main(argv) == 0
    table = pd.read_parquet(out["parquet"])
    assert set(table["verdict"]) <= {vd.NO_INTERVAL, vd.FLAGGED} and (table["verdict"] == vd.NO_INTERVAL).any()
    assert "none.aa" not in set(table["method"])  # the control is no point of the verdict
    assert "A/A: 2 of 3 judged pays or loses" in out["md"].read_text()
