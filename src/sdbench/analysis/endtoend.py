"""End-to-end performance (paper Sec. 3): join all cells, speedups, Tab. 1, Fig. 1/2.

Speedup = SD throughput / no-SD throughput of the same engine x model x dataset x
batch size. Figures are drawn from the joined table only.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from sdbench.analysis.intervals import (
    paired_start_log_ratios,
    replicate_interval,
    start_log_throughputs,
    welch_interval,
)
from sdbench.io import read_parquet, write_parquet, write_text
from sdbench.plotting import save_png

GROUP = ["engine", "model", "dataset", "batch_size"]
SORT = ["engine", "model", "dataset", "method", "batch_size"]


def mark_sweeps(cells: pd.DataFrame, sweeps: dict[str, dict[str, str]]) -> pd.DataFrame:
    """Add ``sweep``: the sweep a cell exists for (its method or dataset is a sweep variant,
    sdbench.sweeps.variant_keys), "" for the grid's own cells."""
    methods, datasets = sweeps.get("methods", {}), sweeps.get("datasets", {})
    return cells.assign(sweep=[methods.get(m) or datasets.get(d) or "" for m, d in zip(cells["method"], cells["dataset"])])


def join_cells(summaries: list[pd.DataFrame], baseline: str,
               calls: list[tuple[pd.DataFrame, pd.DataFrame]] | None = None) -> pd.DataFrame:  # fmt: skip
    """Concatenate per-cell summaries and add ``speedup`` (and pooled speedup) over ``baseline``.

    The speedup and its 95% interval are taken at the level that varies, the engine start
    (:mod:`sdbench.analysis.intervals`). A cell measured in pairs with a no-SD engine in its own
    process (``run.paired_baseline``, sdbench.engine.measure.paired; ``speedup_design`` =
    ``paired``): the t interval of its per-start log ratios; otherwise (``independent``) Welch's
    interval of its per-start log throughputs against the no-SD cell's. ``speedup`` is the
    interval's point (the geometric mean of the per-start ratios); ``speedup_replicates`` the
    starts it rests on: one gives no interval (NaN bounds, not judged). ``calls``: each summary's
    (calls, baseline_calls) tables, which hold the starts; without them every cell must have been
    measured in one start. ``baseline_tokens_per_s`` is always the no-SD cell's. ``contaminated``
    is true when either cell's quiet-machine guard flagged its timed part.
    """
    from sdbench.analysis.energy import add_energy_ratio

    cells = pd.concat(summaries, ignore_index=True)
    cells["_start_logs"], cells["_paired_logs"] = _start_logs(cells, calls)
    dupes = cells.duplicated(SORT)
    if dupes.any():
        raise ValueError(f"duplicate cells in summaries: {cells.loc[dupes, SORT].to_dict('records')}")
    for column, default in (("contaminated", False), ("tokens_per_s_boot", None), ("engine_layout", ""),
                            ("num_preemptions", 0), ("paired_baseline_num_preemptions", 0),
                            ("hardware", "")):  # fmt: skip
        if column not in cells:
            cells[column] = [default] * len(cells)
    keep = GROUP + ["tokens_per_s", "tokens_per_s_pooled", "_start_logs", "contaminated", "engine_layout",
                    "num_preemptions", "hardware"]  # fmt: skip
    base = cells.loc[cells["method"] == baseline, keep].rename(
        columns={
            "tokens_per_s": "baseline_tokens_per_s",
            "tokens_per_s_pooled": "_base_pooled",
            "_start_logs": "_base_start_logs",
            "contaminated": "_base_contaminated",
            "engine_layout": "_base_layout",
            "num_preemptions": "_base_preemptions",
            "hardware": "_base_hardware",
        }
    )
    out = cells.merge(base, on=GROUP, how="left", validate="many_to_one")
    out["speedup_pooled"] = out["tokens_per_s_pooled"] / out["_base_pooled"]
    paired = out["_paired_logs"].map(lambda x: x is not None)
    # A cell without a no-SD cell in the join (NaN after the merge) has no independent speedup;
    # a paired cell still has its own.
    found = [
        replicate_interval(p) if on else welch_interval(s, b if isinstance(b, list) else [])
        for s, b, p, on in zip(out["_start_logs"], out["_base_start_logs"], out["_paired_logs"], paired)
    ]
    out["speedup"] = [iv.point for iv in found]
    out["speedup_ci_low"] = [iv.low for iv in found]
    out["speedup_ci_high"] = [iv.high for iv in found]
    out["speedup_replicates"] = [iv.replicates for iv in found]
    out["speedup_design"] = ["paired" if on else "independent" for on in paired]
    base_rows = out["method"] == baseline
    out.loc[base_rows, "speedup_design"] = ""
    out.loc[base_rows, ["speedup", "speedup_ci_low", "speedup_ci_high"]] = [1.0, float("nan"), float("nan")]
    check_layouts(out)
    out["hardware_mismatch"] = check_hardware(out, "_base_hardware", independent=out["speedup_design"] == "independent")
    out["contaminated"] = out["contaminated"].fillna(False).astype(bool) | out["_base_contaminated"].fillna(
        False
    ).astype(bool)
    # A speedup whose either arm had requests preempted (KV cache full) was timed at a smaller
    # batch than its cell names for part of the run (docs/measurement.md).
    own = out["num_preemptions"].fillna(0).astype(int) + out["paired_baseline_num_preemptions"].fillna(0).astype(int)
    other = out["_base_preemptions"].where(out["speedup_design"] == "independent", 0).fillna(0).astype(int)
    out["preempted"] = (own + other) > 0
    out = out.drop(columns=["_base_pooled", "_base_start_logs", "_base_contaminated", "_base_layout",
                            "_base_preemptions", "_base_hardware", "tokens_per_s_boot", "_start_logs",
                            "_paired_logs"])  # fmt: skip
    out = add_energy_ratio(out, cells, baseline)  # joules per token over no SD's, as the speedup (analysis.energy)
    return out.sort_values(SORT, kind="stable").reset_index(drop=True)


def _start_logs(cells: pd.DataFrame, calls: list[tuple[pd.DataFrame, pd.DataFrame]] | None,
                ) -> tuple[list[list[float]], list[list[float] | None]]:  # fmt: skip
    """Per summary row: its per-start log throughputs, and for a paired cell its per-start log
    speedups over the no-SD arm of the same process (None otherwise). From the calls tables, or,
    without them, from the summary of a cell measured in one start."""
    paired = cells["paired_speedup"].notna() if "paired_speedup" in cells else pd.Series(False, index=cells.index)
    if calls is not None:
        if len(calls) != len(cells):
            raise ValueError(f"aggregate: {len(calls)} calls tables for {len(cells)} cell summaries")
        own = [list(start_log_throughputs(c)) for c, _ in calls]
        pairs = [list(paired_start_log_ratios(c, b)) if on else None for (c, b), on in zip(calls, paired)]
        return own, pairs
    starts = cells["num_engine_starts"] if "num_engine_starts" in cells else pd.Series(1, index=cells.index)
    several = cells[starts.fillna(1).astype(int) > 1]
    if len(several):
        first = several.iloc[0]
        raise ValueError(f"aggregate: cell {first[SORT].to_dict()} was measured in {int(first['num_engine_starts'])} "
                         "engine starts: its interval needs its calls tables (--calls, --baseline-calls)")  # fmt: skip
    own = [[math.log(x)] if x > 0 else [] for x in cells["tokens_per_s"].astype(float)]
    ratios = cells["paired_speedup"].astype(float) if "paired_speedup" in cells else pd.Series(0.0, index=cells.index)
    pairs = [([math.log(x)] if x > 0 else []) if on else None for x, on in zip(ratios, paired)]
    return own, pairs


def _mismatched(
    cells: pd.DataFrame, column: str, base: str, independent: pd.Series, load: str = "batch_size"
) -> tuple[str, pd.Series, int] | None:
    """The first of the ``independent`` rows whose ``column`` differs from its no-SD arm's (``base``),
    both known: (the cell's name, its row, how many such rows); None when there is none."""
    known = (cells[column].fillna("") != "") & (cells[base].fillna("") != "")
    bad = cells[known & independent & (cells[column] != cells[base])]
    if not len(bad):
        return None
    row = bad.iloc[0]
    short = {"batch_size": "bs", "concurrency": "c"}[load]
    return "/".join(str(row[k]) for k in ("engine", "model", "dataset", "method")) + f"/{short}{row[load]}", row, len(bad)


def check_layouts(cells: pd.DataFrame) -> None:
    """Refuse a speedup over the separately measured no-SD cell whose engine ran in another
    process layout (``engine_layout``; a paired cell's arms are checked when timed)."""
    found = _mismatched(cells, "engine_layout", "_base_layout", cells["speedup_design"] == "independent")
    if found:
        name, row, count = found
        raise ValueError(
            f"cell {name}: its speedup divides a {row['engine_layout']} engine by a {row['_base_layout']} no-SD "
            f"engine; both arms must run in one process layout ({count} such cell(s))"
        )


# Re-measures, on the kind of node the engine jobs now get, every cell measured on another kind
# (sdbench.engine.groups.reusable_cells): the arms of a marked pair then share one kind.
REMEASURE_OTHER_HARDWARE = "SDBENCH_REMEASURE_OTHER_HARDWARE=1 snakemake --forcerun run_engine"


def hardware_kind(label: object) -> str:
    """The part of a ``hardware`` label a number depends on (sdbench.engine.site.hardware.hardware_class):
    the GPU boards with their memory and count, or the CPU; not the driver, which is provenance."""
    label = "" if label is None or label != label else str(label)  # NaN: unknown
    return label if label.startswith("CPU ") else label.split(", driver ")[0]


def check_hardware(cells: pd.DataFrame, base: str, independent: pd.Series, load: str = "batch_size") -> pd.Series:
    """The rows whose two arms were measured in separate jobs on different kinds of machine
    (:func:`hardware_kind` of ``hardware``: GPU boards and memory, or the CPU; another driver is
    the same kind); ``base`` names the no-SD arm's column, ``independent`` the rows whose arms ran
    apart (paired arms share one process). Such a speedup is no measurement of either machine:
    the caller marks it (``hardware_mismatch``) and keeps it out of the verdict and advice. One
    line on stderr names the first, how many, and the command that re-measures them."""
    kinds, base_kinds = cells["hardware"].map(hardware_kind), cells[base].map(hardware_kind)
    mismatch = independent & (kinds != "") & (base_kinds != "") & (kinds != base_kinds)
    if mismatch.any():
        row = cells[mismatch].iloc[0]
        short = {"batch_size": "bs", "concurrency": "c"}[load]
        name = "/".join(str(row[k]) for k in ("engine", "model", "dataset", "method")) + f"/{short}{row[load]}"
        print(f"warning: cell {name}: SD measured on [{hardware_kind(row['hardware'])}], its no-SD arm on "
              f"[{hardware_kind(row[base])}]: marked hardware_mismatch, kept out of the verdict "
              f"({int(mismatch.sum())} such cell(s)); to measure both arms on one kind of node: "
              f"{REMEASURE_OTHER_HARDWARE}, or measure in pairs (run.paired_baseline)", file=sys.stderr)  # fmt: skip
    return mismatch


def generation_length_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Tab. 1: output length mean and std per engine x model x dataset x batch size x method."""
    grouped = requests.groupby(SORT, sort=True)["num_output_tokens"]
    return grouped.agg(output_len_mean="mean", output_len_std=lambda s: s.std(ddof=0), n="size").reset_index()


# What output_divergence reads of a requests table (output_slot where the table has it).
DIVERGENCE_COLUMNS = [*SORT, "request_id", "call_index", "slot", "output_slot", "output_token_ids"]
PAIR = ["engine", "model", "dataset"]


def _first_diffs(outputs: pa.ListArray, rows: np.ndarray, refs: list[np.ndarray]) -> np.ndarray:
    """First position where ``outputs[rows[i]]`` differs from ``refs[i]`` (a length difference
    counts at the shorter length), -1 where they are equal."""
    offsets = outputs.offsets.to_numpy()
    values = outputs.values.to_numpy(zero_copy_only=False)
    out = np.empty(len(rows), dtype=np.int64)
    for i, (row, ref) in enumerate(zip(rows, refs, strict=True)):
        a = values[offsets[row] : offsets[row + 1]]
        n = min(len(a), len(ref))
        d = np.flatnonzero(a[:n] != ref[:n])
        out[i] = d[0] if d.size else (n if len(a) != len(ref) else -1)
    return out


def _list_column(table: pa.Table, name: str) -> pa.ListArray:
    chunks = table.column(name).chunks
    column = chunks[0] if len(chunks) == 1 else table.column(name).combine_chunks()
    return column.cast(pa.list_(column.type.value_type)) if pa.types.is_large_list(column.type) else column


def _reference_outputs(table: pa.Table) -> dict[str, np.ndarray]:
    """request_id -> output token ids of slot 0 of the rows in ``table`` (a no-SD cell's), first row
    of each request; slot 0 always holds its own output."""
    slots = table.column("slot").to_numpy()
    rows = np.flatnonzero(slots == 0)
    ids = table.column("request_id").to_pylist()
    outputs = _list_column(table, "output_token_ids")
    offsets, values = outputs.offsets.to_numpy(), outputs.values.to_numpy(zero_copy_only=False)
    refs: dict[str, np.ndarray] = {}
    for row in rows:
        refs.setdefault(str(ids[row]), values[offsets[row] : offsets[row + 1]])
    return refs


def _divergence_counts(table: pa.Table, refs: dict[str, np.ndarray]) -> pd.DataFrame:
    """Per cell of ``table`` (rows of one engine x model x dataset): sequences compared with their
    reference (``n``), how many differ and the sum of their first differing positions. A row that
    refers to another slot's output (``output_slot``) counts that slot's result."""
    frame = table.select(SORT).to_pandas()
    rid = pd.Series(table.column("request_id").to_pylist(), dtype=object).astype(str).to_numpy()
    slot = table.column("slot").to_numpy()
    output_slot = table.column("output_slot").to_numpy() if "output_slot" in table.column_names else slot
    holds = output_slot == slot
    own = np.flatnonzero(holds & np.isin(rid, list(refs)))
    first = np.full(len(slot), np.nan)  # NaN: no reference for the request
    first[own] = _first_diffs(_list_column(table, "output_token_ids"), own, [refs[r] for r in rid[own]])
    refer = np.flatnonzero(~holds)
    if refer.size:
        frame["call_index"] = table.column("call_index").to_numpy()
        on = [*SORT, "call_index", "slot"]
        holders = frame.iloc[own].assign(slot=slot[own], _first=first[own])[[*on, "_first"]]
        wanted = frame.iloc[refer].assign(slot=output_slot[refer])[on]
        first[refer] = wanted.merge(holders, on=on, how="left", validate="many_to_one")["_first"].to_numpy()
    compared = ~np.isnan(first)
    frame = frame[compared].assign(first_diff=first[compared])
    frame["differs"] = frame["first_diff"] >= 0
    frame["diff_sum"] = frame["first_diff"].where(frame["differs"], 0).astype("int64")
    grouped = frame.groupby(SORT, sort=True)
    return grouped.agg(n=("differs", "size"), n_differs=("differs", "sum"), diff_sum=("diff_sum", "sum")).reset_index()


def _forced_cells(cells: pd.DataFrame | None) -> set[tuple]:
    """Forced-acceptance cells (``sweep`` ``forced_acceptance``): their accepted tokens are the
    drafter's, not the greedy ones, by design."""
    if cells is None or "sweep" not in cells:
        return set()
    return set(cells.loc[cells["sweep"] == "forced_acceptance", SORT].itertuples(index=False, name=None))


def _divergence_table(counts: list[pd.DataFrame], cells: pd.DataFrame | None) -> pd.DataFrame:
    """The divergence table from per-cell counts (:func:`_divergence_counts`)."""
    columns = [*SORT, "n", "n_differs", "diff_sum"]
    total = pd.concat([c[columns] for c in counts], ignore_index=True) if counts else pd.DataFrame(columns=columns)
    total = total.groupby(SORT, sort=True)[["n", "n_differs", "diff_sum"]].sum().reset_index()
    total = total[total["n"] > 0]
    out = total[SORT].assign(
        n=total["n"].astype("int64"),
        share_differs=total["n_differs"] / total["n"],
        first_diff_mean=(total["diff_sum"] / total["n_differs"]).where(total["n_differs"] > 0),
    ).reset_index(drop=True)
    if cells is None:
        return out
    temps = cells[SORT + ["temperature"]] if "temperature" in cells else cells[SORT].assign(temperature=0.0)
    out = out.merge(temps, on=SORT, how="left", validate="one_to_one")
    out["temperature"] = out["temperature"].fillna(0.0)  # summaries from before temperatures: greedy
    out["reference"] = [
        "greedy no-SD" if t == 0 else f"no-SD sampled at T={t:g}, same seeds" for t in out["temperature"]
    ]
    return out


def _reference_cells(present: pd.DataFrame, baseline: str) -> dict[tuple, tuple]:
    """(engine, model, dataset) -> the no-SD cell whose outputs are the reference: the smallest batch size."""
    base = present[present["method"] == baseline].sort_values("batch_size", kind="stable").drop_duplicates(PAIR)
    return {tuple(r[:3]): tuple(r) for r in base[SORT].itertuples(index=False, name=None)}


def output_divergence(requests: pd.DataFrame, baseline: str, cells: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per cell: share of sequences whose output differs from the reference output.

    The reference is the no-SD output of the same request at the smallest batch size
    (first slot); ``first_diff_mean`` is the mean first differing position among
    differing sequences (a length difference counts at the shorter length). With ``cells``
    (their ``temperature``) each row says what it was compared with (``reference``): greedy
    no SD, or, for a sampled dataset, no SD sampled with the same seeds, which SD matches in
    distribution but need not reproduce (sdbench.engine.measure.sampling): there a difference is expected.
    Forced-acceptance cells (``sweep`` ``forced_acceptance`` in ``cells``) are left out: their
    accepted tokens are the drafter's, not the greedy ones, by design. A row that refers to
    another slot's output (``output_slot``, sdbench.requesttable) counts as that slot.
    :func:`aggregate_requests` computes the same from files, one cell at a time.
    """
    forced = _forced_cells(cells)
    if forced:
        keep = [k not in forced for k in requests[SORT].itertuples(index=False, name=None)]
        requests = requests[keep]
    table = pa.Table.from_pandas(requests[[c for c in DIVERGENCE_COLUMNS if c in requests]], preserve_index=False)
    counts = []
    for pair, ref_cell in _reference_cells(requests[SORT].drop_duplicates(), baseline).items():
        refs = _reference_outputs(table.filter(_key_mask(table, SORT, ref_cell)))
        counts.append(_divergence_counts(table.filter(_key_mask(table, PAIR, pair)), refs))
    return _divergence_table(counts, cells)


def _key_mask(table: pa.Table, names: list[str], values: tuple) -> pa.Array:
    import pyarrow.compute as pc

    mask = None
    for name, value in zip(names, values, strict=True):
        m = pc.equal(table.column(name), pa.scalar(value, table.schema.field(name).type))
        mask = m if mask is None else pc.and_(mask, m)
    return mask


def aggregate_requests(
    paths: list[str], baseline: str, cells: pd.DataFrame | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Tab. 1 (:func:`generation_length_table`) and :func:`output_divergence` from requests tables,
    file by file: each file is read twice, only the columns needed (``pyarrow`` column projection),
    so memory holds one file's outputs and one reference cell's, never the grid's.

    First the cell keys and output lengths of every file; then, per engine x model x dataset, the
    reference cell's slot-0 outputs and each of the pair's files against them. A cell in two
    files is refused (a requests table is one cell's, or a disjoint set of cells').
    """
    from sdbench.io import read_parquet

    lengths, present = [], []
    for path in paths:
        table = read_parquet(path, columns=[*SORT, "num_output_tokens"], what="requests table")
        lengths.append(generation_length_table(table))
        present.append(table[SORT].drop_duplicates().assign(_file=path))
    lengths_table = pd.concat(lengths, ignore_index=True)
    twice = lengths_table.duplicated(SORT)
    if twice.any():
        files = pd.concat(present).merge(lengths_table.loc[twice, SORT], on=SORT)["_file"].unique()
        raise ValueError(f"aggregate: cell(s) {lengths_table.loc[twice, SORT].to_dict('records')[:3]} in more "
                         f"than one requests table ({', '.join(files[:4])})")  # fmt: skip
    lengths_table = lengths_table.sort_values(SORT, kind="stable").reset_index(drop=True)
    forced = _forced_cells(cells)
    present_all = pd.concat(present, ignore_index=True)
    present_all = present_all[[k not in forced for k in present_all[SORT].itertuples(index=False, name=None)]]
    counts = []
    for pair, ref_cell in _reference_cells(present_all, baseline).items():
        ref_file = present_all.merge(pd.DataFrame([ref_cell], columns=SORT), on=SORT)["_file"].iloc[0]
        refs = _reference_outputs(_read_cells(ref_file, SORT, ref_cell))
        for path in present_all.merge(pd.DataFrame([pair], columns=PAIR), on=PAIR)["_file"].unique():
            table = _read_cells(path, PAIR, pair)
            if forced:
                keep = [k not in forced for k in table.select(SORT).to_pandas().itertuples(index=False, name=None)]
                table = table.filter(pa.array(keep))
            counts.append(_divergence_counts(table, refs))
            del table
            pa.default_memory_pool().release_unused()  # the next file reuses it, or the system does
    return lengths_table, _divergence_table(counts, cells)


def _read_cells(path: str, names: list[str], values: tuple) -> pa.Table:
    """The :data:`DIVERGENCE_COLUMNS` (those the file has) of the rows of ``path`` whose ``names`` equal ``values``."""
    import pyarrow.parquet as pq

    import pyarrow.compute as pc

    have = set(pq.read_schema(path).names)
    table = pq.read_table(path, columns=[c for c in DIVERGENCE_COLUMNS if c in have])
    mask = _key_mask(table, names, values)
    return table if pc.all(mask).as_py() else table.filter(mask)  # one cell per file: no copy


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


def grid_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """The grid's own cells: sweep variants (column ``sweep``) belong to their sweep's item."""
    return cells[cells["sweep"].fillna("") == ""] if "sweep" in cells else cells


def plot_throughput(cells: pd.DataFrame, out_png: str | Path) -> pd.DataFrame:
    """Fig. 1/2: throughput (top) and speedup (bottom) vs batch size per method, a panel per
    engine x model x dataset, wrapped into a grid; one legend for every method drawn. Returns
    the drawn table (also written beside ``out_png``)."""
    from matplotlib.lines import Line2D

    from sdbench.plotting import drawn_table, figure_legend, method_styles, panel_axes, panel_grid

    cells = grid_cells(cells)
    panels = list(cells.groupby(["engine", "model", "dataset"], sort=True))
    styles = method_styles(cells)
    dpi = 110
    fig, axes = panel_grid(len(panels), 4.0, 3.3, dpi, rows_per_panel=2)
    drawn = drawn_table(fig)
    metrics = (
        ("tokens_per_s", "tokens_per_s_ci_low", "tokens_per_s_ci_high", "output tokens / s"),
        ("speedup", "speedup_ci_low", "speedup_ci_high", "speedup over no SD"),
    )
    flagged_any = preempted_any = False
    for i, (keys, sub) in enumerate(panels):
        title = f"{keys[1]} / {keys[2]}\n{keys[0]}"
        for row, (y, lo, hi, ylabel) in enumerate(metrics):
            ax = panel_axes(axes, i, row, 2)
            for method, line in sub.groupby("method", sort=True):
                line = line.sort_values("batch_size")
                err = None
                if lo in line and line[lo].notna().any():  # 95% bootstrap interval
                    err = [(line[y] - line[lo]).clip(lower=0), (line[hi] - line[y]).clip(lower=0)]
                style = styles[method]
                drawn.errorbar(ax, line["batch_size"], line[y], yerr=err, capsize=3, color=style.color,
                               marker=style.marker, series=method, label=style.label)  # fmt: skip
            flagged = sub[sub["contaminated"].astype(bool)] if "contaminated" in sub else sub.iloc[:0]
            if len(flagged):  # timed beside other work (docs: quiet machine)
                flagged_any = True
                drawn.scatter(ax, flagged["batch_size"], flagged[y], s=150, facecolors="none", edgecolors="red",
                              linewidths=1.5, zorder=5, mark="ring", series=flagged["method"],
                              note="timed on a busy machine")  # fmt: skip
            preempted = sub[sub["preempted"].astype(bool)] if "preempted" in sub else sub.iloc[:0]
            if len(preempted):  # KV cache too small for the batch: part of it waited (docs/measurement.md)
                preempted_any = True
                drawn.scatter(ax, preempted["batch_size"], preempted[y], s=220, marker="s", facecolors="none",
                              edgecolors="darkorange", linewidths=1.5, zorder=5, mark="preempted",
                              series=preempted["method"], note="requests preempted (KV cache full)")  # fmt: skip
            if row == 1:
                drawn.axhline(ax, 1.0, color="grey", lw=0.8, ls="--", series="no SD")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("batch size", fontsize=8)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.grid(alpha=0.3)
        panel_axes(axes, i, 0, 2).set_title(title, fontsize=9)
    extra = []
    if flagged_any:
        extra.append(Line2D([], [], ls="none", marker="o", markerfacecolor="none", markeredgecolor="red",
                            markersize=10, label="timed on a busy machine"))  # fmt: skip
    if preempted_any:
        extra.append(Line2D([], [], ls="none", marker="s", markerfacecolor="none", markeredgecolor="darkorange",
                            markersize=11, label="requests preempted (KV cache full)"))  # fmt: skip
    figure_legend(fig, styles, extra)
    return save_png(fig, out_png, dpi=dpi)


def plot_acceptance_per_position(cells: pd.DataFrame, out_png: str | Path) -> pd.DataFrame:
    """Acceptance rate by draft position (run-cell counters, mean over the batch sizes), one
    panel per engine x model x dataset, one line per method. Returns the drawn table."""
    import numpy as np

    from sdbench.plotting import drawn_table, figure_legend, method_styles, panel_axes, panel_grid

    cells = grid_cells(cells)
    sd = cells[cells["acceptance_rate_per_pos"].map(len) > 0]
    panels = list(sd.groupby(["engine", "model", "dataset"], sort=True))
    styles = method_styles(sd)
    dpi = 110
    fig, axes = panel_grid(len(panels), 4.0, 3.2, dpi)
    drawn = drawn_table(fig)
    for i, (keys, sub) in enumerate(panels):
        ax = panel_axes(axes, i)
        for method, rows in sub.groupby("method", sort=True):
            width = max(len(r) for r in rows["acceptance_rate_per_pos"])
            rates = np.nanmean([list(r) + [np.nan] * (width - len(r)) for r in rows["acceptance_rate_per_pos"]], axis=0)
            style = styles[method]
            drawn.plot(ax, range(1, width + 1), rates, color=style.color, marker=style.marker, series=method,
                       label=style.label)  # fmt: skip
        ax.set_title(f"{keys[1]} / {keys[2]}\n{keys[0]}", fontsize=9)
        ax.set_xlabel("draft position", fontsize=8)
        ax.set_ylabel("acceptance rate", fontsize=8)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    figure_legend(fig, styles)
    return save_png(fig, out_png, dpi=dpi)


def stale_scope_note(cells: pd.DataFrame) -> str | None:
    """One line naming the cells measured under another measurement scope than this checkout's
    (``measurement_digest``, sdbench.engine.scope; a rehearsal's against the rehearsal's scope),
    and the command that measures exactly those again; None when every cell is current. Their
    numbers stay in the tables: they are measurements of the older code."""
    from sdbench.engine.scope import REMEASURE_COMMAND, measurement_digest, stale_cells

    recorded = cells.get("measurement_digest", pd.Series([""] * len(cells), index=cells.index)).fillna("")
    measured = cells.get("measured", pd.Series([True] * len(cells), index=cells.index)).fillna(True).astype(bool)
    current = {flag: measurement_digest(rehearsal=not flag) for flag in set(measured)}
    names = ["/".join(str(row[k]) for k in ("engine", "model", "dataset", "method")) + f"/bs{row['batch_size']}"
             for _, row in cells.iterrows()]  # fmt: skip
    stale = [n for flag in current for n in stale_cells(
        [(n, d) for n, d, m in zip(names, recorded, measured) if m == flag], current[flag])]  # fmt: skip
    if not stale:
        return None
    now = ", ".join(sorted(current.values()))
    return (f"warning: {len(stale)} of {len(cells)} cells were measured under another measurement scope than this "
            f"checkout's ({now}), e.g. {sorted(stale)[0]}; to measure exactly those again: {REMEASURE_COMMAND}")


def _cmd_aggregate(args: argparse.Namespace) -> int:
    import json

    by_requests = [o for o in ("lengths", "lengths_md", "divergence", "divergence_md") if getattr(args, o)]
    if by_requests and not args.requests:
        flags = ", ".join("--" + o.replace("_", "-") for o in by_requests)
        raise ValueError(f"aggregate: {flags} need --requests (the cells' requests.parquet)")
    summaries = [read_parquet(p, what="summary table") for p in args.summaries]
    calls = None
    if args.calls or args.baseline_calls:
        if not (len(args.calls or []) == len(args.baseline_calls or []) == len(summaries)):
            raise ValueError(f"aggregate: --calls and --baseline-calls need one table per summary ({len(summaries)})")
        calls = [(read_parquet(c, what="calls table"), read_parquet(b, what="baseline calls table"))
                 for c, b in zip(args.calls, args.baseline_calls)]  # fmt: skip
    cells = mark_sweeps(join_cells(summaries, args.baseline, calls), json.loads(args.sweeps))
    write_parquet(cells, args.cells)
    note = stale_scope_note(cells)
    if note:
        print(note, file=sys.stderr)
    if args.speedups_md:
        write_text(speedup_markdown(cells), args.speedups_md)
    if not by_requests:
        return 0
    lengths, divergence = aggregate_requests(args.requests, args.baseline, cells)
    if args.lengths:
        write_parquet(lengths, args.lengths)
    if args.lengths_md:
        write_text(render_length_table(lengths), args.lengths_md)
    if args.divergence:
        write_parquet(divergence, args.divergence)
    if args.divergence_md:
        write_text(divergence.to_markdown(index=False, floatfmt=".3f") + "\n", args.divergence_md)
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    if not (args.output or args.acceptance):
        raise ValueError("plot-throughput: give --output (Fig. 1/2) and/or --acceptance")
    cells = read_parquet(args.cells, what="cells table")
    if args.output:
        plot_throughput(cells, args.output)
    if args.acceptance:
        plot_acceptance_per_position(cells, args.acceptance)
    return 0
