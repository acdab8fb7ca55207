"""Prompt-output overlap as BLEU-n, bucketed (paper Sec. 7, Fig. 8).

For each request, BLEU-n between the prompt and the output generated without speculative decoding:

* hypothesis = the no-SD output, reference = the prompt. BLEU's modified n-gram precision is then the
  share of the output's n-grams that also occur in the prompt, i.e. what an n-gram (prompt-lookup)
  proposer could have copied. The brevity penalty (standard BLEU, Papineni et al.) applies when the
  output is shorter than the prompt.
* On token ids (the published traces carry ids only): ids are joined as space-separated integers and
  scored with ``tokenize='none'``, so every id is one "word" and BLEU-n measures n-gram overlap of token
  ids -- exactly the units an n-gram proposer matches. On text (``prompt_text``/``output_text`` columns,
  or ids decoded with ``--tokenizer``): sacrebleu's default ``13a`` tokenizer.
* Smoothing: ``exp`` (Chen & Cherry 2014 method 3; sacrebleu's sentence-level default) with
  ``effective_order=True``. Without smoothing a single order with no match makes BLEU exactly 0; that
  would put a request with no shared 10-gram in the lowest bucket regardless of its lower-order
  overlap. ``exp`` only affects orders with zero matches, so long outputs are unaffected.

Buckets are [0,0.2), [0.2,0.4), [0.4,0.6), [0.6,0.8), [0.8,1.0] on BLEU in 0..1 (1.0 in the last).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sacrebleu.metrics import BLEU

from sdbench.io import write_parquet
from sdbench.plotting import drawn_table, pyplot, save_png
from sdbench.simulator.core import simulate
from sdbench.simulator.tracesets import load_traces, with_ngram_proposals

DEFAULT_ORDER = 4
MAX_ORDER = 10
SMOOTH_METHOD = "exp"
BUCKET_EDGES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
BUCKET_LABELS = ("[0.0,0.2)", "[0.2,0.4)", "[0.4,0.6)", "[0.6,0.8)", "[0.8,1.0]")
BUCKET_COLUMNS = ("request_id", "bleu_order", "bleu", "bucket")
BASES = ("auto", "text", "ids")
# sacrebleu sums logs: a perfect match can come out as 1.0000000000000013.
_ROUNDING_SLACK = 1e-9


@lru_cache(maxsize=None)
def _scorer(order: int, tokenize: str) -> BLEU:
    if not 1 <= order <= MAX_ORDER:
        raise ValueError(f"BLEU order must be in 1..{MAX_ORDER}, got {order}")
    return BLEU(max_ngram_order=order, tokenize=tokenize, smooth_method=SMOOTH_METHOD, effective_order=True)


def _clamp(score: float) -> float:
    if not -_ROUNDING_SLACK <= score <= 1 + _ROUNDING_SLACK:
        raise ValueError(f"BLEU {score!r} outside [0, 1]")
    return min(max(score, 0.0), 1.0)


def sentence_bleu(output: str, prompt: str, order: int = DEFAULT_ORDER, tokenize: str = "13a") -> float:
    """BLEU-``order`` in [0, 1] of ``output`` (hypothesis) against ``prompt`` (reference)."""
    return _clamp(_scorer(order, tokenize).sentence_score(output, [prompt]).score / 100.0)


def ids_to_words(ids: Sequence[int]) -> str:
    """Token ids as one space-separated string: each id becomes one BLEU "word"."""
    return " ".join(str(int(i)) for i in ids)


def bleu_ids(prompt_ids: Sequence[int], output_ids: Sequence[int], order: int = DEFAULT_ORDER) -> float:
    """BLEU-``order`` of the output against the prompt, on token ids."""
    return sentence_bleu(ids_to_words(output_ids), ids_to_words(prompt_ids), order, tokenize="none")


def bleu_text(prompt_text: str, output_text: str, order: int = DEFAULT_ORDER) -> float:
    """BLEU-``order`` of the output against the prompt, on text (sacrebleu ``13a`` tokenization)."""
    return sentence_bleu(output_text, prompt_text, order, tokenize="13a")


def bucket_of(score: float) -> str:
    """Bucket label of a BLEU score in [0, 1]; left-closed, the last bucket also holds 1.0."""
    if score is None or not isinstance(score, (int, float)) or math.isnan(score) or not 0.0 <= score <= 1.0:
        raise ValueError(f"BLEU score {score!r} is not in [0, 1]")
    # searchsorted on the inner edges: a score equal to an edge goes to the bucket it opens.
    return BUCKET_LABELS[int(np.searchsorted(BUCKET_EDGES[1:-1], score, side="right"))]


# --------------------------------------------------------------------------------------------------
# Inputs


def read_requests(path: str | os.PathLike[str], prompts: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """Read requests from a published-trace JSONL or a run-cell requests parquet, in file order.

    Returns ``request_id``, ``prompt_token_ids``, ``output_token_ids`` and, when the parquet has them,
    ``prompt_text`` / ``output_text``. A run cell's table holds no prompt ids: they come from its
    prompt table ``prompts`` by ``request_id`` (sdbench.requesttable), the text stays the table's own.
    """
    path = Path(path)
    if path.suffix in (".jsonl", ".json"):
        from sdbench.traces.published import read_published_jsonl

        df = pd.DataFrame(
            [(r.request_id, r.prompt_token_ids, r.generated_token_ids) for r in read_published_jsonl(path)],
            columns=["request_id", "prompt_token_ids", "output_token_ids"],
        )
    elif path.suffix == ".parquet":
        from sdbench.requesttable import PROMPTS_HINT, read_with_prompts

        df = read_with_prompts(path, prompts)
        missing = [c for c in ("request_id", "prompt_token_ids", "output_token_ids") if c not in df.columns]
        if missing:
            hint = f"; {PROMPTS_HINT}" if missing == ["prompt_token_ids"] else ""
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)} (have: {', '.join(df.columns)}{hint})")
        keep = [
            c
            for c in ("request_id", "prompt_token_ids", "output_token_ids", "prompt_text", "output_text")
            if c in df.columns
        ]
        df = df[keep].copy()
        df["request_id"] = df["request_id"].astype(str)
    else:
        raise ValueError(f"{path}: expected a .jsonl published trace or a .parquet requests table")
    if df.empty:
        raise ValueError(f"{path}: no requests (expected one row per request)")
    dup = df["request_id"][df["request_id"].duplicated()]
    if len(dup):
        raise ValueError(f"{path}: duplicate request_id(s) {', '.join(map(str, dup.unique()[:5]))}")
    return df.reset_index(drop=True)


def _decode_with(tokenizer_path: str | os.PathLike[str], df: pd.DataFrame) -> pd.DataFrame:
    """Fill ``prompt_text`` / ``output_text`` by decoding ids with a ``tokenizer.json``."""
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # optional dependency (the `engine` extra)
        raise ValueError("--tokenizer needs the `tokenizers` package (pip install sdbench[engine])") from exc
    path = Path(tokenizer_path)
    tok = Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))
    df = df.copy()
    df["prompt_text"] = [tok.decode(list(map(int, ids)), skip_special_tokens=False) for ids in df["prompt_token_ids"]]
    df["output_text"] = [tok.decode(list(map(int, ids)), skip_special_tokens=False) for ids in df["output_token_ids"]]
    return df


def _has_text(df: pd.DataFrame) -> bool:
    return all(c in df.columns and df[c].notna().all() for c in ("prompt_text", "output_text"))


def compute_buckets(requests: pd.DataFrame, order: int = DEFAULT_ORDER, basis: str = "auto") -> pd.DataFrame:
    """Per-request BLEU-``order`` and bucket, in input order.

    ``basis``: ``text`` (needs text columns), ``ids``, or ``auto`` (text when every row has both texts,
    otherwise ids for all rows -- never a mix, so buckets stay comparable within a file). The basis and
    smoothing are recorded in ``DataFrame.attrs`` (stored in the parquet's pandas metadata).
    """
    if basis not in BASES:
        raise ValueError(f"basis must be one of {', '.join(BASES)}, got {basis!r}")
    _scorer(order, "none")  # validate order early
    use_text = basis == "text" or (basis == "auto" and _has_text(requests))
    if use_text and not _has_text(requests):
        raise ValueError("basis 'text' needs non-null prompt_text and output_text for every request")
    if use_text:
        scores = [bleu_text(p, o, order) for p, o in zip(requests["prompt_text"], requests["output_text"])]
    else:
        scores = [bleu_ids(p, o, order) for p, o in zip(requests["prompt_token_ids"], requests["output_token_ids"])]
    out = pd.DataFrame(
        {
            "request_id": requests["request_id"].astype(str).to_numpy(),
            "bleu_order": np.full(len(scores), order, dtype="int64"),
            "bleu": np.asarray(scores, dtype="float64"),
            "bucket": [bucket_of(s) for s in scores],
        }
    )
    out.attrs = {
        "bleu_basis": "text_13a" if use_text else "token_ids",
        "hypothesis": "output",
        "reference": "prompt",
        "smooth_method": SMOOTH_METHOD,
    }
    return out


def bucket_counts(buckets: pd.DataFrame) -> dict[str, int]:
    """Requests per bucket label, every bucket present (zero if empty), in bucket order."""
    counts = buckets["bucket"].value_counts()
    return {label: int(counts.get(label, 0)) for label in BUCKET_LABELS}


# --------------------------------------------------------------------------------------------------
# Fig. 8 heatmap


def plot_heatmap(
    speedups: pd.DataFrame,
    buckets: pd.DataFrame,
    out_png: str | os.PathLike[str],
    title: str | None = None,
    versus_label: str = "EAGLE",
) -> pd.DataFrame:
    """Fig. 8-style heatmap of n-gram's speedup relative to EAGLE, by BLEU bucket and batch size.

    ``speedups`` has ``bucket``, ``batch_size`` and ``relative_speedup`` (n-gram speedup / EAGLE
    speedup); cells show ``(relative_speedup - 1)`` in percent, blue where n-gram wins, red where it
    loses. ``buckets`` (the ``bleu buckets`` product) supplies n per bucket and the BLEU order.
    Returns the drawn table: a ``cell`` per drawn (batch size: series, bucket: x), y the percent
    shown.
    """
    plt = pyplot()
    import matplotlib
    from matplotlib.colors import TwoSlopeNorm

    for name, df, cols in (
        ("speedups", speedups, ("bucket", "batch_size", "relative_speedup")),
        ("buckets", buckets, BUCKET_COLUMNS),
    ):
        missing = [c for c in cols if c not in df.columns]
        if missing:
            raise ValueError(f"{name} table lacks column(s) {', '.join(missing)}")
    unknown = sorted(set(speedups["bucket"]) - set(BUCKET_LABELS))
    if unknown:
        raise ValueError(f"speedups: unknown bucket label(s) {unknown} (expected {list(BUCKET_LABELS)})")
    if speedups.duplicated(["bucket", "batch_size"]).any():
        raise ValueError("speedups: more than one row for a (bucket, batch_size)")
    orders = sorted(set(int(o) for o in buckets["bleu_order"]))
    if len(orders) != 1:
        raise ValueError(f"buckets: expected one bleu_order, found {orders}")

    batch_sizes = sorted(int(b) for b in speedups["batch_size"].unique())
    grid = (
        speedups.assign(
            pct=(speedups["relative_speedup"].astype(float) - 1.0) * 100.0,
            batch_size=speedups["batch_size"].astype(int),
        )
        .pivot(index="batch_size", columns="bucket", values="pct")
        .reindex(index=batch_sizes, columns=list(BUCKET_LABELS))
    )
    values = grid.to_numpy(dtype=float)
    counts = bucket_counts(buckets)
    span = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 1.0
    span = max(span, 1.0)

    fig, ax = plt.subplots(figsize=(6.4, 0.45 * len(batch_sizes) + 1.8))
    cmap = matplotlib.colormaps["RdBu"].with_extremes(bad="#dddddd")
    drawn = drawn_table(fig)
    im = drawn.imshow(ax, np.ma.masked_invalid(values), rows=batch_sizes, cols=list(BUCKET_LABELS),
                      series_name="batch size", cmap=cmap, norm=TwoSlopeNorm(0.0, -span, span), aspect="auto")
    for (i, j), v in np.ndenumerate(values):
        if np.isfinite(v):
            ax.text(
                j,
                i,
                f"{v:+.0f}",
                ha="center",
                va="center",
                fontsize=8,
                color="white" if abs(v) > 0.6 * span else "black",
            )
    ax.set_xticks(range(len(BUCKET_LABELS)))
    ax.set_xticklabels([f"{b}\nn={counts[b]}" for b in BUCKET_LABELS], fontsize=8)
    ax.set_yticks(range(len(batch_sizes)))
    ax.set_yticklabels([str(b) for b in batch_sizes], fontsize=8)
    ax.set_xlabel(f"BLEU-{orders[0]} (prompt vs. no-SD output)")
    ax.set_ylabel("Batch size")
    if title:
        ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, label=f"n-gram speedup relative to {versus_label} (%)")
    fig.tight_layout()
    return save_png(fig, out_png, dpi=150)


# --------------------------------------------------------------------------------------------------
# CLI


def _cmd_buckets(args: argparse.Namespace) -> int:
    # Errors (ValueError naming the file) become one `error:` line in sdbench.cli.main.
    requests = read_requests(args.input, args.prompts)
    if args.tokenizer:
        requests = _decode_with(args.tokenizer, requests)
    out = compute_buckets(requests, order=args.order, basis=args.basis)
    write_parquet(out, args.output)
    print(
        json.dumps(
            {
                "output": str(args.output),
                "bleu_order": args.order,
                "basis": out.attrs["bleu_basis"],
                "counts": bucket_counts(out),
            }
        )
    )
    return 0


def _cmd_heatmap(args: argparse.Namespace) -> int:
    from sdbench.io import read_parquet

    speedups = read_parquet(args.speedups, what="speedups table")
    plot_heatmap(speedups, read_parquet(args.buckets, what="buckets table"), args.output, title=args.title)
    return 0


# Columns that identify one timed call within a cell's process: the paired no-SD arm timed the
# same call next to it (sdbench.engine.measure.paired), in the same engine start and trial.
_CELL_KEYS = ["engine", "model", "dataset", "batch_size"]
_PAIR_KEYS = ["engine_start", "trial", "call_index", "request_id"]


def _paired_arm(sd: pd.DataFrame, base: pd.DataFrame, method: str) -> pd.DataFrame:
    """The no-SD calls paired with ``sd`` (one method's SD calls), aligned to ``sd``'s rows.

    Raises ``ValueError`` unless every SD call has exactly one no-SD call of the same engine
    start, trial and call and the no-SD arm timed no other call.
    """
    keys = _CELL_KEYS + [k for k in _PAIR_KEYS if k in sd or k in base]
    missing = sorted({k for k in keys if k not in sd} | {k for k in keys if k not in base})
    if missing:
        raise ValueError(f"paired no-SD calls of {method}: column(s) {', '.join(missing)} missing in one arm")
    if sd.duplicated(keys).any() or base.duplicated(keys).any():
        raise ValueError(f"paired no-SD calls of {method}: more than one call per {', '.join(keys)}")
    aligned = sd[keys].merge(base[keys + ["tokens_per_s"]], on=keys, how="left", validate="one_to_one")
    if aligned["tokens_per_s"].isna().any() or len(base) != len(sd):
        first = aligned.loc[aligned["tokens_per_s"].isna(), keys].head(1).to_dict("records")
        raise ValueError(
            f"paired no-SD calls of {method}: the two arms did not time the same calls "
            f"({len(sd)} SD, {len(base)} no-SD calls; first unmatched: {first or 'none'})"
        )
    return aligned


def measured_bucket_speedups(
    calls: pd.DataFrame,
    buckets: pd.DataFrame,
    baseline: str,
    ngram: str,
    versus: str,
    baseline_calls: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Fig. 8 from engine runs: n-gram's speedup relative to ``versus`` per BLEU bucket x batch size.

    Uses replicate-mode calls (one prompt per call). Per bucket and batch size, a method's
    speedup is its throughput over the bucket's prompts divided by the no-SD throughput over
    the same prompts, both as :func:`sdbench.analysis.stats.point_estimate` (mean over prompts
    of each prompt's median over trials) -- so a bucket holding every prompt gives the cell's
    own speedup. ``relative_speedup`` = n-gram speedup / ``versus`` speedup.

    ``baseline_calls`` are the paired no-SD arms (``run.paired_baseline``,
    sdbench.engine.measure.paired): the calls of each SD cell's ``baseline_calls.parquet`` with a
    ``paired_with`` column naming the SD method whose process timed them. Where both methods'
    cells were paired (``design`` = ``paired``), each speedup divides by the no-SD calls timed
    in its own process, call by call and trial by trial, so the process's speed cancels. Where
    either was not (``design`` = ``independent``), both divide by the separately measured no-SD
    cell (``baseline``): the relative speedup is then a ratio of two processes' throughputs.

    Columns: ``bucket, batch_size, relative_speedup, n, ngram_speedup, versus_speedup, design``.
    """
    from sdbench.analysis.stats import point_estimate

    calls = calls[calls["request_id"] != "*"]
    scopes = calls[["engine", "model", "dataset"]].drop_duplicates()
    if len(scopes) > 1:
        raise ValueError(f"measured BLEU speedups: one engine x model x dataset at a time, got {len(scopes)}")
    if calls.empty:
        raise ValueError("measured BLEU speedups need replicate-mode calls (one prompt per call)")
    if baseline_calls is None:
        baseline_calls = pd.DataFrame(columns=[*calls.columns, "paired_with"])
    elif len(baseline_calls) and "paired_with" not in baseline_calls:
        raise ValueError("paired no-SD calls need a paired_with column (the SD method whose process timed them)")
    bucket_of_id = dict(zip(buckets["request_id"].astype(str), buckets["bucket"]))
    rows = []
    for batch_size, cell_calls in calls.groupby("batch_size", sort=True):
        arms: dict[str, tuple[pd.DataFrame, pd.DataFrame]] = {}
        paired = True
        for method in (ngram, versus):
            sd = cell_calls[cell_calls["method"] == method]
            base = baseline_calls[
                (baseline_calls["paired_with"] == method) & (baseline_calls["batch_size"] == batch_size)
            ]
            if sd.empty:
                break
            if base.empty:
                paired = False
            else:
                base = sd.assign(tokens_per_s=_paired_arm(sd, base, method)["tokens_per_s"].to_numpy())
            arms[method] = (sd, base)
        if len(arms) < 2:
            continue  # a batch size without both methods has no relative speedup
        if not paired:
            independent = cell_calls[cell_calls["method"] == baseline]
            if independent.empty:
                continue
            arms = {m: (sd, independent) for m, (sd, _) in arms.items()}
        speedups: dict[str, dict[str, float]] = {}
        for method, (sd, base) in arms.items():
            sd_b = sd.assign(bucket=sd["request_id"].astype(str).map(bucket_of_id)).dropna(subset=["bucket"])
            base_b = base.assign(bucket=base["request_id"].astype(str).map(bucket_of_id)).dropna(subset=["bucket"])
            speedups[method] = {
                label: point_estimate(group) / point_estimate(base_b[base_b["bucket"] == label])
                for label, group in sd_b.groupby("bucket")
                if (base_b["bucket"] == label).any()
            }
        counts = (
            arms[ngram][0].drop_duplicates("request_id")["request_id"].astype(str).map(bucket_of_id).value_counts()
        )
        for label in BUCKET_LABELS:
            if label in speedups[ngram] and label in speedups[versus]:
                ng, vs = speedups[ngram][label], speedups[versus][label]
                rows.append(
                    {
                        "bucket": label,
                        "batch_size": int(batch_size),
                        "relative_speedup": ng / vs,
                        "n": int(counts.get(label, 0)),
                        "ngram_speedup": ng,
                        "versus_speedup": vs,
                        "design": "paired" if paired else "independent",
                    }
                )
    columns = ["bucket", "batch_size", "relative_speedup", "n", "ngram_speedup", "versus_speedup", "design"]
    return pd.DataFrame(rows, columns=columns).sort_values(["bucket", "batch_size"]).reset_index(drop=True)


def simulated_bucket_speedups(
    traces: Any,
    buckets: pd.DataFrame,
    batch_sizes: Sequence[int],
    cost_model: Any,
    ngram_policy: str = "fixed-3",
    versus_policy: str = "fixed-3",
    mode: str = "exact",
) -> pd.DataFrame:
    """Fig. 8 from acceptance traces: per BLEU bucket x batch size, the simulated n-gram speedup
    divided by the simulated learned-drafter (EAGLE) speedup.

    ``traces`` is a :class:`sdbench.simulator.tracesets.TraceSet`; every request in the bucket is simulated
    (no sampling), with replicated batches as in the paper's simulator. Buckets with no request
    are left out. Columns: ``bucket, batch_size, n, ngram_policy, versus_policy, mode, cost_model,
    ngram_speedup, versus_speedup, relative_speedup``.
    """
    bucket_by_id = dict(zip(buckets["request_id"].astype(str), buckets["bucket"]))
    missing = [r.request_id for r in traces.requests if r.request_id not in bucket_by_id]
    if missing:
        raise ValueError(
            f"{len(missing)} request(s) of {traces.source} have no BLEU bucket (first: {missing[0]!r}); "
            "were the buckets computed from the same traces?"
        )
    if mode == "exact":  # trace n-gram proposal lengths once, not per bucket
        traces = with_ngram_proposals(traces)
    rows = []
    for label in BUCKET_LABELS:
        subset = replace(traces, requests=tuple(r for r in traces.requests if bucket_by_id[r.request_id] == label))
        if not subset.requests:
            continue
        runs = {
            proposer: simulate(
                [subset], proposer, [policy], batch_sizes, cost_model, mode, num_requests=0
            ).set_index("batch_size")
            for proposer, policy in (("ngram", ngram_policy), ("eagle", versus_policy))
        }
        for b in sorted(int(x) for x in batch_sizes):
            ng, vs = runs["ngram"].loc[b], runs["eagle"].loc[b]
            rows.append(
                {
                    "bucket": label,
                    "batch_size": b,
                    "n": int(ng["num_requests"]),
                    "ngram_policy": ngram_policy,
                    "versus_policy": versus_policy,
                    "mode": mode,
                    "cost_model": cost_model.name,
                    "ngram_speedup": float(ng["speedup"]),
                    "versus_speedup": float(vs["speedup"]),
                    "relative_speedup": float(ng["speedup"]) / float(vs["speedup"]),
                }
            )
    return pd.DataFrame(rows)


def _cmd_simulated(args: argparse.Namespace) -> int:
    from sdbench.io import read_parquet
    from sdbench.simulator.costmodel import load_cost_model

    traces = load_traces(args.traces)
    buckets = read_parquet(args.buckets, what="buckets table")
    table = simulated_bucket_speedups(
        traces,
        buckets,
        args.batch_sizes,
        load_cost_model(args.cost_model),
        args.ngram_policy,
        args.versus_policy,
        args.mode,
    )
    write_parquet(table, args.output)
    plot_heatmap(
        table,
        buckets,
        args.figure,
        title=f"{traces.dataset}: n-gram {args.ngram_policy} vs EAGLE {args.versus_policy} (simulated, {args.mode})",
    )
    print(json.dumps({"output": str(args.output), "counts": bucket_counts(buckets)}))
    return 0


def read_paired_calls(calls_paths: Sequence[str], baseline_paths: Sequence[str]) -> pd.DataFrame:
    """The cells' paired no-SD arms (``baseline_calls.parquet``, the i-th beside the i-th
    ``calls.parquet`` in its cell's directory) with ``paired_with``, the method of the cell
    that timed them.

    An unpaired cell's ``baseline_calls.parquet`` has no rows and adds none.
    """
    from sdbench.io import read_parquet

    if len(baseline_paths) != len(calls_paths):
        raise ValueError(
            f"--baseline-calls: {len(baseline_paths)} file(s) for {len(calls_paths)} --calls file(s); "
            "give each cell's baseline_calls.parquet in the order of --calls"
        )
    frames = []
    for calls_path, base_path in zip(calls_paths, baseline_paths):
        if Path(base_path).resolve().parent != Path(calls_path).resolve().parent:
            raise ValueError(f"{base_path}: not the paired no-SD arm of {calls_path} (not in its cell's directory)")
        base = read_parquet(base_path, what="baseline calls table")
        if base.empty:
            continue
        cell = read_parquet(calls_path, what="calls table")
        keys = ["engine", "model", "dataset", "batch_size"]
        if cell.empty or not cell[keys].drop_duplicates().reset_index(drop=True).equals(
            base[keys].drop_duplicates().reset_index(drop=True)
        ):
            raise ValueError(f"{base_path}: not the paired no-SD arm of {calls_path} (different cell keys)")
        frames.append(base.assign(paired_with=cell["method"].iloc[0]))
    return pd.concat(frames, ignore_index=True) if frames else None


def measured_title(table: pd.DataFrame, ngram: str, versus: str) -> str:
    """Title of the measured Fig. 8: the design its speedups were divided by, and why if not paired."""
    if len(table) and (table["design"] == "paired").all():
        return f"{ngram} vs {versus} (measured; each over the no-SD calls paired in its process)"
    return (
        f"{ngram} vs {versus} (measured; NOT paired: no paired no-SD arm,\n"
        "so each speedup divides throughputs of separate processes)"
    )


def _cmd_measured(args: argparse.Namespace) -> int:
    from sdbench.io import read_parquet, write_parquet

    calls = pd.concat([read_parquet(p, what="calls table") for p in args.calls], ignore_index=True)
    buckets = read_parquet(args.buckets, what="buckets table")
    paired = read_paired_calls(args.calls, args.baseline_calls) if args.baseline_calls else None
    table = measured_bucket_speedups(calls, buckets, args.baseline, args.ngram, args.versus, paired)
    write_parquet(table, args.output)
    title = measured_title(table, args.ngram, args.versus)
    plot_heatmap(table, buckets, args.figure, title=title, versus_label=args.versus)
    return 0
