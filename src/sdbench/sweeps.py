"""Sweeps: grid blocks derived from a config section, so a sweep is part of the same DAG.

``proposal_length`` runs each listed SD method with every ``num_speculative_tokens`` value.
Each value becomes a method entry ``<method>.k<k>`` (a copy of the base entry with that k,
marked ``sweep_of``), or reuses an entry that already says exactly that (the base method at
its own k, or e.g. ``ngram-k5`` for ``ngram-k3`` at k=5), and the sweep adds one grid block
(marked ``sweep: proposal_length``) with those methods and the no-SD baseline. The cells are
ordinary cells: engine groups, pairing, memory accounting and Snakemake's rerun logic apply
unchanged. Expanding is idempotent, so a resolved config (e.g. the bundle's) validates again.

``temperature`` runs the listed SD methods (and the no-SD baseline) on each listed dataset at
every sampling temperature. Temperature belongs to the workload (a request's sampling
parameters), so each point is a dataset entry ``<dataset>.t<T>`` (a copy of the base entry with
``temperature: T``, marked ``sweep_of``; T = 0 is the base dataset itself, greedy), and the
sweep adds one grid block (marked ``sweep: temperature``). The variants run on one engine per
method beside the method's own (group share ``<share>-temperature``, so the grid's cells never
wait for them), on the base's prompt table, and a paired no-SD arm runs the very same
sampled calls (same per-request seeds, sdbench.engine.measure.sampling), so the speedup at T is SD at T
over no SD at T.

``forced_acceptance`` runs each listed SD method at chosen *forced* acceptance lengths: vLLM's
synthetic rejection sampling sets the accept/reject decision while the drafter still drafts and
the target still verifies, so the step costs are real and only the acceptance is chosen. Each
point is a method entry ``<method>.a<L>`` (``full`` is k + 1: every draft accepted, the method's
ceiling), marked ``sweep_of`` and ``forced_acceptance_length``, in one more grid block (``sweep:
forced_acceptance``) with the no-SD baseline. Its engine arguments are the base method's, and
one engine per method runs all its forced points, switching the length cell by cell
(:mod:`sdbench.engine.measure.forcing`; group share ``<share>-forced``). Its cells generate
``max_tokens`` tokens (``ignore_eos``, both arms): accepted drafts are the drafter's tokens, so
the outputs are not the greedy ones and their lengths would otherwise differ between arms.

``aa_control`` (``verdict.aa_control``) is the run's A/A control: the no-SD entry copied as
``<baseline>.aa`` (marked ``sweep_of`` and ``aa_control``) and timed as if it were an SD method,
against the paired no-SD arm, through every step an SD cell takes. One grid block per block of the
grid's own, its models and datasets at its smallest batch size. Its cells belong to the verdict
(sdbench.workflow.plan's grid cells), which counts how many of them the rule judged pays or loses.
"""

from __future__ import annotations

import copy
from typing import Any

PROPOSAL_LENGTH = "proposal_length"
TEMPERATURE = "temperature"
FORCED_ACCEPTANCE = "forced_acceptance"
AA_CONTROL = "aa_control"
FULL = "full"  # a forced acceptance length: every draft accepted (k + 1)
# Keys that do not change what an engine runs.
_COSMETIC = ("label", "sweep_of")


def method_key(base: str, k: int) -> str:
    """The key of ``base`` run with ``k`` speculative tokens."""
    return f"{base}.k{k}"


def variant_keys(config: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Keys that exist only for a sweep: ``{"methods": {key: sweep}, "datasets": {key: sweep}}``
    (entries marked ``sweep_of``). Cells on them belong to their sweep's item, not to the grid's."""
    return {
        "methods": {
            k: AA_CONTROL if m.get("aa_control") else FORCED_ACCEPTANCE if "forced_acceptance_length" in m
            else PROPOSAL_LENGTH
            for k, m in sorted(config["methods"].items())
            if "sweep_of" in m
        },
        "datasets": {k: TEMPERATURE for k, d in sorted(config["datasets"].items()) if "sweep_of" in d},
    }


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


def dataset_key(base: str, temperature: float) -> str:
    """The key of dataset ``base`` sampled at ``temperature`` (``code-edit.t0.7``; T = 0 is ``base``)."""
    t = float(temperature)
    return base if t == 0 else f"{base}.t{t!r}"


def temperature_of(config: dict[str, Any], dataset: str) -> float:
    """Sampling temperature of a dataset's requests (0.0, greedy, when its entry sets none)."""
    return float(config["datasets"][dataset].get("temperature", 0.0))


def is_sampled(config: dict[str, Any], dataset: str) -> bool:
    """Whether a dataset's requests are sampled (temperature > 0) rather than decoded greedily."""
    return temperature_of(config, dataset) > 0


def prompt_dataset(config: dict[str, Any], dataset: str) -> str:
    """The dataset whose prompt table ``dataset`` reads: a temperature variant's base, else itself."""
    entry = config["datasets"][dataset]
    return entry["sweep_of"] if "sweep_of" in entry and "temperature" in entry else dataset


def temperature_datasets(config: dict[str, Any]) -> dict[str, tuple[str, float]]:
    """Dataset key -> (base dataset, temperature) of every point of the temperature sweep,
    sorted by base dataset and temperature."""
    sweep = config.get(TEMPERATURE)
    if not sweep:
        return {}
    return {
        dataset_key(base, t): (base, float(t))
        for base in sorted(sweep["datasets"])
        for t in sorted(float(x) for x in sweep["temperatures"])
    }


def forced_length(value: float | str, k: int) -> float:
    """A forced acceptance length of the config (a number, or ``full`` = k + 1) for a method with k drafts."""
    return float(k + 1) if value == FULL else float(value)


def forced_key(base: str, length: float) -> str:
    """The key of ``base`` forced to accepted length ``length`` (``eagle3-k3.a2.5``, ``.a4``)."""
    return f"{base}.a{length:g}"


def forced_acceptance_methods(config: dict[str, Any]) -> dict[str, tuple[str, float]]:
    """Method key -> (base method, forced accepted length) of every point of the forced-acceptance
    sweep, sorted by base method and length."""
    sweep = config.get(FORCED_ACCEPTANCE)
    if not sweep:
        return {}
    points: dict[str, tuple[str, float]] = {}
    for base in sorted(sweep["methods"]):
        k = int(config["methods"][base]["num_speculative_tokens"])
        for length in sorted({forced_length(v, k) for v in sweep["acceptance_lengths"]}):
            points[forced_key(base, length)] = (base, length)
    return points


def forced_base(config: dict[str, Any], method: str) -> str:
    """The method whose engine runs ``method``: the base of a forced-acceptance point, else itself."""
    entry = config["methods"][method]
    return entry["sweep_of"] if "forced_acceptance_length" in entry else method


def forced_run(config: dict[str, Any], method: str) -> dict[str, Any] | None:
    """The ``run`` settings a forced-acceptance cell overrides (None for other methods): every
    output runs to ``max_tokens`` in both arms, and the sweep's ``num_requests`` if it sets one."""
    if "forced_acceptance_length" not in config["methods"][method]:
        return None
    sweep = config.get(FORCED_ACCEPTANCE) or {}
    extra: dict[str, Any] = {"ignore_eos": True}
    if sweep.get("num_requests"):
        extra["num_requests"] = int(sweep["num_requests"])
    return extra


def _forced_problems(config: dict[str, Any]) -> list[str]:
    """Engines without synthetic rejection, methods that draft nothing, lengths beyond k + 1."""
    from sdbench.engine.release.versions import quirks_for

    sweep = config[FORCED_ACCEPTANCE]
    problems = []
    version = config["engines"][sweep["engine"]]["vllm_version"]
    if not quirks_for(version).synthetic_acceptance:
        problems.append(
            f"{FORCED_ACCEPTANCE}.engine: {sweep['engine']!r} runs vLLM {version}, which has no synthetic "
            "rejection sampling (SpeculativeConfig.rejection_sample_method arrived after 0.11.1; 0.26.0 and the "
            "CPU build 0.32.0 have it)"
        )
    for i, base in enumerate(sweep["methods"]):
        entry = config["methods"][base]
        if "num_speculative_tokens" not in entry:
            problems.append(f"{FORCED_ACCEPTANCE}.methods[{i}]: {base!r} sets no num_speculative_tokens")
            continue
        k = int(entry["num_speculative_tokens"])
        for j, value in enumerate(sweep["acceptance_lengths"]):
            if value != FULL and not 1.0 <= float(value) <= k + 1:
                problems.append(
                    f"{FORCED_ACCEPTANCE}.acceptance_lengths[{j}]: {value} is outside 1..{k + 1} "
                    f"(k + 1 for {base!r}, k = {k})"
                )
        clash = set(entry.get("speculative_config", {})) & {"rejection_sample_method", "synthetic_acceptance_length",
                                                            "synthetic_acceptance_rates"}  # fmt: skip
        if clash:
            problems.append(
                f"methods.{base}.speculative_config: sets {', '.join(sorted(clash))}; the sweep forces acceptance "
                "itself, cell by cell"
            )
    return problems


def _name_problems(config: dict[str, Any], section: str, no_baseline_why: str) -> list[str]:
    """Unknown engine / model / dataset / method names of a sweep section, and the baseline listed as a method."""
    sweep = config[section]
    problems = []
    if sweep["engine"] not in config["engines"]:
        problems.append(f"{section}.engine: unknown engine {sweep['engine']!r}")
    for key in ("models", "datasets", "methods"):
        for i, name in enumerate(sweep[key]):
            if name not in config[key]:
                problems.append(f"{section}.{key}[{i}]: unknown {key[:-1]} {name!r}")
            elif key == "methods" and config["methods"][name]["method"] == "none":
                problems.append(f"{section}.methods[{i}]: {name!r} is the no-SD baseline; {no_baseline_why}")
    return problems


def _temperature_problems(config: dict[str, Any]) -> list[str]:
    """Datasets the temperature sweep cannot vary, and existing entries its keys would collide with."""
    problems = []
    for i, base in enumerate(config[TEMPERATURE]["datasets"]):
        entry = config["datasets"].get(base)
        if entry is None:
            continue  # reported as unknown
        if "temperature" in entry:
            problems.append(
                f"{TEMPERATURE}.datasets[{i}]: {base!r} sets its own temperature ({entry['temperature']}); "
                "sweep a greedy dataset"
            )
        elif entry["source"] == "random_tokens":
            problems.append(f"{TEMPERATURE}.datasets[{i}]: {base!r} is a random-token control; sweep a real dataset")
    if problems:
        return problems
    for key, (base, t) in temperature_datasets(config).items():
        existing = config["datasets"].get(key)
        if key != base and existing is not None and (existing.get("sweep_of"), existing.get("temperature")) != (base, t):
            problems.append(f"datasets.{key}: already defined, and not {base!r} at temperature {t} (the sweep's key)")
    return problems


def sweep_problems(config: dict[str, Any]) -> list[str]:
    """Names a sweep refers to that do not exist (key paths under the sweep's section)."""
    problems = []
    if config.get(PROPOSAL_LENGTH):
        problems += _name_problems(config, PROPOSAL_LENGTH, "it has no proposal length")
    if config.get(TEMPERATURE):
        problems += _name_problems(config, TEMPERATURE, "it runs at every temperature anyway")
        if not problems:
            problems += _temperature_problems(config)
    if config.get(FORCED_ACCEPTANCE):
        names = _name_problems(config, FORCED_ACCEPTANCE, "it drafts nothing to accept")
        problems += names or _forced_problems(config)
    return problems


def expand(config: dict[str, Any]) -> None:
    """Add the sweeps' method and dataset entries and grid blocks to ``config`` (in place; idempotent).

    Call on a schema-valid config after :func:`sweep_problems` found nothing.
    """
    _expand_proposal_length(config)
    _expand_temperature(config)
    _expand_forced_acceptance(config)
    _expand_aa_control(config)


def _expanded(config: dict[str, Any], section: str) -> bool:
    return not config.get(section) or any(block.get("sweep") == section for block in config["grid"])


def _baseline(config: dict[str, Any]) -> list[str]:
    return sorted(name for name, m in config["methods"].items() if m["method"] == "none" and "sweep_of" not in m)[:1]


def aa_key(base: str) -> str:
    """The key of the A/A control's copy of the no-SD entry ``base``."""
    return f"{base}.aa"


def _expand_aa_control(config: dict[str, Any]) -> None:
    if not config.get("verdict", {}).get(AA_CONTROL) or any(b.get("sweep") == AA_CONTROL for b in config["grid"]):
        return
    (base,) = _baseline(config)
    key = aa_key(base)
    config["methods"].setdefault(key, {**copy.deepcopy(config["methods"][base]), "label": "A/A control (no SD)",
                                       "sweep_of": base, "aa_control": True})  # fmt: skip
    own = [b for b in config["grid"] if not b.get("sweep")]
    for block in own:
        config["grid"].append({"sweep": AA_CONTROL, "engine": block["engine"], "models": list(block["models"]),
                               "methods": [base, key], "datasets": list(block["datasets"]),
                               "batch_sizes": [min(block["batch_sizes"])]})  # fmt: skip


def _expand_temperature(config: dict[str, Any]) -> None:
    if _expanded(config, TEMPERATURE):
        return
    sweep = config[TEMPERATURE]
    points = temperature_datasets(config)
    for key, (base, t) in points.items():
        if key != base and key not in config["datasets"]:
            config["datasets"][key] = {**copy.deepcopy(config["datasets"][base]), "temperature": t, "sweep_of": base}
    config["grid"].append(
        {
            "sweep": TEMPERATURE,
            "engine": sweep["engine"],
            "models": list(sweep["models"]),
            "methods": _baseline(config) + list(sweep["methods"]),
            "datasets": list(points),
            "batch_sizes": list(sweep["batch_sizes"]),
        }
    )


def _expand_proposal_length(config: dict[str, Any]) -> None:
    if _expanded(config, PROPOSAL_LENGTH):
        return
    sweep = config[PROPOSAL_LENGTH]
    points = proposal_length_methods(config)
    for key, (base, k) in points.items():
        if key not in config["methods"]:
            entry = copy.deepcopy(config["methods"][base])
            label = entry.get("label", base)
            entry.update(num_speculative_tokens=k, label=f"{label} @ k={k}", sweep_of=base)
            config["methods"][key] = entry
    config["grid"].append(
        {
            "sweep": PROPOSAL_LENGTH,
            "engine": sweep["engine"],
            "models": list(sweep["models"]),
            "methods": _baseline(config) + list(points),
            "datasets": list(sweep["datasets"]),
            "batch_sizes": list(sweep["batch_sizes"]),
        }
    )


def _expand_forced_acceptance(config: dict[str, Any]) -> None:
    if _expanded(config, FORCED_ACCEPTANCE):
        return
    sweep = config[FORCED_ACCEPTANCE]
    points = forced_acceptance_methods(config)
    for key, (base, length) in points.items():
        if key not in config["methods"]:
            # The same engine arguments as the base method: the length is switched inside the
            # base method's engine, cell by cell (sdbench.engine.measure.forcing).
            entry = copy.deepcopy(config["methods"][base])
            entry.update(label=f"{entry.get('label', base)} forced τ={length:g}", sweep_of=base,
                         forced_acceptance_length=length)  # fmt: skip
            config["methods"][key] = entry
    config["grid"].append(
        {
            "sweep": FORCED_ACCEPTANCE,
            "engine": sweep["engine"],
            "models": list(sweep["models"]),
            "methods": _baseline(config) + list(points),
            "datasets": list(sweep["datasets"]),
            "batch_sizes": list(sweep["batch_sizes"]),
        }
    )
