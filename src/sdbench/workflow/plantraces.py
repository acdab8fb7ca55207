"""The plan's traces and acceptance items, a part of :class:`sdbench.workflow.plan.Plan` (a mixin
whose attributes the plan's constructor sets): trace groups' cells and specs, the no-SD outputs the
offline tracers read and their files, the scopes of Fig. 4/5/10 with the trace tables and labels
behind each, and the published traces.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict
from typing import Any

from sdbench.figureindex import published_scope
from sdbench.grid import Cell, TraceGroup, TraceTarget, resolve_cell, trace_group_of
from sdbench.workflow import paths as P

# Method label of the offline suffix rows (distinct from an in-engine `suffix` trace).
OFFLINE_SUFFIX_METHOD = "suffix (offline)"


class TracePlan:
    """Traces, acceptance scopes and published traces of a plan."""

    # Set by Plan.__init__.
    config: dict[str, Any]
    traces: list[TraceTarget]
    trace_groups: dict[TraceGroup, list[TraceTarget]]
    trace_settings: dict[str, Any]
    baseline_cells: dict[tuple[str, str, str], Cell]
    offline_tracers: list[str]
    published: dict[str, Any]

    def trace_cells(self, group: TraceGroup) -> list[Cell]:
        """A trace group's traces as cells at the trace batch size."""
        bs = self.trace_settings["max_num_seqs"]
        return [Cell(t.engine, t.model, t.dataset, t.method, bs) for t in self.trace_groups[group]]

    def trace_group_spec(self, group: TraceGroup) -> dict[str, Any]:
        cells_ = self.trace_cells(group)
        return self._job_spec([resolve_cell(self.config, c, pairing=False) for c in cells_], cells_)

    def trace_group_dir(self, target: TraceTarget) -> str:
        return P.TRACE_GROUP_DIR.format(**trace_group_of(target).as_dict())

    def baseline_requests(self, engine: str, model: str, dataset: str) -> str:
        """No-SD greedy outputs (smallest batch size) of an engine x model x dataset."""
        return self.cell_file(self.baseline_cells[(engine, model, dataset)], "requests")

    def baseline_outputs(self, engine: str, model: str, dataset: str) -> dict[str, str]:
        """:meth:`baseline_requests` and the prompt table its ``request_id`` values name (the
        requests table holds no prompt ids; a temperature variant's prompts are its base's)."""
        cell = self.baseline_cells[(engine, model, dataset)]
        return {"requests": self.baseline_requests(engine, model, dataset),
                "prompts": self.prompt_tables([cell])[cell.dataset]}  # fmt: skip

    def offline_ngram_files(self) -> list[str]:
        if "ngram" not in self.offline_tracers:
            return []
        return [P.OFFLINE_NGRAM.format(engine=e, model=m, dataset=d) for (e, m, d) in sorted(self.baseline_cells)]

    def offline_suffix_files(self) -> list[str]:
        if "suffix" not in self.offline_tracers:
            return []
        return [P.OFFLINE_SUFFIX.format(engine=e, model=m, dataset=d) for (e, m, d) in sorted(self.baseline_cells)]

    def _offline_suffix_keys(self, targets: list[TraceTarget]) -> list[tuple[str, str, str]]:
        """(engine, model, dataset) of traced targets whose offline suffix trace joins their items."""
        if "suffix" not in self.offline_tracers:
            return []
        keys = {(t.engine, t.model, t.dataset) for t in targets}
        return sorted(k for k in keys if k in self.baseline_cells)

    def suffix_trace_args(self) -> str:
        """Options of ``sdbench trace suffix``: traces.suffix settings and the method label."""
        settings = self.trace_settings.get("suffix", {})
        args = [f"--method {shlex.quote(OFFLINE_SUFFIX_METHOD)}"]
        args += [f"--{key.replace('_', '-')} {settings[key]}" for key in sorted(settings)]
        return " ".join(args)

    def acceptance_scopes(self) -> list[str]:
        """Per-dataset scopes of Fig. 4/5: <engine>/<model>/<dataset> of the grid's traces, and
        published/<dataset> (sdbench.figureindex)."""
        grid = sorted({f"{t.engine}/{t.model}/{t.dataset}" for t in self.traces})
        return grid + [f"published/{d}" for d in self.published.get("datasets", [])]

    def difference_scopes(self) -> list[str]:
        """Scopes of Fig. 10: traces of both n-gram and EAGLE (every published dataset)."""
        kinds: dict[str, set[str]] = {}
        for t in self.traces:
            kinds.setdefault(f"{t.engine}/{t.model}/{t.dataset}", set()).add(self.config["methods"][t.method]["method"])
        return [s for s in self.acceptance_scopes() if kinds.get(s, {"ngram", "eagle"}) >= {"ngram", "eagle"}]

    def _scope_traces(self, key: str) -> tuple[list[TraceTarget], list[str]]:
        """(trace targets, published datasets) behind a {source} or {scope} of the index."""
        if key == "grid":
            return self.traces, []
        rest = published_scope(key)
        if rest is not None:
            return [], [rest] if rest else self.published.get("datasets", [])
        engine, model, dataset = key.split("/")
        return [t for t in self.traces if (t.engine, t.model, t.dataset) == (engine, model, dataset)], []

    def acceptance_traces(self, key: str) -> list[str]:
        """Trace tables behind an acceptance item (offline suffix traces after the in-engine ones,
        in the order of :meth:`acceptance_labels`)."""
        targets, published = self._scope_traces(key)
        suffix = [P.OFFLINE_SUFFIX.format(engine=e, model=m, dataset=d) for (e, m, d) in self._offline_suffix_keys(targets)]
        return (
            [P.ENGINE_TRACE.format(**asdict(t)) for t in targets]
            + suffix
            + [P.PUBLISHED_TRACE.format(published=d) for d in published]
        )

    def acceptance_labels(self, key: str) -> list[str]:
        """Names of the grid's traces <engine>/<model>/<dataset>: the tables key on them, so two
        engines or models on one dataset stay apart (published files name themselves)."""
        targets, _ = self._scope_traces(key)
        names = [f"{t.engine}/{t.model}/{t.dataset}" for t in targets]
        return names + [f"{e}/{m}/{d}" for (e, m, d) in self._offline_suffix_keys(targets)]

    def published_trace_files(self) -> list[str]:
        return [P.PUBLISHED_TRACE.format(published=d) for d in self.published.get("datasets", [])]

    def published_jsonl(self) -> list[str]:
        return [P.PUBLISHED_JSONL.format(published=d) for d in self.published.get("datasets", [])]
