"""Which simulator policies each workflow step runs, from the config's ``simulator`` block.

Standard library only: the Snakefile reads these while it builds the DAG.
"""

from __future__ import annotations

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
