"""The server table's bootstrap across server starts (sdbench.analysis.goodput): starts, then rounds,
then requests; paired (joint start draws) when two arms' starts interleaved in one job, unpaired
otherwise; stream-off control rounds left out; joules per (good) request. Synthetic tables made here,
every expected value reasoned by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from sdbench.analysis.goodput import PAIRED, UNPAIRED, add_goodput, energy_columns, interleaved_with


def arm(method: str, speeds: list[float], job: str = "j", sequence: list[int] | None = None,
        tokens: int = 100, interleaved: bool = True) -> tuple[dict, pd.DataFrame]:  # fmt: skip
    """A server cell with one start per entry of ``speeds`` (output tokens/s of its rounds), two
    rounds per start, two requests of ``tokens`` tokens per round, every request fast."""
    rounds = [(s, r) for s in range(len(speeds)) for r in range(2)]
    walls = [2 * tokens / speeds[s] for s, _ in rounds]
    reqs = pd.DataFrame([dict(engine="e", model="m", dataset="d", method=method, concurrency=2, round=i, index=k,
                              start=s, stream=True, num_output_tokens=tokens, ttft_s=0.01, tpot_s=0.001,
                              latency_s=0.2) for i, (s, _) in enumerate(rounds) for k in range(2)])  # fmt: skip
    cell = dict(engine="e", model="m", dataset="d", method=method, concurrency=2,
                sd_method="none" if method == "none" else "ngram", num_speculative_tokens=3,
                tokens_per_s=float(np.median(speeds)), tokens_per_s_min=min(speeds), tokens_per_s_max=max(speeds),
                mean_acceptance_length=2.0, round_wall_s=walls, round_start=[s for s, _ in rounds],
                starts=len(speeds), interleaved=interleaved, job_id=job,
                start_sequence=sequence if sequence is not None else list(range(len(speeds))))  # fmt: skip
    return cell, reqs


def table(*arms: tuple[dict, pd.DataFrame], resample: str = "starts") -> pd.DataFrame:
    cells = pd.DataFrame([c for c, _ in arms])
    return add_goodput(cells, pd.concat([r for _, r in arms], ignore_index=True), {"d": {"ttft_ms": 100}}, 42,
                       resample=resample).set_index("method")  # fmt: skip


def test_resampling_starts_widens_the_interval_to_a_slow_start_alone() -> None:
    """Three starts at 100, 150 and 200 tok/s, rounds within a start alike. Drawing the slowest start
    three times has P = 1/27 = 3.7% > 2.5%: the interval over starts reaches 100 tok/s exactly. Drawn
    as six rounds, all six from the slowest start has P = (2/6)^6 = 0.14%: the low bound stays above."""
    cells = table(arm("none", [100.0, 150.0, 200.0]))
    rounds = table(arm("none", [100.0, 150.0, 200.0]), resample="rounds")
    assert cells.loc["none", "tokens_per_s_ci_low"] == pytest.approx(100.0)
    assert rounds.loc["none", "tokens_per_s_ci_low"] > 100.0 + 1.0
    width = lambda t: t.loc["none", "tokens_per_s_ci_high"] - t.loc["none", "tokens_per_s_ci_low"]  # noqa: E731
    assert width(cells) > width(rounds)
    # Goodput (every request good: 2 per round of wall 200/speed s, so goodput = speed / 100) from the same draws.
    assert cells.loc["none", "goodput_rps_ci_low"] == pytest.approx(1.0)
    assert np.allclose(np.asarray(cells.loc["none", "goodput_rps_boot"]) * 100,
                       cells.loc["none", "tokens_per_s_boot"])  # fmt: skip
    assert cells.loc["none", "starts"] == 3 and cells.loc["none", "resample"] == "starts"


def test_a_table_from_before_repeated_starts_draws_as_the_rounds_only_bootstrap() -> None:
    cell, reqs = arm("none", [100.0, 150.0])
    old = {k: v for k, v in cell.items() if k not in ("round_start", "starts", "interleaved", "job_id", "start_sequence")}
    old_reqs = reqs.drop(columns=["start", "stream"])
    starts, rounds = table((old, old_reqs)), table((old, old_reqs), resample="rounds")
    assert starts.loc["none", "goodput_rps_boot"] == rounds.loc["none", "goodput_rps_boot"]
    assert starts.loc["none", "starts"] == 1


def test_interleaved_arms_are_drawn_jointly_and_labelled_paired() -> None:
    """Both arms slow down alike from start to start (x1, x2, x4), SD 1.5 times no SD in every start.
    Interleaved in one job (no SD at 0, 2, 4, SD at 1, 3, 5): start s of both is drawn together, every
    draw's ratio is 1.5, the interval [1.5, 1.5]. In two jobs the draws are independent: a draw of
    SD's slowest start against no SD's fastest reads 1.5 / 4."""
    from sdbench.analysis.verdict import STARTS_BOOTSTRAP, server_points

    base = arm("none", [100.0, 200.0, 400.0], sequence=[0, 2, 4])
    sd = arm("ngram-k3", [150.0, 300.0, 600.0], sequence=[1, 3, 5])
    paired = table(base, sd)
    assert paired.loc["ngram-k3", "pairing"] == PAIRED and paired.loc["none", "pairing"] == ""
    point = server_points(paired.reset_index()).iloc[0]
    assert (point["speedup_ci_low"], point["speedup_ci_high"]) == pytest.approx((1.5, 1.5))
    assert (point["goodput_ratio_ci_low"], point["goodput_ratio_ci_high"]) == pytest.approx((1.5, 1.5))
    assert point["interval"] == STARTS_BOOTSTRAP and point["pairing"] == PAIRED
    apart = table(base, arm("ngram-k3", [150.0, 300.0, 600.0], job="k", sequence=[0, 1, 2]))
    assert apart.loc["ngram-k3", "pairing"] == UNPAIRED
    point = server_points(apart.reset_index()).iloc[0]
    assert point["speedup_ci_low"] < 1.0 and point["speedup_ci_high"] > 3.0 and point["pairing"] == UNPAIRED


def test_paired_needs_one_job_and_alternating_starts() -> None:
    base, sd = {"interleaved": True, "job_id": "j", "start_sequence": [0, 2, 4]}, {"interleaved": True, "job_id": "j"}
    assert interleaved_with({**sd, "start_sequence": [1, 3, 5]}, base)
    assert interleaved_with({**sd, "start_sequence": [1, 2, 5]}, {**base, "start_sequence": [0, 3, 4]})  # 0|1, 2|3, 4|5
    assert not interleaved_with({**sd, "start_sequence": [3, 5, 7]}, base)  # SD's first start after no SD's second
    assert not interleaved_with({**sd, "start_sequence": [1, 5, 6]}, base)  # 0 1 | 2 4 5: no SD twice in a row
    assert not interleaved_with({**sd, "start_sequence": [1, 3]}, base)  # not as many starts
    assert not interleaved_with({**sd, "job_id": "k", "start_sequence": [1, 3, 5]}, base)
    assert not interleaved_with({**sd, "interleaved": False, "start_sequence": [1, 3, 5]}, base)
    assert not interleaved_with({"start_sequence": [1, 3, 5]}, {"start_sequence": [0, 2, 4]})  # an older table


def test_stream_off_rounds_are_no_part_of_timed_goodput_or_throughput() -> None:
    """A stream-off control round (round 9, not in round_wall_s) of slow requests: left out."""
    cell, reqs = arm("none", [100.0])
    control = reqs.iloc[:2].assign(round=9, stream=False, ttft_s=math.nan, tpot_s=math.nan, latency_s=50.0,
                                   num_output_tokens=1)  # fmt: skip
    out = table((cell, pd.concat([reqs, control], ignore_index=True)))
    assert out.loc["none", "slo_attainment"] == 1.0 and out.loc["none", "tokens_per_s_ci_low"] == pytest.approx(100.0)


def test_joules_per_request_and_per_good_request() -> None:
    """Two rounds metered 30 J and 60 J, 8 timed requests of which 5 met the targets: 90 / 8 and 90 / 5."""
    e = energy_columns({"round_energy_j": [30.0, 60.0], "energy_reason": ""}, 8, 5)
    assert (e["energy_j"], e["joules_per_request"], e["joules_per_good_request"]) == (90.0, 11.25, 18.0)
    unmetered = energy_columns({"round_energy_j": [math.nan, math.nan], "energy_reason": "no meter: RAPL denied"}, 8, 5)
    assert math.isnan(unmetered["joules_per_request"]) and unmetered["energy_reason"] == "no meter: RAPL denied"
    part = energy_columns({"round_energy_j": [30.0, math.nan]}, 8, 5)
    assert math.isnan(part["energy_j"]) and part["energy_reason"] == "metered in 1 of 2 rounds only"
    none_good = energy_columns({"round_energy_j": [30.0, 60.0]}, 8, 0)
    assert none_good["joules_per_request"] == 11.25 and math.isnan(none_good["joules_per_good_request"])
    assert none_good["energy_reason"] == "no request met the targets"
    assert "before energy metering" in energy_columns({}, 8, 5)["energy_reason"]
    # Through the server table: the cell's 4 rounds of two good requests, 10 J each: 5 J per (good) request.
    cell, reqs = arm("none", [100.0, 200.0])
    out = table(({**cell, "round_energy_j": [10.0] * 4, "energy_reason": ""}, reqs))
    assert (out.loc["none", "joules_per_request"], out.loc["none", "joules_per_good_request"]) == (5.0, 5.0)


def test_the_server_table_shows_joules_per_request() -> None:
    from sdbench.analysis.latency import latency_markdown

    row = dict(engine="e", model="m", dataset="d", method="none", concurrency=2, tokens_per_s=100.0,
               tokens_per_s_min=90.0, tokens_per_s_max=110.0, ttft_p50_ms=10.0, tpot_p50_ms=2.0, tpot_p95_ms=3.0,
               tpot_p99_ms=4.0, e2e_p50_ms=200.0, e2e_p99_ms=300.0, mean_acceptance_length=math.nan,
               cost_per_1m_tokens=1.0, cost_per_request=0.001, currency="USD")  # fmt: skip
    text = latency_markdown(pd.DataFrame([{**row, "joules_per_request": 11.254}, {**row, "joules_per_request": math.nan}]))
    rows = [line for line in text.splitlines() if line.startswith("| e |")]
    assert rows[0].endswith("| 11.3 |") and rows[1].endswith("| – |")


def test_the_server_jobs_own_interleaved_output_reads_as_paired(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """serve-group's tables (sdbench.engine.serving.servegroup with stand-in servers, 2 arms x 2 starts
    interleaved, an unreadable meter) through the server table: every timed round drawn, the
    controls left out, the arms paired, joules NaN with the meter's reason."""
    from sdbench.analysis.latency import read_server_cells, read_server_requests
    from tests.engine.test_server_starts import run_standin_interleaved_job

    outs, _ = run_standin_interleaved_job(monkeypatch, tmp_path)
    groups = list(outs.values())
    cells = read_server_cells(groups)
    out = add_goodput(cells, read_server_requests(groups), {"d": {"ttft_ms": 1000}}, 42).set_index(["method", "concurrency"])
    sd = out.loc[("ngram-k3", 1)]
    assert sd["pairing"] == PAIRED and sd["starts"] == 2
    assert sd["slo_attainment"] == 1.0 and sd["goodput_rps"] == pytest.approx(6 / 6.0)  # 3 rounds x 2 requests / 1+2+3 s
    assert math.isnan(sd["joules_per_request"]) and sd["energy_reason"] == "RAPL unreadable: permission denied"
