"""``sdbench bench timeline``: where a workflow run's wall time went, from Snakemake's log.

Snakemake's log (``.snakemake/log/<date>.snakemake.log``) stamps every job's start and
finish. This reads them back into one row per job and splits the run's wall time into
stages (training, engine cells, analyses): each stage's *wall* share is the time during
which at least one of its jobs ran and no job of an earlier stage in :data:`STAGES` did,
so the shares add up to the run's wall time; *job-seconds* sum the jobs' own durations.

With the run's ``results/`` directory it also splits each engine job (``run_engine``) from the
tables its cells wrote: engine start-up (the SD engine's and its paired no-SD engine's
``LLM()``), warm-up, timed calls (both arms) and the rest of the job (process start, imports,
preflight, table writing), with the cells' trials.
"""

from __future__ import annotations

import argparse
import re
from datetime import datetime
from pathlib import Path

import pandas as pd

from sdbench.io import write_parquet

# Stage of each rule; earlier stages take precedence when jobs overlap. Rules not named
# here are analyses (joins, tracing replays, simulator, figures).
STAGES: dict[str, tuple[str, ...]] = {
    "training": ("build_tokenizer", "build_model", "build_head", "download_model"),
    "engine cells": ("run_engine", "trace_group", "breakdown_group", "serve_group"),
}
OTHER_STAGE = "analyses"

_STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
_START = re.compile(r"^(?:local)?rule (\w+):$")
_JOBID = re.compile(r"^\s+jobid: (\d+)$")
_WILDCARDS = re.compile(r"^\s+wildcards: (.*)$")
_FINISH = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)$")


def _parse_stamp(text: str) -> datetime:
    return datetime.strptime(" ".join(text.split()), "%a %b %d %H:%M:%S %Y")


def read_jobs(log: str | Path) -> pd.DataFrame:
    """One row per finished job: ``jobid``, ``rule``, ``wildcards``, ``stage``, ``start``, ``end``, ``seconds``.

    ``wildcards`` is Snakemake's ``name=value, ...`` text ("" for a rule without wildcards).
    """
    started: dict[int, tuple[str, datetime]] = {}
    wildcards: dict[int, str] = {}
    last_job: int | None = None
    rows = []
    stamp: datetime | None = None
    pending_rule: tuple[str, datetime] | None = None
    for line in Path(log).read_text(encoding="utf-8", errors="replace").splitlines():
        if m := _STAMP.match(line):
            stamp = _parse_stamp(m.group(1))
        elif (m := _START.match(line)) and stamp is not None:
            pending_rule = (m.group(1), stamp)
        elif (m := _JOBID.match(line)) and pending_rule is not None:
            last_job = int(m.group(1))
            started[last_job] = pending_rule
            pending_rule = None
        elif (m := _WILDCARDS.match(line)) and last_job is not None:
            wildcards[last_job] = m.group(1).strip()
        elif (m := _FINISH.match(line)) and stamp is not None:
            jobid = int(m.group(1))
            rule, start = started.get(jobid, (m.group(2), stamp))
            rows.append({"jobid": jobid, "rule": rule, "wildcards": wildcards.get(jobid, ""), "start": start, "end": stamp})
    if not rows:
        raise ValueError(f"{log}: no finished jobs found (is it a Snakemake log?)")
    df = pd.DataFrame(rows)
    df["stage"] = df["rule"].map(stage_of)
    df["seconds"] = (df["end"] - df["start"]).dt.total_seconds()
    return df.sort_values(["start", "jobid"]).reset_index(drop=True)


def stage_of(rule: str) -> str:
    """The stage a rule belongs to (:data:`STAGES`, else :data:`OTHER_STAGE`)."""
    return next((stage for stage, rules in STAGES.items() if rule in rules), OTHER_STAGE)


def split(jobs: pd.DataFrame) -> pd.DataFrame:
    """Per stage: wall seconds (exclusive, by precedence), job-seconds and job count."""
    order = [*STAGES, OTHER_STAGE]
    t0, t1 = jobs["start"].min(), jobs["end"].max()
    bounds = sorted({t0, t1, *jobs["start"], *jobs["end"]})
    wall = dict.fromkeys(order, 0.0)
    for a, b in zip(bounds, bounds[1:], strict=False):
        running = jobs[(jobs["start"] <= a) & (jobs["end"] >= b)]["stage"]
        if len(running):
            wall[min(running, key=order.index)] += (b - a).total_seconds()
    out = pd.DataFrame({"stage": order, "wall_s": [wall[s] for s in order]})
    agg = jobs.groupby("stage")["seconds"].agg(["sum", "count"]).rename(columns={"sum": "job_s", "count": "jobs"})
    out = out.join(agg, on="stage").fillna({"job_s": 0.0, "jobs": 0})
    out["jobs"] = out["jobs"].astype(int)
    return out


def format_report(jobs: pd.DataFrame, setup_s: float | None = None) -> str:
    """Stage split and per-rule totals as text."""
    table = split(jobs)
    run_s = (jobs["end"].max() - jobs["start"].min()).total_seconds()
    lines = []
    if setup_s is not None:
        lines.append(f"{'setup':<14} {setup_s:8.0f} s wall")
    for r in table.itertuples():
        lines.append(f"{r.stage:<14} {r.wall_s:8.0f} s wall  {r.job_s:8.0f} job-s  {r.jobs:4d} jobs")
    total = run_s + (setup_s or 0.0)
    lines.append(f"{'total':<14} {total:8.0f} s wall ({total / 60:.1f} min)")
    per_rule = jobs.groupby("rule")["seconds"].agg(["count", "sum", "max"]).sort_values("sum", ascending=False)
    lines.append("rule                         jobs   job-s  longest")
    for rule, r in per_rule.iterrows():
        lines.append(f"{rule:<28} {int(r['count']):5d} {r['sum']:7.0f}  {r['max']:7.0f}")
    return "\n".join(lines)


ENGINE_PARTS = ("startup_s", "warmup_s", "timed_s", "other_s")


def _wildcards(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(", ") if "=" in part)


def engine_breakdown(jobs: pd.DataFrame, results: str | Path) -> pd.DataFrame:
    """One row per ``run_engine`` job: its cells, their median trials, and the job's seconds split
    into :data:`ENGINE_PARTS` from the group's cell tables under ``results/engines/``.

    A part a table does not record (a run from before ``paired_baseline_startup_s`` existed)
    stays in ``other_s``. Jobs whose group directory is missing are left out.
    """
    rows = []
    for job in jobs[jobs["rule"] == "run_engine"].itertuples():
        w = _wildcards(job.wildcards)
        group = Path(results) / "engines" / w.get("engine", "") / w.get("model", "") / w.get("method", "") / w.get(
            "share", "")
        summaries = sorted(group.rglob("summary.parquet")) if group.is_dir() else []
        if not summaries:
            continue
        cells = pd.concat([pd.read_parquet(p) for p in summaries], ignore_index=True)
        baseline_s = sum(float(pd.read_parquet(p.with_name("baseline_calls.parquet"))["duration_s"].sum())
                         for p in summaries if p.with_name("baseline_calls.parquet").is_file())  # fmt: skip
        first = lambda col: float(cells[col].iloc[0]) if col in cells and pd.notna(cells[col].iloc[0]) else 0.0  # noqa: E731
        total = lambda col: float(cells[col].fillna(0).sum()) if col in cells else 0.0  # noqa: E731
        startup = first("startup_s") + first("paired_baseline_startup_s")
        warmup = total("warmup_s") + total("paired_baseline_warmup_s")
        timed = total("generate_s") + baseline_s
        rows.append({
            "group": "/".join(w.get(k, "") for k in ("engine", "model", "method", "share")),
            "cells": len(cells),
            "median_trials": float(cells["num_trials"].median()),
            "job_s": float(job.seconds),
            "startup_s": startup,
            "warmup_s": warmup,
            "timed_s": timed,
            "other_s": float(job.seconds) - startup - warmup - timed,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=["group", "cells", "median_trials", "job_s", *ENGINE_PARTS])


def format_engine_breakdown(table: pd.DataFrame, cells: pd.DataFrame | None = None) -> str:
    """The engine jobs' split as text, one line per job and a total."""
    lines = [f"{'engine job':<44} cells trials   job-s startup warm-up   timed   other"]
    for r in table.itertuples():
        lines.append(f"{r.group:<44} {r.cells:5d} {r.median_trials:6.1f} {r.job_s:7.0f} {r.startup_s:7.0f} "
                     f"{r.warmup_s:7.0f} {r.timed_s:7.0f} {r.other_s:7.0f}")  # fmt: skip
    sums = table[["cells", "job_s", *ENGINE_PARTS]].sum()
    trials = float(cells["num_trials"].median()) if cells is not None and len(cells) else float("nan")
    lines.append(f"{'total (' + str(len(table)) + ' jobs)':<44} {int(sums['cells']):5d} {trials:6.1f} "
                 f"{sums['job_s']:7.0f} {sums['startup_s']:7.0f} {sums['warmup_s']:7.0f} {sums['timed_s']:7.0f} "
                 f"{sums['other_s']:7.0f}")  # fmt: skip
    return "\n".join(lines)


def _cmd_bench_timeline(args: argparse.Namespace) -> int:
    jobs = read_jobs(args.log)
    print(format_report(jobs, args.setup_seconds))
    if args.results:
        table = engine_breakdown(jobs, args.results)
        summaries = sorted(Path(args.results).glob("engines/**/summary.parquet"))
        cells = pd.concat([pd.read_parquet(p, columns=["num_trials"]) for p in summaries]) if summaries else None
        print(format_engine_breakdown(table, cells))
    if args.output:
        write_parquet(jobs, args.output)
    return 0

