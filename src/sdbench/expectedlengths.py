"""A dataset's expected request lengths: one per dataset, for every estimate that needs one.

The runtime and memory estimates (:mod:`sdbench.scheduling`), the KV check on expected residency
(:func:`sdbench.analysis.memory.residency_tokens`) and the rehearsal's stand-in outputs
(:func:`sdbench.rehearsal.prepare.expected_outputs`) all read the lengths here, so that a
rehearsal, a check and a job's request assume the same workload. Apart from the scheduler so that
the KV check (imported while the grid is built) does not import it.
"""

from __future__ import annotations

from typing import Any

# A dataset entry without expected_prompt_tokens (nor max_prompt_tokens): an allowance.
DEFAULT_PROMPT_TOKENS = 1024
# Dataset keys that only size jobs: no job's params hold them, so editing them reruns nothing.
SIZING_KEYS = frozenset({"expected_output_tokens", "expected_prompt_tokens"})


def prompt_tokens(config: dict[str, Any], dataset: str) -> int:
    """A dataset's expected prompt length: ``expected_prompt_tokens``, else its ``matched_to``
    dataset's (random-token controls), else ``max_prompt_tokens``, else :data:`DEFAULT_PROMPT_TOKENS`."""
    entry = config["datasets"][dataset]
    if entry.get("expected_prompt_tokens"):
        return int(entry["expected_prompt_tokens"])
    if entry.get("matched_to") in config["datasets"]:
        return prompt_tokens(config, entry["matched_to"])
    return int(entry.get("max_prompt_tokens") or DEFAULT_PROMPT_TOKENS)


def output_tokens(config: dict[str, Any], dataset: str, run: dict[str, Any] | None = None) -> int:
    """A request's expected output length: ``max_tokens`` when outputs ignore EOS, else the
    dataset's ``expected_output_tokens`` (the workload's mean, a stated estimate) within ``max_tokens``."""
    entry = config["datasets"][dataset]
    budget = int(entry["max_tokens"])
    if (run if run is not None else config.get("run", {})).get("ignore_eos"):
        return budget
    return min(budget, int(entry.get("expected_output_tokens") or budget))
