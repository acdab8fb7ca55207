"""Exceptions shared across the package (a leaf module: it imports nothing from sdbench)."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A configuration problem; the message names the offending key."""


class RehearsalError(ValueError):
    """Rehearsal cells (``measured`` false) where only measured ones are accepted (``sdbench
    compare``, ``sdbench bundle create``) without ``--allow-rehearsal``; the message names the run."""


def describe_yaml_error(exc: Any) -> str:
    """One line for a YAML parse error: where (line, column) and what, without the snippet."""
    def at(mark: Any) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}"

    mark, context_mark = getattr(exc, "problem_mark", None), getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    out = f"{at(mark)}: {problem}" if mark is not None else problem
    if context:
        out += f" ({context}" + (f" at {at(context_mark)})" if context_mark is not None else ")")
    return out
