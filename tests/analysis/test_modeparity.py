"""Offline vs served speedup at the same load and the measured reason they differ
(sdbench.analysis.modeparity), on hand-made tables."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from sdbench.analysis.modeparity import AGREE, CLIENT, LAYOUT, NO_CONTROL, modes_markdown, modes_table, reason


def test_the_reason_is_read_off_the_offline_interval() -> None:
    # Offline 1.02 [0.95, 1.10]; served bounds [x - 0.1, x + 0.1] unless given. Served 1.05 inside
    # agrees; served 1.67 outside with stream off at 1.02 inside is the client's streaming; stream off
    # at 1.5 outside too is the server's layout.
    nan = math.nan

    def why(served: float, stream_off: float, low: float | None = None, high: float | None = None) -> str:
        return reason(1.02, 0.95, 1.10, served, served - 0.1 if low is None else low,
                      served + 0.1 if high is None else high, stream_off)  # fmt: skip

    assert why(1.05, nan) == AGREE
    assert why(1.67, 1.02) == CLIENT
    assert why(1.67, 1.50) == LAYOUT
    assert why(0.80, 0.90) == LAYOUT  # below the interval, control below too
    assert why(1.67, nan) == NO_CONTROL
    assert why(1.10, 2.0, low=1.08, high=1.3) == AGREE  # a bound belongs to the interval
    # A served point outside the offline interval whose own bounds hold the offline speedup: no
    # difference the measurement can tell, nothing to explain.
    assert why(1.67, 1.50, low=1.0, high=2.4) == AGREE
    assert why(1.67, 1.50, low=1.03, high=2.4) == LAYOUT


def tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Offline at batch 1: EAGLE-3 1.04 [0.98, 1.10], n-gram 1.60 [1.50, 1.70]. Served at concurrency 1:
    no SD 162 tok/s (stream off 280), EAGLE-3 270 (stream off 290), n-gram 310 (stream off 300)."""
    cells = pd.DataFrame([
        dict(engine="e", model="m", dataset="d", method="none", sd_method="none", batch_size=1, speedup=math.nan,
             speedup_ci_low=math.nan, speedup_ci_high=math.nan, tokens_per_s=279.0, baseline_tokens_per_s=279.0,
             mean_acceptance_length=1.0),
        dict(engine="e", model="m", dataset="d", method="eagle3-k3", sd_method="eagle3", batch_size=1, speedup=1.04,
             speedup_ci_low=0.98, speedup_ci_high=1.10, tokens_per_s=290.0, baseline_tokens_per_s=279.0,
             speedup_design="paired", mean_acceptance_length=2.6),
        dict(engine="e", model="m", dataset="d", method="ngram-k3", sd_method="ngram", batch_size=1, speedup=1.6,
             speedup_ci_low=1.5, speedup_ci_high=1.7, tokens_per_s=450.0, baseline_tokens_per_s=279.0,
             speedup_design="paired", mean_acceptance_length=2.0),
        dict(engine="e", model="m", dataset="d", method="ngram-k3", sd_method="ngram", batch_size=4, speedup=1.3,
             speedup_ci_low=1.2, speedup_ci_high=1.4, tokens_per_s=450.0, baseline_tokens_per_s=279.0,
             mean_acceptance_length=2.0),
    ])  # fmt: skip
    server = pd.DataFrame([
        dict(engine="e", model="m", dataset="d", method=m, sd_method=sd, concurrency=1, num_speculative_tokens=3,
             tokens_per_s=t, tokens_per_s_min=t, tokens_per_s_max=t, mean_acceptance_length=2.0,
             stream_off_tokens_per_s=off)
        for m, sd, t, off in (("none", "none", 162.0, 280.0), ("eagle3-k3", "eagle3", 270.0, 290.0),
                              ("ngram-k3", "ngram", 310.0, 300.0))
    ])  # fmt: skip
    return cells, server


def test_offline_and_served_side_by_side_with_the_control() -> None:
    cells, server = tables()
    t = modes_table(cells, server).set_index("method")
    assert list(t.index) == ["eagle3-k3", "ngram-k3"]  # batch 4 has no served cell
    e, n = t.loc["eagle3-k3"], t.loc["ngram-k3"]
    assert e["served_speedup"] == pytest.approx(270 / 162) and e["stream_off_speedup"] == pytest.approx(290 / 280)
    assert e["reason"] == CLIENT  # 1.67 outside [0.98, 1.10], 1.036 inside
    assert n["served_speedup"] == pytest.approx(310 / 162) and n["stream_off_speedup"] == pytest.approx(300 / 280)
    assert n["reason"] == LAYOUT  # 1.91 outside [1.5, 1.7], 1.07 outside too
    # Offline no SD beside a paired cell: its own no-SD calls, 290 / 1.04; served: the no-SD server's.
    assert (e["offline_baseline_tokens_per_s"], e["served_baseline_tokens_per_s"]) == (pytest.approx(290 / 1.04), 162.0)
    assert e["offline_pairing"] == "paired" and e["pairing"] == "unpaired"  # separately started servers
    # One server start per arm: no interval at the level that varies (the rounds' range is not one).
    assert pd.isna(e["served_speedup_low"]) and pd.isna(e["served_speedup_high"])
    text = modes_markdown(modes_table(cells, server), {"eagle3-k3": "EAGLE-3"})
    assert ("| m / d (e) | EAGLE-3 | 1 | 1.04 [0.98, 1.10] | 1.67 [–, –] | unpaired | 1.04 | 279 / 162 "
            "| client streaming |") in text.splitlines()  # fmt: skip
    # Without stream-off rounds (a server table from before the control): no control, never a guess.
    bare = modes_table(cells, server.drop(columns="stream_off_tokens_per_s")).set_index("method")
    assert bare.loc["eagle3-k3", "reason"] == NO_CONTROL and math.isnan(bare.loc["eagle3-k3", "stream_off_speedup"])


def test_the_verdict_page_carries_the_comparison_and_says_whose_speedup_it_is() -> None:
    from sdbench.analysis.verdict import modes_section

    cells, server = tables()
    text = "\n".join(modes_section(modes_table(cells, server), {"eagle3-k3": "EAGLE-3"}))
    assert text.startswith("## Offline and served at the same load")
    assert "1 point(s) differ by the client's streaming: there the served speedup is the client's" in text
    assert "1 point(s) differ by the server's layout" in text
    assert "| m / d (e) | EAGLE-3 | 1 | 1.04 [0.98, 1.10] |" in text
    assert modes_section(None, {}) == []


def test_the_verdict_page_carries_the_frontier_and_max_load_beside_the_squares() -> None:
    """ext17's picture and tables on the verdict page, under the page's own heading (not ext17's title)."""
    from tests.analysis.test_goodput_frontier import LABELS, flat_pair

    from sdbench.analysis.goodputfrontier import arms, frontier_table, max_load_table
    from sdbench.analysis.verdict import frontier_section

    cells, reqs = flat_pair(2.0, 5.0)
    found = arms(cells, reqs, seed=7)
    slos = {"d": {"ttft_ms": 10, "tpot_ms": 3}}
    lines = frontier_section(frontier_table(found, cells, slos, n=6), max_load_table(found, slos), LABELS)
    text = "\n".join(lines)
    assert lines[0].startswith("## Goodput without a hand-picked target (`ext17_goodput_frontier`)")
    assert "](ext17_goodput_frontier.png)" in lines[1]
    assert "### m / d (e)" in text and "# Goodput without a hand-picked target\n" not in text
    assert "| n-gram | 2 | unpaired |" in text  # the frontier's row, with its draws
    assert "drawn independently): `SD better` (the difference's interval above 0)" in text
    assert "Highest concurrency with ≥90% of requests meeting the target [95%]" in text  # the max-load table
    assert frontier_section(None, None, {}) == []


def test_the_verdict_markdown_puts_squares_frontier_and_modes_on_one_page() -> None:
    from tests.analysis.test_goodput_frontier import flat_pair

    import sdbench.analysis.verdict as vd
    from sdbench.analysis.goodputfrontier import arms, frontier_table, max_load_table

    cells, server = tables()
    points = vd.points_table(cells, server)
    fcells, freqs = flat_pair(2.0, 5.0)
    found = arms(fcells, freqs, seed=7)
    frontier, loads = frontier_table(found, fcells, {}, n=6), max_load_table(found, {})
    text = vd.verdict_markdown(points, vd.lines_table(points), vd.recommendations(points, {}), {},
                               modes_table(cells, server), frontier, loads)  # fmt: skip
    heads = [line for line in text.splitlines() if line.startswith("## ")]
    assert "## Goodput without a hand-picked target (`ext17_goodput_frontier`)" in heads
    assert "## Offline and served at the same load" in heads
