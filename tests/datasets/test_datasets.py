"""Prompt builders: the embedded default's offline sets, and the paper's six hub datasets.

The hub datasets are tested offline but through the production call path: each test
writes a few rows in the dataset's real repository layout (``support.datasets_hub_copies``)
and points the paper's own config entry at that directory with ``local_path``, so
``datasets.load_dataset`` resolves config, split and data files exactly as it does
for ``hf_id`` on the cluster. Nothing is mocked.
"""

from __future__ import annotations

import ast
import copy
import itertools
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from support.datasets_hub_copies import (
    AIME,
    CNN_ROWS,
    GPQA_ANSWERS,
    GPQA_MAIN,
    GSM8K_ROWS,
    INSTRUCTCODER,
    SHAREGPT,
    WRITERS,
)
from support.datasets_tokenizers import THINK_EMPTY, save_llama3_like

from sdbench.cli import main
from sdbench.config import ConfigError, load_config, validate_config
from sdbench.datasets.prompts import BUILDERS, prepare

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("offline_hub")  # conftest.py

# --- offline prompt sets ---------------------------------------------------------------


def test_code_write_prompt_is_the_function_head_up_to_the_body_indentation() -> None:
    records = list(itertools.islice(BUILDERS["code_write"]({}, 42), 20))
    assert len(records) == 20
    for rec in records:
        head, indent = rec.prompt_text.rsplit("\n", 1)
        assert indent and not indent.strip()  # ends with the body's indentation
        fn = ast.parse(head + "\n" + indent + rec.reference).body[0]  # prompt + reference = the function
        assert isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and ast.get_docstring(fn)
        assert len(fn.body) >= 2


def test_code_edit_prompt_ends_with_the_edit_request() -> None:
    rec = next(iter(BUILDERS["code_edit"]({}, 42)))
    assert "# Edit request:" in rec.prompt_text and rec.reference


# --- hub datasets: fixtures ------------------------------------------------------------


@pytest.fixture(scope="module")
def paper_config() -> dict[str, Any]:
    """config/paper.yaml, validated (schema defaults filled in, as the pipeline sees it)."""
    return load_config(REPO / "config" / "paper.yaml")


def _local_entry(paper_config: dict[str, Any], name: str, copy_dir: Path, **overrides: Any) -> dict[str, Any]:
    """The paper's entry for ``name`` (hf_id, hf_config, split, data_files, revision untouched) + local_path."""
    return {**copy.deepcopy(paper_config["datasets"][name]), "local_path": str(copy_dir), **overrides}


def _templated(tokenizer: Any, text: str, **chat_template_kwargs: Any) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False, **chat_template_kwargs
    )


# Expected (prompt_text, reference) per request id: the builders' prompt formats.
EXPECTED: dict[str, dict[str, tuple[str, str]]] = {
    "cnn": {r["id"]: (f"Summarize the following news article.\n\n{r['article']}", r["highlights"]) for r in CNN_ROWS},
    "sharegpt": {  # first human turn -> first answer; conversations opening with "gpt" or without answer skipped
        r["id"]: (r["conversations"][0]["value"], r["conversations"][1]["value"])
        for r in SHAREGPT
        if len(r["conversations"]) >= 2 and r["conversations"][0]["from"] == "human"
    },
    "instructcoder": {  # no id column: the row index
        str(i): (f"{r['instruction']}:\n{r['input']}", r["output"]) for i, r in enumerate(INSTRUCTCODER)
    },
    "gsm8k": {str(i): (r["question"], r["answer"]) for i, r in enumerate(GSM8K_ROWS)},
    "aime": {str(r["id"]): (r["problem"], r["answer"]) for r in AIME},
}


def _check_gpqa(df: pd.DataFrame) -> None:
    """GPQA choices are shuffled per row: check the structure and that the letter is right."""
    assert sorted(df["request_id"]) == [str(i) for i in range(len(GPQA_MAIN))]
    for rid, prompt, reference in zip(df["request_id"], df["prompt_text"], df["reference"], strict=True):
        row = GPQA_MAIN[int(rid)]
        question, body, instruction = prompt.split("\n\n")
        assert question == row["Question"].strip()
        assert instruction == "Answer with the letter of the correct choice."
        choices = dict(line.split(") ", 1) for line in body.splitlines())
        assert sorted(choices) == ["(A", "(B", "(C", "(D"]
        assert sorted(choices.values()) == sorted(row[c].strip() for c in GPQA_ANSWERS)
        assert choices[f"({reference}"] == row["Correct Answer"].strip()


# --- hub datasets: tests ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["cnn", "sharegpt", "instructcoder", "gsm8k", "aime", "gpqa"])
def test_prepare_dataset_reads_the_hub_layout_through_load_dataset(
    name: str, paper_config: dict[str, Any], qwen3_dir: Path, qwen3: Any, tmp_path: Path
) -> None:
    """`sdbench prepare-dataset` on the paper's entry in the clean form, read from a local copy of
    the hub repository.

    Every usable row comes out exactly once (num_prompts = their number) and no decoy row
    from another config, split or data file does: the entry's hf_config / split /
    data_files selected the same files as on the hub.
    """
    copy_dir = WRITERS[name](tmp_path / "hub-copy")
    n_usable = len(GPQA_MAIN) if name == "gpqa" else len(EXPECTED[name])
    entry = _local_entry(paper_config, name, copy_dir, num_prompts=n_usable, form="clean")
    out = tmp_path / "prompts.parquet"
    chat = {"enable_thinking": False}
    argv = ["prepare-dataset", "--name", name, "--entry", json.dumps(entry), "--tokenizer", str(qwen3_dir)]
    argv += ["--seed", "42", "--chat-template-kwargs", json.dumps(chat), "--output", str(out)]
    assert main(argv) == 0

    df = pd.read_parquet(out)
    assert list(df.columns) == ["request_id", "dataset", "category", "prompt_text", "prompt_token_ids", "reference",
                                "max_tokens"]
    assert set(df["max_tokens"]) == {entry["max_tokens"]}
    assert len(df) == n_usable and df["request_id"].is_unique
    assert set(df["dataset"]) == {name} and set(df["category"]) == {paper_config["datasets"][name]["category"]}
    assert not df["prompt_text"].str.contains("DECOY").any()
    if name == "gpqa":
        _check_gpqa(df)
    else:
        got = {rid: (p, r) for rid, p, r in zip(df["request_id"], df["prompt_text"], df["reference"], strict=True)}
        assert got == EXPECTED[name]
    for text, ids in zip(df["prompt_text"], df["prompt_token_ids"], strict=True):
        # The ids are the templated text's (Qwen3 non-thinking: ends in the empty think block).
        templated = _templated(qwen3, text, **chat)
        assert list(ids) == qwen3(templated, add_special_tokens=False)["input_ids"]
        assert qwen3.decode(list(ids)) == templated
        assert templated.endswith("<|im_start|>assistant\n" + THINK_EMPTY)


@pytest.mark.parametrize(
    ("chat_template_kwargs", "empty_think_block"),
    [({"enable_thinking": False}, True), ({"enable_thinking": True}, False), ({}, False)],
    ids=["non-thinking", "thinking", "template-default"],
)
def test_qwen3_enable_thinking_reaches_the_chat_template(
    chat_template_kwargs: dict[str, Any],
    empty_think_block: bool,
    paper_config: dict[str, Any],
    qwen3: Any,
    tmp_path: Path,
) -> None:
    """qwen3-8b (enable_thinking: false) prompts end in the empty think block; qwen3-8b-thinking's do not."""
    entry = _local_entry(
        paper_config, "gsm8k", WRITERS["gsm8k"](tmp_path / "gsm8k"), num_prompts=len(GSM8K_ROWS), form="clean"
    )
    df = prepare("gsm8k", entry, qwen3, 42, chat_template_kwargs)
    for text, ids in zip(df["prompt_text"], df["prompt_token_ids"], strict=True):
        decoded = qwen3.decode(ids)
        assert decoded.endswith(THINK_EMPTY) is empty_think_block
        assert ("<think>" in decoded) is empty_think_block
        assert ids == qwen3(_templated(qwen3, text, **chat_template_kwargs), add_special_tokens=False)["input_ids"]
        assert THINK_EMPTY not in text  # the table's prompt_text stays the dataset's text
    # Same seed, same sample and order: prompt tables are reproducible.
    again = prepare("gsm8k", entry, qwen3, 42, chat_template_kwargs)
    assert again["request_id"].tolist() == df["request_id"].tolist()


def test_templated_prompts_carry_one_bos_in_the_clean_form(paper_config: dict[str, Any], tmp_path: Path) -> None:
    """A Llama-3 template writes BOS itself: clean ids do not get a second one from the tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(save_llama3_like(tmp_path / "llama3"))
    bos = tok.bos_token_id
    entry = _local_entry(paper_config, "gsm8k", WRITERS["gsm8k"](tmp_path / "gsm8k"), num_prompts=2, form="clean")
    df = prepare("gsm8k", entry, tok, 42)
    for text, ids in zip(df["prompt_text"], df["prompt_token_ids"], strict=True):
        templated = _templated(tok, text)
        assert templated.startswith("<|begin_of_text|>")
        assert ids[0] == bos and ids.count(bos) == 1
        assert ids == tok(templated, add_special_tokens=False)["input_ids"]
        assert tok(templated)["input_ids"][:2] == [bos, bos]  # what adding special tokens would do


def test_prompts_without_chat_template_get_the_tokenizers_special_tokens(
    paper_config: dict[str, Any], tmp_path: Path
) -> None:
    """Base models (no chat template): the raw text, with the tokenizer's BOS."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(save_llama3_like(tmp_path / "llama3-base", with_template=False))
    assert not tok.chat_template
    entry = _local_entry(paper_config, "gsm8k", WRITERS["gsm8k"](tmp_path / "gsm8k"), num_prompts=2, form="clean")
    df = prepare("gsm8k", entry, tok, 42)
    for text, ids in zip(df["prompt_text"], df["prompt_token_ids"], strict=True):
        assert ids == tok(text)["input_ids"] and ids[0] == tok.bos_token_id
        assert tok.decode(ids[1:]) == text


@pytest.mark.parametrize(
    ("name", "column"),
    [
        ("cnn", "highlights"),
        ("sharegpt", "conversations"),
        ("instructcoder", "input"),
        ("gsm8k", "question"),
        ("aime", "problem"),
        ("gpqa", "Incorrect Answer 3"),
    ],
)
def test_missing_column_is_a_config_error_naming_dataset_column_and_columns_found(
    name: str, column: str, paper_config: dict[str, Any], qwen3: Any, tmp_path: Path
) -> None:
    copy_dir = WRITERS[name](tmp_path / "hub-copy", drop=column)
    entry = _local_entry(paper_config, name, copy_dir, num_prompts=1)
    with pytest.raises(ConfigError) as info:
        prepare(name, entry, qwen3, 42)
    message = str(info.value)
    assert message.startswith(f"datasets.{name}: {entry['hf_id']}")
    assert f"lack column(s) {column!r}" in message
    found = message.split("columns found: ", 1)[1]
    assert repr(column) not in found
    assert all(repr(c) in found for c in {"cnn": ["article", "id"], "gpqa": ["Question", "Record ID"]}.get(name, []))


def test_too_few_usable_rows_is_a_config_error(paper_config: dict[str, Any], qwen3: Any, tmp_path: Path) -> None:
    """ShareGPT rows without a human-first exchange are skipped, and num_prompts cannot be met."""
    entry = _local_entry(
        paper_config, "sharegpt", WRITERS["sharegpt"](tmp_path / "sg"), num_prompts=len(SHAREGPT), form="clean"
    )
    with pytest.raises(ConfigError, match=r"datasets\.sharegpt: only 3 prompts available"):
        prepare("sharegpt", entry, qwen3, 42)


def test_local_path_that_is_not_a_directory_is_a_config_error(
    paper_config: dict[str, Any], qwen3: Any, tmp_path: Path
) -> None:
    # A relative "dir/name" that does not exist would otherwise be looked up as a hub id.
    entry = _local_entry(paper_config, "gsm8k", tmp_path / "missing", num_prompts=1)
    with pytest.raises(ConfigError, match=r"datasets\.gsm8k: local_path: .*missing.* is not a directory"):
        prepare("gsm8k", entry, qwen3, 42)


def test_local_path_is_a_valid_dataset_key(paper_config: dict[str, Any], tmp_path: Path) -> None:
    config = copy.deepcopy(paper_config)
    config["datasets"]["cnn"]["local_path"] = str(tmp_path)
    validate_config(config)
    config["datasets"]["cnn"]["local_path"] = 3
    with pytest.raises(ConfigError, match=r"datasets\.cnn\.local_path"):
        validate_config(config)


# --- the authors' form (config/paper.yaml) ------------------------------------------------


def _authors_prompt(name: str, row: dict[str, Any]) -> str | None:
    """The authors' user turn for a hub-copy row, written out here (None: the authors skip it)."""
    if name == "cnn":
        return "Could you summarize the following article, please reuse text from the article if possible: " + row[
            "article"
        ]
    if name == "sharegpt":
        return row["conversations"][0]["value"]
    if name == "instructcoder":
        return f"{row['input']}\n\n{row['instruction']} Just output             the code, do not include any explanation."
    if name == "gsm8k":
        return row["question"]
    if name == "aime":
        return row["problem"]
    choices = "".join(f"\n({x}) {row[c]}" for x, c in zip("ABCD", GPQA_ANSWERS, strict=True))
    return (
        f"What is the correct answer to this question: {row['Question']}\nChoices:{choices}\n\n"
        'Format your response as follows: "The correct answer is (insert answer here)".'
    )


def _authors_order(name: str) -> list[dict[str, Any]]:
    """The hub copy's rows in the order the authors drew them (seed 42)."""
    from sdbench.datasets.authors import buffer_shuffle, sharegpt_order, streaming_shuffle

    if name == "sharegpt":
        return sharegpt_order([r for r in SHAREGPT if len(r["conversations"]) >= 2], 42)
    if name == "cnn":  # two train files: the file order is shuffled too
        return list(streaming_shuffle([CNN_ROWS[:2], CNN_ROWS[2:]], 42))
    rows = {"instructcoder": INSTRUCTCODER, "gsm8k": GSM8K_ROWS, "aime": AIME, "gpqa": GPQA_MAIN}[name]
    return list(buffer_shuffle(rows, 42))


@pytest.mark.parametrize("name", ["cnn", "sharegpt", "instructcoder", "gsm8k", "aime", "gpqa"])
def test_paper_entries_draw_the_authors_prompts_order_and_token_ids(
    name: str, paper_config: dict[str, Any], tmp_path: Path
) -> None:
    """config/paper.yaml's entries (form: authors): the fork's prompt texts, in its seed-42 order,
    ids 0..N-1, templated text tokenized with the special tokens (two BOS with a Llama-3 template);
    AIME without a chat template (one BOS)."""
    from transformers import AutoTokenizer

    assert paper_config["datasets"][name]["form"] == "authors"
    tok = AutoTokenizer.from_pretrained(save_llama3_like(tmp_path / "llama3"))
    expected = [p for p in (_authors_prompt(name, r) for r in _authors_order(name)) if p is not None]
    entry = _local_entry(paper_config, name, WRITERS[name](tmp_path / "hub-copy"), num_prompts=len(expected))
    df = prepare(name, entry, tok, 42)
    assert df["prompt_text"].tolist() == expected
    assert df["request_id"].tolist() == [str(i) for i in range(len(expected))]
    for text, ids in zip(df["prompt_text"], df["prompt_token_ids"], strict=True):
        if name == "aime":
            assert ids == tok(text)["input_ids"] and ids.count(tok.bos_token_id) == 1
        else:
            assert ids == tok(_templated(tok, text))["input_ids"]
            assert ids[:2] == [tok.bos_token_id] * 2
    if name == "gpqa":
        assert set(df["reference"]) == {"A"}


def test_authors_form_pads_a_short_list_with_copies_as_the_fork_did(
    paper_config: dict[str, Any], qwen3: Any, tmp_path: Path
) -> None:
    entry = _local_entry(paper_config, "gsm8k", WRITERS["gsm8k"](tmp_path / "gsm8k"), num_prompts=7)
    lines: list[str] = []
    df = prepare("gsm8k", entry, qwen3, 42, log=lines.append)
    assert df["request_id"].tolist() == [str(i) for i in range(7)]
    assert set(df["prompt_text"][4:]) <= set(df["prompt_text"][:4]) and df["prompt_text"][:4].is_unique
    assert any("padded to 7" in line for line in lines)


def test_streaming_shuffle_of_gsm8k_train_starts_as_the_published_ids() -> None:
    """The published GSM8K ids 0..299 are rows 89, 773, 654, ... of openai/gsm8k main/train (7473
    rows in stored order), checked once against the published prompts; the shuffle must keep it."""
    from sdbench.datasets.authors import buffer_shuffle, shard_order

    order = list(itertools.islice(buffer_shuffle(range(7473), 42), 12))
    assert order == [89, 773, 654, 438, 433, 858, 85, 697, 201, 94, 526, 975]
    assert sorted(buffer_shuffle(range(2500), 42)) == list(range(2500))
    assert shard_order(3, 42) == [2, 1, 0]


def test_context_drops_prompts_that_fill_it_and_caps_max_tokens(
    paper_config: dict[str, Any], qwen3: Any, tmp_path: Path
) -> None:
    entry = _local_entry(
        paper_config, "gsm8k", WRITERS["gsm8k"](tmp_path / "gsm8k"), num_prompts=len(GSM8K_ROWS), form="clean"
    )
    full = prepare("gsm8k", entry, qwen3, 42)
    lengths = sorted(len(ids) for ids in full["prompt_token_ids"])
    context = lengths[-1]  # the longest prompt leaves no room for an output token
    lines: list[str] = []
    df = prepare("gsm8k", {**entry, "num_prompts": len(GSM8K_ROWS) - 1}, qwen3, 42, context=context, log=lines.append)
    assert all(len(ids) < context for ids in df["prompt_token_ids"])
    for ids, max_tokens in zip(df["prompt_token_ids"], df["max_tokens"], strict=True):
        assert max_tokens == min(entry["max_tokens"], context - len(ids))
    longest_seen = [len(ids) for ids in full["prompt_token_ids"]].index(context) < len(GSM8K_ROWS) - 1
    assert any("1 prompt(s) dropped" in line for line in lines) == longest_seen  # sampling stops at 3
    assert any("max_tokens capped" in line for line in lines)


def test_model_context_reads_max_position_embeddings_unless_given(tmp_path: Path) -> None:
    from sdbench.datasets.prompts import model_context

    assert model_context(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    assert model_context(tmp_path) == 8192
    assert model_context(tmp_path, 4096) == 4096


def test_form_must_be_clean_or_authors(paper_config: dict[str, Any], tmp_path: Path) -> None:
    config = copy.deepcopy(paper_config)
    config["datasets"]["gsm8k"]["form"] = "paper"
    with pytest.raises(ConfigError, match=r"datasets\.gsm8k\.form"):
        validate_config(config)
