"""Which simulator policies each workflow step runs, from the config's ``simulator`` block.

Standard library only: the Snakefile reads these while it builds the DAG.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Fitted on other datasets' traces: needs at least two traced datasets.
CROSS_DATASET_POLICIES = ("combined:learned",)
# Policies the published simulator (compat mode) does not have.
EXACT_ONLY_POLICIES = ("adaptive",)


def published_policies(config: dict[str, Any], proposer: str, mode: str) -> list[str]:
    """Policies of a proposer on the published traces in ``mode`` (compat drops exact-only ones)."""
    policies = list(config["simulator"]["published_policies"][proposer])
    if mode == "compat":
        policies = [p for p in policies if p not in EXACT_ONLY_POLICIES]
    return policies


def cell_policies(config: dict[str, Any], proposer: str) -> list[str]:
    """Policies of a proposer on the grid's own traces."""
    return list(config["simulator"]["cell_policies"][proposer])


def adaptive_policies(config: dict[str, Any], num_datasets: int) -> list[str]:
    """``<proposer>:<policy>`` specs of the adaptive report over ``num_datasets`` traced datasets."""
    specs = list(config["simulator"]["adaptive_policies"])
    if num_datasets < 2:
        specs = [s for s in specs if s not in CROSS_DATASET_POLICIES]
    return specs


# The simulator's learned proposer replays the paper's EAGLE where it was traced.
DRAFTER_PREFERENCE = {"eagle": 0, "eagle3": 1}


def validation_targets(config: dict[str, Any], traces: Iterable[Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Engine x model x dataset whose in-engine traces (``traces``: items with ``engine``,
    ``model``, ``dataset``, ``method``) hold an n-gram method and at least one learned or
    draft-model drafter: ``{"ngram": method, "drafters": [methods, preferred first],
    "drafter": the preferred one}``, sorted by key."""
    kinds: dict[tuple[str, str, str], dict[str, Any]] = {}
    for t in traces:
        entry = kinds.setdefault((t.engine, t.model, t.dataset), {"drafters": []})
        if config["methods"][t.method]["method"] == "ngram":
            entry["ngram"] = t.method
        else:
            entry["drafters"].append(t.method)
    for entry in kinds.values():
        entry["drafters"].sort(key=lambda m: (DRAFTER_PREFERENCE.get(config["methods"][m]["method"], 2), m))
        if entry["drafters"]:
            entry["drafter"] = entry["drafters"][0]
    return {k: v for k, v in sorted(kinds.items()) if "ngram" in v and "drafter" in v}


# ----------------------------------------------------------------------------- adaptive policies
ADAPTIVE_SPECS: tuple[str, ...] = (
    "combined:adaptive",
    "combined:learned",
    "combined:trust",
    "combined:ngram-else-eagle",
    "eagle:adaptive",
    "eagle:dynamic-k",
)
