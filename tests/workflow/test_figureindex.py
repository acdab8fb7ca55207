"""The figure index: one path, one rule, one function and one caption per figure or table."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from sdbench.config import ConfigError, load_config, validate_config
from sdbench.figureindex import ITEMS, PAPER_DIR, markdown_index, paper_path, published_scope

REPO = Path(__file__).resolve().parents[2]

RULES = {
    name: path
    for path in (REPO / "workflow" / "rules").glob("*.smk")
    for name in re.findall(r"^rule (\w+):", path.read_text(), flags=re.M)
}


def test_docs_hold_the_index_as_the_package_prints_it() -> None:
    assert markdown_index() in (REPO / "docs" / "figures.md").read_text()


@pytest.mark.parametrize("item", ITEMS, ids=lambda item: item.name)
def test_every_item_has_its_rule_function_and_caption(item) -> None:
    assert item.rule_name in RULES, f"no rule {item.rule_name}"
    # The rule writes the item through paper_report() (its report() entry and path).
    assert f'paper_report("{item.name}"' in RULES[item.rule_name].read_text()
    module, _, function = item.function.rpartition(".")
    assert callable(getattr(importlib.import_module(f"sdbench.{module}"), function))
    assert (REPO / "workflow" / "report" / f"{item.name}.rst").is_file()
    assert item.path().startswith(f"{PAPER_DIR}/{item.name}")
    # A figure's rule declares its drawn table (save_png writes it beside the PNG).
    assert (".csv" in item.files) == (".png" in item.suffixes)
    if ".png" in item.suffixes:
        assert f'drawn_table("{item.name}")' in RULES[item.rule_name].read_text()


def test_paths_and_scopes() -> None:
    assert paper_path("fig09_fixed_vs_oracle", scope="published/exact") == (
        "results/paper/fig09_fixed_vs_oracle/published/exact.png"
    )
    assert paper_path("ext03_compat_vs_exact", ".md") == "results/paper/ext03_compat_vs_exact.md"
    assert paper_path("ext03_compat_vs_exact", ".csv") == "results/paper/ext03_compat_vs_exact.csv"  # drawn table
    with pytest.raises(KeyError, match="ext03_compat_vs_exact writes"):
        paper_path("ext03_compat_vs_exact", ".parquet")
    with pytest.raises(KeyError, match="tab01_generation_length writes"):
        paper_path("tab01_generation_length", ".csv")  # a Markdown table is its own table
    assert published_scope("published/gsm8k") == "gsm8k" and published_scope("published") == ""
    assert published_scope("vllm-cpu/tiny-target/code-edit") is None


def test_an_engine_named_like_the_published_scope_is_refused() -> None:
    config = load_config(REPO / "config" / "config.yaml")
    config["engines"]["published"] = config["engines"].pop(config["grid"][0]["engine"])
    for block in config["grid"]:
        block["engine"] = "published"
    with pytest.raises(ConfigError, match="engines.published: reserved name"):
        validate_config(config)
