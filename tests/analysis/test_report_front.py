"""The HTML report's front page (workflow/report/workflow.rst) says what the run is: a rehearsal
is never described as cells run on the real vLLM engine."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import jinja2

REPO = Path(__file__).resolve().parents[2]


def _front(config: dict) -> str:
    template = jinja2.Template((REPO / "workflow" / "report" / "workflow.rst").read_text())
    return template.render(snakemake=SimpleNamespace(config=config), categories={})


def test_the_front_page_follows_the_engine_mode() -> None:
    grid = {"grid": [{"engine": "e", "models": ["m"], "methods": ["none"], "datasets": ["d"], "batch_sizes": [1]}],
            "engines": {"e": {"vllm_version": "0.11.1", "device": "cuda"}}}  # fmt: skip
    measured, rehearsed = _front(grid), _front({**grid, "engine_mode": "rehearsal"})
    assert "ran on the real vLLM engine" in measured and "rehearsal" not in measured
    assert "**This run is a rehearsal**: no grid cell was measured." in rehearsed
    assert "ran on the real vLLM engine" not in rehearsed
