"""Simulator validation: simulated vs measured speedup for the cells of a real run.

The simulator replays a cell's own in-engine traces under the cost model fitted from
the same machine's breakdown runs, with the cell's proposer and fixed draft length;
the measured speedup comes from the run-cell throughput, with its 95% bootstrap
interval; ``agrees`` says whether the simulated speedup lies inside that interval.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import pandas as pd

from sdbench.columns import conform
from sdbench.io import read_csv, read_parquet, write_parquet, write_text

COLUMNS: tuple[str, ...] = (
    "engine", "model", "dataset", "method", "batch_size", "drafter", "measured_speedup", "measured_speedup_ci_low",
    "measured_speedup_ci_high", "simulated_speedup", "contaminated", "ratio", "agrees",
)  # fmt: skip
# vLLM method -> simulator proposer (any learned drafter stands in for "eagle").
PROPOSER = {"ngram": "ngram", "eagle": "eagle", "eagle3": "eagle", "draft_model": "eagle", "mtp": "eagle"}


def simulated_policy(method: dict[str, Any]) -> tuple[str, str] | None:
    """(proposer, policy) the simulator uses for a config method entry; ``None`` for no SD."""
    name = method["method"]
    if name == "none" or name not in PROPOSER:
        return None
    return PROPOSER[name], f"fixed-{int(method['num_speculative_tokens'])}"


def compare(
    cells: pd.DataFrame,
    simulated: pd.DataFrame,
    methods: dict[str, dict[str, Any]],
) -> pd.DataFrame:
    """Join measured cells with simulated speedups of the same engine x model x dataset x method x
    batch size.

    ``simulated`` holds the simulations of several engines and models (one ``sdbench simulate
    --engine E --model M`` output per engine x model x dataset and proposer): a cell is matched to
    its own engine and model's only (the same dataset's traces of another model accept otherwise
    and its cost model prices other steps). Raises ``ValueError`` when ``simulated`` has no
    ``engine``/``model`` column, or when more than one simulated row matches a cell.

    A learned-drafter cell is compared only with the simulation that replayed its own
    drafter's trace (the ``drafter`` column of ``sdbench simulate`` output, a vLLM method):
    another drafter (EAGLE-3 beside EAGLE) accepts differently and would be judged on the
    wrong trace. Cells whose drafter was not traced are not judged.
    """
    missing = [c for c in ("engine", "model") if c not in simulated]
    if missing:
        raise ValueError(
            f"simulated rows lack column(s) {', '.join(missing)}: a cell cannot be matched to its own engine and "
            "model's simulation (write them with sdbench simulate --engine E --model M)"
        )
    rows = []
    for cell in cells.itertuples():
        key = simulated_policy(methods[cell.method])
        if key is None or "forced_acceptance_length" in methods[cell.method]:
            continue  # no SD, or acceptance forced: not what its drafter's trace accepts
        match = simulated[
            (simulated["engine"] == cell.engine)
            & (simulated["model"] == cell.model)
            & (simulated["dataset"] == cell.dataset)
            & (simulated["proposer"] == key[0])
            & (simulated["policy"] == key[1])
            & (simulated["batch_size"] == cell.batch_size)
        ]
        if key[0] != "ngram":
            drafters = match["drafter"] if "drafter" in match else pd.Series("", index=match.index)
            match = match[drafters == methods[cell.method]["method"]]
        if match.empty:
            continue
        if len(match) > 1:
            name = "/".join(str(getattr(cell, k)) for k in ("engine", "model", "dataset", "method"))
            raise ValueError(f"cell {name}/bs{cell.batch_size}: {len(match)} simulated rows match it (expected one)")
        rows.append(
            {
                "engine": cell.engine,
                "model": cell.model,
                "dataset": cell.dataset,
                "method": cell.method,
                "batch_size": cell.batch_size,
                "drafter": "" if key[0] == "ngram" else methods[cell.method]["method"],
                "measured_speedup": cell.speedup,
                "measured_speedup_ci_low": getattr(cell, "speedup_ci_low", float("nan")),
                "measured_speedup_ci_high": getattr(cell, "speedup_ci_high", float("nan")),
                "simulated_speedup": float(match["speedup"].iloc[0]),
                "contaminated": bool(getattr(cell, "contaminated", False)),
            }
        )
    out = pd.DataFrame(rows)
    if out.empty:
        return conform(out, COLUMNS, "simulated vs measured")
    if not out.empty:
        out["ratio"] = out["simulated_speedup"] / out["measured_speedup"]
        # Agreement: the simulated speedup lies inside the measured 95% interval; a cell
        # without an interval (one trial) cannot be judged.
        inside = (out["simulated_speedup"] >= out["measured_speedup_ci_low"]) & (
            out["simulated_speedup"] <= out["measured_speedup_ci_high"]
        )
        out["agrees"] = inside.where(out["measured_speedup_ci_low"].notna())
    out = out.sort_values(["engine", "model", "dataset", "method", "batch_size"]).reset_index(drop=True)
    return conform(out, COLUMNS, "simulated vs measured")


def _cmd_validate(args: argparse.Namespace) -> int:
    cells = read_parquet(args.cells, what="cells table")
    simulated = pd.concat([read_csv(p, "simulator table") for p in args.simulated], ignore_index=True)
    table = compare(cells, simulated, json.loads(args.methods))
    write_parquet(table, args.output)
    write_text(table.to_markdown(index=False, floatfmt=".2f") + "\n", args.markdown)
    return 0

