"""Figures: matplotlib on the Agg backend, selected when the first figure is made, and saved
atomically as byte-stable PNGs.

matplotlib is imported by :func:`pyplot` only, so importing a module that draws figures costs
nothing until it draws one. :func:`save_png` writes to a temporary file beside the destination
and renames it (a figure is complete or absent), without the "Software" metadata entry that
names the matplotlib version (the same figure gives the same bytes), and closes the figure even
when saving fails.

Every figure of the figure index also hands back what it drew: its :class:`DrawnTable`
(:func:`drawn_table`, :mod:`sdbench.drawn`) registers the artists its drawing calls make
(``drawn.errorbar(ax, ...)``), and :func:`save_png` reads the marks back from those artists
(panel, x, y, intervals, colour in data coordinates), writes them beside the PNG as
``<name>.csv`` (:data:`DRAWN_COLUMNS`, one row per mark; docs/schema.md) and returns them.

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

    A figure with a :class:`DrawnTable` gets it read back from its artists as they are drawn
    and written too, to :func:`drawn_path` of ``path`` (renamed into place after the PNG: a
    failed save leaves neither); returns that table as a DataFrame (None for a figure without one).

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
# Read back from the figure's artists when it is saved: sdbench.drawn.
from sdbench.drawn import (  # noqa: E402  (re-exported: figures import them from here)
    _DRAWN_ATTR,
    DRAWN_COLUMNS,
    DRAWN_SUFFIX,
    DrawnTable,
    drawn_path,
    drawn_table,
    set_rows_per_panel,
)

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
    set_rows_per_panel(fig, rows_per_panel)  # a lower row's marks read back under its panel's title
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
                               series=method, label=style.label)  # fmt: skip
            if hline and r in hline:
                drawn.axhline(ax, hline[r], color="grey", lw=0.8, ls="--", series="reference")
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
