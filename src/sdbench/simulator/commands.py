"""Implementation of ``sdbench simulate`` and its sub-actions ``compare``, ``adaptive-report`` and
``figures`` (parsed in :mod:`sdbench.simulator.cli`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from sdbench.io import read_csv, write_text
from sdbench.simulator.core import simulate, write_results
from sdbench.simulator.costmodel import load_cost_model
from sdbench.simulator.figures import figure_adaptive, figure_combining, figure_compare, figure_fixed_vs_oracle
from sdbench.simulator.powermodel import NO_POWER_MODEL_GIVEN, load_power_model
from sdbench.simulator.reports import adaptive_report, adaptive_summary, compare_modes
from sdbench.simulator.tracesets import TraceSet, draft_method_of, load_traces


def _markdown(df: pd.DataFrame, digits: int = 2) -> str:
    from sdbench.analysis.acceptance import markdown_table

    return markdown_table(df, digits)


def _load_sets(paths: Sequence[str], requests: Sequence[str] = ()) -> list[TraceSet]:
    sets = [load_traces(p, requests) for p in paths]
    seen: dict[str, str] = {}
    for ts in sets:
        if ts.dataset in seen:
            raise ValueError(f"{ts.source}: dataset {ts.dataset!r} already read from {seen[ts.dataset]}")
        seen[ts.dataset] = ts.source
    return sets


def _cmd_simulate(args: argparse.Namespace) -> int:
    missing = [f"--{k.replace('_', '-')}" for k in ("traces", "proposer", "output") if not getattr(args, k)]
    if bool(args.engine) != bool(args.model):
        missing.append("--model" if args.engine else "--engine")
    if missing:
        raise ValueError(
            f"sdbench simulate: the following arguments are required: {', '.join(missing)} "
            "(see sdbench simulate --help)"
        )
    cm = load_cost_model(args.cost_model)
    power, no_power = load_power_model(args.power_model) if args.power_model else (None, NO_POWER_MODEL_GIVEN)
    train = _load_sets(args.train_traces, args.requests) if args.train_traces else None
    sets = _load_sets(args.traces, args.requests)
    df = simulate(
        sets,
        args.proposer,
        args.policy,
        args.batch_sizes,
        cm,
        args.mode,
        batching=args.batching,
        num_requests=args.num_requests,
        seed=args.seed,
        drafter=args.drafter,
        train_sets=train,
        match_probability=args.compat_match_probability,
        power=power,
        no_power=no_power,
    )
    # Which traced drafter the learned proposer replayed (validation matches cells by it).
    drafter = "" if args.proposer == "ngram" else draft_method_of(sets[0], args.drafter)
    df.insert(list(df.columns).index("proposer") + 1, "drafter", drafter)
    if args.engine:  # whose traces: validation matches a cell to its own engine and model's rows
        df.insert(0, "model", args.model)
        df.insert(0, "engine", args.engine)
    from sdbench.columns import conform
    from sdbench.simulator.core import WRITTEN_COLUMNS

    write_results(conform(df, WRITTEN_COLUMNS if args.engine else WRITTEN_COLUMNS[2:], "simulate"), args.output)
    print(f"wrote {len(df)} rows to {args.output}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    cm = load_cost_model(args.cost_model)
    table = compare_modes(_load_sets(args.traces), cm, args.batch_sizes, continuous=not args.no_continuous)
    write_results(table, args.table)
    write_text(_markdown(table), args.markdown)
    figure_compare(table, args.figure)
    print(_markdown(table))
    print(f"wrote {args.table}, {args.markdown} and {args.figure}")
    return 0


def _cmd_adaptive(args: argparse.Namespace) -> int:
    cm = load_cost_model(args.cost_model)
    train = _load_sets(args.train_traces, args.requests) if args.train_traces else None
    report = adaptive_report(
        _load_sets(args.traces, args.requests),
        cm,
        args.batch_sizes,
        args.policies,
        batching=args.batching,
        train_sets=train,
    )
    summary = adaptive_summary(report)
    write_results(report, args.table)
    write_text(_markdown(summary), args.markdown)
    figure_adaptive(report, args.figure)
    print(_markdown(summary))
    print(f"wrote {args.table}, {args.markdown} (gap closed) and {args.figure}")
    return 0


def _cmd_figures(args: argparse.Namespace) -> int:
    if not (args.fixed_vs_oracle or args.combining):
        raise ValueError("simulate figures: give --fixed-vs-oracle (Fig. 9) and/or --combining (Fig. 11)")
    results = pd.concat([read_csv(p, "simulator table") for p in args.results], ignore_index=True)
    if args.fixed_vs_oracle:
        figure_fixed_vs_oracle(results, args.fixed_vs_oracle)
        print(f"wrote {args.fixed_vs_oracle}")
    if args.combining:
        figure_combining(results, args.combining)
        print(f"wrote {args.combining}")
    return 0
