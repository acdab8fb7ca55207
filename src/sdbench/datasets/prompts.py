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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sdbench.datasets.authors import is_valid_sequence, oversample, sharegpt_order, streaming_shuffle
from sdbench.datasets.chattemplate import FORMS, tokenize_prompt
from sdbench.datasets.prompttable import PROMPT_COLUMNS, read_prompt_table  # noqa: F401 - re-exported
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
    # form: authors only. chat False: the bare text, no chat template (the authors' AIME);
    # limits (max_prompt_len, max_total_len): keep the prompt only if it and ``completion``
    # pass vLLM's length filter (sdbench.datasets.authors.is_valid_sequence).
    chat: bool = True
    completion: str | None = None
    limits: tuple[int, int] | None = None


Builder = Callable[[dict[str, Any], int], Iterator[PromptRecord]]
BUILDERS: dict[str, Builder] = {}
# The builders that read the tiny models' corpus (sdbench.datasets.corpus): only their prompt tables
# depend on it, so an edit of the corpus re-prepares (and re-measures) no other dataset's.
CORPUS_BUILDERS = frozenset({"code_edit", "code_write"})
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


def _form(entry: dict[str, Any]) -> str:
    """An entry's prompt form: ``clean`` (default) or ``authors`` (:mod:`sdbench.datasets.chattemplate`)."""
    form = entry.get("form") or "clean"
    if form not in FORMS:
        raise ConfigError(f"form: {form!r} is not one of {', '.join(FORMS)}")
    return form


def _check_columns(entry: dict[str, Any], rows: Any, columns: tuple[str, ...]) -> None:
    """Name the missing column (and those found) before the first row is formatted."""
    found = list(rows.column_names)
    missing = [c for c in columns if c not in found]
    if missing:
        raise ConfigError(
            f"{_source(entry)}: rows lack column(s) {', '.join(map(repr, missing))} "
            f"(columns found: {', '.join(map(repr, found)) or 'none'})"
        )


def split_files(entry: dict[str, Any]) -> list[str]:
    """The data files of the entry's split, in the order ``load_dataset`` reads them."""
    import datasets

    path = entry.get("local_path") or entry["hf_id"]
    if entry.get("local_path") and not Path(path).is_dir():
        raise ConfigError(f"local_path: {path!r} is not a directory (a local copy of {entry.get('hf_id')})")
    kwargs: dict[str, Any] = {"revision": entry.get("revision", "main")}
    if entry.get("data_files"):
        kwargs["data_files"] = entry["data_files"]
    files = datasets.load_dataset_builder(path, entry.get("hf_config"), **kwargs).config.data_files or {}
    return [str(f) for f in files.get(entry.get("split", "train"), [])]


def _authors_hf_rows(entry: dict[str, Any], seed: int, columns: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    """The split's rows in the order the authors' streaming shuffle yielded them
    (:func:`sdbench.datasets.authors.streaming_shuffle`): with several data files, each is
    loaded on its own (same call, ``data_files`` narrowed to it) so their order can be shuffled."""
    files = split_files(entry) if entry.get("hf_id") or entry.get("local_path") else []
    if len(files) <= 1:
        shards = [load_hf_dataset(entry)]
    else:
        split = entry.get("split", "train")
        shards = [load_hf_dataset({**entry, "data_files": {split: [f]}}) for f in files]
    for shard in shards:
        _check_columns(entry, shard, columns)
    return streaming_shuffle(shards, seed)


@dataclass(frozen=True)
class RowFormat:
    """How a hub builder turns a row into a prompt, in each form, and back.

    ``clean``/``authors`` map a row to a record's fields (None: the row is skipped);
    ``parse_authors`` maps the user turn of an authors'-form prompt back to the row fields its
    ``authors`` format reads (``sdbench datasets check-published``).
    """

    columns: tuple[str, ...]
    clean: Callable[[dict[str, Any], int], dict[str, Any] | None]
    authors: Callable[[dict[str, Any]], dict[str, Any] | None]
    parse_authors: Callable[[str], dict[str, Any]]


ROW_FORMATS: dict[str, RowFormat] = {}


def _hf_records(entry: dict[str, Any], seed: int, fmt: RowFormat) -> Iterator[PromptRecord]:
    """Rows of the entry's split as records in the entry's form.

    ``clean``: every row in stored order, id = the row's ``id`` column or its index (prepare
    shuffles). ``authors``: rows in the authors' order (:mod:`sdbench.datasets.authors`), ids
    assigned by prepare from the position of the kept prompts.
    """
    if _form(entry) == "authors":
        for row in _authors_hf_rows(entry, seed, fmt.columns):
            fields = fmt.authors(row)
            if fields is not None:
                yield PromptRecord("", **fields)
        return
    rows = load_hf_dataset(entry)
    _check_columns(entry, rows, fmt.columns)
    for i, row in enumerate(rows):
        fields = fmt.clean(row, seed)
        if fields is not None:
            rid = row.get("id")
            yield PromptRecord(str(i if rid is None else rid), **fields)


def _hub_builder(name: str, fmt: RowFormat) -> None:
    """Register the hub builder ``name`` reading rows by ``fmt``."""
    ROW_FORMATS[name] = fmt
    BUILDERS[name] = lambda entry, seed: _hf_records(entry, seed, fmt)


def _strip_affixes(text: str, prefix: str, suffix: str, what: str) -> str:
    if not (text.startswith(prefix) and text.endswith(suffix)) or len(text) < len(prefix) + len(suffix):
        raise ValueError(f"not the authors' {what} format (expected {prefix[:40]!r}...{suffix[-40:]!r})")
    return text[len(prefix) : len(text) - len(suffix)]


# InstructCoder, the authors' form: the code, then the instruction and this sentence. The published
# prompts (all 500 of combined_instructcoder.jsonl) have 13 spaces after "output"; the fork's
# datasets_bench.py today writes one. The published prompts win.
INSTRUCTCODER_TAIL = " Just output             the code, do not include any explanation."


def _instructcoder_parse(text: str) -> dict[str, Any]:
    body = _strip_affixes(text, "", INSTRUCTCODER_TAIL, "InstructCoder")
    code, sep, instruction = body.rpartition("\n\n")
    if not sep:
        raise ValueError("not the authors' InstructCoder format (no blank line between code and instruction)")
    return {"input": code, "instruction": instruction}


_hub_builder(
    "instructcoder",  # likaixin/InstructCoder
    RowFormat(
        ("instruction", "input"),
        clean=lambda r, seed: {"prompt_text": f"{r['instruction']}:\n{r['input']}", "reference": r.get("output") or ""},
        authors=lambda r: {
            "prompt_text": f"{r['input']}\n\n{r['instruction']}{INSTRUCTCODER_TAIL}",
            "reference": r.get("output") or "",
        },
        parse_authors=_instructcoder_parse,
    ),
)


def _sharegpt_clean(r: dict[str, Any], seed: int) -> dict[str, Any] | None:
    """The first human turn; reference = the first assistant turn (conversations opening with the
    assistant, or without an answer, are skipped)."""
    turns = r.get("conversations") or []
    if len(turns) < 2 or turns[0].get("from") != "human":
        return None
    return {"prompt_text": turns[0]["value"], "reference": turns[1].get("value", "")}


def _sharegpt_authors(r: dict[str, Any]) -> dict[str, Any]:
    """The first turn whoever wrote it; kept by prepare only if it and the second turn pass
    vLLM's default length filter."""
    turns = r["conversations"]
    answer = turns[1].get("value", "")
    return {"prompt_text": turns[0]["value"], "reference": answer, "completion": answer, "limits": (1024, 2048)}


SHAREGPT_FORMAT = RowFormat(
    ("conversations",),
    clean=_sharegpt_clean,
    authors=_sharegpt_authors,
    parse_authors=lambda text: {"conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": ""}]},
)
ROW_FORMATS["sharegpt"] = SHAREGPT_FORMAT


@builder("sharegpt")
def build_sharegpt(entry: dict[str, Any], seed: int) -> Iterator[PromptRecord]:
    """ShareGPT (the V3 JSON): the first human turn; reference = the first assistant turn.

    ``form: authors``: entries with at least two turns, in ``random.seed(seed); random.shuffle``
    order (:func:`sdbench.datasets.authors.sharegpt_order`), the first turn whoever wrote it.
    """
    if _form(entry) != "authors":
        return _hf_records(entry, seed, SHAREGPT_FORMAT)
    rows = load_hf_dataset(entry)
    _check_columns(entry, rows, SHAREGPT_FORMAT.columns)
    kept = [r for r in rows if len(r.get("conversations") or []) >= 2]
    return (PromptRecord("", **_sharegpt_authors(r)) for r in sharegpt_order(kept, seed))


CNN_CLEAN_PREFIX = "Summarize the following news article.\n\n"
CNN_AUTHORS_PREFIX = "Could you summarize the following article, please reuse text from the article if possible: "

_hub_builder(
    "cnn_dailymail",  # abisee/cnn_dailymail 3.0.0; reference = highlights
    RowFormat(
        ("article", "highlights"),
        clean=lambda r, seed: {"prompt_text": CNN_CLEAN_PREFIX + r["article"], "reference": r["highlights"]},
        authors=lambda r: {"prompt_text": CNN_AUTHORS_PREFIX + r["article"], "reference": r["highlights"]},
        parse_authors=lambda text: {
            "article": _strip_affixes(text, CNN_AUTHORS_PREFIX, "", "CNN/DailyMail"),
            "highlights": "",
        },
    ),
)

_hub_builder(
    "gsm8k",  # openai/gsm8k main: the question; reference = the worked answer
    RowFormat(
        ("question", "answer"),
        clean=lambda r, seed: {"prompt_text": r["question"], "reference": r["answer"]},
        authors=lambda r: {"prompt_text": r["question"], "reference": r["answer"]},
        parse_authors=lambda text: {"question": text, "answer": ""},
    ),
)

_hub_builder(
    "aime",  # AI-MO/aimo-validation-aime (AIME 2022-24): the problem; reference = the answer
    RowFormat(
        ("problem", "answer"),
        clean=lambda r, seed: {"prompt_text": r["problem"], "reference": str(r["answer"])},
        # The authors sent the bare problem, no chat template, if problem and solution pass
        # the length filter with max_prompt_len 2048 and max_total_len 32000.
        authors=lambda r: {
            "prompt_text": r["problem"],
            "reference": str(r["answer"]),
            "completion": r.get("solution") or "",
            "limits": (2048, 32000),
            "chat": False,
        },
        parse_authors=lambda text: {"problem": text, "answer": ""},
    ),
)

GPQA_ANSWERS = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
GPQA_HEAD = "What is the correct answer to this question: "
GPQA_TAIL = '\n\nFormat your response as follows: "The correct answer is (insert answer here)".'


def _gpqa_clean(r: dict[str, Any], seed: int) -> dict[str, Any]:
    """Question with shuffled choices (seeded per row); reference = the correct letter."""
    choices = [r[c] for c in GPQA_ANSWERS]
    random.Random(f"{seed}:{r['Question']}").shuffle(choices)
    letters = "ABCD"
    body = "\n".join(f"({letters[i]}) {c.strip()}" for i, c in enumerate(choices))
    answer = letters[choices.index(r["Correct Answer"])]
    text = f"{r['Question'].strip()}\n\n{body}\n\nAnswer with the letter of the correct choice."
    return {"prompt_text": text, "reference": answer}


def _gpqa_authors(r: dict[str, Any]) -> dict[str, Any] | None:
    """The fork's GPQA prompt: the correct answer always (A); rows without a question or
    with fewer than four non-empty choices skipped."""
    choices = [r.get(c) for c in GPQA_ANSWERS]
    if not r.get("Question") or not all(choices):
        return None
    body = "".join(f"\n({letter}) {c}" for letter, c in zip("ABCD", choices, strict=True))
    return {"prompt_text": f"{GPQA_HEAD}{r['Question']}\nChoices:{body}{GPQA_TAIL}", "reference": "A"}


def _gpqa_parse(text: str) -> dict[str, Any]:
    body = _strip_affixes(text, GPQA_HEAD, GPQA_TAIL, "GPQA")
    question, sep, rest = body.partition("\nChoices:\n(A) ")
    parts: list[str] = []
    for letter in "BCD":
        head, found, rest = rest.partition(f"\n({letter}) ")
        parts.append(head)
        if not sep or not found:
            raise ValueError("not the authors' GPQA format (choices (A)-(D) not found)")
    parts.append(rest)
    return {"Question": question, **dict(zip(GPQA_ANSWERS, parts, strict=True))}


_hub_builder(
    "gpqa",  # Idavidrein/gpqa gpqa_main
    RowFormat(("Question", *GPQA_ANSWERS), clean=_gpqa_clean, authors=_gpqa_authors, parse_authors=_gpqa_parse),
)


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
    context: int | None = None,
    log: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """Sample ``entry['num_prompts']`` prompts and tokenize them, in the entry's form.

    ``form: clean`` (default): records sorted by id, then a seeded ``random.Random`` shuffle.
    Records that carry their own category (SPEED-Bench) are dealt round-robin over the
    categories after the shuffle (:func:`balanced_order`), so any prefix is balanced.
    ``form: authors``: the builder's order (the authors' shuffle), their filters and token ids,
    request ids ``"0"``, ``"1"``, ... in that order, padded as the authors padded
    (:mod:`sdbench.datasets.authors`).

    ``context`` (the model's context length; None: unknown) drops a prompt that leaves no room
    for one output token and caps a request's ``max_tokens`` at what fits after its prompt,
    where vLLM's offline engine would stop anyway and its server would refuse the request.
    ``log`` gets one line per rule that dropped or capped something.
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
        authors = _form(entry) == "authors"
        if authors and entry["builder"] not in ROW_FORMATS:
            raise ConfigError(
                f"form: authors is defined for the paper's hub builders ({', '.join(sorted(ROW_FORMATS))}), "
                f"not {entry['builder']!r}"
            )
        if authors:
            records: Iterable[PromptRecord] = build(entry, seed)  # lazily: the authors' order
        else:
            records = sorted(build(entry, seed), key=lambda r: r.request_id)
            random.Random(seed).shuffle(records)
            if any(r.category is not None for r in records):
                records = balanced_order(records, entry.get("category", ""))
    except ConfigError as exc:  # builders know the entry, not its key: name the dataset here
        raise ConfigError(f"datasets.{name}: {exc}") from exc
    limit = entry.get("max_prompt_tokens")
    kwargs = chat_template_kwargs or {}
    template = getattr(tokenizer, "chat_template", None) if authors else None
    rows: list[dict[str, Any]] = []
    seen = filtered = too_long = no_room = capped = 0
    try:
        for rec in records:
            seen += 1
            if authors:
                turns = [{"role": "user", "content": rec.prompt_text}] if rec.chat else None
                ids = tokenize_prompt(tokenizer, turns, rec.prompt_text, "authors", template, kwargs)
                if rec.limits is not None:
                    answer = len(tokenizer(rec.completion or "")["input_ids"])
                    if not is_valid_sequence(len(ids), answer, max_prompt_len=rec.limits[0], max_total_len=rec.limits[1]):
                        filtered += 1
                        continue
            else:
                ids = render_prompt(tokenizer, rec.prompt_text, kwargs, rec.messages)
            if limit is not None and len(ids) > limit:
                too_long += 1
                continue
            max_tokens = int(rec.max_tokens or entry["max_tokens"])
            if context is not None:
                if len(ids) >= context:
                    no_room += 1
                    continue
                if len(ids) + max_tokens > context:
                    capped += 1
                    max_tokens = context - len(ids)
            rows.append(
                {
                    "request_id": str(len(rows)) if authors else rec.request_id,
                    "dataset": name,
                    "category": entry.get("category", "") if rec.category is None else rec.category,
                    "prompt_text": rec.prompt_text,
                    "prompt_token_ids": ids,
                    "reference": rec.reference,
                    "max_tokens": max_tokens,
                }
            )
            if len(rows) == entry["num_prompts"]:
                break
    except ConfigError as exc:
        raise ConfigError(f"datasets.{name}: {exc}") from exc
    say = log or (lambda line: None)
    if filtered:
        say(f"datasets.{name}: {filtered} prompt(s) skipped by the authors' length filter (vLLM's is_valid_sequence)")
    if too_long:
        say(f"datasets.{name}: {too_long} prompt(s) dropped: longer than max_prompt_tokens={limit}")
    if no_room:
        say(f"datasets.{name}: {no_room} prompt(s) dropped: prompt length >= the model's context ({context} tokens)")
    if capped:
        say(f"datasets.{name}: max_tokens capped for {capped} request(s): prompt + max_tokens > context ({context})")
    if authors and rows and len(rows) < entry["num_prompts"]:
        say(f"datasets.{name}: {len(rows)} usable rows, padded to {entry['num_prompts']} with copies as the authors did")
        rows = oversample(rows, entry["num_prompts"], seed)
    if len(rows) < entry["num_prompts"]:
        source = f" ({entry['path']} has {seen} rows)" if entry["source"] == "file" else ""
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


def _json_arg(option: str, text: str) -> dict[str, Any]:
    """A JSON-object command-line value; ConfigError naming ``option`` otherwise."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{option}: not valid JSON ({exc}): {text[:60]!r}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{option}: expected a JSON object, got {type(value).__name__}")
    return value


def model_context(tokenizer_dir: str | Path, max_model_len: int | None = None) -> int | None:
    """The context length prompts must fit: ``max_model_len`` when given (the model entry's),
    else ``max_position_embeddings`` of the model's ``config.json`` beside its tokenizer (what
    vLLM takes by default), else None (a tokenizer-only directory: unknown)."""
    if max_model_len is not None:
        return int(max_model_len)
    path = Path(tokenizer_dir) / "config.json"
    if not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not a readable model config ({exc})") from exc
    cfg = cfg.get("text_config", cfg) if isinstance(cfg, dict) else {}
    value = cfg.get("max_position_embeddings")
    return int(value) if isinstance(value, int) and value > 0 else None


def _cmd_prepare(args: argparse.Namespace) -> int:
    import sys

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
        context = model_context(args.tokenizer, args.max_model_len)
        lines: list[str] = []  # printed once the table is made: an error stays one line
        df = prepare(args.name, entry, tokenizer, args.seed, chat_kwargs, context=context, log=lines.append)
        print(
            f"datasets.{args.name}: {len(df)} prompts, form {_form(entry)}; model context "
            f"{context if context else 'unknown'} tokens (a prompt that fills it is dropped; max_tokens is "
            "capped at what fits after the prompt)",
            *lines,
            sep="\n",
            file=sys.stderr,
        )
    write_parquet(df, Path(args.output))
    return 0
