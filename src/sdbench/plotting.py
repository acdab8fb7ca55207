"""Figures: matplotlib on the Agg backend, selected when the first figure is made, and saved
atomically as byte-stable PNGs.

matplotlib is imported by :func:`pyplot` only, so importing a module that draws figures costs
nothing until it draws one. :func:`save_png` writes to a temporary file beside the destination
and renames it (a figure is complete or absent), without the "Software" metadata entry that
names the matplotlib version (the same figure gives the same bytes), and closes the figure even
when saving fails.

Every figure of the figure index also hands back what it drew: its :class:`DrawnTable`
(:func:`drawn_table`) is filled by the drawing calls themselves (``drawn.errorbar(ax, ...)`` draws
and records the same values), and :func:`save_png` writes it beside the PNG as ``<name>.csv``
(:data:`DRAWN_COLUMNS`, one row per mark; docs/schema.md) and returns it.

A figure drawn from rehearsal data (:mod:`sdbench.provenance`) is marked by :func:`save_png`,
the one place every figure is saved: "rehearsal, not measured" across it, in its title and in the
PNG's ``Warning`` text chunk; its drawn table says ``measured`` false.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from sdbench import provenance
from sdbench.io import atomic_path

# The PNG text chunk that names a rehearsal figure (read back with PIL: ``Image.open(p).text``).
PNG_MARK_KEY = "Warning"


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def subplots(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """``plt.subplots(*args, **kwargs)`` on the Agg backend: ``(figure, axes)``."""
    return pyplot().subplots(*args, **kwargs)


def save_png(fig: Any, path: str | os.PathLike[str], dpi: int, **savefig_kwargs: Any) -> Any:
    """Write ``fig`` to ``path`` as PNG at ``dpi`` atomically, then close it (also on error).

    A figure with a :class:`DrawnTable` gets it written too, to :func:`drawn_path` of ``path``
    (renamed into place after the PNG: a failed save leaves neither); returns that table as a
    DataFrame (None for a figure without one).

    ``savefig_kwargs`` go to ``Figure.savefig`` (e.g. ``bbox_inches="tight"``). A figure wider
    than :data:`MAX_WIDTH_PX` at ``dpi`` is saved at the dpi that fits (every figure a reader opens
    stays at most that wide). A figure of a rehearsal command gets the rehearsal mark
    (:func:`sdbench.provenance.mark_figure`; :data:`PNG_MARK_KEY` in the PNG).
    """
    width = fig.get_figwidth()
    if width * dpi > MAX_WIDTH_PX:
        dpi = int(MAX_WIDTH_PX / width)
    drawn = getattr(fig, _DRAWN_ATTR, None)
    try:
        frame = None if drawn is None else drawn.frame()
        metadata = {"Software": None}
        if provenance.mark_figure(fig):  # after the drawn table: its panels keep their own titles
            metadata[PNG_MARK_KEY] = provenance.MARK
        with contextlib.ExitStack() as stack:
            if frame is not None:  # renamed into place only after the PNG is: both or neither
                frame.to_csv(stack.enter_context(atomic_path(drawn_path(path))), index=False)
            with atomic_path(path) as tmp:
                fig.savefig(tmp, format="png", dpi=dpi, metadata=metadata, **savefig_kwargs)
    finally:
        pyplot().close(fig)
    return frame


# ----------------------------------------------------------------------------- drawn tables
DRAWN_SUFFIX = ".csv"
# panel/xlabel/ylabel: the axes' title and axis labels as drawn; mark: line, point, bar, box,
# whisker, band, cell, square, ring, text, reference; lo/hi: the interval drawn on y (error bar,
# band, box, whisker), x_lo/x_hi: on x; note: what else the mark shows (its colour's class, its text);
# measured: false when the figure was drawn from rehearsal data (sdbench.provenance).
DRAWN_COLUMNS = ("panel", "xlabel", "ylabel", "mark", "series", "label", "x", "y", "lo", "hi", "x_lo", "x_hi", "note",
                 "measured")  # fmt: skip
_DRAWN_ATTR = "_sdbench_drawn"


def drawn_path(png: str | os.PathLike[str]) -> Path:
    """Where the drawn table of the figure at ``png`` is written: beside it, ``<name>.csv``."""
    return Path(png).with_suffix(DRAWN_SUFFIX)


def drawn_table(fig: Any) -> DrawnTable:
    """The :class:`DrawnTable` of ``fig`` (created on first use; :func:`save_png` writes it)."""
    table = getattr(fig, _DRAWN_ATTR, None)
    if table is None:
        table = DrawnTable()
        setattr(fig, _DRAWN_ATTR, table)
    return table


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


def _err(values: list[Any], err: Any) -> tuple[list[Any], list[Any]]:
    """Absolute (lo, hi) of matplotlib's ``yerr``/``xerr``: None, symmetric (scalar or one
    value per mark) or ``[below, above]`` (two sequences)."""
    n = len(values)
    if err is None:
        return [None] * n, [None] * n
    pair = not isinstance(err, (str, bytes)) and hasattr(err, "__len__") and len(err) == 2
    if pair and all(hasattr(e, "__len__") for e in err):
        below, above = _seq(err[0], n), _seq(err[1], n)
    else:
        below = above = _seq(err, n)
    lo = [None if v is None or b is None else v - b for v, b in zip(values, below)]
    hi = [None if v is None or a is None else v + a for v, a in zip(values, above)]
    return lo, hi


class DrawnTable:
    """What a figure drew, one row per mark (:data:`DRAWN_COLUMNS`).

    The drawing methods (:meth:`plot`, :meth:`errorbar`, :meth:`bar`, ...) call the matplotlib
    method of the same name on ``ax`` with the arguments given and record the same x/y values,
    so the table cannot disagree with the figure; :meth:`add` records a mark drawn otherwise.
    ``series`` names the data a mark belongs to (a method, policy, stage), ``label`` how the
    figure shows it (legend or tick label). A mark with no y and no interval (NaN: matplotlib
    draws nothing there) is not recorded. ``panel``, ``xlabel`` and ``ylabel`` are read off the
    axes when the table is made, so they say what the figure says.
    """

    def __init__(self) -> None:
        self._rows: list[tuple[Any, str | None, dict[str, Any]]] = []

    def add(self, ax: Any, mark: str, series: Any, x: Any, y: Any, *, lo: Any = None, hi: Any = None,
            x_lo: Any = None, x_hi: Any = None, label: Any = None, note: Any = None,
            panel: str | None = None) -> None:  # fmt: skip
        """Record marks (scalars, or equally long sequences, one mark each) drawn on ``ax``;
        ``panel`` where the axes' title does not name it (the lower rows of a panel)."""
        lengths = [len(v) for v in (x, y, lo, hi, x_lo, x_hi, series, label, note)
                   if v is not None and not isinstance(v, (str, bytes)) and hasattr(v, "__len__")]  # fmt: skip
        n = max(lengths, default=1)
        cols = {"mark": _seq(mark, n), "series": _seq(series, n), "label": _seq(label, n), "x": _seq(x, n),
                "y": _seq(y, n), "lo": _seq(lo, n), "hi": _seq(hi, n), "x_lo": _seq(x_lo, n),
                "x_hi": _seq(x_hi, n), "note": _seq(note, n)}  # fmt: skip
        for i in range(n):
            row = {k: v[i] for k, v in cols.items()}
            if all(row[k] is None for k in ("y", "lo", "hi")):
                continue
            self._rows.append((ax, panel, row))

    def plot(self, ax: Any, x: Any, y: Any, *args: Any, series: Any, label: Any = None, mark: str = "line",
             legend: bool = True, panel: str | None = None, note: Any = None, **kwargs: Any) -> Any:  # fmt: skip
        """``ax.plot(x, y, *args, label=label, **kwargs)``, recorded (``legend=False``: the
        label is recorded but kept out of an axes legend)."""
        out = ax.plot(x, y, *args, **self._label(label, legend), **kwargs)
        self.add(ax, mark, series, x, y, label=label, note=note, panel=panel)
        return out

    def errorbar(self, ax: Any, x: Any, y: Any, *, yerr: Any = None, xerr: Any = None, series: Any,
                 label: Any = None, mark: str = "line", legend: bool = True, panel: str | None = None,
                 note: Any = None, **kwargs: Any) -> Any:  # fmt: skip
        """``ax.errorbar(x, y, yerr=yerr, xerr=xerr, ...)``, recorded with the intervals drawn."""
        out = ax.errorbar(x, y, yerr=yerr, xerr=xerr, **self._label(label, legend), **kwargs)
        n = _len(x, y)
        xs, ys = _seq(x, n), _seq(y, n)
        lo, hi = _err(ys, yerr)
        x_lo, x_hi = _err(xs, xerr)
        self.add(ax, mark, series, xs, ys, lo=lo, hi=hi, x_lo=x_lo, x_hi=x_hi, label=label, note=note, panel=panel)
        return out

    def scatter(self, ax: Any, x: Any, y: Any, *, series: Any, label: Any = None, mark: str = "point",
                panel: str | None = None, note: Any = None, **kwargs: Any) -> Any:  # fmt: skip
        """``ax.scatter(x, y, **kwargs)``, recorded."""
        out = ax.scatter(x, y, **kwargs)
        self.add(ax, mark, series, x, y, label=label, note=note, panel=panel)
        return out

    def bar(self, ax: Any, positions: Any, heights: Any, *args: Any, series: Any, at: Any = None,
            label: Any = None, legend: bool = True, yerr: Any = None, panel: str | None = None,
            note: Any = None, **kwargs: Any) -> Any:  # fmt: skip
        """``ax.bar(positions, heights, *args, yerr=yerr, ...)``, recorded at ``at`` (the
        category each bar stands for, as its tick reads; default the positions)."""
        if yerr is not None:
            kwargs["yerr"] = yerr
        out = ax.bar(positions, heights, *args, **self._label(label, legend), **kwargs)
        n = _len(positions, heights)
        ys = _seq(heights, n)
        lo, hi = _err(ys, yerr)
        self.add(ax, "bar", series, positions if at is None else at, ys, lo=lo, hi=hi, label=label, note=note,
                 panel=panel)  # fmt: skip
        return out

    def fill_between(self, ax: Any, x: Any, lo: Any, hi: Any, *, series: Any, label: Any = None,
                     legend: bool = True, panel: str | None = None, **kwargs: Any) -> Any:  # fmt: skip
        """``ax.fill_between(x, lo, hi, **kwargs)``, recorded as a band (y empty)."""
        out = ax.fill_between(x, lo, hi, **self._label(label, legend), **kwargs)
        self.add(ax, "band", series, x, None, lo=lo, hi=hi, label=label, panel=panel)
        return out

    def axhline(self, ax: Any, y: float, *, series: Any, panel: str | None = None, **kwargs: Any) -> Any:
        """``ax.axhline(y, **kwargs)``, recorded as a reference mark (x empty)."""
        out = ax.axhline(y, **kwargs)
        self.add(ax, "reference", series, None, y, panel=panel)
        return out

    def imshow(self, ax: Any, values: Any, *, rows: Any, cols: Any, series_name: str = "",
               panel: str | None = None, **kwargs: Any) -> Any:  # fmt: skip
        """``ax.imshow(values, **kwargs)``, recorded one row per drawn (finite) cell: ``series``
        the cell's row (``rows[i]``), ``x`` its column (``cols[j]``), ``y`` its value; ``note``
        is ``series_name`` (what the rows are)."""
        import numpy as np

        out = ax.imshow(values, **kwargs)
        mat = np.ma.filled(np.ma.asarray(values, dtype=float), np.nan)
        i, j = np.nonzero(np.isfinite(mat))
        rows, cols = list(rows), list(cols)
        self.add(ax, "cell", [rows[a] for a in i], [cols[b] for b in j], mat[i, j],
                 note=series_name or None, panel=panel)  # fmt: skip
        return out

    def bxp(self, ax: Any, stats: list[dict[str, Any]], *, series: Any, panel: str | None = None, **kwargs: Any) -> Any:
        """``ax.bxp(stats, **kwargs)``, recorded per box: a ``box`` row (y the median, lo/hi
        the box) and a ``whisker`` row (lo/hi the whiskers), at the box's label."""
        out = ax.bxp(stats, **kwargs)
        names = _seq(series, len(stats))
        for name, s in zip(names, stats):
            self.add(ax, "box", name, s.get("label"), s["med"], lo=s["q1"], hi=s["q3"], label=s.get("label"), panel=panel)
            self.add(ax, "whisker", name, s.get("label"), s["med"], lo=s["whislo"], hi=s["whishi"],
                     label=s.get("label"), panel=panel)  # fmt: skip
        return out

    @staticmethod
    def _label(label: Any, legend: bool) -> dict[str, Any]:
        if label is None or isinstance(label, (list, tuple)) or hasattr(label, "tolist"):
            return {}
        return {"label": str(label) if legend else "_nolegend_"}

    def frame(self) -> Any:
        """The table: :data:`DRAWN_COLUMNS`, one row per mark in drawing order (``measured``:
        :func:`sdbench.provenance.measured` of the command drawing it)."""
        import pandas as pd

        records = []
        for ax, panel, row in self._rows:
            title = ax.get_title() if panel is None else panel
            records.append({"panel": title.replace("\n", " / "), "xlabel": ax.get_xlabel().replace("\n", " "),
                            "ylabel": ax.get_ylabel().replace("\n", " "), **row})  # fmt: skip
        frame = pd.DataFrame.from_records(records, columns=list(DRAWN_COLUMNS))
        frame[provenance.MEASURED] = pd.Series(provenance.measured(), index=frame.index, dtype=bool)
        for col in ("y", "lo", "hi", "x_lo", "x_hi"):
            frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
        return frame


def _len(*values: Any) -> int:
    return max((len(v) for v in values if v is not None and not isinstance(v, (str, bytes)) and hasattr(v, "__len__")),
               default=1)  # fmt: skip


# ----------------------------------------------------------------------------- shared styles
# Every figure draws a method in the same color (by SD family), marker (by proposal length k)
# and label, so one legend reads the same everywhere.
FAMILY_COLORS = {
    "none": "#444444",
    "ngram": "#e6821e",
    "eagle": "#1f6fb4",
    "eagle3": "#2ca02c",
    "draft_model": "#8c52b8",
    "mtp": "#d62728",
    "deepseek_mtp": "#d62728",
    "qwen3_next_mtp": "#d62728",
    "suffix": "#8c564b",
    "medusa": "#e377c2",
}
FAMILY_LABELS = {
    "none": "w/o SD", "ngram": "n-gram", "eagle": "EAGLE", "eagle3": "EAGLE-3", "draft_model": "draft model",
    "mtp": "MTP", "deepseek_mtp": "MTP", "qwen3_next_mtp": "MTP", "suffix": "suffix", "medusa": "Medusa",
}  # fmt: skip
K_MARKERS = {1: "v", 2: "<", 3: "o", 4: ">", 5: "s", 6: "p", 7: "D", 10: "^", 15: "P", 20: "X", 21: "h", 24: "*"}
# Key prefixes of the shipped configs' method names -> family, for tables that carry only the key.
_KEY_FAMILIES = (("eagle3", "eagle3"), ("eagle", "eagle"), ("ngram", "ngram"), ("draft", "draft_model"),
                 ("dm-", "draft_model"), ("mtp", "mtp"), ("suffix", "suffix"), ("medusa", "medusa"),
                 ("none", "none"))  # fmt: skip
_EXTRA_COLORS = ("#17becf", "#bcbd22", "#7f7f7f", "#9edae5", "#c5b0d5")


def _family_and_k(key: str, sd_method: str | None, k: int | None) -> tuple[str, int | None]:
    import re

    family = sd_method or next((fam for prefix, fam in _KEY_FAMILIES if key.startswith(prefix)), "")
    if k is None:
        found = re.findall(r"k(\d+)", key)  # "ngram-k3.k10": the sweep's k is the last one
        k = int(found[-1]) if found else None
    return family, (None if family == "none" else k)


class MethodStyle(tuple):
    """``(color, marker, label)`` of a method."""

    @property
    def color(self) -> str:
        return self[0]

    @property
    def marker(self) -> str:
        return self[1]

    @property
    def label(self) -> str:
        return self[2]

    def kwargs(self) -> dict[str, str]:
        """``color``, ``marker`` and ``label`` for a matplotlib call."""
        return {"color": self.color, "marker": self.marker, "label": self.label}


def method_style(key: str, sd_method: str | None = None, k: int | None = None) -> MethodStyle:
    """The style of method ``key``: color by SD family, marker by proposal length, label
    ``<family> k=<k>`` (``sd_method`` and ``k`` from the table when it has them, else read off the
    key). A key of no known family keeps its own name and a color chosen from the key."""
    import zlib

    family, k = _family_and_k(str(key), sd_method, None if k is None or k != k else int(k))
    if family in FAMILY_COLORS:
        color, label = FAMILY_COLORS[family], FAMILY_LABELS[family]
        if k:
            label += f" k={k}"
        if "tree" in str(key):
            label += " tree"
    else:
        color, label = _EXTRA_COLORS[zlib.crc32(str(key).encode()) % len(_EXTRA_COLORS)], str(key)
    return MethodStyle((color, K_MARKERS.get(k or 0, "o"), label))


def method_styles(table: Any, key: str = "method") -> dict[str, MethodStyle]:
    """Styles of every method in ``table`` (a DataFrame with ``key``, and where present
    ``sd_method`` / ``num_speculative_tokens``); labels made unique by appending the key."""
    styles: dict[str, MethodStyle] = {}
    cols = [c for c in (key, "sd_method", "num_speculative_tokens") if c in table]
    for row in table[cols].drop_duplicates(key).itertuples(index=False):
        values = dict(zip(cols, row))
        k = values.get("num_speculative_tokens")
        styles[str(values[key])] = method_style(str(values[key]), values.get("sd_method"), None if k is None else int(k))
    labels = [s.label for s in styles.values()]
    for name, style in styles.items():
        if labels.count(style.label) > 1:
            styles[name] = MethodStyle((style.color, style.marker, f"{style.label} ({name})"))
    return styles


# ----------------------------------------------------------------------------- panel grids
MAX_WIDTH_PX = 3000
MAX_ASPECT = 4.0


def panel_grid(n: int, panel_w: float, panel_h: float, dpi: int, rows_per_panel: int = 1, **kwargs: Any) -> tuple[Any, Any]:
    """``n`` panels (each ``rows_per_panel`` axes tall) wrapped into a grid at most
    :data:`MAX_WIDTH_PX` wide and no wider than :data:`MAX_ASPECT`:1; unused axes are hidden.

    Returns ``(figure, axes)`` with ``axes[r][c]`` of shape (rows x rows_per_panel, columns);
    panel ``i`` is column ``i % ncols``, rows ``(i // ncols) * rows_per_panel`` onwards. The
    figure has its (empty) :class:`DrawnTable`: a grid that draws nothing says so beside its PNG.
    """
    import math

    n = max(n, 1)
    max_cols = max(1, int(MAX_WIDTH_PX / (panel_w * dpi)))
    ncols = min(n, max_cols)
    while ncols > 1:
        nrows = math.ceil(n / ncols)
        if (ncols * panel_w) / (nrows * rows_per_panel * panel_h) <= MAX_ASPECT:
            break
        ncols -= 1
    nrows = math.ceil(n / ncols)
    fig, axes = subplots(nrows * rows_per_panel, ncols, figsize=(panel_w * ncols, panel_h * rows_per_panel * nrows),
                         squeeze=False, **kwargs)  # fmt: skip
    for i in range(n, nrows * ncols):
        for r in range(rows_per_panel):
            axes[(i // ncols) * rows_per_panel + r, i % ncols].set_visible(False)
    drawn_table(fig)
    return fig, axes


def panel_axes(axes: Any, i: int, row: int = 0, rows_per_panel: int = 1) -> Any:
    """The axes of panel ``i`` (row ``row`` of it) in a :func:`panel_grid`."""
    ncols = axes.shape[1]
    return axes[(i // ncols) * rows_per_panel + row, i % ncols]


def figure_legend(fig: Any, styles: dict[str, MethodStyle], extra: list[Any] | None = None, title: str = "") -> None:
    """One legend naming every method drawn (and ``extra`` handles), below the panels."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=s.color, marker=s.marker, label=s.label) for s in styles.values()]
    handles += extra or []
    ncol = max(1, min(len(handles), int(fig.get_figwidth() // 2.2)))
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=8, frameon=False, title=title or None,
               bbox_to_anchor=(0.5, 0.0))  # fmt: skip
    rows = -(-len(handles) // ncol)
    fig.tight_layout(rect=(0, min(0.35, (0.28 * rows + 0.1) / fig.get_figheight()), 1, 1))


def method_lines(
    table: Any,
    out_png: str | os.PathLike[str],
    *,
    panel_keys: list[str],
    x: str,
    rows: list[tuple[str, str | None, str | None, str]],
    xlabel: str,
    xlog: int | None = None,
    ylog: bool = False,
    hline: dict[int, float] | None = None,
    dpi: int = 110,
) -> Any:
    """Lines per method (shared styles) against ``x``, a panel per ``panel_keys`` combination
    wrapped into a grid, one legend; ``rows`` are ``(y, low, high, ylabel)`` stacked in each panel
    (``low``/``high``: the 95% interval as error bars, or None); ``hline`` draws a dashed line at a
    value in a row (e.g. speedup 1). Returns the drawn table (written beside ``out_png``)."""
    panels = list(table.groupby(panel_keys, sort=True))
    styles = method_styles(table)
    fig, axes = panel_grid(len(panels), 4.0, 3.1, dpi, rows_per_panel=len(rows))
    drawn = drawn_table(fig)
    for i, (keys, sub) in enumerate(panels):
        keys = keys if isinstance(keys, tuple) else (keys,)
        title = " / ".join(str(k) for k in keys[1:]) + (f"\n{keys[0]}" if len(keys) > 1 else str(keys[0]))
        for r, (y, lo, hi, ylabel) in enumerate(rows):
            ax = panel_axes(axes, i, r, len(rows))
            for method, line in sub.groupby("method", sort=True):
                line = line.sort_values(x)
                err = None
                if lo and hi and line[lo].notna().any():
                    err = [(line[y] - line[lo]).clip(lower=0), (line[hi] - line[y]).clip(lower=0)]
                style = styles[method]
                drawn.errorbar(ax, line[x], line[y], yerr=err, capsize=3, color=style.color, marker=style.marker,
                               series=method, label=style.label, panel=title)  # fmt: skip
            if hline and r in hline:
                drawn.axhline(ax, hline[r], color="grey", lw=0.8, ls="--", series="reference", panel=title)
            if xlog:
                ax.set_xscale("log", base=xlog)
            if ylog:
                ax.set_yscale("log")
            ax.set_xlabel(xlabel, fontsize=8)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.grid(alpha=0.3, which="both" if ylog else "major")
        panel_axes(axes, i, 0, len(rows)).set_title(title, fontsize=9)
    figure_legend(fig, styles)
    return save_png(fig, out_png, dpi=dpi)
