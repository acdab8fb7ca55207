"""Subcommand functions that import their implementation only when the command runs.

The parser of every command is built from light modules (``sdbench.<stage>.cli``: argparse and
the standard library only), so ``sdbench --help`` and ``sdbench <command> --help`` start at once.
A command's ``func`` is a :class:`LazyCommand` naming the module and function that implement it;
``sdbench <command>`` imports that module (pandas, vLLM, ...) when it runs the command.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable


class LazyCommand:
    """A command function: imports ``module`` and calls its ``name`` with the parsed namespace."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def resolve(self) -> Callable[[argparse.Namespace], int | None]:
        """The implementing function (imports its module)."""
        return getattr(importlib.import_module(self.module), self.name)

    def __call__(self, args: argparse.Namespace) -> int | None:
        return self.resolve()(args)

    def __repr__(self) -> str:
        return f"lazy({self.module!r}, {self.name!r})"


def lazy(module: str, name: str) -> LazyCommand:
    """The command function ``module.name``, imported when the command runs."""
    return LazyCommand(module, name)
