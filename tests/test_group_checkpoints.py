"""Checkpoint keys of an engine group's cells (sdbench.engine.groups): a finished cell is re-used
only if it was measured under the same spec, engine, inputs, code, software and hardware."""

from __future__ import annotations

import copy
import os
from pathlib import Path

from sdbench.engine.groups import checkpoint_key, measurement_context

SPEC = {
    "cell": {"engine": "e", "model": "m", "dataset": "d", "method": "ngram", "batch_size": 4},
    "method": {"method": "ngram", "num_speculative_tokens": 3},
    "run": {"warmup_requests": 1},
    "paired_baseline": {"key": "none", "method": {"method": "none"}},
}


def _inputs(tmp_path: Path) -> tuple[dict[str, str], str]:
    prompts = tmp_path / "prompts.parquet"
    prompts.write_bytes(b"prompt table")
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    return {"d": str(prompts)}, str(model)


def test_the_key_is_stable_and_changes_with_what_the_measurement_depends_on(tmp_path: Path) -> None:
    prompts, model = _inputs(tmp_path)
    context = measurement_context(prompts, model, None, "refuse", False)
    key = checkpoint_key(SPEC, context, 8, None)
    assert key == checkpoint_key(copy.deepcopy(SPEC), measurement_context(prompts, model, None, "refuse", False), 8, None)
    unpaired = {k: v for k, v in SPEC.items() if k != "paired_baseline"}
    other_k = copy.deepcopy(SPEC)
    other_k["method"]["num_speculative_tokens"] = 5
    changed = {
        "unpaired": checkpoint_key(unpaired, context, 8, None),
        "spec": checkpoint_key(other_k, context, 8, None),
        "max_num_seqs": checkpoint_key(SPEC, context, 16, None),
        "engine start": checkpoint_key(SPEC, context, 8, 1),
        "guard mode": checkpoint_key(SPEC, measurement_context(prompts, model, None, "flag", False), 8, None),
    }
    Path(prompts["d"]).write_bytes(b"another prompt table")
    changed["prompts"] = checkpoint_key(SPEC, measurement_context(prompts, model, None, "refuse", False), 8, None)
    weights = Path(model) / "model.safetensors"
    os.utime(weights, ns=(1, 1))  # a rebuilt model: same size, another time
    changed["model"] = checkpoint_key(SPEC, measurement_context(prompts, model, None, "refuse", False), 8, None)
    assert len({key, *changed.values()}) == len(changed) + 1, changed
    assert context["provenance"] and "hostname" not in context["provenance"]
