"""vLLM's speculative-decoding counters: the engine-wide cumulative counts read around a timed call,
and the per-request ones on each output.

Apart from the trial loop because the server-mode client (:mod:`sdbench.engine.serving.loadgen`) reads
the same counters from ``/metrics`` and the summary row derives acceptance from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

SD_COUNTERS = {
    "num_drafts": "vllm:spec_decode_num_drafts",
    "num_draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}
SD_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
# Requests the scheduler preempted (KV cache full: their blocks freed, recomputed later). A
# timed call with preemptions ran a smaller batch than the cell names for part of its steps.
PREEMPTIONS = "vllm:num_preemptions"


@dataclass
class SDCounters:
    """Cumulative SD counters of the engine at one instant (summed over label sets)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: tuple[int, ...] = ()
    num_preemptions: int = 0

    def __sub__(self, other: SDCounters) -> SDCounters:
        width = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        a = np.zeros(width, dtype=np.int64)
        b = np.zeros(width, dtype=np.int64)
        a[: len(self.accepted_per_pos)] = self.accepted_per_pos
        b[: len(other.accepted_per_pos)] = other.accepted_per_pos
        return SDCounters(
            self.num_drafts - other.num_drafts,
            self.num_draft_tokens - other.num_draft_tokens,
            self.num_accepted_tokens - other.num_accepted_tokens,
            tuple(int(x) for x in a - b),
            self.num_preemptions - other.num_preemptions,
        )


def read_counters(metrics: list[Any]) -> SDCounters:
    """Extract SD counters and preemptions from ``LLM.get_metrics()`` (Counter / Vector objects)."""
    totals = {field: 0 for field in SD_COUNTERS}
    preemptions = 0
    per_pos = np.zeros(0, dtype=np.int64)
    for metric in metrics:
        for field, name in SD_COUNTERS.items():
            if metric.name == name:
                totals[field] += int(metric.value)
        if metric.name == PREEMPTIONS:
            preemptions += int(metric.value)
        if metric.name == SD_PER_POS:
            values = np.asarray(metric.values, dtype=np.int64)
            if len(values) > len(per_pos):
                per_pos = np.pad(per_pos, (0, len(values) - len(per_pos)))
            per_pos[: len(values)] += values
    return SDCounters(**totals, accepted_per_pos=tuple(int(x) for x in per_pos), num_preemptions=preemptions)


def acceptance_stats(delta: SDCounters) -> dict[str, Any]:
    """Mean acceptance length (1 + accepted/drafts), rate, and rate per draft position."""
    if delta.num_drafts == 0:
        return {"mean_acceptance_length": np.nan, "acceptance_rate": np.nan, "acceptance_rate_per_pos": []}
    return {
        "mean_acceptance_length": 1.0 + delta.num_accepted_tokens / delta.num_drafts,
        "acceptance_rate": delta.num_accepted_tokens / max(delta.num_draft_tokens, 1),
        "acceptance_rate_per_pos": [x / delta.num_drafts for x in delta.accepted_per_pos],
    }


def request_sd_metrics(completion: Any) -> dict[str, Any]:
    """The engine's per-request SD counters of one completed output (``sd_*`` columns).

    Values are missing (None) where the engine offers none: no SD, or a vLLM before 0.32.
    ``sd_mean_acceptance_length`` counts the bonus token, as the aggregate counters do.
    """
    metrics = getattr(completion, "spec_decode_metrics", None)
    d = metrics.to_dict() if metrics is not None else {}
    return {
        "sd_num_steps": d.get("num_spec_steps"),
        "sd_num_draft_tokens": d.get("num_draft_tokens"),
        "sd_num_accepted_tokens": d.get("num_accepted_draft_tokens"),
        "sd_mean_acceptance_length": d.get("mean_acceptance_length") if d.get("num_spec_steps") else None,
    }


# ----------------------------------------------------------------------------- touchpoints
from sdbench.engine.release import touchpoints as tp  # noqa: E402 - standard library only


def _per_request_versions() -> list[str]:
    from sdbench.engine.release.versions import _KNOWN

    return [q.version for q in _KNOWN.values() if q.per_request_spec_metrics]


TOUCHPOINTS = tp.declare(
    __name__,
    tp.defined("llm.get_metrics", "vllm:LLM.get_metrics"),
    tp.fields("llm.metric_counter", "vllm.v1.metrics.reader:Counter", ["name", "value"]),
    tp.fields("llm.metric_vector", "vllm.v1.metrics.reader:Vector", ["name", "values"]),
    tp.strings("llm.metric_names", "vllm.v1.spec_decode.metrics", [*SD_COUNTERS.values(), SD_PER_POS, "position"]),
    tp.strings("llm.metric_preemptions", "vllm.v1.metrics.loggers", [PREEMPTIONS]),
    tp.fields("llm.per_request_metrics", "vllm.outputs:CompletionOutput", ["spec_decode_metrics"],
              versions=_per_request_versions()),
    tp.strings("llm.per_request_metrics_keys", "vllm.v1.metrics.stats",
               ["num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens", "mean_acceptance_length"],
               versions=_per_request_versions()),
)
