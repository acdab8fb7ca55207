"""Commands of the engine stage: ``sdbench run-cell``, ``run-group``, ``cell-tables``, ``trace-group``,
``trace-tables``, ``serve-group``, ``engines conformance``.

Argument parsing only (argparse and the standard library); each command's implementation
(:mod:`sdbench.engine.commands`, which imports vLLM when it starts an engine) is imported when it
runs (:mod:`sdbench.lazy`).
"""

from __future__ import annotations

import argparse

from sdbench.cliargs import add_model_dirs, add_output_dir, add_prompts
from sdbench.lazy import lazy

COMMANDS = "sdbench.engine.commands"
QUIET_GUARD_MODES = ("flag", "refuse", "disabled")  # quietguard.MODES


def _add_quiet_guard(p: argparse.ArgumentParser) -> None:
    """``--quiet-guard`` of the commands that time a cell (run-cell, run-group, serve-group)."""
    p.add_argument(
        "--quiet-guard",
        choices=QUIET_GUARD_MODES,
        default=None,
        help="contaminated timed part: keep and flag, or fail (default: $SDBENCH_QUIET_GUARD, else flag)",
    )


def _add_threads(p: argparse.ArgumentParser) -> None:
    """``--threads`` of the commands that start an engine: the CPUs Snakemake gave the job."""
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPUs the job has (its Snakemake threads): the engine's thread pools are sized from them "
        "outside SLURM (default: the affinity mask; sdbench.engine.site.hardware.job_cores)",
    )


def add_run_cell(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench run-cell``."""
    p = subparsers.add_parser("run-cell", help="run one benchmark cell on vLLM")
    p.add_argument("--spec", required=True, help="resolved cell spec: JSON or @file, see sdbench.grid.resolve_cell")
    add_prompts(p)
    add_model_dirs(p)
    add_output_dir(p, "requests/calls/summary.parquet of the cell")
    p.add_argument("--steps-output", default=None, help="breakdown mode: per-step stage timings (parquet)")
    _add_quiet_guard(p)
    _add_threads(p)
    p.set_defaults(func=lazy(COMMANDS, "_cmd_run_cell"))


def add_run_group(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench run-group``."""
    g = subparsers.add_parser("run-group", help="measure every cell of an engine group on one engine")
    g.add_argument("--spec", required=True, help='JSON (or @file, as the workflow passes it): {"cells": [resolved cell specs], "prompts": {dataset: path}, "max_num_seqs": N (optional)}')
    add_model_dirs(g)
    add_output_dir(g, "the group's <dataset>/bs<N>/*.parquet per cell")
    _add_quiet_guard(g)
    _add_threads(g)
    g.add_argument("--breakdown", action="store_true",
                   help="time every engine step by stage; each cell's directory also gets steps.parquet")
    g.add_argument("--checkpoint-dir", default=None,
                   help="keep each finished cell (and a long cell's finished calls) here; any run of a group re-uses "
                        "those measured under the same spec (default: none, every cell is measured)")
    g.add_argument("--dry-run", action="store_true",
                   help="say how many cells would be measured and how many re-used from --checkpoint-dir; "
                        "start no engine, write nothing")
    g.add_argument("--engine-start", type=int, default=None,
                   help="measure in this process only, as engine start N of run.engine_starts (set by run-group itself)")
    g.set_defaults(func=lazy(COMMANDS, "_cmd_run_group"))


def add_cell_tables(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench cell-tables``."""
    c = subparsers.add_parser("cell-tables", help="a cell's tables out of its engine group's directory")
    c.add_argument("--group-dir", required=True)
    c.add_argument("--method", required=True)
    c.add_argument("--dataset", required=True)
    c.add_argument("--batch-size", type=int, required=True)
    add_output_dir(c, "requests/calls/summary.parquet of the cell")
    c.add_argument("--steps", action="store_true", help="a breakdown group's cell: copy steps.parquet too")
    c.set_defaults(func=lazy(COMMANDS, "_cmd_cell_tables"))


def add_trace_group(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench trace-group``."""
    t = subparsers.add_parser(
        "trace-group", help="in-engine acceptance traces of one method on every traced dataset, one engine"
    )
    t.add_argument("--spec", required=True, help='JSON (or @file, as the workflow passes it): {"cells": [resolved cell specs], "prompts": {dataset: path}, "max_num_seqs": N (optional)}')
    add_model_dirs(t)
    t.add_argument("--num-speculative-tokens", type=int, default=20, help="draft length probed per step")
    t.add_argument("--max-num-seqs", type=int, default=8, help="concurrent requests (distinct prompts)")
    add_output_dir(t, "the group's <dataset>/engine_{trace,requests}.parquet per dataset")
    t.add_argument("--checkpoint-dir", default=None,
                   help="keep each traced dataset here as it finishes; a rerun traces only the others")
    _add_threads(t)
    t.set_defaults(func=lazy(COMMANDS, "_cmd_trace_group"))


def add_trace_tables(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench trace-tables``."""
    t = subparsers.add_parser("trace-tables", help="one dataset's trace tables out of its trace group's directory")
    t.add_argument("--group-dir", required=True)
    t.add_argument("--dataset", required=True)
    t.add_argument("--trace", required=True, help="trace table (parquet)")
    t.add_argument("--requests", required=True, help="prompts and greedy outputs of the traced run (parquet)")
    t.set_defaults(func=lazy(COMMANDS, "_cmd_trace_tables"))


def add_serve_group(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench serve-group``."""
    s = subparsers.add_parser("serve-group", help="server mode: one vLLM server, every dataset x concurrency on it")
    s.add_argument("--spec", required=True, help="resolved server group: JSON or @file, see sdbench.servermode")
    # --prompts here: a JSON map of prompt tables, one per dataset (elsewhere one table: cliargs.add_prompts)
    s.add_argument("--prompts", required=True, help='JSON: {dataset: prompt table path}')
    add_model_dirs(s)
    s.add_argument("--drafters", default=None, help='JSON: {method: drafter directory} of the arms that have one')
    s.add_argument("--output-dir", nargs="+", required=True,
                   help="one directory per arm, in the spec's order: <dataset>/c<N>/*.parquet per cell")
    s.add_argument("--server-log", required=True, help="where the server's own output goes (kept on failure)")
    _add_quiet_guard(s)
    _add_threads(s)
    # Its own module: the offline engine rules' code digests must not cover the server code.
    s.set_defaults(func=lazy("sdbench.engine.serving.servegroup", "_cmd_serve_group"))


def add_engines(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench engines conformance``."""
    e = subparsers.add_parser("engines", help="the vLLM releases sdbench runs on")
    sub = e.add_subparsers(dest="engines_command", required=True)
    c = sub.add_parser(
        "conformance",
        help="check every engine touchpoint against each release's real source (no import, no GPU)",
    )
    c.add_argument("--version", action="append", metavar="X.Y.Z", help="only this release (repeatable; default: all)")
    c.add_argument("--source-dir", action="append", default=[], metavar="VERSION=DIR",
                   help="read a release from an unpacked wheel or checkout instead of its pinned wheel (repeatable)")
    c.add_argument("--images", default="containers/images.yaml", help="where the wheels are pinned (engine_sources)")
    c.add_argument("--cache-dir", default="resources/engine-sources",
                   help="unpacked sources, downloaded once per pin (default: resources/engine-sources)")
    # --config here is repeatable: every config listed is checked (cliargs.add_config: one config read)
    c.add_argument("--config", action="append", metavar="CONFIG",
                   help="configs whose pass-through keys are checked (repeatable; default: the shipped ones)")
    c.add_argument("--offline", action="store_true", help="never download: the cache and --source-dir only")
    c.set_defaults(func=lazy("sdbench.engine.release.conformance", "_cmd_conformance"))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the engine stage's commands."""
    add_run_cell(subparsers)
    add_run_group(subparsers)
    add_cell_tables(subparsers)
    add_trace_group(subparsers)
    add_trace_tables(subparsers)
    add_serve_group(subparsers)
    add_engines(subparsers)
