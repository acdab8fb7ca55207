"""Checks of a cell's inputs (prompt table, target and drafter weights) before an engine starts.

Apart because they read only files: a bad checkpoint fails in seconds, not after an engine start.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from sdbench.models.check import check_model_dir
from sdbench.models.medusaformat import check_medusa_dir

DRAFTER_ROLES = {"eagle": "eagle", "eagle3": "eagle3", "draft_model": "draft", "mtp": "mtp"}


def preflight(spec: dict[str, Any], prompts_path: str, model_dir: str, drafter_dir: str | None) -> pd.DataFrame:
    """Check the prompt table and model directories before an engine starts; returns the prompts.

    vLLM leaves a tensor a checkpoint lacks uninitialized without an error, so the
    weights are checked here (sdbench.models.check), not discovered as garbage output.
    """
    from sdbench.datasets.prompttable import read_prompt_table

    prompts = read_prompt_table(prompts_path)
    from sdbench.rehearsal import is_rehearsal, is_standin

    rehearsal = is_rehearsal(spec)
    for path in (model_dir, drafter_dir):
        if path and is_standin(path) and not rehearsal:
            raise ValueError(f"{path}: a rehearsal stand-in (no weights), not a model: a measured run needs the "
                             "real one (delete the directory to download it, or run with engine_mode=rehearsal)")
    if rehearsal:  # the rehearsal engine loads no weights: a stand-in directory is what it reads
        return prompts
    check_model_dir(model_dir, "target")
    role = DRAFTER_ROLES.get(spec["method"]["method"])
    if drafter_dir and role:
        check_model_dir(drafter_dir, role)
    if drafter_dir and spec["method"]["method"] == "medusa":
        check_medusa_dir(drafter_dir, int(spec["method"]["num_speculative_tokens"]))
    return prompts
