"""Declared columns of the tables the pipeline writes.

A table's module declares its columns as a tuple beside the code that builds it, and the builder
returns :func:`conform` of its frame: a column renamed, added or dropped in the code and not in
the declaration fails there, and ``tests/analysis/test_schema_names.py`` checks every declaration against
docs/schema.md (each declared column documented, each documented one declared or in the code).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def conform(frame: Any, columns: Sequence[str], what: str) -> Any:
    """``frame`` with exactly the declared ``columns``, in their order.

    Raises ``ValueError`` naming the table (``what``) and every column missing from the frame or
    not declared. A frame built from no rows (no columns at all) gets the declared ones, empty.
    """
    import pandas as pd

    if len(frame.columns) == 0 and len(frame) == 0:
        return pd.DataFrame(columns=list(columns))
    missing = [c for c in columns if c not in frame.columns]
    extra = [c for c in frame.columns if c not in columns]
    if missing or extra:
        raise ValueError(
            f"{what}: the table's columns differ from its declaration (missing: {', '.join(missing) or 'none'}; "
            f"not declared: {', '.join(map(str, extra)) or 'none'})"
        )
    return frame[list(columns)]
