"""Atomic file and directory writing (a result is either complete or absent, never half-written) and
parquet reading whose errors name the file.

Inside a command (:func:`sdbench.provenance.command_scope`) the readers record whether a table is a
rehearsal (its ``measured`` column) and the writers carry that on: a ``measured`` column and schema
metadata on the tables of an analysis command, a first line on its Markdown (:mod:`sdbench.provenance`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sdbench import provenance

if TYPE_CHECKING:  # pandas is imported by the functions that need it: light modules use atomic_path
    import pandas as pd


def write_error(exc: OSError, path: str | os.PathLike[str]) -> OSError:
    """``exc`` (disk full, read-only file system, permission, ...) as an error naming the output
    ``path`` rather than a temporary file (pyarrow's errors name no file at all)."""
    code = exc.errno
    if code is None:  # pyarrow: "[Errno 28] Error writing bytes to file. Detail: ..."
        match = re.search(r"errno (\d+)\]", str(exc), re.IGNORECASE)
        code = int(match.group(1)) if match else None
    reason = os.strerror(code) if code else " ".join(str(exc).split())
    err = OSError(code, f"cannot write the output ({reason})")
    err.filename = str(path)
    return err


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success.

    On any exception the temporary file is removed and ``path`` is untouched. Its own file
    operations raise ``OSError`` naming ``path`` (see :func:`write_error`).
    """
    final = Path(path)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    except OSError as exc:
        raise write_error(exc, final) from exc
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        try:
            if tmp.exists():
                # mkstemp creates 0600; results are shared like any other file (umask).
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, final)
        except OSError as exc:
            raise write_error(exc, final) from exc
    finally:
        if tmp.exists():
            tmp.unlink()


def read_parquet(
    path: str | os.PathLike[str], columns: list[str] | None = None, what: str = "parquet table"
) -> pd.DataFrame:
    """``pd.read_parquet(path, columns=columns)`` whose errors name ``path`` and what was expected.

    A missing file raises ``FileNotFoundError`` (``filename`` set); an empty, truncated, corrupted
    or non-parquet file, or a requested column it lacks, raises ``ValueError``.
    """
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, f"no such file (expected a {what})", str(path))
    try:
        if columns is not None and os.path.isfile(path):
            have = pq.read_schema(path).names
            missing = [c for c in columns if c not in have]
            if missing:
                raise ValueError(f"{path}: {what} lacks column(s) {', '.join(missing)} (has: {', '.join(have)})")
        frame = pd.read_parquet(path, columns=columns, engine="pyarrow")
        provenance.observe_parquet(path, frame, every_column=columns is None)
        return frame
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except (pa.ArrowException, OSError) as exc:
        reason = " ".join(str(exc).split())
        # pyarrow: "Could not open Parquet input source '<path>': <reason>. Either the file is corrupted or ..."
        if reason.startswith("Could not open Parquet input source") and "': " in reason:
            reason = reason.split("': ", 1)[1]
        reason = reason.split(". Either the file is corrupted")[0].rstrip(".")
        if os.path.isfile(path) and os.path.getsize(path) == 0:
            reason = "the file is empty"
        raise ValueError(
            f"{path}: not a readable {what}: {reason} (expected a complete parquet file; truncated or corrupted?)"
        ) from exc


def read_csv(path: str | os.PathLike[str], what: str = "CSV table") -> pd.DataFrame:
    """``pd.read_csv(path)`` whose errors name ``path`` and what was expected (an input of the
    running command, :func:`sdbench.provenance.observe`)."""
    import pandas as pd

    if not os.path.isfile(path):
        raise FileNotFoundError(errno.ENOENT, f"no such file (expected a {what})", str(path))
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a readable {what} ({' '.join(str(exc).split())})") from exc
    provenance.observe(frame, path)
    return frame


def write_parquet(df: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """Write ``df`` to parquet atomically, without the pandas index.

    Same frame in, same bytes out: no creation timestamps are embedded. In an analysis command
    the table gets its ``measured`` column and schema metadata (:func:`sdbench.provenance.stamp`).
    """
    df = provenance.stamp(df)
    metadata = provenance.table_metadata(df)
    with atomic_path(path) as tmp:
        try:
            if metadata:
                import pyarrow as pa
                import pyarrow.parquet as pq

                table = pa.Table.from_pandas(df, preserve_index=False)
                table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
                pq.write_table(table, tmp, compression="zstd")
            else:
                df.to_parquet(tmp, index=False, engine="pyarrow", compression="zstd")
        except OSError as exc:  # disk full, quota: name the output, not the temporary file
            raise write_error(exc, path) from exc


def write_text(text: str, path: str | os.PathLike[str]) -> None:
    """Write ``text`` to ``path`` atomically (a Markdown file of a rehearsal command starts with
    :func:`sdbench.provenance.banner`)."""
    if str(path).endswith(".md"):
        text = provenance.mark_markdown(text)
    with atomic_path(path) as tmp:
        try:
            tmp.write_text(text)
        except OSError as exc:
            raise write_error(exc, path) from exc


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``path``; move it onto ``path`` on success.

    An existing ``path`` is replaced only once the new content is complete;
    on any exception the temporary directory is removed and ``path`` is untouched.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        yield tmp
        # mkdtemp makes the directory 0700 and some writers make files 0600.
        for sub in [tmp, *tmp.rglob("*")]:
            os.chmod(sub, 0o755 if sub.is_dir() else 0o644)
        if final.exists():
            # os.replace cannot overwrite a non-empty directory: swap via a side name.
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old", dir=final.parent))
            os.replace(final, old / "x")
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def read_spec(text: str) -> Any:
    """A ``--spec`` value: ``@<path>`` (a spec file the workflow wrote, sdbench.workflow.plan.spec_file)
    or the JSON itself. Errors name the file or say the text is not JSON."""
    import json

    if text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as fh:
                return json.load(fh)
        except FileNotFoundError:
            raise FileNotFoundError(2, "no such spec file", text[1:]) from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{text[1:]}: not a JSON spec ({exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--spec: not JSON ({exc}); give the JSON or @<file>") from None
