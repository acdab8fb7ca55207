"""KV cache capacity: check-config refuses or trims cells whose batch cannot fit (no engine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sdbench.analysis.memory import kv_capacity, kv_capacity_shortfalls, memory_report
from sdbench.config import load_config
from sdbench.grid import cells

ROOT = Path(__file__).resolve().parents[2]
SDBENCH = str(Path(sys.executable).parent / "sdbench")


def test_an_h100_holds_about_0_4m_tokens_of_llama_3_1_8b_and_less_with_a_drafter() -> None:
    plain = kv_capacity(memory_report("meta-llama/Llama-3.1-8B-Instruct", dtype="bfloat16"), device_memory_gib=80)
    eagle3 = kv_capacity(
        memory_report("meta-llama/Llama-3.1-8B-Instruct", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "eagle3",
                      dtype="bfloat16"), device_memory_gib=80)  # fmt: skip
    assert plain is not None and eagle3 is not None
    assert 400_000 < plain.capacity_tokens < 500_000  # (72 - 2 - 15) GiB / 128 KiB
    assert eagle3.capacity_tokens < plain.capacity_tokens  # the drafter's KV and weights take room
    explicit = kv_capacity({"per_token_kib": 1.0, "static_gib": 99.0}, kv_cache_memory_bytes=2**20)
    assert explicit is not None and explicit.capacity_tokens == 1024
    assert kv_capacity({"per_token_kib": 1.0, "static_gib": 1.0}) is None  # memory unknown: not judged


def _paper(tmp_path: Path, **top: object) -> Path:
    raw = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    raw.update(top)
    path = tmp_path / "paper.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


# The cells config/paper.yaml's expected residency trims (kv_residency: expected): SPEED-Bench's 32K
# prompts at batch 16 and 64 and 8K at batch 64 do not fit even their prompts (16 x 32,768 = 524,288
# and 64 x 8,192 = 524,288 tokens against about 431K-451K); the draft-model cells at batch 128 on
# ShareGPT need 128 x (1,024 + 737 + 3) = 225,792 against 219,682.
PAPER_TRIMMED = {
    *(("vllm-0.11.1", "llama3.1-8b", f"speed-bench-throughput-{tier}", m, bs)
      for tier, sizes in (("32k", (16, 64)), ("8k", (64,))) for bs in sizes for m in ("none", "ngram-k3", "eagle3-k3")),
    ("vllm-0.26.0-dm", "qwen3-8b", "sharegpt", "dm-k3", 128),
    ("vllm-0.26.0-dm", "qwen3-8b-thinking", "sharegpt", "dm-k3", 128),
}  # fmt: skip


def test_the_paper_grid_trims_what_its_expected_residency_cannot_hold(tmp_path: Path) -> None:
    config = load_config(ROOT / "config/paper.yaml")
    assert config["kv_capacity"] == "trim" and config["kv_residency"] == "expected"
    short = kv_capacity_shortfalls(config)
    assert set(short) == PAPER_TRIMMED
    line = short[("vllm-0.11.1", "llama3.1-8b", "speed-bench-throughput-32k", "none", 64)]
    assert "needs 2,359,296 KV tokens (batch 64 x (32768 prompt + 4096 expected output + 0)), capacity 450,907" in line
    dm = short[("vllm-0.26.0-dm", "qwen3-8b", "sharegpt", "dm-k3", 128)]
    assert "needs 225,792 KV tokens (batch 128 x (1024 prompt + 737 expected output + 3)), capacity 219,682" in dm
    # Counting every sequence at its whole budget refuses what the paper measured at batch 64-128.
    budget = kv_capacity_shortfalls(load_config(_paper(tmp_path, kv_residency="max_tokens")))
    assert len(budget) == 254 and set(short) <= set(budget)
    line = budget[("vllm-0.11.1", "llama3.1-8b", "speed-bench-throughput-32k", "none", 64)]
    assert "needs 2,359,296 KV tokens (batch 64 x (32768 prompt + 4096 max_tokens + 0))" in line
    assert ("vllm-0.11.1", "llama3.1-8b", "speed-bench-throughput-1k", "none", 64) not in budget
    proc = subprocess.run([SDBENCH, "check-config", str(_paper(tmp_path, kv_capacity="refuse"))],
                          capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == len(short) + 1 and lines[-1].startswith("error: ")
    assert any("llama3.1-8b/speed-bench-throughput-32k/eagle3-k3/bs16: needs 589,872" in x for x in lines)


def test_expected_residency_reads_the_datasets_expected_lengths() -> None:
    from sdbench.analysis.memory import residency_tokens

    config = load_config(ROOT / "config/paper.yaml")
    assert residency_tokens(config, "sharegpt") == (1024, 737, "expected output")
    assert residency_tokens(config, "sharegpt-random") == (1024, 737, "expected output")  # its matched_to's prompt
    assert residency_tokens(config, "speed-bench-throughput-32k") == (32768, 4096, "expected output")  # none stated
    assert residency_tokens({**config, "run": {**config["run"], "ignore_eos": True}}, "gsm8k")[1] == 8192
    assert residency_tokens({**config, "kv_residency": "max_tokens"}, "gsm8k") == (None, 8192, "max_tokens")


def test_trim_drops_exactly_the_cells_that_cannot_fit(tmp_path: Path) -> None:
    full = load_config(_paper(tmp_path, kv_capacity="off"))
    trimmed = load_config(_paper(tmp_path, kv_capacity="trim"))
    short = set(kv_capacity_shortfalls(full))
    kept = {(c.engine, c.model, c.dataset, c.method, c.batch_size) for c in cells(trimmed)}
    every = {(c.engine, c.model, c.dataset, c.method, c.batch_size) for c in cells(full)}
    assert short and kept == every - short
    proc = subprocess.run([SDBENCH, "check-config", str(_paper(tmp_path, kv_capacity="trim"))],
                          capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0 and f"valid; {len(kept)} cells" in proc.stdout
    assert proc.stdout.count("kv_capacity trim: ") == len(short)
    off = subprocess.run([SDBENCH, "check-config", str(_paper(tmp_path, kv_capacity="off"))],
                         capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert off.returncode == 0 and f"valid; {len(every)} cells" in off.stdout


def test_fig1_rings_preempted_cells(tmp_path: Path) -> None:
    from sdbench.analysis.endtoend import plot_throughput
    from sdbench.drawn import drawn_path

    rows = [
        {"engine": "e", "model": "m", "dataset": "d", "method": method, "batch_size": bs, "tokens_per_s": t,
         "speedup": s, "preempted": p, "contaminated": False}
        for method, bs, t, s, p in [("none", 1, 10.0, 1.0, False), ("none", 64, 50.0, 1.0, True),
                                    ("ngram", 1, 15.0, 1.5, False), ("ngram", 64, 45.0, 0.9, True)]
    ]  # fmt: skip
    out = tmp_path / "fig1.png"
    plot_throughput(pd.DataFrame(rows), out)
    assert out.stat().st_size > 0
    # The figure read back (its drawn table, beside the PNG): an orange square frame (matplotlib's
    # darkorange, #ff8c00) on each preempted cell at batch 64, in both panels, at the cell's own
    # value; none at batch 1, and no busy-machine ring.
    drawn = pd.read_csv(drawn_path(out))
    marks = drawn[drawn["mark"] == "preempted"]
    got = sorted(zip(marks["ylabel"], marks["series"], marks["x"], marks["y"], marks["color"], marks["note"]))
    note = "requests preempted (KV cache full)"
    assert got == [("output tokens / s", "ngram", 64.0, 45.0, "#ff8c00", note),
                   ("output tokens / s", "none", 64.0, 50.0, "#ff8c00", note),
                   ("speedup over no SD", "ngram", 64.0, 0.9, "#ff8c00", note),
                   ("speedup over no SD", "none", 64.0, 1.0, "#ff8c00", note)]  # fmt: skip
    assert "ring" not in set(drawn["mark"])


@pytest.mark.parametrize("mode", ["refuse", "trim", "off"])
def test_kv_capacity_modes_validate(mode: str, tmp_path: Path) -> None:
    assert load_config(_paper(tmp_path, kv_capacity=mode))["kv_capacity"] == mode


def test_the_workflow_refuses_in_one_line_when_it_builds_the_dag(tmp_path: Path) -> None:
    """Under kv_capacity: refuse the Snakefile stops before any job, naming the first cell."""
    from sdbench.analysis.memory import refuse_kv_shortfalls
    from sdbench.errors import ConfigError

    refused = load_config(_paper(tmp_path, kv_capacity="refuse"))
    with pytest.raises(ConfigError) as err:
        refuse_kv_shortfalls(refused)
    assert str(err.value).startswith("config: kv_capacity refuse: 11 cell(s) cannot fit the KV cache, first ")
    assert "\n" not in str(err.value)
    refuse_kv_shortfalls(load_config(ROOT / "config/paper.yaml"))  # shipped: trim
    refuse_kv_shortfalls(load_config(ROOT / "config/gpu-smoke.yaml"))  # every cell fits
