"""``sdbench bench timeline``: where a workflow run's wall time went, from Snakemake's log.

Snakemake's log (``.snakemake/log/<date>.snakemake.log``) stamps every job's start and
finish. This reads them back into one row per job and splits the run's wall time into
stages (training, engine cells, analyses): each stage's *wall* share is the time during
which at least one of its jobs ran and no job of an earlier stage in :data:`STAGES` did,
so the shares add up to the run's wall time; *job-seconds* sum the jobs' own durations.
"""

from __future__ import annotations

import argparse
import re
from datetime import datetime
from pathlib import Path

import pandas as pd

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


def _cmd_bench_timeline(args: argparse.Namespace) -> int:
    jobs = read_jobs(args.log)
    print(format_report(jobs, args.setup_seconds))
    if args.output:
        from sdbench.io import write_parquet

        write_parquet(jobs, args.output)
    return 0

