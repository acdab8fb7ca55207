"""Acceptance per prompt category: SPEED-Bench's per-category acceptance length, from run cells.

Every sequence of a cell's ``requests.parquet`` carries the engine's per-request SD counters
(``sd_num_steps``, ``sd_num_draft_tokens``, ``sd_num_accepted_tokens``; vLLM >= 0.32, see
``sdbench.engine.measure.counters.request_sd_metrics``); the prompt table gives each ``request_id`` its
``category`` (a SPEED-Bench category or entropy tier, :mod:`sdbench.datasets.speedbench`). Per
engine x model x dataset x method x batch size x category the table gives:

* ``mean_acceptance_length`` = 1 + accepted / steps, both summed over the category's sequences
  (what the cell's own ``mean_acceptance_length`` is over all of them; the bonus token counts);
* ``acceptance_rate`` = accepted / draft tokens;
* ``request_mean_acceptance_length``: the mean over the category's requests of each request's
  1 + accepted / steps (its sequences pooled: in replicate mode a prompt runs batch-size
  times), with a 95% percentile bootstrap interval over requests (seeded per row from
  ``seed`` and the row's keys, so adding a cell does not move another row's interval).
  Requests with no SD step (e.g. one output token) have no acceptance length and are left out
  of this mean; ``n_requests`` counts the requests that have one.

Sequences without counters (no-SD cells, engines before vLLM 0.32) are left out; if none has
any, there is nothing to report and the command fails saying so. Engines before 0.32 still
count per prompt in the paper's replicate mode: each timed call is one prompt replicated
batch-size times, and ``calls.parquet`` holds the engine's counter deltas around it
(:func:`requests_from_calls` turns a cell's first trial into the same per-request rows, its
batch-size sequences pooled as one request's).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from sdbench.analysis.stats import NUM_RESAMPLES, interval
from sdbench.columns import conform
from sdbench.io import read_parquet, write_parquet, write_text
from sdbench.plotting import save_png

KEYS = ["engine", "model", "dataset", "method", "batch_size"]
GROUP = [*KEYS, "category"]
COUNTERS = ["sd_num_steps", "sd_num_draft_tokens", "sd_num_accepted_tokens"]
PROMPT_COLUMNS = ["dataset", "request_id", "category"]
MEAN = "request_mean_acceptance_length"  # with its 95% interval, f"{MEAN}_ci_low" / f"{MEAN}_ci_high"
COLUMNS = [
    *GROUP, "n_requests", "n_sequences", "num_steps", "num_draft_tokens", "num_accepted_tokens",
    "mean_acceptance_length", "acceptance_rate", MEAN, f"{MEAN}_ci_low", f"{MEAN}_ci_high",
]  # fmt: skip


def read_requests_tables(paths: Sequence[str | Path]) -> pd.DataFrame:
    """The cell keys, ``request_id`` and SD counters of every requests table; errors name the file."""
    frames = []
    for path in paths:
        df = read_parquet(path, columns=[*KEYS, "request_id", *COUNTERS], what="requests table")
        if df.empty:
            raise ValueError(f"{path}: no requests (expected one row per request)")
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


CALL_COUNTERS = {"num_drafts": "sd_num_steps", "num_draft_tokens": "sd_num_draft_tokens",
                 "num_accepted_tokens": "sd_num_accepted_tokens"}  # fmt: skip


def requests_from_calls(paths: Sequence[str | Path]) -> pd.DataFrame:
    """Per-request SD counters from replicate-mode ``calls.parquet`` tables (any vLLM version).

    A call whose ``request_id`` is one prompt (replicate mode) counts that prompt's drafts;
    the first trial is taken (greedy trials repeat it). A distinct-mode call (``*``: many
    prompts) cannot be split, and is an error naming the file.
    """
    frames = []
    for path in paths:
        df = read_parquet(path, columns=[*KEYS, "trial", "request_id", *CALL_COUNTERS], what="calls table")
        if "engine_start" in df:
            df = df[df["engine_start"] == df["engine_start"].min()]
        df = df[df["trial"] == df["trial"].min()]
        if df.empty or (df["request_id"] == "*").any():
            raise ValueError(f"{path}: calls of several prompts each (distinct mode) cannot be split per request")
        frames.append(df.drop(columns="trial").rename(columns=CALL_COUNTERS))
    return pd.concat(frames, ignore_index=True)


def read_category_tables(paths: Sequence[str | Path]) -> pd.DataFrame:
    """``dataset, request_id, category`` of the prompt tables, one row per (dataset, request_id).

    The same dataset's tables (one per model) must agree on every request's category.
    """
    frames = [read_parquet(p, columns=PROMPT_COLUMNS, what="prompt table").assign(_file=str(p)) for p in paths]
    both = pd.concat(frames, ignore_index=True)
    both["request_id"] = both["request_id"].astype(str)
    unique = both.drop_duplicates(["dataset", "request_id", "category"])
    clash = unique[unique.duplicated(["dataset", "request_id"], keep=False)]
    if not clash.empty:
        first = clash.iloc[0]
        files = ", ".join(sorted(clash[clash["request_id"] == first["request_id"]]["_file"]))
        raise ValueError(
            f"{files}: the prompt tables give request {first['request_id']!r} of dataset {first['dataset']!r} "
            "different categories (expected one prompt set per dataset)"
        )
    return unique[PROMPT_COLUMNS].reset_index(drop=True)


def _row_seed(seed: int, keys: tuple) -> int:
    """Bootstrap seed of one table row: the base seed and the row's keys (stable across runs)."""
    plain = [k.item() if hasattr(k, "item") else k for k in keys]
    digest = hashlib.sha256(json.dumps([seed, *plain], default=str).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _bootstrap_mean(values: np.ndarray, seed: int, resamples: int) -> tuple[float, float]:
    """95% percentile interval of the mean of ``values`` (resampled with replacement)."""
    if values.size == 0:
        return math.nan, math.nan
    picks = np.random.default_rng(seed).integers(0, values.size, size=(resamples, values.size))
    return interval(values[picks].mean(axis=1))


def category_acceptance(
    requests: pd.DataFrame, prompts: pd.DataFrame, seed: int = 0, resamples: int = NUM_RESAMPLES
) -> pd.DataFrame:
    """One row per engine x model x dataset x method x batch size x category (columns :data:`COLUMNS`), sorted.

    ``requests``: cell keys, ``request_id`` and the ``sd_*`` counters of each sequence;
    ``prompts``: ``dataset, request_id, category``. Raises ValueError when no sequence has SD
    counters or a request has no category.
    """
    missing = sorted({*KEYS, "request_id", *COUNTERS} - set(requests)) or sorted(set(PROMPT_COLUMNS) - set(prompts))
    if missing:
        raise ValueError(f"category-acceptance: the input lacks columns {missing}")
    sd = requests[requests["sd_num_steps"].notna()].copy()
    if sd.empty:
        raise ValueError(
            "category-acceptance: no sequence has per-request SD counters (sd_num_steps; recorded by SD cells "
            "on vLLM >= 0.32)"
        )
    sd["request_id"] = sd["request_id"].astype(str)
    cats = prompts[PROMPT_COLUMNS].assign(request_id=prompts["request_id"].astype(str))
    joined = sd.merge(cats, on=["dataset", "request_id"], how="left", validate="many_to_one")
    orphans = joined[joined["category"].isna()]
    if not orphans.empty:
        ids = sorted(set(orphans["request_id"]))
        raise ValueError(
            f"category-acceptance: {len(ids)} request(s) of dataset {orphans['dataset'].iloc[0]!r} are in no "
            f"prompt table ({', '.join(ids[:3])}{', ...' if len(ids) > 3 else ''}; pass the prompt tables of the "
            "cells' datasets)"
        )
    for c in COUNTERS:
        joined[c] = joined[c].astype("int64")
    per_request = (
        joined.groupby([*GROUP, "request_id"], sort=True)
        .agg(n_sequences=("sd_num_steps", "size"), **{c: (c, "sum") for c in COUNTERS})
        .reset_index()
    )
    stepped = per_request["sd_num_steps"] > 0
    per_request["acceptance_length"] = np.where(
        stepped, 1 + per_request["sd_num_accepted_tokens"] / per_request["sd_num_steps"].where(stepped, 1), np.nan
    )
    rows = []
    for keys, g in per_request.groupby(GROUP, sort=True):
        steps, drafts, accepted = (int(g[c].sum()) for c in COUNTERS)
        values = g["acceptance_length"].dropna().to_numpy(dtype=float)
        low, high = _bootstrap_mean(values, _row_seed(seed, keys), resamples)
        rows.append(
            {
                **dict(zip(GROUP, keys)),
                "n_requests": int(values.size),
                "n_sequences": int(g["n_sequences"].sum()),
                "num_steps": steps,
                "num_draft_tokens": drafts,
                "num_accepted_tokens": accepted,
                "mean_acceptance_length": 1 + accepted / steps if steps else math.nan,
                "acceptance_rate": accepted / drafts if drafts else math.nan,
                "request_mean_acceptance_length": float(values.mean()) if values.size else math.nan,
                f"{MEAN}_ci_low": low,
                f"{MEAN}_ci_high": high,
            }
        )
    table = conform(pd.DataFrame(rows), COLUMNS, "category acceptance")
    return table.sort_values(GROUP, kind="stable").reset_index(drop=True)


def _num(x: float, fmt: str = ".2f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def category_acceptance_markdown(table: pd.DataFrame) -> str:
    """The table as Markdown, one block per engine / model / dataset / batch size."""
    out = []
    for keys, sub in table.groupby(["engine", "model", "dataset", "batch_size"], sort=True):
        out.append(f"### {keys[0]} / {keys[1]} / {keys[2]} / batch size {keys[3]}\n")
        out.append("| category | method | requests | acceptance length | per-request mean [95%] | acceptance rate |")
        out.append("|---|---|---|---|---|---|")
        for r in sub.sort_values(["category", "method"], kind="stable").itertuples(index=False):
            out.append(
                f"| {r.category or '(none)'} | {r.method} | {r.n_requests} | {_num(r.mean_acceptance_length)} "
                f"| {_num(r.request_mean_acceptance_length)} [{_num(r.request_mean_acceptance_length_ci_low)}, "
                f"{_num(r.request_mean_acceptance_length_ci_high)}] | {_num(r.acceptance_rate)} |"
            )
        out.append("")
    return "\n".join(out)


def plot_category_acceptance(table: pd.DataFrame, out_png: str | Path) -> pd.DataFrame:
    """Per-request mean acceptance length with its 95% interval: a group of bars per category,
    one bar per method, a panel per engine / model / dataset / batch size. Returns the drawn
    table (x the category as its tick reads)."""
    from sdbench.plotting import drawn_table, method_styles, panel_grid

    panels = list(table.groupby(["engine", "model", "dataset", "batch_size"], sort=True))
    methods = sorted(table["method"].unique())
    styles = method_styles(table)
    width_per_panel = max(4.5, 0.5 * table["category"].nunique() * max(len(methods), 1) + 1.5)
    fig, axes = panel_grid(len(panels), width_per_panel, 3.8, 110)
    drawn = drawn_table(fig)
    for ax, (keys, sub) in zip(axes.flat, panels):
        categories = sorted(sub["category"].unique())
        x = np.arange(len(categories))
        here = [m for m in methods if m in set(sub["method"])]
        width = 0.8 / max(len(here), 1)
        for i, method in enumerate(here):
            rows = sub[sub["method"] == method].set_index("category").reindex(categories)
            y = rows["request_mean_acceptance_length"].to_numpy(dtype=float)
            # Plain lists: matplotlib probes an array row of one category with a deprecated scalar cast.
            err = [
                np.clip(y - rows[f"{MEAN}_ci_low"].to_numpy(dtype=float), 0, None).tolist(),
                np.clip(rows[f"{MEAN}_ci_high"].to_numpy(dtype=float) - y, 0, None).tolist(),
            ]
            offset = (i - (len(here) - 1) / 2) * width
            drawn.bar(ax, x + offset, y, width=width, yerr=err, capsize=2, color=styles[method].color,
                      label=styles[method].label, series=method)  # fmt: skip
        drawn.axhline(ax, 1.0, color="grey", lw=0.8, ls="--", series="reference")
        ax.set_xticks(x, [c or "(none)" for c in categories], fontsize=7, rotation=30, ha="right")
        ax.set_ylabel("acceptance length, per-request mean")
        ax.set_title(f"{keys[1]} / {keys[2]} / bs {keys[3]}\n{keys[0]}", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return save_png(fig, out_png, dpi=110)


def _cmd_category_acceptance(args: argparse.Namespace) -> int:
    if not args.requests and not args.calls:
        raise ValueError("category-acceptance: give --requests and/or --calls tables")
    frames = ([read_requests_tables(args.requests)] if args.requests else []) + (
        [requests_from_calls(args.calls)] if args.calls else []
    )
    requests = pd.concat(frames, ignore_index=True)
    table = category_acceptance(requests, read_category_tables(args.prompts), args.seed)
    write_parquet(table, args.table)
    write_text(category_acceptance_markdown(table), args.markdown)
    plot_category_acceptance(table, args.figure)
    return 0
