"""Config validation: bad input fails early with the key named."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from sdbench.config import ConfigError, load_config, validate_config
from sdbench.grid import cells

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def default_config() -> dict:
    with open(REPO / "config" / "config.yaml") as fh:
        return yaml.safe_load(fh)


def test_shipped_configs_are_valid() -> None:
    # 36 + MTP model (none, mtp-k3) + 6 random-token control cells + 5 proposal-length points
    # (n-gram k=1/10, EAGLE-3 k=1/5/10) + 9 temperature points (no SD, n-gram, EAGLE-3 at T=0.5/1/1.5)
    # + 3 SPEED-Bench stand-in cells (no SD, n-gram, EAGLE-3 at bs 1)
    assert len(cells(load_config(REPO / "config" / "config.yaml"))) == 114
    assert len(cells(load_config(REPO / "config" / "paper.yaml"))) >= 400


def test_defaults_are_filled(default_config: dict) -> None:
    cfg = validate_config(copy.deepcopy(default_config))
    assert cfg["run"]["batch_mode"] == "replicate"
    assert cfg["engines"]["vllm-cpu"]["patches"] == []


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c["grid"][0]["methods"].append("ngram-k9"), "grid[0].methods: unknown method 'ngram-k9'"),
        (lambda c: c["grid"][0]["batch_sizes"].append(-4), "grid[0].batch_sizes[3]"),
        (lambda c: c["grid"][0]["datasets"].append("sharegpt"), "grid[0].datasets: unknown dataset 'sharegpt'"),
        (lambda c: c["methods"]["ngram-k3"].update(method="ngarm"), "methods.ngram-k3.method"),
        (lambda c: c["methods"]["ngram-k3"].update(num_speculative_token=3), "methods.ngram-k3"),
        (lambda c: c["methods"]["draft-k3"].pop("drafter"), "methods.draft-k3.drafter"),
        (lambda c: c["methods"]["ngram-k3"].update(prompt_lookup_min=9), "prompt_lookup_min (9) > prompt_lookup_max"),
        (lambda c: c["grid"][0].update(engine="vllm-9"), "grid[0].engine: unknown engine 'vllm-9'"),
        (lambda c: c["datasets"]["code-edit"].update(num_prompts=0), "datasets.code-edit.num_prompts"),
        (lambda c: c["bleu"].update(published_ngram_policies=["fixed3"]), "bleu.published_ngram_policies[0]"),
    ],
)
def test_bad_config_names_the_key(default_config: dict, mutate, expected: str) -> None:
    mutate(default_config)
    with pytest.raises(ConfigError) as info:
        validate_config(default_config)
    assert expected in str(info.value)


def test_unsupported_method_on_engine_is_a_config_error(default_config: dict) -> None:
    default_config["engines"]["vllm-cpu"]["vllm_version"] = "0.10.1.1"
    with pytest.raises(ConfigError, match=r"forced_acceptance.engine: 'vllm-cpu' runs vLLM 0.10.1.1, which has no "
                                          r"synthetic rejection sampling"):  # fmt: skip
        validate_config(copy.deepcopy(default_config))
    del default_config["forced_acceptance"]
    with pytest.raises(ConfigError, match=r"server.methods\[1\]: 'ngram-k3' on engine 'vllm-cpu'"):
        validate_config(copy.deepcopy(default_config))  # the server section is checked with the config
    del default_config["server"]
    cfg = validate_config(default_config)
    with pytest.raises(ConfigError, match=r"grid\[0\]: method 'ngram-k3' on engine 'vllm-cpu'"):
        cells(cfg)


def test_load_config_reports_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_cli_check_config_exit_code(tmp_path: Path, default_config: dict, capsys) -> None:
    from sdbench.cli import main

    default_config["grid"][0]["batch_sizes"] = [1, -2]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(default_config))
    assert main(["check-config", str(bad)]) == 2
    assert "grid[0].batch_sizes[1]" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c["models"]["tiny-target-eagle"]["head"].update(kind="eagle3"), "is an eagle3 head, but the method is 'eagle'"),
        (lambda c: c["models"]["tiny-target-eagle"]["head"].update(target="tiny-draft"), "was trained for 'tiny-draft'"),
        (lambda c: c["models"]["tiny-target-eagle"]["head"].update(target="nowhere"), "models.tiny-target-eagle.head.target"),
        (lambda c: c["methods"]["mtp-k3"].update(drafter={"tiny-target-mtp": "tiny-target-eagle"}), "is an eagle head, but the method is 'mtp'"),
        (lambda c: c["grid"][1].update(models=["tiny-target-mtp", "tiny-target"]), "no drafter for target model 'tiny-target'"),
        (
            lambda c: (
                c["grid"][1].update(models=["tiny-target-mtp", "tiny-target"]),
                c["methods"]["mtp-k3"]["drafter"].update({"tiny-target": "tiny-target-mtp"}),
            ),
            "'tiny-target-mtp' is an MTP model; its MTP layer ships inside it",
        ),
    ],
)
def test_a_head_must_match_its_method_and_target(default_config: dict, mutate, expected: str) -> None:
    cfg = copy.deepcopy(default_config)
    mutate(cfg)
    with pytest.raises(ConfigError, match=expected):
        validate_config(cfg, source="config")
