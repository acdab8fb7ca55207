"""Corpus split and synthetic code-edit examples."""

from __future__ import annotations

import ast
import io
import random
import tokenize

import pytest

from sdbench.datasets import corpus

FUNCTION = '''\
def scale(values, factor=2):
    """Multiply every value."""
    total = 0
    out = []
    for value in values:
        total += value * factor
        out.append(value * factor)
    return out, total + 10
'''


@pytest.fixture(scope="module")
def splits() -> dict[str, list]:
    return {split: corpus.corpus_files(split) for split in corpus.SPLITS}


def test_split_is_deterministic_sorted_and_disjoint(splits):
    train, heldout = splits["train"], splits["heldout"]
    assert train == corpus.corpus_files("train")
    assert train == sorted(train) and heldout == sorted(heldout)
    assert not set(train) & set(heldout)
    # About one file in ten is held out.
    assert 0.05 < len(heldout) / (len(train) + len(heldout)) < 0.15


def test_split_excludes_tests_and_generated_files(splits):
    root = corpus.stdlib_root()
    for path in splits["train"] + splits["heldout"]:
        rel = path.relative_to(root)
        assert not {"test", "tests", "idle_test", "site-packages", "pydoc_data"} & set(rel.parts[:-1]), rel
        assert not rel.name.startswith("_sysconfigdata"), rel
    assert not any(
        p.relative_to(root).as_posix() == "encodings/cp1252.py" for p in splits["train"] + splits["heldout"]
    )


def test_split_of_depends_only_on_the_path():
    # Pinned: a path's split is a fixed function of the path alone (sha-based), never of the run.
    assert [corpus.split_of(p) for p in ("os.py", "pkg/m3.py", "pkg/m10.py")] == ["train", "heldout", "heldout"]
    share = sum(corpus.split_of(f"pkg/m{i}.py") == "heldout" for i in range(2000)) / 2000
    assert 0.07 < share < 0.13


def test_bad_split_name_is_rejected():
    with pytest.raises(ValueError, match="split"):
        corpus.corpus_files("test")  # type: ignore[arg-type]


def test_extract_functions_dedents_methods():
    source = "class A:\n    def m(self, x):\n        return x\n\ndef f():\n    pass\n"
    assert corpus.extract_functions(source) == ["def m(self, x):\n    return x\n", "def f():\n    pass\n"]
    assert corpus.extract_functions("def broken(:\n") == []


def test_edit_example_is_deterministic_and_well_formed():
    pinned = corpus.make_edit_example(FUNCTION, random.Random(7))
    assert (pinned.kind, pinned.request) == ("rename_variable", "rename the variable `value` to `value_var`.")
    kinds = set()
    for seed in range(40):
        ex = corpus.make_edit_example(FUNCTION, random.Random(seed))
        kinds.add(ex.kind)
        assert ex.prompt.startswith(FUNCTION) and ex.prompt.endswith(corpus.EDITED_CODE_CUE)
        assert corpus.EDIT_REQUEST_PREFIX + ex.request in ex.prompt
        assert ex.completion != FUNCTION and ex.completion.endswith("\n")
        ast.parse(ex.completion)
    assert kinds == {k for k, _ in corpus.EDIT_KINDS}


def _names(source: str) -> list[str]:
    return [
        t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.NAME
    ]


def test_rename_variable_renames_every_use_and_nothing_else():
    for seed in range(40):
        ex = corpus.make_edit_example(FUNCTION, random.Random(seed))
        if ex.kind == "rename_variable":
            old, new = ex.request.split("`")[1], ex.request.split("`")[3]
            before, after = _names(FUNCTION), _names(ex.completion)
            assert old not in after and after.count(new) == before.count(old)
            assert [new if n == old else n for n in before] == after
            return
    pytest.fail("no rename_variable edit drawn in 40 seeds")


def test_edit_example_rejects_non_functions():
    with pytest.raises(ValueError, match="def"):
        corpus.make_edit_example("x = 1\n", random.Random(0))


def test_edit_examples_are_deterministic_on_a_small_root():
    root = corpus.stdlib_root() / "wsgiref"
    first = corpus.edit_examples("train", seed=3, root=root)
    assert first and first == corpus.edit_examples("train", seed=3, root=root)
    assert first != corpus.edit_examples("train", seed=4, root=root)
