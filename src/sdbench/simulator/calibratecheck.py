"""``sdbench calibrate check``: a cost model against a run's own measurements.

Two checks of a cost model (a calibration's, ``sdbench calibrate fit``; or any) on a pipeline run's
``results/``:

1. **Step times.** Every step the breakdown timed (``results/breakdown/**/steps.parquet``, the
   engine's own stage timings) is priced: the target's forward pass against the measured
   ``verify_s`` (what a calibration times) and the whole step (drafter and per-step overhead too)
   against ``step_s``. Errors are relative, ``predicted / measured - 1``: per step, and per
   breakdown cell over the mean of its steps (what a speedup depends on). A step of a drafter the
   model does not price is counted as not priced, never guessed.
2. **Speedups.** The simulations the run validates (``ext05``: the n-gram and each priced drafter
   per traced engine x model x dataset, :meth:`Plan.sim_cell_files`) are replayed from the run's
   own traces with the same inputs as the rules, priced by the cost model instead of the run's
   fit, and joined to the measured cells by :func:`sdbench.simulator.validation.compare`: how
   many simulated speedups lie inside the measured 95% interval. The run's own table
   (``results/tables/simulated_vs_measured.parquet``) is read beside it as the reference. Only
   the fixed-K policies that validation reads are replayed (each policy is simulated alone, so
   the speedups are those ``sdbench simulate`` would write).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sdbench.simulator.core import simulate
from sdbench.simulator.costmodel import NO_DRAFTER, CostModel
from sdbench.simulator.tracesets import draft_method_of, load_traces
from sdbench.workflow.plan import Plan

# One row per breakdown cell (engine x model x dataset x method x batch size).
STEP_CHECK_COLUMNS: tuple[str, ...] = (
    "engine", "model", "dataset", "method", "batch_size", "sd_method", "steps", "priced",
    "verify_measured_ms", "verify_predicted_ms", "verify_error",  # cell means; error: predicted / measured - 1
    "step_measured_ms", "step_predicted_ms", "step_error",
    # the step outside the target's pass and the drafter's proposal: measured (step - verify - propose,
    # NaN without a propose_s column) and the model's overhead_per_step
    "overhead_measured_ms", "overhead_model_ms",
)  # fmt: skip


def step_errors(model: CostModel, steps: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per step and per breakdown cell: ``model``'s target and whole-step times against the measured.

    ``steps``: breakdown step rows (``sd_method`` the vLLM method, ``verify_s``, ``step_s``,
    ``num_batched_tokens``, ``num_kv_tokens``, ``num_proposed_tokens``). Returns (per step with
    ``verify_error``/``step_error``, NaN where not priced; per cell, :data:`STEP_CHECK_COLUMNS`).
    """
    missing = [c for c in ("sd_method", "verify_s", "step_s", "num_batched_tokens", "num_kv_tokens",
                           "num_proposed_tokens") if c not in steps.columns]  # fmt: skip
    if missing:
        raise ValueError(f"breakdown steps lack column(s) {', '.join(missing)}")
    df = steps.reset_index(drop=True).copy()
    kv = df["num_kv_tokens"].to_numpy(float)
    verify = np.asarray(model.target.time(kv, df["num_batched_tokens"].to_numpy(float)), dtype=float)
    methods = df["sd_method"].fillna("").astype(str).to_numpy()
    proposed = df["num_proposed_tokens"].fillna(0).to_numpy(float)
    draft = np.zeros(len(df))
    priced = np.ones(len(df), bool)
    for method in sorted(set(methods) - NO_DRAFTER):
        m = methods == method
        if method not in model.drafters:
            priced[m], draft[m] = False, math.nan
            continue
        draft[m] = model.drafters[method].time(verify[m], kv[m], proposed[m])
    df["verify_predicted_s"] = verify
    df["step_predicted_s"] = verify + draft + model.overhead_per_step
    df["priced"] = priced
    df["verify_error"] = verify / df["verify_s"].to_numpy(float) - 1.0
    df["step_error"] = df["step_predicted_s"] / df["step_s"] - 1.0
    propose = df["propose_s"].fillna(0.0) if "propose_s" in df else math.nan
    df["overhead_measured_s"] = df["step_s"] - df["verify_s"] - propose
    keys = [k for k in ("engine", "model", "dataset", "method", "batch_size") if k in df.columns]
    rows = []
    for key, g in df.groupby(keys, sort=True) if keys else [((), df)]:
        key = key if isinstance(key, tuple) else (key,)
        vm, vp = g["verify_s"].mean() * 1e3, g["verify_predicted_s"].mean() * 1e3
        sm, sp = g["step_s"].mean() * 1e3, g["step_predicted_s"].mean() * 1e3
        rows.append({**dict(zip(keys, key)), "sd_method": str(g["sd_method"].iloc[0]), "steps": len(g),
                     "priced": bool(g["priced"].all()), "verify_measured_ms": vm, "verify_predicted_ms": vp,
                     "verify_error": vp / vm - 1.0, "step_measured_ms": sm, "step_predicted_ms": sp,
                     "step_error": sp / sm - 1.0, "overhead_measured_ms": g["overhead_measured_s"].median() * 1e3,
                     "overhead_model_ms": model.overhead_per_step * 1e3})  # fmt: skip
    cells = pd.DataFrame(rows).reindex(columns=list(STEP_CHECK_COLUMNS))
    return df, cells


def error_summary(errors: pd.Series) -> str:
    """``median |e|, largest |e| (its sign), n``: of the finite relative errors ``errors``."""
    e = pd.to_numeric(errors, errors="coerce").dropna()
    if e.empty:
        return "none priced"
    worst = e.iloc[int(np.argmax(e.abs().to_numpy()))]
    return f"median |error| {e.abs().median():.1%}, largest {abs(worst):.1%} ({'over' if worst > 0 else 'under'}), n={len(e)}"


def inside_count(table: pd.DataFrame) -> tuple[int, int]:
    """(simulated speedups inside the measured interval, cells judged) of a validation table
    (``agrees``: NaN where a cell has no interval, not judged)."""
    judged = table["agrees"].dropna() if "agrees" in table else pd.Series(dtype=bool)
    return int(judged.astype(bool).sum()), int(len(judged))


def _sim_key(path: str) -> tuple[str, str, str, str, str | None]:
    """(engine, model, dataset, proposer, traced method) of a simulation file the plan names."""
    parts = Path(path).parts
    if parts[-2] == "drafters":
        engine, model, dataset = parts[-5:-2]
        return engine, model, dataset, "eagle", Path(path).stem
    engine, model, dataset = parts[-4:-1]
    return engine, model, dataset, Path(path).stem, None


def reprice(config: dict[str, Any], results: Path, model: CostModel,
            say: Any = None) -> tuple[pd.DataFrame, list[str]]:  # fmt: skip
    """The validated simulations of the run in ``results`` (its config ``config``), replayed with
    ``model``: ``sdbench simulate`` rows, and a note for each one not priced."""
    from sdbench.simulator.validation import simulated_policy
    from sdbench.workflow import paths as P

    plan = Plan(config)
    root = results.parent  # the plan's paths start at results/
    at = lambda p: root / p  # noqa: E731 - a plan path under this run's root
    frames, notes = [], []
    files = plan.sim_cell_files()
    for i, path in enumerate(files, 1):
        engine, mname, dataset, proposer, traced = _sim_key(path)
        # the rule's policies that a cell's method reads (validation: fixed-K of its proposer)
        want = {w[1] for w in map(simulated_policy, config["methods"].values()) if w and w[0] == proposer}
        policies = [pol for pol in plan.sim_cell_policies(proposer) if pol in want]
        inputs = plan.sim_trace_inputs(engine, mname, dataset)
        drafter = plan.sim_drafter(traced) if traced else plan.sim_preferred_drafter(engine, mname, dataset)
        stacked = at(P.SIM_STACKED.format(engine=engine, model=mname, dataset=dataset))
        absent = [str(f) for f in (stacked, at(inputs["requests"])) if not f.is_file()]
        if absent:
            notes.append(f"{path}: not replayed (no {', '.join(absent)} yet)")
            continue
        sets = [load_traces(stacked, [at(inputs["requests"])])]
        try:
            df = simulate(sets, proposer, policies, plan.sim_cell_batch_sizes(engine, mname, dataset), model,
                          "exact", drafter=drafter)  # fmt: skip
        except KeyError as exc:  # a drafter the model does not price
            notes.append(f"{path}: not priced ({exc.args[0]})")
            continue
        df.insert(list(df.columns).index("proposer") + 1, "drafter",
                  "" if proposer == "ngram" else draft_method_of(sets[0], drafter))  # fmt: skip
        df.insert(0, "model", mname)
        df.insert(0, "engine", engine)
        frames.append(df)
        if say:
            say(f"check [{i}/{len(files)}] {path}: {len(df)} rows")
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), notes


def _cmd_check(args: argparse.Namespace) -> int:
    from sdbench.config import load_config
    from sdbench.io import read_parquet
    from sdbench.simulator.costmodel import load_cost_model
    from sdbench.simulator.validation import compare
    from sdbench.workflow import paths as P

    results = Path(args.results)
    if not results.is_dir():
        raise FileNotFoundError(f"--results {results}: no such directory (a pipeline run's results/)")
    model = load_cost_model(args.cost_model)
    config = load_config(args.config)
    plan = Plan(config)
    root = results.parent
    lines = [f"cost model {model.name} ({args.cost_model}, sha256 {model.digest()[:12]}) against {results}"]

    # 1. step times
    paths = [root / p for p in plan.breakdown_steps()]
    absent = [str(p) for p in paths if not p.is_file()]
    if absent:
        raise FileNotFoundError(f"breakdown step table(s) missing: {', '.join(absent[:3])}"
                                + (f" and {len(absent) - 3} more" if len(absent) > 3 else ""))  # fmt: skip
    if not paths:
        raise ValueError(f"{args.config}: its plan has no breakdown cells (no step times to check against)")
    steps = pd.concat([read_parquet(p, what="breakdown steps") for p in paths], ignore_index=True)
    per_step, cells = step_errors(model, steps)
    lines.append(f"step times: {len(per_step)} steps in {len(cells)} breakdown cells ({len(paths)} tables)")
    lines.append(f"  target forward vs verify_s, per step: {error_summary(per_step['verify_error'])}")
    lines.append(f"  target forward vs verify_s, cell means: {error_summary(cells['verify_error'])}")
    priced = per_step["priced"]
    lines.append(f"  whole step vs step_s, per step: {error_summary(per_step.loc[priced, 'step_error'])}")
    lines.append(f"  whole step vs step_s, cell means: {error_summary(cells.loc[cells['priced'], 'step_error'])}")
    measured_overhead = per_step["overhead_measured_s"].dropna()
    if len(measured_overhead):
        by_batch = per_step.dropna(subset=["overhead_measured_s"]).groupby("batch_size")["overhead_measured_s"]
        lines.append(f"  per-step overhead (step - verify - propose, median): measured "
                     f"{measured_overhead.median() * 1e3:.3g} ms (by batch size: "
                     + ", ".join(f"{b}: {v * 1e3:.3g}" for b, v in by_batch.median().items())
                     + f"); the model's overhead_per_step {model.overhead_per_step * 1e3:.3g} ms "
                     "(`calibrate fit --overhead-ms` sets it)")  # fmt: skip
    if (~cells["priced"]).any():
        lines.append("  not priced (no such drafter in the model): "
                     + ", ".join(sorted(set(cells.loc[~cells["priced"], "sd_method"]))))  # fmt: skip

    # 2. speedups (a run still measuring has no joined cells yet: said, the step check stands)
    if not (root / P.CELLS_TABLE).is_file():
        lines.append(f"speedups: not checked: {root / P.CELLS_TABLE} does not exist (the run has not joined its "
                     "cells yet)")  # fmt: skip
        return _finish(lines, args, pd.DataFrame(), cells)
    measured = read_parquet(root / P.CELLS_TABLE, what="cells table")
    reference_path = root / P.table("simulated_vs_measured")
    if reference_path.is_file():
        inside, judged = inside_count(read_parquet(reference_path, what="simulated vs measured"))
        lines.append(f"speedups, the run's own cost model ({reference_path}): {inside} of {judged} inside")
    t0 = time.perf_counter()
    simulated, notes = reprice(config, results, model,
                               say=lambda s: print(s, file=sys.stderr, flush=True))  # fmt: skip
    table = compare(measured, simulated, config["methods"]) if not simulated.empty else pd.DataFrame()
    inside, judged = inside_count(table)
    ratio = table["ratio"] if "ratio" in table else pd.Series(dtype=float)
    lines.append(f"speedups, priced by {model.name}: {inside} of {judged} inside the measured 95% interval; "
                 f"simulated / measured median {ratio.median():.3f} (range {ratio.min():.2f}-{ratio.max():.2f}); "
                 f"replayed in {time.perf_counter() - t0:.0f} s")  # fmt: skip
    for drafter, g in table.groupby("drafter", sort=True) if len(table) else []:
        i, j = inside_count(g)
        lines.append(f"  {drafter or 'ngram'}: {i} of {j} inside (ratio median {g['ratio'].median():.3f})")
    lines += [f"  {n}" for n in notes]
    return _finish(lines, args, table, cells)


def _finish(lines: list[str], args: argparse.Namespace, table: pd.DataFrame, cells: pd.DataFrame) -> int:
    """Print the summary; write the tables asked for (an empty speedup table when not checked)."""
    from sdbench.io import write_parquet, write_text

    print("\n".join(lines))
    if args.output:
        write_parquet(table, args.output)
    if args.steps_output:
        write_parquet(cells, args.steps_output)
    if args.markdown:
        write_text("\n".join(lines) + "\n", args.markdown)
    return 0
