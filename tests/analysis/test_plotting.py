"""The figure helper: Agg backend, atomic and byte-stable PNGs, figures closed."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sdbench.plotting import pyplot, save_png, subplots


def _figure():
    fig, ax = subplots(figsize=(3, 2))
    ax.plot([1, 2, 3], [3, 1, 2], marker="o")
    ax.set_title("probe")
    return fig


def test_agg_backend_and_byte_stable_png(tmp_path: Path) -> None:
    assert pyplot().get_backend().lower() == "agg"
    a, b = tmp_path / "a.png", tmp_path / "sub" / "b.png"
    save_png(_figure(), a, dpi=80)
    save_png(_figure(), b, dpi=80)
    assert a.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert a.read_bytes() == b.read_bytes()  # no "Software" (matplotlib version) entry, no timestamp
    assert b"matplotlib" not in a.read_bytes()
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["a.png", "b.png"]
    assert pyplot().get_fignums() == []  # closed


def test_failed_save_leaves_nothing_and_closes(tmp_path: Path) -> None:
    fig = _figure()
    with pytest.raises(TypeError):
        save_png(fig, tmp_path / "bad.png", dpi=80, no_such_option=1)
    assert list(tmp_path.iterdir()) == []
    assert pyplot().get_fignums() == []


def test_adaptive_policies_wrap_into_a_grid_with_one_legend(tmp_path: Path) -> None:
    # The default's five datasets were one 2190 x 430 px strip (5.1:1).
    from PIL import Image

    from sdbench.simulator.figures import figure_adaptive

    rows = [dict(dataset=f"d{i}", policy=p, batch_size=b, speedup=1.0 + i / 10, best_fixed=1.0, oracle_combine=2.0)
            for i in range(5) for p in ("combined:adaptive", "eagle:dynamic-k") for b in (1, 4, 8)]  # fmt: skip
    out = tmp_path / "ext04.png"
    figure_adaptive(pd.DataFrame(rows), out)
    w, h = Image.open(out).size
    assert w <= 3000 and w / h <= 4.0


def test_drawn_table_records_what_is_drawn_and_is_written_beside_the_png(tmp_path: Path) -> None:
    from sdbench.plotting import DRAWN_COLUMNS, drawn_path, drawn_table

    fig, (a1, a2) = subplots(1, 2, figsize=(4, 2))
    drawn = drawn_table(fig)
    assert drawn_table(fig) is drawn  # one per figure
    drawn.errorbar(a1, [1, 2, 4], [1.0, float("nan"), 3.0], yerr=[[0.1, 0.1, 0.5], [0.2, 0.2, 1.0]], series="m",
                   label="M")  # fmt: skip
    drawn.errorbar(a1, [1], [2.0], xerr=0.5, series="s", mark="point")  # symmetric, on x
    drawn.bar(a2, [0, 1], [5.0, 6.0], series="b", yerr=1.0)
    a2.set_xticks([0, 1], ["x", "y"])  # categories: each bar reads as its tick
    drawn.axhline(a2, 1.0, series="ref")
    a1.set(title="left\npanel", xlabel="batch size", ylabel="speedup")
    frame = save_png(fig, tmp_path / "f.png", dpi=50)
    assert list(frame.columns) == list(DRAWN_COLUMNS)
    line = frame[frame["series"] == "m"]
    assert line["x"].tolist() == [1, 4]  # the NaN point is not drawn, not recorded
    assert line["lo"].tolist() == [0.9, 2.5] and line["hi"].tolist() == [1.2, 4.0]
    assert set(line["panel"]) == {"left / panel"} and set(line["ylabel"]) == {"speedup"}
    point = frame[frame["series"] == "s"].iloc[0]
    assert (point["x_lo"], point["x_hi"], point["mark"]) == (0.5, 1.5, "point") and pd.isna(point["lo"])
    bars = frame[frame["series"] == "b"]
    assert bars["x"].tolist() == ["x", "y"] and bars["lo"].tolist() == [4.0, 5.0] and set(bars["panel"]) == {""}
    assert frame[frame["mark"] == "reference"]["y"].tolist() == [1.0]
    disk = pd.read_csv(drawn_path(tmp_path / "f.png"))
    assert disk["y"].tolist() == frame["y"].tolist() and len(disk) == 6


def test_only_a_figure_with_a_drawn_table_gets_one_and_a_failed_save_leaves_neither(tmp_path: Path) -> None:
    from sdbench.plotting import drawn_table

    assert save_png(_figure(), tmp_path / "plain.png", dpi=50) is None  # drew without recording: no table
    fig = _figure()
    drawn_table(fig).plot(fig.axes[0], [1], [1.0], series="s")
    with pytest.raises(TypeError):
        save_png(fig, tmp_path / "bad.png", dpi=80, no_such_option=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.png"]
