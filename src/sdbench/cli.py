"""Command-line entry point: one subcommand per pipeline step.

Each step lives in its own module that exposes ``register(subparsers)``; the
module adds its subparser and sets ``func`` (called with the parsed namespace,
returning an exit code). Modules are imported lazily by name so a light
command (e.g. ``sdbench memory``) never pays for importing vLLM or torch, and
``sdbench X`` imports only the module(s) of command X (:data:`COMMAND_MODULES`).

Errors end a command with one line ``error: ...`` on stderr (exit code 2 for bad
input, 1 for an internal error); ``sdbench --debug X ...`` adds the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import shlex
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

# Modules that contribute subcommands. Add a module here to add its commands (and name its
# commands in COMMAND_MODULES below, so that `sdbench <command>` imports only that module).
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "trace_cli",
    "acceptance",
    "fetch",
    "grid",
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
    "modelcheck",
    "parity",
    "sharing",
    "timeline",
)


# Top-level command -> the module(s) registering it, in SUBCOMMAND_MODULES order. `sdbench X`
# imports only X's modules (start-up ~0.5 s instead of ~2 s with every module). A command missing
# here (e.g. of a module just added to SUBCOMMAND_MODULES) still works: the parser is then built
# from every module, as for `sdbench --help`. tests/test_bad_inputs.py checks this table.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "trace": ("trace_cli",),
    "bench": ("trace_cli", "simulator", "parity", "sharing", "timeline"),
    "acceptance": ("acceptance",),
    "fetch": ("fetch",),
    "check-config": ("grid",),
    "prepare-dataset": ("datasets",),
    "run-cell": ("runner",),
    "run-group": ("runner",),
    "cell-tables": ("runner",),
    "trace-cell": ("runner",),
    "aggregate": ("endtoend",),
    "plot-throughput": ("endtoend",),
    "download-model": ("hub",),
    "memory": ("memory",),
    "memory-table": ("memory",),
    "bleu": ("bleu",),
    "build-tokenizer": ("tinymodels",),
    "train-model": ("tinymodels",),
    "costmodel": ("costmodel",),
    "breakdown": ("steptiming",),
    "validate-simulator": ("validation",),
    "simulate": ("simulator",),
    "bundle": ("bundle",),
    "containers": ("containers",),
    "check-model": ("modelcheck",),
}

DEBUG_ENV = "SDBENCH_DEBUG"  # SDBENCH_DEBUG=1 acts like --debug (e.g. inside Snakemake rules)
EXIT_USER_ERROR = 2  # bad input: file, key, value or argument (also argparse's code)
EXIT_INTERNAL_ERROR = 1  # anything else: most likely a bug


class _Parser(argparse.ArgumentParser):
    """Argument errors as one line on stderr (no usage block), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER_ERROR, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (first non-option word), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


def _modules_for(command: str | None) -> list[str]:
    """Modules to import for ``command``: its own, or every module when it is unknown."""
    wanted = COMMAND_MODULES.get(command or "", ())
    modules = [m for m in SUBCOMMAND_MODULES if m in wanted]
    return modules if modules and len(modules) == len(wanted) else list(SUBCOMMAND_MODULES)


def build_parser(modules: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """Build the top-level parser with the subcommands of ``modules`` (default: every module)."""
    parser = _Parser(
        prog="sdbench",
        description="Speculative-decoding benchmark pipeline steps.",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help=f"on an error, print the traceback too (also: {DEBUG_ENV}=1)",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES if modules is None else modules:
        module = importlib.import_module(f"sdbench.{name}")
        module.register(subparsers)
    return parser


def one_line(text: str) -> str:
    """``text`` on one line: lines joined by "; " (by a space after a line ending in ":")."""
    out = ""
    for part in (p.strip() for p in str(text).splitlines()):
        if part:
            out = part if not out else (f"{out} {part}" if out.endswith(":") else f"{out}; {part}")
    return out


def _is_instance(exc: BaseException, module: str, name: str) -> bool:
    """``isinstance(exc, module.name)`` without importing ``module`` (it was, if it raised)."""
    cls = getattr(sys.modules.get(module), name, None)
    return isinstance(cls, type) and isinstance(exc, cls)


def describe_error(exc: BaseException) -> tuple[int, str]:
    """Exit code and one-line message for an exception that ended a command.

    Input problems (exit 2): ConfigError and any ValueError (JSON, Arrow, CSV errors included),
    OSError (missing file, permission, disk full, read-only file system, network), YAML errors,
    pyarrow errors, and a KeyError whose message is a sentence (modules raise those for an
    unknown name). Anything else is an internal error (exit 1). Modules name the file or key in
    their messages; this only formats them.
    """
    if isinstance(exc, KeyError):
        arg = exc.args[0] if len(exc.args) == 1 else None
        if isinstance(arg, str) and " " in arg.strip():
            return EXIT_USER_ERROR, one_line(arg)
    elif isinstance(exc, json.JSONDecodeError):
        doc = exc.doc if len(exc.doc) <= 60 else exc.doc[:57] + "..."
        return EXIT_USER_ERROR, one_line(f"not valid JSON ({exc.msg}, line {exc.lineno} column {exc.colno}): {doc!r}")
    elif isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        target = f" -> {exc.filename2}" if exc.filename2 is not None else ""
        return EXIT_USER_ERROR, one_line(f"{exc.filename}{target}: {exc.strerror}")
    elif (
        isinstance(exc, (ValueError, OSError))
        or _is_instance(exc, "yaml", "YAMLError")
        or _is_instance(exc, "pyarrow.lib", "ArrowException")
    ):
        return EXIT_USER_ERROR, one_line(str(exc)) or type(exc).__name__
    return EXIT_INTERNAL_ERROR, one_line(f"internal error: {type(exc).__name__}: {exc}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code.

    An error ends the command with ONE line ``error: ...`` on stderr: exit code 2 for bad input
    (see :func:`describe_error`), 1 for an internal error. ``sdbench --debug CMD ...`` (or
    ``SDBENCH_DEBUG=1``) prints the traceback before that line.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_modules_for(_command_of(argv)))
    args = parser.parse_args(argv)
    debug = args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("error: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:  # a module's `raise SystemExit("message")`: same one-line form
        if not isinstance(exc.code, str):
            raise
        if debug:
            traceback.print_exc()
        message = one_line(exc.code)
        if not message.startswith("error:"):  # "sdbench x: error: what" -> "error: sdbench x: what"
            head, sep, rest = message.partition("error: ")
            message = f"error: {head}{rest}" if sep else f"error: {message}"
        print(message, file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as exc:
        if debug:
            traceback.print_exc()
        code, message = describe_error(exc)
        if code != EXIT_USER_ERROR and not debug:
            message += f" (rerun as `sdbench --debug {shlex.join(argv)}` for the traceback)"
        print(f"error: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
