"""Prompt sets: the paper's six datasets from the Hugging Face hub, and offline
prompt sets the pipeline builds itself for the embedded CPU default.

Every builder yields ``(request_id, prompt_text, reference)`` records, optionally with a
category of their own (SPEED-Bench, :mod:`sdbench.datasets.speedbench`; otherwise the
entry's ``category``); :func:`prepare` samples ``num_prompts`` of them deterministically
(seeded), applies the target's chat template when it has one, tokenizes, and returns the
prompt table:

``request_id`` (str), ``dataset`` (str), ``category`` (str), ``prompt_text`` (str),
``prompt_token_ids`` (list<int32>), ``reference`` (str, "" when none), ``max_tokens`` (int: the
request's output budget, the entry's unless a user's prompts file sets it per row).

The hub datasets are all read by :func:`load_hf_dataset`, one call to
``datasets.load_dataset(hf_id, hf_config, split=..., revision=..., data_files=...)``.
An entry's optional ``local_path`` names a directory holding a copy of the hub
repository (e.g. made by ``hf download --repo-type dataset <hf_id> --revision <sha>
--local-dir <dir>``); it replaces ``hf_id`` as the first argument and every other
argument stays the same, so a cluster without hub access (and the tests) go through
the very call the online run makes.
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

from sdbench.errors import ConfigError
from sdbench.io import write_parquet


@dataclass(frozen=True)
class PromptRecord:
    """One candidate prompt before sampling and tokenization.

    ``category`` is the record's own workload category (e.g. a SPEED-Bench category); None
    takes the dataset entry's ``category``.
    """

    request_id: str
    prompt_text: str
    reference: str = ""
    category: str | None = None
    # A conversation up to its last user turn ((role, content) pairs), rendered by the chat
    # template instead of prompt_text (sdbench.datasets.userprompts).
    messages: tuple[tuple[str, str], ...] | None = None
    # The record's own output budget (at most the entry's max_tokens); None: the entry's.
    max_tokens: int | None = None


Builder = Callable[[dict[str, Any], int], Iterator[PromptRecord]]
BUILDERS: dict[str, Builder] = {}
# Builders kept in modules of their own, which import this one (for @builder and the hub
# loader): imported by name when builders are looked up (registered_builders), so that this
# module need not import them back.
BUILDER_MODULES: tuple[str, ...] = ("sdbench.datasets.speedbench", "sdbench.datasets.userprompts")


def builder(name: str) -> Callable[[Builder], Builder]:
    """Register a prompt builder under ``name`` (the dataset entry's ``builder`` key)."""

    def deco(fn: Builder) -> Builder:
        BUILDERS[name] = fn
        return fn

    return deco


def registered_builders() -> dict[str, Builder]:
    """Every builder: this module's and those of :data:`BUILDER_MODULES` (imported here)."""
    import importlib

    for module in BUILDER_MODULES:
        importlib.import_module(module)
    return BUILDERS


# --- Offline prompt sets (embedded default) -----------------------------------------


def _function_id(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]


@builder("code_edit")
def build_code_edit(entry: dict[str, Any], seed: int) -> Iterator[PromptRecord]:
    """InstructCoder-like: a held-out function plus an edit request; reference = edited code.

    Uses the same edit generator as model training, so the target has learned the
    task format (copy the code, applying the edit): high prompt overlap.
    """
    from sdbench.datasets.corpus import corpus_functions, make_edit_example

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
    from sdbench.datasets.corpus import corpus_functions

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


def _source(entry: dict[str, Any]) -> str:
    """Where an entry's rows come from, for error messages: hub id, local copy, config, split."""
    where = str(entry.get("hf_id", "<no hf_id>"))
    if entry.get("local_path"):
        where += f" (local copy {entry['local_path']})"
    if entry.get("hf_config"):
        where += f" config {entry['hf_config']!r}"
    return f"{where} split {entry.get('split', 'train')!r}"


def load_hf_dataset(entry: dict[str, Any]) -> Any:
    """Load a dataset entry's split with ``datasets.load_dataset``: the one call every hub builder uses.

    The first argument is ``hf_id``, or ``local_path`` when set: a directory with a copy of
    the hub repository (its README.md ``configs`` and data files), which ``load_dataset``
    reads like the hub repository, so ``hf_config``, ``split`` and ``data_files`` select
    the same files. ``revision`` is passed either way; for a local copy ``load_dataset``
    cannot check it (the copy is whatever revision was downloaded). In the workflow every hub
    entry has one: the copy ``download_dataset`` made (:func:`sdbench.models.hub.download_dataset`,
    its commit in ``sdbench-source.json``), read offline.
    """
    import datasets  # only needed on machines that prepare the paper's datasets

    path = entry.get("local_path") or entry["hf_id"]
    if entry.get("local_path") and not Path(path).is_dir():
        # load_dataset would take a missing "dir/name" for a hub id and fail far from the cause.
        raise ConfigError(f"local_path: {path!r} is not a directory (a local copy of {entry.get('hf_id')})")
    kwargs: dict[str, Any] = {"revision": entry.get("revision", "main"), "split": entry.get("split", "train")}
    if entry.get("data_files"):
        kwargs["data_files"] = entry["data_files"]
    return datasets.load_dataset(path, entry.get("hf_config"), **kwargs)


def _hf_records(
    entry: dict[str, Any],
    columns: tuple[str, ...],
    fmt: Callable[[dict[str, Any]], tuple[str, str] | None],
) -> Iterator[PromptRecord]:
    """Rows of the entry's split formatted by ``fmt``; ``columns`` are the ones ``fmt`` reads.

    Checks the columns before the first row so that a wrong config, split or file names the
    missing column instead of failing with a bare ``KeyError`` deep in formatting.
    """
    rows = load_hf_dataset(entry)
    found = list(rows.column_names)
    missing = [c for c in columns if c not in found]
    if missing:
        raise ConfigError(
            f"{_source(entry)}: rows lack column(s) {', '.join(map(repr, missing))} "
            f"(columns found: {', '.join(map(repr, found)) or 'none'})"
        )
    for i, row in enumerate(rows):
        formatted = fmt(row)
        if formatted is not None:
            rid = row.get("id")
            yield PromptRecord(str(i if rid is None else rid), *formatted)


@builder("instructcoder")
def build_instructcoder(entry: dict[str, Any], seed: int) -> Iterator[PromptRecord]:
    """likaixin/InstructCoder: instruction + input code (as vLLM's benchmark formats it)."""
    return _hf_records(
        entry, ("instruction", "input"), lambda r: (f"{r['instruction']}:\n{r['input']}", r.get("output") or "")
    )


@builder("sharegpt")
def build_sharegpt(entry: dict[str, Any], seed: int) -> Iterator[PromptRecord]:
    """ShareGPT: the first human turn; reference = the first assistant turn."""

    def fmt(r: dict[str, Any]) -> tuple[str, str] | None:
        turns = r.get("conversations") or []
        if len(turns) < 2 or turns[0].get("from") != "human":
            return None
        return turns[0]["value"], turns[1].get("value", "")

    return _hf_records(entry, ("conversations",), fmt)


@builder("cnn_dailymail")
def build_cnn(entry: dict[str, Any], seed: int) -> Iterator[PromptRecord]:
    """abisee/cnn_dailymail 3.0.0: summarise the article; reference = highlights."""
    return _hf_records(
        entry,
        ("article", "highlights"),
        lambda r: (f"Summarize the following news article.\n\n{r['article']}", r["highlights"]),
    )


@builder("gsm8k")
def build_gsm8k(entry: dict[str, Any], seed: int) -> Iterator[PromptRecord]:
    """openai/gsm8k main: the question; reference = the worked answer."""
    return _hf_records(entry, ("question", "answer"), lambda r: (r["question"], r["answer"]))


@builder("aime")
def build_aime(entry: dict[str, Any], seed: int) -> Iterator[PromptRecord]:
    """AI-MO/aimo-validation-aime (AIME 2022-24): the problem; reference = the answer."""
    return _hf_records(entry, ("problem", "answer"), lambda r: (r["problem"], str(r["answer"])))


@builder("gpqa")
def build_gpqa(entry: dict[str, Any], seed: int) -> Iterator[PromptRecord]:
    """Idavidrein/gpqa gpqa_main: question with shuffled choices (seeded per row)."""

    answers = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")

    def fmt(r: dict[str, Any]) -> tuple[str, str]:
        choices = [r[c] for c in answers]
        random.Random(f"{seed}:{r['Question']}").shuffle(choices)
        letters = "ABCD"
        body = "\n".join(f"({letters[i]}) {c.strip()}" for i, c in enumerate(choices))
        answer = letters[choices.index(r["Correct Answer"])]
        return f"{r['Question'].strip()}\n\n{body}\n\nAnswer with the letter of the correct choice.", answer

    return _hf_records(entry, ("Question", *answers), fmt)


# --- Sampling and tokenization ------------------------------------------------------


def render_prompt(
    tokenizer: Any,
    text: str,
    chat_template_kwargs: dict[str, Any],
    messages: tuple[tuple[str, str], ...] | None = None,
) -> list[int]:
    """Token ids of ``text`` (or of a conversation, ``messages``): through the chat template
    when the tokenizer has one.

    The templated ids are those of the rendered text tokenized *without* the tokenizer's
    own special tokens (``apply_chat_template`` does so): the template already writes the
    BOS it wants, and adding it again would give Llama-3 prompts a doubled
    ``<|begin_of_text|>``. Only untemplated (base model) prompts get ``add_special_tokens``;
    for them a conversation is its ``text`` (the turns' contents, userprompts).
    """
    if getattr(tokenizer, "chat_template", None):
        turns = [{"role": r, "content": c} for r, c in messages] if messages else [{"role": "user", "content": text}]
        ids = tokenizer.apply_chat_template(
            turns,
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
    """Sample ``entry['num_prompts']`` prompts (seeded shuffle) and tokenize them.

    Records that carry their own category (SPEED-Bench) are dealt round-robin over the
    categories after the shuffle (:func:`balanced_order`), so any prefix is balanced.
    """
    builders = registered_builders()
    # A prompts file is read by its column mapping; the entry's name goes into its error lines.
    entry = {**entry, "_name": name, "builder": entry.get("builder") or ("columns" if entry["source"] == "file" else "")}
    try:
        build = builders[entry["builder"]]
    except KeyError:
        raise ConfigError(
            f"datasets.{name}.builder: unknown builder {entry['builder']!r} (known: {', '.join(sorted(builders))})"
        ) from None
    try:
        records = sorted(build(entry, seed), key=lambda r: r.request_id)
    except ConfigError as exc:  # builders know the entry, not its key: name the dataset here
        raise ConfigError(f"datasets.{name}: {exc}") from exc
    random.Random(seed).shuffle(records)
    if any(r.category is not None for r in records):
        records = balanced_order(records, entry.get("category", ""))
    limit = entry.get("max_prompt_tokens")
    rows: list[dict[str, Any]] = []
    for rec in records:
        ids = render_prompt(tokenizer, rec.prompt_text, chat_template_kwargs or {}, rec.messages)
        if limit is not None and len(ids) > limit:
            continue
        rows.append(
            {
                "request_id": rec.request_id,
                "dataset": name,
                "category": entry.get("category", "") if rec.category is None else rec.category,
                "prompt_text": rec.prompt_text,
                "prompt_token_ids": ids,
                "reference": rec.reference,
                "max_tokens": int(rec.max_tokens or entry["max_tokens"]),
            }
        )
        if len(rows) == entry["num_prompts"]:
            break
    if len(rows) < entry["num_prompts"]:
        source = f" ({entry['path']} has {len(records)} rows)" if entry["source"] == "file" else ""
        raise ConfigError(
            f"datasets.{name}: only {len(rows)} prompts available{source} (num_prompts={entry['num_prompts']}, "
            f"max_prompt_tokens={limit})"
        )
    return pd.DataFrame(rows)


def balanced_order(records: list[PromptRecord], default: str) -> list[PromptRecord]:
    """``records`` dealt round-robin over their categories (sorted; None counts as ``default``),
    each category's records in their given order: every prefix holds each category ±1."""
    by_category: dict[str, list[PromptRecord]] = {}
    for rec in records:
        by_category.setdefault(default if rec.category is None else rec.category, []).append(rec)
    queues = [by_category[c] for c in sorted(by_category)]
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


# Columns an engine run needs from a prompt table (prepare() writes more).
PROMPT_COLUMNS = ("request_id", "prompt_token_ids")


def read_prompt_table(path: str | Path) -> pd.DataFrame:
    """Read a prompt table (:func:`prepare`'s output) for a run; errors name the file.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` for a file that is not a
    readable parquet, lacks :data:`PROMPT_COLUMNS`, has no rows or has an empty prompt.
    """
    from sdbench.io import read_parquet

    df = read_parquet(path, what="prompt table")
    missing = [c for c in PROMPT_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"{path}: prompt table lacks column(s) {', '.join(missing)} (has: {', '.join(df.columns) or 'none'}; "
            "expected the output of sdbench prepare-dataset)"
        )
    if df.empty:
        raise ValueError(f"{path}: prompt table has no rows (expected one row per prompt)")
    empty = [str(r) for r, ids in zip(df["request_id"], df["prompt_token_ids"]) if ids is None or len(ids) == 0]
    if empty:
        raise ValueError(f"{path}: empty prompt_token_ids for request(s) {', '.join(empty[:5])}")
    return df


def _json_arg(option: str, text: str) -> dict[str, Any]:
    """A JSON-object command-line value; ConfigError naming ``option`` otherwise."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{option}: not valid JSON ({exc}): {text[:60]!r}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{option}: expected a JSON object, got {type(value).__name__}")
    return value


def _cmd_prepare(args: argparse.Namespace) -> int:
    entry = _json_arg("--entry", args.entry)
    chat_kwargs = _json_arg("--chat-template-kwargs", args.chat_template_kwargs)
    if not Path(args.tokenizer).is_dir():
        raise FileNotFoundError(2, "no such directory (expected the target's tokenizer directory)", args.tokenizer)
    from transformers import AutoTokenizer  # slow: only once the arguments are known good

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    if entry.get("source") == "random_tokens":
        from sdbench.datasets.randomtokens import random_token_prompts

        if not args.matched:
            raise ConfigError(f"datasets.{args.name}: a random_tokens dataset needs --matched (its matched prompt table)")
        df = random_token_prompts(args.name, entry, read_prompt_table(args.matched), tokenizer, args.seed)
    else:
        df = prepare(args.name, entry, tokenizer, args.seed, chat_kwargs)
    write_parquet(df, Path(args.output))
    return 0
