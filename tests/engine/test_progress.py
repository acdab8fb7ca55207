"""A cell checkpointed inside (sdbench.engine.measure.progress): killed after some calls, then resumed.

The engine here is a test double (no vLLM engine can start in a fast test; the slow end-to-end
tests time real ones): ``FakeLLM`` answers ``generate`` with outputs derived from the prompt ids
and advances a fake clock by a duration that depends on the call's prompts only, so the same call
takes the same time in every run; it raises :class:`Killed` after a given number of calls, as a
job killed by its time limit stops. Everything else -- ``CellRun``, ``timed_part``, the trial
rules, the paired arms, the tables -- is the real code, through the ``Engine`` seam.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

from sdbench.engine.measure.engine import Engine
from sdbench.engine.site.hardware import hardware
from sdbench.engine.measure.paired import measure_paired
from sdbench.engine.measure.progress import Progress
from sdbench.engine.measure.trials import measure_cell

KEYS = {"engine": "vllm-cpu", "model": "tiny", "dataset": "d", "method": "ngram", "batch_size": 2}
PROMPTS = pd.DataFrame({"request_id": [f"r{i}" for i in range(3)], "prompt_token_ids": [[5, 6, 7], [8, 9], [10, 11, 12, 13]]})
# Hardware this machine is not (a fake provenance record).
ELSEWHERE = {"node": "gpu017", "cpu_model": "AMD EPYC 9454", "cpu_count": 96, "gpus": ["NVIDIA H100 80GB HBM3"],
             "gpu_memory_mib": [81559], "driver": "550.54.15"}  # fmt: skip


class Killed(BaseException):
    """The job's end, raised by FakeLLM: as a signal ends a process, nothing on the way catches it."""


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeLLM:
    """TEST DOUBLE of ``vllm.LLM``: deterministic outputs and durations; ``Killed`` at its first
    call (``generate``, or the memory report after the timed part) once ``calls_left`` generate
    calls are spent."""

    def __init__(self, clock: FakeClock, speed: float, calls_left: int | None = None) -> None:
        self.clock, self.speed, self.calls_left = clock, speed, calls_left

    def _alive(self) -> None:
        if self.calls_left == 0:
            raise Killed("time limit")

    def generate(self, prompts: list[list[int]], sampling: Any, use_tqdm: bool = False) -> list[Any]:
        self._alive()
        if self.calls_left is not None:
            self.calls_left -= 1
        self.clock.now += self.speed * (0.5 + 0.01 * sum(sum(p) for p in prompts))
        return [
            SimpleNamespace(outputs=[SimpleNamespace(token_ids=[(t * 7 + 3) % 101 for t in p] + [2], text="",
                                                     finish_reason="stop")])
            for p in prompts
        ]  # fmt: skip

    def get_metrics(self) -> list[Any]:
        return []

    def collective_rpc(self, *args: Any, **kwargs: Any) -> list[Any]:
        self._alive()
        return []  # no workers: memory columns NaN


class FakeEngine(Engine):
    """TEST DOUBLE engine: takes a prompt as its token ids."""

    def prompt(self, token_ids: Any) -> Any:
        return [int(t) for t in token_ids]


def spec(paired: bool = False, **run: Any) -> dict[str, Any]:
    out = {
        "cell": dict(KEYS),
        "seed": 0,
        "method": {"method": "ngram", "num_speculative_tokens": 3},
        "dataset": {"max_tokens": 8},
        "run": {"batch_mode": "replicate", "warmup_requests": 1, "repeats": 3, **run},
    }
    if paired:
        out["paired_baseline"] = {"key": "none", "method": {"method": "none"}}
    return out


def engines(calls_left: int | None) -> list[FakeEngine]:
    """[SD engine, no-SD engine] on one clock; the SD one is killed after ``calls_left`` calls."""
    clock = FakeClock()
    return [FakeEngine(FakeLLM(clock, 1.0, calls_left), {}, 0.0, clock=clock),
            FakeEngine(FakeLLM(clock, 1.7), {}, 0.0, clock=clock)]  # fmt: skip


def measure(cell_spec: dict[str, Any], calls_left: int | None, progress: Progress | None) -> dict[str, pd.DataFrame]:
    sd, base = engines(calls_left)
    if "paired_baseline" in cell_spec:
        return measure_paired(sd, base, cell_spec, PROMPTS, "disabled", progress)
    requests, calls, summary, _ = measure_cell(sd, cell_spec, PROMPTS, None, "disabled", progress)
    return {"requests": requests, "calls": calls, "summary": summary}


def killed_then_resumed(
    cell_spec: dict[str, Any], calls: int, path: Path, every_s: float = 0.0, **progress: Any
) -> dict[str, pd.DataFrame]:
    """The cell killed after ``calls`` generate calls of its SD engine (its warm-up's included),
    then measured again on fresh engines with the same partial checkpoint."""
    with pytest.raises(Killed):
        measure(cell_spec, calls, Progress(path, hardware(), "disabled", every_s))
    return measure(cell_spec, None, Progress(path, progress.pop("here", hardware()), progress.pop("mode", "disabled"), every_s))


ROW_TABLES = ("requests", "calls", "baseline_calls")
SAME_SUMMARY = ("num_trials", "num_calls", "num_sequences", "tokens_per_s", "tokens_per_s_ci_low",
                "tokens_per_s_ci_high", "generate_s", "outputs_stable", "warmup_s", "paired_speedup")  # fmt: skip


def assert_same_measurement(got: dict[str, pd.DataFrame], want: dict[str, pd.DataFrame]) -> None:
    for name in ROW_TABLES:
        if name in want:
            pd.testing.assert_frame_equal(got[name], want[name])
    for column in SAME_SUMMARY:
        if column in want["summary"]:
            assert got["summary"].at[0, column] == pytest.approx(want["summary"].at[0, column], nan_ok=True), column


@pytest.mark.parametrize("paired", [False, True])
# Timed calls done before the kill (3 per trial): within trial 0, trial 0's last, within trial 1.
@pytest.mark.parametrize("calls", [2, 3, 5])
def test_a_killed_cell_resumes_at_its_next_call_and_measures_what_an_uninterrupted_one_does(
    tmp_path: Path, paired: bool, calls: int
) -> None:
    cell_spec = spec(paired)
    whole = measure(cell_spec, None, None)
    assert len(whole["calls"]) == 9 and not whole["summary"].at[0, "resumed"]  # 3 trials x 3 calls
    path = tmp_path / ".progress" / "key"
    resumed = killed_then_resumed(cell_spec, 1 + calls, path)  # 1 warm-up call
    assert_same_measurement(resumed, whole)
    assert resumed["summary"].at[0, "resumed"] and resumed["summary"].at[0, "num_resumes"] == 1


def test_the_stopping_rule_decides_a_resumed_trial_as_it_would_have(tmp_path: Path) -> None:
    """Killed after trial 1's last call (its tables not yet written): the resumed cell judges that
    trial first and stops there (min_measured_s met), as the uninterrupted one did: no third trial."""
    # A trial times 3 calls of 0.5 + 0.01 x (prompt ids summed, 2 replicas) s: 0.86 + 0.84 + 1.42 = 3.12 s.
    cell_spec = spec(repeats=1, min_measured_s=5.0)
    whole = measure(cell_spec, None, None)
    assert whole["summary"].at[0, "num_trials"] == 2
    resumed = killed_then_resumed(cell_spec, 1 + 6, tmp_path / "p")
    assert_same_measurement(resumed, whole)
    assert resumed["summary"].at[0, "num_trials"] == 2


def test_calls_after_the_last_shard_are_timed_again(tmp_path: Path) -> None:
    """Shards every 2 s of timed calls (calls of 0.86, 0.84, 1.42 s): a kill after 5 calls keeps the
    first 3 (3.12 s; the next shard was due after call 6), and the resumed cell times calls 4-5
    again; without any shard it starts over, unflagged."""
    cell_spec = spec()
    whole = measure(cell_spec, None, None)
    resumed = killed_then_resumed(cell_spec, 1 + 5, tmp_path / "a", every_s=2.0)
    states = [json.loads((d / "state.json").read_text()) for d in sorted((tmp_path / "a").iterdir())]
    # (trial, call) of each shard: the killed run's one, then the resumed run's, every 3.12 s.
    assert [(s["position"], s["segment"]) for s in states] == [([0, 2], 0), ([1, 2], 1), ([2, 2], 1)]
    assert_same_measurement(resumed, whole)
    assert resumed["summary"].at[0, "num_resumes"] == 1
    fresh = killed_then_resumed(cell_spec, 1 + 2, tmp_path / "b", every_s=100.0)
    assert_same_measurement(fresh, whole)
    assert not fresh["summary"].at[0, "resumed"]


def test_progress_from_other_hardware_or_a_refused_guard_is_discarded(tmp_path: Path, caplog) -> None:
    cell_spec = spec()
    whole = measure(cell_spec, None, None)
    with caplog.at_level(logging.INFO, logger="sdbench.engine.measure.progress"):
        moved = killed_then_resumed(cell_spec, 1 + 4, tmp_path / "hw", here=ELSEWHERE)
    assert_same_measurement(moved, whole)
    assert not moved["summary"].at[0, "resumed"]
    # The killed job ran here; its rerun "lands on" an H100 node.
    line = next(r.getMessage() for r in caplog.records if "ran on" in r.getMessage())
    assert f"its calls ran on node {hardware()['node']}: " in line
    assert "this job runs on node gpu017: 96 x AMD EPYC 9454, 1 x NVIDIA H100 80GB HBM3 (81,559 MiB), driver " \
           "550.54.15: not resumed" in line  # fmt: skip

    path = tmp_path / "guard"
    with pytest.raises(Killed):
        measure(cell_spec, 1 + 4, Progress(path, hardware(), "disabled", 0.0))
    for state in path.glob("*/state.json"):  # the guard of the killed process saw a neighbour
        data = json.loads(state.read_text())
        data["guard"]["reasons"] = ["busy processes: 4242 stress (98% CPU)"]
        state.write_text(json.dumps(data))
    kept = measure(cell_spec, None, Progress(path, hardware(), "flag", 0.0))
    assert kept["summary"].at[0, "resumed"]  # flag mode: resumed, and flagged (below)
    assert "engine process 1 of 2: busy processes: 4242 stress" in kept["summary"].at[0, "contamination"]
    assert kept["summary"].at[0, "contaminated"] and kept["calls"]["contaminated"].all()
    with pytest.raises(Killed):
        measure(cell_spec, 1 + 4, Progress(tmp_path / "refuse", hardware(), "disabled", 0.0))
    for state in (tmp_path / "refuse").glob("*/state.json"):
        data = json.loads(state.read_text())
        data["guard"]["reasons"] = ["busy processes: 4242 stress (98% CPU)"]
        state.write_text(json.dumps(data))
    refused = measure(cell_spec, None, Progress(tmp_path / "refuse", hardware(), "refuse", 0.0))
    assert not refused["summary"].at[0, "resumed"] and not refused["summary"].at[0, "contaminated"]
    assert_same_measurement(refused, whole)


# ----------------------------------------------------------------------------- a real engine, killed

# One cell of the real vLLM-CPU engine on a tiny random Llama: 4 prompts x 10 trials = 40 timed calls
# of 16 greedy tokens each (ignore_eos: every call decodes all of them), a shard every 0.3 s of
# timed calls (SDBENCH_PROGRESS_EVERY_S). A call takes 0.03 s on two idle cores (the cell's 40, over
# 1 s: the kill comes well before its end), up to 0.2 s (the first ones longer) on busy ones.
REAL_PROMPTS, REAL_TRIALS, REAL_EVERY_S = 4, 10, "0.3"
REAL_SPEC = {
    "cell": {"engine": "vllm-cpu", "model": "tiny", "dataset": "d", "method": "none", "batch_size": 1},
    "seed": 0,
    "engine": {"vllm_version": "0.32.0", "device": "cpu", "env": {"OMP_NUM_THREADS": None},
               "llm_kwargs": {"enforce_eager": True, "kv_cache_memory_bytes": 64 * 2**20}},
    "model": {"dtype": "float32", "max_model_len": 128},
    "method": {"method": "none"},
    "dataset": {"max_tokens": 16},
    # Exactly REAL_TRIALS trials whatever the timings: no seconds or precision rule to meet.
    "run": {"batch_mode": "replicate", "warmup_requests": 1, "ignore_eos": True, "repeats": REAL_TRIALS,
            "max_repeats": REAL_TRIALS, "min_measured_s": 0.0},
}  # fmt: skip


def _run_group(tmp_path: Path, store: Path, out: Path, log: Path) -> Any:
    """``sdbench run-group`` of the one-cell group as the workflow starts it, its output in ``log``:
    in-process engine core (as in the containers), no GPU visible (a CPU job's: its hardware is
    the CPU's), in its own session, whose process group a time limit kills."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    (tmp_path / "tmp").mkdir(exist_ok=True)  # the job's scratch (job_scratch), which a killed job leaves
    env.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "SDBENCH_PROGRESS_EVERY_S": REAL_EVERY_S,
                "CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(tmp_path / "tmp"),
                "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"})  # fmt: skip
    argv = [sys.executable, "-m", "sdbench.cli", "run-group", "--spec", f"@{tmp_path / 'group.json'}",
            "--model-dir", str(tmp_path / "model"), "--checkpoint-dir", str(store), "--output-dir", str(out),
            "--quiet-guard", "disabled"]  # fmt: skip
    return subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip


def _run_to_end(tmp_path: Path, store: Path, out: Path, log: Path) -> str:
    """:func:`_run_group` to its end (it must succeed); returns its log."""
    assert _run_group(tmp_path, store, out, log).wait(timeout=600) == 0, log.read_text()[-4000:]
    return log.read_text()


def _cell_tables(out: Path) -> dict[str, pd.DataFrame]:
    from sdbench.requesttable import expand_outputs

    cell = out / "none" / "d" / "bs1"
    tables = {name: pd.read_parquet(cell / f"{name}.parquet") for name in ("calls", "requests", "summary")}
    tables["requests"] = expand_outputs(tables["requests"])
    return tables


@pytest.mark.slow
def test_a_real_cell_killed_after_its_first_shard_resumes_on_another_node_of_its_kind_not_on_another_cpu(
    tmp_path: Path,
) -> None:
    """``sdbench run-group`` on the real vLLM-CPU engine, SIGKILLed (its whole process group, no
    cleanup, as SLURM at the time limit) once its first progress shard is on disk. The shards'
    hardware is then rewritten as another node's with another driver, same CPU model and count (the
    job retried elsewhere on the same kind of node): the same command again re-uses the saved calls
    and times only the rest, and the cell's tables are those of an uninterrupted run. A copy of the
    shards rewritten as from another CPU model is discarded (the log says why): that run times the
    whole cell in one engine process, and is the uninterrupted run the resumed one is compared with."""
    import os
    import shutil
    import signal
    import time

    from support.datasets_tokenizers import save_tiny_llama
    from support.require import import_or_fail

    import_or_fail("vllm")
    tok = save_tiny_llama(tmp_path / "model", max_position_embeddings=256)
    texts = ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i)\n",
             "class Point:\n    x: int\n    y: int\n", "import os\nprint(os.getcwd())\n"]  # fmt: skip
    prompts = pd.DataFrame({"request_id": [f"p{i}" for i in range(REAL_PROMPTS)],
                            "prompt_token_ids": [tok(t)["input_ids"] for t in texts[:REAL_PROMPTS]]})  # fmt: skip
    prompts.to_parquet(tmp_path / "prompts.parquet")
    group = {"cells": [REAL_SPEC], "prompts": {"d": str(tmp_path / "prompts.parquet")}}
    (tmp_path / "group.json").write_text(json.dumps(group))
    calls_per_cell = REAL_PROMPTS * REAL_TRIALS
    store, other_cpu = tmp_path / "checkpoints", tmp_path / "checkpoints-other-cpu"
    started = time.monotonic()

    # 1. Killed once its first shard is whole on disk (written as a hidden temporary, then renamed).
    proc = _run_group(tmp_path, store, tmp_path / "out", tmp_path / "killed.log")
    try:
        deadline = time.monotonic() + 600
        while not list(store.glob(".progress/*/000001/state.json")):
            assert proc.poll() is None, "ended before its first shard:\n" + (tmp_path / "killed.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "no progress shard after 600 s"
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "out").exists()  # the group's directory is complete or absent
    (progress,) = store.glob(".progress/*")  # one cell, one checkpoint key
    shards = sorted(p for p in progress.iterdir() if p.name.isdigit())
    saved = pd.concat([pd.read_parquet(s / "calls-0.parquet") for s in shards], ignore_index=True)
    reused = len(saved)  # the calls saved before the kill (a shard may have followed the first)
    position = json.loads((shards[-1] / "state.json").read_text())["position"]
    assert 0 < reused < calls_per_cell and position == [(reused - 1) // REAL_PROMPTS, (reused - 1) % REAL_PROMPTS]

    # 2. The shards as another node of the same kind wrote them (same CPU model and count, no GPU,
    #    another driver); a copy as a node with another CPU model wrote them.
    shutil.copytree(store, other_cpu)
    for root, change in ((store, {"node": "cpu-node-b", "driver": "999.99"}), (other_cpu, {"cpu_model": "AMD EPYC 9454"})):
        for state_path in root.glob(".progress/*/*/state.json"):
            state = json.loads(state_path.read_text())
            state["hardware"].update(change)
            state_path.write_text(json.dumps(state, sort_keys=True))

    # 3. The same command again: resumed at the call after the last saved one.
    resumed_log = _run_to_end(tmp_path, store, tmp_path / "out", tmp_path / "resumed.log")
    said = (f"cell progress {progress.name}: resumed after {len(shards)} shard(s) at trial {reused // REAL_PROMPTS}, "
            f"call {reused % REAL_PROMPTS} (resume 1; calls so far: {reused})")  # fmt: skip
    assert said in resumed_log and "not resumed" not in resumed_log, resumed_log[-4000:]
    assert not progress.exists()  # deleted once the cell's checkpoint is written

    # 4. The copy from another CPU model: discarded, the whole cell timed in one engine process.
    fresh_log = _run_to_end(tmp_path, other_cpu, tmp_path / "fresh", tmp_path / "fresh.log")
    from sdbench.engine.site.hardware import hardware

    here = hardware(gpus=False)
    why = (f"cell progress {progress.name}: its calls ran on node {here['node']}: {here['cpu_count']} x AMD EPYC 9454, "
           f"no GPU; this job runs on node {here['node']}: {here['cpu_count']} x {here['cpu_model']}, no GPU: not "
           "resumed, the cell is timed from its start")  # fmt: skip
    assert why in fresh_log and "resumed after" not in fresh_log, fresh_log[-4000:]

    # The resumed cell's tables: the saved calls' rows as they were, then the rest, timed anew; the
    # calls, requests and greedy outputs of the uninterrupted run.
    got, want = _cell_tables(tmp_path / "out"), _cell_tables(tmp_path / "fresh")
    measured = len(got["calls"]) - reused
    assert len(got["calls"]) == len(want["calls"]) == calls_per_cell and measured > 0
    pd.testing.assert_frame_equal(got["calls"].iloc[:reused][list(saved.columns)].reset_index(drop=True), saved)
    shape = ["trial", "call_index", "request_id", "num_seqs", "num_output_tokens"]
    pd.testing.assert_frame_equal(got["calls"][shape], want["calls"][shape])
    assert (got["calls"]["num_output_tokens"] == REAL_SPEC["dataset"]["max_tokens"]).all()
    same = ["request_id", "call_index", "slot", "num_prompt_tokens", "num_output_tokens", "finish_reason"]
    pd.testing.assert_frame_equal(got["requests"][same], want["requests"][same])
    assert [list(t) for t in got["requests"]["output_token_ids"]] == [list(t) for t in want["requests"]["output_token_ids"]]
    g, w = got["summary"].iloc[0], want["summary"].iloc[0]
    assert (bool(g["resumed"]), int(g["num_resumes"]), bool(w["resumed"]), int(w["num_resumes"])) == (True, 1, False, 0)
    assert g["num_calls"] == w["num_calls"] == calls_per_cell and g["num_trials"] == w["num_trials"] == REAL_TRIALS
    assert bool(g["outputs_stable"]) and bool(w["outputs_stable"])
    print(f"\n[progress] killed after {len(shards)} shard(s): {reused} of {calls_per_cell} calls re-used on "
          f"another node of the same kind, {measured} measured anew; another CPU model: shards discarded, "
          f"{calls_per_cell} measured; {time.monotonic() - started:.0f} s")
