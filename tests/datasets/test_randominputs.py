"""Random-token control prompts (sdbench.datasets.randomtokens) and their comparison (analysis.randominputs)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from support.datasets_tokenizers import save_llama3_like
from transformers import AutoTokenizer

from sdbench.analysis import randominputs
from sdbench.config import ConfigError, validate_config
from sdbench.datasets.prompts import prepare
from sdbench.datasets.randomtokens import ordinary_token_ids, random_token_prompts

REPO = Path(__file__).resolve().parents[2]
SDBENCH = Path(sys.executable).with_name("sdbench")
ENTRY = {"source": "random_tokens", "matched_to": "code-edit", "num_prompts": 3, "max_tokens": 16}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_llama3_like(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def real(tokenizer_dir: Path) -> pd.DataFrame:
    entry = {"source": "builtin", "builder": "code_edit", "num_prompts": 4, "max_tokens": 16, "max_prompt_tokens": 2048}
    return prepare("code-edit", entry, AutoTokenizer.from_pretrained(tokenizer_dir), seed=1)


def test_random_prompts_match_lengths_keep_bos_and_are_seeded(tokenizer_dir: Path, real: pd.DataFrame) -> None:
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    table = random_token_prompts("code-edit-random", ENTRY, real, tok, seed=1)
    assert len(table) == 3 and list(table["request_id"]) == [f"random-{r}" for r in real["request_id"][:3]]
    assert [len(x) for x in table["prompt_token_ids"]] == [len(x) for x in real["prompt_token_ids"][:3]]
    assert all(ids[0] == tok.bos_token_id for ids in table["prompt_token_ids"])  # the template's BOS
    vocab = set(ordinary_token_ids(tok))
    assert all(set(ids[1:]) <= vocab for ids in table["prompt_token_ids"])
    assert table["prompt_token_ids"].map(list).tolist() != real["prompt_token_ids"][:3].map(list).tolist()
    again = random_token_prompts("code-edit-random", ENTRY, real, tok, seed=1)
    assert again["prompt_token_ids"].map(list).tolist() == table["prompt_token_ids"].map(list).tolist()
    other = random_token_prompts("code-edit-random", ENTRY, real, tok, seed=2)
    assert other["prompt_token_ids"].map(list).tolist() != table["prompt_token_ids"].map(list).tolist()
    with pytest.raises(ConfigError, match=r"datasets.r.num_prompts: 9, but 'code-edit' has only 4"):
        random_token_prompts("r", {**ENTRY, "num_prompts": 9}, real, tok, seed=1)


def test_prepare_dataset_command_needs_the_matched_table(tokenizer_dir: Path, real: pd.DataFrame, tmp_path: Path) -> None:
    real.to_parquet(tmp_path / "real.parquet")
    base = [str(SDBENCH), "prepare-dataset", "--name", "rnd", "--entry", json.dumps(ENTRY),
            "--tokenizer", str(tokenizer_dir), "--output", str(tmp_path / "rnd.parquet")]  # fmt: skip
    missing = subprocess.run(base, capture_output=True, text=True)
    assert missing.returncode == 2 and "datasets.rnd: a random_tokens dataset needs --matched" in missing.stderr
    done = subprocess.run([*base, "--matched", str(tmp_path / "real.parquet")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert len(pd.read_parquet(tmp_path / "rnd.parquet")) == 3


def test_config_checks_the_matched_dataset() -> None:
    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    for matched, num, message in (
        ("nope", 8, "datasets.code-edit-random.matched_to: 'nope' is not a dataset"),
        ("code-edit-random", 8, "is itself random tokens"),
        ("code-edit", 99, "datasets.code-edit-random.num_prompts: 99 > 'code-edit''s 8"),
    ):
        bad = copy.deepcopy(raw)
        bad["datasets"]["code-edit-random"].update(matched_to=matched, num_prompts=num)
        with pytest.raises(ConfigError, match=message):
            validate_config(bad)


def _cell(dataset: str, method: str, bs: int, acc: float, speedup: float) -> dict:
    return {
        "engine": "e", "model": "m", "dataset": dataset, "method": method, "batch_size": bs,
        "sd_method": "none" if method == "none" else "ngram", "mean_acceptance_length": acc, "speedup": speedup,
        "speedup_ci_low": 0.9 * speedup, "speedup_ci_high": 1.1 * speedup, "tokens_per_s": 100 * speedup,
        "output_len_mean": 50.0,
    }  # fmt: skip


def test_random_vs_real_table_figure_and_errors(tmp_path: Path) -> None:
    cells = pd.DataFrame([
        _cell("real", "none", 1, float("nan"), 1.0), _cell("real", "ng", 1, 3.0, 2.0),
        _cell("rnd", "none", 1, float("nan"), 1.0), _cell("rnd", "ng", 1, 1.5, 0.9), _cell("other", "ng", 4, 2.0, 1.1),
    ])  # fmt: skip
    table = randominputs.random_vs_real(cells, {"rnd": "real"})
    assert list(table["method"]) == ["ng", "none"]
    sd = table[table.method == "ng"].iloc[0]
    assert sd["speedup_ratio"] == pytest.approx(0.45) and sd["mean_acceptance_length_ratio"] == pytest.approx(0.5)
    md = randominputs.random_vs_real_markdown(table)
    assert "| rnd (real) | m | ng | 1 | 3.00 / 1.50 | 2.00 [1.80, 2.20] / 0.90 [0.81, 0.99] | 0.45 | 1.00 |" in md
    randominputs.plot_random_vs_real(table, tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 5_000
    with pytest.raises(ValueError, match="no cell of dataset 'gone'"):
        randominputs.random_vs_real(cells, {"gone": "real"})
    with pytest.raises(ValueError, match="no random_tokens dataset"):
        randominputs.random_vs_real(cells, {})
