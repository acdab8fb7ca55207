"""scripts/astmoves.py: a moved definition whose AST is the same is 'identical', one whose docstring
alone changed 'docstring', one whose code changed 'CHANGED', one gone 'MISSING'; a method moved to
another class (a mixin) is found by its name; --rename reads one alias as another."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("astmoves", REPO / "scripts" / "astmoves.py")
assert _spec is not None and _spec.loader is not None
astmoves = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(astmoves)

OLD = '''
def same(x):
    """Doc."""
    return x + 1


def redoc(x):
    """Old doc."""
    return x


def edited(x):
    return _run(x)


def gone():
    pass


class Big:
    def method(self):
        return 1
'''
NEW_A = '''
def same(x):
    """Doc."""
    return x + 1


def redoc(x):
    """New doc."""
    return x


class Mixin:
    def method(self):
        return 1
'''
NEW_B = '''
def edited(x):
    return run_command(x) + 1


class Big(Mixin):
    pass
'''


def _verdicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *extra: str,
              new_b: str = NEW_B) -> dict[str, str]:  # fmt: skip
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "old.py").write_text(OLD)
    subprocess.run([*git, "-C", str(tmp_path), "add", "old.py"], check=True)
    subprocess.run([*git, "-C", str(tmp_path), "commit", "-q", "-m", "old"], check=True)
    (tmp_path / "a.py").write_text(NEW_A)
    (tmp_path / "b.py").write_text(new_b)
    monkeypatch.chdir(tmp_path)
    code = astmoves.main([*extra, "HEAD", "old.py", "--", "a.py", "b.py"])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| `")]
    verdicts = {row[0].strip("| `"): row[3].strip(" |") for row in rows}
    verdicts["exit"] = str(code)
    return verdicts


def test_each_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    v = _verdicts(tmp_path, monkeypatch, capsys)
    assert (v["same"], v["redoc"], v["edited"], v["gone"]) == ("identical", "docstring", "CHANGED", "MISSING")
    assert v["Big.method"] == "identical"  # found in Mixin by its name
    assert v["Big"] == "CHANGED" and v["exit"] == "1"


def test_rename_reads_an_alias_as_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    aliased = NEW_B.replace("run_command(x) + 1", "run_command(x)")  # edited: only its helper's alias differs
    assert _verdicts(tmp_path / "a", monkeypatch, capsys, new_b=aliased)["edited"] == "CHANGED"
    assert _verdicts(tmp_path / "b", monkeypatch, capsys, "--rename", "_run=run_command", new_b=aliased)["edited"] == "identical"


def test_module_reads_an_import_of_a_moved_module_as_the_new_one() -> None:
    old = "def f():\n    from pkg.trials import run\n    import pkg.trials\n    return run\n"
    new = "def f():\n    from pkg.measure.trials import run\n    import pkg.measure.trials\n    return run\n"
    moved = {"pkg.trials": "pkg.measure.trials"}
    assert astmoves.definitions(old) != astmoves.definitions(new)
    assert astmoves.definitions(old, modules=moved) == astmoves.definitions(new, modules=moved)
    # only the named module is read as moved: another import still differs
    other = new.replace("from pkg.measure.trials import run", "from pkg.measure.other import run")
    assert astmoves.definitions(old, modules=moved) != astmoves.definitions(other, modules=moved)


def test_module_reads_a_parent_import_and_a_named_module_in_a_string() -> None:
    moved = {"pkg.trials": "pkg.measure.trials"}
    # module-level imports are not compared (a split rewrites them): the import sits in a function
    old = 'def f():\n    from pkg import trials as t\n    return t\nENTRY = "pkg.trials:main"\nOTHER = "pkg.trialsx"\n'
    new = ('def f():\n    from pkg.measure import trials as t\n    return t\n'
           'ENTRY = "pkg.measure.trials:main"\nOTHER = "pkg.trialsx"\n')
    assert astmoves.definitions(old, modules=moved) == astmoves.definitions(new, modules=moved)
    assert astmoves.definitions(old.replace("pkg.trials:", "pkg.trial:"), modules=moved) != \
        astmoves.definitions(new, modules=moved)
