"""The figure index: every figure and table a reader looks at, with its one output path.

Each item is named ``<paper item>_<topic>`` (``fig09_fixed_vs_oracle``; ``ext..`` for items the
paper does not have). The name is the output's path under ``results/paper/`` and, where one rule
draws only that item, the rule's name too, so "where is Fig. 9 made?" has one answer. Items
drawn once per scope hold a ``{wildcard}`` directory level:

- ``{source}``: ``grid`` (this run's in-engine traces) or ``published`` (the authors' traces);
- ``{scope}``: ``published/<dataset>`` or ``<engine>/<model>/<dataset>`` for per-dataset
  acceptance figures, ``published/<mode>`` or ``<engine>/<model>/<dataset>`` for the simulator's
  figures, ``published`` or ``<engine>/<model>`` for the adaptive-policy report.

Data tables (parquet, documented in ``docs/schema.md``) stay beside their stage under
``results/<stage>/``; only what a reader looks at is here, and beside each PNG its drawn table
(``<name>.csv``: one row per mark the figure drew, :mod:`sdbench.plotting`). A Markdown table is
its own table. Standard library only: the Snakefile
reads it while it builds the DAG, and ``sdbench figure-index`` prints the README's table.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

PAPER_DIR = "results/paper"
# Beside every PNG: the table of what it drew (sdbench.plotting.DRAWN_SUFFIX; standard library only here).
DRAWN_SUFFIX = ".csv"
# A scope starting with this names the paper authors' traces, not an engine of the grid.
PUBLISHED_SCOPE = "published"


@dataclass(frozen=True)
class Item:
    """One figure or table: where it is, which rule draws it and with which function."""

    name: str  # <item>_<topic>: also the rule's name unless `rule` says otherwise
    paper: str  # the paper's figure/table it reproduces ("" for our own)
    what: str
    suffixes: tuple[str, ...]  # file types written (".png", ".md")
    function: str  # the package function that computes/draws it
    section: str  # report category
    scope: str = ""  # "{source}", "{scope}", ... directory level; "" = one file
    rule: str = ""  # the rule, when it is not `name`

    @property
    def rule_name(self) -> str:
        return self.rule or self.name

    @property
    def files(self) -> tuple[str, ...]:
        """Every file type written: :attr:`suffixes` and, for a figure, its drawn table."""
        return self.suffixes + ((DRAWN_SUFFIX,) if ".png" in self.suffixes else ())

    def path(self, suffix: str | None = None) -> str:
        """Output path template (Snakemake wildcards in braces) of one of the item's files."""
        suffix = suffix or self.suffixes[0]
        if suffix not in self.files:
            raise KeyError(f"{self.name} writes {self.files}, not {suffix!r}")
        stem = f"{PAPER_DIR}/{self.name}/{self.scope}" if self.scope else f"{PAPER_DIR}/{self.name}"
        return stem + suffix


# "A..." sorts first: the report lists sections by name, and the verdict is what a reader wants first.
VERDICT, SEC3, SEC5, SEC6, SEC7, SEC8, CEILING, PRODUCTION = (
    "At a glance: does SD pay here?",
    "Sec. 3 End-to-end throughput",
    "Sec. 5 Memory and runtime breakdown",
    "Sec. 6 Acceptance",
    "Sec. 7 BLEU",
    "Sec. 8 Simulator",
    "Sec. 8+ How far from the ceiling, measured",
    "Production questions",
)
PER_DATASET = "{scope}"

ITEMS: tuple[Item, ...] = (
    Item("ext00_verdict", "", "does SD pay, per model x method x dataset and batch size / concurrency; where it stops",
         (".md", ".png"), "analysis.verdict.verdict_markdown", VERDICT),
    Item("fig01_end_to_end", "Fig. 1/2", "throughput and speedup vs batch size, 95% intervals",
         (".png",), "analysis.endtoend.plot_throughput", SEC3),
    Item("tab01_generation_length", "Tab. 1", "output length (mean ± sd) per method x batch size",
         (".md",), "analysis.endtoend.generation_length_table", SEC3, rule="aggregate"),
    Item("ext01_speedups", "", "speedup over no-SD per cell with 95% interval and design",
         (".md",), "analysis.endtoend.speedup_markdown", SEC3, rule="aggregate"),
    Item("ext06_output_divergence", "", "share of outputs differing from no-SD (greedy, or same-seed sampled), per cell",
         (".md",), "analysis.endtoend.output_divergence", SEC3, rule="aggregate"),
    Item("fig03_runtime_breakdown", "Fig. 3", "share of step time per stage, per method x batch size",
         (".png",), "analysis.breakdown.plot_breakdown", SEC5),
    Item("tab02_memory", "Tab. 2/3", "analytical vs measured memory (static and per token) per engine x model x method",
         (".md", ".png"), "analysis.memory.memory_markdown", SEC5),
    Item("tab04_generated_length", "Tab. 4", "per-request mean accepted length by dataset x method",
         (".md",), "analysis.acceptance.table4", SEC6, scope="{source}"),
    Item("fig04_acceptance_heatmap", "Fig. 4", "accepted length per request x token position",
         (".png",), "analysis.acceptance.plot_heatmaps", SEC6, scope=PER_DATASET),
    Item("fig05_position_deciles", "Fig. 5", "accepted length by relative position decile",
         (".png",), "analysis.acceptance.plot_position_deciles", SEC6, scope=PER_DATASET),
    Item("fig06_request_acceptance", "Fig. 6", "per-request mean accepted length, boxes per method",
         (".png",), "analysis.acceptance.plot_request_boxes", SEC6, scope="{source}"),
    Item("fig10_ngram_minus_eagle", "Fig. 10", "n-gram minus EAGLE accepted length per position",
         (".png",), "analysis.acceptance.plot_difference", SEC6, scope=PER_DATASET),
    Item("ext02_acceptance_per_position", "", "acceptance rate by draft position, run-cell counters",
         (".png",), "analysis.endtoend.plot_acceptance_per_position", SEC6),
    Item("fig08_bleu_measured", "Fig. 8", "n-gram vs EAGLE speedup by prompt/output BLEU-4, measured",
         (".png",), "analysis.bleu.plot_heatmap", SEC7, scope="{engine}/{model}/{dataset}"),
    Item("fig08_bleu_simulated", "Fig. 8", "the same on the published traces, simulated",
         (".png",), "analysis.bleu.plot_heatmap", SEC7, scope="{published}/ngram-{ngram_policy}"),
    Item("fig09_fixed_vs_oracle", "Fig. 9", "simulated speedup of fixed vs oracle proposal length",
         (".png",), "simulator.figures.figure_fixed_vs_oracle", SEC8, scope="{scope}"),
    Item("fig11_oracle_combine", "Fig. 11", "oracle-combine of n-gram and EAGLE vs each alone",
         (".png",), "simulator.figures.figure_combining", SEC8, scope="{scope}"),
    Item("ext03_compat_vs_exact", "", "published simulator (compat) vs exact mode, per correction",
         (".png", ".md"), "simulator.reports.compare_modes", SEC8),
    Item("ext04_adaptive_policies", "", "causal adaptive policies vs best fixed vs oracle",
         (".png", ".md"), "simulator.reports.adaptive_report", SEC8, scope="{scope}"),
    Item("ext05_simulated_vs_measured", "", "simulated vs measured speedup per cell and drafter",
         (".md",), "simulator.validation.compare", SEC8),
    Item("ext15_simulator_at_forced", "", "the simulator's cost model at the forced-acceptance points; refitted there",
         (".png", ".md"), "simulator.forcedcheck.check_table", SEC8),
    Item("ext07_cost", "", "cost per 1M output tokens and per request, per method x batch size",
         (".png", ".md"), "analysis.cost.cost_table", PRODUCTION),
    Item("ext16_energy_per_token", "", "joules per output token and tokens/s vs batch size per method; SD's energy ratio",
         (".png", ".md"), "analysis.energy.energy_table", PRODUCTION),
    Item("ext08_proposal_length", "", "accepted length, acceptance rate, speedup and memory vs k, per method",
         (".png", ".md"), "analysis.proposal.proposal_length_table", PRODUCTION),
    Item("ext09_random_inputs", "", "random-token prompts vs the real prompts they match: acceptance, speedup",
         (".png", ".md"), "analysis.randominputs.random_vs_real", PRODUCTION),
    Item("ext10_temperature", "", "accepted length and speedup vs sampling temperature; where SD stops paying",
         (".png", ".md"), "analysis.temperature.temperature_table", PRODUCTION),
    Item("ext11_latency_throughput", "", "server mode: TPOT p50 vs output tokens/s per device by concurrency; cost",
         (".png", ".md"), "analysis.latency.latency_table", PRODUCTION),
    Item("ext17_goodput_frontier", "", "server mode: where SD's goodput is higher, over every TTFT x TPOT target; "
         "each arm's max load at 90% attainment", (".png", ".md"), "analysis.goodputfrontier.frontier_table",
         PRODUCTION),
    Item("ext18_offline_vs_served", "", "offline vs served speedup at the same load, the stream-off control, and "
         "the measured reason they differ", (".md",), "analysis.modeparity.modes_table", PRODUCTION),
    Item("ext12_speed_bench_categories", "", "acceptance length per SPEED-Bench category, per method, 95% intervals",
         (".png", ".md"), "analysis.categories.category_acceptance", PRODUCTION),
    Item("ext13_forced_acceptance", "", "speedup at forced accepted lengths per method x batch size; the ceiling",
         (".png", ".md"), "analysis.forced.forced_table", CEILING),
    Item("ext14_sd_gap", "", "gap to the ideal split into system and acceptance: measured, at real τ, ceiling",
         (".png", ".md"), "analysis.forced.gap_table", CEILING, rule="ext13_forced_acceptance"),
)
BY_NAME: dict[str, Item] = {item.name: item for item in ITEMS}


def paper_path(name: str, suffix: str | None = None, **wildcards: str) -> str:
    """Path of item ``name``; with ``wildcards``, its scope filled in (else the template)."""
    template = BY_NAME[name].path(suffix)
    return template.format(**wildcards) if wildcards else template


def published_scope(scope: str) -> str | None:
    """The rest of a ``published/...`` scope (``""`` for ``published``), else None."""
    head, _, rest = scope.partition("/")
    return rest if head == PUBLISHED_SCOPE else None


def markdown_index() -> str:
    """The README's figure index table."""
    rows = [
        "| item | paper | what | rule | output | drawn table | function |",
        "|---|---|---|---|---|---|---|",
    ]
    for item in ITEMS:
        outputs = ", ".join(f"`{item.path(s)}`" for s in item.suffixes)
        drawn = f"`{item.path(DRAWN_SUFFIX)}`" if DRAWN_SUFFIX in item.files else "the `.md` is the table"
        rows.append(
            f"| `{item.name}` | {item.paper or 'ours'} | {item.what} | `{item.rule_name}` "
            f"| {outputs} | {drawn} | `{item.function}` |"
        )
    return "\n".join(rows) + "\n"


def _cmd_index(args: argparse.Namespace) -> int:
    print(markdown_index(), end="")
    return 0
