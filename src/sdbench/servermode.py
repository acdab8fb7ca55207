"""Server mode: the ``server`` config section as jobs the DAG runs.

Production traffic reaches vLLM through its OpenAI-compatible server, not ``LLM.generate``:
requests arrive one by one, are streamed back, and share the engine with whatever else is in
flight. The ``server`` section names an engine, models, methods, datasets and concurrency
levels; each engine x model x method is one :class:`ServerGroup`, one job that starts one
server and measures every dataset x concurrency level on it (a "server cell").

Light (standard library and the grid's own imports): the Snakefile reads it while it builds
the DAG. The job itself is :mod:`sdbench.engine.servegroup`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

SECTION = "server"
# Keys of one server cell, in table order (docs/schema.md, server tables).
SERVER_CELL_KEYS = ("engine", "model", "dataset", "method", "concurrency")


@dataclass(frozen=True, order=True)
class ServerGroup:
    """Server cells measured on one server: same engine, model and method."""

    engine: str
    model: str
    method: str

    def as_dict(self) -> dict[str, str]:
        """The group's keys (Snakemake wildcards use these names)."""
        return asdict(self)


def server_groups(config: dict[str, Any]) -> list[ServerGroup]:
    """Every server group of a validated config, sorted (none without a ``server`` section)."""
    section = config.get(SECTION)
    if not section:
        return []
    return sorted(
        ServerGroup(section["engine"], model, method) for model in section["models"] for method in section["methods"]
    )


def resolve_server_group(config: dict[str, Any], group: ServerGroup) -> dict[str, Any]:
    """Everything a serve-group job needs, resolved from the config (JSON-serialisable).

    Snakemake passes it as a rule param, so editing any entry the group uses (its engine,
    model, method, datasets, run settings or the server section) reruns exactly that group.
    """
    section = config[SECTION]
    datasets = {
        name: {k: config["datasets"][name][k] for k in ("max_tokens", "num_prompts")} for name in section["datasets"]
    }
    run = config.get("run", {})
    return {
        "group": group.as_dict(),
        "seed": config.get("seed", 42),
        "engine": config["engines"][group.engine],
        "model": config["models"][group.model],
        "method": config["methods"][group.method],
        # As sdbench.grid.drafter_of (not imported: the config module imports this one).
        "drafter": config["methods"][group.method].get("drafter", {}).get(group.model),
        "datasets": datasets,
        # The latency targets are the analysis's (sdbench latency): editing them measures nothing again.
        "server": {k: v for k, v in section.items() if k not in ("engine", "models", "methods", "datasets", "slo")},
        # Only what shapes a request; pairing and trial settings are the offline runner's.
        "run": {k: run[k] for k in ("ignore_eos", "enable_prefix_caching") if k in run},
    }


def slo_for(section: dict[str, Any], dataset: str) -> dict[str, float]:
    """The latency targets (``ttft_ms``, ``tpot_ms``, ``e2e_ms``) of a dataset's server cells: the
    ``slo`` section's global ones, each overridden by the dataset's own entry under ``slo.datasets``."""
    slo = section.get("slo") or {}
    targets = {k: v for k, v in slo.items() if k != "datasets"}
    targets.update(slo.get("datasets", {}).get(dataset, {}))
    return targets


def server_slos(config: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Dataset -> its latency targets, for every dataset of the ``server`` section (empty without one)."""
    section = config.get(SECTION)
    return {d: slo_for(section, d) for d in section["datasets"]} if section else {}


def server_problems(config: dict[str, Any], drafter_methods: frozenset[str]) -> list[str]:
    """Names the ``server`` section refers to that do not exist or cannot run (key paths).

    ``drafter_methods``: vLLM methods that need a drafter (sdbench.config.DRAFTER_METHODS).
    """
    from sdbench.engine.versions import unsupported_reason

    section = config.get(SECTION)
    if not section:
        return []
    problems: list[str] = []
    engine = config["engines"].get(section["engine"])
    if engine is None:
        problems.append(f"{SECTION}.engine: unknown engine {section['engine']!r} (defined: {', '.join(sorted(config['engines']))})")
    for key in ("models", "datasets", "methods"):
        for i, name in enumerate(section[key]):
            if name not in config[key]:
                problems.append(f"{SECTION}.{key}[{i}]: unknown {key[:-1]} {name!r}")
    for name in (section.get("slo") or {}).get("datasets", {}):
        if name not in section["datasets"]:
            problems.append(f"{SECTION}.slo.datasets.{name}: not one of {SECTION}.datasets ({', '.join(section['datasets'])})")
    for i, name in enumerate(section["methods"]):
        method = config["methods"].get(name)
        if method is None:
            continue
        if engine is not None:
            reason = unsupported_reason(engine, method["method"])
            if reason:
                problems.append(f"{SECTION}.methods[{i}]: {name!r} on engine {section['engine']!r}: {reason}")
        if method["method"] in drafter_methods:
            for model in section["models"]:
                if model in config["models"] and model not in method.get("drafter", {}):
                    problems.append(f"methods.{name}.drafter: no drafter for target model {model!r} (used by {SECTION})")
    return problems
