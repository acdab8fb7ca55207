"""``sdbench bench job-usage``: every SLURM job's peak memory and time against what it asked.

Reads the per-job records a watcher wrote beside a SLURM cluster without an accounting
database (tests/support/slurm_usage.py: one ``<job_id>.json`` per job, holding the job's
``squeue`` fields as SLURM printed them and the memory the watcher saw), and makes one row per
job: the rule and wildcards (from the comment the Snakemake SLURM executor sets,
``rule_<rule>_wildcards_<values>``), what the job asked (``--mem``, ``-t``, CPUs, GPUs), its
state, its wall time and its peak memory. A job is **over memory** when its peak exceeds its
``--mem``, **over time** when SLURM ended it at its limit (``TIMEOUT``) or it ran longer than its
limit; **failed** when it did not end ``COMPLETED``.

The report (Markdown) counts the jobs by state, failed and over, lists every failed or over job,
the 10 largest by peak memory and by time against their asks, and each rule's largest. The
command exits 1 when a job failed or went over (a check for a rehearsal of the grid).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import pandas as pd

from sdbench.io import write_parquet, write_text

# The records' format (written by tests/support/slurm_usage.py).
RECORD_VERSION = 1
# States of a job that has not ended (squeue's long names).
ACTIVE_STATES = frozenset({
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "REQUEUE_HOLD",
    "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD",
})
COMMENT = re.compile(r"^rule_(?P<rule>.+?)(?:_wildcards_(?P<wildcards>.*))?$")
MEMORY_UNITS_MB = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2, "P": 1024.0**3}
TOP = 10

COLUMNS = (
    "job_id", "rule", "wildcards", "state", "failed", "partition", "mem_asked_mb", "time_limit_min",
    "cpus", "gpus", "gpu_type", "submit", "start", "end", "wall_s", "startup_s", "startup_cpu_s", "command_s", "peak_rss_mb",
    "sampled_rss_mb",
    "peak_process_mb", "peak_process", "processes", "samples", "interval_s", "mem_share", "time_share",
    "over_memory", "over_time",
)


def parse_time_limit(text: str) -> float:
    """SLURM's time limit (``[days-]hours:minutes:seconds``, ``minutes:seconds``) in minutes; NaN if none.

    >>> parse_time_limit("2-00:00:00"), parse_time_limit("1:30:00"), parse_time_limit("5:00")
    (2880.0, 90.0, 5.0)
    """
    text = text.strip()
    if not text or text.upper() in ("UNLIMITED", "INFINITE", "N/A", "NOT_SET", "INVALID"):
        return math.nan
    days, _, clock = text.rpartition("-")
    parts = [float(p) for p in clock.split(":")]
    if len(parts) == 1:  # bare minutes
        parts = [0.0, parts[0], 0.0]
    elif len(parts) == 2:  # minutes:seconds
        parts = [0.0, *parts]
    hours, minutes, seconds = parts
    return (float(days or 0) * 24 + hours) * 60 + minutes + seconds / 60


def parse_memory_mb(text: str) -> float:
    """SLURM's memory (``8000M``, ``250G``, ``2T``; a bare number is MB) in MB; NaN if none.

    >>> parse_memory_mb("8000M"), parse_memory_mb("250G"), parse_memory_mb("1T")
    (8000.0, 256000.0, 1048576.0)
    """
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGTP]?)", text.strip().upper())
    if not m:
        return math.nan
    return float(m.group(1)) * MEMORY_UNITS_MB[m.group(2) or "M"]


def parse_gpus(*tres: str) -> tuple[int, str]:
    """GPUs and their type from ``tres-per-job`` / ``tres-per-node`` (``gres:gpu:h100:4``, ``gres/gpu:2``).

    >>> parse_gpus("gres:gpu:h100:4", "N/A"), parse_gpus("N/A", "gres/gpu:2"), parse_gpus("N/A", "N/A")
    ((4, 'h100'), (2, ''), (0, ''))
    """
    for text in tres:
        for item in text.split(","):
            parts = re.split(r"[:/]", item.strip())
            if len(parts) >= 2 and parts[0] == "gres" and parts[1] == "gpu":
                rest = parts[2:]
                count = int(rest[-1]) if rest and rest[-1].isdigit() else 1
                kind = rest[0] if len(rest) == 2 else ""
                return count, kind
    return 0, ""


def parse_comment(text: str) -> tuple[str, str]:
    """Rule and wildcard values from the executor's job comment ``rule_<rule>_wildcards_<values>``.

    >>> parse_comment("rule_run_engine_wildcards_vllm_llama_none_all"), parse_comment("rule_aggregate")
    (('run_engine', 'vllm_llama_none_all'), ('aggregate', ''))
    """
    m = COMMENT.match(text.strip())
    if not m:
        return "", ""
    return m.group("rule"), m.group("wildcards") or ""


def command_startup(processes: list[dict]) -> tuple[float, float, float]:
    """A job's start-up before its rule's command (the first ``sdbench`` process): seconds from the
    job's first process to the command, the CPU seconds of the processes started before it, and the
    command's own seconds (start to last sighting); NaN when no command was seen.

    Under the Snakemake SLURM executor the start-up is the job step's: a shell, the batch step's
    Snakemake, ``srun``, the srun step's Snakemake (each loading the workflow) and the rule's shell.
    """
    if not processes:
        return math.nan, math.nan, math.nan
    ordered = sorted(processes, key=lambda p: p["start"])
    for i, proc in enumerate(ordered):
        if any(Path(arg).name == "sdbench" for arg in proc.get("argv", [])[:2]):
            before = sum(p.get("cpu_s", 0.0) for p in ordered[:i])
            return proc["start"] - ordered[0]["start"], before, proc.get("last_seen", proc["start"]) - proc["start"]
    return math.nan, math.nan, math.nan


def _timestamp(text: str) -> pd.Timestamp:
    try:
        return pd.Timestamp(text)
    except ValueError:
        return pd.NaT


def job_row(record: dict) -> dict:
    """One job's row from its record (see the module docstring)."""
    if record.get("version") != RECORD_VERSION:
        raise ValueError(f"job {record.get('job_id')}: record version {record.get('version')!r}, "
                         f"expected {RECORD_VERSION}")
    q, usage = record.get("squeue", {}), record["usage"]
    rule, wildcards = parse_comment(q.get("Comment", ""))
    gpus, gpu_type = parse_gpus(q.get("tres-per-job", ""), q.get("tres-per-node", ""))
    start, end = _timestamp(q.get("StartTime", "")), _timestamp(q.get("EndTime", ""))
    wall = (end - start).total_seconds() if pd.notna(start) and pd.notna(end) else math.nan
    state = q.get("State", "") or "UNKNOWN"
    mem, limit = parse_memory_mb(q.get("MinMemory", "")), parse_time_limit(q.get("TimeLimit", ""))
    peak = usage["peak_rss_kb"] / 1024
    startup, startup_cpu, command = command_startup(usage.get("process_list", []))
    return {
        "job_id": str(record["job_id"]),
        "rule": rule,
        "wildcards": wildcards,
        "state": state,
        "failed": state != "COMPLETED",
        "partition": q.get("Partition", ""),
        "mem_asked_mb": mem,
        "time_limit_min": limit,
        "cpus": int(q["NumCPUs"]) if q.get("NumCPUs", "").isdigit() else 0,
        "gpus": gpus,
        "gpu_type": gpu_type,
        "submit": _timestamp(q.get("SubmitTime", "")),
        "start": start,
        "end": end,
        "wall_s": wall,
        "startup_s": startup,
        "startup_cpu_s": startup_cpu,
        "command_s": command,
        "peak_rss_mb": peak,
        "sampled_rss_mb": usage["sampled_rss_kb"] / 1024,
        "peak_process_mb": usage["peak_process_kb"] / 1024,
        "peak_process": usage["peak_process"],
        "processes": int(usage["processes"]),
        "samples": int(usage["samples"]),
        "interval_s": float(usage["interval_s"]),
        "mem_share": peak / mem if mem > 0 else math.nan,
        "time_share": wall / (60 * limit) if limit > 0 else math.nan,
        "over_memory": bool(mem > 0 and peak > mem),
        "over_time": bool(state in ("TIMEOUT", "DEADLINE") or (limit > 0 and wall > 60 * limit)),
    }


def read_usage(usage_dir: str | Path) -> pd.DataFrame:
    """One row per job record in ``usage_dir`` (:data:`COLUMNS`), sorted by job id."""
    directory = Path(usage_dir)
    if not directory.is_dir():
        raise SystemExit(f"--usage-dir {directory}: no such directory")
    rows = []
    for path in sorted(directory.glob("*.json")):
        try:
            rows.append(job_row(json.loads(path.read_text())))
        except (ValueError, KeyError) as exc:
            raise SystemExit(f"{path}: not a job usage record ({exc})") from None
    if not rows:
        raise SystemExit(f"--usage-dir {directory}: no job records (*.json)")
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    order = table["job_id"].map(lambda j: (len(j), j))
    return table.iloc[order.argsort(kind="stable")].reset_index(drop=True)


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "-"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _mb(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:,.0f}"


def _share(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{100 * value:.1f}%"


def _jobs_markdown(table: pd.DataFrame, kind: str) -> str:
    if table.empty:
        return "(none)"
    shown = pd.DataFrame({"job": table["job_id"], "rule": table["rule"], "wildcards": table["wildcards"]})
    if kind in ("memory", "problems"):
        shown["state"] = table["state"]
        shown["peak MB"] = table["peak_rss_mb"].map(_mb)
        shown["asked MB"] = table["mem_asked_mb"].map(_mb)
        shown["peak/asked"] = table["mem_share"].map(_share)
    if kind in ("time", "problems"):
        shown["wall"] = table["wall_s"].map(_clock)
        shown["limit"] = (table["time_limit_min"] * 60).map(_clock)
        shown["wall/limit"] = table["time_share"].map(_share)
    if kind == "memory":
        shown["largest process (MB)"] = [
            f"{_mb(mb)}: {cmd[:60]}" for mb, cmd in zip(table["peak_process_mb"], table["peak_process"])
        ]
    if kind == "time":
        shown["CPUs"] = table["cpus"]
        shown["GPUs"] = [f"{n} {t}".strip() if n else "0" for n, t in zip(table["gpus"], table["gpu_type"])]
    return shown.to_markdown(index=False)


def per_rule(table: pd.DataFrame) -> pd.DataFrame:
    """Each rule's jobs, failures and largest peak memory and wall time against the smallest ask."""
    grouped = table.groupby("rule", sort=True)
    return pd.DataFrame({
        "jobs": grouped.size(),
        "failed": grouped["failed"].sum(),
        "max_peak_mb": grouped["peak_rss_mb"].max(),
        "min_mem_asked_mb": grouped["mem_asked_mb"].min(),
        "max_mem_share": grouped["mem_share"].max(),
        "max_wall_s": grouped["wall_s"].max(),
        "min_time_limit_min": grouped["time_limit_min"].min(),
        "max_time_share": grouped["time_share"].max(),
    }).reset_index()


def format_report(table: pd.DataFrame, top: int = TOP) -> str:
    """The Markdown report of the module docstring."""
    states = table["state"].value_counts().sort_index()
    problems = table[table["failed"] | table["over_memory"] | table["over_time"]]
    wall = (table["end"].max() - table["submit"].min()).total_seconds() if len(table) else math.nan
    lines = [
        f"# SLURM jobs: peak memory and time against their asks ({len(table)} jobs)",
        "",
        f"- jobs ended: {int((~table['state'].isin(ACTIVE_STATES | {'UNKNOWN'})).sum())} "
        f"({', '.join(f'{s} {n}' for s, n in states.items())})",
        f"- failed: {int(table['failed'].sum())}",
        f"- over their memory: {int(table['over_memory'].sum())}",
        f"- over their time: {int(table['over_time'].sum())}",
        f"- first submission to last end: {_clock(wall)}",
        f"- job step start-up (a job's first process to its rule's command): median "
        f"{table['startup_s'].median():.1f} s and {table['startup_cpu_s'].median():.1f} CPU-s, largest "
        f"{table['startup_s'].max():.1f} s ({int(table['startup_s'].notna().sum())} jobs); the commands: "
        f"{table['command_s'].sum() / 60:.1f} min of {table['wall_s'].sum() / 60:.1f} job-minutes",
        "",
        "Peak memory: the largest sum, over a job's processes alive at once, of each one's own peak",
        f"resident memory (VmHWM), sampled every {table['interval_s'].max():g} s; wall time: SLURM's start to end.",
        "",
        "## Failed or over",
        "",
        _jobs_markdown(problems, "problems"),
        "",
        f"## The {top} largest by peak memory",
        "",
        _jobs_markdown(table.sort_values(["peak_rss_mb", "job_id"], ascending=[False, True]).head(top), "memory"),
        "",
        f"## The {top} longest",
        "",
        _jobs_markdown(table.sort_values(["wall_s", "job_id"], ascending=[False, True]).head(top), "time"),
        "",
        "## Per rule",
        "",
    ]
    rules = per_rule(table)
    shown = pd.DataFrame({
        "rule": rules["rule"], "jobs": rules["jobs"], "failed": rules["failed"],
        "max peak MB": rules["max_peak_mb"].map(_mb), "min asked MB": rules["min_mem_asked_mb"].map(_mb),
        "max peak/asked": rules["max_mem_share"].map(_share), "max wall": rules["max_wall_s"].map(_clock),
        "min limit": (rules["min_time_limit_min"] * 60).map(_clock),
        "max wall/limit": rules["max_time_share"].map(_share),
    })
    lines.append(shown.to_markdown(index=False))
    return "\n".join(lines) + "\n"


def verdict(table: pd.DataFrame) -> str | None:
    """One line naming what failed or went over; ``None`` when every job completed within its asks."""
    failed, mem, time_ = (int(table[c].sum()) for c in ("failed", "over_memory", "over_time"))
    if not (failed or mem or time_):
        return None
    return f"{failed} job(s) failed, {mem} over their memory, {time_} over their time (of {len(table)})"


def _cmd_bench_job_usage(args: argparse.Namespace) -> int:
    table = read_usage(args.usage_dir)
    report = format_report(table)
    print(report, end="")
    if args.markdown:
        write_text(report, args.markdown)
    if args.output:
        write_parquet(table, args.output)
    problem = verdict(table)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    return 0
