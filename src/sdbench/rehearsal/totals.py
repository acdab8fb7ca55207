"""A rehearsed engine job's modelled seconds, written into its output directory (``rehearsal.json``).

Apart from :mod:`sdbench.rehearsal.report` (which reads them against the rules' asks) because
the rehearsal's engine jobs run it: it is in their measurement scope (:mod:`sdbench.engine.scope`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

JOB_FILE = "rehearsal.json"


def write_job_total(directory: str | Path, kind: str, startup_s: float, generate_s: float, cells: int,
                    spec: dict[str, Any] | None = None) -> None:  # fmt: skip
    """Write a rehearsed job's modelled seconds into its output directory, and (given a job's
    ``spec``) which cost model priced them (:func:`sdbench.rehearsal.costs.priced_by`)."""
    record = {"kind": kind, "measured": False, "cells": int(cells), "startup_s": float(startup_s),
              "generate_s": float(generate_s), "modelled_s": float(startup_s) + float(generate_s)}  # fmt: skip
    if spec is not None:
        from sdbench.rehearsal.costs import priced_by

        record.update(priced_by(spec))
    (Path(directory) / JOB_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def group_seconds(summaries: list[pd.DataFrame]) -> tuple[float, float] | None:
    """(start-up, generate) seconds of an engine group from its cells' summaries; None when measured.

    The group's engines start once per engine start and are shared by its cells; a paired group
    also starts the no-SD engine.
    """
    rows = pd.concat(summaries, ignore_index=True)
    if rows.empty or bool(rows.get("measured", pd.Series([True])).all()):
        return None
    starts = rows.get("num_engine_starts", pd.Series(1, index=rows.index)).astype(float)
    startup = float((rows["startup_s"] * starts).max())
    paired = (rows["paired_baseline_startup_s"] * starts).max() if "paired_baseline_startup_s" in rows else math.nan
    startup += 0.0 if pd.isna(paired) else float(paired)
    return startup, float(rows["modelled_s"].sum())


def write_group_total(directory: str | Path, summaries: list[pd.DataFrame], kind: str = "engine",
                      spec: dict[str, Any] | None = None) -> None:  # fmt: skip
    """:func:`write_job_total` of an engine group whose cells were rehearsed (nothing otherwise)."""
    seconds = group_seconds(summaries)
    if seconds is not None:
        write_job_total(directory, kind, *seconds, len(summaries), spec=spec)
