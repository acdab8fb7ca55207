"""The simulator checked where it matters: its cost model at the forced-acceptance points.

A forced-acceptance cell (:mod:`sdbench.analysis.forced`) fixes how many drafts are accepted, so
the simulator's prediction there depends on its cost model alone, not on how good a drafter is.
For each forced cell the cell's own step pattern -- its measured accepted length τ on drafting
steps, the share of steps that drafted and the drafts per drafting step (n-gram drafts only where
the prompt matches) -- is laid out as a trajectory over the cell's prompts and output length and
priced by :func:`sdbench.simulator.pricing.replicated_latency`, the simulator's own pricing of a
replicated batch, against plain decoding of the same requests. The prediction is judged against
the measured speedup's 95% interval.

Where predictions fall outside, the cost model is **refitted** from the forced cells' whole-call
latencies (each SD arm's mean call time, and its paired no-SD arm's, the SD time x the speedup):
the predicted latency is linear in the cost model's coefficients, so the target's per-token and
per-step costs and each forced method's per-step and per-draft costs are fitted by non-negative
least squares on relative errors; the KV-length coefficients keep the step-timing fit's values
(the forced cells barely vary the context length). Methods the sweep did not force keep their
step-timing costs. The refitted model prices the grid's simulations (ext05 and the grid's
Fig. 9/11) from then on; its in-sample residual at the forced points is shown beside the
prediction before the refit.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from sdbench.columns import conform
from sdbench.io import write_parquet, write_text
from sdbench.simulator.costmodel import CostModel, DrafterCost, TargetCost, load_cost_model, save_cost_model
from sdbench.simulator.lstsq import nonnegative_lstsq
from sdbench.simulator.policytypes import DRAFT, EXACT, NGRAM, TraceArrays, Trajectories
from sdbench.simulator.pricing import baseline_trajectories, replicated_latency

NGRAM_METHOD = "ngram"
CHECKED = ("engine", "model", "dataset", "base_method", "method", "sd_method", "batch_size",
           "forced_acceptance_length", "mean_acceptance_length", "speedup", "speedup_ci_low", "speedup_ci_high")
# Per cost model: the step-timing fit (no suffix) and the refit at the forced points (_refit).
COLUMNS: tuple[str, ...] = (*CHECKED, *(f"{c}{tag}" for tag in ("", "_refit") for c in ("predicted", "error", "inside")))


def _beatty(n: int, rate: float) -> np.ndarray:
    """``n`` integers averaging ``rate`` as evenly as possible: floor((j+1) r) - floor(j r)."""
    j = np.arange(n + 1, dtype=float)
    return np.diff(np.floor(j * rate + 1e-9)).astype(np.int64)


def forced_trajectories(
    prompt_len: np.ndarray, output_len: int, tau: float, draft_share: float, drafts: int
) -> tuple[TraceArrays, Trajectories]:
    """Requests of ``output_len`` tokens decoded with a fixed step pattern: a share
    ``draft_share`` of steps drafts ``drafts`` tokens and emits ``tau`` on average (spread evenly),
    the other steps emit one token."""
    n = len(prompt_len)
    share = 0.0 if math.isnan(draft_share) else min(max(draft_share, 0.0), 1.0)
    # Enough steps for the slowest case (one token each); cut at output_len below.
    drafting = _beatty(output_len, share).astype(bool)
    emitted = np.ones(output_len, np.int64)
    emitted[drafting] = np.maximum(_beatty(int(drafting.sum()), tau), 1) if drafting.any() else 1
    gen = 1 + np.concatenate([[0], np.cumsum(emitted)[:-1]])
    keep = gen < output_len  # the prefill produced token 1; stop once output_len are out
    emitted = np.minimum(emitted[keep], output_len - gen[keep])
    steps = int(keep.sum())
    req = np.repeat(np.arange(n), steps)
    arrays = TraceArrays(np.arange(n) * output_len, np.full(n, output_len, np.int64), prompt_len.astype(np.int64))
    traj = Trajectories(
        req,
        np.tile(gen[keep], n),
        np.tile(np.where(drafting[keep], 1, 0), n).astype(np.int8),  # drafter code patched by the caller
        np.tile(np.where(drafting[keep], drafts, 0), n).astype(np.int64),
        np.tile(emitted, n),
    )
    return arrays, traj


def predicted_latencies(cm: CostModel, row: Any, prompt_len: np.ndarray) -> tuple[float, float]:
    """(SD, no-SD) mean request latency of a forced cell's replicated batch under ``cm``."""
    sd = str(row.sd_method)
    drafts = int(round(row.drafts_per_step)) if not math.isnan(row.drafts_per_step) else int(row.num_speculative_tokens)
    arrays, traj = forced_trajectories(prompt_len, int(round(row.output_len_mean)), float(row.mean_acceptance_length),
                                       float(row.draft_step_share), drafts)  # fmt: skip
    code = NGRAM if sd == NGRAM_METHOD else DRAFT
    traj = replace(traj, drafter=np.where(traj.k > 0, code, 0).astype(np.int8))
    proposer = NGRAM_METHOD if sd == NGRAM_METHOD else "eagle"
    b = [int(row.batch_size)]
    lat_sd = replicated_latency(traj, arrays, proposer, cm, EXACT, sd, b)[:, 0]
    lat_base = replicated_latency(baseline_trajectories(arrays), arrays, None, cm, EXACT, sd, b)[:, 0]
    return float(lat_sd.mean()), float(lat_base.mean())


def predict(cm: CostModel, forced: pd.DataFrame, prompts: dict[tuple[str, str], np.ndarray]) -> np.ndarray:
    """Predicted speedup of every forced cell (tokens per request are equal in both arms); NaN
    where ``cm`` has no cost for the cell's drafter (e.g. Medusa, which the step-timing fit does
    not time: the refit gives it one from the forced points alone)."""
    out = []
    for row in forced.itertuples(index=False):
        if str(row.sd_method) not in cm.drafters:
            out.append(math.nan)
            continue
        sd, base = predicted_latencies(cm, row, prompts[(row.model, row.dataset)])
        out.append(base / sd)
    return np.array(out, dtype=float)


# ----------------------------------------------------------------------------- refit
def _parameters(cm: CostModel, methods: list[str]) -> list[tuple[str, str]]:
    return [("target", "c_compute"), ("target", "fixed")] + [(m, p) for m in methods for p in ("c_fixed", "c_spec")]


def _with(cm: CostModel, methods: list[str], theta: dict[tuple[str, str], float], kv: bool) -> CostModel:
    """``cm`` with the refitted coefficients ``theta`` (KV coefficients kept when ``kv``, else 0)."""
    t = cm.target
    target = TargetCost(c_kv=t.c_kv if kv else 0.0, c_compute=theta[("target", "c_compute")],
                        c_fixed=theta[("target", "fixed")])  # fmt: skip
    drafters = dict(cm.drafters)
    for m in methods:
        old = cm.drafters.get(m)
        c_kv = old.c_kv if (kv and old is not None and old.kind == "linear") else 0.0
        drafters[m] = DrafterCost(kind="linear", c_kv=c_kv, c_spec=theta[(m, "c_spec")], c_fixed=theta[(m, "c_fixed")])
    return replace(cm, target=target, drafters=drafters, overhead_per_step=0.0)


def refit(cm: CostModel, forced: pd.DataFrame, prompts: dict[tuple[str, str], np.ndarray], name: str) -> CostModel:
    """The cost model refitted to the forced cells' measured call latencies (module docstring)."""
    methods = sorted(set(forced["sd_method"]))
    params = _parameters(cm, methods)
    zero = {p: 0.0 for p in params}
    # The KV part is kept as fitted from the step timings: the latency it predicts is subtracted.
    kv_only = _with(replace(cm, target=replace(cm.target, c_compute=0.0, c_fixed=0.0)), methods, zero, kv=True)
    rows, targets = [], []
    for row in forced.itertuples(index=False):
        measured_sd = row.generate_s / row.num_calls
        measured = {"sd": measured_sd, "base": measured_sd * row.speedup}
        prompt = prompts[(row.model, row.dataset)]
        kv_sd, kv_base = predicted_latencies(kv_only, row, prompt)
        feats = {"sd": [], "base": []}
        for p in params:
            unit = _with(cm, methods, {**zero, p: 1.0}, kv=False)
            sd, base = predicted_latencies(unit, row, prompt)
            feats["sd"].append(sd)
            feats["base"].append(base)
        for arm, kv_part in (("sd", kv_sd), ("base", kv_base)):
            if math.isnan(measured[arm]):
                continue
            rows.append(np.array(feats[arm]) / measured[arm])  # relative errors: every cell weighs alike
            targets.append((measured[arm] - kv_part) / measured[arm])
    coef = nonnegative_lstsq(np.array(rows), np.array(targets))
    fitted = _with(cm, methods, dict(zip(params, map(float, coef))), kv=True)
    residual = np.array(rows) @ coef - np.array(targets)
    fit = {
        **dict(cm.fit),
        "refit": {
            "from": "forced-acceptance cells' call latencies (sdbench.simulator.forcedcheck)",
            "cells": int(len(forced)),
            "methods": methods,
            "relative_rms_error": float(np.sqrt(np.mean(residual**2))),
        },
    }
    return replace(fitted, name=name, fit=fit, description=f"{cm.name}, refitted at the forced-acceptance points")


# ----------------------------------------------------------------------------- check
def check_table(forced: pd.DataFrame, before: CostModel, after: CostModel,
                prompts: dict[tuple[str, str], np.ndarray]) -> pd.DataFrame:  # fmt: skip
    """Per forced cell: measured speedup and interval, the prediction of each model, its error
    and whether it lies inside the interval."""
    out = forced[list(CHECKED)].copy()
    for tag, cm in (("", before), ("_refit", after)):
        pred = predict(cm, forced, prompts)
        out[f"predicted{tag}"] = pred
        out[f"error{tag}"] = pred / out["speedup"] - 1
        out[f"inside{tag}"] = (pred >= out["speedup_ci_low"]) & (pred <= out["speedup_ci_high"])
    return conform(out, COLUMNS, "simulator at the forced points")


def check_markdown(table: pd.DataFrame, before: CostModel, after: CostModel, labels: dict[str, str]) -> str:
    """The check per point, and per method x batch size how many points lie inside."""
    lines = [
        "# The simulator at the forced-acceptance points",
        "",
        f"Prediction of the simulator's pricing with the cost model fitted from the step timings (`{before.name}`)",
        f"and refitted at these points (`{after.name}`, in-sample; relative RMS error of the call latencies "
        f"{after.fit.get('refit', {}).get('relative_rms_error', float('nan')):.3f}), beside the measured speedup",
        "and its 95% interval. ✓: inside the interval.",
        "",
        "| model | method | bs | τ forced | τ measured | measured [95% CI] | predicted | error | | refitted | error | |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table.itertuples(index=False):
        lines.append(
            f"| {r.model} ({r.engine}) | {labels.get(r.base_method, r.base_method)} | {r.batch_size} | {r.forced_acceptance_length:g} "
            f"| {r.mean_acceptance_length:.2f} | {r.speedup:.2f} [{r.speedup_ci_low:.2f}, {r.speedup_ci_high:.2f}] "
            f"| {_num(r.predicted, '.2f')} | {_num(r.error, '+.0%')} | {'✓' if r.inside else ''} "
            f"| {_num(r.predicted_refit, '.2f')} | {_num(r.error_refit, '+.0%')} | {'✓' if r.inside_refit else ''} |"
        )
    lines += ["", "| model | method | bs | inside (step-timing fit) | inside (refitted) | median error before | after |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for (engine, model, base, b), sub in table.groupby(["engine", "model", "base_method", "batch_size"], sort=True):
        priced = sub["predicted"].notna()
        before_inside = f"{int(sub['inside'].sum())} of {len(sub)}" if priced.any() else "not priced"
        lines.append(
            f"| {model} ({engine}) | {labels.get(base, base)} | {b} | {before_inside} "
            f"| {int(sub['inside_refit'].sum())} of {len(sub)} | {_num(sub['error'].median(), '+.0%')} "
            f"| {_num(sub['error_refit'].median(), '+.0%')} |"
        )
    priced = table["predicted"].notna()
    lines += ["", f"All points: {int(table['inside'].sum())} of {int(priced.sum())} priced inside before the refit, "
                  f"{int(table['inside_refit'].sum())} of {len(table)} after (in-sample)."]  # fmt: skip
    unpriced = sorted(set(table.loc[~priced, "sd_method"]))
    if unpriced:
        lines += ["", f"Not priced before the refit: {', '.join(unpriced)} (the step-timing fit `{before.name}` has "
                      "no cost for that drafter; add it to `breakdown:` to time it). The refit fits it from "
                      "these points alone."]  # fmt: skip
    return "\n".join(lines) + "\n"


def _num(x: float, fmt: str) -> str:
    """``x`` formatted, or an em dash where it is NaN (a point the model does not price)."""
    return "—" if math.isnan(x) else format(x, fmt)


def plot_check(table: pd.DataFrame, out_png: str, dpi: int = 110) -> pd.DataFrame:
    """Predicted against measured speedup (95% interval), before and after the refit. Returns the
    drawn table (series the predicted column, x the measured speedup with its interval x_lo/x_hi)."""
    from sdbench.plotting import drawn_table, save_png, subplots

    fig, ax = subplots(figsize=(5.0, 4.6))
    err = [(table["speedup"] - table["speedup_ci_low"]).clip(lower=0),
           (table["speedup_ci_high"] - table["speedup"]).clip(lower=0)]  # fmt: skip
    for col, color, label in (("predicted", "#c44e52", "step-timing fit"), ("predicted_refit", "#4c72b0",
                                                                             "refitted at the forced points")):  # fmt: skip
        drawn_table(fig).errorbar(ax, table["speedup"], table[col], xerr=err, ls="none", marker="o", color=color,
                                  capsize=2, label=label, alpha=0.8, series=col, mark="point")  # fmt: skip
    lo = float(min(table["speedup_ci_low"].min(), table["predicted"].min(), table["predicted_refit"].min())) * 0.95
    hi = float(max(table["speedup_ci_high"].max(), table["predicted"].max(), table["predicted_refit"].max())) * 1.05
    drawn_table(fig).plot(ax, [lo, hi], [lo, hi], color="grey", lw=0.8, ls=":", mark="reference", series="y = x")
    ax.set_xlabel("measured speedup (95% interval)")
    ax.set_ylabel("simulated speedup")
    ax.set_title("Simulator at the forced-acceptance points", fontsize=10)
    ax.legend(fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_png(fig, out_png, dpi=dpi)


def prompt_lengths(paths: list[str], num_requests: int | None) -> dict[tuple[str, str], np.ndarray]:
    """(model, dataset) -> prompt lengths of the requests a forced cell times (the table's first
    ``num_requests`` rows, as the runner takes them), from ``results/prompts/<model>/<dataset>.parquet``."""
    from pathlib import Path

    from sdbench.io import read_parquet

    out = {}
    for path in paths:
        p = Path(path)
        table = read_parquet(p, what="prompt table")
        ids = table["prompt_token_ids"].head(num_requests) if num_requests else table["prompt_token_ids"]
        out[(p.parent.name, p.stem)] = np.array([len(x) for x in ids])
    return out


def _cmd_check(args: argparse.Namespace) -> int:
    import json

    from sdbench.io import read_parquet

    forced = read_parquet(args.forced, what="forced-acceptance table")
    prompts = prompt_lengths(args.prompts, args.num_requests)
    before = load_cost_model(args.cost_model)
    after = refit(before, forced, prompts, args.name)
    table = check_table(forced, before, after, prompts)
    labels = json.loads(args.labels) if args.labels else {}
    save_cost_model(after, args.refitted)
    write_parquet(table, args.output)
    write_text(check_markdown(table, before, after, labels), args.markdown)
    plot_check(table, args.figure)
    return 0
