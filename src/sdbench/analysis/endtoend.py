"""End-to-end performance (paper Sec. 3): join all cells, speedups, Tab. 1, Fig. 1/2.

Speedup = SD throughput / no-SD throughput of the same engine x model x dataset x
batch size. Figures are drawn from the joined table only.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from sdbench.io import write_parquet, write_text
from sdbench.plotting import save_png, subplots

GROUP = ["engine", "model", "dataset", "batch_size"]
SORT = ["engine", "model", "dataset", "method", "batch_size"]


def join_cells(summaries: list[pd.DataFrame], baseline: str) -> pd.DataFrame:
    """Concatenate per-cell summaries and add ``speedup`` (and pooled speedup) over ``baseline``.

    A cell measured in pairs with a no-SD engine in its own process
    (``run.paired_baseline``, sdbench.engine.paired) takes its ``speedup`` and interval from
    the pairs (``speedup_design`` = ``paired``); otherwise ``speedup`` is the ratio over the
    separately measured no-SD cell and ``speedup_ci_low/high`` the interval of the ratio of
    the two cells' bootstrap draws (``independent``; sdbench.analysis.stats).
    ``baseline_tokens_per_s`` is always the no-SD cell's. ``contaminated`` is true when
    either cell's quiet-machine guard flagged its timed part.
    """
    from sdbench.analysis.stats import ratio_interval

    cells = pd.concat(summaries, ignore_index=True)
    dupes = cells.duplicated(SORT)
    if dupes.any():
        raise ValueError(f"duplicate cells in summaries: {cells.loc[dupes, SORT].to_dict('records')}")
    for column, default in (("contaminated", False), ("tokens_per_s_boot", None)):
        if column not in cells:
            cells[column] = [default] * len(cells)
    keep = GROUP + ["tokens_per_s", "tokens_per_s_pooled", "tokens_per_s_boot", "contaminated"]
    base = cells.loc[cells["method"] == baseline, keep].rename(
        columns={
            "tokens_per_s": "baseline_tokens_per_s",
            "tokens_per_s_pooled": "_base_pooled",
            "tokens_per_s_boot": "_base_boot",
            "contaminated": "_base_contaminated",
        }
    )
    out = cells.merge(base, on=GROUP, how="left", validate="many_to_one")
    out["speedup"] = out["tokens_per_s"] / out["baseline_tokens_per_s"]
    out["speedup_pooled"] = out["tokens_per_s_pooled"] / out["_base_pooled"]
    bounds = [
        ratio_interval(a, b) if a is not None and b is not None and len(a) and len(b) else (float("nan"),) * 2
        for a, b in zip(out["tokens_per_s_boot"], out["_base_boot"])
    ]
    out["speedup_ci_low"] = [lo for lo, _ in bounds]
    out["speedup_ci_high"] = [hi for _, hi in bounds]
    out["speedup_design"] = "independent"
    if "paired_speedup" in out:
        paired = out["paired_speedup"].notna()
        for column in ("speedup", "speedup_ci_low", "speedup_ci_high"):
            out.loc[paired, column] = out.loc[paired, f"paired_{column}"]
        out.loc[paired, "speedup_design"] = "paired"
    out.loc[out["method"] == baseline, "speedup_design"] = ""
    out["contaminated"] = out["contaminated"].fillna(False).astype(bool) | out["_base_contaminated"].fillna(
        False
    ).astype(bool)
    out = out.drop(columns=["_base_pooled", "_base_boot", "_base_contaminated", "tokens_per_s_boot"])
    return out.sort_values(SORT, kind="stable").reset_index(drop=True)


def generation_length_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Tab. 1: output length mean and std per engine x model x dataset x batch size x method."""
    grouped = requests.groupby(SORT, sort=True)["num_output_tokens"]
    return grouped.agg(output_len_mean="mean", output_len_std=lambda s: s.std(ddof=0), n="size").reset_index()


def output_divergence(requests: pd.DataFrame, baseline: str, cells: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per cell: share of sequences whose output differs from the reference output.

    The reference is the no-SD output of the same request at the smallest batch size
    (first slot); ``first_diff_mean`` is the mean first differing position among
    differing sequences (a length difference counts at the shorter length). With ``cells``
    (their ``temperature``) each row says what it was compared with (``reference``): greedy
    no SD, or, for a sampled dataset, no SD sampled with the same seeds, which SD matches in
    distribution but need not reproduce (sdbench.engine.sampling): there a difference is expected.
    """
    base = requests[requests["method"] == baseline]
    smallest = base.groupby(["engine", "model", "dataset"])["batch_size"].transform("min")
    ref = base[(base["batch_size"] == smallest) & (base["slot"] == 0)]
    ref = ref.drop_duplicates(["engine", "model", "dataset", "request_id"])
    ref = ref[["engine", "model", "dataset", "request_id", "output_token_ids"]].rename(
        columns={"output_token_ids": "reference_ids"}
    )
    joined = requests.merge(ref, on=["engine", "model", "dataset", "request_id"], how="inner")

    def first_diff(a: list[int], b: list[int]) -> int:
        n = min(len(a), len(b))
        for i in range(n):
            if a[i] != b[i]:
                return i
        return n if len(a) != len(b) else -1

    joined["first_diff"] = [first_diff(list(a), list(b)) for a, b in zip(joined.output_token_ids, joined.reference_ids)]
    joined["differs"] = joined["first_diff"] >= 0
    grouped = joined.groupby(SORT, sort=True)
    out = grouped.agg(n=("differs", "size"), share_differs=("differs", "mean")).reset_index()
    diffs = joined[joined["differs"]].groupby(SORT)["first_diff"].mean().rename("first_diff_mean")
    out = out.merge(diffs.reset_index(), on=SORT, how="left")
    if cells is None:
        return out
    temps = cells[SORT + ["temperature"]] if "temperature" in cells else cells[SORT].assign(temperature=0.0)
    out = out.merge(temps, on=SORT, how="left", validate="one_to_one")
    out["temperature"] = out["temperature"].fillna(0.0)  # summaries from before temperatures: greedy
    out["reference"] = [
        "greedy no-SD" if t == 0 else f"no-SD sampled at T={t:g}, same seeds" for t in out["temperature"]
    ]
    return out


def render_length_table(table: pd.DataFrame) -> str:
    """Tab. 1 as Markdown: rows = batch size, columns = method, cells = mean +- std."""
    parts: list[str] = []
    for keys, sub in table.groupby(["engine", "model", "dataset"], sort=True):
        wide = sub.assign(cell=[f"{m:.0f} ± {s:.0f}" for m, s in zip(sub.output_len_mean, sub.output_len_std)])
        wide = wide.pivot(index="batch_size", columns="method", values="cell")
        parts.append(f"### {' / '.join(map(str, keys))}\n\n{wide.to_markdown()}\n")
    return "\n".join(parts)


def speedup_markdown(cells: pd.DataFrame) -> str:
    """Speedups as Markdown: per engine / model / dataset, rows = SD method, columns = batch size,
    cells = ``speedup [95% interval]`` (``*`` marks a cell timed beside other work)."""
    parts: list[str] = []
    # SD cells only: the no-SD cells have no design (their speedup is 1 by definition).
    design = cells["speedup_design"].fillna("").astype(str) if "speedup_design" in cells else None
    sd = cells[cells["speedup"].notna() & (design != "" if design is not None else True)]
    for keys, sub in sd.groupby(["engine", "model", "dataset"], sort=True):
        flags = sub["contaminated"].astype(bool) if "contaminated" in sub else [False] * len(sub)
        text = [
            f"{s:.2f} [{lo:.2f}, {hi:.2f}]{'*' if flag else ''}"
            for s, lo, hi, flag in zip(sub.speedup, sub.speedup_ci_low, sub.speedup_ci_high, flags)
        ]
        wide = sub.assign(cell=text).pivot(index="method", columns="batch_size", values="cell")
        wide.columns = [f"bs {b}" for b in wide.columns]
        designs = ", ".join(sorted(sub["speedup_design"].unique())) if design is not None else "independent"
        parts.append(f"### {' / '.join(map(str, keys))} ({designs})\n\n{wide.to_markdown()}\n")
    return "\n".join(parts)


def plot_throughput(cells: pd.DataFrame, out_png: str | Path) -> None:
    """Fig. 1/2: throughput and speedup vs batch size per method, one column per model x dataset."""
    panels = list(cells.groupby(["engine", "model", "dataset"], sort=True))
    fig, axes = subplots(2, len(panels), figsize=(4.2 * len(panels), 7), squeeze=False)
    for col, (keys, sub) in enumerate(panels):
        metrics = (
            ("tokens_per_s", "tokens_per_s_ci_low", "tokens_per_s_ci_high"),
            ("speedup", "speedup_ci_low", "speedup_ci_high"),
        )
        for method, line in sub.groupby("method", sort=True):
            line = line.sort_values("batch_size")
            for row, (y, lo, hi) in enumerate(metrics):
                err = None
                if lo in line and line[lo].notna().any():  # 95% bootstrap interval
                    err = [(line[y] - line[lo]).clip(lower=0), (line[hi] - line[y]).clip(lower=0)]
                axes[row, col].errorbar(line["batch_size"], line[y], yerr=err, marker="o", capsize=3, label=method)
        flagged = sub[sub["contaminated"].astype(bool)] if "contaminated" in sub else sub.iloc[:0]
        for row, (y, _, _) in enumerate(metrics):
            if len(flagged):  # timed beside other work (README: "Quiet machine")
                axes[row, col].scatter(
                    flagged["batch_size"], flagged[y], s=150, facecolors="none", edgecolors="red",
                    linewidths=1.5, zorder=5, label="flagged: busy machine",
                )
        axes[0, col].set_title("\n".join(map(str, keys)), fontsize=9)
        axes[0, col].set_ylabel("output tokens / s")
        axes[1, col].axhline(1.0, color="grey", lw=0.8, ls="--")
        axes[1, col].set_ylabel("speedup over no-SD")
        for ax in axes[:, col]:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("batch size")
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, out_png, dpi=110)


def plot_acceptance_per_position(cells: pd.DataFrame, out_png: str | Path) -> None:
    """Acceptance rate by draft position (run-cell counters), one panel per model x dataset."""
    sd = cells[cells["acceptance_rate_per_pos"].map(len) > 0]
    panels = list(sd.groupby(["engine", "model", "dataset"], sort=True))
    fig, axes = subplots(1, max(len(panels), 1), figsize=(4.2 * max(len(panels), 1), 3.6), squeeze=False)
    for col, (keys, sub) in enumerate(panels):
        ax = axes[0, col]
        for (method, bs), row in sub.groupby(["method", "batch_size"], sort=True):
            rates = list(row["acceptance_rate_per_pos"].iloc[0])
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=f"{method} bs{bs}")
        ax.set_title("\n".join(map(str, keys)), fontsize=9)
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance rate")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    save_png(fig, out_png, dpi=110)


def _cmd_aggregate(args: argparse.Namespace) -> int:
    cells = join_cells([pd.read_parquet(p) for p in args.summaries], args.baseline)
    requests = pd.concat([pd.read_parquet(p) for p in args.requests], ignore_index=True)
    lengths = generation_length_table(requests)
    write_parquet(cells, args.cells)
    write_text(speedup_markdown(cells), args.speedups_md)
    write_parquet(lengths, args.lengths)
    write_text(render_length_table(lengths), args.lengths_md)
    divergence = output_divergence(requests, args.baseline, cells)
    write_parquet(divergence, args.divergence)
    write_text(divergence.to_markdown(index=False, floatfmt=".3f") + "\n", args.divergence_md)
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    if not (args.output or args.acceptance):
        raise ValueError("plot-throughput: give --output (Fig. 1/2) and/or --acceptance")
    cells = pd.read_parquet(args.cells)
    if args.output:
        plot_throughput(cells, args.output)
    if args.acceptance:
        plot_acceptance_per_position(cells, args.acceptance)
    return 0
