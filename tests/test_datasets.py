"""Offline prompt builders of the embedded default."""

from __future__ import annotations

import ast
import itertools

from sdbench.datasets import BUILDERS


def test_code_write_prompt_is_the_function_head_up_to_the_body_indentation() -> None:
    records = list(itertools.islice(BUILDERS["code_write"]({}, 42), 20))
    assert len(records) == 20
    for rec in records:
        head, indent = rec.prompt_text.rsplit("\n", 1)
        assert indent and not indent.strip()  # ends with the body's indentation
        fn = ast.parse(head + "\n" + indent + rec.reference).body[0]  # prompt + reference = the function
        assert isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and ast.get_docstring(fn)
        assert len(fn.body) >= 2


def test_code_edit_prompt_ends_with_the_edit_request() -> None:
    rec = next(iter(BUILDERS["code_edit"]({}, 42)))
    assert "# Edit request:" in rec.prompt_text and rec.reference
