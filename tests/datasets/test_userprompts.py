"""Your own prompts (sdbench.datasets.userprompts): a JSONL / CSV / parquet file by column mapping.

Bad files fail in one line naming the file, the line or row and what was expected, and write no
prompt table. The table of the cases tried is printed by ``test_bad_prompt_files_table``.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import REPO
from sdbench.cli import main
from sdbench.datasets.prompts import prepare
from sdbench.datasets.userprompts import read_rows, row_records
from sdbench.errors import ConfigError

CHAT = REPO / "tests" / "data" / "chat-prompts.jsonl"
COLUMNS = {"messages": "messages", "reference": "reference", "category": "topic", "max_tokens": "max_tokens", "id": "id"}


def _entry(path: Path, **over: Any) -> dict[str, Any]:
    return {"source": "file", "path": str(path), "columns": dict(COLUMNS), "num_prompts": 8, "max_tokens": 128, **over}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A Llama-3-like tokenizer with its chat template, saved by the tests."""
    from support.datasets_tokenizers import save_llama3_like
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(save_llama3_like(tmp_path_factory.mktemp("llama3")))


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The same tokenizer without a chat template (as the default's tiny models)."""
    from support.datasets_tokenizers import save_llama3_like
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(save_llama3_like(tmp_path_factory.mktemp("plain"), with_template=False))


def _rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in CHAT.read_text().splitlines()]


def _as_csv(path: Path) -> Path:
    rows = _rows()
    fields = ["id", "messages", "reference", "topic", "max_tokens"]
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for r in rows:
            writer.writerow({**{k: r.get(k, "") for k in fields}, "messages": json.dumps(r["messages"])})
    return path


def _as_pandas_csv(path: Path) -> Path:
    frame = pd.DataFrame(_rows())
    frame.assign(messages=frame["messages"].map(json.dumps)).to_csv(path, index=False)
    assert "96.0" in path.read_text()
    return path


def _as_parquet(path: Path) -> Path:
    rows = _rows()
    table = pa.table({
        "id": [r["id"] for r in rows],
        "messages": [r["messages"] for r in rows],  # a list of {role, content} structs
        "reference": [r["reference"] for r in rows],
        "topic": [r["topic"] for r in rows],
        "max_tokens": pa.array([r.get("max_tokens") for r in rows], pa.int64()),
    })
    pq.write_table(table, path)
    return path


def _table_bytes(entry: dict[str, Any], tokenizer: Any, out: Path) -> bytes:
    from sdbench.io import write_parquet

    write_parquet(prepare("my-chat", entry, tokenizer, 42), out)
    return out.read_bytes()


def test_jsonl_csv_and_parquet_give_byte_identical_prompt_tables(llama: Any, tmp_path: Path) -> None:
    tables = {
        "jsonl": _table_bytes(_entry(CHAT), llama, tmp_path / "a.parquet"),
        "csv": _table_bytes(_entry(_as_csv(tmp_path / "p.csv")), llama, tmp_path / "b.parquet"),
        "parquet": _table_bytes(_entry(_as_parquet(tmp_path / "p.parquet")), llama, tmp_path / "c.parquet"),
        # pandas writes max_tokens with gaps as "96.0": still an integer
        "csv-pandas": _table_bytes(_entry(_as_pandas_csv(tmp_path / "q.csv")), llama, tmp_path / "d.parquet"),
    }
    assert tables["jsonl"] == tables["csv"] == tables["parquet"] == tables["csv-pandas"]
    df = pd.read_parquet(tmp_path / "a.parquet")
    assert len(df) == 8 and df["request_id"].str.startswith("chat-").all()
    assert set(df["category"]) <= {"rename-function", "rename-variable"}
    assert set(df["max_tokens"]) <= {128, 96} and 96 in set(df["max_tokens"])


def test_messages_go_through_the_chat_template_up_to_the_last_user_turn(llama: Any, plain: Any) -> None:
    row = next(r for r in _rows() if len(r["messages"]) == 4)  # system, user, assistant, user
    entry = _entry(CHAT, columns={"messages": "messages", "id": "id"})
    (record,) = row_records(iter([("line 1", row)]), entry, "my-chat", "f.jsonl")
    assert [role for role, _ in record.messages] == ["system", "user", "assistant", "user"]
    from sdbench.datasets.prompts import render_prompt

    expected = llama.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=True)
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    assert render_prompt(llama, record.prompt_text, {}, record.messages) == list(expected)
    # Without a template the model sees the turns' contents joined by blank lines.
    assert record.prompt_text == "\n\n".join(m["content"] for m in row["messages"])
    assert render_prompt(plain, record.prompt_text, {}, record.messages) == plain(record.prompt_text)["input_ids"]


def test_the_assistant_turn_after_the_last_user_turn_is_the_reference() -> None:
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    entry = {**_entry(CHAT), "columns": {"messages": "messages"}}
    (record,) = row_records(iter([("line 1", row)]), entry, "x", "f.jsonl")
    assert record.reference == "hello" and record.request_id == "1"


def test_a_hub_dataset_by_column_mapping(llama: Any, tmp_path: Path) -> None:
    """builder: columns on a hub-layout copy (local_path: the same load_dataset call as the hub)."""
    repo = tmp_path / "hub-copy"
    (repo / "data").mkdir(parents=True)
    pd.DataFrame({"question": [f"What is {i} + {i}?" for i in range(6)], "answer": [str(2 * i) for i in range(6)]}
                 ).to_parquet(repo / "data" / "train-00000-of-00001.parquet")
    entry = {"source": "huggingface", "builder": "columns", "hf_id": "someone/qa", "local_path": str(repo),
             "split": "train", "columns": {"prompt": "question", "reference": "answer"}, "num_prompts": 4,
             "max_tokens": 32}  # fmt: skip
    df = prepare("qa", entry, llama, 42)
    assert len(df) == 4 and set(df["max_tokens"]) == {32}
    assert all(int(q.split()[2]) * 2 == int(a) for q, a in zip(df["prompt_text"], df["reference"]))


# --------------------------------------------------------------------------- bad files
def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _jsonl(rows: list[Any]) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


GOOD = {"id": "a", "messages": [{"role": "user", "content": "hello"}]}
BAD_FILES: list[tuple[str, Any, str]] = [
    ("invalid JSON", lambda p: _write(p, "f.jsonl", _jsonl([GOOD, '{"id": "b", "messages": [}'])),
     r"f.jsonl: line 2: invalid JSON"),
    ("a line that is not an object", lambda p: _write(p, "f.jsonl", _jsonl([GOOD, [1, 2]])),
     r"f.jsonl: line 2: expected a JSON object, got list"),
    ("missing column", lambda p: _write(p, "f.jsonl", _jsonl([{"id": "a", "text": "hi"}])),
     r"f.jsonl: line 1: no column 'messages' \(columns: 'id', 'text'\)"),
    ("empty prompt", lambda p: _write(p, "f.csv", "id,prompt\na,hello\nb,   \n"),
     r"f.csv: line 3: column 'prompt' is empty"),
    ("messages without a user turn", lambda p: _write(p, "f.jsonl", _jsonl([
        {"id": "a", "messages": [{"role": "system", "content": "be brief"}]}])),
     r"f.jsonl: line 1: messages: no user turn"),
    ("a turn without content", lambda p: _write(p, "f.jsonl", _jsonl([{"id": "a", "messages": [{"role": "user"}]}])),
     r"f.jsonl: line 1: messages\[0\]: expected an object with role and content"),
    ("an unknown role", lambda p: _write(p, "f.jsonl", _jsonl([
        {"id": "a", "messages": [{"role": "human", "content": "hi"}]}])),
     r"f.jsonl: line 1: messages\[0\]: role 'human' is not one of"),
    ("messages as a CSV cell that is not JSON", lambda p: _write(p, "f.csv", "id,messages\na,[{'role': 'user'}]\n"),
     r"f.csv: line 2: messages: not a JSON list"),
    ("max_tokens not an integer", lambda p: _write(p, "f.jsonl", _jsonl([{**GOOD, "max_tokens": "lots"}])),
     r"f.jsonl: line 1: column 'max_tokens': 'lots' is not an integer"),
    ("max_tokens above the entry's", lambda p: _write(p, "f.jsonl", _jsonl([{**GOOD, "max_tokens": 4096}])),
     r"f.jsonl: line 1: column 'max_tokens': 4096 is outside 1..128"),
    ("a request id twice", lambda p: _write(p, "f.jsonl", _jsonl([GOOD, {**GOOD}])),
     r"f.jsonl: line 2: request id 'a' again \(first at line 1\)"),
    ("fewer rows than num_prompts", lambda p: _write(p, "f.jsonl", _jsonl([GOOD, {**GOOD, "id": "b"}])),
     r"datasets.my-chat: only 2 prompts available \(.*f.jsonl has 2 rows\) \(num_prompts=8"),
    ("a CSV row with more cells than the header", lambda p: _write(p, "f.csv", "id,prompt\na,hi,extra\n"),
     r"f.csv: line 2: more cells than the header's 2 columns"),
    ("not a parquet file", lambda p: _write(p, "f.parquet", "id,prompt\n"),
     r"f.parquet: not a readable parquet file"),
    ("an unknown file type", lambda p: _write(p, "f.txt", "hello\n"),
     r"f.txt: unknown file type '.txt'"),
    ("no such file", lambda p: p / "missing.jsonl", r"missing.jsonl: no such prompts file"),
]


def _columns_for(path: Path) -> dict[str, str]:
    text = path.read_text() if path.exists() and path.suffix != ".parquet" else ""
    if path.suffix == ".csv" and text.startswith("id,prompt"):
        return {"prompt": "prompt", "id": "id"}
    columns = {"messages": "messages", "id": "id"}
    return {**columns, "max_tokens": "max_tokens"} if '"max_tokens"' in text else columns


@pytest.mark.parametrize("what, make, message", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_a_bad_prompts_file_fails_in_one_line_and_writes_nothing(
    what: str, make: Any, message: str, plain: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make(tmp_path)
    entry = _entry(path, columns=_columns_for(path))
    out = tmp_path / "prompts.parquet"
    tok = tmp_path / "tok"
    plain.save_pretrained(tok)
    code = main(["prepare-dataset", "--name", "my-chat", "--entry", json.dumps(entry), "--tokenizer", str(tok),
                 "--seed", "42", "--output", str(out)])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    import re

    assert re.search(message, err[0]), err[0]
    assert not out.exists() and not list(tmp_path.glob(".prompts.parquet*"))


def test_bad_prompt_files_table(plain: Any, tmp_path: Path) -> None:
    """The README's table: each case and the one line it gets (paths relative to the test dir)."""
    lines = ["| bad input | the line it gets |", "|---|---|"]
    for what, make, _ in BAD_FILES:
        case = tmp_path / what.replace(" ", "-")
        case.mkdir()
        path = make(case)
        entry = _entry(path, columns=_columns_for(path))
        with pytest.raises(ConfigError) as err:
            prepare("my-chat", entry, plain, 42)
        lines.append(f"| {what} | `{str(err.value).replace(str(case) + '/', '')}` |")
    print("\n" + "\n".join(lines))
    assert len(lines) == len(BAD_FILES) + 2


def test_config_refuses_a_file_source_without_path_or_with_both_prompt_fields(tmp_path: Path) -> None:
    import yaml

    from sdbench.config import load_config

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["datasets"]["my-chat"].pop("path")
    config["datasets"]["my-chat"]["columns"]["prompt"] = "text"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "datasets.my-chat.path: required for source 'file'" in str(err.value)
    assert "datasets.my-chat.columns: give exactly one of prompt and messages" in str(err.value)


def test_read_rows_numbers_jsonl_and_csv_lines_as_in_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "f.jsonl", _jsonl([GOOD]) + "\n" + _jsonl([{**GOOD, "id": "b"}]))
    assert [w for w, _ in read_rows(path)] == ["line 1", "line 3"]
    shutil.copy(path, tmp_path / "g.jsonl")
