"""Architecture facts of a model (:class:`ModelSpec`): from an architecture YAML or a ``config.json``.

Architecture configs ship as package data, ``sdbench/data/models/<org>--<name>.yaml`` (one per Hugging
Face repo id; ``$SDBENCH_DATA_DIR/models/`` adds or shadows files, see :mod:`sdbench.packagedata`), and
are validated with a JSON schema (:data:`MODEL_SCHEMA`) on load; a local model directory (or its
``config.json``) is accepted too, so the tiny models the pipeline trains itself need no YAML. The memory
accounting (:mod:`sdbench.analysis.memory`) counts parameters and KV cache from these specs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from sdbench.packagedata import data_file, list_data, override_dir, shipped_dir

# mimo: a dense Qwen2 network (q/k/v biases, no o_proj bias) with MTP layers (MiMoForCausalLM).
# medusa: Medusa heads (vLLM's MedusaModel): per head, residual blocks and an LM head.
ARCHITECTURES = ("llama", "qwen3", "eagle", "eagle3", "glm4_moe", "mimo", "medusa")
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}

_POS_INT = {"type": "integer", "minimum": 1}
_NONNEG_INT = {"type": "integer", "minimum": 0}
_BOOL = {"type": "boolean"}

_COMMON_REQUIRED = [
    "repo_id",
    "architecture",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
    "torch_dtype",
]
_EAGLE_REQUIRED = ["fc_bias", "first_layer_input_layernorm", "shares_embed_tokens", "shares_lm_head"]
_EAGLE3_REQUIRED = ["draft_vocab_size", "fc_bias", "shares_embed_tokens", "shares_lm_head", "has_d2t", "has_t2d"]
_MOE_REQUIRED = [
    "moe_intermediate_size",
    "n_routed_experts",
    "n_shared_experts",
    "num_experts_per_tok",
    "first_k_dense_replace",
    "num_nextn_predict_layers",
]

MODEL_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "sdbench model architecture config",
    "type": "object",
    "required": _COMMON_REQUIRED,
    "additionalProperties": False,
    "properties": {
        "repo_id": {"type": "string", "pattern": r"^[^/\s]+/[^/\s]+$"},
        "architecture": {"enum": list(ARCHITECTURES)},
        "vocab_size": _POS_INT,
        "hidden_size": _POS_INT,
        "intermediate_size": _POS_INT,
        "num_hidden_layers": _POS_INT,
        "num_attention_heads": _POS_INT,
        "num_key_value_heads": _POS_INT,
        "head_dim": _POS_INT,
        "tie_word_embeddings": _BOOL,
        "torch_dtype": {"enum": list(DTYPE_BYTES)},
        "attention_bias": _BOOL,
        "mlp_bias": _BOOL,
        # EAGLE / EAGLE-3 heads
        "target_repo_id": {"type": "string"},
        "draft_vocab_size": _POS_INT,
        "target_hidden_size": _POS_INT,
        "num_aux_hidden_states": _POS_INT,
        "fc_bias": _BOOL,
        "first_layer_input_layernorm": _BOOL,
        "shares_embed_tokens": _BOOL,
        "shares_lm_head": _BOOL,
        "has_d2t": _BOOL,
        "has_t2d": _BOOL,
        # glm4_moe
        "use_qk_norm": _BOOL,
        "moe_intermediate_size": _POS_INT,
        "n_routed_experts": _POS_INT,
        "n_shared_experts": _NONNEG_INT,
        "num_experts_per_tok": _POS_INT,
        "first_k_dense_replace": _NONNEG_INT,
        "num_nextn_predict_layers": _NONNEG_INT,
        # medusa
        "medusa_num_heads": _POS_INT,
        "medusa_fc_bias": _BOOL,
        "medusa_lm_heads": _NONNEG_INT,
    },
    "allOf": [
        {
            "if": {"properties": {"architecture": {"const": "eagle"}}, "required": ["architecture"]},
            "then": {"required": _EAGLE_REQUIRED},
        },
        {
            "if": {"properties": {"architecture": {"const": "eagle3"}}, "required": ["architecture"]},
            "then": {"required": _EAGLE3_REQUIRED},
        },
        {
            "if": {"properties": {"architecture": {"const": "glm4_moe"}}, "required": ["architecture"]},
            "then": {"required": _MOE_REQUIRED},
        },
        {
            "if": {"properties": {"architecture": {"const": "mimo"}}, "required": ["architecture"]},
            "then": {"required": ["num_nextn_predict_layers"]},
        },
        {
            "if": {"properties": {"architecture": {"const": "medusa"}}, "required": ["architecture"]},
            "then": {"required": ["medusa_num_heads", "medusa_fc_bias", "medusa_lm_heads"]},
        },
    ],
}


@dataclass(frozen=True)
class ModelSpec:
    """Architecture facts of one model (a validated architecture YAML or a ``config.json``)."""

    repo_id: str
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool
    torch_dtype: str
    attention_bias: bool = False
    mlp_bias: bool = False
    target_repo_id: str | None = None
    draft_vocab_size: int | None = None
    target_hidden_size: int | None = None
    num_aux_hidden_states: int | None = None  # EAGLE-3: target layers fc reads (3 when unset)
    fc_bias: bool = False
    first_layer_input_layernorm: bool = True
    shares_embed_tokens: bool = False
    shares_lm_head: bool = False
    has_d2t: bool = False
    has_t2d: bool = False
    use_qk_norm: bool = False
    moe_intermediate_size: int | None = None
    n_routed_experts: int | None = None
    n_shared_experts: int | None = None
    num_experts_per_tok: int | None = None
    first_k_dense_replace: int | None = None
    num_nextn_predict_layers: int = 0
    medusa_num_heads: int | None = None
    medusa_fc_bias: bool = False
    medusa_lm_heads: int | None = None  # own LM heads (0: one shared original_lm_head)
    source: str = field(default="", compare=False)

    @property
    def kv_bytes_per_layer_elem(self) -> int:
        """K and V elements per token for one layer: ``2 * n_kv * d_head``."""
        return 2 * self.num_key_value_heads * self.head_dim


# --------------------------------------------------------------------------------------------------
# Loading and validation


def model_file_name(repo_id: str) -> str:
    """``org/name`` -> ``org--name.yaml`` (the file holding that repo's architecture config)."""
    return repo_id.replace("/", "--") + ".yaml"


def _format_schema_error(source: str, err: jsonschema.ValidationError) -> str:
    where = "/".join(str(p) for p in err.absolute_path)
    if err.validator == "required":
        missing = [k for k in err.validator_value if isinstance(err.instance, dict) and k not in err.instance]
        arch = err.instance.get("architecture") if isinstance(err.instance, dict) else None
        why = f" (required for architecture {arch!r})" if arch and set(missing) - set(_COMMON_REQUIRED) else ""
        return "; ".join(f"{source}: key {k!r}: missing{why}" for k in missing)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        unknown = [k for k in err.instance if k not in MODEL_SCHEMA["properties"]]
        return "; ".join(
            f"{source}: key {k!r}: unknown key (allowed: {', '.join(sorted(MODEL_SCHEMA['properties']))})"
            for k in unknown
        )
    return f"{source}: key {where or '<root>'!r}: {err.message}"


def validate_model_config(data: Any, source: str) -> None:
    """Check ``data`` against :data:`MODEL_SCHEMA`; raise ``ValueError`` naming ``source`` and each bad key."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a mapping of config keys, got {type(data).__name__}")
    validator = jsonschema.Draft202012Validator(MODEL_SCHEMA)
    errors = sorted(validator.iter_errors(data), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if errors:
        raise ValueError("invalid model config:\n  " + "\n  ".join(_format_schema_error(source, e) for e in errors))


def _spec_from_mapping(data: Mapping[str, Any], source: str) -> ModelSpec:
    validate_model_config(dict(data), source)
    allowed = {f.name for f in fields(ModelSpec)}
    return ModelSpec(**{k: v for k, v in data.items() if k in allowed}, source=source)


def load_model_yaml(path: str | os.PathLike[str] | Traversable) -> ModelSpec:
    """Load and validate one architecture YAML; its ``repo_id`` must match the file name.

    ``path`` is a file path or a package-data file (:func:`sdbench.packagedata.data_file`).
    """
    if isinstance(path, (str, os.PathLike)):
        path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        from sdbench.errors import describe_yaml_error

        raise ValueError(f"{path}: not valid YAML: {describe_yaml_error(exc)}") from exc
    spec = _spec_from_mapping(data if data is not None else {}, str(path))
    if model_file_name(spec.repo_id) != path.name:
        raise ValueError(
            f"{path}: key 'repo_id': {spec.repo_id!r} belongs in {model_file_name(spec.repo_id)!r}, "
            f"not {path.name!r}"
        )
    return spec


# config.json model_type -> our architecture name (EAGLE-1 heads ship a plain llama config).
_HF_MODEL_TYPES = {"llama": "llama", "qwen3": "qwen3", "glm4_moe": "glm4_moe"}


def load_hf_config(path: str | os.PathLike[str], expect: str | None = None) -> ModelSpec:
    """Build a spec from a local Hugging Face ``config.json`` (or the directory holding it).

    ``expect="eagle"`` reads a plain llama config as an EAGLE-1 head (that is all its config says);
    an EAGLE-3 head is recognised by ``draft_vocab_size`` or an ``*Eagle3*`` architecture name.
    """
    path = Path(path)
    cfg_path = path / "config.json" if path.is_dir() else path
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{cfg_path}: cannot read a Hugging Face config.json ({exc})") from exc
    if not isinstance(cfg, dict):
        raise ValueError(f"{cfg_path}: expected a JSON object (a Hugging Face config.json), got {type(cfg).__name__}")
    src = str(cfg_path)
    archs = [str(a) for a in cfg.get("architectures") or []]
    model_type = cfg.get("model_type")
    if model_type == "medusa":
        return _medusa_spec(cfg, path, src)
    if "draft_vocab_size" in cfg or any("eagle3" in a.lower() for a in archs):
        arch = "eagle3"
    elif "MiMoForCausalLM" in archs:
        arch = "mimo"
    elif model_type in _HF_MODEL_TYPES:
        arch = _HF_MODEL_TYPES[model_type]
    else:
        raise ValueError(
            f"{src}: key 'model_type': {model_type!r} is not supported "
            f"(supported: {', '.join(sorted(_HF_MODEL_TYPES))}, or an EAGLE-3 head)"
        )
    if expect == "eagle" and arch == "llama":
        arch = "eagle"
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if key not in cfg:
            raise ValueError(f"{src}: key {key!r}: missing")
    heads = cfg["num_attention_heads"]
    data: dict[str, Any] = {
        "repo_id": cfg.get("_name_or_path") if "/" in str(cfg.get("_name_or_path", "")) else f"local/{path.name}",
        "architecture": arch,
        "vocab_size": cfg["vocab_size"],
        "hidden_size": cfg["hidden_size"],
        "intermediate_size": cfg["intermediate_size"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": cfg.get("num_key_value_heads") or heads,
        # transformers' default when config.json has no head_dim key
        "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        # transformers >= 4.56 writes "dtype"; no key means float32 weights
        "torch_dtype": cfg.get("torch_dtype") or cfg.get("dtype") or "float32",
        # A Qwen2 (MiMo) layer always has q/k/v biases; its config says nothing about them.
        "attention_bias": arch == "mimo" or bool(cfg.get("attention_bias", False)),
    }
    if arch != "glm4_moe":
        data["mlp_bias"] = bool(cfg.get("mlp_bias", False))
    if arch == "eagle":
        data.update(fc_bias=False, first_layer_input_layernorm=False, shares_embed_tokens=True, shares_lm_head=True)
    elif arch == "eagle3":
        draft_vocab = cfg.get("draft_vocab_size") or cfg["vocab_size"]
        # Same vocabulary: vLLM shares the target's lm_head and loads no d2t/t2d map
        # (llama_eagle3.py); a reduced draft vocabulary ships its own lm_head and d2t.
        own_vocab = draft_vocab != cfg["vocab_size"]
        data.update(
            draft_vocab_size=draft_vocab,
            fc_bias=False,
            shares_embed_tokens=True,
            shares_lm_head=not own_vocab,
            has_d2t=own_vocab,
            has_t2d=own_vocab,
        )
        if cfg.get("target_hidden_size"):
            data["target_hidden_size"] = cfg["target_hidden_size"]
        aux = cfg.get("num_aux_hidden_states") or len(
            (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or ()
        )
        if aux:
            data["num_aux_hidden_states"] = aux
    elif arch == "mimo":
        data["num_nextn_predict_layers"] = int(cfg.get("num_nextn_predict_layers") or 0)
    elif arch == "glm4_moe":
        data["use_qk_norm"] = bool(cfg.get("use_qk_norm", False))
        for key in _MOE_REQUIRED:
            if key in cfg:
                data[key] = cfg[key]
    return _spec_from_mapping(data, src)


def _medusa_spec(cfg: Mapping[str, Any], path: Path, src: str) -> ModelSpec:
    """A Medusa config (vLLM's ``MedusaConfig``): no attention, so the attention fields hold
    placeholders (one head of ``hidden_size``) that nothing counts; no KV cache."""
    for key in ("vocab_size", "hidden_size", "num_heads"):
        if key not in cfg:
            raise ValueError(f"{src}: key {key!r}: missing")
    h = cfg["hidden_size"]
    data = {
        "repo_id": f"local/{path.name}", "architecture": "medusa", "vocab_size": cfg["vocab_size"],
        "hidden_size": h, "intermediate_size": h, "num_hidden_layers": int(cfg.get("num_hidden_layers") or 1),
        "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": h, "tie_word_embeddings": False,
        "torch_dtype": cfg.get("torch_dtype") or cfg.get("dtype") or "float32",
        "medusa_num_heads": cfg["num_heads"], "medusa_fc_bias": bool(cfg.get("medusa_fc_bias", False)),
        # vLLM: one LM head per Medusa head, unless original_lm_head shares a single one.
        "medusa_lm_heads": 0 if cfg.get("original_lm_head") else cfg["num_heads"],
        "draft_vocab_size": cfg.get("truncated_vocab_size") or cfg["vocab_size"],
    }  # fmt: skip
    return _spec_from_mapping(data, src)


def load_model_spec(
    name: str, models_dir: str | os.PathLike[str] | None = None, expect: str | None = None
) -> ModelSpec:
    """Resolve ``name`` to a spec: a local model dir / ``config.json`` path, else a repo id.

    A repo id is looked up in ``models_dir`` when given (and only there), else in the package's
    architecture YAMLs and ``$SDBENCH_DATA_DIR/models`` (:mod:`sdbench.packagedata`).
    """
    local = Path(name)
    if local.is_dir() or (local.is_file() and local.suffix == ".json"):
        return load_hf_config(local, expect=expect)
    if local.is_file() and local.suffix in (".yaml", ".yml"):
        return load_model_yaml(local)
    if name.count("/") != 1 or name.startswith((".", "/", "~")):
        raise ValueError(f"{name!r}: no such model directory or config.json (a repo id looks like 'org/name')")
    file_name = model_file_name(name)
    if models_dir is None:
        try:
            return load_model_yaml(data_file("models", file_name))
        except FileNotFoundError:
            override = override_dir()
            where = f"expected {file_name} in {shipped_dir('models')}"
            if override is not None:
                where += f" or {override / 'models'}"
            known = list_data("models")
    else:
        mdir = Path(models_dir)
        path = mdir / file_name
        if path.is_file():
            return load_model_yaml(path)
        where = f"expected {path}"
        known = sorted(p.name for p in mdir.glob("*.yaml")) if mdir.is_dir() else []
    repo_ids = [k.removesuffix(".yaml").replace("--", "/", 1) for k in known]
    raise ValueError(
        f"no architecture config for {name!r}: {where} "
        f"(known: {', '.join(repo_ids) or 'none'}; or pass a local model directory / config.json)"
    )


def iter_model_specs(models_dir: str | os.PathLike[str] | None = None) -> Iterable[ModelSpec]:
    """Load and validate every architecture YAML: those in ``models_dir``, else the package's (with overrides)."""
    if models_dir is not None:
        for path in sorted(Path(models_dir).glob("*.yaml")):
            yield load_model_yaml(path)
        return
    for name in list_data("models"):
        yield load_model_yaml(data_file("models", name))
