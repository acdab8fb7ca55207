"""``sdbench bench engine-sharing``: cells measured in one shared engine vs each in a fresh engine.

The workflow measures every cell of an engine group (same engine, model, method and
engine arguments) on one engine (``sdbench run-group``). This command checks that the
sharing does not change what a cell measures: it runs the group's cells once through
``run-group`` (one process, one engine) and once through ``run-cell`` per cell (one
process and a fresh engine per cell), in alternating order over ``--rounds``, and per
cell compares the throughput and its 95% interval (:mod:`sdbench.analysis.stats`). A cell
*agrees* when the two intervals overlap. It also prints what the sharing saves: the
wall time of the shared process against the sum of the fresh processes.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from sdbench.grid import engine_groups, resolve_cell

SIDES = ("shared", "fresh")


def group_cells(config: dict[str, Any], engine: str, model: str, method: str) -> list[dict[str, Any]]:
    """Resolved specs of the cells of one engine group, in the workflow's order."""
    for group, cells in engine_groups(config).items():
        if (group.engine, group.model, group.method) == (engine, model, method):
            return [resolve_cell(config, c) for c in cells]
    known = sorted({(g.engine, g.model, g.method) for g in engine_groups(config)})
    raise ValueError(f"no engine group {engine}/{model}/{method} in the grid; groups: {known}")


def _sdbench() -> str:
    """The ``sdbench`` console script beside this interpreter (the workflow's)."""
    return str(Path(sys.executable).parent / "sdbench")


def _run(argv: list[str], log: Path) -> float:
    """Run one process to completion (its log kept); returns its wall time."""
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({proc.returncode}); log: {log}")
    return time.perf_counter() - t0


def run_shared(cells: list[dict[str, Any]], prompts: dict[str, str], dirs: list[str], out: Path) -> float:
    """All cells in one ``run-group`` process; tables under ``out/<dataset>/bs<N>/``."""
    spec = json.dumps({"cells": cells, "prompts": prompts}, sort_keys=True)
    argv = [_sdbench(), "run-group", "--spec", spec, *dirs, "--output-dir", str(out)]
    return _run(argv, out.with_suffix(".log"))


def run_fresh(cells: list[dict[str, Any]], prompts: dict[str, str], dirs: list[str], out: Path) -> float:
    """Each cell in its own ``run-cell`` process (a fresh engine); returns the summed wall time."""
    total = 0.0
    out.mkdir(parents=True, exist_ok=True)
    for spec in cells:
        cell = spec["cell"]
        cell_dir = out / cell["dataset"] / f"bs{cell['batch_size']}"
        argv = [
            _sdbench(), "run-cell", "--spec", json.dumps(spec, sort_keys=True),
            "--prompts", prompts[cell["dataset"]], *dirs, "--output-dir", str(cell_dir),
        ]  # fmt: skip
        cell_dir.parent.mkdir(parents=True, exist_ok=True)
        total += _run(argv, cell_dir.with_suffix(".log"))
    return total


def read_summaries(root: Path, side: str, round_: int) -> pd.DataFrame:
    """The summary rows of one side's run (one per cell)."""
    frames = [pd.read_parquet(p) for p in sorted(root.glob("*/bs*/summary.parquet"))]
    df = pd.concat(frames, ignore_index=True)
    return df.assign(side=side, round=round_)


def compare(summaries: pd.DataFrame) -> pd.DataFrame:
    """Per cell and round: both sides' throughput with intervals, and whether the intervals overlap."""
    keys = ["dataset", "batch_size", "round"]
    cols = ["tokens_per_s", "tokens_per_s_ci_low", "tokens_per_s_ci_high", "contaminated"]
    wide = summaries.pivot_table(index=keys, columns="side", values=cols, aggfunc="first")
    wide.columns = [f"{side}_{col}" for col, side in wide.columns]
    out = wide.reset_index()
    out["fresh_over_shared"] = out["fresh_tokens_per_s"] / out["shared_tokens_per_s"]
    out["agree"] = (out["fresh_tokens_per_s_ci_low"] <= out["shared_tokens_per_s_ci_high"]) & (
        out["shared_tokens_per_s_ci_low"] <= out["fresh_tokens_per_s_ci_high"]
    )
    return out.sort_values(keys).reset_index(drop=True)


def format_report(table: pd.DataFrame, wall: dict[str, list[float]]) -> str:
    """Human-readable comparison (one line per cell and round)."""
    lines = ["dataset     bs  round  shared tok/s [95% CI]        fresh tok/s [95% CI]         fresh/shared  agree"]
    for r in table.itertuples():
        shared = f"{r.shared_tokens_per_s:8.1f} [{r.shared_tokens_per_s_ci_low:.1f}, {r.shared_tokens_per_s_ci_high:.1f}]"
        fresh = f"{r.fresh_tokens_per_s:8.1f} [{r.fresh_tokens_per_s_ci_low:.1f}, {r.fresh_tokens_per_s_ci_high:.1f}]"
        lines.append(
            f"{r.dataset:<10} {r.batch_size:>3}  {r.round:>5}  {shared:<28} {fresh:<28} {r.fresh_over_shared:>12.3f}  "
            f"{'yes' if r.agree else 'NO'}"
        )
    n, ok = len(table), int(table["agree"].sum())
    lines.append(f"cells whose intervals overlap: {ok}/{n}")
    for side in SIDES:
        lines.append(f"{side}: process wall time per round {', '.join(f'{s:.0f} s' for s in wall[side])}")
    return "\n".join(lines)


def _cmd_bench_engine_sharing(args: argparse.Namespace) -> int:
    from sdbench.config import load_config

    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    from sdbench.bench.parity import machine_info

    config = load_config(args.config)
    engine = args.engine or sorted(config["engines"])[0]
    cells = group_cells(config, engine, args.model, args.method)
    results = Path(args.results)
    prompts = {}
    for spec in cells:
        path = results / "prompts" / args.model / f"{spec['cell']['dataset']}.parquet"
        if not path.is_file():
            raise FileNotFoundError(f"--results: {path} not found (run the workflow's prepare_dataset first)")
        prompts[spec["cell"]["dataset"]] = str(path)
    dirs = ["--model-dir", args.model_dir] + (["--drafter-dir", args.drafter_dir] if args.drafter_dir else [])
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    runners = {"shared": run_shared, "fresh": run_fresh}
    wall: dict[str, list[float]] = {side: [] for side in SIDES}
    frames = []
    for round_ in range(args.rounds):
        for side in SIDES if round_ % 2 == 0 else SIDES[::-1]:
            out = workdir / f"{side}-{round_}"
            seconds = runners[side](cells, prompts, dirs, out)
            wall[side].append(seconds)
            print(f"round {round_} {side}: {seconds:.0f} s", flush=True)
            frames.append(read_summaries(out, side, round_))
    table = compare(pd.concat(frames, ignore_index=True))
    print(format_report(table, wall))
    print(f"machine: {machine['cpu_model']}, {machine['cores']} cores, load {machine['loadavg']} before")
    if args.output_json:
        report = {"machine": machine, "wall_s": wall, "cells": json.loads(table.to_json(orient="records"))}
        Path(args.output_json).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return 0 if bool(table["agree"].all()) else 1

