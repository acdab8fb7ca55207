"""Sweeps: grid blocks derived from a config section, so a sweep is part of the same DAG.

``proposal_length`` runs each listed SD method with every ``num_speculative_tokens`` value.
Each value becomes a method entry ``<method>.k<k>`` (a copy of the base entry with that k,
marked ``sweep_of``), or reuses an entry that already says exactly that (the base method at
its own k, or e.g. ``ngram-k5`` for ``ngram-k3`` at k=5), and the sweep adds one grid block
(marked ``sweep: proposal_length``) with those methods and the no-SD baseline. The cells are
ordinary cells: engine groups, pairing, memory accounting and Snakemake's rerun logic apply
unchanged. Expanding is idempotent, so a resolved config (e.g. the bundle's) validates again.
"""

from __future__ import annotations

import copy
from typing import Any

PROPOSAL_LENGTH = "proposal_length"
# Keys that do not change what an engine runs.
_COSMETIC = ("label", "sweep_of")


def method_key(base: str, k: int) -> str:
    """The key of ``base`` run with ``k`` speculative tokens."""
    return f"{base}.k{k}"


def _same_engine_args(a: dict[str, Any], b: dict[str, Any]) -> bool:
    strip = lambda m: {k: v for k, v in m.items() if k not in _COSMETIC}  # noqa: E731
    return strip(a) == strip(b)


def proposal_length_methods(config: dict[str, Any]) -> dict[str, tuple[str, int]]:
    """Method key -> (base method, k) of every point of the proposal-length sweep, sorted by base and k."""
    sweep = config.get(PROPOSAL_LENGTH)
    if not sweep:
        return {}
    points: dict[str, tuple[str, int]] = {}
    for base in sweep["methods"]:
        entry = config["methods"][base]
        for k in sorted(sweep["num_speculative_tokens"]):
            wanted = {**entry, "num_speculative_tokens": k}
            same = [
                name
                for name, other in sorted(config["methods"].items())
                if name == method_key(base, k) or _same_engine_args(other, wanted)
            ]
            # Prefer the base itself, then an existing hand-written entry, then the derived key.
            key = base if k == entry["num_speculative_tokens"] else next(
                (n for n in same if "sweep_of" not in config["methods"][n]), method_key(base, k)
            )
            points[key] = (base, k)
    return points


def sweep_problems(config: dict[str, Any]) -> list[str]:
    """Names a sweep refers to that do not exist (key paths under the sweep's section)."""
    sweep = config.get(PROPOSAL_LENGTH)
    if not sweep:
        return []
    problems = []
    if sweep["engine"] not in config["engines"]:
        problems.append(f"{PROPOSAL_LENGTH}.engine: unknown engine {sweep['engine']!r}")
    for key in ("models", "datasets", "methods"):
        for i, name in enumerate(sweep[key]):
            if name not in config[key]:
                problems.append(f"{PROPOSAL_LENGTH}.{key}[{i}]: unknown {key[:-1]} {name!r}")
            elif key == "methods" and config["methods"][name]["method"] == "none":
                problems.append(f"{PROPOSAL_LENGTH}.methods[{i}]: {name!r} is the no-SD baseline; it has no proposal length")
    return problems


def expand(config: dict[str, Any]) -> None:
    """Add the sweep's method entries and grid block to ``config`` (in place; idempotent).

    Call on a schema-valid config after :func:`sweep_problems` found nothing.
    """
    sweep = config.get(PROPOSAL_LENGTH)
    if not sweep or any(block.get("sweep") == PROPOSAL_LENGTH for block in config["grid"]):
        return
    points = proposal_length_methods(config)
    for key, (base, k) in points.items():
        if key not in config["methods"]:
            entry = copy.deepcopy(config["methods"][base])
            label = entry.get("label", base)
            entry.update(num_speculative_tokens=k, label=f"{label} @ k={k}", sweep_of=base)
            config["methods"][key] = entry
    baseline = sorted(name for name, m in config["methods"].items() if m["method"] == "none")
    config["grid"].append(
        {
            "sweep": PROPOSAL_LENGTH,
            "engine": sweep["engine"],
            "models": list(sweep["models"]),
            "methods": baseline[:1] + list(points),
            "datasets": list(sweep["datasets"]),
            "batch_sizes": list(sweep["batch_sizes"]),
        }
    )
