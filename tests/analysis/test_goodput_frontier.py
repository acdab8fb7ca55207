"""The server verdict without a hand-picked target (sdbench.analysis.goodputfrontier): the goodput
frontier and the max-load table on per-request tables made here, whose answers are worked out by
hand in each test; the user's targets as a point on it, said the same way by the verdict
(sdbench.analysis.verdict); and the figure's check (tests/support/drawncheck.py) failing on a
figure that says otherwise."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from sdbench.analysis.goodput import add_goodput, goodput_draws, ratio_interval, region
from sdbench.analysis.goodputfrontier import (
    ATTAINMENT,
    GRID_POINTS,
    arms,
    frontier_markdown,
    frontier_table,
    max_load,
    max_load_table,
    plot_frontier,
)
from tests.support import drawncheck

LABELS = {"none": "w/o SD", "ngram-k3": "n-gram"}
# The summary's latency percentiles (sdbench serve-group writes them; the frontier reads the requests).
PERCENTILES = ("ttft_p50_ms", "tpot_p50_ms", "tpot_p95_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms")


def cell(method: str, concurrency: int, walls: list[float]) -> dict:
    """A server cell summary row (the columns the frontier and the verdict read)."""
    sd = "none" if method == "none" else method.split("-")[0]
    return dict(engine="e", model="m", dataset="d", method=method, concurrency=concurrency, sd_method=sd,
                num_speculative_tokens=0 if sd == "none" else 3, tokens_per_s=100.0, tokens_per_s_min=90.0,
                tokens_per_s_max=110.0, mean_acceptance_length=2.0, round_wall_s=walls, hardware="cpu",
                mean_output_tokens=128.0, **dict.fromkeys(PERCENTILES, math.nan))  # fmt: skip


def requests(method: str, concurrency: int, ttft_ms: list[list[float]], tpot_ms: list[list[float]]) -> pd.DataFrame:
    """Timed requests, a list of values per round; 128 output tokens, so E2E = TTFT + 127 x TPOT."""
    rows = [dict(engine="e", model="m", dataset="d", method=method, concurrency=concurrency, round=r, index=i,
                 ttft_s=a / 1000, tpot_s=b / 1000, latency_s=(a + 127 * b) / 1000, num_output_tokens=128)
            for r, (ttfts, tpots) in enumerate(zip(ttft_ms, tpot_ms))
            for i, (a, b) in enumerate(zip(ttfts, tpots))]  # fmt: skip
    return pd.DataFrame(rows)


def flat_pair(sd_tpot: float, base_tpot: float, concurrency: int = 2) -> tuple[pd.DataFrame, pd.DataFrame]:
    """No SD and n-gram at one concurrency: 2 rounds x 4 requests each, every TTFT 10 ms, every TPOT the
    arm's, walls 1 s: an arm meeting a target has goodput 8 / 2 s = 4 req/s in every bootstrap draw."""
    cells = pd.DataFrame([cell("none", concurrency, [1.0, 1.0]), cell("ngram-k3", concurrency, [1.0, 1.0])])
    reqs = pd.concat([requests("none", concurrency, [[10.0] * 4] * 2, [[base_tpot] * 4] * 2),
                      requests("ngram-k3", concurrency, [[10.0] * 4] * 2, [[sd_tpot] * 4] * 2)],
                     ignore_index=True)  # fmt: skip
    return cells, reqs


# ----------------------------------------------------------------------------- the frontier
@pytest.mark.parametrize("sd_tpot, base_tpot, between", [(2.0, 5.0, "SD better"), (5.0, 2.0, "no SD better")])
def test_the_faster_arm_is_better_between_the_two_tpots_neither_below_both_and_no_difference_above(
    sd_tpot: float, base_tpot: float, between: str
) -> None:
    """TTFT 10 ms in both arms; TPOT 2 ms in one, 5 ms in the other. By hand: below a TTFT target of
    10 ms or a TPOT target of 2 ms no request meets it (neither meets); from 2 to 5 ms only the 2 ms
    arm's requests meet it, 4 req/s against 0 in every draw (that arm better); from 5 ms both meet it
    at 4 req/s in every draw, a difference of exactly 0 (undecided: goodput tells them apart no more)."""
    cells, reqs = flat_pair(sd_tpot, base_tpot)
    table = frontier_table(arms(cells, reqs, seed=7), cells, {}, n=6)
    # The grid: 6 log-spaced targets from the smallest value over 1.25 to the largest times 1.25.
    assert sorted(table["slo_ttft_ms"].unique()) == pytest.approx([8.0 * (12.5 / 8.0) ** (i / 5) for i in range(6)])
    assert sorted(table["slo_tpot_ms"].unique()) == pytest.approx([1.6 * (6.25 / 1.6) ** (i / 5) for i in range(6)])
    assert len(table) == 36 and (table["point"] == "grid").all() and table["slo_e2e_ms"].isna().all()
    fast, slow = min(sd_tpot, base_tpot), max(sd_tpot, base_tpot)
    for r in table.itertuples(index=False):
        meets_fast = r.slo_ttft_ms >= 10 and r.slo_tpot_ms >= fast
        meets_slow = r.slo_ttft_ms >= 10 and r.slo_tpot_ms >= slow
        want = "neither meets" if not meets_fast else between if not meets_slow else "undecided"
        assert r.region == want, (r.slo_ttft_ms, r.slo_tpot_ms)
        sd_meets = meets_fast if sd_tpot == fast else meets_slow
        base_meets = meets_fast if base_tpot == fast else meets_slow
        assert (r.goodput_rps, r.baseline_goodput_rps) == (4.0 * sd_meets, 4.0 * base_meets)
        diff = 4.0 * sd_meets - 4.0 * base_meets
        assert (r.goodput_difference_rps_ci_low, r.goodput_difference_rps_ci_high) == (diff, diff)
    # 3 TTFT rows from 10 ms up x 4 TPOT targets between 2 and 5 ms: 12 of the 36 squares.
    assert (table["region"] == between).sum() == 12 and (table["region"] == "undecided").sum() == 3


def test_the_region_rule_is_the_95_percent_interval_of_the_difference() -> None:
    """SD's draws 1.0 req/s but for k of 1,010 draws at 0, no SD's 0.5: the difference's 2.5% point (the
    ceil(25.25) = 26th smallest, inverted CDF) is +0.5 with k = 25 draws below 0 and -0.5 with 26; the
    97.5% point of no SD minus SD (the 985th) likewise."""
    base = np.full(1010, 0.5)
    for k, sd_side, base_side in ((25, "SD better", "no SD better"), (26, "undecided", "undecided")):
        sd = np.r_[np.zeros(k), np.ones(1010 - k)]
        assert region(sd, base, 1.0, 0.5) == sd_side
        assert region(base, sd, 0.5, 1.0) == base_side
    # A 90% interval (the ceil(50.5) = 51st smallest) would call 50 draws below 0 SD better: the 95% one does not.
    assert region(np.r_[np.zeros(50), np.ones(960)], base, 1.0, 0.5) == "undecided"
    # No request of either arm meets it: named, whatever the draws say.
    assert region(np.zeros(10), np.zeros(10), 0.0, 0.0) == "neither meets"


def test_the_region_says_what_the_verdicts_ratio_interval_says_on_any_draws() -> None:
    """The frontier judges the difference, the verdict showed the ratio: on the same draws both give one
    answer (the ratio's lower bound is above 1 exactly when the difference's is above 0)."""
    from sdbench.analysis.verdict import verdict

    # The frontier has no equivalence margin: an interval holding 0 (1) is undecided, even or not.
    words = {"pays": "SD better", "loses": "no SD better", "break-even": "undecided", "undecided": "undecided"}
    rng = np.random.default_rng(3)
    seen = set()
    for _ in range(300):  # goodputs >= 0, some draws 0 (a ratio x/0 is infinite, 0/0 is 1)
        a = np.clip(rng.normal(rng.uniform(0, 3), 1.0, 200), 0, None)
        b = np.clip(rng.normal(rng.uniform(0, 3), 1.0, 200), 0, None)
        got = region(a, b, 1.0, 1.0)
        assert got == words[verdict(*ratio_interval(a, b))]
        seen.add(got)
    assert seen == set(words.values())


# ----------------------------------------------------------------------------- the user's targets
def noisy_pair(concurrency: int = 4) -> tuple[pd.DataFrame, pd.DataFrame]:
    """No SD and n-gram, 2 rounds x 16 requests with spread (TPOT ~2.3 ms vs ~3.5 ms, TTFT ~16 vs ~10
    ms, walls unequal): the bootstrap decides, so regions vary across targets."""
    rng = np.random.default_rng(11)

    def arm(method: str, ttft: float, tpot: float, walls: list[float]) -> tuple[dict, pd.DataFrame]:
        t = [list(ttft * np.exp(0.25 * rng.standard_normal(16))) for _ in walls]
        p = [list(tpot * np.exp(0.12 * rng.standard_normal(16))) for _ in walls]
        return cell(method, concurrency, walls), requests(method, concurrency, t, p)

    (bc, br), (sc, sr) = arm("none", 10.0, 3.5, [2.0, 2.3]), arm("ngram-k3", 16.0, 2.3, [1.5, 1.4])
    return pd.DataFrame([bc, sc]), pd.concat([br, sr], ignore_index=True)


def test_the_users_targets_are_a_point_judged_on_the_server_tables_own_draws() -> None:
    """The frontier's row for the user's targets (E2E included) has the server table's goodput and the
    verdict's square at them the same region, wherever they fall."""
    from sdbench.analysis.verdict import server_points

    cells, reqs = noisy_pair()
    found = arms(cells, reqs, seed=42)
    seen = set()
    for slo in ({"ttft_ms": 30, "tpot_ms": 3.0}, {"ttft_ms": 30, "tpot_ms": 2.6, "e2e_ms": 500},
                {"ttft_ms": 11, "tpot_ms": 5.0}, {"ttft_ms": 18, "tpot_ms": 5.0}, {"ttft_ms": 30, "tpot_ms": 9.0},
                {"ttft_ms": 5, "tpot_ms": 1.0}, {"tpot_ms": 3.3},
                {"ttft_ms": 30, "tpot_ms": 5.0, "e2e_ms": 330}):  # fmt: skip
        table = frontier_table(found, cells, {"d": slo}, n=8)
        yours = table[table["point"] == "your targets"]
        assert len(yours) == 1 and len(table) == 8 * 8 + 1
        server = add_goodput(cells, reqs, {"d": slo}, 42)
        point = server_points(server).iloc[0]
        assert yours["region"].iloc[0] == point["goodput_verdict"], slo
        assert yours["goodput_rps"].iloc[0] == server.set_index("method").loc["ngram-k3", "goodput_rps"]
        # The same draws, hence the same interval: the difference of the two cells' boot columns.
        boot = server.set_index("method")["goodput_rps_boot"]
        diff = np.asarray(boot["ngram-k3"]) - np.asarray(boot["none"])
        tail = (1 - 0.95) / 2  # the 95% interval's tails as the bootstrap's CONFIDENCE gives them
        low, high = np.quantile(diff, [tail, 1 - tail], method="inverted_cdf")
        bounds = yours[["goodput_difference_rps_ci_low", "goodput_difference_rps_ci_high"]].iloc[0].tolist()
        assert bounds == [low, high]
        if slo.get("e2e_ms") == 330:  # SD's requests all meet TTFT 30 and TPOT 5 ms; E2E ~16 + 127 x 2.3 ms, some not
            assert 0 < yours["slo_attainment"].iloc[0] < 1
        seen.add(point["goodput_verdict"])
    assert seen == {"SD better", "no SD better", "undecided", "neither meets"}


def test_the_verdict_says_where_the_targets_fall_and_names_targets_no_arm_meets() -> None:
    """On the flat pair (n-gram TPOT 2 ms, no SD 5 ms, TTFT 10 ms, 4 req/s for an arm meeting every
    target): TPOT 3 ms lies where only SD's requests meet it, 1 ms where none does, 6 ms where both do."""
    from sdbench.analysis.verdict import goodput_sections, server_points

    cells, reqs = flat_pair(2.0, 5.0)
    squares = {3.0: "| n-gram | 4 req/s, none without SD: SD better |",
               1.0: "| n-gram | 0 req/s, neither meets: not scored |",
               6.0: "| n-gram | 1.00 [1.00, 1.00] undecided, unpaired |"}  # fmt: skip
    for tpot, square in squares.items():
        server = add_goodput(cells, reqs, {"d": {"ttft_ms": 20, "tpot_ms": tpot}}, 42)
        text = goodput_sections(server_points(server).assign(load_kind="concurrency", load=2), LABELS)
        assert square in text, text
        assert text[1].startswith(f"Your targets (`server.slo`: TTFT 20 / TPOT {tpot:g} ms) are one point of the")
        assert "pays" not in "\n".join(text) and "inf" not in "\n".join(text)
        unreachable = "No request of any arm met your targets at any concurrency: this hardware does not reach them"
        assert (unreachable in "\n".join(text)) == (tpot == 1.0)


def test_the_frontier_markdown_rows_by_hand() -> None:
    """The flat pair on a 6 x 6 grid (first test): 12 squares SD better, 3 undecided, 21 neither meets;
    at the loosest TTFT SD is better from the 2nd TPOT target, 1.6 x 3.90625^(1/5) = 2.10 ms, to the
    5th, 1.6 x 3.90625^(4/5) = 4.76 ms (the 6th, 6.25 ms, is no SD's too). The user's targets, TTFT 10
    and TPOT 3 ms (inside both axes' range: the grid is the same), are met by every SD request (4 req/s)
    and no no-SD one, and are no square of the grid's shares."""
    cells, reqs = flat_pair(2.0, 5.0)
    found = arms(cells, reqs, seed=7)
    slos = {"d": {"ttft_ms": 10, "tpot_ms": 3}}
    text = frontier_markdown(frontier_table(found, cells, slos, n=6), max_load_table(found, slos), LABELS, grid=6)
    assert ("| n-gram | 2 | unpaired | 33% | 0% | 8% | 58% | 2.1-4.76 | SD better (TTFT 10 / TPOT 3 ms: SD 4, no SD 0 req/s) |"
            in text.splitlines())  # fmt: skip
    assert "(log-spaced, 6 x 6)" in text


# ----------------------------------------------------------------------------- max load
def load_line(goods: dict[int, int], walls: dict[int, float]) -> list:
    """One arm over concurrencies: at each, one round of 10 requests of which ``goods[c]`` have TPOT
    1 ms and the rest 9 ms, every TTFT 5 ms x c, wall ``walls[c]``."""
    cells = pd.DataFrame([cell("none", c, [walls[c]]) for c in goods])
    reqs = pd.concat([requests("none", c, [[5.0 * c] * 10], [[1.0] * g + [9.0] * (10 - g)]) for c, g in goods.items()],
                     ignore_index=True)  # fmt: skip
    found = arms(cells, reqs, seed=5)
    return sorted(found.values(), key=lambda a: a.cell["concurrency"]), found


def test_the_highest_load_where_90_percent_meet_the_target_and_its_interval() -> None:
    """10/10, 9/10 and 8/10 requests meet TPOT 2 ms at concurrency 1, 2, 4 (walls 10, 5, 2.5 s):
    90% is met up to 2 (exactly 90% counts), at 1, 2 and 4 req/s. Bootstrap by hand (one round, its 10
    requests redrawn): 2 keeps 90% when its bad request is drawn at most once, P = 0.9^10 + 10 x 0.1 x
    0.9^9 = 0.736; 4 when at most one of its two is, P = 0.8^10 + 10 x 0.2 x 0.8^9 = 0.376. So the max
    load is 1 with P = 0.264, 2 with 0.459, 4 with 0.277: the 95% interval is [1, 4]."""
    line, _ = load_line({1: 10, 2: 9, 4: 8}, {1: 10.0, 2: 5.0, 4: 2.5})
    got = max_load(line, {"tpot_ms": 2.0})
    assert ATTAINMENT == 0.9
    assert (got["max_concurrency"], got["max_requests_per_s"], got["beyond_measured"]) == (2, 2.0, False)
    assert (got["max_concurrency_ci_low"], got["max_concurrency_ci_high"]) == (1.0, 4.0)
    assert (got["max_requests_per_s_ci_low"], got["max_requests_per_s_ci_high"]) == (1.0, 4.0)
    assert got["slo_attainments"] == pytest.approx([1.0, 0.9, 0.8]) and got["concurrencies"] == [1, 2, 4]
    # A loose target every request meets: at least the largest load measured, every draw too.
    loose = max_load(line, {"tpot_ms": 10.0})
    assert (loose["max_concurrency"], loose["beyond_measured"], loose["max_concurrency_ci_low"]) == (4, True, 4.0)
    # One no request meets at the smallest load: none (0), 0 req/s.
    tight = max_load(line, {"ttft_ms": 1.0})
    assert (tight["max_concurrency"], tight["max_requests_per_s"], tight["max_concurrency_ci_high"]) == (0, 0.0, 0.0)


def test_a_load_beyond_one_that_misses_the_target_does_not_count() -> None:
    """10/10, 5/10, 10/10 at concurrency 1, 2, 4: the highest load up to which every load meets 90% is
    1, not 4 (a server that misses at 2 does not serve 4 within the target)."""
    line, _ = load_line({1: 10, 2: 5, 4: 10}, {1: 10.0, 2: 5.0, 4: 2.5})
    got = max_load(line, {"tpot_ms": 2.0})
    assert (got["max_concurrency"], got["max_requests_per_s"]) == (1, 1.0)


def test_the_max_load_table_takes_the_users_targets_and_no_sds_unloaded_latency_scaled() -> None:
    """Targets: the user's, then no SD's TTFT and TPOT p50 at its smallest concurrency (5 ms; TPOT: the
    median of 10 x 1 ms and 0 x 9 ms = 1 ms at concurrency 1) times 1, 1.5, 2, 3, 5. TTFT is 5, 10 and
    20 ms at concurrency 1, 2, 4: scale 1 and 1.5 (TTFT 5 and 7.5 ms) are met at 1 only; 2 (10 ms, TPOT
    2 ms: 9 of 10 at concurrency 2) up to 2; 3 and 5 (15 and 25 ms) up to 2 as well (concurrency 4: TTFT
    20 ms > 15; with 25 ms, 8 of 10 within TPOT 5 ms)."""
    _, found = load_line({1: 10, 2: 9, 4: 8}, {1: 10.0, 2: 5.0, 4: 2.5})
    table = max_load_table(found, {"d": {"tpot_ms": 2.0}})
    assert table["target"].tolist() == ["your targets", "scale 1", "scale 1.5", "scale 2", "scale 3", "scale 5"]
    assert table["slo_ttft_ms"].tolist()[1:] == pytest.approx([5.0, 7.5, 10.0, 15.0, 25.0])
    assert table["slo_tpot_ms"].tolist() == pytest.approx([2.0, 1.0, 1.5, 2.0, 3.0, 5.0])
    assert math.isnan(table["slo_ttft_ms"].iloc[0]) and table["max_concurrency"].iloc[0] == 2
    assert table["max_concurrency"].tolist() == [2, 1, 1, 2, 2, 2]
    text = frontier_markdown(frontier_table(found, pd.DataFrame(), {}), table, LABELS)
    row = [line for line in text.splitlines() if line.startswith("| w/o SD |")][0]
    assert row.startswith("| w/o SD | 2 [1, ≥4]; 2 [1, 4] req/s | ")


# ----------------------------------------------------------------------------- the figure and its check
def write_run(root: Path, slo: dict) -> Path:
    """A run directory with the noisy pair's server cells, the frontier and verdict tables and the figure."""
    from sdbench.analysis.verdict import server_points

    cells, reqs = noisy_pair()
    (root / "config").mkdir(parents=True)
    methods = {"none": {"label": "w/o SD"}, "ngram-k3": {"label": "n-gram"}}
    (root / "config/config.yaml").write_text(yaml.safe_dump({"methods": methods}))
    for c in cells.to_dict("records"):
        d = root / "results/server/e/m" / c["method"] / "d" / f"c{c['concurrency']}"
        d.mkdir(parents=True)
        pd.DataFrame([c]).to_parquet(d / "summary.parquet")
        reqs[reqs["method"] == c["method"]].to_parquet(d / "requests.parquet")
    (root / "results/tables").mkdir(parents=True)
    (root / "results/paper").mkdir(parents=True)
    table = frontier_table(arms(cells, reqs, seed=42), cells, {"d": slo}, n=8)
    table.to_parquet(root / "results/tables/goodput_frontier.parquet")
    server_points(add_goodput(cells, reqs, {"d": slo}, 42)).to_parquet(root / "results/tables/verdict.parquet")
    plot_frontier(table, root / "results/paper/ext17_goodput_frontier.png", LABELS)
    return root


def tamper(csv: Path, mark: str, column: str, value: object, row: int = 0) -> None:
    drawn = drawncheck.read_drawn(csv)
    drawn.loc[drawn.index[drawn["mark"] == mark][row], column] = value
    drawn.to_csv(csv, index=False)


def test_the_figures_check_passes_on_the_figure_and_fails_on_one_that_says_otherwise(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", {"ttft_ms": 30, "tpot_ms": 3.0, "e2e_ms": 330})  # E2E binds: see above
    csv = run / "results/paper/ext17_goodput_frontier.csv"
    assert drawncheck.check_run(run) == {"ext17_goodput_frontier": (8 * 8 + 1, 8 * 8 + 1)}
    original = csv.read_text()
    drawn = drawncheck.read_drawn(csv)
    squares = drawn[drawn["mark"] == "cell"]
    other = {r: c for r, c in drawncheck.REGION_COLORS.items() if r != squares["note"].iloc[0]}
    for column, value, match in (("note", next(iter(other)), "drawn"), ("color", next(iter(other.values())), "drawn"),
                                 ("y", 1e6, None)):  # fmt: skip
        tamper(csv, "cell", column, value)
        with pytest.raises((AssertionError, KeyError), match=match):
            drawncheck.check_run(run)
        csv.write_text(original)
    for column, value, match in (("x", "0.5", "star x"), ("note", "your targets: undecided", "star says")):
        tamper(csv, "target", column, value)
        with pytest.raises(AssertionError, match=match):
            drawncheck.check_run(run)
        csv.write_text(original)
    # The table itself: a goodput not counted from the requests, a region not by the rule.
    path = run / "results/tables/goodput_frontier.parquet"
    table = pd.read_parquet(path)
    for column, value, match in (("goodput_rps", 99.0, "SD goodput"), ("baseline_goodput_rps", 99.0, "no-SD goodput"),
                                 ("region", "SD better" if table["region"].iloc[-1] != "SD better" else "undecided",
                                  "region")):  # fmt: skip
        table.assign(**{column: table[column].where(table.index != len(table) - 1, value)}).to_parquet(path)
        with pytest.raises(AssertionError, match=match):
            drawncheck.check_run(run)
    table.to_parquet(path)
    drawncheck.check_run(run)


def test_the_command_writes_every_output_and_refuses_a_grid_of_one(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    run = write_run(tmp_path / "run", {"ttft_ms": 30, "tpot_ms": 3.0})
    groups = [str(run / "results/server/e/m" / m) for m in ("none", "ngram-k3")]
    out = tmp_path / "out"
    argv = [str(Path(sys.executable).parent / "sdbench"), "goodput-frontier", "--groups", *groups, "--slo",
            json.dumps({"d": {"ttft_ms": 30, "tpot_ms": 3.0}}), "--labels", json.dumps(LABELS), "--output",
            str(out / "f.parquet"), "--max-load", str(out / "l.parquet"), "--markdown", str(out / "f.md"),
            "--figure", str(out / "f.png")]  # fmt: skip
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120)
    frontier = pd.read_parquet(out / "f.parquet")
    assert len(frontier) == GRID_POINTS**2 + 1 and (out / "f.csv").is_file() and (out / "l.parquet").is_file()
    bad = subprocess.run([*argv, "--grid", "1"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith("--grid 1: at least 2 targets per axis")


def test_the_draws_are_the_server_tables_resamples() -> None:
    """goodput_draws on resample weights: one good request per round (walls 1 s and 3 s) gives the
    three values by hand, 2 / 2 s, 2 / 4 s and 2 / 6 s, as before the weights."""
    draws = goodput_draws(np.array([True, True]), np.array([0, 1]), [1.0, 3.0], seed=1)
    assert sorted(set(draws.tolist())) == pytest.approx([1 / 3, 1 / 2, 1.0])


def test_the_cli_default_grid_is_the_implementations() -> None:
    from sdbench.analysis import cli as analysis_cli

    assert analysis_cli.FRONTIER_GRID == GRID_POINTS
