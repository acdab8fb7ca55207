"""What ``vllm bench throughput`` gets in ``sdbench bench parity``: the runner's prompts as a
ShareGPT file the tool reads in the runner's order, and the runner's engine arguments as the
tool's command line (checked by building ``EngineArgs`` both ways).
"""

from __future__ import annotations

import argparse
import json
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any


# --- prompts for the tool ------------------------------------------------------------


def shuffle_permutation(n: int, seed: int) -> list[int]:
    """``perm`` with ``shuffled[j] = original[perm[j]]`` after ``random.seed(seed); random.shuffle``.

    ``random.shuffle`` draws depend only on the length, so shuffling indices gives the permutation
    the tool's ShareGPT loader applies to its entries.
    """
    perm = list(range(n))
    random.Random(seed).shuffle(perm)
    return perm


def pre_shuffle_order(items: Sequence[Any], seed: int) -> list[Any]:
    """``items`` arranged so that the tool's seeded shuffle yields them in the given order."""
    perm = shuffle_permutation(len(items), seed)
    out: list[Any] = [None] * len(items)
    for j, source in enumerate(perm):
        out[source] = items[j]
    return out


def prompt_texts(tokenizer: Any, id_lists: Sequence[Sequence[int]]) -> tuple[list[str], list[int]]:
    """Text per prompt that the engine re-tokenizes (special tokens added) to the same ids.

    Tries the decoded ids with special tokens kept, then without a leading BOS (the tokenizer
    adds it back). Returns (texts, indices of prompts whose re-tokenization differs); such a
    prompt keeps the first candidate.
    """
    bos = getattr(tokenizer, "bos_token_id", None)
    texts: list[str] = []
    mismatches: list[int] = []
    for i, ids in enumerate(id_lists):
        ids = [int(t) for t in ids]
        candidates = [tokenizer.decode(ids, skip_special_tokens=False)]
        if bos is not None and ids and ids[0] == bos:
            candidates.append(tokenizer.decode(ids[1:], skip_special_tokens=False))
        for text in candidates:
            if [int(t) for t in tokenizer(text)["input_ids"]] == ids:
                texts.append(text)
                break
        else:
            texts.append(candidates[0])
            mismatches.append(i)
    return texts, mismatches


def write_sharegpt(path: str | os.PathLike[str], texts: Sequence[str], seed: int) -> Path:
    """A ShareGPT JSON the tool (``--dataset-name sharegpt --seed SEED``) reads in ``texts`` order.

    The completion turn is a placeholder: ``--output-len`` replaces its length.
    """
    entries = [{"conversations": [{"from": "human", "value": t}, {"from": "gpt", "value": "-"}]} for t in texts]
    path = Path(path)
    path.write_text(json.dumps(pre_shuffle_order(entries, seed)), encoding="utf-8")
    return path


# --- engine arguments -> the tool's command line ------------------------------------------


def engine_cli_args(kwargs: dict[str, Any], parser: argparse.ArgumentParser) -> list[str]:
    """``LLM(**kwargs)`` keyword arguments as options of ``parser`` (the tool's parser).

    Booleans use the parser's own spelling: ``--x``/``--no-x`` for BooleanOptionalAction, ``--x``
    for a store_true option set to True (False is then its default and is left out). Dicts and
    lists go as JSON (``--speculative-config '{...}'``). Raises ``ValueError`` for a keyword
    the parser has no option for or cannot express.
    """
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    argv: list[str] = []
    for key, value in kwargs.items():
        action = actions.get(key)
        if action is None:
            raise ValueError(f"vllm bench throughput has no option for engine argument {key!r}")
        flag = next((s for s in action.option_strings if s == "--" + key.replace("_", "-")), action.option_strings[0])
        if isinstance(action, argparse.BooleanOptionalAction):
            if not isinstance(value, bool):
                raise ValueError(f"engine argument {key!r}: expected a bool, got {value!r}")
            argv.append(flag if value else "--no-" + flag[2:])
        elif isinstance(action, argparse._StoreTrueAction):
            if value is True:
                argv.append(flag)
            elif value is False and not action.default:
                continue  # the option's default
            else:
                raise ValueError(f"engine argument {key!r}={value!r} cannot be spelled with {flag}")
        elif isinstance(action, argparse._StoreFalseAction):
            if value is False:
                argv.append(flag)
            elif value is not True:
                raise ValueError(f"engine argument {key!r}={value!r} cannot be spelled with {flag}")
        elif value is None:
            continue
        else:
            argv += [flag, json.dumps(value) if isinstance(value, dict | list) else str(value)]
    return argv


def vllm_bench_argv(
    kwargs: dict[str, Any],
    parser: argparse.ArgumentParser,
    dataset_path: str | os.PathLike[str],
    num_prompts: int,
    output_len: int,
    num_warmups: int,
) -> list[str]:
    """Arguments of ``vllm bench throughput`` for the cell (dataset part, then engine part)."""
    return [
        "--backend", "vllm",
        "--dataset-name", "sharegpt",
        "--dataset-path", str(dataset_path),
        "--num-prompts", str(num_prompts),
        "--output-len", str(output_len),
        "--num-warmups", str(num_warmups),
        *engine_cli_args(kwargs, parser),
    ]  # fmt: skip


# vLLM 0.11 moved FlexibleArgumentParser from vllm.utils into vllm.utils.argparse_utils.
ARGUMENT_PARSER_HOMES = ("vllm.utils.argparse_utils", "vllm.utils")


def flexible_argument_parser() -> argparse.ArgumentParser:
    """A new ``FlexibleArgumentParser`` (the parser vLLM's CLI tools build), wherever this release keeps it."""
    import importlib

    for module in ARGUMENT_PARSER_HOMES:
        try:
            return importlib.import_module(module).FlexibleArgumentParser()
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"no FlexibleArgumentParser in {' or '.join(ARGUMENT_PARSER_HOMES)}")


def vllm_bench_parser() -> argparse.ArgumentParser:
    """The parser ``vllm bench throughput`` uses (imports vLLM)."""
    from vllm.benchmarks.throughput import add_cli_args

    parser = flexible_argument_parser()
    add_cli_args(parser)
    return parser


# EngineArgs fields whose value differs between LLM(...) and the tool's CLI defaults only in a
# way the engine never reads for a text-only model without LoRA or a reasoning parser.
BENIGN_DEFAULT_DIFFS = {
    "enable_lora": (False, None),
    "mm_device_do_normalize": (True, None),
    "reasoning_parser_plugin": (None, ""),
}


def engine_args_diff(kwargs: dict[str, Any], argv: Sequence[str], parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Fields of ``EngineArgs`` that differ between ``LLM(**kwargs)`` and the tool's ``argv``.

    Builds both without starting an engine: the LLM side is stopped right before
    ``LLMEngine.from_engine_args``. Differences listed in :data:`BENIGN_DEFAULT_DIFFS` are left out.
    Returns ``{field: (llm_value, tool_value)}``.
    """
    import dataclasses

    import vllm.entrypoints.llm as llm_module
    from vllm.engine.arg_utils import EngineArgs

    tool_args = EngineArgs.from_cli_args(parser.parse_args(list(argv)))

    class _Captured(Exception):
        pass

    captured: dict[str, Any] = {}
    original = llm_module.LLMEngine.__dict__["from_engine_args"]

    def _capture(cls: Any, engine_args: Any, *args: Any, **kw: Any) -> Any:
        captured["engine_args"] = engine_args
        raise _Captured

    llm_module.LLMEngine.from_engine_args = classmethod(_capture)
    try:
        llm_module.LLM(**kwargs)
    except _Captured:
        pass
    finally:
        llm_module.LLMEngine.from_engine_args = original
    llm_args = captured["engine_args"]
    diff = {}
    for f in dataclasses.fields(EngineArgs):
        a, b = getattr(llm_args, f.name), getattr(tool_args, f.name)
        if a != b and BENIGN_DEFAULT_DIFFS.get(f.name) != (a, b):
            diff[f.name] = (a, b)
    return diff


# ----------------------------------------------------------------------------- touchpoints
from sdbench.engine.release import touchpoints as tp  # noqa: E402 - standard library only



def _check_argument_parser(src: tp.SourceTree) -> str | None:
    homes = [m for m in ARGUMENT_PARSER_HOMES if src.has(f"{m}:FlexibleArgumentParser")]
    return None if homes else f"no FlexibleArgumentParser in {' or '.join(ARGUMENT_PARSER_HOMES)}"


TOUCHPOINTS = tp.declare(
    __name__,
    tp.defined("parity.bench_throughput_args", "vllm.benchmarks.throughput:add_cli_args", ["parser"]),
    tp.custom("parity.argument_parser", _check_argument_parser,
              [f"{m}:FlexibleArgumentParser" for m in ARGUMENT_PARSER_HOMES]),
    tp.defined("parity.engine_args", "vllm.engine.arg_utils:EngineArgs.from_cli_args"),
    tp.defined("parity.llm_engine", "vllm.entrypoints.llm:LLMEngine.from_engine_args"),
)
