"""The Medusa heads' directory as vLLM reads it: the config it expects, the tensors it fills, and
the check of a directory against both (:mod:`sdbench.models.medusa` trains the heads).

Apart from the trainer so that an engine job's input check (:mod:`sdbench.engine.site.preflight`)
reads a directory without importing the training code. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sdbench.models.check import compare_tensors


ARCHITECTURE = "MedusaModel"


MODEL_TYPE = "medusa"


LAYERS_PER_HEAD = 1  # Medusa-1: one residual block per head


def medusa_config(target_config: Mapping[str, Any], num_heads: int) -> dict[str, Any]:
    """The heads' ``config.json`` (read by vLLM's ``MedusaConfig``): sizes from the target."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "hidden_size": int(target_config["hidden_size"]),
        "vocab_size": int(target_config["vocab_size"]),
        "truncated_vocab_size": int(target_config["vocab_size"]),  # no token_map
        "num_heads": int(num_heads),
        "num_hidden_layers": LAYERS_PER_HEAD,
        "medusa_fc_bias": True,  # the reference ResBlock's Linear has a bias
        "original_lm_head": False,  # every head has its own LM head (lm_heads.<i>)
        "dtype": str(target_config.get("dtype", target_config.get("torch_dtype", "float32"))),
    }


def expected_tensors(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Checkpoint keys and shapes vLLM's ``Medusa.load_weights`` fills for ``config`` (all heads)."""
    h = int(config["hidden_size"])
    vocab = int(config["vocab_size"])
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(int(config["num_heads"])):
        for j in range(int(config.get("num_hidden_layers", 1))):
            shapes[f"blocks.{i}.layers.{j}.weight"] = (h, h)
            if config.get("medusa_fc_bias", False):
                shapes[f"blocks.{i}.layers.{j}.bias"] = (h,)
    if config.get("original_lm_head", False):
        shapes["lm_head.weight"] = (int(config.get("truncated_vocab_size") or vocab), h)
    else:
        shapes.update({f"lm_heads.{i}.weight": (vocab, h) for i in range(int(config["num_heads"]))})
    return shapes


def config_problems(config: Mapping[str, Any]) -> list[str]:
    """What in a Medusa ``config.json`` vLLM would misread: keys ``MedusaConfig.from_pretrained``
    renames onto ``num_heads`` / ``num_hidden_layers``, a missing size, a truncated vocabulary."""
    problems = []
    for key in config:
        if "num" in key and "heads" in key and key != "num_heads":
            problems.append(f"key {key!r} would be read as num_heads (MedusaConfig.from_pretrained renames it)")
        elif "num" in key and "layers" in key and key != "num_hidden_layers":
            problems.append(f"key {key!r} would be read as num_hidden_layers (MedusaConfig.from_pretrained renames it)")
    for key in ("hidden_size", "vocab_size", "num_heads"):
        value = config.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(f"{key}: expected an integer >= 1, got {value!r}")
    truncated = config.get("truncated_vocab_size")
    if truncated is not None and truncated != config.get("vocab_size"):
        problems.append(f"truncated_vocab_size {truncated!r} differs from vocab_size: vLLM then needs a token_map (not written here)")
    return problems


def check_medusa_tensors(config: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Raise ``ValueError`` naming the first missing, unexpected or mis-shaped tensor.

    vLLM drops a checkpoint key it has no parameter for without a word (``Medusa.load_weights``),
    so an unexpected tensor is refused here too.
    """
    compare_tensors("medusa heads", expected_tensors(config), shapes, "", "vLLM's Medusa has no parameter for it")


def check_medusa_dir(path: str | Path, num_speculative_tokens: int | None = None) -> None:
    """Check a Medusa directory as vLLM will read it: ``config.json``, tensor names and shapes.

    Reads ``config.json`` and the safetensors headers only. With ``num_speculative_tokens``,
    also that the directory has that many heads (vLLM builds ``k`` heads and fails to load fewer).
    Raises :class:`sdbench.errors.ConfigError` naming the directory.
    """
    from sdbench.errors import ConfigError
    from sdbench.models.check import read_config, safetensors_header, weight_files

    directory = Path(path)
    config = read_config(directory)
    problems = config_problems(config)
    if config.get("architectures") not in (None, [ARCHITECTURE]):
        problems.append(f"architectures {config.get('architectures')!r}: expected [{ARCHITECTURE!r}]")
    if problems:
        raise ConfigError(f"{directory}/config.json: not a Medusa config vLLM reads as written: " + "; ".join(problems))
    files, _ = weight_files(directory)
    if not files:
        raise ConfigError(f"{directory}: no *.safetensors file")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        shapes.update({k: tuple(v["shape"]) for k, v in safetensors_header(file).items()})
    try:
        check_medusa_tensors(config, shapes)
    except ValueError as exc:
        raise ConfigError(f"{directory}: {exc}") from exc
    if num_speculative_tokens is not None and num_speculative_tokens > int(config["num_heads"]):
        raise ConfigError(
            f"{directory}: {config['num_heads']} Medusa head(s), fewer than num_speculative_tokens "
            f"{num_speculative_tokens} (vLLM builds one head per speculative token)"
        )
