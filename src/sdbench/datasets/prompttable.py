"""A prompt table as a run reads it: its columns and the check that it is one.

Apart from the builders (:mod:`sdbench.datasets.prompts`) so that an engine job reads its prompts
without importing how they were built.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd


# Columns an engine run needs from a prompt table (prepare() writes more).
PROMPT_COLUMNS = ("request_id", "prompt_token_ids")


def read_prompt_table(path: str | Path) -> pd.DataFrame:
    """Read a prompt table (:func:`sdbench.datasets.prompts.prepare`'s output) for a run; errors name the file.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` for a file that is not a
    readable parquet, lacks :data:`PROMPT_COLUMNS`, has no rows or has an empty prompt.
    """
    from sdbench.io import read_parquet

    df = read_parquet(path, what="prompt table")
    missing = [c for c in PROMPT_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"{path}: prompt table lacks column(s) {', '.join(missing)} (has: {', '.join(df.columns) or 'none'}; "
            "expected the output of sdbench prepare-dataset)"
        )
    if df.empty:
        raise ValueError(f"{path}: prompt table has no rows (expected one row per prompt)")
    empty = [str(r) for r, ids in zip(df["request_id"], df["prompt_token_ids"]) if ids is None or len(ids) == 0]
    if empty:
        raise ValueError(f"{path}: empty prompt_token_ids for request(s) {', '.join(empty[:5])}")
    return df
