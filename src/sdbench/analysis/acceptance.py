"""Acceptance analyses of trace tables (paper Sec. 6 and 8): Fig. 4, 5, 6/13, 10 and Tab. 4.

Inputs are trace tables (:mod:`sdbench.traces.table`) of any model, dataset and method; each file is
labelled with a dataset (``--labels`` or the file name). The paper's "generation length" is our
``acc_len`` (accepted drafts + 1 bonus token).

Statistic choices (checked against the paper, see the README):
- Tab. 4 and Fig. 6/13 are over per-request means of ``acc_len`` (the paper's Tab. 4 medians are
  not integers and its std for EAGLE is ~1, far below the per-position spread).
- Fig. 5: positions of each request are split into ten equal relative intervals; per-request
  interval means are averaged over requests, with a normal 95% CI over requests (requests, not
  correlated positions, are the independent units).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from sdbench.io import write_parquet, write_text
from sdbench.plotting import drawn_path, drawn_table, save_png, subplots
from sdbench.traces.published import dataset_name
from sdbench.traces.table import read_trace_table

# Output-length classes of Fig. 5 (left-closed): <4K, 4K-8K, 8K-13K, >=13K tokens.
LENGTH_BINS: tuple[int, ...] = (4096, 8192, 13312)
N_POSITION_BINS = 10
Z95 = 1.959963984540054  # two-sided 95% normal quantile
NGRAM, EAGLE = "ngram", "eagle"
MAX_ACC_LEN = 21  # 20 drafts + 1: colour-scale cap of the heatmaps


# ----------------------------------------------------------------------------- loading
def load_traces(paths: Sequence[str | os.PathLike[str]], labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Concatenate trace tables, adding a ``dataset`` column (``labels`` or the file names).

    Raises ``ValueError`` if labels do not match the files or if two files hold the same
    (dataset, method).
    """
    if labels is not None and len(labels) != len(paths):
        raise ValueError(f"got {len(labels)} labels for {len(paths)} trace files")
    frames, seen = [], {}
    for i, path in enumerate(paths):
        df = read_trace_table(path)
        label = labels[i] if labels is not None else dataset_name(path)
        for method in df["method"].unique():
            if (label, method) in seen:
                raise ValueError(
                    f"{path}: dataset {label!r} method {method!r} already read from {seen[label, method]}"
                )
            seen[label, method] = path
        frames.append(df.assign(dataset=pd.array([label] * len(df), dtype="string")))
    return pd.concat(frames, ignore_index=True)


def _ordered(values: pd.Series) -> list:
    """Distinct values in order of first appearance (the order files and methods were given)."""
    return list(dict.fromkeys(values))


# ----------------------------------------------------------------------------- per request
def request_means(traces: pd.DataFrame) -> pd.DataFrame:
    """One row per (dataset, method, request): ``n_positions`` and ``mean_acc_len``."""
    g = traces.groupby(["dataset", "method", "request_id"], sort=False)["acc_len"]
    return g.agg(n_positions="size", mean_acc_len="mean").reset_index()


def table4(traces: pd.DataFrame) -> pd.DataFrame:
    """Tab. 4: mean/median/std (ddof=1) of per-request mean ``acc_len`` per dataset x method."""
    g = request_means(traces).groupby(["dataset", "method"], sort=False)["mean_acc_len"]
    return g.agg(n_requests="size", mean="mean", median="median", std="std").reset_index()


def request_box_stats(traces: pd.DataFrame) -> pd.DataFrame:
    """Fig. 6/13: 5/25/50/75/95th percentiles of per-request mean ``acc_len``."""
    g = request_means(traces).groupby(["dataset", "method"], sort=False)["mean_acc_len"]
    q = {f"p{p}": g.quantile(p / 100) for p in (5, 25, 50, 75, 95)}
    return pd.DataFrame({"n_requests": g.size(), **q}).reset_index()


# ----------------------------------------------------------------------------- within requests
def length_class_labels(bins: Sequence[int] = LENGTH_BINS) -> list[str]:
    """Labels of the output-length classes cut at ``bins``, e.g. ``<4K``, ``4K-8K``, ``>=13K``."""
    fmt = [f"{b // 1024}K" if b % 1024 == 0 else str(b) for b in bins]
    return [f"<{fmt[0]}"] + [f"{a}-{b}" for a, b in zip(fmt, fmt[1:])] + [f">={fmt[-1]}"]


def position_deciles(
    traces: pd.DataFrame,
    bins: Sequence[int] = LENGTH_BINS,
    per_class: int | None = 50,
    seed: int = 0,
    n_intervals: int = N_POSITION_BINS,
) -> pd.DataFrame:
    """Fig. 5: mean ``acc_len`` per relative position interval, by output-length class.

    Requests (per dataset x method) fall in the class of their output length; up to
    ``per_class`` of them are sampled per class (seeded; None: all). Position ``j`` of a request
    of length ``L`` is in interval ``floor(n_intervals * j / L)``. Returns one row per (dataset,
    method, length_class, interval) with ``n_requests``, ``mean``, ``mean_ci_low``, ``mean_ci_high``.
    """
    keys = ["dataset", "method", "request_id"]
    groups = ["dataset", "method", "length_class", "interval"]
    reqs = request_means(traces)[[*keys, "n_positions"]]
    reqs["length_class"] = pd.cut(
        reqs["n_positions"], [0, *bins, np.inf], right=False, labels=length_class_labels(bins)
    )
    if per_class is not None:
        # A seeded random rank within each class picks the sample; table order is kept.
        rank = pd.Series(np.random.default_rng(seed).random(len(reqs)), index=reqs.index)
        rank = rank.groupby([reqs["dataset"], reqs["method"], reqs["length_class"]], observed=True).rank(
            method="first"
        )
        reqs = reqs[rank <= per_class]
    df = traces[[*keys, "position", "acc_len"]].merge(reqs, on=keys, how="inner", sort=False)
    df["interval"] = (n_intervals * df["position"].astype(np.int64) // df["n_positions"]).astype(np.int32)
    # Categoricals in order of first appearance make the sorted groupby keep the input order.
    for col in ("dataset", "method"):
        df[col] = pd.Categorical(df[col], categories=_ordered(traces[col]))
    per_request = df.groupby([*groups, "request_id"], observed=True)["acc_len"].mean()
    out = per_request.groupby(level=groups, observed=True).agg(n_requests="size", mean="mean", std="std")
    out = out.reset_index()
    half = Z95 * out["std"].fillna(0.0) / np.sqrt(out["n_requests"])
    out["mean_ci_low"], out["mean_ci_high"] = out["mean"] - half, out["mean"] + half
    for col in ("dataset", "method"):
        out[col] = out[col].astype("string")
    return out.drop(columns="std")


def heatmap_matrix(traces: pd.DataFrame, max_position: int | None = None) -> tuple[np.ndarray, list[str]]:
    """Fig. 4: ``acc_len`` as a (request x position) float matrix (NaN past a request's end).

    ``traces`` must hold one dataset x method. Rows are sorted by output length (shortest
    first; ties keep table order); columns are cut at ``max_position``.
    """
    return _request_matrix(traces, "acc_len", max_position)


def _request_matrix(df: pd.DataFrame, value: str, max_position: int | None) -> tuple[np.ndarray, list[str]]:
    lengths = df.groupby("request_id", sort=False).size().sort_values(kind="stable")
    width = int(lengths.max()) if len(lengths) else 0
    if max_position is not None:
        width = min(width, max_position)
    row = pd.Series(np.arange(len(lengths)), index=lengths.index)
    df = df[df["position"] < width]
    mat = np.full((len(lengths), width), np.nan)
    mat[row.loc[df["request_id"]].to_numpy(), df["position"].to_numpy()] = df[value].to_numpy(float)
    return mat, [str(r) for r in lengths.index]


# ----------------------------------------------------------------------------- method difference
def ngram_minus_eagle(traces: pd.DataFrame, ngram: str = NGRAM, eagle: str = EAGLE) -> pd.DataFrame:
    """Fig. 10: ``diff = acc_len(ngram) - acc_len(eagle)`` per (dataset, request, position).

    Aligned on position, kept only where both methods have a value (their outputs can differ in
    length); datasets lacking either method are skipped.
    """
    keys = ["dataset", "request_id", "position"]
    a = traces.loc[traces["method"] == ngram, [*keys, "acc_len"]]
    b = traces.loc[traces["method"] == eagle, [*keys, "acc_len"]]
    merged = a.merge(b, on=keys, suffixes=("_ngram", "_eagle"), how="inner", sort=False)
    merged["diff"] = (merged["acc_len_ngram"] - merged["acc_len_eagle"]).astype(np.int32)
    return merged[[*keys, "diff"]]


def difference_summary(diff: pd.DataFrame) -> pd.DataFrame:
    """Per dataset: positions compared, shares where n-gram / EAGLE / neither is longer, mean diff."""
    g = diff.assign(
        ngram_better=diff["diff"] > 0, eagle_better=diff["diff"] < 0, equal=diff["diff"] == 0
    ).groupby("dataset", sort=False)
    return g.agg(
        n_positions=("diff", "size"),
        share_ngram_better=("ngram_better", "mean"),
        share_eagle_better=("eagle_better", "mean"),
        share_equal=("equal", "mean"),
        mean_diff=("diff", "mean"),
    ).reset_index()


# ----------------------------------------------------------------------------- output
def markdown_table(df: pd.DataFrame, digits: int = 2) -> str:
    """Render ``df`` as a GitHub markdown table (floats rounded to ``digits``)."""

    def cell(v: object) -> str:
        return f"{v:.{digits}f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def plot_heatmaps(traces: pd.DataFrame, dataset: str, max_position: int | None = 512):
    """Fig. 4 for one dataset: one heatmap panel per method, wrapped into a grid.

    Returns the figure; its drawn table (:func:`sdbench.plotting.drawn_table`, written and returned
    by ``save_png``) has a ``cell`` per drawn (request, position): series the request id, x the
    position, y ``acc_len``, the panel's title naming the method. The same for Fig. 5, 6 and 10.
    """
    from sdbench.plotting import method_style, panel_axes, panel_grid

    sub = traces[traces["dataset"] == dataset]
    methods = _ordered(sub["method"])
    fig, axes = panel_grid(len(methods), 5.0, 3.8, 110)
    im = None
    for i, method in enumerate(methods):
        ax = panel_axes(axes, i)
        mat, requests = heatmap_matrix(sub[sub["method"] == method], max_position)
        im = drawn_table(fig).imshow(ax, mat, rows=requests, cols=range(mat.shape[1]), series_name="request",
                                     aspect="auto", interpolation="nearest", cmap="Blues", vmin=1,
                                     vmax=MAX_ACC_LEN)  # fmt: skip
        ax.set_title(f"{dataset}, {method_style(method).label}", fontsize=9, color=method_style(method).color)
        ax.set(xlabel="output position", ylabel="request (by output length)")
    fig.colorbar(im, ax=[a for a in axes.ravel() if a.get_visible()], label="generated tokens per step (acc_len)")
    return fig


def plot_position_deciles(deciles: pd.DataFrame, dataset: str):
    """Fig. 5 for one dataset: a panel per output-length class, a line (95% CI band) per method."""
    from sdbench.plotting import figure_legend, method_style, panel_axes, panel_grid

    sub = deciles[deciles["dataset"] == dataset]
    classes = [c for c in sub["length_class"].cat.categories if (sub["length_class"] == c).any()]
    methods = _ordered(sub["method"])
    styles = {m: method_style(m) for m in methods}
    fig, axes = panel_grid(len(classes), 4.4, 3.4, 110)
    for i, cls in enumerate(classes):
        ax = panel_axes(axes, i)
        for method in methods:
            d = sub[(sub["length_class"] == cls) & (sub["method"] == method)]
            n = int(d["n_requests"].max()) if len(d) else 0
            drawn = drawn_table(fig)
            drawn.plot(ax, d["interval"] + 1, d["mean"], color=styles[method].color, marker=styles[method].marker,
                       series=method, label=styles[method].label, note=f"n={n}" if n else None)  # fmt: skip
            drawn.fill_between(ax, d["interval"] + 1, d["mean_ci_low"], d["mean_ci_high"], alpha=0.2,
                               color=styles[method].color, series=method, label=styles[method].label)  # fmt: skip
            if n:
                ax.annotate(f"n={n}", (d["interval"].iloc[-1] + 1, d["mean"].iloc[-1]), fontsize=6,
                            color=styles[method].color, xytext=(3, 0), textcoords="offset points")  # fmt: skip
        ax.set_title(f"{dataset}: outputs {cls} tokens", fontsize=9)
        ax.set(xlabel="position decile", ylabel="mean acc_len")
        ax.grid(alpha=0.3)
    figure_legend(fig, styles)
    return fig


def plot_request_boxes(box: pd.DataFrame):
    """Fig. 6/13: per-request mean ``acc_len`` boxes (25-75) with 5-95 whiskers, per dataset x method."""
    from sdbench.plotting import method_style, panel_axes, panel_grid

    datasets = _ordered(box["dataset"])
    widest = max((int((box["dataset"] == d).sum()) for d in datasets), default=1)
    fig, axes = panel_grid(len(datasets), 1.0 + 0.55 * widest, 4.0, 110)
    for i, dataset in enumerate(datasets):
        ax = panel_axes(axes, i)
        d = box[box["dataset"] == dataset]
        stats = [
            {"label": method_style(m).label, "med": p50, "q1": p25, "q3": p75, "whislo": p5, "whishi": p95, "fliers": []}
            for m, p5, p25, p50, p75, p95 in zip(d["method"], d["p5"], d["p25"], d["p50"], d["p75"], d["p95"])
        ]
        boxes = drawn_table(fig).bxp(ax, stats, showfliers=False, patch_artist=True, series=d["method"])
        for patch, m in zip(boxes["boxes"], d["method"]):
            patch.set_facecolor(method_style(m).color)
            patch.set_alpha(0.45)
        ax.set_title(dataset, fontsize=9)
        ax.set_ylabel("per-request mean acc_len")
        ax.tick_params(axis="x", labelrotation=35, labelsize=7)
    fig.tight_layout()
    return fig


def plot_difference(diff: pd.DataFrame, dataset: str, max_position: int | None = 512):
    """Fig. 10 for one dataset: (request x position) map of n-gram minus EAGLE ``acc_len``."""
    mat, requests = _request_matrix(diff[diff["dataset"] == dataset], "diff", max_position)
    fig, ax = subplots(figsize=(7, 4.5))
    lim = MAX_ACC_LEN - 1
    im = drawn_table(fig).imshow(ax, mat, rows=requests, cols=range(mat.shape[1]), series_name="request",
                                 aspect="auto", interpolation="nearest", cmap="RdBu", vmin=-lim, vmax=lim)  # fmt: skip
    ax.set(title=f"{dataset}: n-gram minus EAGLE", xlabel="output position", ylabel="request")
    fig.colorbar(im, ax=ax, label="acc_len difference (blue: n-gram longer)")
    return fig


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def write_figures(
    traces: pd.DataFrame,
    outdir: str | os.PathLike[str],
    max_position: int | None = 512,
    per_class: int | None = 50,
    seed: int = 0,
) -> list[Path]:
    """Write Fig. 4, 5, 6 and 10 PNGs (each with its drawn table beside it) plus the parquet data
    behind Fig. 5, 6 and 10 to ``outdir``."""
    outdir = Path(outdir)
    written: list[Path] = []

    def out(name: str) -> Path:
        written.append(outdir / name)
        return written[-1]

    datasets = _ordered(traces["dataset"])
    deciles = position_deciles(traces, per_class=per_class, seed=seed)
    box = request_box_stats(traces)
    diff = ngram_minus_eagle(traces)
    write_parquet(deciles, out("fig5_position_deciles.parquet"))
    write_parquet(box, out("fig6_request_box.parquet"))
    write_parquet(difference_summary(diff), out("fig10_difference_summary.parquet"))
    save_png(plot_request_boxes(box), out("fig6_request_means.png"), dpi=120)
    for dataset in datasets:
        slug = _slug(dataset)
        save_png(plot_heatmaps(traces, dataset, max_position), out(f"fig4_heatmap_{slug}.png"), dpi=120)
        save_png(plot_position_deciles(deciles, dataset), out(f"fig5_position_deciles_{slug}.png"), dpi=120)
        if (diff["dataset"] == dataset).any():
            save_png(plot_difference(diff, dataset, max_position), out(f"fig10_difference_{slug}.png"), dpi=120)
    return written + [drawn_path(p) for p in written if p.suffix == ".png"]


FIGURES = ("heatmap", "deciles", "requests", "difference")


def write_figure(
    kind: str,
    traces: pd.DataFrame,
    output: str | os.PathLike[str],
    data: str | os.PathLike[str] | None = None,
    max_position: int | None = 512,
    per_class: int | None = 50,
    seed: int = 0,
) -> pd.DataFrame:
    """Write one figure of the index (Fig. 4 ``heatmap``, 5 ``deciles``, 6 ``requests``, 10
    ``difference``) and, for Fig. 5, 6 and 10, the table behind it to ``data``; returns the drawn
    table (also written beside ``output``).

    Fig. 4, 5 and 10 are drawn for one dataset: ``traces`` must hold exactly one.
    """
    datasets = _ordered(traces["dataset"])
    if kind != "requests" and len(datasets) != 1:
        raise ValueError(f"acceptance figure {kind}: traces hold {len(datasets)} datasets {datasets}, expected one")
    dataset = datasets[0]
    if kind == "heatmap":
        figure, table = plot_heatmaps(traces, dataset, max_position), None
    elif kind == "deciles":
        table = position_deciles(traces, per_class=per_class, seed=seed)
        figure = plot_position_deciles(table, dataset)
    elif kind == "requests":
        table = request_box_stats(traces)
        figure = plot_request_boxes(table)
    elif kind == "difference":
        diff = ngram_minus_eagle(traces)
        if diff.empty:
            raise ValueError(f"acceptance figure difference: dataset {dataset!r} lacks {NGRAM!r} or {EAGLE!r} traces")
        figure, table = plot_difference(diff, dataset, max_position), difference_summary(diff)
    else:
        raise ValueError(f"unknown acceptance figure {kind!r}; expected one of {FIGURES}")
    if data is not None and table is not None:
        write_parquet(table, data)
    return save_png(figure, output, dpi=120)


# ----------------------------------------------------------------------------- CLI
def _cmd_table4(args: argparse.Namespace) -> int:
    tab = table4(load_traces(args.traces, args.labels))
    write_parquet(tab, args.output)
    if args.markdown:
        write_text(markdown_table(tab), args.markdown)
    return 0


def _cmd_figure(args: argparse.Namespace) -> int:
    write_figure(
        args.figure,
        load_traces(args.traces, args.labels),
        args.output,
        args.data,
        None if args.max_position <= 0 else args.max_position,
        None if args.per_class <= 0 else args.per_class,
        args.seed,
    )
    return 0


def _cmd_figures(args: argparse.Namespace) -> int:
    max_position = None if args.max_position <= 0 else args.max_position
    per_class = None if args.per_class <= 0 else args.per_class
    for path in write_figures(
        load_traces(args.traces, args.labels), args.outdir, max_position, per_class, args.seed
    ):
        print(path)
    return 0
