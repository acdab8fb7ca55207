"""Every figure of the index: what it drew, read back from the figure, against its input.

Each test calls the function that draws a figure-index item on a small hand-made input shaped
like the real table, and checks the drawn table -- read back from the figure's artists after
drawing (sdbench.drawn: the panel is the title of the axes a mark is on, x/y/intervals are the
artists' data coordinates, the colour is the one drawn) -- and the CSV beside the PNG against that
input: the column plotted (after the documented transformation) in the right panel, every method
/ series / cell present, the intervals drawn and the colours. ``COUNTS`` keeps, per item, the
marks read back; ``test_every_figure_of_the_index_is_read_back`` keeps the list of items covered
equal to the index's figures and prints the counts (``pytest -s``).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sdbench.figureindex import ITEMS
from sdbench.plotting import DRAWN_COLUMNS, drawn_path, method_style, method_styles, save_png
# The verdict's colours (docs: README's verdict figure), and its rule on the 95% interval.
from tests.support.drawncheck import VERDICT_COLORS
from tests.support.drawncheck import verdict_rule as verdict_by_hand

COVERED: set[str] = set()  # figure-index items whose drawn table a test below asserts
COUNTS: dict[str, int] = {}  # item -> marks read back from its figure(s) in its test
_CURRENT: list[str] = []  # the items of the test running


def covers(*items: str):
    """Mark a test as reading back the drawn table of figure-index ``items``."""
    COVERED.update(items)

    def wrap(test):
        @functools.wraps(test)
        def run(*args, **kwargs):
            _CURRENT[:] = items
            try:
                return test(*args, **kwargs)
            finally:
                _CURRENT.clear()

        return run

    return wrap


def drawn_of(frame: pd.DataFrame | None, png: Path) -> pd.DataFrame:
    """The returned drawn table, checked equal to the CSV written beside ``png``."""
    assert frame is not None and list(frame.columns) == list(DRAWN_COLUMNS)
    assert png.is_file() and drawn_path(png) == png.with_suffix(".csv")
    disk = pd.read_csv(drawn_path(png), keep_default_na=False, na_values=[""])
    assert list(disk.columns) == list(DRAWN_COLUMNS) and len(disk) == len(frame)
    for col in ("y", "lo", "hi", "x_lo", "x_hi"):
        np.testing.assert_array_equal(disk[col].to_numpy(float), frame[col].to_numpy(float))
    text = lambda f, c: ["" if pd.isna(v) else str(v) for v in f[c]]  # noqa: E731 - "" and None are empty cells
    for col in ("series", "color", "panel", "mark"):
        assert text(disk, col) == text(frame, col), col
    for item in _CURRENT:
        COUNTS[item] = COUNTS.get(item, 0) + len(frame)
    return frame


def by(frame: pd.DataFrame, **where) -> pd.DataFrame:
    mask = np.ones(len(frame), dtype=bool)
    for col, value in where.items():
        mask &= (frame[col] == value).to_numpy()
    return frame[mask]


def same(a, b, atol: float = 1e-12) -> None:
    np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=0, atol=atol)


def hex_of(color) -> str:
    from matplotlib.colors import to_hex

    return to_hex(color, keep_alpha=False)


# ----------------------------------------------------------------------------- Sec. 3 / verdict
def _cells() -> pd.DataFrame:
    """A joined cells table (sdbench aggregate): two panels, no-SD and two SD methods, a flagged
    cell, a sweep variant that the grid figures must not draw."""
    rng = np.random.default_rng(1)
    rows = []
    for dataset in ("code-edit", "chat"):
        for method, sd, k in (("none", "none", 0), ("ngram-k3", "ngram", 3), ("eagle-k2", "eagle", 2)):
            for b in (1, 4, 16):
                tps = float(rng.uniform(10, 100))
                sp = np.nan if sd == "none" else float(rng.uniform(0.5, 2.0))
                rows.append(dict(engine="vllm-cpu", model="tiny-target", dataset=dataset, method=method, sd_method=sd,
                                 num_speculative_tokens=k, batch_size=b, tokens_per_s=tps,
                                 tokens_per_s_ci_low=tps - 1.5, tokens_per_s_ci_high=tps + 2.5,
                                 speedup=1.0 if sd == "none" else sp,
                                 speedup_ci_low=np.nan if sd == "none" else sp - 0.1,
                                 speedup_ci_high=np.nan if sd == "none" else sp + 0.2,
                                 contaminated=(dataset == "chat" and method == "ngram-k3" and b == 4),
                                 acceptance_rate_per_pos=[] if sd == "none" else list(rng.uniform(0, 1, k)),
                                 mean_acceptance_length=1.0 if sd == "none" else 1.5 + b / 100, sweep=""))  # fmt: skip
    rows.append({**rows[-1], "method": "eagle-k2.t07", "sweep": "temperature", "tokens_per_s": 1e6})
    return pd.DataFrame(rows)


ROWS = (("output tokens / s", "tokens_per_s", "tokens_per_s_ci_low", "tokens_per_s_ci_high"),
        ("speedup over no SD", "speedup", "speedup_ci_low", "speedup_ci_high"))


@covers("fig01_end_to_end")
def test_fig01_draws_throughput_and_speedup_with_their_intervals(tmp_path: Path) -> None:
    from sdbench.analysis.endtoend import plot_throughput

    cells = _cells()
    png = tmp_path / "fig01.png"
    drawn = drawn_of(plot_throughput(cells, png), png)
    grid = cells[cells["sweep"] == ""]
    panel = "tiny-target / " + grid["dataset"] + " / vllm-cpu"
    assert "eagle-k2.t07" not in set(drawn["series"])  # a sweep variant is its own item's
    styles = method_styles(grid)
    for row_label, y, lo, hi in ROWS:
        lines = by(drawn, mark="line", ylabel=row_label)
        got = lines.set_index(["panel", "series", "x"]).sort_index()
        want = grid.assign(panel=panel, series=grid["method"], x=grid["batch_size"].astype(float)).set_index(
            ["panel", "series", "x"]).sort_index()  # fmt: skip
        assert got.index.tolist() == want.index.tolist()  # every panel x method x batch size, once, in its panel
        same(got["y"], want[y])
        same(got["lo"], want[lo])
        same(got["hi"], want[hi])
        assert got["label"].tolist() == [styles[m].label for m in got.index.get_level_values("series")]
        assert got["color"].tolist() == [styles[m].color for m in got.index.get_level_values("series")]
        assert set(got["xlabel"]) == {"batch size"}
        # A ring on each row around the flagged cell's own point: same panel, batch size and height.
        rings = by(drawn, mark="ring", ylabel=row_label).set_index(["panel", "series", "x"]).sort_index()
        flagged = grid[grid["contaminated"]]
        want_rings = flagged.assign(panel="tiny-target / " + flagged["dataset"] + " / vllm-cpu",
                                    series=flagged["method"], x=flagged["batch_size"].astype(float))  # fmt: skip
        want_rings = want_rings.set_index(["panel", "series", "x"]).sort_index()
        assert rings.index.tolist() == want_rings.index.tolist()
        same(rings["y"], want_rings[y])
        assert set(rings["color"]) == {"#ff0000"}  # red
    refs = by(drawn, mark="reference")
    assert sorted(refs["panel"]) == sorted(set(panel)) and set(refs["ylabel"]) == {"speedup over no SD"}
    assert refs["y"].tolist() == [1.0, 1.0]  # speedup 1, per panel
    assert by(drawn, mark="preempted").empty  # no cell preempted here
    # A preempted cell gets a square on both rows, at its own point.
    one = cells.assign(preempted=(cells["method"] == "ngram-k3") & (cells["batch_size"] == cells["batch_size"].max()))
    squares = by(drawn_of(plot_throughput(one, png), png), mark="preempted")
    marked = one[one["preempted"] & (one["sweep"] == "")]
    assert len(squares) == 2 * len(marked) and set(squares["series"]) == {"ngram-k3"}
    for row_label, y, _, _ in ROWS:
        at = by(squares, ylabel=row_label).sort_values("panel")
        same(at["y"], marked.sort_values("dataset")[y])
        assert set(at["color"]) == {"#ff8c00"}  # dark orange


@covers("ext02_acceptance_per_position")
def test_ext02_draws_the_mean_rate_per_draft_position(tmp_path: Path) -> None:
    from sdbench.analysis.endtoend import plot_acceptance_per_position

    cells = _cells()
    png = tmp_path / "ext02.png"
    drawn = drawn_of(plot_acceptance_per_position(cells, png), png)
    grid = cells[(cells["sweep"] == "") & (cells["sd_method"] != "none")]
    assert set(drawn["series"]) == {"ngram-k3", "eagle-k2"}
    for (dataset, method), rows in grid.groupby(["dataset", "method"]):
        line = by(drawn, panel=f"tiny-target / {dataset} / vllm-cpu", series=method)
        want = np.mean(np.stack(rows["acceptance_rate_per_pos"].to_list()), axis=0)
        assert line["x"].tolist() == list(range(1, len(want) + 1))
        same(line["y"], want)
        assert set(line["color"]) == {method_style(method).color}


def _points() -> pd.DataFrame:
    from sdbench.analysis.verdict import points_table

    return points_table(_cells())




@covers("ext00_verdict")
def test_ext00_draws_a_square_per_point_with_its_speedup_and_verdict(tmp_path: Path) -> None:
    from sdbench.analysis.verdict import plot_verdict

    points = _points()
    png = tmp_path / "ext00.png"
    labels = {"ngram-k3": "n-gram (3)"}
    drawn = drawn_of(plot_verdict(points, png, labels), png)
    squares = by(drawn, mark="square")
    styles = method_styles(points)
    want = points.assign(panel=points["model"] + " / " + points["dataset"] + " / " + points["engine"],
                         x=points["load"].astype(str))  # fmt: skip
    got = squares.set_index(["panel", "series", "x"]).sort_index()
    want = want.set_index(["panel", "method", "x"]).sort_index()
    assert got.index.tolist() == want.index.tolist()  # each point's square in its panel, at its load's tick
    same(got["y"], want["speedup"], atol=0.005)  # the speedup written in the square (two decimals)
    # The row the square is on reads as its method (the configured label, else the method's).
    assert got["label"].tolist() == [labels.get(m, styles[m].label) for m in got.index.get_level_values("series")]
    # Its colour is its verdict's, by the rule on the 95% interval: above 1 pays, below loses, else break-even.
    cells = _cells()  # the points' own flags, read off their cells: contaminated
    bad = cells[cells["contaminated"].astype(bool)]  # (none of them preempted)
    flagged = {(f"{m} / {d} / {e}", k, str(b)) for e, m, d, k, b in
               zip(bad["engine"], bad["model"], bad["dataset"], bad["method"], bad["batch_size"])}  # fmt: skip
    rule = [verdict_by_hand(lo, hi, key in flagged)
            for lo, hi, key in zip(want["speedup_ci_low"], want["speedup_ci_high"], want.index)]  # fmt: skip
    assert flagged and flagged <= set(want.index)
    assert got["color"].tolist() == [VERDICT_COLORS[v] for v in rule]
    assert {"pays", "loses", "undecided", "flagged"} <= set(rule)  # the input has squares of each kind it can
    assert got["note"].tolist() == rule
    taus = by(drawn, mark="text")
    for (dataset, method), rows in points.groupby(["dataset", "method"]):
        tau = by(taus, panel=f"tiny-target / {dataset} / vllm-cpu", series=method)
        same(tau["y"], [rows["mean_acceptance_length"].mean()], atol=0.005)
        assert tau["label"].tolist() == [labels.get(method, styles[method].label)]  # on its method's row
    assert by(drawn, mark="preempted").empty
    # A preempted point gets a frame inside its square.
    one = points.assign(preempted=points.index == points.index[0])
    framed = by(drawn_of(plot_verdict(one, png, {}), png), mark="preempted")
    assert framed[["series", "x"]].values.tolist() == [[one["method"].iloc[0], str(one["load"].iloc[0])]]
    assert framed["color"].tolist() == ["#ff8c00"]


# ----------------------------------------------------------------------------- Sec. 5
@covers("fig03_runtime_breakdown")
def test_fig03_draws_each_stage_fraction_per_method_and_batch_size(tmp_path: Path) -> None:
    from sdbench.analysis.breakdown import FRACTION_COLUMNS, STAGES, plot_breakdown

    rng = np.random.default_rng(2)
    rows = []
    for m in ("ngram", "none", "eagle"):
        for b in (1, 8):
            f = rng.dirichlet(np.ones(4))
            rows.append(dict(method=m, batch_size=b, num_steps=10, total_s=1.0, **dict(zip(FRACTION_COLUMNS, f))))
    table = pd.DataFrame(rows)
    png = tmp_path / "fig03.png"
    drawn = drawn_of(plot_breakdown(table, png, title="t"), png)
    bars = by(drawn, mark="bar")
    assert set(bars["series"]) == set(STAGES)
    # x as the figure reads it: the method's label under its group, the batch size under the bar.
    assert by(bars, series="propose")["x"].tolist()[:2] == ["w/o SD 1", "w/o SD 8"]  # no-SD first
    colors = {"propose": "#4c72b0", "verify": "#dd8452", "sample": "#55a868", "other": "#8c8c8c"}
    for r in table.itertuples(index=False):
        for stage in STAGES:
            bar = by(bars, series=stage, x=f"{method_style(r.method).label} {r.batch_size}")
            same(bar["y"], [getattr(r, f"{stage}_frac")])
            assert bar["color"].tolist() == [colors[stage]]
    groups = by(drawn, mark="group")
    assert groups["note"].tolist() == [method_style(m).label for m in ("none", "eagle", "ngram")]


@covers("tab02_memory")
def test_tab02_draws_analytical_and_measured_memory_per_cell(tmp_path: Path) -> None:
    from sdbench.analysis.memory import plot_memory

    df = pd.DataFrame(dict(cell=["t | none", "t | eagle", "t | ngram"], analytical_static_gib=[1.0, 1.2, 1.0],
                           measured_weights_gib=[0.9, np.nan, 1.1], peak_memory_gib=[2.0, 2.5, np.nan],
                           analytical_per_token_kib=[36.0, 40.0, 36.0], measured_kv_cache_gib=[1.0, 1.0, np.nan]))  # fmt: skip
    png = tmp_path / "tab02.png"
    drawn = drawn_of(plot_memory(df, png), png)
    for series, col in (("analytical_static_gib", "analytical_static_gib"),
                        ("analytical_per_token_kib", "analytical_per_token_kib")):  # fmt: skip
        rows = by(drawn, series=series)
        assert rows["x"].tolist() == df["cell"].tolist()
        same(rows["y"], df[col])
    measured = by(drawn, series="measured_weights_gib")
    same(measured["y"], df["measured_weights_gib"].fillna(0.0))  # drawn as 0, marked n/a
    assert measured["note"].fillna("").tolist() == ["", "n/a", ""]
    peak = by(drawn, series="peak_memory_gib")
    assert peak["x"].tolist() == ["t | none", "t | eagle"]  # NaN: not drawn
    same(peak["y"], [2.0, 2.5])
    notes = by(drawn, series="analytical_per_token_kib")["note"].tolist()
    assert notes[0] == f"1.00 GiB = {2**20 / 36:,.0f} tok" and pd.isna(notes[2])  # capacity of the measured cache


# ----------------------------------------------------------------------------- Sec. 6
def _traces() -> pd.DataFrame:
    from sdbench.traces.table import MethodTrace, make_trace_table

    rng = np.random.default_rng(3)
    spec = {m: {f"r{i}": rng.integers(1, 8, int(rng.integers(5, 30))).tolist() for i in range(8)}
            for m in ("ngram", "eagle")}  # fmt: skip
    table = make_trace_table(MethodTrace(rid, m, np.asarray(acc)) for m, reqs in spec.items() for rid, acc in reqs.items())
    return table.assign(dataset=pd.array(["toy"] * len(table), dtype="string"))


@covers("fig04_acceptance_heatmap")
def test_fig04_draws_every_accepted_length_at_its_request_and_position(tmp_path: Path) -> None:
    from sdbench.analysis.acceptance import plot_heatmaps

    traces = _traces()
    png = tmp_path / "fig04.png"
    drawn = drawn_of(save_png(plot_heatmaps(traces, "toy", max_position=20), png, dpi=60), png)
    assert set(drawn["mark"]) == {"cell"}
    for method in ("ngram", "eagle"):
        cells = drawn[drawn["panel"] == f"toy, {method_style(method).label}"]
        want = traces[(traces["method"] == method) & (traces["position"] < 20)]
        got = cells.set_index(["series", "x"])["y"].sort_index()
        want = want.set_index(["request_id", "position"])["acc_len"].sort_index()
        assert got.index.tolist() == [(str(r), int(p)) for r, p in want.index]
        same(got, want)


@covers("fig05_position_deciles")
def test_fig05_draws_decile_means_with_their_interval_bands(tmp_path: Path) -> None:
    from sdbench.analysis.acceptance import plot_position_deciles, position_deciles

    deciles = position_deciles(_traces(), per_class=None)
    png = tmp_path / "fig05.png"
    drawn = drawn_of(save_png(plot_position_deciles(deciles, "toy"), png, dpi=60), png)
    for method, d in deciles.groupby("method"):
        line, band = by(drawn, mark="line", series=method), by(drawn, mark="band", series=method)
        assert line["x"].tolist() == (d["interval"] + 1).tolist() == band["x"].tolist()
        same(line["y"], d["mean"])
        same(band["lo"], d["mean_ci_low"])
        same(band["hi"], d["mean_ci_high"])
        assert set(line["note"]) == {f"n={int(d['n_requests'].max())}"}  # the annotation


@covers("fig06_request_acceptance")
def test_fig06_draws_a_box_and_whiskers_per_method(tmp_path: Path) -> None:
    from sdbench.analysis.acceptance import plot_request_boxes, request_box_stats

    box = request_box_stats(_traces())
    png = tmp_path / "fig06.png"
    drawn = drawn_of(save_png(plot_request_boxes(box), png, dpi=60), png)
    for r in box.itertuples(index=False):
        b, w = by(drawn, mark="box", series=r.method), by(drawn, mark="whisker", series=r.method)
        same([b["y"].item(), b["lo"].item(), b["hi"].item()], [r.p50, r.p25, r.p75])
        same([w["lo"].item(), w["hi"].item()], [r.p5, r.p95])
        assert b["x"].item() == method_style(r.method).label and b["panel"].item() == "toy"


@covers("fig10_ngram_minus_eagle")
def test_fig10_draws_the_difference_per_request_and_position(tmp_path: Path) -> None:
    from sdbench.analysis.acceptance import ngram_minus_eagle, plot_difference

    diff = ngram_minus_eagle(_traces())
    png = tmp_path / "fig10.png"
    drawn = drawn_of(save_png(plot_difference(diff, "toy", None), png, dpi=60), png)
    got = drawn.set_index(["series", "x"])["y"].sort_index()
    want = diff.set_index(["request_id", "position"])["diff"].sort_index()
    assert got.index.tolist() == [(str(r), int(p)) for r, p in want.index]
    same(got, want)


# ----------------------------------------------------------------------------- Sec. 7
@covers("fig08_bleu_measured", "fig08_bleu_simulated")
def test_fig08_draws_the_relative_speedup_in_percent_per_bucket_and_batch_size(tmp_path: Path) -> None:
    from sdbench.analysis.bleu import BUCKET_LABELS, plot_heatmap

    speedups = pd.DataFrame([dict(bucket=bk, batch_size=b, relative_speedup=1.0 + 0.1 * i - 0.05 * j)
                             for i, bk in enumerate(BUCKET_LABELS[:4]) for j, b in enumerate((1, 8, 32))])  # fmt: skip
    buckets = pd.DataFrame(dict(request_id=[f"r{i}" for i in range(6)], bleu_order=4, bleu=0.1,
                                bucket=[BUCKET_LABELS[i % 4] for i in range(6)]))  # fmt: skip
    png = tmp_path / "fig08.png"
    drawn = drawn_of(plot_heatmap(speedups, buckets, png, title="x"), png)
    assert len(drawn) == len(speedups)  # the empty fifth bucket draws no cell
    got = drawn.set_index(["series", "x"])["y"].sort_index()
    want = speedups.set_index(["batch_size", "bucket"])["relative_speedup"].sort_index()
    assert got.index.tolist() == want.index.tolist()
    same(got, (want - 1.0) * 100.0)
    # Blue where n-gram is faster than EAGLE, red where slower (the colour drawn, by its sign).
    for r in drawn.itertuples(index=False):
        red, blue = int(r.color[1:3], 16), int(r.color[5:7], 16)
        assert (blue > red) if r.y > 0 else (red > blue) if r.y < 0 else True, r


# ----------------------------------------------------------------------------- Sec. 8
def _sim_results() -> pd.DataFrame:
    rows = []
    for d in ("gsm8k", "code"):
        for p, policies in (("eagle", ("fixed-2", "fixed-4", "oracle")), ("ngram", ("fixed-2", "oracle")),
                            ("combined", ("oracle",))):  # fmt: skip
            for i, policy in enumerate(policies):
                for b in (1, 4, 16):
                    rows.append(dict(dataset=d, proposer=p, policy=policy, batch_size=b,
                                     speedup=1.0 + 0.1 * i + 0.01 * b + (0.5 if d == "code" else 0)))  # fmt: skip
    return pd.DataFrame(rows)


@covers("fig09_fixed_vs_oracle")
def test_fig09_draws_every_policy_per_dataset_and_proposer(tmp_path: Path) -> None:
    from sdbench.simulator.figures import figure_fixed_vs_oracle

    results = _sim_results()
    png = tmp_path / "fig09.png"
    drawn = drawn_of(figure_fixed_vs_oracle(results, png), png)
    lines = by(drawn, mark="line")
    shown = results[results["proposer"].isin(["eagle", "ngram"])]
    for (d, p, policy), g in shown.groupby(["dataset", "proposer", "policy"]):
        line = by(lines, panel=f"{d} / {'EAGLE' if p == 'eagle' else 'n-gram'}", series=policy)
        assert line["x"].tolist() == sorted(g["batch_size"]) and set(line["label"]) == {policy}
        same(line["y"], g.sort_values("batch_size")["speedup"])
        if policy.startswith("oracle"):
            assert set(line["color"]) == {"#000000"}  # the oracle in black
    assert len(lines) == len(shown)


@covers("fig11_oracle_combine")
def test_fig11_draws_the_oracles_and_each_best_fixed_policy(tmp_path: Path) -> None:
    from sdbench.simulator.figures import figure_combining

    results = _sim_results()
    png = tmp_path / "fig11.png"
    drawn = drawn_of(figure_combining(results, png), png)
    for d, sub in results.groupby("dataset"):
        panel = by(drawn, panel=d, mark="line")
        assert set(panel["series"]) == {"Oracle_Combine", "Oracle_EAGLE", "Oracle_n-gram", "best fixed EAGLE",
                                        "best fixed n-gram"}  # fmt: skip
        for series, proposer in (("Oracle_Combine", "combined"), ("Oracle_EAGLE", "eagle"), ("Oracle_n-gram", "ngram")):
            want = sub[(sub["proposer"] == proposer) & (sub["policy"] == "oracle")].sort_values("batch_size")
            same(by(panel, series=series)["y"], want["speedup"])
        best = sub[(sub["proposer"] == "eagle") & sub["policy"].str.startswith("fixed-")].groupby("batch_size")["speedup"].max()
        line = by(panel, series="best fixed EAGLE")
        same(line["y"], best.sort_index())
        assert set(line["note"]) == {"fixed-4"}  # which fixed policy was best


@covers("ext03_compat_vs_exact")
def test_ext03_draws_compat_and_exact_per_policy(tmp_path: Path) -> None:
    from sdbench.simulator.figures import figure_compare

    table = _sim_results().rename(columns={"speedup": "exact"})
    table["compat"] = table["exact"] * 1.1
    png = tmp_path / "ext03.png"
    drawn = drawn_of(figure_compare(table, png), png)
    lines = by(drawn, mark="line")
    for mode in ("compat", "exact"):
        got = by(lines, note=mode).assign(dataset=lambda f: f["panel"].str.split(" / ").str[0],
                                          proposer=lambda f: f["panel"].str.split(" / ").str[1].str.split(" ").str[0])
        got = got.set_index(["dataset", "proposer", "series", "x"]).sort_index()
        want = table.set_index(["dataset", "proposer", "policy", "batch_size"]).sort_index()
        assert got.index.tolist() == want.index.tolist()
        same(got["y"], want[mode])


@covers("ext04_adaptive_policies")
def test_ext04_draws_policies_between_best_fixed_and_oracle_combine(tmp_path: Path) -> None:
    from sdbench.simulator.figures import figure_adaptive

    report = pd.DataFrame([dict(dataset=d, policy=p, batch_size=b, speedup=1.0 + i / 10 + b / 100,
                                best_fixed=1.0 + b / 50, oracle_combine=2.0 + b / 50)
                           for d in ("d0", "d1") for i, p in enumerate(("combined:adaptive", "eagle:dynamic-k"))
                           for b in (1, 4, 8)])  # fmt: skip
    png = tmp_path / "ext04.png"
    drawn = drawn_of(figure_adaptive(report, png), png)
    for d, sub in report.groupby("dataset"):
        ref = sub.drop_duplicates("batch_size").sort_values("batch_size")
        band = by(drawn, panel=d, mark="band")
        same(band["lo"], ref["best_fixed"])
        same(band["hi"], ref["oracle_combine"])
        same(by(drawn, panel=d, series="best fixed")["y"], ref["best_fixed"])
        same(by(drawn, panel=d, series="oracle-combine")["y"], ref["oracle_combine"])
        for policy, g in sub.groupby("policy"):
            same(by(drawn, panel=d, series=policy)["y"], g.sort_values("batch_size")["speedup"])


@covers("ext15_simulator_at_forced")
def test_ext15_draws_predicted_against_measured_with_the_measured_interval(tmp_path: Path) -> None:
    from sdbench.simulator.forcedcheck import plot_check

    table = pd.DataFrame(dict(speedup=[0.8, 1.2, 1.6], speedup_ci_low=[0.7, 1.1, 1.4], speedup_ci_high=[0.9, 1.3, 1.7],
                              predicted=[0.9, 1.0, 1.9], predicted_refit=[0.82, 1.18, 1.62]))  # fmt: skip
    png = tmp_path / "ext15.png"
    drawn = drawn_of(plot_check(table, str(png)), png)
    for col in ("predicted", "predicted_refit"):
        pts = by(drawn, series=col, mark="point")
        same(pts["x"], table["speedup"])
        same(pts["y"], table[col])
        same(pts["x_lo"], table["speedup_ci_low"])
        same(pts["x_hi"], table["speedup_ci_high"])


# ----------------------------------------------------------------------------- production questions
def _assert_method_lines(drawn: pd.DataFrame, table: pd.DataFrame, panel: pd.Series, x: str, ylabel: str, y: str,
                         lo: str | None = None, hi: str | None = None, method: str = "method") -> None:  # fmt: skip
    """method_lines drew ``y`` (interval ``lo``/``hi``) of every row of ``table`` at ``x`` in ``panel``."""
    lines = by(drawn, mark="line", ylabel=ylabel)
    got = lines.set_index(["panel", "series", "x"]).sort_index()
    want = table.assign(_panel=panel, _series=table[method], _x=table[x]).set_index(["_panel", "_series", "_x"]).sort_index()
    assert got.index.tolist() == want.index.tolist()
    same(got["y"], want[y])
    if lo:
        same(got["lo"], want[lo])
        same(got["hi"], want[hi])
    else:
        assert got["lo"].isna().all()
    styles = method_styles(table.assign(method=table[method]))
    assert got["color"].tolist() == [styles[m].color for m in got.index.get_level_values("series")]


@covers("ext07_cost")
def test_ext07_draws_cost_per_million_tokens_with_its_interval(tmp_path: Path) -> None:
    from sdbench.analysis.cost import plot_cost

    rows = [dict(engine="vllm-cpu", model="m", dataset=d, method=m, sd_method=m.split("-")[0], batch_size=b,
                 cost_per_1m_tokens=c, cost_per_1m_tokens_ci_low=c * 0.9, cost_per_1m_tokens_ci_high=c * 1.2,
                 currency="USD")
            for d in ("a", "b") for m in ("none", "ngram-k3") for b, c in ((1, 10.0), (4, 4.0), (16, 2.5))]  # fmt: skip
    table = pd.DataFrame(rows)
    png = tmp_path / "ext07.png"
    drawn = drawn_of(plot_cost(table, png), png)
    _assert_method_lines(drawn, table, "m / " + table["dataset"] + " / vllm-cpu", "batch_size", "USD per 1M output tokens",
                         "cost_per_1m_tokens", "cost_per_1m_tokens_ci_low", "cost_per_1m_tokens_ci_high")  # fmt: skip


@covers("ext16_energy_per_token")
def test_ext16_draws_tokens_per_s_and_joules_per_token_from_cells_metered_by_the_nvml_double(tmp_path: Path) -> None:
    """Cells timed on the LLM double with the NVML double as their meter (tests/support/energycells.py:
    joules per token by hand 0.5 / 0.4 without SD, 0.6 / 0.2 with it, at batch sizes 1 / 2)."""
    from sdbench.analysis.energy import energy_table, plot_energy
    from tests.support import energycells

    table = energy_table(energycells.joined(energycells.measure(energycells.nvml_meter)))
    png = tmp_path / "ext16.png"
    drawn = drawn_of(plot_energy(table, png), png)
    panel = pd.Series("m / d / e", index=table.index)
    _assert_method_lines(drawn, table, panel, "batch_size", "output tokens / s", "tokens_per_s",
                         "tokens_per_s_ci_low", "tokens_per_s_ci_high")  # fmt: skip
    _assert_method_lines(drawn, table, panel, "batch_size", "joules / output token", "joules_per_token",
                         "joules_per_token_ci_low", "joules_per_token_ci_high")  # fmt: skip
    joules = by(drawn, mark="line", ylabel="joules / output token").set_index(["series", "x"])["y"]
    same(joules.sort_index(), [0.6, 0.2, 0.5, 0.4])  # (ngram-k3, 1), (ngram-k3, 2), (none, 1), (none, 2)


@covers("ext08_proposal_length")
def test_ext08_draws_speedup_and_accepted_length_against_k(tmp_path: Path) -> None:
    from sdbench.analysis.proposal import plot_proposal_length

    table = pd.DataFrame([dict(engine="e", model="m", dataset="d", base_method=bm, method=f"{bm}.k{k}", sd_method="ngram",
                               num_speculative_tokens=k, batch_size=b, speedup=1 + k / 10 + b / 100,
                               speedup_ci_low=1 + k / 10 + b / 100 - 0.05, speedup_ci_high=1 + k / 10 + b / 100 + 0.07,
                               mean_acceptance_length=1 + k / 3)
                          for bm in ("ngram-k3", "eagle-k2") for k in (1, 2, 4) for b in (1, 8)])  # fmt: skip
    png = tmp_path / "ext08.png"
    drawn = drawn_of(plot_proposal_length(table, png), png)
    panel = "m / d / bs " + table["batch_size"].astype(str) + " / e"
    _assert_method_lines(drawn, table, panel, "num_speculative_tokens", "speedup over no SD", "speedup", "speedup_ci_low",
                         "speedup_ci_high", method="base_method")  # fmt: skip
    _assert_method_lines(drawn, table, panel, "num_speculative_tokens", "mean accepted length (tokens/step)",
                         "mean_acceptance_length", method="base_method")  # fmt: skip


@covers("ext10_temperature")
def test_ext10_draws_accepted_length_and_speedup_against_temperature(tmp_path: Path) -> None:
    from sdbench.analysis.temperature import plot_temperature

    table = pd.DataFrame([dict(engine="e", model="m", base_dataset="d", dataset=f"d.t{t}", method=m, sd_method="ngram",
                               num_speculative_tokens=3, batch_size=4, temperature=t, mean_acceptance_length=2 - t / 2,
                               speedup=1.5 - t / 3, speedup_ci_low=1.4 - t / 3, speedup_ci_high=1.6 - t / 3)
                          for m in ("ngram-k3", "eagle-k2") for t in (0.0, 0.5, 1.0)])  # fmt: skip
    png = tmp_path / "ext10.png"
    drawn = drawn_of(plot_temperature(table, png), png)
    panel = pd.Series("m / d / bs 4 / e", index=table.index)
    _assert_method_lines(drawn, table, panel, "temperature", "mean accepted length (tokens/step)", "mean_acceptance_length")
    _assert_method_lines(drawn, table, panel, "temperature", "speedup over no SD at the same T", "speedup",
                         "speedup_ci_low", "speedup_ci_high")  # fmt: skip


@covers("ext09_random_inputs")
def test_ext09_draws_real_and_random_speedups_with_their_intervals(tmp_path: Path) -> None:
    from sdbench.analysis.randominputs import plot_random_vs_real

    rows = [dict(dataset_random="code-rand", dataset_real="code", engine="e", model="m", method=m, sd_method=s,
                 batch_size=b, speedup_real=1.5 + b / 10, speedup_ci_low_real=1.4 + b / 10, speedup_ci_high_real=1.7 + b / 10,
                 speedup_random=0.9 + b / 10, speedup_ci_low_random=0.8 + b / 10, speedup_ci_high_random=1.0 + b / 10)
            for m, s in (("none", "none"), ("ngram-k3", "ngram"), ("eagle-k2", "eagle")) for b in (1, 4)]  # fmt: skip
    table = pd.DataFrame(rows)
    png = tmp_path / "ext09.png"
    drawn = drawn_of(plot_random_vs_real(table, png), png)
    sd = table[table["sd_method"] != "none"]
    for side, name in (("real", "code"), ("random", "code-rand")):
        bars = by(drawn, mark="bar", note=side)
        assert bars["series"].tolist() == sd["method"].tolist() and set(bars["label"]) == {name}
        assert bars["x"].tolist() == [f"{method_style(m).label} bs{b}" for m, b in zip(sd["method"], sd["batch_size"])]
        same(bars["y"], sd[f"speedup_{side}"])
        assert bars["color"].tolist() == [method_style(m).color for m in sd["method"]]
        same(bars["lo"], sd[f"speedup_ci_low_{side}"])
        same(bars["hi"], sd[f"speedup_ci_high_{side}"])


@covers("ext11_latency_throughput")
def test_ext11_draws_tpot_against_throughput_per_device_by_concurrency(tmp_path: Path) -> None:
    from sdbench.analysis.latency import plot_latency_throughput

    table = pd.DataFrame([dict(engine="e", model="m", dataset="d", method=m, sd_method=m.split("-")[0], concurrency=c,
                               devices=2, tokens_per_s_per_device=50.0 * c, tokens_per_s_min=90.0 * c,
                               tokens_per_s_max=110.0 * c, tpot_p50_ms=20.0 + c)
                          for m in ("none", "ngram-k3") for c in (1, 4, 16)])  # fmt: skip
    png = tmp_path / "ext11.png"
    drawn = drawn_of(plot_latency_throughput(table, png), png)
    for m, line in table.groupby("method"):
        got = by(drawn, series=m)
        same(got["x"], line["tokens_per_s_per_device"])
        same(got["y"], line["tpot_p50_ms"])
        same(got["x_lo"], line["tokens_per_s_min"] / 2)
        same(got["x_hi"], line["tokens_per_s_max"] / 2)
        assert got["note"].tolist() == line["concurrency"].astype(str).tolist()


@covers("ext17_goodput_frontier")
def test_ext17_draws_a_square_per_grid_target_in_its_regions_colour_and_a_star_at_the_targets(tmp_path: Path) -> None:
    from sdbench.analysis.goodputfrontier import plot_frontier

    regions = ["SD better", "no SD better", "undecided", "neither meets"]
    colors = {"SD better": "#b7e4b0", "no SD better": "#f4b6b0", "undecided": "#e6e6e6", "neither meets": "#8c8c8c"}
    rows = [dict(engine="e", model="m", dataset="d", method=m, sd_method=m.split("-")[0], num_speculative_tokens=3,
                 concurrency=c, point="grid", slo_ttft_ms=ttft, slo_tpot_ms=tpot, slo_e2e_ms=np.nan,
                 region=regions[(i + j + c) % 4], flags="contaminated" if c == 4 else "")
            for m in ("ngram-k3", "eagle3-k3") for c in (1, 4)
            for i, ttft in enumerate((10.0, 20.0, 40.0)) for j, tpot in enumerate((1.0, 2.0, 4.0))]  # fmt: skip
    rows.append(dict(rows[0], point="your targets", slo_ttft_ms=np.nan, slo_tpot_ms=3.0, slo_e2e_ms=500.0,
                     region="undecided"))  # fmt: skip
    table = pd.DataFrame(rows)
    png = tmp_path / "ext17.png"
    drawn = drawn_of(plot_frontier(table, png, {"ngram-k3": "n-gram", "eagle3-k3": "EAGLE-3"}), png)
    grid = table[table["point"] == "grid"]
    cells = by(drawn, mark="cell")
    assert len(cells) == len(grid) and set(drawn["mark"]) == {"cell", "target"}
    for r in grid.itertuples(index=False):
        label = "n-gram" if r.method == "ngram-k3" else "EAGLE-3"
        flag = " (flagged: contaminated)" if r.concurrency == 4 else ""
        got = cells[(cells["panel"] == f"m / d / e / {label}, concurrency {r.concurrency}{flag}")
                    & (cells["series"] == r.method) & np.isclose(cells["x"].astype(float), r.slo_tpot_ms)
                    & np.isclose(cells["y"], r.slo_ttft_ms)]  # fmt: skip
        assert got["note"].tolist() == [r.region] and got["color"].tolist() == [colors[r.region]]
    # No TTFT target: the star sits at the grid's loosest TTFT (40 ms), where every request meets it.
    star = by(drawn, mark="target")
    assert len(star) == 1 and star["panel"].iloc[0] == "m / d / e / n-gram, concurrency 1"
    same([float(star["x"].iloc[0]), star["y"].iloc[0]], [3.0, 40.0])
    assert star["note"].iloc[0] == "your targets: undecided"


@covers("ext12_speed_bench_categories")
def test_ext12_draws_a_bar_per_category_and_method_with_its_interval(tmp_path: Path) -> None:
    from sdbench.analysis.categories import plot_category_acceptance

    table = pd.DataFrame([dict(engine="e", model="m", dataset="speed", batch_size=4, method=m, sd_method=m.split("-")[0],
                               category=c, request_mean_acceptance_length=1.5 + i + j / 10,
                               request_mean_acceptance_length_ci_low=1.4 + i + j / 10,
                               request_mean_acceptance_length_ci_high=1.8 + i + j / 10)
                          for i, m in enumerate(("eagle-k2", "ngram-k3")) for j, c in enumerate(("coding", "", "math"))])  # fmt: skip
    png = tmp_path / "ext12.png"
    drawn = drawn_of(plot_category_acceptance(table, png), png)
    bars = by(drawn, mark="bar").set_index(["series", "x"]).sort_index()
    want = table.assign(x=table["category"].replace("", "(none)")).set_index(["method", "x"]).sort_index()
    assert bars.index.tolist() == want.index.tolist()
    same(bars["y"], want["request_mean_acceptance_length"])
    assert bars["color"].tolist() == [method_style(m).color for m in bars.index.get_level_values("series")]
    same(bars["lo"], want["request_mean_acceptance_length_ci_low"])
    same(bars["hi"], want["request_mean_acceptance_length_ci_high"])


def _forced_and_gap() -> tuple[pd.DataFrame, pd.DataFrame]:
    key = dict(engine="e", model="m", dataset="d")
    forced = pd.DataFrame([dict(**key, base_method=bm, batch_size=b, num_speculative_tokens=3, forced=f,
                                mean_acceptance_length=1 + f, speedup=1 + f / 2 - b / 100,
                                speedup_ci_low=0.95 + f / 2 - b / 100, speedup_ci_high=1.1 + f / 2 - b / 100)
                           for bm in ("ngram-k3", "eagle-k3") for b in (1, 8) for f in (0, 1, 2, 3)])  # fmt: skip
    gap = pd.DataFrame([dict(**key, base_method=bm, batch_size=b, real_acceptance_length=2.2, measured_speedup=1.3,
                             measured_speedup_ci_low=1.2, measured_speedup_ci_high=1.45, at_real_speedup=1.5, at_real_speedup_ci_low=1.4,
                             at_real_speedup_ci_high=1.6, ceiling_speedup=np.nan if b == 8 else 2.4, ceiling_speedup_ci_low=2.3,
                             ceiling_speedup_ci_high=2.5, ideal_speedup=4.0)
                        for bm in ("ngram-k3", "eagle-k3") for b in (1, 8)])  # fmt: skip
    return forced, gap


@covers("ext13_forced_acceptance")
def test_ext13_draws_speedup_against_forced_accepted_length_per_batch_size(tmp_path: Path) -> None:
    from sdbench.analysis.forced import plot_forced

    forced, gap = _forced_and_gap()
    png = tmp_path / "ext13.png"
    drawn = drawn_of(plot_forced(forced, gap, png, {"ngram-k3": "n-gram"}), png)
    for (bm, b), line in forced.groupby(["base_method", "batch_size"]):
        panel = f"{'n-gram' if bm == 'ngram-k3' else bm} / m / d"
        got = by(drawn, panel=panel, series=f"bs {b}", mark="line")
        same(got["x"], line["mean_acceptance_length"])
        same(got["y"], line["speedup"])
        same(got["lo"], line["speedup_ci_low"])
        same(got["hi"], line["speedup_ci_high"])
        own = by(drawn, panel=panel, series=f"bs {b}", mark="point")
        g = gap[(gap["base_method"] == bm) & (gap["batch_size"] == b)]
        same(own["x"], g["real_acceptance_length"])
        same(own[["y", "lo", "hi"]].to_numpy().ravel(), g[["measured_speedup", "measured_speedup_ci_low", "measured_speedup_ci_high"]].to_numpy().ravel())


@covers("ext14_sd_gap")
def test_ext14_draws_measured_at_real_ceiling_and_ideal_bars(tmp_path: Path) -> None:
    from sdbench.analysis.forced import plot_gap

    _, gap = _forced_and_gap()
    png = tmp_path / "ext14.png"
    drawn = drawn_of(plot_gap(gap, png, {}), png)
    bars = by(drawn, mark="bar")
    colors = {"measured_speedup": "#4c72b0", "at_real_speedup": "#55a868", "ceiling_speedup": "#c44e52",
              "ideal_speedup": "#bbbbbb"}  # fmt: skip
    assert set(bars["series"]) == set(colors)
    for col, lo, hi in (("measured_speedup", "measured_speedup_ci_low", "measured_speedup_ci_high"),
                        ("at_real_speedup", "at_real_speedup_ci_low", "at_real_speedup_ci_high"),
                        ("ceiling_speedup", "ceiling_speedup_ci_low", "ceiling_speedup_ci_high"), ("ideal_speedup", None, None)):  # fmt: skip
        for bm, sub in gap.groupby("base_method"):
            got = by(bars, series=col, panel=f"{bm} / m / d")
            assert got["x"].tolist() == sub["batch_size"].astype(str).tolist()  # the batch size's tick
            same(got["y"], sub[col].fillna(0))  # a missing ceiling is drawn as a 0 bar
            assert set(got["color"]) == {colors[col]}
            if lo:
                drawn_lo = np.where(sub[col].isna(), 0.0, sub[lo])
                same(got["lo"][sub[col].notna().to_numpy()], drawn_lo[sub[col].notna().to_numpy()])
                same(got["hi"][sub[col].notna().to_numpy()], sub[hi][sub[col].notna()])


# ----------------------------------------------------------------------------- the count
def test_every_figure_of_the_index_is_read_back() -> None:
    figures = {item.name for item in ITEMS if ".png" in item.suffixes}
    assert COVERED == figures, f"not read back: {sorted(figures - COVERED)}; unknown: {sorted(COVERED - figures)}"
    if set(COUNTS) == figures:  # the whole file ran: every figure drew marks and they were read back
        print("\nitem | marks read back")
        for item in ITEMS:
            if item.name in COUNTS:
                print(f"{item.name} | {COUNTS[item.name]}")
        assert all(COUNTS[name] > 0 for name in figures), COUNTS


@pytest.mark.parametrize("item", [i for i in ITEMS if ".png" not in i.suffixes], ids=lambda i: i.name)
def test_a_markdown_item_is_its_own_table(item) -> None:
    assert item.files == (".md",)
