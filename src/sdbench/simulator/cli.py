"""Commands of the simulator stage: ``sdbench simulate``, ``sdbench costmodel`` (and its power
model, ``costmodel power``), ``sdbench validate-simulator``, ``sdbench calibrate`` (and ``calibrate fit``, ``calibrate check``).

Argument parsing only (argparse and the standard library); each command's implementation is
imported when it runs (:mod:`sdbench.lazy`). Choices and defaults are plain constants here, the
same as the implementation's (tests/package/test_cli.py checks that they match).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sdbench.cliargs import (
    add_cells,
    add_figure,
    add_labels,
    add_markdown,
    add_output_table,
    add_prompts,
    add_seed,
    add_table_outputs,
)
from sdbench.lazy import lazy
from sdbench.simulator.choices import ADAPTIVE_SPECS  # standard library only: no start-up cost

COMMANDS = "sdbench.simulator.commands"

PROPOSERS: tuple[str, ...] = ("ngram", "eagle", "combined")  # policytypes.PROPOSERS
DEFAULT_BATCH_SIZES: tuple[int, ...] = (1, 8, 16, 32, 64, 128)  # core.DEFAULT_BATCH_SIZES
PAPER_POLICIES: tuple[str, ...] = ("fixed-1", "fixed-3", "fixed-5", "oracle")  # core.PAPER_POLICIES
MODES: tuple[str, ...] = ("compat", "exact")  # core.MODES
BATCHING: tuple[str, ...] = ("replicated", "continuous")  # core.BATCHING
COMPAT_NUM_REQUESTS = 300  # compat.COMPAT_NUM_REQUESTS
COMPAT_SEED = 42  # compat.COMPAT_SEED
STEP_COLUMNS: tuple[str, ...] = (  # costmodel.STEP_COLUMNS
    "method",
    "batch_size",
    "num_batched_tokens",
    "num_kv_tokens",
    "num_proposed_tokens",
    "verify_s",
    "propose_s",
    "step_s",
)
DEFAULT_COST_MODEL = "llama3.1-8b-h100"
CALIBRATE_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)  # calibrate.DEFAULT_BATCH_SIZES
CALIBRATE_TOKENS: tuple[int, ...] = (1, 2, 3, 4, 5, 8)  # calibrate.DEFAULT_TOKENS
CALIBRATE_CONTEXTS: tuple[int, ...] = (1024, 4096)  # calibrate.DEFAULT_CONTEXTS
DRAFTER_KINDS: tuple[str, ...] = ("eagle", "eagle3", "mtp", "draft_model")  # calibrate.DRAFTER_KINDS
HOLDOUT_RULES: tuple[str, ...] = ("every-4th", "random")  # calibratefit.HOLDOUT_RULES


def add_trace_options(p: argparse.ArgumentParser, traces_required: bool = True) -> None:
    """``--traces``, ``--batch-sizes`` and ``--cost-model`` (simulate and ``bench simulator``)."""
    p.add_argument(
        "--traces",
        nargs="+",
        required=traces_required,
        metavar="PATH",
        help="published-trace combined_<dataset>.jsonl or trace-table .parquet files",
    )
    p.add_argument("--batch-sizes", nargs="+", type=int, default=list(DEFAULT_BATCH_SIZES), metavar="N")
    p.add_argument(
        "--cost-model",
        default=DEFAULT_COST_MODEL,
        help="cost model name (shipped or in $SDBENCH_DATA_DIR/cost_models) or a YAML path "
        "(default: llama3.1-8b-h100)",
    )


def add_costmodel(subparsers: argparse._SubParsersAction) -> None:
    """Add ``costmodel fit`` and ``costmodel show``."""
    parser = subparsers.add_parser("costmodel", help="step-time cost models of the simulator")
    sub = parser.add_subparsers(dest="costmodel_command", required=True)
    fit = sub.add_parser("fit", help="least-squares fit of a cost model from per-step timings")
    fit.add_argument(
        "--steps",
        nargs="+",
        required=True,
        help=f"step table(s) (.parquet or .csv) with columns {', '.join(STEP_COLUMNS)}",
    )
    fit.add_argument(
        "--method-column",
        default="method",
        help="column naming the vLLM method of each step (run-cell breakdown tables: sd_method)",
    )
    fit.add_argument("--output", required=True, help="cost-model YAML to write")
    fit.add_argument("--name", required=True, help="name recorded in the model")
    fit.set_defaults(func=lazy("sdbench.simulator.costmodel", "_cmd_fit"))
    power = sub.add_parser(
        "power",
        help="fit the simulator's power model (watts against batched tokens per step) from measured cells",
    )
    add_cells(power)
    power.add_argument("--engine", help="only this engine's cells (whose step timings fitted the cost model)")
    power.add_argument("--model", help="only this model's cells")
    power.add_argument(
        "--output",
        required=True,
        metavar="FILE.json",
        help="power model to write (without a metered cell: no parameters, and the reason)",
    )
    power.set_defaults(func=lazy("sdbench.simulator.powermodel", "_cmd_power"))
    show = sub.add_parser("show", help="print a validated cost model")
    show.add_argument("model", help="cost model name (shipped or in $SDBENCH_DATA_DIR/cost_models) or YAML path")
    show.set_defaults(func=lazy("sdbench.simulator.costmodel", "_cmd_show"))


def add_validate_simulator(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench validate-simulator``."""
    p = subparsers.add_parser("validate-simulator", help="simulated vs measured speedup per cell")
    add_cells(p)
    p.add_argument("--simulated", nargs="+", required=True, help="sdbench simulate CSVs")
    p.add_argument("--methods", required=True, help="JSON: the config's methods section")
    add_output_table(p, "simulated vs measured speedup per cell")
    add_markdown(p, "simulated vs measured speedup per cell")
    p.set_defaults(func=lazy("sdbench.simulator.validation", "_cmd_validate"))


def add_simulate(subparsers: argparse._SubParsersAction) -> None:
    """Add ``simulate`` (with the sub-actions ``compare``, ``adaptive-report``, ``figures``)."""
    sim = subparsers.add_parser(
        "simulate",
        help="trace-replay simulation of speculative-decoding speedup",
        description="Simulate speedup from acceptance traces. Sub-actions: compare, adaptive-report, figures.",
    )
    add_trace_options(sim, traces_required=False)
    sim.add_argument("--proposer", choices=PROPOSERS)
    sim.add_argument(
        "--policy",
        nargs="+",
        default=list(PAPER_POLICIES),
        metavar="POLICY",
        help="fixed-K, oracle, oracle-combine, adaptive, goodput, goodput-fitted, learned, trust, "
        "ngram-else-eagle, dynamic-k; yardsticks hindsight-first, hindsight-ngram "
        "(default: fixed-1 fixed-3 fixed-5 oracle)",
    )
    sim.add_argument("--mode", choices=list(MODES), default="exact")
    sim.add_argument("--output", metavar="OUT.csv")  # the results as CSV, optional: not a parquet table
    sim.add_argument(
        "--num-requests",
        type=int,
        default=COMPAT_NUM_REQUESTS,
        help="requests sampled per dataset (default 300; <= 0: all, in file order)",
    )
    add_seed(sim, COMPAT_SEED, "the request sampling")
    sim.add_argument("--drafter", help="learned-drafter method standing for proposer eagle (default: eagle)")
    sim.add_argument("--engine", help="engine key of the traces (a column of every row; with --model)")
    sim.add_argument("--model", help="model key of the traces (a column of every row; with --engine)")
    _add_replay_inputs(sim)
    sim.add_argument(
        "--power-model",
        metavar="FILE.json",
        help="power model (sdbench costmodel power) for the energy bound; without one its columns are NaN",
    )
    sim.add_argument(
        "--compat-match-probability",
        type=float,
        help="compat n-gram match probability for datasets the published simulator does not know",
    )
    sim.set_defaults(func=lazy(COMMANDS, "_cmd_simulate"))
    actions = sim.add_subparsers(dest="simulate_action", required=False, metavar="{compare,adaptive-report,figures}")

    cmp_ = actions.add_parser("compare", help="compat vs exact: each correction alone, table + figure")
    add_trace_options(cmp_)
    _add_report_outputs(cmp_, "compat vs exact speedup per dataset and proposer")
    cmp_.add_argument("--no-continuous", action="store_true", help="skip the continuous-batching column")
    cmp_.set_defaults(func=lazy(COMMANDS, "_cmd_compare"))

    ada = actions.add_parser("adaptive-report", help="causal policies vs best fixed vs oracle-combine")
    add_trace_options(ada)
    _add_report_outputs(ada, "causal policies between the best fixed policy and oracle-combine")
    ada.add_argument("--policies", nargs="+", default=list(ADAPTIVE_SPECS), metavar="PROPOSER:POLICY")
    _add_replay_inputs(ada)
    ada.set_defaults(func=lazy(COMMANDS, "_cmd_adaptive"))

    fig = actions.add_parser("figures", help="Fig. 9 and Fig. 11 from simulate results")
    fig.add_argument("--results", nargs="+", required=True, metavar="CSV", help="sdbench simulate outputs")
    fig.add_argument("--fixed-vs-oracle", type=Path, metavar="PNG", help="write Fig. 9 here")
    fig.add_argument("--combining", type=Path, metavar="PNG", help="write Fig. 11 here")
    fig.set_defaults(func=lazy(COMMANDS, "_cmd_figures"))

    chk = actions.add_parser(
        "forced-check", help="the cost model at the forced-acceptance points; refit it there (ext15)"
    )
    chk.add_argument("--forced", required=True, help="results/tables/forced_acceptance.parquet")
    add_prompts(chk, many=True)
    chk.add_argument("--num-requests", type=int, default=None, help="prompts each forced cell timed (the first N)")
    chk.add_argument("--cost-model", required=True, help="the cost model fitted from the step timings")
    chk.add_argument("--name", default="forced", help="name of the refitted model (default: forced)")
    chk.add_argument("--refitted", required=True, help="output: the refitted cost model (YAML)")
    add_labels(chk)
    add_table_outputs(chk, figure="predicted vs measured", table="the check per forced cell", markdown="the check")
    chk.set_defaults(func=lazy("sdbench.simulator.forcedcheck", "_cmd_check"))


def _add_replay_inputs(parser: argparse.ArgumentParser) -> None:
    """``--batching``, ``--requests`` and ``--train-traces`` of ``simulate`` and ``simulate adaptive-report``."""
    parser.add_argument("--batching", choices=BATCHING, default="replicated")
    parser.add_argument(
        "--requests",
        nargs="+",
        default=[],
        metavar="PATH",
        help="requests tables (token ids) for trace tables lacking prompt lengths / n-gram drafts",
    )
    parser.add_argument(
        "--train-traces",
        nargs="+",
        metavar="PATH",
        help="training traces of the learned policy (default: the other --traces)",
    )


def _add_report_outputs(parser: argparse.ArgumentParser, figure: str) -> None:
    """The three files of a simulator report: its table (CSV), Markdown summary and figure."""
    parser.add_argument("--table", required=True, type=Path, metavar="CSV")
    add_markdown(parser, "the report's summary")
    add_figure(parser, figure)


def add_calibrate(subparsers: argparse._SubParsersAction) -> None:
    """Add ``calibrate`` (time a model's step on this machine) and its sub-action ``fit``."""
    cal = subparsers.add_parser(
        "calibrate",
        help="time one step of a model's shape (random weights) on this GPU or CPU; fit a cost model from it",
        description="Time one verification step (and the drafter's) of a model's architecture with random "
        "weights over a grid of batch size B, new tokens per sequence q and context length L; time and energy "
        "from one window. Sub-action: fit (a cost model and power model from such a table).",
    )
    cal.add_argument("--model", help="a config's model key (with --config), a repo id with a shipped "
                     "architecture YAML, or a config.json / model directory")  # fmt: skip
    cal.add_argument("--config", help="pipeline config whose models (and methods) --model and --method name")
    cal.add_argument("--method", help="config method key: time its drafter for --model (EAGLE, EAGLE-3, MTP, "
                     "draft model)")  # fmt: skip
    cal.add_argument("--drafter", help="drafter repo id or config.json / directory (without --config)")
    cal.add_argument("--drafter-kind", choices=DRAFTER_KINDS, help="what --drafter is (default: its architecture's)")
    cal.add_argument("--no-drafter", action="store_true", help="time the target only")
    cal.add_argument("--batch-sizes", nargs="+", type=int, default=list(CALIBRATE_BATCH_SIZES), metavar="B")
    cal.add_argument("--tokens", nargs="+", type=int, default=list(CALIBRATE_TOKENS), metavar="Q",
                     help="new tokens per sequence (the drafter: drafts per sequence)")  # fmt: skip
    cal.add_argument("--contexts", nargs="+", type=int, default=list(CALIBRATE_CONTEXTS), metavar="L",
                     help="tokens in each sequence's KV cache")  # fmt: skip
    cal.add_argument("--device", default="auto", help="auto (CUDA/ROCm where torch sees one, else cpu), cpu, cuda[:N]")
    cal.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                     help="default: bfloat16 on a GPU, float32 on the CPU")  # fmt: skip
    cal.add_argument("--no-graphs", action="store_true", help="on CUDA, run eager instead of replaying CUDA graphs")
    cal.add_argument("--window-s", type=float, default=None,
                     help="seconds of back-to-back steps per window, time and energy read at its ends "
                     "(default 1.0 on a GPU, 0.2 on the CPU)")  # fmt: skip
    cal.add_argument("--windows", type=int, default=3, help="windows per point (the median's is kept; default 3)")
    cal.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own)")
    add_seed(cal, 0, "the random weights, tokens and KV caches")
    cal.add_argument("--output", metavar="TABLE", help="the calibration table (.parquet, or .csv)")
    add_figure(cal, "ms per step against batched tokens, a line per context length", required=False)
    cal.set_defaults(func=lazy("sdbench.simulator.calibrate", "_cmd_calibrate"))
    actions = cal.add_subparsers(dest="calibrate_action", required=False, metavar="{fit,check}")
    fit = actions.add_parser("fit", help="a cost model (line or hinge, with a KV term) from a calibration table")
    fit.add_argument("--table", required=True, help="calibration table (.parquet/.csv), or any CSV with B, q, L, ms "
                     "(and joules)")  # fmt: skip
    fit.add_argument("--name", required=True, help="name recorded in the cost model")
    fit.add_argument("--output", required=True, metavar="MODEL.yaml", help="the cost model to write")
    fit.add_argument("--power-output", metavar="FILE.json",
                     help="the power model to write (without same-window energy: no parameters, and why)")  # fmt: skip
    fit.add_argument("--holdout", choices=HOLDOUT_RULES, default="every-4th",
                     help="rows held out to choose the shape: every 4th in (L, B, q) order, or a seeded random "
                     "25%% (default every-4th)")  # fmt: skip
    add_seed(fit, 0, "the random hold-out")
    fit.add_argument("--statistic", choices=("median", "min"), default="median",
                     help="each point's window of median time (default), or its fastest window (ms_min: on a "
                     "shared CPU the least disturbed; no power model from it)")  # fmt: skip
    fit.add_argument("--base", default=DEFAULT_COST_MODEL,
                     help="cost model whose drafters and per-step overhead are kept where the table has none "
                     "(default: llama3.1-8b-h100)")  # fmt: skip
    fit.add_argument("--overhead-ms", type=float, metavar="MS",
                     help="per-step overhead (ms) outside the forward pass, instead of the base's: 0 where the base "
                     "split what the calibration times as one pass (the published H100 model), or what `calibrate "
                     "check` measured on a run (step - verify - propose)")  # fmt: skip
    fit.add_argument("--board-limit-w", type=float, help="the board's power limit, to check implied watts against "
                     "(default: the table's power_limit_w)")  # fmt: skip
    fit.set_defaults(func=lazy("sdbench.simulator.calibratefit", "_cmd_fit"))
    chk = actions.add_parser("check", help="a cost model against a run's breakdown step times and measured speedups")
    chk.add_argument("--cost-model", required=True, help="cost model name or YAML path (a calibration's fit)")
    chk.add_argument("--results", default="results", help="the run's results/ directory (default: results)")
    chk.add_argument("--config", default="config/config.yaml", help="the run's config (default: config/config.yaml)")
    chk.add_argument("--output", metavar="TABLE.parquet", help="simulated vs measured per cell, priced by the model")
    chk.add_argument("--steps-output", metavar="TABLE.parquet", help="predicted vs measured step times per "
                     "breakdown cell")  # fmt: skip
    add_markdown(chk, "the check's summary", required=False)
    chk.set_defaults(func=lazy("sdbench.simulator.calibratecheck", "_cmd_check"))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the simulator stage's commands: ``costmodel``, ``validate-simulator``, ``simulate``, ``calibrate``."""
    add_costmodel(subparsers)
    add_validate_simulator(subparsers)
    add_simulate(subparsers)
    add_calibrate(subparsers)
