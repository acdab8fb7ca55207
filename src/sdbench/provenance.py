"""Measured or rehearsal: the ``measured`` flag of a command's inputs, carried to everything it writes.

A rehearsal engine stands in for vLLM and writes ``measured = False`` in every per-cell table
(docs/schema.md). Nothing computed from such a table may pass for a measurement, so one
mechanism carries the flag through every command instead of each analysis function:

- ``sdbench`` runs each command inside :func:`command_scope` (:func:`sdbench.cli.main`);
- every table a command reads through :mod:`sdbench.io` (``read_parquet``, ``read_csv``) is
  :func:`observe`-d: a ``measured`` column with a False row (or a parquet file whose schema
  metadata says so) makes the command's output a rehearsal; a table without the column is a
  measurement (runs written before the column existed);
- an analysis command (:data:`STAMPED_MODULES`) stamps every table it writes
  (``io.write_parquet``, the simulator's CSVs): a ``measured`` column, False on every row when any
  input row was False (else the table's own value, True by default), plus the parquet schema
  metadata key :data:`METADATA_KEY`;
- a rehearsal command's figures carry :data:`MARK` (``sdbench.plotting.save_png``) and its
  Markdown files start with :func:`banner` (``io.write_text``).

Outside a scope (a library call, a test calling a function) nothing is observed or stamped.
This module imports only the standard library: ``sdbench.cli`` imports it at start-up.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

MEASURED = "measured"
# Parquet schema metadata: "true" / "false", beside the column (readable without the rows).
METADATA_KEY = b"sdbench.measured"
# The visible mark on every figure drawn from rehearsal data, and the first words of its Markdown.
MARK = "rehearsal, not measured"
# Commands implemented here compute tables from cells, traces or server tables: they stamp.
STAMPED_MODULES = ("sdbench.analysis.", "sdbench.simulator.", "sdbench.traces.table")
# How many rehearsal inputs the banner names before it counts the rest.
_NAMED = 2


@dataclass
class Scope:
    """What one command has read: the inputs holding rehearsal rows, and whether it stamps."""

    stamp: bool
    rehearsal: list[str] = field(default_factory=list)


_scope: Scope | None = None


def stamps(module: str) -> bool:
    """Whether a command implemented in ``module`` stamps its tables (:data:`STAMPED_MODULES`)."""
    return module.startswith(STAMPED_MODULES)


@contextlib.contextmanager
def command_scope(stamp: bool) -> Iterator[Scope]:
    """Observe the inputs of one command and mark its outputs (``stamp``: also add the column)."""
    global _scope
    outer, _scope = _scope, Scope(stamp)
    try:
        yield _scope
    finally:
        _scope = outer


def frame_measured(frame: pd.DataFrame) -> bool:
    """False when ``frame`` has a ``measured`` column with a False row; a table without the
    column is a measurement (written before the column existed)."""
    if MEASURED not in frame.columns:
        return True
    return bool(frame[MEASURED].fillna(True).astype(bool).all())


def rehearsal_rows(frame: pd.DataFrame) -> int:
    """How many rows of ``frame`` say ``measured = False`` (0 without the column)."""
    if MEASURED not in frame.columns:
        return 0
    return int((~frame[MEASURED].fillna(True).astype(bool)).sum())


def observe(frame: pd.DataFrame | None, source: str | os.PathLike[str], measured: bool | None = None) -> None:
    """Record an input of the running command: ``frame``'s ``measured`` column, or ``measured``
    given directly (a file read otherwise). No-op outside :func:`command_scope`."""
    if _scope is None:
        return
    ok = measured if measured is not None else (True if frame is None else frame_measured(frame))
    if not ok and str(source) not in _scope.rehearsal:
        _scope.rehearsal.append(str(source))


def observe_parquet(path: str | os.PathLike[str], frame: pd.DataFrame, every_column: bool = True) -> None:
    """:func:`observe` a parquet input read into ``frame``: its ``measured`` column; when only some
    columns were read (not ``every_column``), the file's schema metadata or column instead."""
    if _scope is None:
        return
    if MEASURED in frame.columns or every_column or not os.path.isfile(path):
        observe(frame, path)
        return
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    flag = (schema.metadata or {}).get(METADATA_KEY)
    if flag is not None:
        observe(None, path, measured=flag != b"false")
    elif MEASURED in schema.names:
        observe(pq.read_table(path, columns=[MEASURED]).to_pandas(), path)


def stamping() -> bool:
    """Whether the running command stamps what it writes (an analysis command)."""
    return _scope is not None and _scope.stamp


def measured() -> bool:
    """False when the running command has read a rehearsal input (True outside a scope)."""
    return _scope is None or not _scope.rehearsal


def rehearsal_sources() -> list[str]:
    """The inputs of the running command that hold rehearsal rows."""
    return [] if _scope is None else list(_scope.rehearsal)


def stamp(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its ``measured`` column, in a stamping command: the frame's own value
    (True where absent) and False everywhere when the command read a rehearsal input."""
    if _scope is None or not _scope.stamp:
        return frame
    own = frame[MEASURED].fillna(True).astype(bool) if MEASURED in frame.columns else True
    return frame.assign(**{MEASURED: own & measured()})


def table_metadata(frame: pd.DataFrame) -> dict[bytes, bytes]:
    """Parquet schema metadata of a stamped ``frame``: :data:`METADATA_KEY` (empty otherwise)."""
    if _scope is None or not _scope.stamp or MEASURED not in frame.columns:
        return {}
    return {METADATA_KEY: b"true" if frame_measured(frame) else b"false"}


def refuse_rehearsal(runs: list[tuple[str, int, int]], verb: str) -> None:
    """Raise :class:`sdbench.errors.RehearsalError` (one line, exit code 2) when a run of ``runs``
    (``(name, rehearsal cells, cells)``) holds rehearsal cells: ``verb`` says what the flag would allow."""
    from sdbench.errors import RehearsalError

    found = [(name, n, total) for name, n, total in runs if n]
    if found:
        which = ", ".join(f"{name}: {n} of {total} cells" for name, n, total in found)
        raise RehearsalError(
            f"{which} {'is' if len(found) == 1 and found[0][1] == 1 else 'are'} a rehearsal "
            f"(measured = false), not a measurement; pass --allow-rehearsal to {verb} anyway"
        )


def banner() -> str:
    """The first line of a rehearsal command's Markdown ("" for a measurement)."""
    sources = rehearsal_sources()
    if not sources:
        return ""
    named = ", ".join(f"`{s}`" for s in sources[:_NAMED])
    more = f" and {len(sources) - _NAMED} more" if len(sources) > _NAMED else ""
    return (
        f"> **{MARK[0].upper()}{MARK[1:]}.** Drawn from rehearsal data (`measured` = false in {named}{more}): "
        "a stand-in engine's preview, not a measurement."
    )


def mark_markdown(text: str) -> str:
    """``text`` starting with :func:`banner` in a rehearsal command (unchanged otherwise or when
    it already does)."""
    head = banner()
    if not head or text.startswith(head):
        return text
    return f"{head}\n\n{text}"


def mark_figure(fig: Any) -> bool:
    """Put :data:`MARK` on ``fig`` in a rehearsal command: large translucent diagonal text across
    it, and the figure's title (its suptitle, else a line at its top left) suffixed. Returns
    whether it marked."""
    if measured():
        return False
    import math

    # Along the figure's diagonal, about three quarters of its length (a glyph ~0.6 em wide).
    width, height = fig.get_figwidth(), fig.get_figheight()
    size = 0.75 * math.hypot(width, height) * 72 / (0.6 * len(MARK))
    angle = min(60.0, max(15.0, math.degrees(math.atan2(height, width))))
    fig.text(0.5, 0.5, MARK.upper(), fontsize=size, color="red", alpha=0.18, rotation=angle, ha="center",
             va="center", zorder=1000, gid="sdbench-rehearsal-mark")  # fmt: skip
    title = getattr(fig, "_suptitle", None)
    if title is not None and title.get_text():
        title.set_text(f"{title.get_text()} ({MARK})")
    else:
        fig.text(0.005, 0.995, f"({MARK})", fontsize=9, color="red", ha="left", va="top",
                 gid="sdbench-rehearsal-title")  # fmt: skip
    return True
