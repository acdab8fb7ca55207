"""The step energy model's report: held-out errors before (the watts model of
:mod:`sdbench.simulator.powermodel`) and after (:mod:`sdbench.simulator.stepenergy`), implied
watts, and the ``fit``/``report`` command.

Apart from the model so that the model imports neither the old one nor its file format
(:mod:`powermodel` loads step energy files: the two would import each other).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sdbench.simulator.powermodel import fit_power_model, save_power_model
from sdbench.simulator.stepenergy import (
    _nk,
    every_4th,
    fit_step_energy,
    implied_watts,
    relative_errors,
    table_rows,
)


# ----------------------------------------------------------------------------- before and after
def heldout_errors(table: pd.DataFrame) -> pd.DataFrame:
    """Held-out relative errors of the old model on its own quantity (watts = joules / ms, the
    Hill curve against batched tokens) and of this one on joules: rule ``every 4th`` and
    ``context out`` (each L whose others keep 8 rows, predicted from them), one row per rule x model with
    the median and largest error, the held-out rows and the chosen form."""
    rows, _ = table_rows(table)
    rules: list[tuple[str, list[np.ndarray]]] = [("every 4th", [every_4th(rows)])]
    # A context out where the others keep 8 rows or more (the fit needs rows to choose its form):
    # on the shared tables L = 4096 predicted from the L = 1024 rows, a context it never saw.
    outs = [(rows["L"] == c).to_numpy() for c in sorted(rows["L"].unique())]
    outs = [hold for hold in outs if (~hold).sum() >= 8 and len(outs) > 1]
    if outs:
        rules.append(("context out", outs))
    out = []
    watts = rows["joules"].to_numpy(float) / (rows["ms"].to_numpy(float) / 1e3)
    tokens = _nk(rows)[0]
    for rule, holds in rules:
        before, after, forms = [], [], []
        for hold in holds:
            old = fit_power_model(tokens[~hold], watts[~hold])
            before.append(np.abs(old.watts(tokens[hold]) - watts[hold]) / watts[hold])
            new = fit_step_energy(rows[~hold])
            forms.append(new.form)
            after.append(relative_errors(new, rows[hold]))
        for model, errs, quantity, form in (("before", before, "watts = joules / ms", "Hill P(B q)"),
                                            ("after", after, "joules", "/".join(sorted(set(forms))))):  # fmt: skip
            e = np.concatenate(errs)
            out.append({"rule": rule, "model": model, "quantity": quantity, "form": form, "heldout_rows": len(e),
                        "median": float(np.median(e)), "largest": float(e.max())})  # fmt: skip
    return pd.DataFrame(out)


# ----------------------------------------------------------------------------- command
def report(paths: list[str], board_limit_w: float = 700.0) -> str:
    """Markdown: per table the chosen model, the held-out errors before and after, and the implied watts."""
    lines = ["| table | rule | model | quantity | held-out rows | median error | largest error |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    notes = []
    for path in paths:
        t = pd.read_csv(path)
        name = path.rsplit("/", 1)[-1]
        for r in heldout_errors(t).itertuples(index=False):
            lines.append(f"| {name} | {r.rule} | {r.model} ({r.form}) | {r.quantity} | {r.heldout_rows} "
                         f"| {100 * r.median:.1f}% | {100 * r.largest:.1f}% |")  # fmt: skip
        model = fit_step_energy(t, name)
        watts, what = implied_watts(model, t)
        rows, _ = table_rows(t)
        raw = rows["joules"].to_numpy(float) / (rows["ms"].to_numpy(float) / 1e3)
        over = watts > board_limit_w
        slow = np.max(model.joules(*_nk(rows)) / board_limit_w / (rows["ms"].to_numpy(float) / 1e3)) - 1
        notes += [f"- {name}: {model.label()}",
                  f"  - implied watts ({what}): {watts.min():.0f}-{watts.max():.0f} W, {int(over.sum())} of "
                  f"{len(watts)} rows above the {board_limit_w:g} W board limit"
                  + (f" (for those rows the energy window's steps must have run at least {100 * slow:.0f}% slower "
                     "than the 20-replay median)" if over.any() else ""),
                  f"  - measured joules / ms: {raw.min():.0f}-{raw.max():.0f} W, {int((raw > board_limit_w).sum())} "
                  f"above {board_limit_w:g} W"]  # fmt: skip
    return "\n".join(lines + [""] + notes) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m sdbench.simulator.stepenergyreport fit TABLE --output FILE.json`` (a model file for
    ``sdbench simulate --power-model``) or ``report TABLE...`` (held-out errors and implied watts)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m sdbench.simulator.stepenergyreport", description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("fit", help="fit a step energy model to a table (B, q, L, joules[, ms, same_window])")
    fit.add_argument("table")
    fit.add_argument("--output", required=True)
    rep = sub.add_parser("report", help="held-out errors before/after and implied watts, as Markdown")
    rep.add_argument("tables", nargs="+")
    rep.add_argument("--board-limit-w", type=float, default=700.0)
    args = parser.parse_args(argv)
    if args.command == "fit":
        model = fit_step_energy(pd.read_csv(args.table), args.table)
        save_power_model(model, args.output)
        print(f"{model.label()}\nwrote {args.output}")
    else:
        print(report(args.tables, args.board_limit_w), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
