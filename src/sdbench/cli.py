"""Command-line entry point: one subcommand per pipeline step.

The parser is assembled from light modules: each stage's ``sdbench.<stage>.cli`` (argparse and
the standard library only) adds its commands, and this module adds those of the top-level
modules (``check-config``, ``bundle``, ``containers``). A command's ``func`` is a lazy reference
(:mod:`sdbench.lazy`): ``sdbench X`` imports X's implementation (pandas, vLLM, ...) only when
it runs X, so ``sdbench --help`` and ``sdbench X --help`` start at once.

Each command runs in a :func:`sdbench.provenance.command_scope`: a table it reads with
``measured = False`` (a rehearsal) marks what it writes, and an analysis command stamps every
table it writes with ``measured``.

Errors end a command with one line ``error: ...`` on stderr (exit code 2 for bad input, 1 for an
internal error); ``sdbench --debug X ...`` adds the traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from sdbench import provenance
from sdbench.analysis import cli as analysis_cli
from sdbench.bench import cli as bench_cli
from sdbench.cliargs import add_config
from sdbench.datasets import cli as datasets_cli
from sdbench.engine import cli as engine_cli
from sdbench.lazy import lazy
from sdbench.models import cli as models_cli
from sdbench.simulator import cli as simulator_cli
from sdbench.traces import cli as traces_cli

# --- commands of the top-level modules -----------------------------------------------------------


def _add_check_config(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench check-config`` (:mod:`sdbench.grid`; with a profile :mod:`sdbench.workflow.plan`)."""
    p = subparsers.add_parser("check-config", help="validate a config file and count its cells")
    p.add_argument("config")
    p.add_argument("--profile", default=None,
                   help="also apply this Snakemake profile's config entries (a site's limits) and print how "
                        "engine groups are split to fit")
    p.add_argument("--jobs", action="store_true",
                   help="also print every engine job (rule, wildcards, GPUs, mem_mb, the estimate's parts in "
                        "minutes, its runtime request) as a tab-separated table, and their totals")
    p.set_defaults(func=lazy("sdbench.workflow.plan", "_cmd_check_config"))


def _add_figure_index(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench figure-index`` (:mod:`sdbench.figureindex`)."""
    p = subparsers.add_parser("figure-index", help="print the figure index: item -> rule -> output -> function")
    p.set_defaults(func=lazy("sdbench.figureindex", "_cmd_index"))


def _environment(spec: str) -> tuple[str, Path]:
    """``bundle create --environment NAME=FREEZE.txt`` as ``(name, path)``."""
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected NAME=FREEZE.txt")
    return name, Path(path)


def _add_bundle(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench bundle create|verify|config`` (:mod:`sdbench.bundle`)."""
    p = subparsers.add_parser("bundle", help="frozen, checksummed RO-Crate archive of a finished run")
    sub = p.add_subparsers(dest="bundle_command", required=True)

    c = sub.add_parser("create", help="write the run's results, report and provenance into one .tar.gz")
    c.add_argument("--output", required=True, type=Path, metavar="ARCHIVE.tar.gz")
    c.add_argument("--results", required=True, type=Path, metavar="DIR", help="results directory of the run")
    c.add_argument(
        "--workflow",
        type=Path,
        default=Path("Snakefile"),
        metavar="SNAKEFILE",
        help="main Snakefile: the crate's main entity; bundle paths are relative to its directory",
    )
    c.add_argument(
        "--workflow-files",
        nargs="*",
        type=Path,
        default=[],
        metavar="PATH",
        help="rule files / directories of the workflow (below the Snakefile's directory)",
    )
    c.add_argument("--report", type=Path, help="Snakemake HTML report")
    c.add_argument("--config", type=Path, help="resolved config (YAML)")  # a file to pack, not one to read
    c.add_argument("--containers", type=Path, metavar="images.yaml", help="container image digests (may be absent)")
    c.add_argument(
        "--environment",
        action="append",
        type=_environment,
        metavar="NAME=FREEZE.txt",
        help="pip freeze of an environment (repeatable)",
    )
    c.add_argument(
        "--snakemake-dir",
        type=Path,
        metavar=".snakemake",
        help="read the run's start/end time and container images from Snakemake's metadata",
    )
    c.add_argument(
        "--containers-used",
        action="store_true",
        help="the run's jobs ran in the images Snakemake recorded (--sdm apptainer)",
    )
    c.add_argument("--start-time", help="run start (ISO 8601), overrides --snakemake-dir")
    c.add_argument("--end-time", help="run end (ISO 8601), overrides --snakemake-dir")
    c.add_argument("--date-published", help="root datePublished (ISO 8601; default $SOURCE_DATE_EPOCH, else end time)")
    c.add_argument("--allow-rehearsal", action="store_true",
                   help="bundle a run with rehearsal cells (measured = false); without it such a run is refused "
                        "(exit code 2)")  # fmt: skip
    c.set_defaults(func=lazy("sdbench.bundle", "_cmd_create"))

    v = sub.add_parser("verify", help="re-check every checksum of a bundle (archive or unpacked directory)")
    v.add_argument("path", type=Path, metavar="PATH")
    v.set_defaults(func=lazy("sdbench.bundle", "_cmd_verify"))

    r = sub.add_parser("config", help="write the resolved config (JSON, as Snakemake holds it) as YAML")
    r.add_argument("--json", required=True, help="the config as a JSON string")
    r.add_argument("--output", required=True, type=Path, metavar="resolved.yaml")
    r.set_defaults(func=lazy("sdbench.bundle", "_cmd_config"))


def _add_compare(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench compare A B`` (:mod:`sdbench.analysis.runcompare`)."""
    p = subparsers.add_parser(
        "compare", help="two runs or bundles cell by cell: speedup, throughput, acceptance; a regression gate"
    )
    p.add_argument("runs", nargs=2, metavar="RUN", help="results directory, bundle (.tar.gz) or cells.parquet")
    bench_cli.compare_options(p)


def _add_containers(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench containers render`` (:mod:`sdbench.containers`) and ``containers check``
    (:mod:`sdbench.containercheck`)."""
    p = subparsers.add_parser("containers", help="render / check the Apptainer definition files")
    sub = p.add_subparsers(dest="containers_command", required=True)
    for name, module, help_ in (
        ("render", "sdbench.containers", "write containers/<name>.def for every image of images.yaml"),
        ("check", "sdbench.containercheck", "verify the definitions: digest pins, labels, %%test, up to date"),
    ):
        q = sub.add_parser(name, help=help_)
        q.add_argument("--images", help="images file (default: <output-dir>/images.yaml)")
        # --output-dir here: optional, the .def files (cliargs.add_output_dir: an engine command's results)
        q.add_argument("--output-dir", default="containers", help="directory of the .def files (default: containers)")
        if name == "check":
            q.add_argument("--offline", action="store_true",
                           help="do not download source archives to check their build requirements (warn instead)")
        q.set_defaults(func=lazy(module, f"_cmd_{name}"))


def _add_doctor(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench doctor`` (:mod:`sdbench.doctor`)."""
    p = subparsers.add_parser("doctor", help="check this site before a run: venv, Snakemake, Apptainer, hub, SLURM")
    # --config here defaults to the profile's configfile (cliargs.add_config: to config/config.yaml)
    p.add_argument("--config", help="config file (default: the profile's configfile, else config/config.yaml)")
    p.add_argument("--profile", metavar="PROFILE_DIR", help="Snakemake profile directory, e.g. profiles/slurm")
    p.add_argument("--offline", action="store_true", help="skip the checks that need the Hugging Face hub")
    p.add_argument("--cost-model", help="a cost model to validate (name or YAML, e.g. sdbench calibrate fit's): its "
                   "source, device and held-out error")  # fmt: skip
    p.set_defaults(func=lazy("sdbench.doctor", "_cmd_doctor"))


def _add_image_gate(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench image-gate`` (:mod:`sdbench.imagegate`)."""
    p = subparsers.add_parser("image-gate", help="inside an engine image, before its engine jobs: GPU and driver")
    p.add_argument("--image", required=True, help="the image's name (containers/images.yaml), e.g. sdbench-vllm-0.26.0")
    p.add_argument("--rehearsal", action="store_true", help="a rehearsal: without nvidia-smi, pass and say so")
    p.add_argument("--output", required=True, help="where the passed gate writes what it saw (JSON)")
    p.set_defaults(func=lazy("sdbench.imagegate", "_cmd_image_gate"))


def _add_rehearsal(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench rehearsal estimates|marks|prepare-dataset|standin-model`` (:mod:`sdbench.rehearsal.report`,
    :mod:`sdbench.rehearsal.prepare`)."""
    r = subparsers.add_parser("rehearsal", help="a rehearsal's inputs and modelled engine jobs (engine_mode: rehearsal)")
    sub = r.add_subparsers(dest="rehearsal_command", required=True)
    e = sub.add_parser("estimates", help="each engine job's requested runtime against its rehearsal's modelled time")
    add_config(e, "the rehearsed grid", required=True)
    e.add_argument("--profile", default=None, help="also apply this Snakemake profile's config entries (a site's split)")
    e.add_argument("--root", default=".", help="working directory of the rehearsal (default: .)")
    e.add_argument("--output", default=None, help="also write the table here (parquet)")
    e.set_defaults(func=lazy("sdbench.rehearsal.report", "_cmd_estimates"))
    k = sub.add_parser("marks", help="every figure and table under results/paper: is each marked as a rehearsal?")
    k.add_argument("--paper-dir", default="results/paper", help="a run's results/paper (default: results/paper)")
    k.add_argument("--expect", nargs="*", default=None, metavar="ITEM",
                   help="figure-index items that must have a file (default: every item of the index; none: "
                        "--expect alone)")
    k.add_argument("--markdown", default=None, help="also write the report here")
    k.set_defaults(func=lazy("sdbench.rehearsal.report", "_cmd_marks"))
    # What the prepare_dataset and download_model rules run in a rehearsal (sdbench.rehearsal.prepare).
    datasets_cli.add_prepare_dataset(sub)
    p = sub.choices["prepare-dataset"]
    p.description = "prepare-dataset of a rehearsal: a rehearsal prompt set for a hub dataset or a stand-in tokenizer"
    p.add_argument("--rehearsal-traces", nargs="+", required=True, metavar="NAME=PATH",
                   help="the published traces the prompt sets take lengths and records from (gsm8k=..., instructcoder=...)")
    p.set_defaults(func=lazy("sdbench.rehearsal.prepare", "_cmd_prepare"))
    m = sub.add_parser("standin-model", help="a stand-in model directory: config.json and a marker, no weights")
    m.add_argument("--repo", required=True, help="Hugging Face repo id whose shipped architecture config it takes")
    m.add_argument("--revision", default="main", help="recorded in the marker")
    m.add_argument("--output", required=True, help="output directory")
    m.set_defaults(func=lazy("sdbench.rehearsal.prepare", "_cmd_standin_model"))


# Every command: name -> the function adding its parser. `sdbench --help` lists TOOLS first (what
# a user runs by hand, in this order), then the pipeline's own steps (what the rules run).
COMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "trace": traces_cli.add_trace,
    "bench": bench_cli.add_bench,
    "acceptance": analysis_cli.add_acceptance,
    "fetch": traces_cli.add_fetch,
    "check-config": _add_check_config,
    "figure-index": _add_figure_index,
    "prepare-dataset": datasets_cli.add_prepare_dataset,
    "speed-bench-sample": datasets_cli.add_speed_bench_sample,
    "datasets": datasets_cli.add_datasets,
    "run-cell": engine_cli.add_run_cell,
    "run-group": engine_cli.add_run_group,
    "cell-tables": engine_cli.add_cell_tables,
    "trace-group": engine_cli.add_trace_group,
    "trace-tables": engine_cli.add_trace_tables,
    "serve-group": engine_cli.add_serve_group,
    "aggregate": analysis_cli.add_aggregate,
    "verdict": analysis_cli.add_verdict,
    "forced-acceptance": analysis_cli.add_forced_acceptance,
    "plot-throughput": analysis_cli.add_plot_throughput,
    "download-model": models_cli.add_download_model,
    "download-dataset": models_cli.add_download_dataset,
    "memory-table": analysis_cli.add_memory_table,
    "cost": analysis_cli.add_cost,
    "energy": analysis_cli.add_energy,
    "latency": analysis_cli.add_latency,
    "goodput-frontier": analysis_cli.add_goodput_frontier,
    "mode-parity": analysis_cli.add_mode_parity,
    "proposal-length": analysis_cli.add_proposal_length,
    "random-inputs": analysis_cli.add_random_inputs,
    "temperature": analysis_cli.add_temperature,
    "category-acceptance": analysis_cli.add_category_acceptance,
    "memory": analysis_cli.add_memory,
    "bleu": analysis_cli.add_bleu,
    "build-tokenizer": models_cli.add_build_tokenizer,
    "train-model": models_cli.add_train_model,
    "train-head": models_cli.add_train_head,
    "costmodel": simulator_cli.add_costmodel,
    "breakdown": analysis_cli.add_breakdown,
    "validate-simulator": simulator_cli.add_validate_simulator,
    "simulate": simulator_cli.add_simulate,
    "calibrate": simulator_cli.add_calibrate,
    "bundle": _add_bundle,
    "containers": _add_containers,
    "check-model": models_cli.add_check_model,
    "engines": engine_cli.add_engines,
    "compare": _add_compare,
    "doctor": _add_doctor,
    "rehearsal": _add_rehearsal,
    "image-gate": _add_image_gate,
}
# What a user runs by hand, listed first by ``sdbench --help``; the rest are the pipeline's steps.
TOOLS = (
    "doctor", "check-config", "compare", "verdict", "engines", "containers", "bundle", "simulate", "memory", "bench",
    "figure-index", "fetch", "download-model", "check-model", "costmodel", "calibrate", "datasets", "rehearsal",
)  # fmt: skip
# The stages' command modules (each has register(subparsers) adding all its commands).
STAGE_CLIS = (traces_cli, bench_cli, analysis_cli, datasets_cli, engine_cli, models_cli, simulator_cli)

DEBUG_ENV = "SDBENCH_DEBUG"  # SDBENCH_DEBUG=1 acts like --debug (e.g. inside Snakemake rules)
EXIT_USER_ERROR = 2  # bad input: file, key, value or argument (also argparse's code)
EXIT_INTERNAL_ERROR = 1  # anything else: most likely a bug


class _Parser(argparse.ArgumentParser):
    """Argument errors as one line on stderr (no usage block), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER_ERROR, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every command (:data:`COMMANDS`); imports no implementation."""
    parser = _Parser(
        prog="sdbench",
        description="Speculative decoding on production inference engines: the benchmark pipeline's commands.",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help=f"on an error, print the traceback too (also: {DEBUG_ENV}=1)",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="tools")
    for name in (*TOOLS, *(n for n in COMMANDS if n not in TOOLS)):
        COMMANDS[name](subparsers)
    # The pipeline's steps in a section of their own (argparse lists one subparser group: move
    # their help lines into another group; parsing is unchanged).
    steps = parser.add_argument_group("pipeline steps (the workflow's rules run these; see docs/configuration.md)")
    listed = subparsers._choices_actions
    steps._group_actions.extend(a for a in listed if a.dest not in TOOLS)
    listed[:] = [a for a in listed if a.dest in TOOLS]
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
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    try:
        with provenance.command_scope(stamp=provenance.stamps(getattr(args.func, "module", ""))):
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


def entry() -> None:
    """The ``sdbench`` console script and ``python -m sdbench.cli``: :func:`main` on the process's
    arguments; an engine command's process then ends without the interpreter's teardown
    (:func:`sdbench.processexit.end`: seconds per engine start)."""
    from sdbench.engine.site.quietguard import ENGINE_COMMANDS

    code = main()
    command = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    if command in ENGINE_COMMANDS:
        from sdbench.processexit import end

        end(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
