"""The drawn table is read back from the figure (sdbench.drawn), not from what a plot function says.

Each test draws through a :class:`DrawnTable` and then changes or misplaces what matplotlib drew;
the table must say what the figure shows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sdbench.plotting import drawn_table, panel_axes, panel_grid, save_png, subplots


def test_a_mark_is_in_the_panel_of_the_axes_it_was_drawn_on(tmp_path: Path) -> None:
    fig, axes = panel_grid(2, 3.0, 2.0, 60, rows_per_panel=2)
    drawn = drawn_table(fig)
    for i, title in enumerate(("left", "right")):
        panel_axes(axes, i, 0, 2).set_title(title)
    drawn.plot(panel_axes(axes, 0, 0, 2), [1, 2], [3, 4], series="a")  # left, top row
    drawn.plot(panel_axes(axes, 0, 1, 2), [1, 2], [5, 6], series="b")  # left, lower row: no title of its own
    drawn.plot(panel_axes(axes, 0, 0, 2), [1, 2], [7, 8], series="c")  # meant for "right", drawn on the left
    frame = save_png(fig, tmp_path / "p.png", dpi=60)
    assert frame.groupby("series")["panel"].first().to_dict() == {"a": "left", "b": "left", "c": "left"}


def test_values_and_colours_are_read_after_drawing(tmp_path: Path) -> None:
    fig, ax = subplots()
    drawn = drawn_table(fig)
    (line,) = drawn.plot(ax, [1, 2, 3], [1.0, np.nan, 3.0], color="red", series="s")
    line.set_ydata([1.5, np.nan, 2.5])  # moved after the call: the table says where it is
    line.set_color("#123456")
    ring = drawn.scatter(ax, [1, 2], [4, 5], facecolors="none", edgecolors="red", series="s", mark="ring")
    ring.set_offsets([[1, 40], [2, 50]])
    fig.text(0.5, 0.5, "rehearsal, not measured")  # a figure-level text: not a data mark
    ax.plot([0, 1], [0, 1])  # drawn outside the table: a decoration
    frame = save_png(fig, tmp_path / "v.png", dpi=60)
    lines = frame[frame["mark"] == "line"]
    assert lines["x"].tolist() == [1.0, 3.0] and lines["y"].tolist() == [1.5, 2.5]  # NaN: nothing drawn
    assert set(lines["color"]) == {"#123456"}
    rings = frame[frame["mark"] == "ring"]
    assert rings["y"].tolist() == [40.0, 50.0] and set(rings["color"]) == {"#ff0000"}  # the edge of a hollow ring
    assert len(frame) == 4 and "rehearsal" not in " ".join(frame["note"].dropna())


def test_intervals_are_the_error_bars_drawn(tmp_path: Path) -> None:
    fig, ax = subplots()
    drawn = drawn_table(fig)
    drawn.errorbar(ax, [1, 2, 4], [1.0, 2.0, 3.0], yerr=[[0.1, np.nan, 0.3], [0.2, np.nan, 0.4]],
                   xerr=[[0.5, 0.5, 0.5], [1, 1, 1]], series="s")  # fmt: skip
    drawn.bar(ax, [0, 1], [2.0, 3.0], yerr=[[0.5, 1.0], [0.25, 0.5]], series="b", color=["#ff0000", "#00ff00"])
    drawn.fill_between(ax, [1, 2], [0.5, 0.6], [1.5, 1.8], series="band", color="blue")
    frame = save_png(fig, tmp_path / "e.png", dpi=60)
    points = frame[frame["series"] == "s"]
    assert points["lo"].tolist()[::2] == [0.9, 2.7] and points["hi"].tolist()[::2] == [1.2, 3.4]
    assert np.isnan(points["lo"].iloc[1]) and points["x_lo"].tolist() == [0.5, 1.5, 3.5]
    bars = frame[frame["series"] == "b"]
    assert bars["y"].tolist() == [2.0, 3.0] and bars["lo"].tolist() == [1.5, 2.0] and bars["hi"].tolist() == [2.25, 3.5]
    assert bars["color"].tolist() == ["#ff0000", "#00ff00"]
    band = frame[frame["mark"] == "band"]
    assert band["x"].tolist() == [1.0, 2.0] and band["lo"].tolist() == [0.5, 0.6] and band["hi"].tolist() == [1.5, 1.8]


def test_a_categorical_position_reads_as_its_tick(tmp_path: Path) -> None:
    from matplotlib.patches import Rectangle

    fig, (left, right) = subplots(1, 2)
    drawn = drawn_table(fig)
    drawn.patch(left, Rectangle((0.5, -0.5), 1, 1, color="#b7e4b0"), mark="square", series="m")
    left.text(1, 0, "1.23x")  # the value written in the square
    left.set_xticks([0, 1, 2], ["1", "4", "16"])  # loads at positions 0..2: categories
    left.set_yticks([0], ["n-gram"])
    drawn.plot(right, [1, 4, 8], [1.0, 2.0, 3.0], series="numeric")
    right.set_xscale("log", base=2)
    right.set_xticks([1, 8], ["1", "8"])  # labels that read as their positions: a numeric axis
    frame = save_png(fig, tmp_path / "c.png", dpi=60)
    square = frame[frame["mark"] == "square"].iloc[0]
    assert (square["x"], square["y"], square["label"], square["color"]) == ("4", 1.23, "n-gram", "#b7e4b0")
    assert frame[frame["series"] == "numeric"]["x"].tolist() == [1.0, 4.0, 8.0]


def test_an_empty_figure_has_an_empty_table(tmp_path: Path) -> None:
    fig, _ = panel_grid(1, 2.0, 2.0, 60)
    frame = save_png(fig, tmp_path / "n.png", dpi=60)
    assert frame.empty and pd.read_csv(tmp_path / "n.csv").empty
