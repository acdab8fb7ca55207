"""Pipeline configuration: loading, JSON-schema validation and cross-references.

The config is the grid: engines, models, datasets and SD methods are catalogues,
and ``grid`` blocks name which combinations run. Every error names the key.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import jsonschema
import yaml

from sdbench.errors import ConfigError  # re-exported: callers import it from here
from sdbench.errors import describe_yaml_error  # noqa: F401 - re-exported likewise
from sdbench import sweeps
from sdbench.servermode import server_problems
from sdbench.figureindex import PUBLISHED_SCOPE
from sdbench.packagedata import read_text

# Methods whose speculative_config needs a drafter model (``method.drafter``).
DRAFTER_METHODS = frozenset({"eagle", "eagle3", "draft_model", "medusa", "mtp", "deepseek_mtp", "qwen3_next_mtp"})


def load_schema() -> dict[str, Any]:
    """The packaged JSON schema for pipeline configs."""
    text = read_text("schemas", "config.schema.yaml")
    return yaml.safe_load(text)


def _with_defaults(validator_class: type) -> type:
    """Extend a jsonschema validator so that validation fills ``default`` values."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):  # type: ignore[no-untyped-def]
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


_Validator = _with_defaults(jsonschema.Draft202012Validator)


def _key_path(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top level>"


def _describe(error: jsonschema.ValidationError) -> str:
    # For oneOf/anyOf the most useful message is usually the deepest sub-error.
    best = jsonschema.exceptions.best_match([error]) if error.context else error
    where = _key_path(best.absolute_path)
    if best.validator == "additionalProperties":
        return f"{where}: {best.message} (check the spelling of the key)"
    return f"{where}: {best.message}"


def validate_config(config: dict[str, Any], source: str = "config") -> dict[str, Any]:
    """Validate ``config`` in place (filling schema defaults) and check cross-references.

    Sweeps (sdbench.sweeps) are expanded into method entries and grid blocks in place.
    Returns the same dict. Raises :class:`ConfigError` listing every problem,
    each prefixed by the key path, e.g. ``grid[0].batch_sizes[1]``.
    """
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: top level must be a mapping, got {type(config).__name__}")
    validator = _Validator(load_schema())
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    problems = [_describe(e) for e in errors]
    if not problems:
        problems = sweeps.sweep_problems(config)
        if not problems:
            sweeps.expand(config)  # a sweep is more grid: its block is checked like the others
        problems += _cross_reference_problems(config)
    if problems:
        raise ConfigError(f"{source}: invalid configuration:\n  " + "\n  ".join(problems))
    return config


def _cross_reference_problems(config: dict[str, Any]) -> list[str]:
    """Checks JSON schema cannot express: grid names exist, drafters resolve."""
    problems: list[str] = []
    if PUBLISHED_SCOPE in config["engines"]:
        # Figure-index scopes <engine>/<model>/<dataset> would collide with published/<dataset>.
        problems.append(f"engines.{PUBLISHED_SCOPE}: reserved name (the published traces' scope); rename the engine")
    catalogues = {"engine": "engines", "models": "models", "methods": "methods", "datasets": "datasets"}
    for i, block in enumerate(config["grid"]):
        for key, section in catalogues.items():
            names = [block[key]] if key == "engine" else block[key]
            for name in names:
                if name not in config[section]:
                    known = ", ".join(sorted(config[section]))
                    problems.append(f"grid[{i}].{key}: unknown {section[:-1]} {name!r} (defined: {known})")
        for method_name in block["methods"]:
            method = config["methods"].get(method_name)
            if method is None or method["method"] not in DRAFTER_METHODS:
                continue
            for model_name in block["models"]:
                drafter = method.get("drafter", {}).get(model_name)
                if drafter is None:
                    problems.append(
                        f"methods.{method_name}.drafter: no drafter for target model {model_name!r} "
                        f"(used by grid[{i}])"
                    )
                elif drafter not in config["models"]:
                    problems.append(f"methods.{method_name}.drafter.{model_name}: unknown model {drafter!r}")
                elif "head" in config["models"][drafter]:
                    head = config["models"][drafter]["head"]
                    if head["kind"] != method["method"]:
                        problems.append(
                            f"methods.{method_name}.drafter.{model_name}: {drafter!r} is an {head['kind']} head, "
                            f"but the method is {method['method']!r}"
                        )
                    if head["kind"] == "mtp":
                        if drafter != model_name:
                            problems.append(
                                f"methods.{method_name}.drafter.{model_name}: {drafter!r} is an MTP model; its MTP "
                                f"layer ships inside it, so it drafts only for itself (drafter must be {model_name!r})"
                            )
                    elif head["target"] != model_name:
                        problems.append(
                            f"methods.{method_name}.drafter.{model_name}: head {drafter!r} was trained for "
                            f"{head['target']!r}, not {model_name!r}"
                        )
                    if head["kind"] == "medusa":
                        from sdbench.models.headconfig import HeadConfig

                        heads = head.get("num_heads", HeadConfig.num_heads)
                        k = method.get("num_speculative_tokens", 0)
                        if k > heads:
                            problems.append(
                                f"methods.{method_name}.num_speculative_tokens: {k} > the {heads} head(s) of "
                                f"{drafter!r} (vLLM builds one Medusa head per speculative token; raise its num_heads)"
                            )
    for name, model in config["models"].items():
        target = model.get("head", {}).get("target")
        if target is not None and "build" not in config["models"].get(target, {}):
            problems.append(f"models.{name}.head.target: {target!r} is not a model the pipeline builds")
    for i, name in enumerate(config.get("traces", {}).get("methods", [])):
        if name not in config["methods"]:
            problems.append(f"traces.methods[{i}]: unknown method {name!r}")
        elif config["methods"][name]["method"] == "none":
            problems.append(f"traces.methods[{i}]: {name!r} is the no-SD baseline; nothing to trace")
    for key, section in (("methods", "methods"), ("datasets", "datasets"), ("models", "models")):
        for i, name in enumerate(config.get("breakdown", {}).get(key, [])):
            if name not in config[section]:
                problems.append(f"breakdown.{key}[{i}]: unknown {section[:-1]} {name!r}")
    engine = config.get("breakdown", {}).get("engine")
    if engine is not None and engine not in config["engines"]:
        problems.append(f"breakdown.engine: unknown engine {engine!r}")
    for key in ("ngram", "versus"):
        name = config.get("bleu", {}).get(key)
        if name is not None and name not in config["methods"]:
            problems.append(f"bleu.{key}: unknown method {name!r}")
    prices = config.get("cost", {}).get("price_per_device_hour")
    if prices is not None:
        for i, block in enumerate(config["grid"]):
            if block["engine"] not in prices:
                problems.append(f"cost.price_per_device_hour: no price for engine {block['engine']!r} (grid[{i}])")
        if config.get("server") and config["server"]["engine"] not in prices:
            problems.append(f"cost.price_per_device_hour: no price for engine {config['server']['engine']!r} (server)")
    problems += server_problems(config, DRAFTER_METHODS)
    for name, method in config["methods"].items():
        lo, hi = method.get("prompt_lookup_min"), method.get("prompt_lookup_max")
        if lo is not None and hi is not None and lo > hi:
            problems.append(f"methods.{name}: prompt_lookup_min ({lo}) > prompt_lookup_max ({hi})")
        if method["method"] != "none" and "num_speculative_tokens" not in method:
            problems.append(f"methods.{name}.num_speculative_tokens: required for method {method['method']!r}")
    for name, dataset in config["datasets"].items():
        if dataset["source"] == "huggingface" and "hf_id" not in dataset:
            problems.append(f"datasets.{name}.hf_id: required for source 'huggingface'")
        if dataset["source"] == "random_tokens":
            matched = config["datasets"].get(dataset.get("matched_to", ""))
            if matched is None:
                problems.append(
                    f"datasets.{name}.matched_to: {dataset.get('matched_to')!r} is not a dataset "
                    "(a random_tokens dataset matches a real one's prompt lengths)"
                )
            elif matched["source"] == "random_tokens":
                problems.append(f"datasets.{name}.matched_to: {dataset['matched_to']!r} is itself random tokens")
            elif dataset["num_prompts"] > matched["num_prompts"]:
                problems.append(
                    f"datasets.{name}.num_prompts: {dataset['num_prompts']} > {dataset['matched_to']!r}'s "
                    f"{matched['num_prompts']}"
                )
        elif dataset["source"] == "file":
            for key in ("path", "columns"):
                if key not in dataset:
                    problems.append(f"datasets.{name}.{key}: required for source 'file' (your prompts file "
                                    "and which of its columns hold the prompt or messages)")
            columns = dataset.get("columns", {})
            if columns and ("prompt" in columns) == ("messages" in columns):
                problems.append(f"datasets.{name}.columns: give exactly one of prompt and messages")
        elif "builder" not in dataset:
            problems.append(f"datasets.{name}.builder: required (which prompt builder formats this dataset)")
        elif dataset["builder"] == "columns" and "columns" not in dataset:
            problems.append(f"datasets.{name}.columns: required for builder 'columns' (which column holds what)")
    return problems


def load_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a YAML config file."""
    try:
        with open(path, encoding="utf-8") as fh:
            config = yaml.safe_load(fh)
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: config file not found") from exc
    except IsADirectoryError as exc:
        raise ConfigError(f"{path}: is a directory (expected a YAML config file)") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not a text file ({exc.reason} at byte {exc.start}; expected a YAML config)"
        ) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {describe_yaml_error(exc)}") from exc
    if config is None:
        raise ConfigError(f"{path}: the config file is empty (expected a YAML mapping with grid, models, ...)")
    return validate_config(config, source=str(path))
