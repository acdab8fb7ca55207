"""Goodput under latency targets in server mode (sdbench.analysis.goodput), counted by hand on
server request tables made here, and the server-mode verdict on it (sdbench.analysis.verdict)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from sdbench.analysis.goodput import add_goodput, goodput_columns, goodput_markdown, latency_percentiles, meets_targets

SLO = {"ttft_ms": 100, "tpot_ms": 2.5, "e2e_ms": 420}


def requests() -> pd.DataFrame:
    """Two rounds of four requests (walls 2 s and 4 s); which meet SLO, and why, per row."""
    rows = [  # round, ttft s, tpot s, e2e s, output tokens: verdict
        (0, 0.100, 0.0025, 0.420, 128),  # every value exactly at its target: good
        (0, 0.050, np.nan, 0.060, 1),    # one token: TPOT counts as 0, as vLLM's: good
        (0, 0.020, 0.0020, 0.300, 128),  # good
        (0, 0.101, 0.0010, 0.200, 128),  # TTFT above: not good
        (1, 0.010, 0.0026, 0.350, 128),  # TPOT above: not good
        (1, 0.010, 0.0020, 0.421, 128),  # E2E above: not good
        (1, 0.030, 0.0024, 0.330, 128),  # good
        (1, 0.090, 0.0015, 0.280, 128),  # good
    ]  # fmt: skip
    frame = pd.DataFrame(rows, columns=["round", "ttft_s", "tpot_s", "latency_s", "num_output_tokens"])
    return frame.assign(engine="e", model="m", dataset="d", concurrency=2,
                        chunk_gaps_s=[[0.001, 0.002], [], [0.003], [0.004]] * 2)  # fmt: skip


def test_a_request_is_good_when_it_meets_every_target_and_goodput_counts_them_per_second() -> None:
    reqs = requests()
    assert meets_targets(reqs, SLO).tolist() == [True, True, True, False, False, False, True, True]
    # A target left out is not judged: without e2e the sixth request is good too.
    assert meets_targets(reqs, {"ttft_ms": 100, "tpot_ms": 2.5}).sum() == 6
    c = goodput_columns(reqs, [2.0, 4.0], SLO, seed=3)
    assert c["goodput_rps"] == pytest.approx(5 / 6.0)  # 3 + 2 good over 2 s + 4 s
    assert (c["goodput_rps_min"], c["goodput_rps_max"]) == pytest.approx((2 / 4.0, 3 / 2.0))
    assert c["slo_attainment"] == pytest.approx(5 / 8)
    assert (c["slo_ttft_ms"], c["slo_tpot_ms"], c["slo_e2e_ms"]) == (100.0, 2.5, 420.0)
    # The interval: at least the worst round alone, at most the best (rounds and requests resampled).
    assert 0.0 <= c["goodput_rps_ci_low"] < 5 / 6.0 < c["goodput_rps_ci_high"] <= 4 / 2.0
    assert len(c["goodput_rps_boot"]) == 2000
    # Every request good and equal walls: no spread, the interval is the point.
    steady = goodput_columns(reqs, [2.0, 2.0], {"ttft_ms": 1000}, seed=3)
    assert (steady["goodput_rps"], steady["goodput_rps_ci_low"], steady["goodput_rps_ci_high"]) == (2.0, 2.0, 2.0)
    # No targets: NaN, never a goodput of 0.
    none = goodput_columns(reqs, [2.0, 4.0], {}, seed=3)
    assert math.isnan(none["goodput_rps"]) and math.isnan(none["slo_tpot_ms"]) and none["goodput_rps_boot"] == []


def test_percentiles_of_ttft_tpot_and_itl_pooled_over_chunk_gaps() -> None:
    p = latency_percentiles(requests())
    # ITL: every chunk gap of every request pooled, as vLLM's itls: 1, 2, 3, 4 ms twice.
    assert p["itl_p50_ms"] == pytest.approx(2.5) and p["itl_p90_ms"] == pytest.approx(4.0)
    assert p["tpot_p50_ms"] == pytest.approx(2.0)  # the one-token request's NaN left out
    assert p["ttft_p90_ms"] == pytest.approx(np.percentile([100, 50, 20, 101, 10, 10, 30, 90], 90))
    assert set(p) == {f"{m}_p{q}_ms" for m in ("ttft", "tpot", "e2e", "itl") for q in (50, 90, 95, 99)}


def server_cell(method: str, good: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A server cell whose rounds (walls 2 s) each have ``good`` of 4 requests meeting SLO."""
    reqs = pd.concat([requests().iloc[:4].assign(round=r) for r in (0, 1)], ignore_index=True)
    fast = [True] * good + [False] * (4 - good)
    reqs["ttft_s"] = [0.01 if f else 1.0 for f in fast * 2]
    reqs["tpot_s"], reqs["latency_s"] = 0.001, 0.2
    reqs = reqs.assign(method=method)
    cell = pd.DataFrame([dict(engine="e", model="m", dataset="d", method=method, concurrency=2,
                              sd_method="none" if method == "none" else "ngram", num_speculative_tokens=3,
                              tokens_per_s=100.0, tokens_per_s_min=90.0, tokens_per_s_max=110.0,
                              mean_acceptance_length=2.0, round_wall_s=[2.0, 2.0])])  # fmt: skip
    return cell, reqs


def test_the_server_verdict_judges_goodput_against_no_sd() -> None:
    from sdbench.analysis.verdict import goodput_sections, server_points

    (base, base_reqs), (sd, sd_reqs) = server_cell("none", 1), server_cell("ngram-k3", 4)
    cells = add_goodput(pd.concat([base, sd], ignore_index=True), pd.concat([base_reqs, sd_reqs]), {"d": SLO}, 42)
    assert cells.set_index("method")["goodput_rps"].to_dict() == pytest.approx({"none": 2 / 4.0, "ngram-k3": 8 / 4.0})
    point = server_points(cells).iloc[0]
    assert point["goodput_ratio"] == pytest.approx(4.0) and point["baseline_goodput_rps"] == pytest.approx(0.5)
    assert 1.0 < point["goodput_ratio_ci_low"] <= 4.0 <= point["goodput_ratio_ci_high"]
    assert point["goodput_verdict"] == "SD better"  # where the targets fall on the frontier, not "pays"
    text = "\n".join(goodput_sections(server_points(cells).assign(load_kind="concurrency", load=2), {"ngram-k3": "n-gram"}))
    assert "| no SD (req/s) | 0.5 |" in text.splitlines()
    # The SD row whole. SD's draws are all 2 req/s; no SD's are k / 4 s with k ~ Binomial(8, 1/4) good
    # requests (each round holds one good of four): the ratio 8 / k is infinite at k = 0 (P = 10%, over
    # the top 2.5%), and its 2.5% point is 8 / 5 (P(k >= 5) = 2.7%, P(k >= 6) = 0.4%).
    assert "| n-gram | 4.00 [1.60, inf] SD better, unpaired |" in text.splitlines()
    # Without targets for the dataset: no goodput, and no verdict on it.
    bare = add_goodput(pd.concat([base, sd], ignore_index=True), pd.concat([base_reqs, sd_reqs]), {}, 42)
    assert server_points(bare).iloc[0]["goodput_verdict"] == "no targets"
    assert "no targets" in goodput_markdown(bare)
    # Every SD request meets the targets in both rounds (walls 2 s): every draw is 8 / 4 s, the
    # interval the point; no latency percentiles in this table.
    assert "| m | d | ngram-k3 | 2 | 100 / 2.5 / 420 | 2 [2, 2] | 100% | – / – / – | – / – / – | – / – / – | – |" \
        in goodput_markdown(cells).splitlines()  # fmt: skip


def test_where_no_sd_meets_no_target_the_verdict_gives_sd_goodput_not_an_infinite_ratio() -> None:
    """Only SD's requests meet the targets: SD's goodput and that none met without SD, never "pays";
    no request of either arm: named, not scored."""
    from sdbench.analysis.verdict import goodput_sections, server_points

    base, base_reqs = server_cell("none", 0)
    for good, verdict, square in ((4, "SD better", "| n-gram | 2 req/s, none without SD: SD better |"),
                                  (0, "neither meets", "| n-gram | 0 req/s, neither meets: not scored |")):  # fmt: skip
        sd, sd_reqs = server_cell("ngram-k3", good)
        cells = add_goodput(pd.concat([base, sd], ignore_index=True), pd.concat([base_reqs, sd_reqs]), {"d": SLO}, 42)
        points = server_points(cells)
        assert points.iloc[0]["goodput_verdict"] == verdict  # 8 good over 2 x 2 s; or 0 of 8 in both arms
        text = "\n".join(goodput_sections(points.assign(load_kind="concurrency", load=2), {"ngram-k3": "n-gram"}))
        assert "| no SD (req/s) | 0 |" in text and square in text.splitlines()
        assert "inf" not in text and "pays" not in text


def test_targets_are_global_or_per_dataset_and_a_stray_dataset_is_named() -> None:
    from sdbench.servermode import server_problems, slo_for

    section = {"datasets": ["a", "b"], "slo": {"ttft_ms": 100, "tpot_ms": 2.5, "datasets": {"b": {"tpot_ms": 5}}}}
    assert slo_for(section, "a") == {"ttft_ms": 100, "tpot_ms": 2.5}
    assert slo_for(section, "b") == {"ttft_ms": 100, "tpot_ms": 5}
    assert slo_for({"datasets": ["a"]}, "a") == {}
    config = {"server": {**section, "engine": "e", "models": [], "methods": [],
                         "slo": {"datasets": {"c": {"ttft_ms": 1}}}}, "engines": {"e": {}}, "models": {},
              "datasets": {"a": {}, "b": {}}, "methods": {}}  # fmt: skip
    assert server_problems(config, frozenset()) == ["server.slo.datasets.c: not one of server.datasets (a, b)"]


def test_the_ratio_interval_is_the_95_percent_one_of_the_draws_ratios() -> None:
    from sdbench.analysis.goodput import ratio_interval

    # Ratios 1, 2, ..., 1010 (in shuffled order): the inverted CDF's 2.5% point is the ceil(25.25) = 26th
    # smallest, its 97.5% point the ceil(984.75) = 985th (a 90% interval would give 51 and 960).
    ratios = np.random.default_rng(0).permutation(np.arange(1, 1011, dtype=float))
    assert ratio_interval(ratios * 0.5, np.full(1010, 0.5)) == (26.0, 985.0)
    # 0/0 is the same goodput (ratio 1), x/0 infinite: the bounds are draws, never interpolated.
    assert ratio_interval([0.0] * 10 + [1.0] * 10, [0.0] * 20) == (1.0, math.inf)


def test_the_bootstrap_resamples_rounds_their_walls_and_the_requests_within_a_round() -> None:
    from sdbench.analysis.goodput import goodput_draws

    # One good request per round, walls 1 s and 3 s: a draw is round 0 twice (2 / 2 s), round 1
    # twice (2 / 6 s) or one of each (2 / 4 s); with the rounds or their walls left as they are,
    # every draw would be 2 / 4 s.
    draws = goodput_draws(np.array([True, True]), np.array([0, 1]), [1.0, 3.0], seed=1)
    values, counts = np.unique(draws, return_counts=True)
    assert values.tolist() == pytest.approx([1 / 3, 1 / 2, 1.0])
    assert counts / len(draws) == pytest.approx([0.25, 0.5, 0.25], abs=0.04)  # 1/4, 1/2, 1/4 by hand
    # One round of a good and a bad request (wall 1 s): the requests resampled give 0, 1 or 2 good.
    draws = goodput_draws(np.array([True, False]), np.array([0, 0]), [1.0], seed=1)
    values, counts = np.unique(draws, return_counts=True)
    assert values.tolist() == [0.0, 1.0, 2.0]
    assert counts / len(draws) == pytest.approx([0.25, 0.5, 0.25], abs=0.04)


def test_the_goodput_verdict_per_method_on_hand_made_draws_and_its_whole_markdown_rows() -> None:
    """No SD's 1,000 draws: 40 of 1.0, 920 of 0.5, 40 of 0.25 req/s; each SD cell's draws are one
    value, so the ratios' 2.5% and 97.5% points (the 25th and 975th of 1,000) are by hand its value
    over 1.0 and over 0.25 (a 90% interval, the 50th and 950th, would be its value over 0.5 twice)."""
    from sdbench.analysis.verdict import goodput_sections, server_points

    base_boot = [1.0] * 40 + [0.5] * 920 + [0.25] * 40
    rows = [("none", "none", 0.5, base_boot)]
    rows += [(method, sd, g, [g] * 1000) for method, sd, g in (("ngram-k3", "ngram", 2.0), ("eagle-k2", "eagle", 0.5),
                                                               ("mtp-k1", "mtp", 0.2))]  # fmt: skip
    cells = pd.DataFrame([dict(engine="e", model="m", dataset="d", method=method, sd_method=sd, concurrency=2,
                               num_speculative_tokens=0 if sd == "none" else 3, tokens_per_s=100.0,
                               tokens_per_s_min=90.0, tokens_per_s_max=110.0, mean_acceptance_length=2.0,
                               goodput_rps=g, goodput_rps_boot=boot) for method, sd, g, boot in rows])  # fmt: skip
    points = server_points(cells).set_index("method")
    # n-gram: [2 / 1, 2 / 0.25] lies above 1; EAGLE: [0.5, 2] contains it; MTP: [0.2, 0.8] lies below.
    bounds = ["goodput_ratio_ci_low", "goodput_ratio_ci_high"]
    assert points.loc["ngram-k3", bounds].tolist() == [2.0, 8.0]
    assert points.loc["eagle-k2", bounds].tolist() == [0.5, 2.0]
    assert points.loc["mtp-k1", bounds].tolist() == pytest.approx([0.2, 0.8])
    assert points["goodput_verdict"].to_dict() == {"ngram-k3": "SD better", "eagle-k2": "undecided",
                                                   "mtp-k1": "no SD better"}  # fmt: skip
    text = goodput_sections(points.reset_index().assign(load_kind="concurrency", load=2),
                            {"ngram-k3": "n-gram", "eagle-k2": "EAGLE", "mtp-k1": "MTP"})  # fmt: skip
    assert text[2:8] == [
        "| method | concurrency 2 |",
        "|---|---|",
        "| no SD (req/s) | 0.5 |",
        "| EAGLE | 1.00 [0.50, 2.00] undecided, unpaired |",  # separately started servers: independent draws
        "| MTP | 0.40 [0.20, 0.80] no SD better, unpaired |",
        "| n-gram | 4.00 [2.00, 8.00] SD better, unpaired |",
    ]


def test_the_goodput_markdown_rows_cell_by_cell() -> None:
    """The per-cell table of ``sdbench latency`` on a hand-made server table: each row as written by hand."""
    by_metric = {"ttft": (12.345, 98.76, 150.4), "tpot": (2.0, 2.5, 3.25), "itl": (0.5, 1234.4, math.nan)}
    pct = {f"{m}_p{p}_ms": v for m, values in by_metric.items() for p, v in zip((50, 90, 99), values)}
    keys = dict(model="m", dataset="d", concurrency=4)
    table = pd.DataFrame([
        dict(keys, method="ngram-k3", slo_ttft_ms=100.0, slo_tpot_ms=2.5, slo_e2e_ms=math.nan, goodput_rps=1.23456,
             goodput_rps_ci_low=1.1, goodput_rps_ci_high=1.4, slo_attainment=0.75, joules_per_good_request=18.04, **pct),
        dict(keys, method="none", slo_ttft_ms=math.nan, slo_tpot_ms=math.nan, slo_e2e_ms=math.nan,
             goodput_rps=math.nan, goodput_rps_ci_low=math.nan, goodput_rps_ci_high=math.nan, slo_attainment=math.nan),
    ])  # fmt: skip
    rows = [line for line in goodput_markdown(table).splitlines() if line.startswith("| m |")]
    assert rows == [
        "| m | d | ngram-k3 | 4 | 100 / 2.5 / – | 1.23 [1.1, 1.4] | 75% | 12.3 / 98.8 / 150 | 2 / 2.5 / 3.25 "
        "| 0.5 / 1234 / – | 18 |",  # J per good request, three significant digits
        "| m | d | none | 4 | – / – / – | no targets | – | – / – / – | – / – / – | – / – / – | – |",
    ]  # fmt: skip


def test_a_clean_server_point_keeps_its_goodput_verdict_and_a_busy_no_sd_arm_flags_it() -> None:
    """The flag comes from either arm's quiet guard (the no-SD arm alone suffices); a clean point's
    goodput verdict stands, and an offline point has none."""
    from sdbench.analysis.verdict import FLAGGED, points_table, server_points

    (base, base_reqs), (sd, sd_reqs) = server_cell("none", 1), server_cell("ngram-k3", 4)
    cells = add_goodput(pd.concat([base, sd], ignore_index=True), pd.concat([base_reqs, sd_reqs]), {"d": SLO}, 42)
    offline = pd.DataFrame([dict(engine="e", model="m", dataset="d", method="ngram-k3", sd_method="ngram",
                                 num_speculative_tokens=3, batch_size=1, speedup=1.5, speedup_ci_low=1.4,
                                 speedup_ci_high=1.6, speedup_design="paired", mean_acceptance_length=2.0)])  # fmt: skip
    points = points_table(offline, cells).set_index("load_kind")
    assert points.loc["concurrency", "goodput_verdict"] == "SD better" and points.loc["batch size", "goodput_verdict"] == ""
    busy_base = cells.assign(contaminated=[True, False])  # the no-SD server's guard saw other work, SD's did not
    assert cells["method"].tolist()[0] == "none"
    assert server_points(busy_base).iloc[0]["flags"] == "contaminated"
    assert points_table(offline, busy_base).set_index("load_kind").loc["concurrency", "goodput_verdict"] == FLAGGED
