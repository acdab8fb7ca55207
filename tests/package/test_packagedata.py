"""Package data lookup (sdbench.packagedata) and its SDBENCH_DATA_DIR override, in-process."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from sdbench.config import ConfigError, load_schema
from sdbench.simulator.costmodel import available_cost_models, load_cost_model
from sdbench.models.spec import load_model_spec
from sdbench.packagedata import DATA_DIR_ENV, data_file, list_data, shipped_dir

SHIPPED = "llama3.1-8b-h100"


def _cost_model_yaml(name: str, c_fixed: float) -> str:
    data = load_cost_model(SHIPPED).to_dict()
    data.update(name=name)
    data["target"]["c_fixed"] = c_fixed
    return yaml.safe_dump(data)


@pytest.fixture
def override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty override directory, active for the test."""
    root = tmp_path / "data"
    (root / "cost_models").mkdir(parents=True)
    monkeypatch.setenv(DATA_DIR_ENV, str(root))
    return root


def test_shipped_data_is_inside_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    assert f"{SHIPPED}.yaml" in list_data("cost_models")
    assert "meta-llama--Llama-3.1-8B-Instruct.yaml" in list_data("models")
    assert list_data("schemas") == ["config.schema.yaml"]
    assert Path(str(shipped_dir("models"))).parts[-3:] == ("sdbench", "data", "models")
    assert load_schema()["type"] == "object"


def test_override_adds_and_shadows(override: Path) -> None:
    (override / "cost_models" / "mine.yaml").write_text(_cost_model_yaml("mine", 0.5))
    (override / "cost_models" / f"{SHIPPED}.yaml").write_text(_cost_model_yaml(SHIPPED, 0.25))
    assert available_cost_models() == sorted(["mine", SHIPPED])
    assert load_cost_model("mine").target.c_fixed == 0.5
    assert load_cost_model(SHIPPED).target.c_fixed == 0.25
    assert data_file("cost_models", "mine.yaml") == override / "cost_models" / "mine.yaml"
    # No models/ in the override: the shipped architecture configs still resolve.
    assert load_model_spec("meta-llama/Llama-3.1-8B-Instruct").num_hidden_layers == 32


def test_override_model_yaml(override: Path) -> None:
    shipped = yaml.safe_load(data_file("models", "meta-llama--Llama-3.2-1B-Instruct.yaml").read_text())
    (override / "models").mkdir()
    (override / "models" / "acme--tiny.yaml").write_text(yaml.safe_dump({**shipped, "repo_id": "acme/tiny"}))
    spec = load_model_spec("acme/tiny")
    assert spec.source == str(override / "models" / "acme--tiny.yaml")
    assert "acme--tiny.yaml" in list_data("models") and "Qwen--Qwen3-8B.yaml" in list_data("models")


def test_schemas_are_not_overridable(override: Path) -> None:
    (override / "schemas").mkdir()
    (override / "schemas" / "config.schema.yaml").write_text("{}")
    assert load_schema()["type"] == "object"


def test_missing_override_dir_names_variable_and_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nope"
    monkeypatch.setenv(DATA_DIR_ENV, str(missing))
    with pytest.raises(ConfigError, match=re.escape(f"{DATA_DIR_ENV}={missing}: no such directory")):
        load_cost_model(SHIPPED)
    with pytest.raises(ConfigError, match=DATA_DIR_ENV):
        list_data("models")


def test_unknown_names_list_what_exists(override: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"no cost model named 'nope' .*{re.escape(SHIPPED)}"):
        load_cost_model("nope")
    with pytest.raises(
        ValueError, match=f"no architecture config for 'acme/none': .* or {re.escape(str(override / 'models'))}"
    ):
        load_model_spec("acme/none")
    with pytest.raises(ValueError, match="plain file name"):
        data_file("models", "../models/x.yaml")
