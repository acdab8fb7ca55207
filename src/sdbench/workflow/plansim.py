"""The plan's BLEU items and simulations, a part of :class:`sdbench.workflow.plan.Plan` (a mixin
whose attributes the plan's constructor sets): the engine x model x dataset targets of Fig. 8 and of
the simulator's validation, the policies and inputs of each simulation, and the adaptive-policy
report's inputs and options.
"""

from __future__ import annotations

from typing import Any

from sdbench.figureindex import published_scope
from sdbench.grid import Cell
from sdbench.simulator import choices as simulator_choices
from sdbench.workflow import paths as P

SIM_PROPOSERS = ("ngram", "eagle", "combined")


class SimulatorPlan:
    """BLEU targets, simulator validation targets and the simulations' inputs of a plan."""

    # Set by Plan.__init__.
    config: dict[str, Any]
    cells: list[Cell]
    traces: list[Any]
    breakdown: list[Cell]
    baseline: str
    baseline_cells: dict[tuple[str, str, str], Cell]
    bleu: dict[str, Any] | None
    published: dict[str, Any]

    def bleu_targets(self) -> list[tuple[str, str, str]]:
        """Engine x model x dataset where the grid runs both BLEU-compared methods."""
        if not self.bleu:
            return []
        have = {(c.engine, c.model, c.dataset, c.method) for c in self.cells}
        return [k for k in sorted(self.baseline_cells)
                if (*k, self.bleu["ngram"]) in have and (*k, self.bleu["versus"]) in have]  # fmt: skip

    def bleu_calls(self, engine: str, model: str, dataset: str, name: str = "calls") -> list[str]:
        """One table (``calls`` or ``baseline_calls``) of each cell Fig. 8 measured reads, in one order."""
        methods = {self.baseline, self.bleu["ngram"], self.bleu["versus"]}
        return [self.cell_file(c, name) for c in self.cells
                if (c.engine, c.model, c.dataset) == (engine, model, dataset) and c.method in methods]  # fmt: skip

    def validation_targets(self) -> dict[tuple[str, str, str], dict[str, Any]]:
        return simulator_choices.validation_targets(self.config, self.traces)

    def priced_targets(self) -> dict[tuple[str, str, str], dict[str, Any]]:
        """The validation targets the fitted cost model prices: those of the engine x model whose
        breakdown steps fitted it (one pair, config check); another model's steps cost otherwise."""
        priced = {(c.engine, c.model) for c in self.breakdown}
        return {k: v for k, v in self.validation_targets().items() if k[:2] in priced}

    def sim_policies(self, proposer: str, mode: str) -> list[str]:
        return simulator_choices.published_policies(self.config, proposer, mode)

    def sim_trace_inputs(self, engine: str, model: str, dataset: str) -> dict[str, Any]:
        target = self.validation_targets()[(engine, model, dataset)]
        cell = {"engine": engine, "model": model, "dataset": dataset}
        return {
            "traces": [P.ENGINE_TRACE.format(**cell, method=m) for m in sorted([target["ngram"], *target["drafters"]])],
            "requests": P.ENGINE_REQUESTS.format(**cell, method=target["ngram"]),
        }

    def sim_figure_inputs(self, scope: str) -> list[str]:
        """Simulation results behind Fig. 9/11 of a scope: published/<mode> or E/M/D."""
        mode = published_scope(scope)
        if mode is not None:
            return [P.SIM_PUBLISHED.format(mode=mode, proposer=p) for p in SIM_PROPOSERS]
        engine, model, dataset = scope.split("/")
        return [P.SIM_CELL.format(engine=engine, model=model, dataset=dataset, proposer=p) for p in SIM_PROPOSERS]

    def sim_preferred_drafter(self, engine: str, model: str, dataset: str) -> str:
        """The vLLM method of the drafter the learned proposer replays on this dataset."""
        return self.config["methods"][self.validation_targets()[(engine, model, dataset)]["drafter"]]["method"]

    def sim_drafter(self, method: str) -> str:
        """The vLLM method of a traced drafter (what its trace rows are named)."""
        return self.config["methods"][method]["method"]

    def sim_cell_policies(self, proposer: str) -> list[str]:
        return simulator_choices.cell_policies(self.config, proposer)

    def sim_cell_batch_sizes(self, engine: str, model: str, dataset: str) -> list[int]:
        return sorted({c.batch_size for c in self.cells if (c.engine, c.model, c.dataset) == (engine, model, dataset)})

    def sim_cell_files(self) -> list[str]:
        """Simulations validated against the measured cells: n-gram, and every traced drafter
        that the fitted cost model prices (its method ran in breakdown mode)."""
        priced = {self.config["methods"][m]["method"] for m in self.config.get("breakdown", {}).get("methods", [])}
        files = []
        for (e, m, d), target in self.priced_targets().items():
            files.append(P.SIM_CELL.format(engine=e, model=m, dataset=d, proposer="ngram"))
            files += [P.SIM_DRAFTER.format(engine=e, model=m, dataset=d, method=x) for x in target["drafters"]
                      if self.config["methods"][x]["method"] in priced]  # fmt: skip
        return files

    def adaptive_cell_targets(self) -> dict[tuple[str, str], list[str]]:
        """Engine x model -> datasets with both in-engine traces (adaptive policies on the grid),
        of the engine x model the fitted cost model prices."""
        out: dict[tuple[str, str], list[str]] = {}
        for e, m, d in self.priced_targets():
            out.setdefault((e, m), []).append(d)
        return out

    def adaptive_inputs(self, scope: str) -> dict[str, Any]:
        """Traces of the adaptive-policy report of a scope: ``published``, or <engine>/<model>
        (this run's traces of every validated dataset, their requests, the fitted cost model)."""
        if published_scope(scope) is not None:
            return {"traces": self.published_jsonl()}
        engine, model = scope.split("/")
        targets = self.validation_targets()
        datasets = self.adaptive_cell_targets()[(engine, model)]
        return {
            "traces": [P.SIM_STACKED.format(engine=engine, model=model, dataset=d) for d in datasets],
            "requests": [P.ENGINE_REQUESTS.format(engine=engine, model=model, dataset=d,
                                                  method=targets[(engine, model, d)]["ngram"]) for d in datasets],
            "cost_model": self.sim_cost_model(),
        }  # fmt: skip

    def adaptive_options(self, scope: str) -> tuple[list[int], list[str]] | None:
        """(batch sizes, policies) of the adaptive report on the grid; for the published traces None
        (the command's defaults), or with one published dataset ([] batch sizes: the defaults) the
        policies without those that train on another dataset."""
        if published_scope(scope) is not None:
            if len(self.published.get("datasets") or []) >= 2:
                return None
            specs = simulator_choices.ADAPTIVE_SPECS
            return [], [s for s in specs if s not in simulator_choices.CROSS_DATASET_POLICIES]
        key = tuple(scope.split("/"))
        sizes = sorted({c.batch_size for c in self.cells if (c.engine, c.model) == key})
        return sizes, simulator_choices.adaptive_policies(self.config, len(self.adaptive_cell_targets()[key]))
