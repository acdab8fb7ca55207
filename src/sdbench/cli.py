"""Command-line entry point: one subcommand per pipeline step.

Each step lives in its own module that exposes ``register(subparsers)``; the
module adds its subparser and sets ``func`` (called with the parsed namespace,
returning an exit code). Modules are imported lazily by name so a light
command (e.g. ``sdbench memory``) never pays for importing vLLM or torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

# Modules that contribute subcommands. Add a module here to add its commands.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "trace_cli",
    "acceptance",
    "fetch",
    "config",
    "datasets",
    "runner",
    "endtoend",
    "hub",
    "memory",
    "bleu",
    "tinymodels",
    "costmodel",
    "steptiming",
    "validation",
    "simulator",
    "bundle",
    "containers",
)


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="sdbench",
        description="Speculative-decoding benchmark pipeline steps.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        module = importlib.import_module(f"sdbench.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    from sdbench.config import ConfigError

    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:  # user input problems: the message names the key
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
