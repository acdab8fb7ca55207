"""Checkpoints of an engine group's cells (sdbench.engine.groups): a finished cell is re-used
if it was measured under the same spec, engine, inputs, code and software, by any group that
holds it (however the site splits), on whatever hardware, which is recorded and checked."""

from __future__ import annotations

import copy
import json
import logging
import os
from pathlib import Path

import pandas as pd
import pytest

from sdbench.engine.groups import CELL_TABLES, checkpoint_key, measurement_context, reusable_cells, run_group

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
    # Software is keyed; the hardware is not (reusable_cells checks it).
    assert set(context) == {"prompts", "model", "drafter", "code", "software", "guard_mode", "breakdown"}
    assert set(context["software"]) == {
        "vllm_version", "torch_version", "transformers_version", "sdbench_version", "python_version"
    }  # fmt: skip


# ----------------------------------------------------------------------------- re-use and hardware
HERE = {"node": "n1", "cpu_model": "Intel Xeon 8480+", "cpu_count": 112, "gpus": ["NVIDIA H100 80GB HBM3"],
        "gpu_memory_mib": [81559], "driver": "550.54.15"}  # fmt: skip
# Another node of the same kind, and a node of another kind (fake provenance records).
SAME_KIND = {**HERE, "node": "n2"}
OTHER_KIND = {**HERE, "node": "g7", "gpus": ["NVIDIA A100-SXM4-80GB"], "gpu_memory_mib": [81920]}


def _entry(store: Path, key: str, hw: dict | None, names: tuple[str, ...] = CELL_TABLES, tokens_per_s: float = 1.0) -> None:
    """A checkpoint as _measure_cells writes it: the tables, then (unless ``hw`` is None) hardware.json."""
    entry = store / key
    entry.mkdir(parents=True)
    for name in names:
        pd.DataFrame({"tokens_per_s": [tokens_per_s], "hostname": [(hw or {}).get("node", "")]}).to_parquet(
            entry / f"{name}.parquet"
        )
    if hw is not None:
        (entry / "hardware.json").write_text(json.dumps(hw))


def test_one_start_reuses_a_checkpoint_from_any_hardware_and_only_complete_ones(tmp_path: Path) -> None:
    _entry(tmp_path, "a", SAME_KIND)
    _entry(tmp_path, "b", OTHER_KIND)
    _entry(tmp_path, "c", None)  # an entry without its hardware: not one this code wrote whole
    _entry(tmp_path, "d", HERE, names=CELL_TABLES[:-1])  # no summary
    found, notes = reusable_cells(tmp_path, ["a", "b", "c", "d", "e"], CELL_TABLES, HERE)
    assert found == {"a": SAME_KIND, "b": OTHER_KIND} and notes == []


def test_remeasure_other_hardware_measures_again_what_another_kind_measured(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """SDBENCH_REMEASURE_OTHER_HARDWARE=1 (what a hardware_mismatch line proposes): a checkpoint of
    another kind of node is measured again here; one of this kind on another node or driver is kept."""
    _entry(tmp_path, "a", {**SAME_KIND, "driver": "570.86.10"})
    _entry(tmp_path, "b", OTHER_KIND)
    monkeypatch.setenv("SDBENCH_REMEASURE_OTHER_HARDWARE", "1")
    found, notes = reusable_cells(tmp_path, ["a", "b"], CELL_TABLES, HERE)
    assert list(found) == ["a"] and len(notes) == 1
    assert notes[0].startswith("checkpoint b was measured on node g7: 112 x Intel Xeon 8480+, 1 x NVIDIA A100-SXM4-80GB")
    assert notes[0].endswith("and SDBENCH_REMEASURE_OTHER_HARDWARE=1: measured again here")
    monkeypatch.setenv("SDBENCH_REMEASURE_OTHER_HARDWARE", "0")
    assert list(reusable_cells(tmp_path, ["a", "b"], CELL_TABLES, HERE)[0]) == ["a", "b"]


def test_a_cells_engine_starts_share_hardware(tmp_path: Path) -> None:
    # Cell 0: both starts measured on the other kind of node. Cell 1: only start 0, on the other kind.
    # Cell 2: only start 0, on this kind (another node of it).
    for key, hw in (("c0s0", OTHER_KIND), ("c0s1", OTHER_KIND), ("c1s0", OTHER_KIND), ("c2s0", SAME_KIND)):
        _entry(tmp_path, key, hw)
    starts = [["c0s0", "c0s1"], ["c1s0", "c1s1"], ["c2s0", "c2s1"]]
    found, notes = reusable_cells(tmp_path, ["c0s0", "c1s0", "c2s0"], CELL_TABLES, HERE, starts)
    assert found == {"c0s0": OTHER_KIND, "c2s0": SAME_KIND}
    assert len(notes) == 1 and notes[0].startswith("checkpoint c1s0 was measured on node g7: 112 x Intel Xeon 8480+, "
                                                   "1 x NVIDIA A100-SXM4-80GB (81,920 MiB), driver 550.54.15")  # fmt: skip
    assert "this job runs on node n1: 112 x Intel Xeon 8480+, 1 x NVIDIA H100 80GB HBM3 (81,559 MiB)" in notes[0]
    found, _ = reusable_cells(tmp_path, ["c0s1", "c1s1", "c2s1"], CELL_TABLES, HERE, starts)
    assert found == {"c0s1": OTHER_KIND}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from support.datasets_tokenizers import save_tiny_llama

    out = tmp_path_factory.mktemp("tiny")
    save_tiny_llama(out, max_position_embeddings=256)
    return str(out)


def _group(tmp_path: Path, batch_sizes: list[int]) -> tuple[list[dict], dict[str, str]]:
    prompts = tmp_path / "prompts.parquet"
    if not prompts.exists():
        pd.DataFrame({"request_id": ["r0"], "prompt_token_ids": [[1, 2, 3]]}).to_parquet(prompts)
    specs = []
    for bs in batch_sizes:
        spec = copy.deepcopy({k: v for k, v in SPEC.items() if k != "paired_baseline"})
        spec["cell"]["batch_size"] = bs
        specs.append(spec)
    return specs, {"d": str(prompts)}


def test_a_group_split_differently_measures_nothing_measured_and_logs_other_hardware(
    tmp_path: Path, tiny_model: str, caplog, capsys
) -> None:
    """Cells measured by the unsplit group (max_num_seqs 4), on another kind of node, are found by a
    split part of it, which keeps max_num_seqs 4 (sdbench.workflow.plan): nothing to measure, no
    engine; each re-used cell keeps its own tables (and provenance), the log names both nodes, and
    the store is kept for the next split."""
    store = tmp_path / "checkpoints"
    specs, prompts = _group(tmp_path, [1, 2, 4])
    context = measurement_context(prompts, tiny_model, None, "flag", False)
    for spec in specs:
        _entry(store, checkpoint_key(spec, context, 4, None), OTHER_KIND, tokens_per_s=float(spec["cell"]["batch_size"]))
    part = specs[:2]
    assert run_group(part, prompts, tiny_model, None, str(tmp_path / "out"), "flag", max_num_seqs=2,
                     checkpoint_dir=str(store), dry_run=True) == (2, 0)  # another engine: measured again
    with caplog.at_level(logging.INFO, logger="sdbench.engine.groups"):
        counts = run_group(part, prompts, tiny_model, None, str(tmp_path / "out"), "flag", max_num_seqs=4,
                           checkpoint_dir=str(store))  # fmt: skip
    assert counts == (0, 2)
    for spec in part:
        bs = spec["cell"]["batch_size"]
        copied = tmp_path / "out" / "ngram" / "d" / f"bs{bs}" / "summary.parquet"
        assert pd.read_parquet(copied).to_dict("records") == [{"tokens_per_s": float(bs), "hostname": "g7"}]
        assert copied.samefile(store / checkpoint_key(spec, context, 4, None) / "summary.parquet")  # a link, not a copy
    lines = [r.getMessage() for r in caplog.records if "re-used from checkpoint" in r.getMessage()]
    assert len(lines) == 2 and all("measured on node g7: " in line and "; this job runs on node " in line
                                   and "(the cell keeps the hardware it was measured on)" in line for line in lines)  # fmt: skip
    assert "group: 0 of 2 cell(s) to measure, 2 re-used" in caplog.text
    assert len([p for p in store.iterdir() if not p.name.startswith(".")]) == 3  # kept
    # What `sdbench run-group --dry-run` says of the unsplit group and of a part that lost max_num_seqs.
    from sdbench.cli import main

    for cells_, extra, said in ((specs, {}, "0 cell(s) to measure, 3 re-used"),
                                (part, {"max_num_seqs": 2}, "2 cell(s) to measure, 0 re-used")):  # fmt: skip
        spec_path = tmp_path / "group.json"
        spec_path.write_text(json.dumps({"cells": cells_, "prompts": prompts, **extra}))
        argv = ["run-group", "--spec", f"@{spec_path}", "--model-dir", tiny_model, "--checkpoint-dir", str(store),
                "--output-dir", str(tmp_path / "dry"), "--quiet-guard", "flag", "--dry-run"]  # fmt: skip
        assert main(argv) == 0
        assert capsys.readouterr().out == f"{tmp_path / 'dry'}: {said}\n"
    assert not (tmp_path / "dry").exists()


def test_the_hardware_record_reads_the_jobs_gpus_from_nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """nvidia-smi is the test double (tests/support/doubles/gpu): two GPUs, the job sees the second.
    The checkpoint key's context is the same with or without them."""
    from sdbench.engine.site.hardware import describe_hardware, hardware, same_hardware

    prompts, model = _inputs(tmp_path)
    without = measurement_context(prompts, model, None, "flag", False)
    doubles = Path(__file__).parents[1] / "support" / "doubles" / "gpu"
    monkeypatch.setenv("PATH", f"{doubles}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SDBENCH_NVIDIA_SMI_GPUS", "NVIDIA H100 80GB HBM3,NVIDIA H100 80GB HBM3")
    monkeypatch.setenv("SDBENCH_NVIDIA_SMI_DRIVER", "550.54.15")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    hw = hardware()
    assert (hw["gpus"], hw["gpu_memory_mib"], hw["driver"]) == (["NVIDIA H100 80GB HBM3"], [81559], "550.54.15")
    assert hw["cpu_count"] == os.cpu_count()
    assert describe_hardware(hw).endswith(", 1 x NVIDIA H100 80GB HBM3 (81,559 MiB), driver 550.54.15")
    monkeypatch.setenv("SDBENCH_NVIDIA_SMI_MEMORY", "40960")  # another kind of node, by its memory alone
    assert not same_hardware(hardware(), hw) and same_hardware({**hw, "node": "elsewhere"}, hw)
    assert measurement_context(prompts, model, None, "flag", False) == without


def test_a_cells_key_counts_its_own_prompt_table_only(tmp_path: Path) -> None:
    """A site's ``max_runtime`` splits a group over datasets into one group per dataset, holding
    fewer prompt tables: each cell keeps its key (its checkpoint is re-used), and still changes
    with its own table. Found by the paper rehearsal: 125 cells re-measured at 1,440 minutes."""
    prompts, model = _inputs(tmp_path)
    other = tmp_path / "other.parquet"
    other.write_bytes(b"another dataset's table")
    together = measurement_context({**prompts, "e": str(other)}, model, None, "refuse", False)
    alone = measurement_context(prompts, model, None, "refuse", False)
    assert SPEC["cell"]["dataset"] == "d"
    assert checkpoint_key(SPEC, together, 8, None) == checkpoint_key(SPEC, alone, 8, None)
    Path(prompts["d"]).write_bytes(b"the cell's table, edited")
    assert checkpoint_key(SPEC, measurement_context(prompts, model, None, "refuse", False), 8, None) != \
        checkpoint_key(SPEC, alone, 8, None)  # fmt: skip
