"""Code digests: a changed statement changes the step's digest; comments and docs do not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sdbench.codedigest import code_digest, module_closure

REPO = Path(__file__).resolve().parents[2]


def digests_of(src: Path, *modules: str) -> dict[str, str]:
    """Digests computed in a fresh interpreter that imports sdbench from ``src``."""
    code = (
        "import json, sys; from sdbench.codedigest import code_digest; "
        "print(json.dumps({m: code_digest(m) for m in sys.argv[1:]}))"
    )
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", code, *modules], env=env, capture_output=True, text=True, check=True)
    import json

    return json.loads(out.stdout)


@pytest.fixture()
def src_copy(tmp_path: Path) -> Path:
    dest = tmp_path / "src"
    shutil.copytree(REPO / "src", dest, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return dest


def test_closure_follows_package_imports() -> None:
    closure = module_closure("sdbench.analysis.bleu")
    assert {"sdbench.analysis.bleu", "sdbench.io"} <= set(closure)
    assert "sdbench.engine.measure.trials" not in closure
    assert closure == sorted(closure)


def test_a_module_brings_the_packages_it_sits_in() -> None:
    """Importing sdbench.engine.measure.trials runs engine/__init__ and engine/measure/__init__ first."""
    closure = module_closure("sdbench.engine.measure.trials")
    assert {"sdbench", "sdbench.engine", "sdbench.engine.measure", "sdbench.engine.release"} <= set(closure)


PROBE = '"""A module whose digest the tests pin."""\n\nVALUE = 1\n\n\ndef twice(x: int) -> int:\n    return 2 * x\n'


def test_digest_is_pinned_and_module_specific(src_copy: Path) -> None:
    """A fixed module has a fixed digest (its syntax tree, not the run): pinned, in a fresh interpreter."""
    (src_copy / "sdbench" / "pinned_probe.py").write_text(PROBE)
    assert digests_of(src_copy, "sdbench.pinned_probe") == {"sdbench.pinned_probe": "3e4436587f7d6255"}  # with sdbench/__init__
    assert code_digest("sdbench.analysis.bleu") != code_digest("sdbench.analysis.memory")


def test_comment_and_docstring_edits_keep_the_digest(src_copy: Path) -> None:
    before = digests_of(src_copy, "sdbench.analysis.memory", "sdbench.analysis.bleu")
    path = src_copy / "sdbench" / "analysis" / "memory.py"
    text = path.read_text()
    text = text.replace('"""', '"""Edited documentation. ', 1) + "\n# a trailing comment\n"
    path.write_text(text)
    assert digests_of(src_copy, "sdbench.analysis.memory", "sdbench.analysis.bleu") == before


def test_statement_edit_changes_the_step_and_its_importers_only(src_copy: Path) -> None:
    modules = ("sdbench.io", "sdbench.analysis.memory", "sdbench.analysis.bleu", "sdbench.engine.commands")
    before = digests_of(src_copy, *modules)
    io_path = src_copy / "sdbench" / "io.py"
    io_path.write_text(io_path.read_text() + "\n_PROBE = 1\n")
    after = digests_of(src_copy, *modules)
    # Every step whose code imports sdbench.io changes; here all of them do.
    assert all(after[m] != before[m] for m in modules)
    mem_path = src_copy / "sdbench" / "analysis" / "memory.py"
    mem_path.write_text(mem_path.read_text() + "\n_PROBE = 2\n")
    again = digests_of(src_copy, *modules)
    assert again["sdbench.analysis.memory"] != after["sdbench.analysis.memory"]
    assert {m: again[m] for m in modules if m != "sdbench.analysis.memory"} == {
        m: after[m] for m in modules if m != "sdbench.analysis.memory"
    }


def test_unknown_module_is_an_error() -> None:
    with pytest.raises(ValueError, match="sdbench.nonexistent"):
        code_digest("sdbench.nonexistent")


def test_workflow_step_names_resolve() -> None:
    """Every module a rule passes to code_digest exists (a renamed module fails here, not silently)."""
    import re

    from sdbench.codedigest import step_modules

    rules = "".join(p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk"))
    calls = re.findall(r"code_digest\(([^)]*)\)", rules)
    names = sorted({n for call in calls for n in re.findall(r'"([^"]+)"', call)})
    assert "sdbench.analysis.endtoend" in names  # the engine rules: tests/engine/test_measurement_scope.py
    for name in names:
        assert len(code_digest(name)) == 16, name
        assert name in module_closure(name) or step_modules(name) != [name], name


def test_a_package_stands_for_all_its_modules() -> None:
    closure = module_closure("sdbench.traces")
    assert {"sdbench.traces", "sdbench.traces.cli", "sdbench.traces.fetch", "sdbench.traces.table"} <= set(closure)
    assert code_digest("sdbench.traces") != code_digest("sdbench.traces.table")


def test_the_cache_serves_a_fresh_process_and_misses_after_an_edit(src_copy: Path, tmp_path: Path) -> None:
    """A second interpreter reads the digests the first computed, without parsing; an edit of any
    module of the package reads another cache file, so the edited step's digest is recomputed."""
    cache = tmp_path / "cache"
    code = (
        "import json, sys; from sdbench import codedigest as c; c.use_cache(sys.argv[1]); "
        "parse = sys.argv[2] == 'parse'; "
        "c._parsed = c._parsed if parse else (lambda name: (_ for _ in ()).throw(AssertionError('parsed ' + name))); "
        "print(json.dumps({m: c.code_digest(m) for m in sys.argv[3:]}))"
    )
    env = {**os.environ, "PYTHONPATH": str(src_copy)}

    def run(mode: str, *modules: str) -> dict[str, str]:
        out = subprocess.run([sys.executable, "-c", code, str(cache), mode, *modules], env=env,
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-2000:]
        import json

        return json.loads(out.stdout)

    modules = ("sdbench.analysis.bleu", "sdbench.analysis.memory")
    first = run("parse", *modules)
    assert first == digests_of(src_copy, *modules)  # the cache keeps the uncached value
    assert len(list(cache.glob("*.json"))) == 1
    assert run("cached", *modules) == first  # served without parsing a module
    path = src_copy / "sdbench" / "analysis" / "memory.py"
    path.write_text(path.read_text() + "\nEDITED = 1\n")
    with pytest.raises(AssertionError, match="parsed"):
        run("cached", "sdbench.analysis.memory")  # another package state: not in any cache file
    after = run("parse", *modules)
    assert after["sdbench.analysis.memory"] != first["sdbench.analysis.memory"]
    assert after["sdbench.analysis.bleu"] == first["sdbench.analysis.bleu"]
    assert len(list(cache.glob("*.json"))) == 2
