"""SPEED-Bench as prompt sets (builder ``speed_bench``, the offline stand-in with its layout) and
acceptance per category from the cells' per-request SD counters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sdbench.analysis.categories import COLUMNS, category_acceptance, category_acceptance_markdown
from sdbench.cli import main
from sdbench.config import ConfigError
from sdbench.datasets import speedbench
from sdbench.datasets.prompts import BUILDERS, balanced_order, prepare, registered_builders
from sdbench.datasets.speedbenchsample import DATA_FILE, write_sample

PER_CATEGORY = 4
pytestmark = pytest.mark.usefixtures("offline_hub")  # conftest.py


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sample(tmp_path_factory.mktemp("sb") / "speed-bench", per_category=PER_CATEGORY)


@pytest.fixture(scope="module")
def placeholder_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sample(tmp_path_factory.mktemp("sbp") / "speed-bench", per_category=PER_CATEGORY, placeholders=True)


def _entry(local_path: Path, **overrides: Any) -> dict[str, Any]:
    """A config/paper.yaml-style entry for nvidia/SPEED-Bench, read from a local copy."""
    return {
        "source": "huggingface",
        "builder": "speed_bench",
        "hf_id": "nvidia/SPEED-Bench",
        "hf_config": "qualitative",
        "split": "test",
        "revision": "main",
        "local_path": str(local_path),
        "num_prompts": 2 * PER_CATEGORY,
        "max_tokens": 16,
        **overrides,
    }


def _hub_rows(root: Path, config: str) -> pd.DataFrame:
    return pd.read_parquet(root / DATA_FILE.format(config=config))


# --- the builder, through load_hf_dataset -------------------------------------------------


def test_the_builder_is_registered_when_prepare_looks_builders_up() -> None:
    assert "speed_bench" in registered_builders() and BUILDERS["speed_bench"] is speedbench.build_speed_bench


def test_sample_has_speed_bench_columns_and_configs(sample: Path) -> None:
    for config in ("qualitative", "throughput_1k"):
        schema = pq.read_schema(sample / DATA_FILE.format(config=config))
        assert schema.names == list(speedbench.COLUMNS)
        assert schema.field("turns").type == pa.list_(pa.string()) and schema.field("multiturn").type == pa.bool_()
    assert "config_name: throughput_1k" in (sample / "README.md").read_text()


@pytest.mark.parametrize(
    ("config", "categories"),
    [("qualitative", {"coding", "writing"}), ("throughput_1k", {"low_entropy", "high_entropy"})],
)
def test_prepare_reads_the_local_copy_with_each_rows_category(
    sample: Path, qwen3: Any, config: str, categories: set[str]
) -> None:
    df = prepare("sb", _entry(sample, hf_config=config), qwen3, 42)
    hub = _hub_rows(sample, config).set_index("question_id")
    assert set(df["category"]) == categories
    assert df["category"].value_counts().tolist() == [PER_CATEGORY, PER_CATEGORY]
    assert set(df["request_id"]) == set(hub.index)  # question_id, this config's rows only
    for row in df.itertuples():
        assert row.prompt_text == hub.at[row.request_id, "turns"][0]
        assert row.category == hub.at[row.request_id, "category"]
        assert len(row.prompt_token_ids) > 0


def test_a_subsample_is_balanced_and_every_prefix_too(sample: Path, qwen3: Any) -> None:
    df = prepare("sb", _entry(sample, num_prompts=5), qwen3, 42)
    cats = df["category"].tolist()
    assert cats == [cats[0], cats[1]] * 2 + [cats[0]] and cats[0] != cats[1]


def test_categories_keep_only_those(sample: Path, qwen3: Any) -> None:
    df = prepare("sb", _entry(sample, categories=["writing"], num_prompts=PER_CATEGORY), qwen3, 42)
    assert set(df["category"]) == {"writing"} and len(df) == PER_CATEGORY
    with pytest.raises(ConfigError, match=rf"datasets\.sb: only {PER_CATEGORY} prompts available"):
        prepare("sb", _entry(sample, categories=["writing"], num_prompts=PER_CATEGORY + 1), qwen3, 42)


def test_an_unknown_category_names_it_and_the_ones_present(sample: Path, qwen3: Any) -> None:
    with pytest.raises(ConfigError) as info:
        prepare("sb", _entry(sample, categories=["writing", "cooking"]), qwen3, 42)
    assert str(info.value) == (
        f"datasets.sb: categories: 'cooking' not in nvidia/SPEED-Bench (local copy {sample}) config 'qualitative' "
        "split 'test' (its categories: coding, writing)"
    )


def test_placeholder_rows_are_refused_with_count_and_command(placeholder_sample: Path, qwen3: Any) -> None:
    with pytest.raises(ConfigError) as info:
        prepare("sb", _entry(placeholder_sample), qwen3, 42)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        f"datasets.sb: nvidia/SPEED-Bench (local copy {placeholder_sample}) config 'qualitative' split 'test': "
        f"{PER_CATEGORY} of {2 * PER_CATEGORY} rows hold SPEED-Bench's placeholder"
    )
    assert "prepare_data.py --dataset speed --config qualitative --output_dir DIR" in message
    assert "then set local_path: DIR/speed/qualitative, hf_config: null, split: test" in message
    # The materialised category alone is fine.
    df = prepare("sb", _entry(placeholder_sample, categories=["writing"], num_prompts=PER_CATEGORY), qwen3, 42)
    assert not df["prompt_text"].str.startswith(speedbench.PLACEHOLDER).any()


def test_prepare_dataset_refuses_placeholders_in_one_line_and_writes_nothing(
    placeholder_sample: Path, qwen3_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "prompts.parquet"
    argv = ["prepare-dataset", "--name", "sb", "--entry", json.dumps(_entry(placeholder_sample)),
            "--tokenizer", str(qwen3_dir), "--output", str(out)]  # fmt: skip
    assert main(argv) == 2
    # The last stderr line (before it: the datasets library's progress bar) is the one error line.
    err = capsys.readouterr().err.split("\r")[-1].splitlines()
    assert len(err) == 2 and err[1].startswith("error: datasets.sb: ") and "placeholder" in err[1]
    assert not out.exists()


def test_model_optimizer_and_nemo_skills_outputs_are_read_too(sample: Path, qwen3: Any, tmp_path: Path) -> None:
    """prepare_data.py's DIR/speed/<config>/test.parquet, and NeMo-Skills' <config>.jsonl with messages
    (multi-turn: the first user turn is the prompt, as vLLM takes it)."""
    rows = _hub_rows(sample, "qualitative")
    mo = tmp_path / "data" / "speed" / "qualitative"
    mo.mkdir(parents=True)
    rows.to_parquet(mo / "test.parquet", index=False)
    df = prepare("sb", _entry(mo, hf_config=None), qwen3, 42)
    assert sorted(df["request_id"]) == sorted(rows["question_id"])

    nemo = tmp_path / "nemo"
    nemo.mkdir()
    records = rows.drop(columns="turns").to_dict("records")
    for rec, turns in zip(records, rows["turns"]):
        rec["messages"] = [{"role": "user", "content": t} for t in [*turns, "and a second turn"]]
    (nemo / "qualitative.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    df = prepare("sb", _entry(nemo, hf_config=None, data_files="qualitative.jsonl", split="train"), qwen3, 42)
    first = dict(zip(rows["question_id"], (t[0] for t in rows["turns"])))
    assert all(first[r.request_id] == r.prompt_text for r in df.itertuples())


def test_missing_column_and_duplicate_ids_are_config_errors(sample: Path, qwen3: Any, tmp_path: Path) -> None:
    rows = _hub_rows(sample, "qualitative")
    bad = tmp_path / "nocat" / "speed" / "qualitative"
    bad.mkdir(parents=True)
    rows.drop(columns="category").to_parquet(bad / "test.parquet", index=False)
    with pytest.raises(ConfigError, match=r"datasets\.sb: .*rows lack column\(s\) 'category' \(columns found: "):
        prepare("sb", _entry(bad, hf_config=None), qwen3, 42)
    dup = tmp_path / "dup"
    dup.mkdir()
    pd.concat([rows, rows.iloc[:1]]).to_parquet(dup / "test.parquet", index=False)
    with pytest.raises(ConfigError, match=r"question_id '.*' occurs more than once"):
        prepare("sb", _entry(dup, hf_config=None), qwen3, 42)


def test_sample_and_prompt_table_are_byte_identical_on_rerun(
    sample: Path, qwen3_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    again = write_sample(tmp_path / "again", per_category=PER_CATEGORY)
    files = sorted(p.relative_to(sample) for p in sample.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    assert all((sample / f).read_bytes() == (again / f).read_bytes() for f in files)
    assert main(["speed-bench-sample", "--output", str(tmp_path / "cli"), "--per-category", str(PER_CATEGORY)]) == 0
    assert all((sample / f).read_bytes() == (tmp_path / "cli" / f).read_bytes() for f in files)
    outs = []
    for i in range(2):
        out = tmp_path / f"p{i}.parquet"
        argv = ["prepare-dataset", "--name", "sb", "--entry", json.dumps(_entry(sample, num_prompts=6)),
                "--tokenizer", str(qwen3_dir), "--output", str(out)]  # fmt: skip
        assert main(argv) == 0
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


def test_balanced_order_deals_categories_round_robin() -> None:
    from sdbench.datasets.prompts import PromptRecord

    recs = [PromptRecord(f"r{i}", "x", category=c) for i, c in enumerate("bbbaac")]
    assert [r.request_id for r in balanced_order(recs, "")] == ["r3", "r0", "r5", "r4", "r1", "r2"]
    plain = [PromptRecord("x", "t"), PromptRecord("y", "t", category="z")]
    assert [r.request_id for r in balanced_order(plain, "code")] == ["x", "y"]  # None counts as the entry's


# --- acceptance per category ----------------------------------------------------------------

CELL = {"engine": "vllm-cpu", "model": "tiny-target", "dataset": "sb"}


def _seq(method: str, bs: int, rid: str, steps: int | None, drafts: int | None, acc: int | None) -> dict[str, Any]:
    return {**CELL, "method": method, "batch_size": bs, "request_id": rid, "sd_num_steps": steps,
            "sd_num_draft_tokens": drafts, "sd_num_accepted_tokens": acc}  # fmt: skip


REQUESTS = pd.DataFrame(
    [
        _seq("ngram-k3", 1, "q1", 10, 30, 15),  # 2.5
        _seq("ngram-k3", 1, "q2", 5, 15, 5),  # 2.0
        _seq("ngram-k3", 1, "q3", 4, 12, 0),  # 1.0
        _seq("ngram-k3", 1, "q4", 0, 0, 0),  # one output token: no SD step
        _seq("eagle-k3", 2, "q1", 6, 18, 6),  # replicas of q1: pooled 1 + 8/10
        _seq("eagle-k3", 2, "q1", 4, 12, 2),
        _seq("none", 1, "q1", None, None, None),  # no SD: left out
    ]
).astype({"sd_num_steps": "Int64", "sd_num_draft_tokens": "Int64", "sd_num_accepted_tokens": "Int64"})
PROMPTS = pd.DataFrame(
    {"dataset": "sb", "request_id": ["q1", "q2", "q3", "q4"], "category": ["coding", "coding", "writing", "writing"]}
)


def test_category_acceptance_exact_numbers() -> None:
    t = category_acceptance(REQUESTS, PROMPTS, seed=0)
    assert list(t.columns) == COLUMNS
    assert t[["method", "batch_size", "category"]].values.tolist() == [
        ["eagle-k3", 2, "coding"], ["ngram-k3", 1, "coding"], ["ngram-k3", 1, "writing"],
    ]  # fmt: skip
    eagle, coding, writing = (r._asdict() for r in t.itertuples(index=False))
    assert (eagle["n_requests"], eagle["n_sequences"], eagle["num_steps"], eagle["num_accepted_tokens"]) == (
        1,
        2,
        10,
        8,
    )
    assert eagle["mean_acceptance_length"] == pytest.approx(1.8) and eagle["acceptance_rate"] == pytest.approx(8 / 30)
    assert eagle["request_mean_acceptance_length"] == pytest.approx(1.8)
    ci = ("request_mean_acceptance_length_ci_low", "request_mean_acceptance_length_ci_high")
    assert (eagle[ci[0]], eagle[ci[1]]) == pytest.approx((1.8, 1.8))
    assert (coding["n_requests"], coding["n_sequences"], coding["num_draft_tokens"]) == (2, 2, 45)
    assert coding["mean_acceptance_length"] == pytest.approx(1 + 20 / 15)
    assert coding["acceptance_rate"] == pytest.approx(20 / 45)
    assert coding["request_mean_acceptance_length"] == pytest.approx(2.25)
    assert 2.0 <= coding[ci[0]] <= 2.25 <= coding[ci[1]] <= 2.5
    assert (writing["n_requests"], writing["n_sequences"], writing["num_steps"]) == (1, 2, 4)
    assert writing["mean_acceptance_length"] == 1.0 and writing["acceptance_rate"] == 0.0
    assert (writing[ci[0]], writing[ci[1]]) == (1.0, 1.0)
    assert t.equals(category_acceptance(REQUESTS.iloc[::-1], PROMPTS, seed=0))  # order-free, seeded
    md = category_acceptance_markdown(t)
    assert "| coding | ngram-k3 | 2 | 2.33 | 2.25 [" in md and "### vllm-cpu / tiny-target / sb / batch size 2" in md


def test_category_acceptance_refuses_what_it_cannot_join() -> None:
    with pytest.raises(ValueError, match=r"1 request\(s\) of dataset 'sb' are in no prompt table \(q4;"):
        category_acceptance(REQUESTS, PROMPTS[PROMPTS["request_id"] != "q4"])
    with pytest.raises(ValueError, match="no sequence has per-request SD counters"):
        category_acceptance(REQUESTS[REQUESTS["method"] == "none"], PROMPTS)


def _write(df: pd.DataFrame, path: Path) -> str:
    df.to_parquet(path, index=False)
    return str(path)


def test_category_acceptance_cli_writes_table_markdown_and_figure(tmp_path: Path) -> None:
    req = [_write(g, tmp_path / f"{m}.parquet") for m, g in REQUESTS.groupby("method")]
    prompts = _write(PROMPTS.assign(prompt_text="p"), tmp_path / "prompts.parquet")
    outs = {k: tmp_path / f"out.{k}" for k in ("parquet", "md", "png")}
    argv = ["category-acceptance", "--requests", *req, "--prompts", prompts, "--table", str(outs["parquet"]),
            "--markdown", str(outs["md"]), "--figure", str(outs["png"])]  # fmt: skip
    assert main(argv) == 0
    first = {k: p.read_bytes() for k, p in outs.items()}
    assert main(argv) == 0
    assert {k: p.read_bytes() for k, p in outs.items()} == first
    written = pd.read_parquet(outs["parquet"])
    assert written.pop("measured").all()  # stamped by the command (sdbench.provenance): a measurement
    assert written.equals(category_acceptance(REQUESTS, PROMPTS))


def test_replicate_mode_calls_count_per_request_on_any_vllm_version(tmp_path: Path) -> None:
    """Engines before vLLM 0.32 record no per-request counters; a replicate-mode call is one prompt,
    so its counter deltas (first trial) are that request's, its replicas pooled."""
    from sdbench.analysis.categories import requests_from_calls

    keys = {"engine": "vllm-0.11.1", "model": "m", "dataset": "sb", "method": "ngram-k3", "batch_size": 2}
    calls = pd.DataFrame([
        {**keys, "trial": 0, "request_id": "q1", "num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 15},
        {**keys, "trial": 0, "request_id": "q2", "num_drafts": 4, "num_draft_tokens": 12, "num_accepted_tokens": 0},
        {**keys, "trial": 1, "request_id": "q1", "num_drafts": 99, "num_draft_tokens": 99, "num_accepted_tokens": 99},
    ])  # fmt: skip
    path = _write(calls, tmp_path / "calls.parquet")
    prompts = pd.DataFrame({"dataset": ["sb", "sb"], "request_id": ["q1", "q2"], "category": ["coding", "writing"]})
    t = category_acceptance(requests_from_calls([path]), prompts, seed=0)
    assert t[["category", "n_requests", "num_steps", "mean_acceptance_length"]].values.tolist() == [
        ["coding", 1, 10, 2.5], ["writing", 1, 4, 1.0],
    ]  # fmt: skip
    distinct = _write(calls.assign(request_id="*"), tmp_path / "distinct.parquet")
    with pytest.raises(ValueError, match="distinct mode"):
        requests_from_calls([distinct])


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing", "error: {d}/missing.parquet: no such file (expected a requests table)"),
        ("nocounters", "error: {d}/nocounters.parquet: requests table lacks column(s) sd_num_steps, "
                       "sd_num_draft_tokens, sd_num_accepted_tokens (has: "),
        ("nocategory", "error: {d}/nocategory.parquet: prompt table lacks column(s) category (has: "),
        ("conflict", "error: {d}/conflict.parquet, {d}/prompts.parquet: the prompt tables give request 'q1' of "
                     "dataset 'sb' different categories"),
        ("per_category", "error: --per-category: 0 (expected at least 1)"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_naming_it(
    case: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path
    req = _write(REQUESTS, d / "requests.parquet")
    prompts = _write(PROMPTS, d / "prompts.parquet")
    outs = ["--table", str(d / "t.parquet"), "--markdown", str(d / "t.md"), "--figure", str(d / "t.png")]
    argv = ["category-acceptance", "--requests", req, "--prompts", prompts, *outs]
    if case == "missing":
        argv[2] = str(d / "missing.parquet")
    elif case == "nocounters":
        argv[2] = _write(REQUESTS.drop(columns=["sd_num_steps", "sd_num_draft_tokens", "sd_num_accepted_tokens"]),
                         d / "nocounters.parquet")  # fmt: skip
    elif case == "nocategory":
        argv[4] = _write(PROMPTS.drop(columns="category"), d / "nocategory.parquet")
    elif case == "conflict":
        other = _write(PROMPTS.assign(category="math"), d / "conflict.parquet")
        argv = ["category-acceptance", "--requests", req, "--prompts", prompts, other, *outs]
    else:
        argv = ["speed-bench-sample", "--output", str(d / "s"), "--per-category", "0"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(expected.format(d=d)), err
    assert not (d / "t.parquet").exists() and not (d / "s").exists()
