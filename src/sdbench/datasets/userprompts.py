"""Your own prompts, no code: a local JSONL / CSV / parquet file, or any hub dataset, by column mapping.

A dataset entry with ``source: file`` and a ``path`` reads the file; one with
``source: huggingface`` and ``builder: columns`` reads ``hf_id`` (or ``local_path``) through the
same :func:`sdbench.datasets.prompts.load_hf_dataset` call as the paper's datasets. Either way the
entry's ``columns`` map this package's fields to the file's columns::

    columns:
      prompt: question          # a prompt string ...
      messages: messages        # ... or OpenAI-style messages [{role, content}, ...]
      reference: answer         # optional: a reference output (BLEU buckets, divergence)
      category: topic           # optional: the row's workload category
      max_tokens: max_new       # optional: the row's output budget (at most the entry's max_tokens)
      id: uid                   # optional: request ids (default: the row number)

Exactly one of ``prompt`` and ``messages`` is given. A multi-turn conversation is kept up to
and including its last user turn (what the model answers next); the assistant turn after it, if
any, is the reference when no ``reference`` column is mapped. The target's chat template renders
the messages (with the model's ``chat_template_kwargs``); a tokenizer without one sees the
turns' contents joined by blank lines. Sampling, seeds, ``num_prompts`` and
``max_prompt_tokens`` then work as for every dataset (:func:`sdbench.datasets.prompts.prepare`).

In a CSV file, a ``messages`` cell is the conversation as JSON text; in parquet it may be JSON
text or a list of ``{role, content}`` structs. Bad input is one ``ConfigError`` naming the file,
the line (JSONL, CSV: the file's line number) or row (parquet, hub: from 1) and what was
expected, raised before any prompt table is written.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sdbench.datasets.prompts import PromptRecord, builder, load_hf_dataset
from sdbench.errors import ConfigError

FIELDS = ("prompt", "messages", "reference", "category", "max_tokens", "id")
FORMATS = {".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet"}
ROLES = ("system", "user", "assistant", "tool", "developer")


def _file_format(path: Path, entry: dict[str, Any]) -> str:
    fmt = entry.get("format") or FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ConfigError(f"{path}: unknown file type {path.suffix!r} (expected .jsonl, .csv or .parquet, or set format:)")
    return fmt


def read_rows(path: str | Path, entry: dict[str, Any] | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, row)`` for every row of a prompts file; ``where`` is ``line N`` or ``row N``."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such prompts file")
    fmt = _file_format(path, entry or {})
    if fmt == "jsonl":
        with open(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{path}: line {n}: invalid JSON ({exc.msg} at column {exc.colno})") from None
                if not isinstance(row, dict):
                    raise ConfigError(f"{path}: line {n}: expected a JSON object, got {type(row).__name__}")
                yield f"line {n}", row
    elif fmt == "csv":
        import csv

        with open(path, encoding="utf-8", newline="") as fh:
            reader = csv.DictReader(fh)
            try:
                for row in reader:
                    if None in row:  # more cells than the header has columns
                        raise ConfigError(f"{path}: line {reader.line_num}: more cells than the header's "
                                          f"{len(reader.fieldnames or [])} columns")
                    yield f"line {reader.line_num}", dict(row)
            except csv.Error as exc:
                raise ConfigError(f"{path}: line {reader.line_num}: not valid CSV ({exc})") from None
    else:
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as exc:  # noqa: BLE001 - any pyarrow failure: the file is not parquet
            raise ConfigError(f"{path}: not a readable parquet file ({type(exc).__name__}: {exc})") from None
        for n, row in enumerate(table.to_pylist(), 1):
            yield f"row {n}", row


def _columns(entry: dict[str, Any], name: str) -> dict[str, str]:
    columns = entry.get("columns")
    if not isinstance(columns, dict) or not columns:
        raise ConfigError(f"datasets.{name}.columns: missing (map prompt or messages, and optionally "
                          f"{', '.join(FIELDS[2:])}, to the file's columns)")
    unknown = sorted(set(columns) - set(FIELDS))
    if unknown:
        raise ConfigError(f"datasets.{name}.columns.{unknown[0]}: unknown field (known: {', '.join(FIELDS)})")
    if ("prompt" in columns) == ("messages" in columns):
        raise ConfigError(f"datasets.{name}.columns: give exactly one of prompt and messages")
    return columns


def _messages(value: Any, where: str) -> tuple[tuple[tuple[str, str], ...], str]:
    """The conversation up to its last user turn, and the assistant turn after it ("" if none)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: messages: not a JSON list of {{role, content}} ({exc.msg})") from None
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: messages: expected a non-empty list of {{role, content}}, got {type(value).__name__}")
    turns = []
    for i, turn in enumerate(value):
        if not isinstance(turn, dict) or "role" not in turn or "content" not in turn:
            raise ConfigError(f"{where}: messages[{i}]: expected an object with role and content")
        if turn["role"] not in ROLES:
            raise ConfigError(f"{where}: messages[{i}]: role {turn['role']!r} is not one of {', '.join(ROLES)}")
        if not isinstance(turn["content"], str):
            raise ConfigError(f"{where}: messages[{i}]: content must be a string")
        turns.append((str(turn["role"]), turn["content"]))
    users = [i for i, (role, _) in enumerate(turns) if role == "user"]
    if not users:
        raise ConfigError(f"{where}: messages: no user turn (the model answers the last user turn)")
    last = users[-1]
    if not turns[last][1].strip():
        raise ConfigError(f"{where}: messages[{last}]: the last user turn is empty")
    after = turns[last + 1][1] if last + 1 < len(turns) and turns[last + 1][0] == "assistant" else ""
    return tuple(turns[: last + 1]), after


def _field(row: dict[str, Any], column: str, where: str, found: list[str], optional: bool = False) -> Any:
    """The row's value of ``column``; a row may lack an optional one (a JSON object leaving it out)."""
    if column not in row:
        if optional:
            return None
        raise ConfigError(f"{where}: no column {column!r} (columns: {', '.join(map(repr, found)) or 'none'})")
    return row[column]


def row_records(
    rows: Iterator[tuple[str, dict[str, Any]]], entry: dict[str, Any], name: str, source: str
) -> Iterator[PromptRecord]:
    """Prompt records of ``rows`` by the entry's column mapping (``source`` names the input in errors)."""
    columns = _columns(entry, name)
    cap = int(entry["max_tokens"])
    seen: dict[str, str] = {}
    present: set[str] = set()  # optional columns some row has
    for index, (loc, row) in enumerate(rows, 1):
        where = f"{source}: {loc}"
        found = list(row)
        present.update(found)
        reference = ""
        messages = None
        if "messages" in columns:
            messages, reference = _messages(_field(row, columns["messages"], where, found), where)
            text = "\n\n".join(content for _, content in messages)
        else:
            text = _field(row, columns["prompt"], where, found)
            if not isinstance(text, str):
                raise ConfigError(f"{where}: column {columns['prompt']!r}: expected text, got {type(text).__name__}")
            if not text.strip():
                raise ConfigError(f"{where}: column {columns['prompt']!r} is empty")
        if "reference" in columns:
            value = _field(row, columns["reference"], where, found, optional=True)
            reference = "" if value is None else str(value)
        category = None
        if "category" in columns:
            value = _field(row, columns["category"], where, found, optional=True)
            category = None if value in (None, "") else str(value)
        max_tokens = None
        if "max_tokens" in columns:
            value = _field(row, columns["max_tokens"], where, found, optional=True)
            if value not in (None, ""):
                try:
                    # Through float: a CSV cell is text, and pandas writes an integer column with gaps as "96.0".
                    number = float(value)
                    max_tokens = int(number)
                    if max_tokens != number:
                        raise ValueError
                except (TypeError, ValueError, OverflowError):
                    raise ConfigError(f"{where}: column {columns['max_tokens']!r}: {value!r} is not an integer") from None
                if not 1 <= max_tokens <= cap:
                    raise ConfigError(f"{where}: column {columns['max_tokens']!r}: {max_tokens} is outside 1.."
                                      f"{cap} (datasets.{name}.max_tokens is the most a request may generate)")
        rid = str(index)
        if "id" in columns:
            value = _field(row, columns["id"], where, found)
            if value in (None, ""):
                raise ConfigError(f"{where}: column {columns['id']!r} is empty")
            rid = str(value)
        if rid in seen:
            raise ConfigError(f"{where}: request id {rid!r} again (first at {seen[rid]})")
        seen[rid] = loc
        yield PromptRecord(rid, text, reference, category, messages, max_tokens)
    for field in ("reference", "category", "max_tokens"):
        if field in columns and seen and columns[field] not in present:  # a misspelled mapping
            raise ConfigError(f"{source}: no row has column {columns[field]!r} (mapped as {field})")


@builder("columns")
def build_columns(entry: dict[str, Any], seed: int) -> Iterator[PromptRecord]:
    """A local prompts file (``source: file``) or a hub dataset, read by ``columns``."""
    name = entry.get("_name", "<dataset>")
    if entry.get("source") == "file":
        path = Path(entry["path"])
        return row_records(read_rows(path, entry), entry, name, str(path))
    rows = load_hf_dataset(entry)
    hub_rows = ((f"row {n}", row) for n, row in enumerate(rows, 1))
    return row_records(hub_rows, entry, name, str(entry.get("local_path") or entry.get("hf_id")))
