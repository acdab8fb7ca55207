"""What a figure drew, read back from the figure: its drawn table.

A figure of the figure index draws its data marks through its :class:`DrawnTable`
(:func:`drawn_table`): ``drawn.errorbar(ax, ...)`` calls ``ax.errorbar(...)`` and registers the
artists matplotlib made, with what they stand for (``mark``, ``series``, ``label``, ``note``).
Nothing else is kept. When the figure is saved (:func:`sdbench.plotting.save_png`), the table is
read back from those artists as they are then, in data coordinates:

- ``panel``: the title of the axes the artist is on (the lower rows of a panel grid: the title
  of the panel's top axes, by position in the grid), ``xlabel``/``ylabel`` the axes' labels;
- ``x``, ``y``: the point of a line or scatter mark, a bar's centre and height, a square's
  centre and the number written in it, a box's median, a heatmap cell's value, a text's
  position and the number it writes; on a categorical axis (tick labels set at fixed
  positions) a position reads as the tick label nearest it (within half a tick spacing);
- ``lo``/``hi``, ``x_lo``/``x_hi``: the error bar's ends (segments of the error-bar
  collections), a band's edges, a box's quartiles or whiskers;
- ``color``: the mark's colour as drawn (hex): the line's, a bar's or square's face (its
  edge where it has no face), a ring's edge, a heatmap cell's colour from its colour map.

So a mark drawn on the wrong axes, at the wrong height or in the wrong colour is in the table as
drawn. Artists not drawn through the table (grids, legends, figure-level texts such as a
"rehearsal" mark, decorations) are not rows. The table is written beside the PNG as
``<name>.csv`` (:data:`DRAWN_COLUMNS`; docs/schema.md).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdbench import provenance

DRAWN_SUFFIX = ".csv"
# mark: line, point, bar, box, whisker, band, cell, square, preempted, ring, text, group,
# reference; x/y, lo/hi, x_lo/x_hi, color read back from the artists; series/label/note: what the
# drawing function said the mark stands for (docs/schema.md).
DRAWN_COLUMNS = ("panel", "xlabel", "ylabel", "mark", "series", "label", "x", "y", "lo", "hi", "x_lo", "x_hi",
                 "color", "note", "measured")  # fmt: skip
_DRAWN_ATTR = "_sdbench_drawn"
_ROWS_PER_PANEL_ATTR = "_sdbench_rows_per_panel"
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def drawn_path(png: str | os.PathLike[str]) -> Path:
    """Where the drawn table of the figure at ``png`` is written: beside it, ``<name>.csv``."""
    return Path(png).with_suffix(DRAWN_SUFFIX)


def drawn_table(fig: Any) -> DrawnTable:
    """The :class:`DrawnTable` of ``fig`` (created on first use; ``save_png`` writes it)."""
    table = getattr(fig, _DRAWN_ATTR, None)
    if table is None:
        table = DrawnTable()
        setattr(fig, _DRAWN_ATTR, table)
    return table


def set_rows_per_panel(fig: Any, rows: int) -> None:
    """Say that each panel of ``fig`` is ``rows`` axes tall (its title on the top one)."""
    setattr(fig, _ROWS_PER_PANEL_ATTR, rows)


# ----------------------------------------------------------------------------- values
def _scalar(v: Any) -> Any:
    """A plain Python value: a numpy scalar unwrapped, NaN/NA as None."""
    import pandas as pd

    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()
    return None if v is None or (not isinstance(v, (str, bytes)) and pd.isna(v)) else v


def _seq(v: Any, n: int) -> list[Any]:
    """``v`` as ``n`` plain values: a scalar repeated, a sequence checked to hold ``n``."""
    if v is None or isinstance(v, (str, bytes)) or not hasattr(v, "__len__"):
        return [_scalar(v)] * n
    values = [_scalar(x) for x in (v.tolist() if hasattr(v, "tolist") else list(v))]
    if len(values) != n:
        raise ValueError(f"drawn table: {len(values)} values for {n} marks")
    return values


def _finite(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _number(v: Any) -> float | None:
    """A drawn coordinate as a float (None where matplotlib draws nothing: NaN, masked)."""
    import numpy as np

    if v is None or v is np.ma.masked:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _hex(color: Any) -> str | None:
    """``color`` as ``#rrggbb`` (None for no colour: 'none' or fully transparent)."""
    from matplotlib.colors import to_hex, to_rgba

    if color is None or (isinstance(color, str) and color == "none"):
        return None
    rgba = to_rgba(color)
    return None if rgba[3] == 0 else to_hex(rgba, keep_alpha=False)


def _patch_color(patch: Any) -> str | None:
    """A patch's face colour, or its edge where it is not filled."""
    face = _hex(patch.get_facecolor()) if patch.get_fill() else None
    return face or _hex(patch.get_edgecolor())


def text_number(text: str) -> float | None:
    """The first number a text writes (``"τ=1.50"`` -> 1.5, ``"+5"`` -> 5.0), else None."""
    found = _NUMBER.search(text.replace("\u2212", "-"))
    return float(found.group()) if found else None


# ----------------------------------------------------------------------------- axes
def _panel(ax: Any) -> str:
    """The panel an axes belongs to: its title, or for a lower row of a panel grid the title of
    the panel's top axes (found by grid position)."""
    title = ax.get_title()
    rows = getattr(ax.figure, _ROWS_PER_PANEL_ATTR, 1)
    if not title and rows > 1 and ax.get_subplotspec() is not None:
        spec = ax.get_subplotspec()
        top, col = spec.rowspan.start - spec.rowspan.start % rows, spec.colspan.start
        for other in ax.figure.axes:
            s = other.get_subplotspec()
            if s is not None and s.rowspan.start == top and s.colspan.start == col and s.get_gridspec() is spec.get_gridspec():
                title = other.get_title()
                break
    return title.replace("\n", " / ")


def _ticks(axis: Any) -> tuple[list[float], list[str]] | None:
    """(positions, labels) of an axis whose ticks are categories: labels fixed at positions that
    do not read as their own positions (a batch-size axis labelled 1, 8, 16 at 1, 8, 16 is numeric)."""
    from matplotlib.ticker import FixedFormatter, FixedLocator, FuncFormatter

    # Labels given with the ticks (set_xticks(locs, labels), set_xticklabels) fix the formatter.
    formatter, locator = axis.get_major_formatter(), axis.get_major_locator()
    if not isinstance(formatter, (FixedFormatter, FuncFormatter)) or not isinstance(locator, FixedLocator):
        return None
    locs = [float(v) for v in locator.locs]
    labels = [str(s).replace("\n", " ") for s in formatter.format_ticks(locs)]
    if not locs or len(labels) < len(locs):
        return None
    numeric = all(_number_or_none(lab) is not None and math.isclose(_number_or_none(lab), loc)
                  for loc, lab in zip(locs, labels))  # fmt: skip
    return None if numeric else (locs, labels)


def _number_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _category(ticks: tuple[list[float], list[str]] | None, pos: float | None) -> Any:
    """The tick label at ``pos`` on a categorical axis (within half the smallest tick spacing),
    else ``pos`` itself."""
    if ticks is None or pos is None:
        return pos
    locs, labels = ticks
    gaps = [b - a for a, b in zip(sorted(locs), sorted(locs)[1:]) if b > a]
    reach = min(gaps) / 2 if gaps else 0.5
    best = min(range(len(locs)), key=lambda i: abs(locs[i] - pos))
    return labels[best] if abs(locs[best] - pos) < reach + 1e-9 else pos


@dataclass
class _Mark:
    """Artists drawn by one call, what they stand for, and how to read them back."""

    kind: str
    artists: tuple[Any, ...]
    mark: str
    series: Any = None
    label: Any = None
    note: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def axes(self) -> Any:
        return self.artists[0].axes


class DrawnTable:
    """What a figure drew, one row per mark (:data:`DRAWN_COLUMNS`), read back from its artists.

    The drawing methods call the matplotlib method of the same name on ``ax`` with the
    arguments given and register the artists it made; :meth:`frame` reads the values, panel
    and colour off those artists (module docstring). ``series`` names the data a mark belongs
    to (a method, policy, stage), ``label`` how the figure names it (legend entry), ``note`` what
    else it stands for (a verdict, a point's text); each a scalar or one value per point.
    """

    def __init__(self) -> None:
        self._marks: list[_Mark] = []

    def _register(self, kind: str, artists: Any, mark: str, series: Any, label: Any = None, note: Any = None,
                  **extra: Any) -> None:  # fmt: skip
        items = tuple(a for a in (artists if isinstance(artists, (list, tuple)) else [artists]) if a is not None)
        if items:
            self._marks.append(_Mark(kind, items, mark, series, label, note, extra))

    @staticmethod
    def _label(label: Any, legend: bool) -> dict[str, Any]:
        if label is None or isinstance(label, (list, tuple)) or hasattr(label, "tolist"):
            return {}
        return {"label": str(label) if legend else "_nolegend_"}

    # ------------------------------------------------------------------ drawing
    def plot(self, ax: Any, x: Any, y: Any, *args: Any, series: Any, label: Any = None, mark: str = "line",
             legend: bool = True, note: Any = None, **kwargs: Any) -> Any:  # fmt: skip
        """``ax.plot(x, y, *args, label=label, **kwargs)`` (``legend=False``: the label is
        recorded but kept out of an axes legend)."""
        out = ax.plot(x, y, *args, **self._label(label, legend), **kwargs)
        self._register("line", out[0], mark, series, label, note)
        return out

    def errorbar(self, ax: Any, x: Any, y: Any, *, yerr: Any = None, xerr: Any = None, series: Any,
                 label: Any = None, mark: str = "line", legend: bool = True, note: Any = None,
                 **kwargs: Any) -> Any:  # fmt: skip
        """``ax.errorbar(x, y, yerr=yerr, xerr=xerr, ...)``, read back with the intervals drawn."""
        out = ax.errorbar(x, y, yerr=yerr, xerr=xerr, **self._label(label, legend), **kwargs)
        self._register("errorbar", [out.lines[0], *out.lines[2]], mark, series, label, note, container=out)
        return out

    def scatter(self, ax: Any, x: Any, y: Any, *, series: Any, label: Any = None, mark: str = "point",
                note: Any = None, **kwargs: Any) -> Any:  # fmt: skip
        """``ax.scatter(x, y, **kwargs)``."""
        out = ax.scatter(x, y, **kwargs)
        self._register("scatter", out, mark, series, label, note)
        return out

    def bar(self, ax: Any, positions: Any, heights: Any, *args: Any, series: Any, label: Any = None,
            legend: bool = True, yerr: Any = None, note: Any = None, **kwargs: Any) -> Any:  # fmt: skip
        """``ax.bar(positions, heights, *args, yerr=yerr, ...)``: a ``bar`` per rectangle, x its
        centre (the tick label on a categorical axis), y its height."""
        if yerr is not None:
            kwargs["yerr"] = yerr
        out = ax.bar(positions, heights, *args, **self._label(label, legend), **kwargs)
        bars = out.errorbar.lines[2] if out.errorbar is not None else ()
        self._register("bar", [*out.patches, *bars], "bar", series, label, note, container=out)
        return out

    def fill_between(self, ax: Any, x: Any, lo: Any, hi: Any, *, series: Any, label: Any = None,
                     legend: bool = True, **kwargs: Any) -> Any:  # fmt: skip
        """``ax.fill_between(x, lo, hi, **kwargs)``: a ``band`` per x, lo/hi its edges (y empty)."""
        out = ax.fill_between(x, lo, hi, **self._label(label, legend), **kwargs)
        self._register("band", out, "band", series, label)
        return out

    def axhline(self, ax: Any, y: float, *, series: Any, **kwargs: Any) -> Any:
        """``ax.axhline(y, **kwargs)``: a ``reference`` mark, y its level (x empty)."""
        out = ax.axhline(y, **kwargs)
        self._register("reference", out, "reference", series)
        return out

    def imshow(self, ax: Any, values: Any, *, rows: Any, cols: Any, series_name: str = "", **kwargs: Any) -> Any:
        """``ax.imshow(values, **kwargs)``: a ``cell`` per drawn (finite) value of the image, series
        its row's name (``rows[i]``), x its column's (``cols[j]``), y the value, color the colour
        map's; ``note`` is ``series_name`` (what the rows are)."""
        out = ax.imshow(values, **kwargs)
        self._register("cell", out, "cell", None, note=series_name or None, rows=list(rows), cols=list(cols))
        return out

    def bxp(self, ax: Any, stats: list[dict[str, Any]], *, series: Any, **kwargs: Any) -> Any:
        """``ax.bxp(stats, **kwargs)``: per box a ``box`` row (y the median, lo/hi the box) and a
        ``whisker`` row (lo/hi the whiskers' ends), x its tick label."""
        out = ax.bxp(stats, **kwargs)
        self._register("box", [*out["boxes"], *out["medians"], *out["whiskers"]], "box", series, parts=out)
        return out

    def patch(self, ax: Any, patch: Any, *, mark: str, series: Any, label: Any = None, note: Any = None) -> Any:
        """``ax.add_patch(patch)``: x and y its centre, y the number written at its centre where a
        text is (a verdict square's speedup), color its face (its edge where unfilled)."""
        out = ax.add_patch(patch)
        self._register("patch", out, mark, series, label, note)
        return out

    def text(self, ax: Any, x: float, y: float, s: str, *, series: Any, mark: str = "text", label: Any = None,
             **kwargs: Any) -> Any:  # fmt: skip
        """``ax.text(x, y, s, **kwargs)``: y the number the text writes, note the text."""
        out = ax.text(x, y, s, **kwargs)
        self._register("text", out, mark, series, label)
        return out

    # ------------------------------------------------------------------ reading back
    def frame(self) -> Any:
        """The table read back from the artists: :data:`DRAWN_COLUMNS`, one row per mark, axes
        by axes (the figure's order), in drawing order within each."""
        import pandas as pd

        live = [m for m in self._marks if m.axes is not None]
        order: dict[int, tuple[int, int]] = {}
        figures = {id(m.axes.figure): m.axes.figure for m in live}
        for fig in figures.values():
            for i, ax in enumerate(fig.axes):
                for j, child in enumerate(ax.get_children()):
                    order[id(child)] = (i, j)
        live.sort(key=lambda m: order.get(id(m.artists[0]), (len(order), 0)))
        records = []
        for m in live:
            ax = m.axes
            head = {"panel": _panel(ax), "xlabel": ax.get_xlabel().replace("\n", " "),
                    "ylabel": ax.get_ylabel().replace("\n", " "), "mark": m.mark}  # fmt: skip
            points = _READERS[m.kind](m)
            n_tags = len({p.get("_i", i) for i, p in enumerate(points)})
            tags = {"series": _seq(m.series, n_tags) if m.kind != "cell" else None, "label": _seq(m.label, n_tags),
                    "note": _seq(m.note, n_tags)}  # fmt: skip
            for i, point in enumerate(points):
                t = point.pop("_i", i)  # the call's value that a point stands for (a box: two rows)
                if all(not _finite(point.get(k)) for k in ("y", "lo", "hi")) and point.get("note") is None:
                    continue  # matplotlib draws nothing there
                row = {**head, "series": tags["series"][t] if tags["series"] else None, "label": tags["label"][t],
                       "note": tags["note"][t]}  # fmt: skip
                row.update({k: v for k, v in point.items() if v is not None or k not in row})
                records.append(row)
        frame = pd.DataFrame.from_records(records, columns=list(DRAWN_COLUMNS))
        # measured: false when the command drawing it read rehearsal data (sdbench.provenance).
        frame[provenance.MEASURED] = pd.Series(provenance.measured(), index=frame.index, dtype=bool)
        for col in ("y", "lo", "hi", "x_lo", "x_hi"):
            frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
        return frame


# ----------------------------------------------------------------------------- readers
def _xy(ax: Any, x: Any, y: Any) -> tuple[Any, Any]:
    """A data point as the axes read it: categorical positions as their tick labels."""
    return _category(_ticks(ax.xaxis), _number(x)), _category(_ticks(ax.yaxis), _number(y))


def _line_points(line: Any) -> list[dict[str, Any]]:
    ax, color = line.axes, _hex(line.get_color())
    xs, ys = line.get_xdata(orig=False), line.get_ydata(orig=False)
    return [{"x": _xy(ax, x, None)[0], "y": _number(y), "color": color} for x, y in zip(xs, ys)]


def _interval_segments(collections: Any, n: int) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """(lo, hi, x_lo, x_hi) per point from error-bar line collections (one segment per point:
    vertical ones on y, horizontal ones on x; empty where nothing is drawn)."""
    lo, hi, x_lo, x_hi = ([None] * n for _ in range(4))
    for col in collections:
        segments = col.get_segments()
        if len(segments) != n:
            raise ValueError(f"drawn table: {len(segments)} error bars for {n} points")
        for i, seg in enumerate(segments):
            if len(seg) < 2:
                continue
            (xa, ya), (xb, yb) = seg[0], seg[-1]
            if xa == xb:
                lo[i], hi[i] = _number(min(ya, yb)), _number(max(ya, yb))
            else:
                x_lo[i], x_hi[i] = _number(min(xa, xb)), _number(max(xa, xb))
    return lo, hi, x_lo, x_hi


def _read_line(m: _Mark) -> list[dict[str, Any]]:
    return _line_points(m.artists[0])


def _read_errorbar(m: _Mark) -> list[dict[str, Any]]:
    container = m.extra["container"]
    data_line, _, bars = container.lines
    if data_line is None:
        raise ValueError("drawn table: an error bar without its points (fmt='none') cannot be read back")
    points = _line_points(data_line)
    lo, hi, x_lo, x_hi = _interval_segments(bars, len(points))
    for i, p in enumerate(points):
        p.update(lo=lo[i], hi=hi[i], x_lo=x_lo[i], x_hi=x_hi[i])
    return points


def _read_scatter(m: _Mark) -> list[dict[str, Any]]:
    import numpy as np

    col = m.artists[0]
    ax = col.axes
    offsets = np.ma.asarray(col.get_offsets())
    faces, edges = col.get_facecolors(), col.get_edgecolors()
    out = []
    for i, (x, y) in enumerate(offsets):
        face = _hex(faces[i % len(faces)]) if len(faces) else None
        edge = _hex(edges[i % len(edges)]) if len(edges) else None
        out.append({"x": _xy(ax, x, None)[0], "y": _number(y), "color": face or edge})
    return out


def _read_bar(m: _Mark) -> list[dict[str, Any]]:
    container = m.extra["container"]
    ax = m.axes
    groups = _group_labels(ax)
    out = []
    for rect in container.patches:
        centre = _number(rect.get_x() + rect.get_width() / 2)
        x = _xy(ax, centre, None)[0]
        if groups and centre is not None:
            x = f"{min(groups, key=lambda g: abs(g[0] - centre))[1]} {x}"
        out.append({"x": x, "y": _number(rect.get_height()), "color": _patch_color(rect)})
    if container.errorbar is not None:
        lo, hi, _, _ = _interval_segments(container.errorbar.lines[2], len(out))
        for i, p in enumerate(out):
            p.update(lo=lo[i], hi=hi[i])
    return out


def _group_labels(ax: Any) -> list[tuple[float, str]]:
    """(x, text) of the ``group`` texts drawn through the table on ``ax`` (a label under a group
    of bars, e.g. Fig. 3's method under its batch sizes)."""
    table = getattr(ax.figure, _DRAWN_ATTR, None)
    if table is None:
        return []
    return [(float(m.artists[0].get_position()[0]), m.artists[0].get_text())
            for m in table._marks if m.kind == "text" and m.mark == "group" and m.axes is ax]  # fmt: skip


def _read_band(m: _Mark) -> list[dict[str, Any]]:
    ax = m.axes
    edges: dict[float, list[float]] = {}
    for path in m.artists[0].get_paths():
        for x, y in path.vertices:
            if math.isfinite(x) and math.isfinite(y):
                edges.setdefault(float(x), []).append(float(y))
    color = _hex(m.artists[0].get_facecolor()[0]) if len(m.artists[0].get_facecolor()) else None
    return [{"x": _xy(ax, x, None)[0], "lo": min(ys), "hi": max(ys), "color": color} for x, ys in sorted(edges.items())]


def _read_reference(m: _Mark) -> list[dict[str, Any]]:
    line = m.artists[0]
    ys = line.get_ydata(orig=False)
    return [{"x": None, "y": _number(ys[0]), "color": _hex(line.get_color())}]


def _read_cell(m: _Mark) -> list[dict[str, Any]]:
    import numpy as np

    image = m.artists[0]
    values = np.ma.asarray(image.get_array(), dtype=float)
    rows, cols = m.extra["rows"], m.extra["cols"]
    if values.shape != (len(rows), len(cols)):
        raise ValueError(f"drawn table: an image of {values.shape} for {len(rows)} rows x {len(cols)} columns")
    colors = image.to_rgba(values)
    out = []
    for (i, j), v in np.ndenumerate(np.ma.filled(values, np.nan)):
        if math.isfinite(v):
            out.append({"series": _scalar(rows[i]), "x": _scalar(cols[j]), "y": float(v), "color": _hex(colors[i, j])})
    return out


def _read_box(m: _Mark) -> list[dict[str, Any]]:
    parts = m.extra["parts"]
    ax = m.axes
    out = []
    for i, (box, median) in enumerate(zip(parts["boxes"], parts["medians"])):
        verts = box.get_path().vertices if hasattr(box, "get_path") else box.get_xydata()
        xs, ys = [float(v[0]) for v in verts], [float(v[1]) for v in verts]
        x = _xy(ax, (min(xs) + max(xs)) / 2, None)[0]
        whiskers = [float(y) for w in parts["whiskers"][2 * i : 2 * i + 2] for y in w.get_ydata()]
        color = _patch_color(box) if hasattr(box, "get_fill") else _hex(box.get_color())
        med = _number(median.get_ydata()[0])
        out.append({"_i": i, "mark": "box", "x": x, "y": med, "lo": min(ys), "hi": max(ys), "color": color})
        out.append({"_i": i, "mark": "whisker", "x": x, "y": med, "lo": min(whiskers), "hi": max(whiskers),
                    "color": color})
    return out


def _text_at(ax: Any, x: float, y: float) -> Any:
    """The text drawn at data point (x, y) of ``ax`` (None if none is)."""
    for t in ax.texts:
        if t.get_transform() != ax.transData:
            continue
        tx, ty = t.get_position()
        if math.isclose(float(tx), x, abs_tol=1e-9) and math.isclose(float(ty), y, abs_tol=1e-9):
            return t
    return None


def _read_patch(m: _Mark) -> list[dict[str, Any]]:
    patch = m.artists[0]
    ax = m.axes
    box = patch.get_bbox() if hasattr(patch, "get_bbox") else patch.get_extents()
    cx, cy = (box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2
    x, y_label = _xy(ax, cx, cy)
    text = _text_at(ax, cx, cy)
    value = text_number(text.get_text()) if text is not None else cy
    row = {"x": x, "y": value, "color": _patch_color(patch)}
    if isinstance(y_label, str):  # a categorical row: the label it reads
        row["label"] = y_label
    return [row]


def _read_text(m: _Mark) -> list[dict[str, Any]]:
    text = m.artists[0]
    ax = m.axes
    px, py = text.get_position()
    on_data = text.get_transform() == ax.transData
    x, y_label = _xy(ax, px, py if on_data else None)
    row = {"x": x, "y": text_number(text.get_text()), "color": _hex(text.get_color()), "note": text.get_text()}
    if isinstance(y_label, str):
        row["label"] = y_label
    if m.mark == "group":  # a label under a group of bars: x where it is centred, no value
        row["x"], row["y"] = _number(px), None
    return [row]


_READERS = {"line": _read_line, "errorbar": _read_errorbar, "scatter": _read_scatter, "bar": _read_bar,
            "band": _read_band, "reference": _read_reference, "cell": _read_cell, "box": _read_box,
            "patch": _read_patch, "text": _read_text}  # fmt: skip
