"""Implementation of the engine commands ``run-cell``, ``run-group``, ``cell-tables`` and
``trace-cell`` (parsed in :mod:`sdbench.engine.cli`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sdbench.engine.groups import (
    CELL_TABLES,
    cell_subdir,
    engine_starts,
    run_group,
    run_group_starts,
    write_cell_tables,
)
from sdbench.engine.runner import preflight, run_cell, trace_cell
from sdbench.io import write_parquet


def _cmd_trace_cell(args: argparse.Namespace) -> int:
    from sdbench.lifeline import watch_workflow

    watch_workflow()
    spec = json.loads(args.spec)
    prompts = preflight(spec, args.prompts, args.model_dir, args.drafter_dir)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="sdbench-trace-") as trace_dir:
        trace, requests = trace_cell(
            spec, prompts, args.model_dir, args.drafter_dir, args.num_speculative_tokens, args.max_num_seqs, trace_dir
        )
    write_parquet(requests, args.requests)
    write_parquet(trace, args.output)
    return 0


def _cmd_run_cell(args: argparse.Namespace) -> int:
    from sdbench.lifeline import watch_workflow
    from sdbench.engine.quietguard import Contaminated, mode_from_env

    watch_workflow()
    spec = json.loads(args.spec)
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


def _cmd_run_group(args: argparse.Namespace) -> int:
    from sdbench.lifeline import watch_workflow
    from sdbench.engine.quietguard import Contaminated, mode_from_env

    watch_workflow()
    group = json.loads(args.spec)
    if args.engine_start is None and engine_starts(group["cells"]) > 1:
        own = ["run-group", "--spec", args.spec, "--model-dir", args.model_dir]
        own += ["--drafter-dir", args.drafter_dir] if args.drafter_dir else []
        own += ["--quiet-guard", args.quiet_guard] if args.quiet_guard else []
        return run_group_starts(group["cells"], own, args.output_dir)
    try:
        run_group(
            group["cells"], group["prompts"], args.model_dir, args.drafter_dir, args.output_dir,
            args.quiet_guard or mode_from_env(),
        )
    except Contaminated as exc:  # refuse mode: no output; a cluster retries the job
        print(f"error: {exc}", file=sys.stderr)
        return 3
    return 0


def _cmd_cell_tables(args: argparse.Namespace) -> int:
    import shutil

    source = Path(args.group_dir) / cell_subdir(args.dataset, args.batch_size)
    missing = [n for n in CELL_TABLES if not (source / f"{n}.parquet").is_file()]
    if missing:
        raise FileNotFoundError(f"{source}: engine group lacks {', '.join(missing)}.parquet of this cell")
    from sdbench.io import atomic_path

    for name in CELL_TABLES:  # copies, not links: each output gets its own, newer mtime
        with atomic_path(Path(args.output_dir) / f"{name}.parquet") as tmp:
            shutil.copyfile(source / f"{name}.parquet", tmp)
    return 0
