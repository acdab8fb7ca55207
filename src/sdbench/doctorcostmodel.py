"""``sdbench doctor``'s cost-model check: the cost models a run would be priced by, validated.

The models are ``--cost-model`` (``sdbench doctor --cost-model X``: what ``sdbench simulate`` or
``calibrate check`` will read) and the config's ``rehearsal_cost_model`` (what a rehearsal prices
its steps by). Each is loaded against the schema (:func:`sdbench.simulator.costmodel.load_cost_model`)
and its line says where it came from: its source, the device its calibration table was timed on
and the fit's held-out error (``sdbench calibrate fit``), or that it has none. A model whose held-out
largest error exceeds :data:`HELDOUT_MAX` passes with that said: a cost model prices, a doctor
does not judge it; a file that does not load fails with the loader's message.
"""

from __future__ import annotations

from typing import Any

from sdbench.doctorcore import Result, failed, ok

# A calibration fit good enough to price a grid: held-out median error <= 5%, largest <= 10%.
HELDOUT_MEDIAN, HELDOUT_MAX = 0.05, 0.10


def describe(model: Any) -> str:
    """Source, device and held-out error of a loaded cost model, in one clause."""
    fit = dict(model.fit or {})
    time = fit.get("time") or {}
    chosen = (time.get("shapes") or {}).get(time.get("chosen", ""), {})
    parts = [f"source {model.source or 'not stated'}"]
    if "heldout_median" in chosen:
        med, top = float(chosen["heldout_median"]), float(chosen["heldout_max"])
        within = "within" if med <= HELDOUT_MEDIAN and top <= HELDOUT_MAX else "outside"
        parts += [f"device {fit.get('device', 'not recorded')}",
                  f"{time['chosen']} held-out median {med:.1%}, largest {top:.1%} ({within} "
                  f"{HELDOUT_MEDIAN:.0%} / {HELDOUT_MAX:.0%})"]  # fmt: skip
    else:
        parts.append("not a calibration (no held-out error)")
    return "; ".join(parts)


def cost_model_check(name: str, what: str) -> Result:
    """One named cost model (``what``: where it is named): loads and validates, or fails."""
    from sdbench.simulator.costmodel import load_cost_model

    check = f"cost model ({what})"
    try:
        model = load_cost_model(name)
    except (OSError, ValueError) as exc:
        return failed(check, str(exc), "give a cost model name (sdbench costmodel show) or a YAML that "
                      "sdbench calibrate fit / costmodel fit wrote")  # fmt: skip
    return ok(f"{check}: {model.name} ({name}), sha256 {model.digest()[:12]}; {describe(model)}")


def cost_model_checks(site: Any) -> list[Result]:
    """The check of every cost model the site names (none named: no line)."""
    named = []
    if getattr(site, "cost_model", None):
        named.append((str(site.cost_model), "--cost-model"))
    config = getattr(site, "config", None) or {}
    if config.get("rehearsal_cost_model"):
        named.append((str(config["rehearsal_cost_model"]), "config rehearsal_cost_model"))
    return [cost_model_check(name, what) for name, what in named]
