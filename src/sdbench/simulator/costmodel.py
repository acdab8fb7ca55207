"""Step-time cost models for the simulator, stored as YAML data, and their least-squares fit.

A cost model predicts the wall time (seconds) of one engine step:

- target forward pass (verification, or prefill/plain decode):
  ``c_kv * tokens_in_kv_cache + c_compute * batched_tokens + c_fixed``, plus, where the model has a
  knee (``knee_tokens``, ``c_above_knee``: a hinge fitted by ``sdbench calibrate fit``),
  ``c_above_knee * max(0, batched_tokens - knee_tokens)``: a step that turns compute-bound past the knee;
- drafting, per drafter method (a key of ``drafters``):
  ``fraction_of_verify`` (n-gram lookup: ``fraction * verify_time``) or
  ``linear`` (learned drafters: ``c_kv * kv + c_spec * proposed_tokens + c_fixed``);
- a constant per-step overhead (scheduling, sampling, bookkeeping), and an optional cost for a
  request switching drafter between steps.

Models ship as package data, ``sdbench/data/cost_models/<name>.yaml`` (``$SDBENCH_DATA_DIR/cost_models/``
adds or shadows names, see :mod:`sdbench.packagedata`), and are validated against
:data:`COST_MODEL_SCHEMA` on load. ``sdbench costmodel fit`` fits one from per-step timings.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pandas as pd
import yaml

from sdbench import provenance
from sdbench.io import write_text
from sdbench.packagedata import data_file, list_data

_COEF = {"type": "number", "minimum": 0}
_TARGET_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["c_kv", "c_compute", "c_fixed"],
    "properties": {
        "c_kv": _COEF,
        "c_compute": _COEF,
        "c_fixed": _COEF,
        # The optional hinge: both or neither (a knee without its slope prices nothing).
        "knee_tokens": {"type": "number", "exclusiveMinimum": 0},
        "c_above_knee": _COEF,
    },
    "dependentRequired": {"knee_tokens": ["c_above_knee"], "c_above_knee": ["knee_tokens"]},
}
_DRAFTER_KINDS = {
    "fraction_of_verify": {"fraction": _COEF},
    "linear": {"c_kv": _COEF, "c_spec": _COEF, "c_fixed": _COEF},
}
# Dispatch on `kind` (if/then) rather than oneOf, so an error names the drafter's bad key.
_DRAFTER_SCHEMA = {
    "type": "object",
    "required": ["kind"],
    "properties": {"kind": {"enum": list(_DRAFTER_KINDS)}},
    "allOf": [
        {
            "if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
            "then": {
                "additionalProperties": False,
                "required": ["kind", *props],
                "properties": {"kind": {"const": kind}, **props},
            },
        }
        for kind, props in _DRAFTER_KINDS.items()
    ],
}
COST_MODEL_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "target", "drafters", "overhead_per_step"],
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9._-]+$"},
        "description": {"type": "string"},
        "source": {"type": "string"},
        "target": _TARGET_SCHEMA,
        "drafters": {"type": "object", "minProperties": 1, "additionalProperties": _DRAFTER_SCHEMA},
        "overhead_per_step": _COEF,
        "switching_overhead": _COEF,
        "fit": {"type": "object"},  # free-form provenance written by `costmodel fit`
    },
}

# Step-table columns consumed by the fit (one row per engine step).
STEP_COLUMNS: tuple[str, ...] = (
    "method",
    "batch_size",
    "num_batched_tokens",
    "num_kv_tokens",
    "num_proposed_tokens",
    "verify_s",
    "propose_s",
    "step_s",
)
# `method` values of steps run without speculative decoding (no drafter to fit).
NO_DRAFTER = frozenset({"", "none", "baseline", "no_sd"})
NGRAM_KIND_METHODS = frozenset({"ngram"})


@dataclass(frozen=True)
class TargetCost:
    """Target forward pass: ``c_kv * kv + c_compute * batched + c_fixed`` seconds, plus
    :meth:`hinge` where the model has a knee (``c_above_knee`` > 0)."""

    c_kv: float
    c_compute: float
    c_fixed: float
    knee_tokens: float = 0.0
    c_above_knee: float = 0.0

    def hinge(self, batched_tokens: Any) -> Any:
        """``c_above_knee * max(0, batched - knee_tokens)`` seconds; exactly 0.0 without a knee, so
        a linear model prices bit for bit as before. Elementwise on numpy arrays."""
        if self.c_above_knee == 0.0:
            return 0.0
        return self.c_above_knee * np.maximum(np.asarray(batched_tokens, dtype=float) - self.knee_tokens, 0.0)

    def time(self, kv_tokens: Any, batched_tokens: Any) -> Any:
        """Forward-pass seconds; works elementwise on numpy arrays."""
        return self.c_kv * kv_tokens + self.c_compute * batched_tokens + self.c_fixed + self.hinge(batched_tokens)

    def to_dict(self) -> dict[str, float]:
        """The YAML mapping of the target (the knee only where the model has one)."""
        out = {"c_kv": self.c_kv, "c_compute": self.c_compute, "c_fixed": self.c_fixed}
        if self.c_above_knee > 0.0:
            out.update(knee_tokens=self.knee_tokens, c_above_knee=self.c_above_knee)
        return out


@dataclass(frozen=True)
class DrafterCost:
    """One drafter's proposal cost (``kind`` is ``fraction_of_verify`` or ``linear``)."""

    kind: str
    fraction: float = 0.0
    c_kv: float = 0.0
    c_spec: float = 0.0
    c_fixed: float = 0.0

    def time(self, verify_s: Any, kv_tokens: Any, proposed_tokens: Any) -> Any:
        """Drafting seconds for one step; works elementwise on numpy arrays."""
        if self.kind == "fraction_of_verify":
            return self.fraction * verify_s
        return self.c_kv * kv_tokens + self.c_spec * proposed_tokens + self.c_fixed

    def to_dict(self) -> dict[str, Any]:
        """The YAML mapping of this drafter."""
        if self.kind == "fraction_of_verify":
            return {"kind": self.kind, "fraction": self.fraction}
        return {"kind": self.kind, "c_kv": self.c_kv, "c_spec": self.c_spec, "c_fixed": self.c_fixed}


@dataclass(frozen=True)
class CostModel:
    """A validated cost model (see the module docstring)."""

    name: str
    target: TargetCost
    drafters: Mapping[str, DrafterCost]
    overhead_per_step: float
    switching_overhead: float = 0.0
    description: str = ""
    source: str = ""
    fit: Mapping[str, Any] = field(default_factory=dict)

    def drafter(self, method: str) -> DrafterCost:
        """The cost of drafter ``method``; ``KeyError`` names the model and its drafters."""
        try:
            return self.drafters[method]
        except KeyError:
            raise KeyError(
                f"cost model {self.name!r} has no drafter {method!r} (has: {', '.join(sorted(self.drafters))})"
            ) from None

    def to_dict(self) -> dict[str, Any]:
        """The YAML mapping of this model (validates against :data:`COST_MODEL_SCHEMA`)."""
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        if self.source:
            out["source"] = self.source
        out["target"] = self.target.to_dict()
        out["drafters"] = {m: d.to_dict() for m, d in self.drafters.items()}
        out["overhead_per_step"] = self.overhead_per_step
        out["switching_overhead"] = self.switching_overhead
        if self.fit:
            out["fit"] = dict(self.fit)
        return out

    def digest(self) -> str:
        """sha256 of the model's canonical YAML (keys sorted): which model priced a simulation,
        the same for the same coefficients whatever the file's comments or key order."""
        import hashlib

        text = yaml.safe_dump(self.to_dict(), sort_keys=True, default_flow_style=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _key_path(path: Any) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def cost_model_from_dict(data: Any, source: str = "<dict>") -> CostModel:
    """Validate ``data`` against the schema and build a :class:`CostModel`.

    Raises ``ValueError`` naming ``source`` and the offending key.
    """
    validator = jsonschema.Draft202012Validator(COST_MODEL_SCHEMA)
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        raise ValueError(f"{source}: {_key_path(err.absolute_path)}: {err.message}")
    drafters = {m: DrafterCost(**spec) for m, spec in data["drafters"].items()}
    return CostModel(
        name=data["name"],
        target=TargetCost(**data["target"]),
        drafters=drafters,
        overhead_per_step=float(data["overhead_per_step"]),
        switching_overhead=float(data.get("switching_overhead", 0.0)),
        description=data.get("description", ""),
        source=data.get("source", ""),
        fit=data.get("fit", {}),
    )


def available_cost_models() -> list[str]:
    """Names of the cost models available by name: shipped ones plus ``$SDBENCH_DATA_DIR/cost_models``."""
    return [name.removesuffix(".yaml") for name in list_data("cost_models")]


def resolve_cost_model_path(name_or_path: str | os.PathLike[str]) -> Path | Traversable:
    """A path to a YAML file, or the file of a cost model name (see :func:`available_cost_models`)."""
    path = Path(name_or_path)
    # A YAML suffix or a directory part means a path; anything else is a name.
    if path.suffix in (".yaml", ".yml") or path.is_file() or path.name != str(name_or_path):
        if not path.is_file():
            raise FileNotFoundError(f"cost model file {path} does not exist")
        return path
    try:
        return data_file("cost_models", f"{name_or_path}.yaml")
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"no cost model named {str(name_or_path)!r} "
            f"(available: {', '.join(available_cost_models()) or 'none'}; or pass a YAML path)"
        ) from exc


def load_cost_model(name_or_path: str | os.PathLike[str]) -> CostModel:
    """Load and validate a cost model by name (see :func:`available_cost_models`) or YAML path."""
    from sdbench.errors import describe_yaml_error

    path = resolve_cost_model_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path}: not a text file ({exc.reason} at byte {exc.start}; expected a cost-model YAML)"
        ) from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {describe_yaml_error(exc)}") from exc
    if not isinstance(data, dict):
        raise ValueError(
            f"{path}: expected a cost-model mapping (name, target, drafters, overhead_per_step), "
            f"got {'an empty file' if data is None else type(data).__name__}"
        )
    model = cost_model_from_dict(data, source=str(path))
    # A model fitted from rehearsal step tables is an input of a rehearsal (fit.measured, save_cost_model).
    provenance.observe(None, str(path), measured=model.fit.get("measured") is not False)
    return model


def dump_cost_model(model: CostModel) -> str:
    """YAML text of ``model`` (keys in schema order)."""
    return yaml.safe_dump(model.to_dict(), sort_keys=False, default_flow_style=False)


def save_cost_model(model: CostModel, path: str | os.PathLike[str]) -> None:
    """Validate and write ``model`` to ``path`` atomically; fitted by an analysis command, its
    ``fit.measured`` says whether its step tables were measured (:mod:`sdbench.provenance`)."""
    if provenance.stamping():
        model = CostModel(**{**model.__dict__, "fit": {**model.fit, "measured": provenance.measured()}})
    cost_model_from_dict(model.to_dict(), source=str(path))
    write_text(dump_cost_model(model), path)


# ----------------------------------------------------------------------------- fitting
def r_squared(y: np.ndarray, y_hat: np.ndarray) -> float:
    """Coefficient of determination (NaN when ``y`` is constant or empty)."""
    ss_tot = float(np.sum((y - y.mean()) ** 2)) if len(y) else 0.0
    if ss_tot == 0.0:
        return math.nan
    return 1.0 - float(np.sum((y - y_hat) ** 2)) / ss_tot


def _lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return coef


def read_step_table(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a per-step timing table (parquet or CSV) and check :data:`STEP_COLUMNS`."""
    from sdbench.io import read_parquet

    path = Path(path)
    if path.suffix == ".csv":
        if not path.is_file():
            raise FileNotFoundError(2, "no such file (expected a step table)", str(path))
        try:
            df = pd.read_csv(path)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: not a readable CSV step table ({' '.join(str(exc).split())})") from exc
        provenance.observe(df, path)
    else:
        df = read_parquet(path, what="step table")
    missing = [c for c in STEP_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: step table lacks column(s) {', '.join(missing)}")
    if df.empty:
        raise ValueError(f"{path}: step table has no rows")
    return df


def one_target(steps: pd.DataFrame, what: str = "cost-model fit") -> None:
    """Refuse step timings of more than one engine x model (``engine``/``model`` columns, where
    present): a cost model prices one target's steps, and pooled steps of two fit neither."""
    keys = [c for c in ("engine", "model") if c in steps.columns]
    pairs = sorted(map(tuple, steps[keys].drop_duplicates().astype(str).to_numpy())) if keys else []
    if len(pairs) > 1:
        named = ", ".join("/".join(p) for p in pairs)
        raise ValueError(f"{what}: steps of {len(pairs)} engine x model pairs ({named}); one at a time")


def fit_cost_model(steps: pd.DataFrame, name: str, source: str = "") -> CostModel:
    """Least-squares fit of a cost model to per-step timings (columns :data:`STEP_COLUMNS`).

    - target: ``verify_s ~ c_kv*num_kv_tokens + c_compute*num_batched_tokens + c_fixed`` over
      all steps;
    - n-gram: ``propose_s ~ fraction * verify_s`` (through the origin) over its steps;
    - every other drafter method: ``propose_s ~ c_kv*kv + c_spec*num_proposed_tokens + c_fixed``;
    - overhead: mean of ``step_s - verify_s - propose_s``.

    R^2 per component, plus of the whole step time, is recorded in ``fit``. Negative fitted
    coefficients (possible with noisy data) are clipped to 0 with the R^2 computed after clipping.
    """
    missing = [c for c in STEP_COLUMNS if c not in steps.columns]
    if missing:
        raise ValueError(f"step table lacks column(s) {', '.join(missing)}")
    one_target(steps)
    df = steps.copy()
    df["method"] = df["method"].fillna("").astype(str)
    df["propose_s"] = df["propose_s"].fillna(0.0).astype(float)
    for col in ("num_kv_tokens", "num_batched_tokens", "num_proposed_tokens", "verify_s", "step_s"):
        df[col] = df[col].fillna(0).astype(float)

    kv, batched, verify = df["num_kv_tokens"].to_numpy(), df["num_batched_tokens"].to_numpy(), df["verify_s"].to_numpy()
    x = np.column_stack([kv, batched, np.ones(len(df))])
    t = np.clip(_lstsq(x, verify), 0.0, None)
    target = TargetCost(c_kv=float(t[0]), c_compute=float(t[1]), c_fixed=float(t[2]))
    r2: dict[str, float] = {"target": r_squared(verify, target.time(kv, batched))}
    n_steps: dict[str, int] = {"target": len(df)}

    drafters: dict[str, DrafterCost] = {}
    for method in sorted(set(df["method"]) - NO_DRAFTER):
        sub = df[df["method"] == method]
        y = sub["propose_s"].to_numpy()
        if method in NGRAM_KIND_METHODS:
            v = sub["verify_s"].to_numpy()
            denom = float(np.dot(v, v))
            frac = max(float(np.dot(v, y)) / denom, 0.0) if denom > 0 else 0.0
            drafters[method] = DrafterCost(kind="fraction_of_verify", fraction=frac)
        else:
            xd = np.column_stack([sub["num_kv_tokens"], sub["num_proposed_tokens"], np.ones(len(sub))])
            c = np.clip(_lstsq(xd, y), 0.0, None)
            drafters[method] = DrafterCost(kind="linear", c_kv=float(c[0]), c_spec=float(c[1]), c_fixed=float(c[2]))
        d = drafters[method]
        r2[method] = r_squared(
            y,
            d.time(sub["verify_s"].to_numpy(), sub["num_kv_tokens"].to_numpy(), sub["num_proposed_tokens"].to_numpy()),
        )
        n_steps[method] = len(sub)
    if not drafters:
        raise ValueError(
            "step table has no speculative-decoding steps (every method is one of "
            f"{sorted(NO_DRAFTER)}): cannot fit a drafter"
        )

    residual = df["step_s"].to_numpy() - verify - df["propose_s"].to_numpy()
    overhead = max(float(residual.mean()), 0.0)
    model = CostModel(name=name, target=target, drafters=drafters, overhead_per_step=overhead, source=source)
    predicted = predict_step_times(model, df)
    r2["step"] = r_squared(df["step_s"].to_numpy(), predicted)
    fit = {
        "method": "least squares (numpy.linalg.lstsq)",
        "n_steps": n_steps,
        "r2": {k: (None if math.isnan(v) else round(v, 6)) for k, v in r2.items()},
        "overhead_residual_std_s": float(residual.std()),
    }
    return CostModel(**{**model.__dict__, "fit": fit})


def predict_step_times(model: CostModel, steps: pd.DataFrame) -> np.ndarray:
    """Predicted ``step_s`` of each row of a step table under ``model``."""
    kv = steps["num_kv_tokens"].to_numpy(float)
    verify = model.target.time(kv, steps["num_batched_tokens"].to_numpy(float))
    draft = np.zeros(len(steps))
    methods = steps["method"].fillna("").astype(str).to_numpy()
    proposed = steps["num_proposed_tokens"].fillna(0).to_numpy(float)
    for method in set(methods) - NO_DRAFTER:
        m = methods == method
        draft[m] = model.drafter(method).time(verify[m], kv[m], proposed[m])
    return verify + draft + model.overhead_per_step


# ----------------------------------------------------------------------------- CLI
def _format_fit(model: CostModel) -> str:
    t = model.target
    lines = [
        f"cost model {model.name}",
        f"  target: c_kv={t.c_kv:.6e} c_compute={t.c_compute:.6e} c_fixed={t.c_fixed:.6e}"
        + (f" knee_tokens={t.knee_tokens:.6g} c_above_knee={t.c_above_knee:.6e}" if t.c_above_knee > 0 else ""),
    ]
    for m, d in model.drafters.items():
        if d.kind == "fraction_of_verify":
            lines.append(f"  drafter {m}: fraction={d.fraction:.6e}")
        else:
            lines.append(f"  drafter {m}: c_kv={d.c_kv:.6e} c_spec={d.c_spec:.6e} c_fixed={d.c_fixed:.6e}")
    lines.append(f"  overhead_per_step={model.overhead_per_step:.6e}")
    for comp, r2 in model.fit.get("r2", {}).items():
        lines.append(
            f"  R^2 {comp}: {'n/a' if r2 is None else f'{r2:.4f}'} ({model.fit['n_steps'].get(comp, model.fit['n_steps']['target'])} steps)"
        )
    return "\n".join(lines)


def _cmd_fit(args: argparse.Namespace) -> int:
    steps = pd.concat([read_step_table(p) for p in args.steps], ignore_index=True)
    if args.method_column != "method":
        if args.method_column not in steps.columns:
            raise ValueError(f"step tables lack the method column {args.method_column!r}")
        steps["method"] = steps[args.method_column]
    model = fit_cost_model(steps, args.name, source=f"fit from {len(args.steps)} step table(s)")
    save_cost_model(model, args.output)
    print(_format_fit(model))
    print(f"wrote {args.output}")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    print(dump_cost_model(load_cost_model(args.model)), end="")
    return 0

