"""Prompt sets: the paper's six datasets from the Hugging Face hub, and offline
prompt sets the pipeline builds itself for the embedded CPU default.

Every builder yields ``(request_id, prompt_text, reference)`` records; :func:`prepare`
samples ``num_prompts`` of them deterministically (seeded), applies the target's
chat template when it has one, tokenizes, and returns the prompt table:

``request_id`` (str), ``dataset`` (str), ``category`` (str), ``prompt_text`` (str),
``prompt_token_ids`` (list<int32>), ``reference`` (str, "" when none).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sdbench.io import write_parquet


@dataclass(frozen=True)
class PromptRecord:
    """One candidate prompt before sampling and tokenization."""

    request_id: str
    prompt_text: str
    reference: str = ""


Builder = Callable[[dict[str, Any], int], Iterator[PromptRecord]]
BUILDERS: dict[str, Builder] = {}


def builder(name: str) -> Callable[[Builder], Builder]:
    """Register a prompt builder under ``name`` (the dataset entry's ``builder`` key)."""

    def deco(fn: Builder) -> Builder:
        BUILDERS[name] = fn
        return fn

    return deco


# --- Offline prompt sets (embedded default) -----------------------------------------


def _function_id(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]


@builder("code_edit")
def build_code_edit(entry: dict[str, Any], seed: int) -> Iterator[PromptRecord]:
    """InstructCoder-like: a held-out function plus an edit request; reference = edited code.

    Uses the same edit generator as model training, so the target has learned the
    task format (copy the code, applying the edit): high prompt overlap.
    """
    from sdbench.corpus import corpus_functions, make_edit_example

    for text in corpus_functions("heldout"):
        fid = _function_id(text)
        try:
            example = make_edit_example(text, random.Random(f"{seed}:{fid}"))
        except ValueError:
            continue
        yield PromptRecord(f"edit-{fid}", example.prompt, example.completion)


@builder("code_write")
def build_code_write(entry: dict[str, Any], seed: int) -> Iterator[PromptRecord]:
    """Low-overlap workload: a held-out function's signature and docstring; the model writes the body."""
    from sdbench.corpus import corpus_functions

    for text in corpus_functions("heldout"):
        node = ast.parse(text).body[0]
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or ast.get_docstring(node) is None:
            continue
        if len(node.body) < 2:
            continue
        lines = text.splitlines()
        doc_end = node.body[0].end_lineno or node.lineno  # prompt ends after the docstring
        body = "\n".join(lines[doc_end:]).lstrip("\n")
        # End with the body's indentation: after a bare docstring the model (trained on edit
        # examples too) would otherwise take the function as complete and start an edit request.
        indent = body[: len(body) - len(body.lstrip(" \t"))]
        prompt = "\n".join(lines[:doc_end]) + "\n" + indent
        yield PromptRecord(f"write-{_function_id(text)}", prompt, body[len(indent) :])


# --- Hugging Face datasets (cluster) ------------------------------------------------


def _load_hf(entry: dict[str, Any]) -> Any:
    """Load a pinned dataset revision with the ``datasets`` library."""
    import datasets  # only needed on machines that prepare the paper's datasets

    kwargs: dict[str, Any] = {"revision": entry.get("revision", "main"), "split": entry.get("split", "train")}
    if entry.get("data_files"):
        kwargs["data_files"] = entry["data_files"]
    return datasets.load_dataset(entry["hf_id"], entry.get("hf_config"), **kwargs)


def _hf_records(entry: dict[str, Any], fmt: Callable[[dict[str, Any]], tuple[str, str] | None]) -> Iterator[PromptRecord]:
    for i, row in enumerate(_load_hf(entry)):
        formatted = fmt(row)
        if formatted is not None:
            yield PromptRecord(str(row.get("id", i)), *formatted)


@builder("instructcoder")
def build_instructcoder(entry: dict[str, Any], seed: int) -> Iterator[PromptRecord]:
    """likaixin/InstructCoder: instruction + input code (as vLLM's benchmark formats it)."""
    return _hf_records(entry, lambda r: (f"{r['instruction']}:\n{r['input']}", r.get("output", "")))


@builder("sharegpt")
def build_sharegpt(entry: dict[str, Any], seed: int) -> Iterator[PromptRecord]:
    """ShareGPT: the first human turn; reference = the first assistant turn."""

    def fmt(r: dict[str, Any]) -> tuple[str, str] | None:
        turns = r.get("conversations") or []
        if len(turns) < 2 or turns[0].get("from") != "human":
            return None
        return turns[0]["value"], turns[1].get("value", "")

    return _hf_records(entry, fmt)


@builder("cnn_dailymail")
def build_cnn(entry: dict[str, Any], seed: int) -> Iterator[PromptRecord]:
    """abisee/cnn_dailymail 3.0.0: summarise the article; reference = highlights."""
    return _hf_records(
        entry, lambda r: (f"Summarize the following news article.\n\n{r['article']}", r["highlights"])
    )


@builder("gsm8k")
def build_gsm8k(entry: dict[str, Any], seed: int) -> Iterator[PromptRecord]:
    """openai/gsm8k main: the question; reference = the worked answer."""
    return _hf_records(entry, lambda r: (r["question"], r["answer"]))


@builder("aime")
def build_aime(entry: dict[str, Any], seed: int) -> Iterator[PromptRecord]:
    """AI-MO/aimo-validation-aime (AIME 2022-24): the problem; reference = the answer."""
    return _hf_records(entry, lambda r: (r["problem"], str(r["answer"])))


@builder("gpqa")
def build_gpqa(entry: dict[str, Any], seed: int) -> Iterator[PromptRecord]:
    """Idavidrein/gpqa gpqa_main: question with shuffled choices (seeded per row)."""

    def fmt(r: dict[str, Any]) -> tuple[str, str]:
        choices = [r["Correct Answer"], r["Incorrect Answer 1"], r["Incorrect Answer 2"], r["Incorrect Answer 3"]]
        random.Random(f"{seed}:{r['Question']}").shuffle(choices)
        letters = "ABCD"
        body = "\n".join(f"({letters[i]}) {c.strip()}" for i, c in enumerate(choices))
        answer = letters[choices.index(r["Correct Answer"])]
        return f"{r['Question'].strip()}\n\n{body}\n\nAnswer with the letter of the correct choice.", answer

    return _hf_records(entry, fmt)


# --- Sampling and tokenization ------------------------------------------------------


def render_prompt(tokenizer: Any, text: str, chat_template_kwargs: dict[str, Any]) -> list[int]:
    """Token ids of ``text``: through the chat template when the tokenizer has one."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}],
            add_generation_prompt=True,
            tokenize=True,
            **chat_template_kwargs,
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]
    return [int(t) for t in tokenizer(text, add_special_tokens=True)["input_ids"]]


def prepare(
    name: str,
    entry: dict[str, Any],
    tokenizer: Any,
    seed: int,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> pd.DataFrame:
    """Sample ``entry['num_prompts']`` prompts (seeded shuffle) and tokenize them."""
    try:
        build = BUILDERS[entry["builder"]]
    except KeyError:
        raise ValueError(
            f"datasets.{name}.builder: unknown builder {entry['builder']!r} (known: {', '.join(sorted(BUILDERS))})"
        ) from None
    records = sorted(build(entry, seed), key=lambda r: r.request_id)
    random.Random(seed).shuffle(records)
    limit = entry.get("max_prompt_tokens")
    rows: list[dict[str, Any]] = []
    for rec in records:
        ids = render_prompt(tokenizer, rec.prompt_text, chat_template_kwargs or {})
        if limit is not None and len(ids) > limit:
            continue
        rows.append(
            {
                "request_id": rec.request_id,
                "dataset": name,
                "category": entry.get("category", ""),
                "prompt_text": rec.prompt_text,
                "prompt_token_ids": ids,
                "reference": rec.reference,
            }
        )
        if len(rows) == entry["num_prompts"]:
            break
    if len(rows) < entry["num_prompts"]:
        raise ValueError(
            f"datasets.{name}: only {len(rows)} prompts available (num_prompts={entry['num_prompts']}, "
            f"max_prompt_tokens={limit})"
        )
    return pd.DataFrame(rows)


def _cmd_prepare(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    entry = json.loads(args.entry)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    df = prepare(args.name, entry, tokenizer, args.seed, json.loads(args.chat_template_kwargs))
    write_parquet(df, Path(args.output))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench prepare-dataset``."""
    p = subparsers.add_parser("prepare-dataset", help="sample and tokenize a prompt set")
    p.add_argument("--name", required=True, help="dataset key in the config")
    p.add_argument("--entry", required=True, help="the dataset's config entry (JSON)")
    p.add_argument("--tokenizer", required=True, help="tokenizer directory (the target model's)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--chat-template-kwargs", default="{}", help="JSON dict for apply_chat_template")
    p.add_argument("--output", required=True, help="prompt table (parquet)")
    p.set_defaults(func=_cmd_prepare)
