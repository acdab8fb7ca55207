"""Breakdown mode (sdbench.engine.measure.steptiming): tables, figure, record reading, and a real vLLM run."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from support.require import import_or_fail

from sdbench.analysis import breakdown as bd
from sdbench.analysis import cli as analysis_cli
from sdbench.engine.measure import steptiming as st


def _steps(method: str, batch_size: int, n: int, verify: float, propose: float, sample: float, other: float):
    step_s = verify + propose + sample + other
    return pd.DataFrame(
        {
            "step": range(n),
            "num_reqs": batch_size,
            "num_batched_tokens": batch_size * 4,
            "num_kv_tokens": np.arange(n) * batch_size + 100,
            "num_proposed_tokens": 3 * batch_size if propose else 0,
            "step_s": step_s,
            "verify_s": verify,
            "propose_s": propose,
            "sample_s": sample,
            "other_s": other,
            "method": method,
            "batch_size": batch_size,
        }
    )


def test_breakdown_table_fractions_per_group_sum_to_one():
    steps = pd.concat(
        [
            _steps("none", 1, 5, verify=0.8, propose=0.0, sample=0.05, other=0.15),
            _steps("ngram", 1, 4, verify=0.6, propose=0.1, sample=0.1, other=0.2),
            _steps("ngram", 8, 3, verify=0.9, propose=0.05, sample=0.02, other=0.03),
        ],
        ignore_index=True,
    )
    table = bd.breakdown_table(steps)
    assert list(table.columns) == ["method", "batch_size", "num_steps", "total_s", *bd.FRACTION_COLUMNS]
    assert table[list(bd.FRACTION_COLUMNS)].sum(axis=1).to_numpy() == pytest.approx(1.0)
    ngram1 = table[(table["method"] == "ngram") & (table["batch_size"] == 1)].iloc[0]
    assert ngram1["num_steps"] == 4 and ngram1["total_s"] == pytest.approx(4.0)
    assert ngram1["propose_frac"] == pytest.approx(0.1) and ngram1["verify_frac"] == pytest.approx(0.6)
    assert table.loc[table["method"] == "none", "propose_frac"].item() == 0.0


def test_breakdown_table_weights_steps_by_time_and_derives_other():
    # A 3 s step and a 1 s step: shares of *time*, not means of per-step fractions.
    steps = pd.DataFrame(
        {"step_s": [3.0, 1.0], "verify_s": [3.0, 0.0], "propose_s": [0.0, 0.5], "sample_s": [0.0, 0.0]}
    )
    row = bd.breakdown_table(steps).iloc[0]
    assert row["verify_frac"] == pytest.approx(0.75)
    assert row["propose_frac"] == pytest.approx(0.125)
    assert row["other_frac"] == pytest.approx(0.125)
    assert row["num_steps"] == 2


def test_breakdown_table_rejects_bad_input():
    with pytest.raises(ValueError, match="lacks column"):
        bd.breakdown_table(pd.DataFrame({"step_s": [1.0]}))
    with pytest.raises(ValueError, match="no rows"):
        bd.breakdown_table(pd.DataFrame(columns=["step_s", "verify_s", "propose_s", "sample_s"]))


def test_plot_breakdown_writes_png_atomically(tmp_path):
    steps = pd.concat(
        [
            _steps(m, b, 2, 0.7, 0.1 if m != "none" else 0.0, 0.05, 0.15)
            for m in ("ngram", "none", "eagle")
            for b in (1, 8)
        ],
        ignore_index=True,
    )
    out = tmp_path / "fig" / "fig3.png"
    bd.plot_breakdown(bd.breakdown_table(steps), out, title="synthetic")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # No temp file left behind; the drawn table beside the PNG.
    assert sorted(p.name for p in out.parent.iterdir()) == ["fig3.csv", "fig3.png"]
    with pytest.raises(ValueError, match="lacks column"):
        bd.plot_breakdown(pd.DataFrame({"method": ["x"]}), tmp_path / "bad.png")
    assert not (tmp_path / "bad.png").exists()


def _write_jsonl(path: Path, records: list[dict], tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def _merged(t0: float, step_s: float, verify: float, **counts: int) -> dict:
    base = {"num_reqs": 2, "num_batched_tokens": 8, "num_kv_tokens": 40, "num_proposed_tokens": 6}
    return {
        "kind": "step", "t0": t0, "t1": t0 + step_s, "step_s": step_s,
        "verify_s": verify, "propose_s": 0.1 * step_s, "sample_s": 0.05 * step_s, **{**base, **counts},
    }  # fmt: skip


def test_read_step_dir_orders_steps_and_derives_other(tmp_path):
    # Out of order across two files; a truncated last line (killed process) is ignored.
    _write_jsonl(tmp_path / "steps-2.jsonl", [_merged(10.0, 1.0, 0.5, num_kv_tokens=50)], tail='{"kind": "st')
    _write_jsonl(tmp_path / "steps-1.jsonl", [_merged(5.0, 2.0, 1.0, num_kv_tokens=0)])
    df = st.read_step_dir(tmp_path)
    assert list(df.columns) == list(st.STEP_COLUMNS)
    assert df["step"].tolist() == [0, 1]
    assert df["num_kv_tokens"].tolist() == [0, 50]
    assert df["other_s"].to_numpy() == pytest.approx([2.0 - 1.0 - 0.2 - 0.1, 1.0 - 0.5 - 0.1 - 0.05])
    assert df["num_reqs"].dtype == np.int64 and df["step_s"].dtype == np.float64


def test_read_step_dir_joins_worker_records_by_time(tmp_path):
    # Tensor parallelism: the engine writes bare steps, the rank-0 worker writes exec records.
    _write_jsonl(
        tmp_path / "steps-100.jsonl",
        [{"kind": "step", "t0": 1.0, "t1": 2.0, "step_s": 1.0}, {"kind": "step", "t0": 3.0, "t1": 3.5, "step_s": 0.5}],
    )
    counts = {"num_reqs": 1, "num_batched_tokens": 4, "num_kv_tokens": 9, "num_proposed_tokens": 3}
    _write_jsonl(
        tmp_path / "steps-101.jsonl",
        [
            {"kind": "exec", "t0": 3.1, "t1": 3.4, "verify_s": 0.2, "propose_s": 0.05, "sample_s": 0.01, **counts},
            {"kind": "exec", "t0": 1.1, "t1": 1.9, "verify_s": 0.6, "propose_s": 0.1, "sample_s": 0.02, **counts},
        ],
    )
    df = st.read_step_dir(tmp_path)
    assert df["verify_s"].tolist() == [0.6, 0.2]
    assert df["other_s"].to_numpy() == pytest.approx([1.0 - 0.72, 0.5 - 0.26])
    assert df["num_kv_tokens"].tolist() == [9, 9]
    # A step with no worker record inside it cannot be split into stages.
    _write_jsonl(tmp_path / "steps-100.jsonl", [{"kind": "step", "t0": 5.0, "t1": 6.0, "step_s": 1.0}])
    with pytest.raises(ValueError, match="no model-runner record"):
        st.read_step_dir(tmp_path)


def test_read_step_dir_without_records(tmp_path):
    with pytest.raises(FileNotFoundError, match=st.ENV_STEP_TIMING_DIR):
        st.read_step_dir(tmp_path / "missing")
    (tmp_path / "steps-1.jsonl").write_text("")
    with pytest.raises(FileNotFoundError):
        st.read_step_dir(tmp_path)


def _scheduler_output(spec: dict[str, list[int]]) -> SimpleNamespace:
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(num_computed_tokens=0), SimpleNamespace(num_computed_tokens=16)],
        scheduled_cached_reqs=SimpleNamespace(num_computed_tokens=[100, 50]),
        num_scheduled_tokens={"a": 10, "b": 4, "c": 4, "d": 1},
        total_num_scheduled_tokens=19,
        scheduled_spec_decode_tokens=spec,
    )


def test_step_counts():
    counts = st.step_counts(_scheduler_output({"c": [5, 6, 7]}))
    assert counts == {"num_reqs": 4, "num_batched_tokens": 19, "num_kv_tokens": 166, "num_proposed_tokens": 3}
    assert st.step_counts(_scheduler_output({}))["num_proposed_tokens"] == 0


def test_timed_regions_count_outermost_only_inside_execution(tmp_path, monkeypatch):
    """Runner-side bookkeeping without vLLM: a worker process (no engine) writes exec records."""
    state = st._State()
    state.rank0, state.sync = True, lambda: None
    monkeypatch.setattr(st, "_state", state)
    monkeypatch.setenv(st.ENV_STEP_TIMING_DIR, str(tmp_path))
    calls = []
    sample = st._timed("sample_s", lambda: calls.append("sample"))
    propose = st._timed("propose_s", lambda: (calls.append("propose"), sample()))  # drafter samples inside

    sample()  # outside an execution: runs, not recorded
    st._open_exec(_scheduler_output({"c": [1, 2]}))
    sample()
    propose()
    assert state.exec["sample_s"] > 0 and state.exec["propose_s"] > 0
    sample_before = state.exec["sample_s"]
    st._close_exec()
    state.fh.close()
    assert calls == ["sample", "sample", "propose", "sample"]
    (record,) = [json.loads(line) for line in (tmp_path / f"steps-{os.getpid()}.jsonl").read_text().splitlines()]
    assert record["kind"] == "exec" and record["num_proposed_tokens"] == 2
    assert record["sample_s"] == sample_before  # the nested sample stayed in propose
    assert record["verify_s"] == 0.0 and record["t1"] >= record["t0"]


def test_engine_checks_refuse_overlapping_steps(monkeypatch):
    def check(**engine):
        monkeypatch.setattr(st, "_state", st._State())
        st._check_engine(SimpleNamespace(**engine))

    ok = SimpleNamespace(use_v2_model_runner=False)
    check(batch_queue=None, vllm_config=ok)
    with pytest.raises(RuntimeError, match="async_scheduling=False"):
        check(batch_queue=[], vllm_config=ok)
    with pytest.raises(RuntimeError, match="VLLM_USE_V2_MODEL_RUNNER=0"):
        check(batch_queue=None, vllm_config=SimpleNamespace(use_v2_model_runner=True))
    with pytest.raises(RuntimeError, match="non-overlapping"):
        st._raise_batch_queue()  # what EngineCore.step_with_batch_queue does in breakdown mode


def test_hooks_are_chosen_by_what_the_build_defines():
    runner = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
    split = st.select_hooks(lambda target: True)  # 0.11.1 and later: every hook point exists
    assert split.verify == f"{runner}._model_forward" and split.sample == (f"{runner}._sample",)
    assert split.split_execute and split.post_step
    inline = st.select_hooks(lambda target: False)  # 0.10.1.1: forward and sampling inline
    assert inline.verify is None  # inline self.model(...) call: proxied
    assert inline.sample == ("vllm.v1.sample.sampler:Sampler.forward",
                             "vllm.v1.sample.rejection_sampler:RejectionSampler.forward")
    assert not inline.split_execute and not inline.post_step
    # A fork that keeps 0.11.1's version string but samples inside execute_model.
    fork = st.select_hooks(lambda target: not target.endswith(".sample_tokens"))
    assert not fork.split_execute and fork.verify == f"{runner}._model_forward"


def test_cli_breakdown_plot(tmp_path):
    paths = []
    for method, bs in (("none", 1), ("ngram", 1)):
        path = tmp_path / f"{method}.parquet"
        _steps(method, bs, 3, 0.7, 0.0 if method == "none" else 0.1, 0.05, 0.15).drop(columns="other_s").to_parquet(
            path
        )
        paths.append(str(path))
    parser = argparse.ArgumentParser()
    analysis_cli.add_breakdown(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        [
            "breakdown",
            "plot",
            "--steps",
            *paths,
            "--output",
            str(tmp_path / "fig3.png"),
            "--table",
            str(tmp_path / "t.parquet"),
        ]
    )
    assert args.func(args) == 0
    table = pd.read_parquet(tmp_path / "t.parquet")
    assert sorted(table["method"]) == ["ngram", "none"]
    assert (tmp_path / "fig3.png").is_file()
    bad = tmp_path / "bad.parquet"
    pd.DataFrame({"step_s": [1.0]}).to_parquet(bad)
    with pytest.raises(ValueError, match=r"bad.parquet: step table lacks column\(s\) method"):
        bd.read_step_tables([bad])


# ----------------------------------------------------------------------------- real engine
CHILD = textwrap.dedent("""
    import json, sys
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    work = sys.argv[1]
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
                      bos_token_id=0, eos_token_id=1, pad_token_id=2)
    LlamaForCausalLM(cfg).save_pretrained(work + "/target")

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=work + "/target", dtype="float32", enforce_eager=True, kv_cache_memory_bytes=1 << 29,
              max_model_len=1024, max_num_seqs=4, skip_tokenizer_init=True, seed=0, async_scheduling=False,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                  "prompt_lookup_min": 3, "prompt_lookup_max": 7})
    core = llm.llm_engine.engine_core.engine_core
    inner, executed = core.step_fn, [0]

    def counting_step():  # engine steps counted independently of the plugin
        out = inner()
        executed[0] += bool(out[1])
        return out

    core.step_fn = counting_step
    prompts = [TokensPrompt(prompt_token_ids=[0] + list(range(10 + 7 * i, 30 + 7 * i)) * 3) for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, detokenize=False)
    outs = llm.generate(prompts, params, use_tqdm=False)
    print("RESULT " + json.dumps({"executed": executed[0], "prompt_tokens": 61 * 4,
                                  "out_lens": [len(o.outputs[0].token_ids) for o in outs]}), flush=True)
    """)


@pytest.mark.slow
def test_real_vllm_ngram_breakdown(tmp_path):
    """Tiny random Llama on vLLM (CPU), n-gram SD: one record per engine step, consistent stages."""
    import_or_fail("vllm")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    steps_dir = tmp_path / "steps"
    env = {**os.environ, st.ENV_STEP_TIMING_DIR: str(steps_dir), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["out_lens"] == [24] * 4

    steps = st.read_step_dir(steps_dir)
    assert len(steps) == result["executed"] > 0
    first = steps.iloc[0]  # prefill of all four prompts
    assert (first["num_batched_tokens"], first["num_kv_tokens"], first["num_reqs"]) == (result["prompt_tokens"], 0, 4)
    # Context only grows while the same requests run (finished ones leave the batch).
    same = steps["num_reqs"].eq(steps["num_reqs"].shift())
    assert (steps["num_kv_tokens"].diff()[same] >= 0).all()
    # batched = one token per request + its scheduled drafts, on every decode step
    decode = steps.iloc[1:]
    assert (decode["num_batched_tokens"] == decode["num_reqs"] + decode["num_proposed_tokens"]).all()
    assert (steps["verify_s"] > 0).all() and (steps["propose_s"] > 0).all() and (steps["sample_s"] > 0).all()
    assert (steps["other_s"] >= 0).all()
    table = bd.breakdown_table(steps)
    assert table[list(bd.FRACTION_COLUMNS)].sum(axis=1).item() == pytest.approx(1.0)
