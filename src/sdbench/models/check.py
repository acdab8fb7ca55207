"""Check a model or drafter-head directory before an engine loads it.

vLLM loads a checkpoint without complaining about *missing* tensors (the EAGLE heads' and the
Llama ``load_weights`` return no loaded-name set, so the "weights not initialized" check is
skipped): a head lacking ``fc.weight`` or a target lacking a layer's ``q_proj`` starts and serves
garbage. :func:`check_model_dir` fails first, naming the directory and the missing tensor(s).

It reads only ``config.json`` and the JSON headers of the ``*.safetensors`` files (no torch, no
tensor data). Roles and the tensors each needs:

- ``target`` / ``draft`` (a standalone Llama-like model: llama, mistral, qwen2, qwen3):
  ``model.embed_tokens``; per layer up to ``num_hidden_layers`` the q/k/v/o projections (or a
  fused ``qkv_proj``), gate/up/down (or ``gate_up_proj``), ``input_layernorm`` and
  ``post_attention_layernorm`` (plus ``q_norm``/``k_norm`` for qwen3 and biases when the config
  says so); ``model.norm``; ``lm_head`` unless ``tie_word_embeddings``. Other architectures get
  the directory, config and header checks only.
- ``eagle`` (EAGLE-1 head, vLLM ``EagleLlamaForCausalLM``): keys without a ``model.`` prefix;
  ``fc.weight`` and ``layers.<i>.{self_attn.{q,k,v,o}_proj, post_attention_layernorm,
  mlp.{gate,up,down}_proj}``; layer 0 has no ``input_layernorm`` and the head has no ``norm`` or
  ``lm_head`` (vLLM rejects those keys).
- ``eagle3`` (EAGLE-3 head, vLLM ``Eagle3LlamaForCausalLM``): ``fc.weight``, ``midlayer.*`` (or
  ``layers.0.*``) with ``input_layernorm``, ``hidden_norm``, ``post_attention_layernorm``, the
  attention and MLP projections; ``norm.weight``; ``lm_head.weight`` and ``d2t`` when
  ``draft_vocab_size`` differs from ``vocab_size`` (else the target's lm_head is shared and no
  ``d2t`` may be shipped).
- ``mtp`` (a target that carries its MTP layers; named for vLLM ``MiMoForCausalLM``): the ``target`` tensors
  plus, per layer up to ``num_nextn_predict_layers``, ``model.mtp_layers.<i>.{token_layernorm,
  hidden_layernorm, input_proj, final_layernorm}`` and a Qwen2 decoder layer (q/k/v biases).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sdbench.errors import ConfigError

ROLES = ("target", "draft", "eagle", "eagle3", "mtp")
LLAMA_LIKE = frozenset({"llama", "mistral", "qwen2", "qwen3"})
MIMO = "MiMoForCausalLM"  # the MTP layout checked by name (model.mtp_layers.<i>.*)
CONFIG_FILE = "config.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"
_MAX_HEADER = 100 * 2**20  # safetensors caps its JSON header at 100 MB
_SHOW = 8  # missing tensors named in a message before "... (N more)"


def _listing(names: Iterable[str]) -> str:
    names = sorted(names)
    shown = ", ".join(names[:_SHOW])
    return shown + (f", ... ({len(names) - _SHOW} more)" if len(names) > _SHOW else "")


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``config.json`` of model directory ``path``; ConfigError naming the directory or file."""
    directory = Path(path)
    if not directory.exists():
        raise ConfigError(f"{directory}: model directory does not exist")
    if not directory.is_dir():
        raise ConfigError(f"{directory}: not a directory (expected a model directory with {CONFIG_FILE} and weights)")
    cfg_path = directory / CONFIG_FILE
    if not cfg_path.is_file():
        raise ConfigError(f"{directory}: no {CONFIG_FILE} (expected a Hugging Face model directory)")
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{cfg_path}: not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ConfigError(f"{cfg_path}: expected a JSON object, got {type(config).__name__}")
    return config


def safetensors_header(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Tensor name -> ``{dtype, shape, data_offsets}`` from a safetensors file's JSON header.

    Checks that the header parses and that the file holds every tensor's bytes (a truncated
    download fails here, not inside the engine). ConfigError names the file.
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ConfigError(f"{path}: not a safetensors file ({size} bytes; expected an 8-byte header length)")
        (n,) = struct.unpack("<Q", head)
        if n > min(_MAX_HEADER, size - 8):
            raise ConfigError(
                f"{path}: not a safetensors file (header length {n} does not fit the file's {size} bytes)"
            )
        raw = fh.read(n)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: corrupted safetensors header (not valid JSON: {exc})") from exc
    if not isinstance(header, dict):
        raise ConfigError(f"{path}: corrupted safetensors header (expected a JSON object)")
    header.pop("__metadata__", None)
    end = 0
    for name, info in header.items():
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise ConfigError(f"{path}: corrupted safetensors header (tensor {name!r} has no data_offsets)")
        end = max(end, offsets[1])
    if 8 + n + end > size:
        raise ConfigError(
            f"{path}: truncated: the header describes {8 + n + end} bytes, the file has {size} "
            "(re-download or re-save it)"
        )
    return header


def weight_files(path: str | os.PathLike[str]) -> tuple[list[Path], list[Path]]:
    """(``*.safetensors`` files, ``pytorch_model*.bin`` files) of a model directory."""
    directory = Path(path)
    return sorted(directory.glob("*.safetensors")), sorted(directory.glob("pytorch_model*.bin"))


def _layers(config: dict[str, Any], cfg_path: Path) -> int:
    n = config.get("num_hidden_layers")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"{cfg_path}: num_hidden_layers: expected an integer >= 1, got {n!r}")
    return n


def _attention_mlp(prefix: str, config: dict[str, Any], model_type: str, names: set[str]) -> list[str]:
    """Missing attention/MLP tensors of the decoder layer at ``prefix`` (e.g. ``model.layers.0.``)."""
    need: list[str] = []
    attn, mlp = f"{prefix}self_attn.", f"{prefix}mlp."
    if f"{attn}qkv_proj.weight" not in names:
        need += [f"{attn}{p}_proj.weight" for p in "qkv"]
    need.append(f"{attn}o_proj.weight")
    if f"{mlp}gate_up_proj.weight" not in names:
        need += [f"{mlp}gate_proj.weight", f"{mlp}up_proj.weight"]
    need.append(f"{mlp}down_proj.weight")
    if model_type == "qwen2" or config.get("attention_bias"):
        if f"{attn}qkv_proj.bias" not in names:
            need += [f"{attn}{p}_proj.bias" for p in "qkv"]
        if config.get("attention_bias") and model_type != "qwen2":
            need.append(f"{attn}o_proj.bias")
    if config.get("mlp_bias"):
        need += [f"{mlp}{p}_proj.bias" for p in ("gate", "up", "down")]
    if model_type == "qwen3":
        need += [f"{attn}q_norm.weight", f"{attn}k_norm.weight"]
    return need


def required_tensors(config: dict[str, Any], role: str, names: set[str], cfg_path: Path) -> tuple[list[str], list[str]]:
    """(Required tensor names, forbidden names present) for ``role``; ``names`` are the
    checkpoint's (fused projections are accepted in place of the separate ones)."""
    model_type = str(config.get("model_type", ""))
    n = _layers(config, cfg_path)
    if role in ("target", "draft"):
        need = ["model.embed_tokens.weight", "model.norm.weight"]
        for i in range(n):
            p = f"model.layers.{i}."
            need += [f"{p}input_layernorm.weight", f"{p}post_attention_layernorm.weight"]
            need += _attention_mlp(p, config, model_type, names)
        if not config.get("tie_word_embeddings", False):
            need.append("lm_head.weight")
        return need, []
    if role == "mtp":
        need, _ = required_tensors(config, "target", names, cfg_path)
        if MIMO not in (config.get("architectures") or []):
            return need, []  # other MTP layouts (DeepSeek, GLM): the target's tensors only
        layers = config.get("num_nextn_predict_layers")
        if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
            raise ConfigError(f"{cfg_path}: num_nextn_predict_layers: expected an integer >= 1 for an MTP model, got {layers!r}")
        for i in range(layers):
            p = f"model.mtp_layers.{i}."
            need += [f"{p}{n}.weight" for n in ("token_layernorm", "hidden_layernorm", "input_proj", "final_layernorm")]
            need += [f"{p}input_layernorm.weight", f"{p}post_attention_layernorm.weight"]
            need += _attention_mlp(p, config, "qwen2", names)
        return need, []
    prefixed = sorted(k for k in names if k.startswith("model."))
    if role == "eagle":
        need = ["fc.weight"]
        for i in range(n):
            p = f"layers.{i}."
            need += [f"{p}post_attention_layernorm.weight", *_attention_mlp(p, config, "llama", names)]
            if i > 0:
                need.append(f"{p}input_layernorm.weight")
        forbidden = [k for k in ("layers.0.input_layernorm.weight", "norm.weight", "lm_head.weight") if k in names]
        return need, prefixed + forbidden
    # eagle3: layer 0 is `midlayer.` (or `layers.0.`), further layers are standard ones.
    first = "layers.0." if any(k.startswith("layers.0.") for k in names) else "midlayer."
    need = ["fc.weight", "norm.weight"]
    for i in range(n):
        p = first if i == 0 else f"layers.{i}."
        need += [f"{p}input_layernorm.weight", f"{p}post_attention_layernorm.weight"]
        need += _attention_mlp(p, config, "llama", names)
        if i == 0:
            need.append(f"{p}hidden_norm.weight")
    vocab, draft_vocab = config.get("vocab_size"), config.get("draft_vocab_size", config.get("vocab_size"))
    forbidden = list(prefixed)
    if draft_vocab != vocab:
        need += ["lm_head.weight", "d2t"]
    elif "d2t" in names:
        forbidden.append("d2t")
    return need, forbidden


def check_model_dir(path: str | os.PathLike[str], role: str = "target") -> None:
    """Verify a model (``target``/``draft``) or drafter-head (``eagle``/``eagle3``) directory.

    Checks: the directory exists; ``config.json`` parses; at least one weights file
    (``*.safetensors`` or ``pytorch_model*.bin``); every safetensors header parses and its file
    is complete; the tensors the architecture needs are present (safetensors only: ``.bin``
    files are pickles and are not opened). Raises :class:`ConfigError` naming the directory
    and what is missing.
    """
    if role not in ROLES:
        raise ConfigError(f"role {role!r}: expected one of {', '.join(ROLES)}")
    directory = Path(path)
    config = read_config(directory)
    cfg_path = directory / CONFIG_FILE
    safetensors, bins = weight_files(directory)
    if not safetensors and not bins:
        raise ConfigError(f"{directory}: no weights file (expected *.safetensors or pytorch_model*.bin)")
    if not safetensors:
        return
    index = directory / SAFETENSORS_INDEX
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"{index}: expected a JSON object with a weight_map ({exc})") from exc
        absent = [s for s in sorted(shards) if not (directory / s).is_file()]
        if absent:
            raise ConfigError(f"{directory}: shard(s) listed in {SAFETENSORS_INDEX} missing: {_listing(absent)}")
    names: set[str] = set()
    for file in safetensors:
        names.update(safetensors_header(file))
    if not checks_tensor_names(config, role):
        return  # tensor layout of this architecture unknown here: file checks only
    need, forbidden = required_tensors(config, role, names, cfg_path)
    missing = [k for k in dict.fromkeys(need) if k not in names]
    what = {"target": "a target model", "draft": "a draft model", "eagle": "an EAGLE-1 head", "mtp": "an MTP model"}.get(
        role, "an EAGLE-3 head"
    )
    if missing:
        hint = (
            "; its keys start with 'model.': a full model, not a head?"
            if role.startswith("eagle") and any(k.startswith("model.") for k in names)
            else ""
        )
        raise ConfigError(
            f"{directory}: missing tensor(s) needed by {what}: {_listing(missing)} "
            f"(vLLM would leave them uninitialized; {len(names)} tensors in {len(safetensors)} safetensors file(s){hint})"
        )
    if forbidden:
        why = (
            "keys must not start with 'model.', vLLM adds it; "
            if any(k.startswith("model.") for k in forbidden)
            else ""
        )
        raise ConfigError(
            f"{directory}: unexpected tensor(s) for {what}: {_listing(forbidden)} ({why}vLLM rejects them)"
        )


def checks_tensor_names(config: dict[str, Any], role: str) -> bool:
    """Whether :func:`check_model_dir` knows the tensor layout of ``config`` in ``role``."""
    if role == "mtp" and MIMO in (config.get("architectures") or []):
        return True
    return role.startswith("eagle") or str(config.get("model_type", "")) in LLAMA_LIKE


def _cmd_check(args: argparse.Namespace) -> int:
    check_model_dir(args.directory, args.role)
    safetensors, bins = weight_files(args.directory)
    if not safetensors:
        detail = f"{len(bins)} pytorch .bin file(s); tensor names not checked"
    elif not checks_tensor_names(read_config(args.directory), args.role):
        detail = f"{len(safetensors)} safetensors file(s); tensor names not checked for this model_type"
    else:
        detail = f"{len(safetensors)} safetensors file(s), every tensor a {args.role} needs present"
    print(f"{args.directory}: ok ({args.role}: {detail})")
    return 0


def compare_tensors(
    what: str,
    expected: dict[str, tuple[int, ...]],
    shapes: dict[str, tuple[int, ...]] | Any,
    missing_why: str,
    unexpected_why: str,
) -> None:
    """Raise ``ValueError`` naming the first tensor of ``what`` that is missing, mis-shaped or
    unexpected (``expected`` and ``shapes``: name -> shape), with the reason vLLM makes it matter."""
    for name, shape in expected.items():
        if name not in shapes:
            raise ValueError(f"{what}: tensor {name!r} is missing{missing_why}")
        if tuple(shapes[name]) != shape:
            raise ValueError(f"{what}: tensor {name!r} has shape {list(shapes[name])}, expected {list(shape)}")
    for name in sorted(set(shapes) - set(expected)):
        raise ValueError(f"{what}: unexpected tensor {name!r} ({unexpected_why})")
