"""Implementation of the engine commands ``run-cell``, ``run-group``, ``cell-tables``,
``trace-group`` and ``trace-tables`` (parsed in :mod:`sdbench.engine.cli`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sdbench.engine.site.hardware import engine_job
from sdbench.engine.groups import (
    CELL_TABLES,
    STEPS_TABLE,
    cell_subdir,
    engine_starts,
    run_group,
    run_group_starts,
    write_cell_tables,
)
from sdbench.engine.site.preflight import preflight
from sdbench.engine.tracegroup import trace_group
from sdbench.engine.measure.trials import run_cell
from sdbench.io import atomic_dir, atomic_path, read_parquet, read_spec, write_parquet

# A trace group's directory: <dataset>/<name>.parquet per traced dataset.
TRACE_TABLES = ("engine_trace", "engine_requests")


@engine_job
def _cmd_trace_group(args: argparse.Namespace) -> int:
    import tempfile

    from sdbench.lifeline import watch_workflow

    watch_workflow()
    group = read_spec(args.spec)
    specs = group["cells"]
    prompts = {
        spec["cell"]["dataset"]: preflight(spec, group["prompts"][spec["cell"]["dataset"]], args.model_dir, args.drafter_dir)
        for spec in specs
    }
    store = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    keys = trace_keys(group, args) if store else {}
    done = {d for d, key in keys.items() if all((store / key / f"{n}.parquet").is_file() for n in TRACE_TABLES)}
    todo = [s for s in specs if s["cell"]["dataset"] not in done]
    print(f"trace group: {len(todo)} of {len(specs)} dataset(s) to trace, {len(done)} re-used"
          + (f" from {store}" if done else ""), file=sys.stderr, flush=True)  # fmt: skip

    def keep(dataset: str, tables: tuple) -> None:
        if store is not None:
            with atomic_dir(store / keys[dataset]) as tmp:
                for name, table in zip(TRACE_TABLES, tables, strict=True):
                    write_parquet(table, tmp / f"{name}.parquet")

    totals: dict[str, float] = {}
    traced: dict[str, tuple] = {}
    if todo:
        with tempfile.TemporaryDirectory(prefix="sdbench-trace-") as trace_dir:
            traced = trace_group(
                todo, {s["cell"]["dataset"]: prompts[s["cell"]["dataset"]] for s in todo}, args.model_dir,
                args.drafter_dir, args.num_speculative_tokens, args.max_num_seqs, trace_dir, totals, keep,
            )  # fmt: skip
    for dataset in sorted(done):
        traced[dataset] = tuple(read_parquet(store / keys[dataset] / f"{n}.parquet") for n in TRACE_TABLES)
    # Assembled aside and renamed at the end: no group directory unless every trace is in it.
    with atomic_dir(args.output_dir) as tmp:
        for dataset, tables in sorted(traced.items()):
            for name, table in zip(TRACE_TABLES, tables, strict=True):
                write_parquet(table, tmp / dataset / f"{name}.parquet")
        if totals:  # a rehearsal: the job's modelled seconds (sdbench.rehearsal.report)
            from sdbench import rehearsal

            rehearsal.module("totals").write_job_total(tmp, "trace", totals["startup_s"], totals["generate_s"], len(specs),
                                                      spec=specs[0])
    return 0


def trace_keys(group: dict, args: argparse.Namespace) -> dict[str, str]:
    """Each traced dataset's checkpoint name: as a run group's cell (sdbench.engine.groups.checkpoint_key:
    its spec, its prompt table's bytes, the model files, the measurement's code, the software),
    with the draft length and concurrency the trace ran at."""
    from sdbench.engine.groups import checkpoint_key, measurement_context
    from sdbench.rehearsal import is_rehearsal

    context = measurement_context(group["prompts"], args.model_dir, args.drafter_dir, "trace", False,
                                  rehearsal=is_rehearsal(group["cells"][0]))  # fmt: skip
    traced = {"num_speculative_tokens": args.num_speculative_tokens, "max_num_seqs": args.max_num_seqs}
    return {s["cell"]["dataset"]: checkpoint_key({**s, "trace": traced}, context, args.max_num_seqs, None)
            for s in group["cells"]}  # fmt: skip


def _cmd_trace_tables(args: argparse.Namespace) -> int:
    import shutil

    source = Path(args.group_dir) / args.dataset
    targets = dict(zip(TRACE_TABLES, (args.trace, args.requests)))
    missing = [n for n in TRACE_TABLES if not (source / f"{n}.parquet").is_file()]
    if missing:
        raise FileNotFoundError(f"{source}: trace group lacks {', '.join(missing)}.parquet of this dataset")
    for name, target in targets.items():  # copies: each output gets its own, newer mtime
        with atomic_path(Path(target)) as tmp:
            shutil.copyfile(source / f"{name}.parquet", tmp)
    return 0


@engine_job
def _cmd_run_cell(args: argparse.Namespace) -> int:
    from sdbench.lifeline import watch_workflow
    from sdbench.engine.site.quietguard import Contaminated, mode_from_env

    watch_workflow()
    spec = read_spec(args.spec)
    prompts = preflight(spec, args.prompts, args.model_dir, args.drafter_dir)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="sdbench-steps-") as scratch:
        steps_dir = scratch if args.steps_output else None
        try:
            requests, calls, summary, steps = run_cell(
                spec, prompts, args.model_dir, args.drafter_dir, steps_dir, args.quiet_guard or mode_from_env()
            )
        except Contaminated as exc:  # refuse mode: no output; a cluster retries the job
            print(f"error: {exc}", file=sys.stderr)
            return 3
    if steps is not None:
        write_parquet(steps, args.steps_output)
    tables = {"requests": requests, "calls": calls, "baseline_calls": calls.iloc[0:0], "summary": summary}
    write_cell_tables(tables, Path(args.output_dir))
    return 0


@engine_job
def _cmd_run_group(args: argparse.Namespace) -> int:
    from sdbench.lifeline import watch_workflow
    from sdbench.engine.site.quietguard import Contaminated, mode_from_env

    watch_workflow()
    group = read_spec(args.spec)
    if args.dry_run:
        return _dry_run_group(group, args)
    if args.engine_start is None and engine_starts(group["cells"]) > 1 and not args.breakdown:
        own = ["run-group", "--spec", args.spec, "--model-dir", args.model_dir]
        own += ["--drafter-dir", args.drafter_dir] if args.drafter_dir else []
        own += ["--quiet-guard", args.quiet_guard] if args.quiet_guard else []
        return run_group_starts(group["cells"], own, args.output_dir, args.checkpoint_dir)
    try:
        run_group(
            group["cells"], group["prompts"], args.model_dir, args.drafter_dir, args.output_dir,
            args.quiet_guard or mode_from_env(), breakdown=args.breakdown,
            max_num_seqs=group.get("max_num_seqs"), checkpoint_dir=args.checkpoint_dir,
            engine_start=args.engine_start,
        )
    except Contaminated as exc:  # refuse mode: no output; a cluster retries the job
        print(f"error: {exc}", file=sys.stderr)
        return 3
    return 0


def _dry_run_group(group: dict, args: argparse.Namespace) -> int:
    """``run-group --dry-run``: how many of the group's cells (in every engine start) its run would
    measure, the others being re-used from the checkpoint store; one line on stdout."""
    from sdbench.engine.site.quietguard import mode_from_env

    multi = args.engine_start is None and engine_starts(group["cells"]) > 1 and not args.breakdown
    starts = range(engine_starts(group["cells"])) if multi else [args.engine_start]
    measure = reuse = 0
    for start in starts:
        m, r = run_group(
            group["cells"], group["prompts"], args.model_dir, args.drafter_dir, args.output_dir,
            args.quiet_guard or mode_from_env(), breakdown=args.breakdown,
            max_num_seqs=group.get("max_num_seqs"), checkpoint_dir=args.checkpoint_dir,
            engine_start=start, dry_run=True,
        )  # fmt: skip
        measure, reuse = measure + m, reuse + r
    print(f"{args.output_dir}: {measure} cell(s) to measure, {reuse} re-used")
    return 0


def _cmd_cell_tables(args: argparse.Namespace) -> int:
    import shutil

    source = Path(args.group_dir) / cell_subdir(args.method, args.dataset, args.batch_size)
    names = (*CELL_TABLES, STEPS_TABLE) if args.steps else CELL_TABLES
    missing = [n for n in names if not (source / f"{n}.parquet").is_file()]
    if missing:
        raise FileNotFoundError(f"{source}: engine group lacks {', '.join(missing)}.parquet of this cell")
    for name in names:  # copies, not links: each output gets its own, newer mtime
        with atomic_path(Path(args.output_dir) / f"{name}.parquet") as tmp:
            shutil.copyfile(source / f"{name}.parquet", tmp)
    return 0
