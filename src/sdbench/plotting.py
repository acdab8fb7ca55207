"""Figures: matplotlib on the Agg backend, selected when the first figure is made, and saved
atomically as byte-stable PNGs.

matplotlib is imported by :func:`pyplot` only, so importing a module that draws figures costs
nothing until it draws one. :func:`save_png` writes to a temporary file beside the destination
and renames it (a figure is complete or absent), without the "Software" metadata entry that
names the matplotlib version (the same figure gives the same bytes), and closes the figure even
when saving fails.
"""

from __future__ import annotations

import os
from typing import Any

from sdbench.io import atomic_path


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def subplots(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """``plt.subplots(*args, **kwargs)`` on the Agg backend: ``(figure, axes)``."""
    return pyplot().subplots(*args, **kwargs)


def save_png(fig: Any, path: str | os.PathLike[str], dpi: int, **savefig_kwargs: Any) -> None:
    """Write ``fig`` to ``path`` as PNG at ``dpi`` atomically, then close it (also on error).

    ``savefig_kwargs`` go to ``Figure.savefig`` (e.g. ``bbox_inches="tight"``).
    """
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=dpi, metadata={"Software": None}, **savefig_kwargs)
    finally:
        pyplot().close(fig)
