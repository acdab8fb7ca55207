"""Server mode: the ``server`` config section as jobs the DAG runs.

Production traffic reaches vLLM through its OpenAI-compatible server, not ``LLM.generate``:
requests arrive one by one, are streamed back, and share the engine with whatever else is in
flight. The ``server`` section names an engine, models, methods, datasets and concurrency
levels; each engine x model x method is one :class:`ServerGroup`, one job that starts the
method's server ``starts`` times and measures every dataset x concurrency level on each start
(a "server cell"), its ``rounds`` spread round-robin over the starts (:func:`start_rounds`). With
``interleave`` one job per engine x model holds every method (its "arms") and alternates them
start by start (:func:`start_order`), so SD and no SD are measured side by side in time, on one
node; each arm still writes its own directory, laid out as without it.

Light (standard library and the grid's own imports): the Snakefile reads it while it builds
the DAG. The job itself is :mod:`sdbench.engine.serving.servegroup`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SECTION = "server"
# Keys of one server cell, in table order (docs/schema.md, server tables).
SERVER_CELL_KEYS = ("engine", "model", "dataset", "method", "concurrency")


# The log name of an interleaved job (its arms' directories keep their method names).
INTERLEAVED = "interleaved"


@dataclass(frozen=True, order=True)
class ServerGroup:
    """One server job: an engine and model, and the methods (arms) it starts servers for, one arm
    unless ``interleave``."""

    engine: str
    model: str
    methods: tuple[str, ...]
    interleave: bool = False

    @property
    def label(self) -> str:
        """The job's name in logs: its method, or :data:`INTERLEAVED`."""
        return INTERLEAVED if self.interleave else self.methods[0]

    def as_dict(self) -> dict[str, str]:
        """The job's Snakemake wildcards: engine, model and (one arm per job) method."""
        keys = {"engine": self.engine, "model": self.model}
        return keys if self.interleave else {**keys, "method": self.methods[0]}

    def arm_keys(self, method: str) -> dict[str, str]:
        """Keys of one arm's directory (``SERVER_GROUP_DIR``)."""
        return {"engine": self.engine, "model": self.model, "method": method}


def server_settings(section: dict[str, Any]) -> tuple[int, int, bool, list[int]]:
    """``(rounds, starts, interleave, stream_control)`` of a server section, with their defaults."""
    return (int(section.get("rounds", 2)), int(section.get("starts", 1)), bool(section.get("interleave", False)),
            sorted(int(c) for c in section.get("stream_control") or []))  # fmt: skip


def start_rounds(rounds: int, starts: int, start: int) -> list[int]:
    """The timed rounds (0-based, of every level) that server start ``start`` measures: round r
    runs in start r % starts, so every start gets rounds and a round's number says its start."""
    if not 0 <= start < starts <= rounds:
        raise ValueError(f"start {start} of {starts} starts over {rounds} rounds: need 0 <= start < starts <= rounds")
    return list(range(start, rounds, starts))


def start_order(methods: tuple[str, ...] | list[str], starts: int, interleave: bool) -> list[tuple[int, str]]:
    """A job's server starts in the order it runs them, as (start index, arm): interleaved, start
    s of every arm before start s + 1 of any, the arms' order reversed every other start (A B B A:
    no arm always runs first, so a drift over the job does not favour one); else each arm's starts
    back to back."""
    if interleave:
        return [(s, m) for s in range(starts) for m in (methods if s % 2 == 0 else list(reversed(methods)))]
    return [(s, m) for m in methods for s in range(starts)]


def server_groups_interleaved(config: dict[str, Any]) -> bool:
    """Whether the config's server jobs are one per engine x model, every method interleaved."""
    section = config.get(SECTION)
    return bool(section) and server_settings(section)[2]


def server_groups(config: dict[str, Any]) -> list[ServerGroup]:
    """Every server job of a validated config, sorted (none without a ``server`` section)."""
    section = config.get(SECTION)
    if not section:
        return []
    engine, models, methods = section["engine"], section["models"], tuple(section["methods"])
    if server_settings(section)[2]:
        return sorted(ServerGroup(engine, model, methods, True) for model in models)
    return sorted(ServerGroup(engine, model, (method,)) for model in models for method in methods)


def arm_spec(spec: dict[str, Any], method: str) -> dict[str, Any]:
    """One arm's spec out of a job's (:func:`resolve_server_group`): the job's settings, the arm's
    method and drafter, ``group`` naming the arm (as a one-arm job's)."""
    arm = spec["arms"][method]
    group = {"engine": spec["group"]["engine"], "model": spec["group"]["model"], "method": method}
    return {**{k: v for k, v in spec.items() if k != "arms"}, "group": group, "method": arm["method"],
            "drafter": arm["drafter"]}  # fmt: skip


def resolve_server_group(config: dict[str, Any], group: ServerGroup) -> dict[str, Any]:
    """Everything a serve-group job needs, resolved from the config (JSON-serialisable); its arms
    in :func:`start_order`'s order under ``arms`` (:func:`arm_spec` gives one).

    Snakemake passes it as a rule param, so editing any entry the group uses (its engine,
    model, methods, datasets, run settings or the server section) reruns exactly that group.
    """
    section = config[SECTION]
    datasets = {
        name: {k: config["datasets"][name][k] for k in ("max_tokens", "num_prompts")} for name in section["datasets"]
    }
    run = config.get("run", {})
    return {
        "group": {"engine": group.engine, "model": group.model, "methods": list(group.methods),
                  "interleave": group.interleave},  # fmt: skip
        "seed": config.get("seed", 42),
        "engine": config["engines"][group.engine],
        "model": config["models"][group.model],
        "arms": {
            # As sdbench.grid.drafter_of (not imported: the config module imports this one).
            m: {"method": config["methods"][m], "drafter": config["methods"][m].get("drafter", {}).get(group.model)}
            for m in group.methods
        },
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
    from sdbench.engine.release.versions import unsupported_reason

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
    rounds, starts, _, control = server_settings(section)
    if starts > rounds:
        problems.append(f"{SECTION}.starts: {starts} starts but {SECTION}.rounds is {rounds}: every start needs a "
                        f"timed round (round r runs in start r % starts); raise rounds to at least {starts}")
    for i, level in enumerate(section.get("stream_control") or []):
        if level not in section["concurrency"]:
            problems.append(f"{SECTION}.stream_control[{i}]: {level} is not one of {SECTION}.concurrency "
                            f"({', '.join(map(str, section['concurrency']))})")
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
