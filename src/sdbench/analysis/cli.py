"""Commands of the analysis stage: ``sdbench aggregate``, ``plot-throughput``, ``memory``,
``memory-table``, ``cost``, ``latency``, ``goodput-frontier``, ``mode-parity``, ``proposal-length``, ``random-inputs``,
``temperature``, ``category-acceptance``, ``bleu``, ``acceptance`` and ``breakdown``.

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

# memory: SD methods and serving dtypes it accounts for (analysis.memory.METHODS, models.spec.DTYPE_BYTES)
METHODS: tuple[str, ...] = ("none", "ngram", "eagle", "eagle3", "draft_model", "mtp", "medusa")
DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float32")
# bleu: BLEU orders and bases (analysis.bleu.DEFAULT_ORDER, MAX_ORDER, BASES)
DEFAULT_ORDER = 4
MAX_ORDER = 10
BASES: tuple[str, ...] = ("auto", "text", "ids")
# goodput-frontier: targets per axis of the grid (analysis.goodputfrontier.GRID_POINTS)
FRONTIER_GRID = 24


def add_aggregate(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench aggregate``."""
    p = subparsers.add_parser("aggregate", help="join cell summaries; speedups; Tab. 1")
    p.add_argument("--summaries", nargs="+", required=True, help="summary.parquet of every cell")
    p.add_argument("--calls", nargs="+", default=None,
                   help="calls.parquet of every cell, in --summaries' order: the engine starts the intervals rest on")
    p.add_argument("--baseline-calls", nargs="+", default=None,
                   help="baseline_calls.parquet of every cell, in --summaries' order (a paired cell's no-SD arm)")
    p.add_argument("--requests", nargs="+", default=None,
                   help="requests.parquet of every cell (needed by --lengths and --divergence)")
    p.add_argument("--baseline", required=True, help="method key of the no-SD baseline")
    # --cells is this command's output (every other command reads it: cliargs.add_cells)
    p.add_argument("--cells", required=True, help="output: joined cell table (parquet)")
    p.add_argument("--speedups-md", default=None, help="output: speedups with intervals (Markdown)")
    p.add_argument("--lengths", default=None, help="output: Tab. 1 generation lengths (parquet)")
    p.add_argument("--lengths-md", default=None, help="output: Tab. 1 rendered as Markdown")
    p.add_argument("--divergence", default=None, help="output: share of outputs differing from no-SD")
    p.add_argument("--divergence-md", default=None, help="output: the same, rendered as Markdown")
    p.add_argument("--sweeps", default="{}",
                   help='JSON {"methods": {key: sweep}, "datasets": {key: sweep}}: keys only a sweep runs (column sweep)')
    p.set_defaults(func=lazy("sdbench.analysis.endtoend", "_cmd_aggregate"))


def add_verdict(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench verdict``."""
    p = subparsers.add_parser("verdict", help="does SD pay, per model x method x dataset and load (ext00)")
    add_cells(p)
    p.add_argument("--server", default=None, help="results/tables/server.parquet (server mode), if any")
    p.add_argument("--frontier", default=None, help="goodput_frontier.parquet (ext17): shown beside the goodput squares")
    p.add_argument("--max-load", default=None, help="goodput_max_load.parquet (ext17): shown beside the goodput squares")
    p.add_argument("--equivalence-margin", type=float, default=0.03,
                   help="break-even only inside [1/(1+m), 1+m] (config verdict.equivalence_margin; default 0.03)")
    add_labels(p)
    add_table_outputs(
        p,
        figure="each method x load colored by verdict, labelled with its speedup",
        table="one row per SD point with its verdict",
        markdown="the verdict in words and tables",
    )
    p.set_defaults(func=lazy("sdbench.analysis.verdict", "_cmd_verdict"))


def add_plot_throughput(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench plot-throughput``."""
    q = subparsers.add_parser("plot-throughput", help="Fig. 1/2: throughput and speedup vs batch size")
    add_cells(q)
    # --output is this command's PNG (Fig. 1/2), written only when given
    q.add_argument("--output", default=None, help="PNG path: Fig. 1/2")
    q.add_argument("--acceptance", default=None, help="PNG path: acceptance rate by draft position")
    q.set_defaults(func=lazy("sdbench.analysis.endtoend", "_cmd_plot"))


def add_memory_table(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench memory-table``."""
    t = subparsers.add_parser("memory-table", help="analytical vs measured memory per cell")
    add_cells(t)
    t.add_argument("--models", required=True, help="JSON: model key -> repo id or model directory")
    t.add_argument("--dtype", choices=DTYPES, default=None)
    add_output_table(t, "analytical vs measured memory per cell")
    add_figure(t, "analytical vs measured weights and KV cache per token")
    add_markdown(t, "Tab. 2/3 per engine x model x method", required=False)
    t.set_defaults(func=lazy("sdbench.analysis.memory", "_cmd_memory_table"))


def add_cost(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench cost``."""
    c = subparsers.add_parser("cost", help="cost per 1M output tokens and per request, per cell")
    add_cells(c)
    c.add_argument("--prices", required=True, help="JSON: engine key -> price per device-hour")
    c.add_argument("--devices", default="{}", help="JSON: model key -> devices per engine instance (default 1)")
    c.add_argument("--currency", default="USD")
    c.add_argument("--source", default="", help="where the prices come from (printed above the table)")
    add_table_outputs(c, "cost per 1M output tokens vs batch size")
    c.set_defaults(func=lazy("sdbench.analysis.cost", "_cmd_cost"))


def add_energy(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench energy``."""
    c = subparsers.add_parser("energy", help="joules per output token beside tokens/s per cell; SD's energy ratio")
    add_cells(c)
    add_table_outputs(c, "tokens/s and joules per output token vs batch size, per method")
    c.set_defaults(func=lazy("sdbench.analysis.energy", "_cmd_energy"))


def add_latency(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench latency``."""
    c = subparsers.add_parser("latency", help="server mode: latency-throughput trade-off and cost per concurrency")
    c.add_argument("--groups", nargs="+", required=True, help="server group directories (serve-group)")
    c.add_argument("--prices", required=True, help="JSON: engine key -> price per device-hour")
    c.add_argument("--devices", default="{}", help="JSON: model key -> devices per engine instance (default 1)")
    c.add_argument("--currency", default="USD")
    c.add_argument("--source", default="", help="where the prices come from (printed above the table)")
    c.add_argument("--slo", default="{}", help="JSON: dataset -> latency targets {ttft_ms, tpot_ms, e2e_ms} (goodput)")
    c.add_argument("--seed", type=int, default=42, help="seed of goodput's bootstrap (the config's)")
    add_table_outputs(c, "TPOT p50 vs output tokens/s per device, per method")
    c.set_defaults(func=lazy("sdbench.analysis.latency", "_cmd_latency"))


def add_goodput_frontier(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench goodput-frontier``."""
    c = subparsers.add_parser(
        "goodput-frontier", help="server mode: where SD's goodput is higher over every TTFT x TPOT target; max load"
    )
    c.add_argument("--groups", nargs="+", required=True, help="server group directories (serve-group)")
    c.add_argument("--slo", default="{}", help="JSON: dataset -> your latency targets {ttft_ms, tpot_ms, e2e_ms}")
    c.add_argument("--seed", type=int, default=42, help="seed of goodput's bootstrap (the config's)")
    c.add_argument("--grid", type=int, default=FRONTIER_GRID,
                   help=f"targets per axis of the frontier's grid (default {FRONTIER_GRID})")  # fmt: skip
    add_labels(c)
    add_table_outputs(c, "the frontier: a panel per SD arm x concurrency, TTFT x TPOT targets by region",
                      table="one row per SD arm x concurrency x target with its region")  # fmt: skip
    c.add_argument("--max-load", required=True, help="output: each arm's highest load meeting each target (parquet)")
    c.set_defaults(func=lazy("sdbench.analysis.goodputfrontier", "_cmd_goodput_frontier"))


def add_mode_parity(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench mode-parity``."""
    c = subparsers.add_parser("mode-parity", help="offline vs served speedup at the same load, and why they differ")
    add_cells(c)  # the grid's own cells (grid_cells.parquet), as the verdict reads them
    c.add_argument("--server", required=True, help="the server table (server.parquet, sdbench latency)")
    add_labels(c)
    add_output_table(c, "one row per SD method x load measured both ways")
    add_markdown(c, "the side-by-side table with the reason")
    c.set_defaults(func=lazy("sdbench.analysis.modeparity", "_cmd_mode_parity"))


def add_proposal_length(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench proposal-length``."""
    p = subparsers.add_parser("proposal-length", help="acceptance, speedup and memory vs num_speculative_tokens")
    add_cells(p)
    p.add_argument("--memory", required=True, help="memory table (memory-table)")
    p.add_argument("--points", required=True, help="JSON: method key -> [base method, k] (sdbench.sweeps)")
    p.add_argument("--scope", required=True, help="JSON: the sweep's engine, models, datasets, batch_sizes")
    add_table_outputs(p, "speedup and accepted length vs k")
    p.set_defaults(func=lazy("sdbench.analysis.proposal", "_cmd_proposal_length"))


def add_random_inputs(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench random-inputs``."""
    p = subparsers.add_parser("random-inputs", help="random-token prompts vs the real prompts they match")
    add_cells(p)
    p.add_argument("--pairs", required=True, help="JSON: random_tokens dataset -> the dataset it matches")
    add_table_outputs(p, "speedup on real vs random prompts")
    p.set_defaults(func=lazy("sdbench.analysis.randominputs", "_cmd_random_inputs"))


def add_temperature(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench temperature``."""
    p = subparsers.add_parser("temperature", help="acceptance and speedup vs sampling temperature; where SD stops paying")
    add_cells(p)
    p.add_argument("--points", required=True, help="JSON: dataset key -> [base dataset, temperature] (sdbench.sweeps)")
    p.add_argument("--scope", required=True, help="JSON: the sweep's engine, models, methods, batch_sizes")
    p.add_argument("--recommendation", required=True, help="output: where SD stops paying (parquet)")
    add_table_outputs(p, "accepted length and speedup vs temperature")
    p.set_defaults(func=lazy("sdbench.analysis.temperature", "_cmd_temperature"))


def add_category_acceptance(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench category-acceptance``."""
    p = subparsers.add_parser(
        "category-acceptance", help="acceptance length per prompt category (SPEED-Bench), per-request SD counters"
    )
    p.add_argument("--requests", nargs="+", default=[], help="requests.parquet of cells with per-request SD counters (vLLM >= 0.32)")
    p.add_argument("--calls", nargs="+", default=[], help="calls.parquet of replicate-mode cells (any vLLM version)")
    add_prompts(p, many=True)
    add_seed(p, 0, "the bootstrap intervals")
    p.add_argument("--table", required=True, help="output: acceptance length per category and method (parquet)")
    add_markdown(p)
    add_figure(p, "acceptance length per category and method")
    p.set_defaults(func=lazy("sdbench.analysis.categories", "_cmd_category_acceptance"))


def add_memory(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench memory``."""
    p = subparsers.add_parser(
        "memory",
        help="analytical weight and KV-cache memory of a target/drafter pair (paper Tab. 2)",
        description="Print static weight memory (GiB) and per-token KV cache (KiB) as JSON. "
        "NAME is a Hugging Face repo id with a config in --models-dir, or a local model directory / config.json.",
    )
    p.add_argument("--target", required=True, metavar="NAME")
    p.add_argument("--draft", metavar="NAME", help="EAGLE/EAGLE-3 head or draft model (omit for none/ngram/mtp)")
    p.add_argument("--method", choices=METHODS, help="default: none without --draft, else implied by the drafter")
    p.add_argument(
        "--models-dir",
        type=Path,
        default=None,
        help="directory of architecture YAMLs to use instead of the shipped ones and $SDBENCH_DATA_DIR/models",
    )
    p.add_argument("--dtype", choices=DTYPES, help="serving dtype (default: the target's torch_dtype)")
    p.set_defaults(func=lazy("sdbench.analysis.memory", "_cmd_memory"))


def add_bleu(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench bleu buckets|heatmap|measured|simulated``."""
    p = subparsers.add_parser("bleu", help="prompt-output BLEU buckets and the Fig. 8 heatmap (paper Sec. 7)")
    sub = p.add_subparsers(dest="bleu_command", required=True)

    b = sub.add_parser("buckets", help="per-request BLEU-n between prompt and no-SD output, bucketed")
    b.add_argument(
        "--input", required=True, type=Path, metavar="FILE", help="published-trace .jsonl or requests .parquet"
    )
    b.add_argument("--prompts", type=Path, default=None, metavar="FILE",
                   help="the prompt table of a requests .parquet (its prompt ids, by request_id)")
    add_output_table(b, "per-request BLEU and its bucket")
    b.add_argument(
        "--order", type=int, default=DEFAULT_ORDER, choices=range(1, MAX_ORDER + 1), metavar=f"1..{MAX_ORDER}"
    )
    b.add_argument("--basis", choices=BASES, default="auto", help="text or token ids (auto: text when present)")
    b.add_argument("--tokenizer", metavar="PATH", help="tokenizer.json (or its directory) to decode ids to text")
    b.set_defaults(func=lazy("sdbench.analysis.bleu", "_cmd_buckets"))

    h = sub.add_parser("heatmap", help="Fig. 8: n-gram vs EAGLE relative speedup by BLEU bucket and batch size")
    h.add_argument("--speedups", required=True, type=Path, metavar="TABLE.parquet")
    h.add_argument("--buckets", required=True, type=Path, metavar="BUCKETS.parquet")
    # --output here is the heatmap itself (PNG), not a table
    h.add_argument("--output", required=True, type=Path, metavar="fig8.png")
    h.add_argument("--title", default=None)
    h.set_defaults(func=lazy("sdbench.analysis.bleu", "_cmd_heatmap"))
    m = sub.add_parser("measured", help="Fig. 8 from engine runs: per-bucket n-gram vs drafter speedup")
    m.add_argument("--calls", nargs="+", required=True, help="calls.parquet of the baseline, n-gram and versus cells")
    m.add_argument("--buckets", required=True, help="bleu buckets parquet of the same prompts")
    m.add_argument(
        "--baseline-calls",
        nargs="+",
        default=None,
        help="the baseline_calls.parquet (paired no-SD arm) beside each --calls file, in the same order",
    )
    m.add_argument("--baseline", required=True, help="method key of the no-SD cells")
    m.add_argument("--ngram", required=True, help="method key of the n-gram cells")
    m.add_argument("--versus", required=True, help="method key of the learned/draft-model cells")
    add_output_table(m, "n-gram vs drafter speedup per BLEU bucket and batch size")
    add_figure(m, "the heatmap of that table")
    m.set_defaults(func=lazy("sdbench.analysis.bleu", "_cmd_measured"))

    sim = sub.add_parser("simulated", help="Fig. 8 from traces: per-bucket simulated n-gram vs EAGLE speedup")
    sim.add_argument("--traces", required=True, type=Path, help="published-trace .jsonl (or trace table)")
    sim.add_argument("--buckets", required=True, type=Path, help="bleu buckets parquet of the same requests")
    sim.add_argument("--ngram-policy", default="fixed-3", help="simulator policy of the n-gram proposer")
    sim.add_argument("--versus-policy", default="fixed-3", help="simulator policy of the learned drafter")
    sim.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 16, 32, 64, 128])
    sim.add_argument("--cost-model", default="llama3.1-8b-h100", help="cost model name or YAML path")
    sim.add_argument("--mode", choices=("exact", "compat"), default="exact")
    add_output_table(sim, "simulated n-gram vs EAGLE speedup per BLEU bucket and batch size")
    add_figure(sim, "the heatmap of that table")
    sim.set_defaults(func=lazy("sdbench.analysis.bleu", "_cmd_simulated"))


def _add_trace_table_args(parser: argparse.ArgumentParser) -> None:
    """``--traces`` and ``--labels`` of the acceptance analyses."""
    parser.add_argument("--traces", nargs="+", required=True, help="trace table .parquet files")
    # --labels here: one dataset label per trace file (elsewhere: JSON method labels, cliargs.add_labels)
    parser.add_argument(
        "--labels",
        nargs="+",
        default=None,
        help="dataset label per trace file (default: file name, combined_<dataset> -> <dataset>)",
    )


def add_acceptance(subparsers: argparse._SubParsersAction) -> None:
    """Add ``acceptance {table4,figures,figure}``."""
    acc = subparsers.add_parser("acceptance", help="acceptance analyses of trace tables (Sec. 6)")
    sub = acc.add_subparsers(dest="acceptance_command", required=True)

    t4 = sub.add_parser("table4", help="Tab. 4: stats of per-request mean acc_len per dataset x method")
    _add_trace_table_args(t4)
    add_output_table(t4, "Tab. 4")
    add_markdown(t4, "Tab. 4", required=False)
    t4.set_defaults(func=lazy("sdbench.analysis.acceptance", "_cmd_table4"))

    figs = sub.add_parser("figures", help="Fig. 4, 5, 6/13, 10 PNGs (+ their data as parquet) into one directory")
    _add_trace_table_args(figs)
    figs.add_argument("--outdir", required=True)
    _add_figure_options(figs)
    figs.set_defaults(func=lazy("sdbench.analysis.acceptance", "_cmd_figures"))

    one = sub.add_parser("figure", help="one figure of the index: Fig. 4 heatmap, 5 deciles, 6 requests, 10 difference")
    one.add_argument("figure", choices=("heatmap", "deciles", "requests", "difference"))
    _add_trace_table_args(one)
    one.add_argument("--output", required=True, help="PNG to write")
    one.add_argument("--data", default=None, help="also write the table behind Fig. 5/6/10 (.parquet) here")
    _add_figure_options(one)
    one.set_defaults(func=lazy("sdbench.analysis.acceptance", "_cmd_figure"))


def _add_figure_options(parser: argparse.ArgumentParser) -> None:
    """Drawing options shared by ``acceptance figures`` and ``acceptance figure``."""
    parser.add_argument(
        "--max-position", type=int, default=512, help="positions shown in heatmaps (paper: 512; <=0: all)"
    )
    parser.add_argument(
        "--per-class",
        type=int,
        default=50,
        help="requests sampled per output-length class in Fig. 5 (paper: 50; <=0: all)",
    )
    add_seed(parser, 0, "the Fig. 5 sampling")


def add_breakdown(subparsers: argparse._SubParsersAction) -> None:
    """Add ``breakdown plot``."""
    parser = subparsers.add_parser("breakdown", help="runtime breakdown per stage (Sec. 5.1, Fig. 3)")
    sub = parser.add_subparsers(dest="breakdown_command", required=True)
    plot = sub.add_parser("plot", help="stacked-bar figure (+ table) of stage fractions per method x batch size")
    plot.add_argument(
        "--steps",
        nargs="+",
        required=True,
        help="step tables (.parquet/.csv): read_step_dir() columns plus method, batch_size",
    )
    plot.add_argument("--output", required=True, help="PNG to write")
    plot.add_argument("--table", default=None, help="also write the fractions table (.parquet) here")
    plot.add_argument("--title", default=None, help="figure title (e.g. the model)")
    plot.set_defaults(func=lazy("sdbench.analysis.breakdown", "_cmd_plot"))


def add_forced_acceptance(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench forced-acceptance``."""
    p = subparsers.add_parser(
        "forced-acceptance", help="forced-acceptance curves, ceilings and the gap split (ext13, ext14)"
    )
    add_cells(p)  # with the forced-acceptance sweep's cells
    p.add_argument("--methods", required=True, help="the config's methods (JSON): bases, forced lengths, labels")
    p.add_argument("--table", required=True, help="output: one row per forced cell (parquet)")
    p.add_argument("--gap-table", required=True, help="output: the gap split per method x batch size (parquet)")
    add_markdown(p, "the forced points and ceilings")
    p.add_argument("--gap-markdown", required=True, help="output: the gap split (Markdown)")
    add_figure(p, "speedup vs accepted length")
    p.add_argument("--gap-figure", required=True, help="output: measured / at real τ / ceiling / ideal (PNG)")
    p.set_defaults(func=lazy("sdbench.analysis.forced", "_cmd_forced"))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the analysis stage's commands."""
    for add in (
        add_acceptance,
        add_aggregate,
        add_verdict,
        add_forced_acceptance,
        add_plot_throughput,
        add_memory_table,
        add_cost,
        add_energy,
        add_latency,
        add_goodput_frontier,
        add_mode_parity,
        add_proposal_length,
        add_random_inputs,
        add_temperature,
        add_category_acceptance,
        add_memory,
        add_bleu,
        add_breakdown,
    ):
        add(subparsers)
