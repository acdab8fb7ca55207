"""support/tinybuild.py: the session's tiny-target build is seeded only into a run whose config
builds it alike, with the model kept newer than its tokenizer (Snakemake's mtime check)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from support import tinybuild


def _built(root: Path) -> Path:
    for i, output in enumerate(tinybuild.OUTPUTS):
        (root / output).mkdir(parents=True)
        (root / output / "config.json").write_text("{}")
        for path in (root / output / "config.json", root / output):
            os.utime(path, (1_000_000 + 100 * i, 1_000_000 + 100 * i))
    return root


def test_every_config_it_serves_builds_the_same_model() -> None:
    for name in ("faults", "server", "slurm-timeout"):
        assert tinybuild._build_inputs(tinybuild.REPO / ".test" / "config" / f"{name}.yaml") == \
            tinybuild._build_inputs(tinybuild.CONFIG), name


def test_seed_copies_with_mtimes_and_refuses_another_model(tmp_path: Path) -> None:
    built = _built(tmp_path / "built")
    tinybuild.seed(tmp_path / "run", built, tinybuild.CONFIG)
    tokenizer, model = (tmp_path / "run" / o for o in tinybuild.OUTPUTS)
    assert (model / "config.json").read_text() == "{}"
    assert tokenizer.stat().st_mtime == 1_000_000 < model.stat().st_mtime == 1_000_100
    other = yaml.safe_load(tinybuild.CONFIG.read_text())
    other["models"][tinybuild.MODEL]["build"]["steps"] = 21
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    with pytest.raises(AssertionError, match="other.yaml: its seed or tiny-target entry differs"):
        tinybuild.seed(tmp_path / "run2", built, tmp_path / "other.yaml")
    assert not (tmp_path / "run2").exists()
