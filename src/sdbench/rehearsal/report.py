"""Modelled seconds of each rehearsed engine job, against what its rule asks the scheduler for.

Every rehearsed engine job writes ``rehearsal.json`` into its output directory: its modelled
engine start-up(s), the modelled seconds of its generate calls (warm-up and timed calls of every
arm; trace and server calls) and the total, as if the job ran from scratch (a cell re-used from a
checkpoint counts too). :func:`estimates_table` (``sdbench rehearsal estimates``) sets them beside
the runtime each job's rule requests (:mod:`sdbench.scheduling`, first attempt).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from sdbench import scheduling
from sdbench.config import load_config, validate_config
from sdbench.plotting import PNG_MARK_KEY
from sdbench.rehearsal.totals import JOB_FILE, group_seconds, write_group_total, write_job_total  # noqa: F401
from sdbench.workflow.plan import Plan, profile_config


def estimates_table(config: dict[str, Any], root: str | Path = ".") -> pd.DataFrame:
    """Per engine job of ``config``: the runtime its rule requests (first attempt, minutes) and the
    rehearsal's modelled minutes (NaN where the job has no ``rehearsal.json`` under ``root``)."""
    from sdbench.workflow import paths as P

    plan = Plan(config)
    jobs: list[tuple[str, str, str, float]] = []
    for group, cells in sorted(plan.groups.items()):
        jobs.append(("run_engine", "/".join(group.as_dict().values()), P.GROUP_DIR.format(**group.as_dict()),
                     scheduling.group_runtime_minutes(config, cells, 1)))  # fmt: skip
    for group, cells in sorted(plan.breakdown_groups.items()):
        jobs.append(("breakdown_group", "/".join(group.as_dict().values()),
                     P.BREAKDOWN_GROUP_DIR.format(**group.as_dict()), scheduling.breakdown_runtime_minutes(config, cells, 1)))  # fmt: skip
    for tgroup in sorted(plan.trace_groups):
        jobs.append(("trace_group", "/".join(tgroup.as_dict().values()), P.TRACE_GROUP_DIR.format(**tgroup.as_dict()),
                     scheduling.trace_runtime_minutes(config, plan.trace_cells(tgroup), 1)))  # fmt: skip
    for sgroup in sorted(plan.server_groups):  # an interleaved job writes one directory per arm
        jobs.append(("serve_group", "/".join(sgroup.as_dict().values()), " ".join(plan.server_arm_dirs(sgroup)),
                     scheduling.server_runtime_minutes(config, plan.server_cell(sgroup), 1)))  # fmt: skip
    rows = []
    for rule, name, directories, requested in jobs:
        paths = [Path(root) / d / JOB_FILE for d in directories.split(" ")]
        found = [json.loads(path.read_text()) for path in paths if path.is_file()]
        record = {k: sum(r[k] for r in found) for k in ("modelled_s", "startup_s", "cells")} if found else {}
        modelled = record.get("modelled_s", math.nan) / 60
        rows.append({"rule": rule, "job": name, "requested_min": float(requested), "modelled_min": modelled,
                     "requested_over_modelled": float(requested) / modelled if modelled and modelled == modelled else math.nan,
                     "modelled_startup_min": record.get("startup_s", math.nan) / 60, "cells": record.get("cells", 0)})  # fmt: skip
    return pd.DataFrame(rows)


def _cmd_estimates(args: argparse.Namespace) -> int:
    import yaml

    load_config(args.config)  # errors name the file and key
    raw = yaml.safe_load(Path(args.config).read_text())
    extra = profile_config(args.profile) if args.profile else {}
    config = validate_config({**raw, **extra, "engine_mode": "rehearsal"}, source=args.config)
    table = estimates_table(config, args.root)
    if args.output:
        from sdbench.io import write_parquet

        write_parquet(table, args.output)
    done = table.dropna(subset=["modelled_min"])
    print(table.to_string(index=False, float_format=lambda x: f"{x:,.1f}"))
    print(f"{len(done)} of {len(table)} engine jobs rehearsed; requested {done['requested_min'].sum():,.0f} min, "
          f"modelled {done['modelled_min'].sum():,.0f} min")  # fmt: skip
    return 0


def _drawn_from_rehearsal(csv: Path) -> bool:
    """Whether a drawn table (``<figure>.csv``) has a mark from rehearsal rows (``measured`` false)."""
    measured = pd.read_csv(csv).get("measured")
    return measured is not None and bool(measured.astype(str).str.lower().isin(["false", "0"]).any())


def marks_table(paper_dir: str | Path) -> pd.DataFrame:
    """Every figure and Markdown table under a run's ``results/paper/``: whether its data is a
    rehearsal's and whether it carries the rehearsal mark. The data: the ``measured`` column of the
    drawn table beside it (``<stem>.csv``: a mark from a row with ``measured`` false is rehearsal
    data); a Markdown table without one is taken for the authors' data when its path has a
    ``published`` scope, else for the rehearsal's (this is a check of a rehearsal's results). The
    mark: a PNG's text chunk (:data:`sdbench.plotting.PNG_MARK_KEY`), a Markdown file's first
    line (:func:`sdbench.provenance.banner`). One row per file: ``item``
    (its figure-index name), ``path`` (under ``paper_dir``), ``kind`` (png, md), ``rehearsal_data``,
    ``marked``."""
    from PIL import Image

    from sdbench.figureindex import PUBLISHED_SCOPE
    from sdbench.provenance import MARK

    root = Path(paper_dir)
    rows = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".png", ".md")):
        drawn = path.with_suffix(".csv")
        if drawn.is_file():
            rehearsal = _drawn_from_rehearsal(drawn)
        else:
            rehearsal = PUBLISHED_SCOPE not in path.relative_to(root).with_suffix("").parts
        if path.suffix == ".png":
            with Image.open(path) as image:
                marked = image.info.get(PNG_MARK_KEY) == MARK
        else:
            marked = MARK in path.read_text(errors="replace").split("\n", 1)[0].lower()
        rows.append({"item": path.relative_to(root).parts[0].removesuffix(path.suffix), "path": str(path.relative_to(root)),
                     "kind": path.suffix.lstrip("."), "rehearsal_data": bool(rehearsal), "marked": bool(marked)})  # fmt: skip
    return pd.DataFrame(rows, columns=["item", "path", "kind", "rehearsal_data", "marked"])


def marks_report(table: pd.DataFrame, expected: list[str] | None = None) -> tuple[str, bool]:
    """(Markdown, whether every file is marked exactly when its data is a rehearsal's and every
    expected figure-index item has a file) of :func:`marks_table`."""
    from sdbench.figureindex import BY_NAME

    expected = sorted(BY_NAME) if expected is None else sorted(expected)
    present = sorted(set(table["item"]))
    missing = [name for name in expected if name not in present]
    absent = [name for name in sorted(BY_NAME) if name not in present]
    wrong = table[table["marked"] != table["rehearsal_data"]]
    lines = [f"# results/paper: {len(present)} figure-index items, {len(table)} figures and Markdown tables", ""]
    for (kind, rehearsal), rows in table.groupby(["kind", "rehearsal_data"]):
        whose = "rehearsal data" if rehearsal else "measured data only (in a rehearsal: the authors' published traces)"
        lines.append(f"- {kind} drawn from {whose}: {int(rows['marked'].sum())} of {len(rows)} marked "
                     f"({len(set(rows['item']))} items)")  # fmt: skip
    lines.append(f"- index items without a file: {', '.join(absent) if absent else 'none'}")
    if missing:
        lines.append(f"- expected and without a file: {', '.join(missing)}")
    if not wrong.empty:
        lines += ["", "Marked where the data is not a rehearsal's, or not marked where it is:",
                  *[f"- {r.path} (rehearsal data: {r.rehearsal_data}, marked: {r.marked})" for r in wrong.itertuples()]]  # fmt: skip
    return "\n".join(lines) + "\n", wrong.empty and not missing


def _cmd_marks(args: argparse.Namespace) -> int:
    table = marks_table(args.paper_dir)
    if table.empty:
        raise SystemExit(f"error: {args.paper_dir}: no figure or table")
    text, ok = marks_report(table, args.expect)
    if args.markdown:
        from sdbench.io import write_text

        write_text(text, args.markdown)
    print(text, end="")
    return 0 if ok else 1
