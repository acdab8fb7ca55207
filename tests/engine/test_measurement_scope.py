"""The measurement scope (sdbench.engine.scope): engine jobs and checkpoints are keyed on the code
that runs in the engine process, so an edit of a trainer, a tracer or an analysis measures
nothing again, and an edit of the timed loop does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from sdbench.analysis.endtoend import stale_scope_note
from sdbench.engine import scope

REPO = Path(__file__).resolve().parents[2]

# The scope today, written out: a module joining it (an engine module importing a trainer, say)
# fails here and has to be a decision, not an accident (before the scope: 53 modules).
SCOPE = sorted(f"sdbench{'.' + m if m else ''}" for m in (
    "", "cliargs", "codedigest", "engine", "engine.measure", "engine.release", "engine.site", "engine.release.acceptancetrace", "engine.cli", "engine.commands", "engine.site.compilecache",
    "engine.measure.counters", "engine.measure.energy", "engine.measure.engine", "engine.release.enginefixes", "engine.measure.forcing", "engine.groups",
    "engine.site.hardware", "engine.measure.paired", "engine.measure.progress", "engine.site.quietguard", "engine.measure.resampling",
    "engine.measure.sampling", "engine.scope", "engine.measure.steptiming", "engine.measure.summary", "engine.release.touchpoints",
    "engine.tracegroup", "engine.measure.trials", "engine.release.versions", "engine.release.workerprobe", "errors", "io", "lazy",
    "lifeline", "provenance", "rehearsal", "requesttable", "traces", "traces.records",
))  # fmt: skip


def test_the_scope_is_the_named_modules() -> None:
    assert scope.measurement_modules() == SCOPE
    server = set(scope.measurement_modules(server=True)) - set(SCOPE)
    # servermode: which rounds each server start measures (start_rounds, start_order).
    assert server == {"sdbench.engine.serving", "sdbench.engine.serving.servegroup", "sdbench.engine.serving.server", "sdbench.engine.serving.loadgen",
                      "sdbench.engine.measure.latencysummary", "sdbench.servermode"}  # fmt: skip
    rehearsal = scope.measurement_modules(rehearsal=True)
    assert "sdbench.rehearsal.steps" in rehearsal and "sdbench.rehearsal.steps" not in SCOPE


def test_every_vllm_plugin_is_an_entry() -> None:
    """vLLM loads the plugins into the engine by entry point: no import names them."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    plugins = pyproject["project"]["entry-points"]["vllm.general_plugins"].values()
    assert {p.split(":")[0] for p in plugins} <= set(scope.ENTRIES)


def test_every_rehearsal_module_the_engine_loads_is_an_entry() -> None:
    """The engine loads the rehearsal's stand-in engine by name (``rehearsal.module("llm")``)."""
    import re

    text = "".join(p.read_text() for p in (REPO / "src" / "sdbench" / "engine").rglob("*.py"))
    loaded = {f"sdbench.rehearsal.{name}" for name in re.findall(r'rehearsal\.module\("(\w+)"\)', text)}
    assert loaded and loaded <= set(scope.REHEARSAL_ENTRIES), sorted(loaded - set(scope.REHEARSAL_ENTRIES))


def test_outside_holds_only_what_cannot_change_a_number() -> None:
    assert set(scope.OUTSIDE) == {"sdbench.engine.site.preflight"}
    assert not set(scope.OUTSIDE) & set(SCOPE)
    # The trainers, tracers and dataset builders preflight reaches stay out with it.
    assert "sdbench.models.training" not in SCOPE and "sdbench.datasets.corpus" not in SCOPE


def _digests(src: Path) -> dict[str, str]:
    code = ("import json; from sdbench.engine.scope import measurement_digest as d; "
            "print(json.dumps({'measured': d(), 'rehearsal': d(rehearsal=True)}))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(src)},
                          capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(done.stdout)


def test_only_an_edit_of_the_measurement_changes_its_digest(tmp_path: Path) -> None:
    """A statement appended to a trainer, a corpus builder, a tracer, the analyses' statistics, the
    rehearsal's step model and a figure module leaves a measured run's digest as it was; one in
    the timed loop changes it. The rehearsal's step model is its engine: a rehearsal's changes."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    before = _digests(src)
    for module in ("models/training.py", "datasets/corpus.py", "traces/suffix.py", "analysis/stats.py",
                   "analysis/verdict.py"):  # fmt: skip
        path = src / "sdbench" / module
        path.write_text(path.read_text() + "\n_EDITED = 1\n")
    assert _digests(src) == before
    steps = src / "sdbench" / "rehearsal" / "steps.py"
    steps.write_text(steps.read_text() + "\n_EDITED = 1\n")
    after = _digests(src)
    assert after["measured"] == before["measured"] and after["rehearsal"] != before["rehearsal"]
    trials = src / "sdbench" / "engine" / "measure" / "trials.py"
    trials.write_text(trials.read_text() + "\n_EDITED = 1\n")
    assert _digests(src)["measured"] != before["measured"]


def test_the_checkpoint_key_holds_the_scope_digest(tmp_path: Path) -> None:
    from sdbench.engine.groups import measurement_context

    prompts = tmp_path / "p.parquet"
    prompts.write_bytes(b"prompts")
    context = measurement_context({"d": str(prompts)}, str(tmp_path), None, "flag", False)
    assert context["code"] == scope.measurement_digest()
    rehearsal = measurement_context({"d": str(prompts)}, str(tmp_path), None, "flag", False, rehearsal=True)
    assert rehearsal["code"] == scope.measurement_digest(rehearsal=True) != context["code"]


def test_engine_rules_are_keyed_on_the_scope() -> None:
    rules = {p.name: p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk")}
    for name, rule in (("runs.smk", "run_engine"), ("runs.smk", "run_cell"), ("acceptance.smk", "trace_group"),
                       ("acceptance.smk", "trace_cell"), ("breakdown.smk", "breakdown_group"),
                       ("breakdown.smk", "breakdown_cell"), ("server.smk", "serve_group")):  # fmt: skip
        body = rules[name].split(f"rule {rule}:", 1)[1].split("\nrule ", 1)[0]
        assert "code=MEASUREMENT_CODE," in body or "code=SERVER_MEASUREMENT_CODE," in body, rule
    assert "engine.cli" not in "".join(rules.values())


def _cells(*digests: str, measured: bool = True) -> pd.DataFrame:
    return pd.DataFrame([{"engine": "e", "model": "m", "dataset": "d", "method": f"m{i}", "batch_size": 4,
                          "measurement_digest": d, "measured": measured} for i, d in enumerate(digests)])  # fmt: skip


def test_aggregate_names_the_cells_of_an_older_scope() -> None:
    now = scope.measurement_digest()
    assert stale_scope_note(_cells(now, now)) is None
    note = stale_scope_note(_cells(now, "0123456789abcdef", ""))
    assert note == (f"warning: 2 of 3 cells were measured under another measurement scope than this checkout's "
                    f"({now}), e.g. e/m/d/m1/bs4; to measure exactly those again: {scope.REMEASURE_COMMAND}")  # fmt: skip
    # A rehearsal's cells are held against the rehearsal's scope.
    assert stale_scope_note(_cells(scope.measurement_digest(rehearsal=True), measured=False)) is None
    assert stale_scope_note(_cells(now, measured=False)) is not None
    assert stale_scope_note(_cells(now).drop(columns="measured")) is None


@pytest.mark.parametrize(("recorded", "stale"), [([("a", "x"), ("b", "y")], ["b"]), ([("c", ""), ("a", "x")], ["c"])])
def test_stale_cells(recorded: list[tuple[str, str]], stale: list[str]) -> None:
    assert scope.stale_cells(recorded, "x") == stale


def test_only_the_corpus_builders_read_the_corpus() -> None:
    """prepare_dataset's digest leaves the corpus out for every other builder: no other builder of
    sdbench.datasets.prompts may import it."""
    import ast

    from sdbench.datasets.prompts import CORPUS_BUILDERS

    tree = ast.parse((REPO / "src/sdbench/datasets/prompts.py").read_text())
    readers = set()
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        names = [d.args[0].value for d in fn.decorator_list
                 if isinstance(d, ast.Call) and getattr(d.func, "id", "") == "builder"]  # fmt: skip
        imports = {n.module for n in ast.walk(fn) if isinstance(n, ast.ImportFrom)}
        if names and "sdbench.datasets.corpus" in imports:
            readers.update(names)
    assert readers == set(CORPUS_BUILDERS) == {"code_edit", "code_write"}
    from sdbench.config import load_config
    from sdbench.workflow.plan import Plan

    paper = Plan(load_config(REPO / "config/paper.yaml"))
    assert paper.prepare_outside("gsm8k") == ("sdbench.datasets.corpus",)
    assert Plan(load_config(REPO / "config/config.yaml")).prepare_outside("code-edit") == ()


def test_sdbench_aggregate_prints_the_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sdbench.cli import main

    paths = []
    for method, digest in (("none", scope.measurement_digest()), ("ngram", "0123456789abcdef")):
        path = tmp_path / f"{method}.parquet"
        pd.DataFrame([{"engine": "e", "model": "m", "dataset": "d", "method": method, "batch_size": 1,
                       "tokens_per_s": 10.0, "tokens_per_s_pooled": 10.0, "measurement_digest": digest}]).to_parquet(path)  # fmt: skip
        paths.append(str(path))
    assert main(["aggregate", "--summaries", *paths, "--baseline", "none", "--cells", str(tmp_path / "cells.parquet")]) == 0
    assert "warning: 1 of 2 cells were measured under another measurement scope" in capsys.readouterr().err


def test_a_cell_records_the_scope_it_was_measured_under() -> None:
    """A measured CPU cell (no GPUs looked up) records the measured scope, a rehearsed one the
    rehearsal's, a server cell the server's."""
    from sdbench.engine.site.hardware import provenance

    assert provenance(gpus=False, rehearsal=False)["measurement_digest"] == scope.measurement_digest()
    assert provenance(gpus=False)["measurement_digest"] == scope.measurement_digest(rehearsal=True)
    assert provenance(gpus=False, rehearsal=False, server=True)["measurement_digest"] == (
        scope.measurement_digest(server=True))
