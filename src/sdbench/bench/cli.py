"""The ``sdbench bench`` command group: micro-benchmarks of pipeline components (not pipeline steps).

``bench tracer`` (:mod:`sdbench.bench.tracer`), ``bench simulator`` (:mod:`sdbench.bench.simulator`),
``bench parity`` (:mod:`sdbench.bench.parity`), ``bench engine-sharing`` (:mod:`sdbench.bench.sharing`),
``bench aggregate-inputs`` (:mod:`sdbench.bench.aggregateinputs`),
``bench coverage`` (:mod:`sdbench.bench.coverage`),
``bench serve-parity`` (:mod:`sdbench.bench.serveparity`), ``bench modes`` (:mod:`sdbench.bench.modes`), ``bench timeline``
(:mod:`sdbench.bench.timeline`), ``bench job-usage`` (:mod:`sdbench.bench.jobusage`) and ``bench compare-runs`` (an alias of ``sdbench compare``,
:mod:`sdbench.analysis.runcompare`). Argument parsing only (argparse and the
standard library); each benchmark's implementation is imported when it runs (:mod:`sdbench.lazy`).
"""

from __future__ import annotations

import argparse
import sys

from sdbench.cliargs import (
    add_config,
    add_figure,
    add_markdown,
    add_model_dirs,
    add_output_table,
    add_prompts,
    add_seed,
)
from sdbench.lazy import lazy
from sdbench.simulator.cli import add_trace_options

PARITY_REPEATS = 3  # parity.DEFAULT_REPEATS


def add_tracer(bench: argparse._SubParsersAction) -> None:
    """Add ``bench tracer``."""
    tracer = bench.add_parser("tracer", help="time the fast n-gram tracer vs the reference")
    tracer.add_argument("--traces", nargs="+", required=True, help="published .jsonl / requests .parquet")
    tracer.add_argument(
        "--reference-budget",
        type=float,
        default=60.0,
        help="seconds to spend on the quadratic reference before extrapolating (default 60)",
    )
    add_seed(tracer, 0, "the reference subset")
    tracer.set_defaults(func=lazy("sdbench.bench.tracer", "_cmd_bench_tracer"))


def add_aggregate_inputs(bench: argparse._SubParsersAction) -> None:
    """Add ``bench aggregate-inputs``."""
    p = bench.add_parser("aggregate-inputs",
                         help="synthetic summary/requests tables of a config's grid at real row counts")  # fmt: skip
    add_config(p, "the grid")
    p.add_argument("--output-dir", required=True, help="where to write <engine>/<model>/<dataset>/<method>/bs<N>/")
    for key, what in (("engines", "engine"), ("models", "model"), ("datasets", "dataset"), ("methods", "method")):
        p.add_argument(f"--{key}", nargs="+", default=None, help=f"only these {what} keys (default: all)")
    p.add_argument("--batch-sizes", nargs="+", type=int, default=None, help="only these batch sizes (default: all)")
    p.add_argument("--full-rows", action="store_true",
                   help="every row with its prompt ids and its own output ids and text, int64 (the older layout)")
    add_seed(p, 0, "the synthetic lengths and tokens")
    p.set_defaults(func=lazy("sdbench.bench.aggregateinputs", "_cmd_aggregate_inputs"))


def add_simulator(bench: argparse._SubParsersAction) -> None:
    """Add ``bench simulator``."""
    p = bench.add_parser("simulator", help="time the paper grid in compat mode vs the published simulator")
    add_trace_options(p)
    p.add_argument(
        "--published-simulator",
        metavar="DIR",
        help="checkout of SpecDecode-Bench/simulator to run and time (else only ours is timed)",
    )
    p.add_argument("--python", default=sys.executable, help="interpreter for the published simulator")
    p.add_argument("--repeat", type=int, default=3, help="timed repetitions of ours (best is reported)")
    p.set_defaults(func=lazy("sdbench.bench.simulator", "_cmd_bench_simulator"))


def add_parity(bench: argparse._SubParsersAction) -> None:
    """Add ``bench parity``."""
    p = bench.add_parser(
        "parity", help="one cell through sdbench's runner and `vllm bench throughput`; throughput ratio"
    )
    add_config(p, "the cell")
    p.add_argument("--engine", default=None, help="engine key (default: the config's first engine)")
    p.add_argument("--model", required=True, help="model key, e.g. tiny-target")
    p.add_argument("--dataset", required=True, help="dataset key, e.g. code-edit")
    p.add_argument("--method", required=True, help="method key, e.g. none or ngram-k3")
    p.add_argument("--batch-size", type=int, required=True, help="max_num_seqs (all prompts are submitted at once)")
    add_model_dirs(p)
    add_prompts(p)
    p.add_argument("--num-prompts", type=int, default=None, help="first N prompts (default: all)")
    p.add_argument("--max-tokens", type=int, default=None, help="output tokens per request (default: the dataset's)")
    p.add_argument("--repeats", type=int, default=PARITY_REPEATS, help="runs per side, alternating order (default 3)")
    p.add_argument("--workdir", required=True, help="directory for the prompt files, per-run results and logs")
    p.add_argument("--output-json", default=None, help="write the full report here")
    p.add_argument(
        "--vllm-sampling",
        choices=("runner", "tool"),
        default="runner",
        help="runner (default): the tool samples with the runner's greedy SamplingParams; "
        "tool: its hard-coded temperature 1.0 (not like with like)",
    )
    p.add_argument(
        "--vllm-env",
        choices=("runner", "tool"),
        default="runner",
        help="runner (default): the tool runs with the runner's engine env (in-process engine core); "
        "tool: the inherited env (the tool's default multiprocess engine core)",
    )
    p.add_argument(
        "--quiet-threshold",
        type=float,
        default=0.15,
        help="before each run wait until the machine's CPUs are busy less than this share (5 s window); "
        "a run during which other processes used more is reported as contended (default 0.15)",
    )
    p.add_argument("--retries", type=int, default=2, help="reruns of a contended run (default 2)")
    p.add_argument("--quiet-wait", type=float, default=600.0, help="longest wait for a quiet machine, s (default 600)")
    p.set_defaults(func=lazy("sdbench.bench.parity", "_cmd_bench_parity"))


def add_engine_sharing(bench: argparse._SubParsersAction) -> None:
    """Add ``bench engine-sharing``."""
    p = bench.add_parser(
        "engine-sharing", help="an engine group's cells on one shared engine vs each on a fresh engine"
    )
    add_config(p, "the group")
    p.add_argument("--engine", default=None, help="engine key (default: the config's first engine)")
    p.add_argument("--model", required=True, help="model key, e.g. tiny-target")
    p.add_argument("--method", required=True, help="method key, e.g. ngram-k3")
    add_model_dirs(p)
    p.add_argument("--results", default="results", help="a workflow's results/ (prompt tables; default results)")
    p.add_argument("--rounds", type=int, default=1, help="shared and fresh runs each, alternating order (default 1)")
    p.add_argument("--workdir", required=True, help="directory for both sides' tables and logs")
    p.add_argument("--output-json", default=None, help="write the comparison here")
    p.set_defaults(func=lazy("sdbench.bench.sharing", "_cmd_bench_engine_sharing"))


def add_timeline(bench: argparse._SubParsersAction) -> None:
    """Add ``bench timeline``."""
    p = bench.add_parser(
        "timeline", help="a workflow run's wall time split into stages, from its Snakemake log"
    )
    p.add_argument("--log", required=True, help=".snakemake/log/<date>.snakemake.log of the run")
    p.add_argument("--setup-seconds", type=float, default=None, help="setup (bootstrap) wall time to add")
    add_output_table(p, "the jobs table", required=False)
    p.add_argument("--results", default=None,
                   help="the run's results/ directory: also split each engine job (start-up, warm-up, timed, other)")
    p.set_defaults(func=lazy("sdbench.bench.timeline", "_cmd_bench_timeline"))


def add_job_usage(bench: argparse._SubParsersAction) -> None:
    """Add ``bench job-usage``."""
    p = bench.add_parser(
        "job-usage", help="every SLURM job's peak memory and time against its asks; exit 1 if one failed or went over"
    )
    p.add_argument("--usage-dir", required=True,
                   help="the per-job records (<job_id>.json) of tests/support/slurm_usage.py")
    add_output_table(p, "one row per job", required=False)
    add_markdown(p, "the report", required=False)
    p.set_defaults(func=lazy("sdbench.bench.jobusage", "_cmd_bench_job_usage"))


def compare_options(p: argparse.ArgumentParser) -> None:
    """Options of ``sdbench compare`` (and of its alias ``bench compare-runs``) after the two runs."""
    p.add_argument("--threshold", type=float, default=None, metavar="FRACTION",
                   help="exit 1 when a cell's speedup or throughput in B is lower by more than this "
                        "(e.g. 0.1) with disjoint intervals: a CI gate")  # fmt: skip
    p.add_argument("--gate", choices=("speedup", "throughput", "both"), default="both",
                   help="what --threshold judges (default both); speedup, paired with no SD in the same process, "
                        "survives a machine whose speed changed between the runs, throughput does not")  # fmt: skip
    # --config here: optional, no default; only the method labels come from it (unlike cliargs.add_config)
    p.add_argument("--config", default=None, help="config whose method labels to print (default: method keys)")
    add_markdown(p, "the table and summary", required=False)
    add_figure(p, "B against A per cell, speedup and throughput", required=False)
    add_output_table(p, "the joined table", required=False)
    p.add_argument("--max-half-width", type=float, default=0.05, help="median half-width criterion (default 0.05)")
    p.add_argument("--check", action="store_true", help="also exit 1 unless the runs agree and both are narrow")
    p.add_argument("--common", action="store_true", help="compare the cells both runs measured (a grid that grew)")
    p.add_argument("--allow-rehearsal", action="store_true",
                   help="compare a rehearsal's cells (measured = false) too: a real run against its rehearsal, "
                        "cell by cell (without it such a run is refused, exit code 2)")  # fmt: skip
    p.set_defaults(func=lazy("sdbench.analysis.runcompare", "_cmd_compare"))


def add_compare_runs(bench: argparse._SubParsersAction) -> None:
    """Add ``bench compare-runs``: ``sdbench compare`` under its earlier name."""
    p = bench.add_parser("compare-runs", help="alias of `sdbench compare` (two runs cell by cell)")
    p.add_argument("--runs", nargs=2, required=True, metavar=("A", "B"),
                   help="the two runs: results directories, bundles or cells.parquet files")
    compare_options(p)


def add_modes(bench: argparse._SubParsersAction) -> None:
    """Add ``bench modes``."""
    p = bench.add_parser("modes", help="served speedup with a stream-off control over interleaved server starts; "
                         "offline vs served and interval widths")  # fmt: skip
    add_config(p, "the entries")
    p.add_argument("--engine", default="vllm-cpu", help="engine key (default vllm-cpu)")
    p.add_argument("--model", default="tiny-target", help="model key (default tiny-target)")
    p.add_argument("--dataset", default="code-edit", help="dataset key of --prompts (default code-edit)")
    p.add_argument("--methods", nargs="+", default=["ngram-k3", "eagle3-k3"], help="SD method keys (no SD is added)")
    p.add_argument("--model-dir", required=True, help="target model directory (HF format)")
    p.add_argument("--drafters", default=None, help="JSON: method key -> drafter directory")
    add_prompts(p)
    p.add_argument("--num-prompts", type=int, default=8, help="first N prompts of the table (default 8)")
    p.add_argument("--max-tokens", type=int, default=None, help="output budget (default: the dataset's)")
    p.add_argument("--loads", nargs="+", type=int, default=[1, 8], help="requests in flight (default 1 8)")
    p.add_argument("--starts", type=int, default=3, help="server starts per method, interleaved (default 3)")
    p.add_argument("--rounds", type=int, default=2, help="timed streamed rounds per start and load (default 2)")
    p.add_argument("--requests-per-level", type=int, default=16, help="requests per round (default 16)")
    p.add_argument("--warmup", type=int, default=2, help="untimed requests per start and load (default 2)")
    p.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for /health")
    p.add_argument("--output-dir", required=True, help="output: <method>/<dataset>/c<load>/ as serve-group's")
    p.add_argument("--offline-cells", default=None, help="a run's grid_cells.parquet: the offline side")
    p.add_argument("--output", default=None, help="output: the offline vs served table (parquet)")
    p.add_argument("--markdown", default=None, help="output: widths and the offline vs served table (Markdown)")
    p.add_argument("--analyse-only", action="store_true", help="no server: report on --output-dir's measurement")
    p.set_defaults(func=lazy("sdbench.bench.modes", "_cmd_bench_modes"))


def add_serve_parity(bench: argparse._SubParsersAction) -> None:
    """Add ``bench serve-parity``."""
    p = bench.add_parser(
        "serve-parity", help="the server-mode client vs `vllm bench serve` on one server: throughput and TPOT ratios"
    )
    add_config(p, "the entries")
    p.add_argument("--engine", default="vllm-cpu", help="engine key (default vllm-cpu)")
    p.add_argument("--model", required=True, help="model key, e.g. tiny-target")
    p.add_argument("--method", required=True, help="method key, e.g. none or ngram-k3")
    add_model_dirs(p)
    add_prompts(p)
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight (default 4)")
    p.add_argument("--num-requests", type=int, default=32, help="requests per round (prompts cycled; default 32)")
    p.add_argument("--max-tokens", type=int, default=128, help="output tokens per request (ignore_eos; default 128)")
    p.add_argument("--rounds", type=int, default=4, help="rounds per client, alternating who goes first (default 4)")
    add_seed(p, 0, "vllm bench serve's random draws")
    p.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for /health")
    p.add_argument("--server-log", default=None, help="keep the server's log here (default: a temporary file)")
    p.set_defaults(func=lazy("sdbench.bench.serveparity", "_cmd_bench_serve_parity"))


def add_coverage(bench: argparse._SubParsersAction) -> None:
    """Add ``bench coverage``."""
    p = bench.add_parser("coverage", help="coverage of the 95% intervals and A/A false verdicts, simulated")
    p.add_argument("--runs", type=int, default=200, help="simulated runs per design and true speedup (default 200)")
    p.add_argument("--resamples", type=int, default=400, help="bootstrap draws of the 'before' intervals")
    spreads = (("process", 0.04, "an engine process's speed"), ("instance", 0.03, "an engine instance's own speed"),
               ("trial", 0.03, "a call's"), ("round", 0.02, "a server round's"))  # fmt: skip
    for name, default, what in spreads:
        p.add_argument(f"--{name}-sd", type=float, default=default, help=f"log sd of {what} (default {default})")
    p.add_argument("--margin", type=float, default=0.03, help="the equivalence margin of 'break-even' (default 0.03)")
    add_seed(p, 0, "the simulation")
    p.add_argument("--output", default=None, help="the study's table (parquet)")
    add_markdown(p, "the study's table", required=False)
    p.set_defaults(func=lazy("sdbench.bench.coverage", "_cmd_bench_coverage"))


def add_bench(subparsers: argparse._SubParsersAction) -> None:
    """Add ``bench`` and its benchmarks."""
    parser = subparsers.add_parser("bench", help="micro-benchmarks of pipeline components")
    bench = parser.add_subparsers(dest="bench_command", required=True)
    for add in (add_tracer, add_simulator, add_parity, add_serve_parity, add_modes, add_engine_sharing, add_timeline,
                add_job_usage, add_compare_runs, add_aggregate_inputs, add_coverage):
        add(bench)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``bench`` command group."""
    add_bench(subparsers)
