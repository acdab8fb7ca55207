"""``sdbench bench simulator``: the published simulator's full grid in compat mode, sdbench vs
SpecDecode-Bench/simulator.

Ours is timed in-process (best of ``--repeat``, trace loading included) and as whole processes,
one ``sdbench simulate`` per proposer (start-up included); the published simulator runs as its
own processes, one ``main.py`` per proposer, and both ratios are printed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from sdbench.bench.processes import run_sdbench
from sdbench.simulator.core import DEFAULT_BATCH_SIZES, simulate
from sdbench.simulator.costmodel import CostModel, load_cost_model
from sdbench.simulator.reports import PAPER_GRID
from sdbench.simulator.tracesets import load_traces


PUBLISHED_PROPOSERS = {"eagle": "eagle3", "ngram": "ngram", "combined": "combined"}


def run_paper_grid(
    paths: Sequence[str | os.PathLike[str]], cm: CostModel, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES
) -> pd.DataFrame:
    """The published simulator's full grid in compat mode, loading the traces (what is timed)."""
    sets = [load_traces(p) for p in paths]
    return pd.concat(
        [simulate(sets, proposer, policies, batch_sizes, cm, "compat") for proposer, policies in PAPER_GRID],
        ignore_index=True,
    )


def run_paper_grid_processes(
    paths: Sequence[str | os.PathLike[str]], cost_model: str, batch_sizes: Sequence[int], workdir: Path
) -> tuple[float, pd.DataFrame]:
    """The same grid as the pipeline runs it: one ``sdbench simulate --mode compat`` process per
    proposer, as the published simulator runs one ``main.py`` per proposer. Returns the summed wall
    seconds (start-up, trace loading and CSV writing included) and the results."""
    seconds, frames = 0.0, []
    for proposer, policies in PAPER_GRID:
        out = workdir / f"{proposer}.csv"
        seconds += run_sdbench(
            ["simulate", "--traces", *paths, "--proposer", proposer, "--policy", *policies, "--mode", "compat"]
            + ["--batch-sizes", *map(str, batch_sizes), "--cost-model", cost_model, "--output", out]
        )
        frames.append(pd.read_csv(out))
    return seconds, pd.concat(frames, ignore_index=True)


def _same_results(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Whether two result tables have the same speedups (to the CSV's 6 decimals)."""
    keys = ["dataset", "proposer", "policy", "batch_size"]
    a, b = a.sort_values(keys).reset_index(drop=True), b.sort_values(keys).reset_index(drop=True)
    return a[keys].astype(str).equals(b[keys].astype(str)) and bool(
        ((a["speedup"] - b["speedup"]).abs() <= 1e-6).all()
    )


def run_published_simulator(
    directory: Path, datasets: Sequence[str], batch_sizes: Sequence[int], python: str = sys.executable
) -> tuple[float, pd.DataFrame]:
    """Run the published simulator's ``main.py`` (in ``directory``) for the paper grid; returns
    wall seconds and its results (dataset, proposer, policy, batch_size, speedup)."""
    if not (directory / "main.py").is_file():
        raise FileNotFoundError(f"{directory}/main.py not found: not a checkout of SpecDecode-Bench/simulator")
    for d in datasets:
        data = directory / "data" / "llama3.1-8B" / f"combined_{d}.jsonl"
        if not data.is_file():
            raise FileNotFoundError(f"the published simulator reads {data}, which does not exist")
    frames = []
    with tempfile.TemporaryDirectory(prefix="pubsim-") as out:
        start = time.perf_counter()
        for proposer in PUBLISHED_PROPOSERS.values():
            cmd = [
                python,
                "main.py",
                "--proposer",
                proposer,
                "--datasets",
                *datasets,
                "--batch-sizes",
                *map(str, batch_sizes),
                "--output-dir",
                out,
            ]
            subprocess.run(cmd, cwd=directory, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seconds = time.perf_counter() - start
        names = {v: k for k, v in PUBLISHED_PROPOSERS.items()}
        for proposer in PUBLISHED_PROPOSERS.values():
            for d in datasets:
                df = pd.read_csv(Path(out) / f"{proposer}_{d}_speedup.csv")
                frames.append(
                    pd.DataFrame(
                        {
                            "dataset": d,
                            "proposer": names[proposer],
                            "policy": df["predict_method"].str.lower().str.replace("_", "-"),
                            "batch_size": df["batch_size"],
                            "speedup": df["speedup"],
                        }
                    )
                )
    return seconds, pd.concat(frames, ignore_index=True)


def _cmd_bench_simulator(args: argparse.Namespace) -> int:
    cm = load_cost_model(args.cost_model)
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        ours = run_paper_grid(args.traces, cm, args.batch_sizes)
        times.append(time.perf_counter() - start)
    ours_s = min(times)
    configs = len(ours)
    print(
        f"sdbench compat: {configs} configurations (dataset x proposer x policy x batch size) "
        f"in {ours_s:.3f} s (best of {args.repeat}, traces loading included)"
    )
    with tempfile.TemporaryDirectory(prefix="sdbench-bench-simulator-") as tmp:
        runs = [
            run_paper_grid_processes(args.traces, args.cost_model, args.batch_sizes, Path(tmp))
            for _ in range(args.repeat)
        ]
    whole_s = min(s for s, _ in runs)
    same = _same_results(ours, runs[0][1])
    print(
        f"sdbench compat as whole processes (one `sdbench simulate --mode compat` per proposer, start-up "
        f"included): {whole_s:.3f} s (best of {args.repeat}; results {'identical' if same else 'DIFFERENT'})"
    )
    if args.published_simulator is None:
        return 0 if same else 1
    datasets = sorted(ours["dataset"].unique())
    pub_s, pub = run_published_simulator(Path(args.published_simulator), datasets, args.batch_sizes, args.python)
    merged = ours.merge(pub, on=["dataset", "proposer", "policy", "batch_size"], suffixes=("", "_published"))
    same = int((merged["speedup"].round(2) == merged["speedup_published"].round(2)).sum())
    print(f"published simulator: {pub_s:.1f} s; results equal to 2 decimals on {same}/{len(merged)} configurations")
    print(f"ratio (published / sdbench): {pub_s / ours_s:.0f}x")
    print(f"ratio as whole processes (published / sdbench processes): {pub_s / whole_s:.0f}x")
    return 0 if same else 1
