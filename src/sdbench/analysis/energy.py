"""Energy beside throughput: joules per output token per cell, and SD's energy ratio over no SD.

A cell's joules per output token (``joules_per_token`` with its 95% interval, its meter in
``energy_meter``) comes from its calls (:mod:`sdbench.engine.measure.energy`). The energy ratio of an SD
cell is its joules per token over its no-SD arm's, computed as its speedup is
(:func:`sdbench.analysis.endtoend.join_cells`): from the paired arms where the cell was timed in pairs
(``paired_energy_ratio``), else over the separately measured no-SD cell with the interval of the
ratio of the two cells' bootstrap draws. Below 1 SD saves energy per token; above 1 it costs more.
Where no meter existed every energy column is NaN, ``energy_meter`` says ``not measured`` and
``energy_reason`` why (no NVML, no RAPL, RAPL root-only, mixed meters): the page lists those cells
under their reason rather than leaving them out.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from sdbench.engine.measure.energy import JOULES_PER_TOKEN, NOT_MEASURED
from sdbench.io import read_parquet, write_parquet, write_text

GROUP = ["engine", "model", "dataset", "batch_size"]
SORT = ["engine", "model", "dataset", "method", "batch_size"]
RATIO = ("energy_ratio", "energy_ratio_ci_low", "energy_ratio_ci_high")
BOOT = "joules_per_token_boot"
# energy.parquet (docs/schema.md).
COLUMNS: tuple[str, ...] = (
    *SORT, "sd_method", "num_speculative_tokens", "tokens_per_s", "tokens_per_s_ci_low", "tokens_per_s_ci_high",
    "energy_meter", "energy_reason", "mean_power_w", JOULES_PER_TOKEN, f"{JOULES_PER_TOKEN}_ci_low",
    f"{JOULES_PER_TOKEN}_ci_high",
    "speedup", "speedup_ci_low", "speedup_ci_high", *RATIO,
)  # fmt: skip


def add_energy_ratio(out: pd.DataFrame, cells: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """``out`` (the joined cells, with ``speedup_design``) with ``baseline_joules_per_token`` and
    :data:`RATIO`; the per-cell bootstrap draws are dropped. Cells from before energy was
    measured get ``energy_meter`` ``not measured``."""
    out = out.copy()
    if "energy_meter" not in out:
        out["energy_meter"] = NOT_MEASURED
    for column in (JOULES_PER_TOKEN, f"{JOULES_PER_TOKEN}_ci_low", f"{JOULES_PER_TOKEN}_ci_high"):
        if column not in out:
            out[column] = math.nan
    out["energy_meter"] = out["energy_meter"].fillna(NOT_MEASURED)
    out["energy_reason"] = with_reasons(out)
    base = cells.loc[cells["method"] == baseline, [c for c in [*GROUP, JOULES_PER_TOKEN, BOOT] if c in cells]]
    base = base.rename(columns={JOULES_PER_TOKEN: "baseline_joules_per_token", BOOT: "_base_jpt_boot"})
    out = out.merge(base, on=GROUP, how="left", validate="many_to_one") if len(base.columns) > len(GROUP) \
        else out.assign(baseline_joules_per_token=math.nan)
    out["energy_ratio"] = out[JOULES_PER_TOKEN] / out["baseline_joules_per_token"]
    bounds = [_ratio_bounds(a, b) for a, b in zip(out.get(BOOT, [None] * len(out)),
                                                   out.get("_base_jpt_boot", [None] * len(out)))]  # fmt: skip
    out["energy_ratio_ci_low"] = [lo for lo, _ in bounds]
    out["energy_ratio_ci_high"] = [hi for _, hi in bounds]
    if "paired_energy_ratio" in out:  # paired cells: the ratio of their own two arms, as the speedup
        paired = out["speedup_design"] == "paired"
        for column in RATIO:
            out.loc[paired, column] = out.loc[paired, f"paired_{column}"]
        out.loc[paired, "baseline_joules_per_token"] = out.loc[paired, "paired_baseline_joules_per_token"]
    out.loc[out["method"] == baseline, list(RATIO)] = math.nan
    return out.drop(columns=[c for c in (BOOT, "_base_jpt_boot") if c in out])


NOT_RECORDED = "not recorded (cells from before energy_reason)"


def with_reasons(cells: pd.DataFrame) -> pd.Series:
    """``energy_reason`` of each cell: '' where a meter measured it, its recorded reason, or
    :data:`NOT_RECORDED` for an unmetered cell from before the column existed."""
    reason = cells["energy_reason"] if "energy_reason" in cells else pd.Series("", index=cells.index)
    reason = reason.fillna("").astype(str)
    unmetered = cells["energy_meter"].fillna(NOT_MEASURED) == NOT_MEASURED
    return reason.where(~unmetered | (reason != ""), NOT_RECORDED).where(unmetered, "")


def _ratio_bounds(a: object, b: object) -> tuple[float, float]:
    """Interval of the ratio of two cells' independent bootstrap draws (NaN without both)."""
    from sdbench.analysis.stats import ratio_interval

    sized = lambda x: hasattr(x, "__len__") and len(x) > 0  # noqa: E731
    return ratio_interval(a, b) if sized(a) and sized(b) else (math.nan, math.nan)


def energy_word(low: float, high: float) -> str:
    """SD's energy per token against no SD from the ratio's interval: ``saves`` (all below 1),
    ``costs`` (all above 1), ``even`` (contains 1), ``not measured`` (no interval)."""
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return NOT_MEASURED
    if high < 1.0:
        return "saves"
    if low > 1.0:
        return "costs"
    return "even"


def fmt_energy(value: float, low: float, high: float, spec: str = ".3g") -> str:
    """``value [low, high]``, or ``not measured`` for NaN."""
    if value is None or math.isnan(value):
        return NOT_MEASURED
    return f"{value:{spec}} [{low:{spec}}, {high:{spec}}]"


# ----------------------------------------------------------------------------- the energy item
def energy_table(cells: pd.DataFrame) -> pd.DataFrame:
    """The grid's cells with throughput and energy side by side (one row per cell)."""
    from sdbench.columns import conform

    cells = cells[cells["sweep"].fillna("") == ""] if "sweep" in cells else cells  # the grid's own (a sweep's: its item)
    if "energy_meter" in cells:
        cells = cells.assign(energy_reason=with_reasons(cells))
    missing = [c for c in COLUMNS if c not in cells]
    if missing:
        raise ValueError(f"cells table lacks columns {missing} (expected sdbench aggregate output)")
    return conform(cells[list(COLUMNS)].sort_values(SORT, kind="stable").reset_index(drop=True), COLUMNS, "energy")


def energy_markdown(table: pd.DataFrame) -> str:
    """Joules per output token [95%] beside tokens/s, and SD's energy ratio next to its speedup."""
    lines = [
        "Energy per output token of the timed calls (the meter's counter read before and after every call: "
        "`nvml` the engine's GPUs, `rapl` the CPU packages; \"not measured\" where none exists). "
        "Energy ratio = SD's joules per token over no SD's, computed as the speedup is [95% interval]; "
        "below 1 SD saves energy.",
        "",
        "| engine | model | dataset | method | batch | tok/s [95%] | J/token [95%] | mean W | speedup [95%] "
        "| energy ratio [95%] | meter |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table.itertuples(index=False):
        sd = r.sd_method != "none"
        power = NOT_MEASURED if math.isnan(r.mean_power_w) else f"{r.mean_power_w:.1f}"
        lines.append(
            f"| {r.engine} | {r.model} | {r.dataset} | {r.method} | {r.batch_size} "
            f"| {fmt_energy(r.tokens_per_s, r.tokens_per_s_ci_low, r.tokens_per_s_ci_high, '.1f')} "
            f"| {fmt_energy(r.joules_per_token, r.joules_per_token_ci_low, r.joules_per_token_ci_high)} | {power} "
            f"| {fmt_energy(r.speedup, r.speedup_ci_low, r.speedup_ci_high, '.2f') if sd else '1'} "
            f"| {fmt_energy(r.energy_ratio, r.energy_ratio_ci_low, r.energy_ratio_ci_high, '.2f') if sd else '1'} "
            f"| {r.energy_meter} |"
        )
    return "\n".join(lines + not_measured_lines(table)) + "\n\n" + power_model_line(table) + "\n"


def not_measured_lines(table: pd.DataFrame) -> list[str]:
    """The unmetered cells grouped by their ``energy_reason`` (none: no lines)."""
    unmetered = table[table["energy_meter"] == NOT_MEASURED]
    if unmetered.empty:
        return []
    lines = ["", "Not measured, and why:"]
    for reason, group in unmetered.groupby("energy_reason", sort=True):
        names = ", ".join(f"{r.method} bs{r.batch_size}" for r in group.itertuples(index=False))
        keys = sorted({f"{r.engine}/{r.model}/{r.dataset}" for r in group.itertuples(index=False)})
        lines.append(f"- {reason or NOT_RECORDED}: {len(group)} cell(s) ({', '.join(keys)}: {names})")
    return lines


def power_model_line(table: pd.DataFrame) -> str:
    """The power model fitted from the measured cells (sdbench.simulator.powermodel), or why none is."""
    from sdbench.simulator.powermodel import cell_power_points, fit_power_model

    points = cell_power_points(table)
    if points["tokens_per_step"].nunique() < 2 or len(points) < 3:
        return f"Power model: none ({len(points)} cell(s) with a meter; needs 3 at 2 or more batched-token counts)."
    return "Power model fitted from the cells' mean power: " + fit_power_model(
        points["tokens_per_step"], points["mean_power_w"]).describe() + "."


def plot_energy(table: pd.DataFrame, out_png: str | Path) -> pd.DataFrame:
    """Tokens per second (top) and joules per output token (bottom) vs batch size, one line per
    method with 95% intervals, a panel per engine x model x dataset. Returns the drawn table;
    cells without a meter draw no energy mark (y empty), and with none measured the axis says so."""
    from sdbench.plotting import method_lines

    unit = "joules / output token" + (f" ({NOT_MEASURED})" if table[JOULES_PER_TOKEN].isna().all() else "")
    return method_lines(table, out_png, panel_keys=["engine", "model", "dataset"], x="batch_size",
                        rows=[("tokens_per_s", "tokens_per_s_ci_low", "tokens_per_s_ci_high", "output tokens / s"),
                              (JOULES_PER_TOKEN, f"{JOULES_PER_TOKEN}_ci_low", f"{JOULES_PER_TOKEN}_ci_high", unit)],
                        xlabel="batch size", xlog=2)  # fmt: skip


def _cmd_energy(args: argparse.Namespace) -> int:
    table = energy_table(read_parquet(args.cells, what="cells table"))
    write_parquet(table, args.output)
    write_text(energy_markdown(table), args.markdown)
    plot_energy(table, args.figure)
    return 0
