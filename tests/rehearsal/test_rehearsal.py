"""The rehearsal engine (sdbench.rehearsal): real tables from modelled steps, no GPU, no vLLM.

The cell code is the real one (CellRun, timed_part, summaries, pairing, trace and server groups);
what a test checks is what the rehearsal engine feeds it: the accepted lengths it replays from the
published traces (values read from the file by hand), the step times it prices (hand formulas over
the cost model's coefficients, typed in from src/sdbench/data/cost_models/llama3.1-8b-h100.yaml) and
the columns it yields, compared with those the same code writes for a test double of ``vllm.LLM``
built from vLLM's own output classes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from sdbench.engine.measure.trials import measure_cell
from sdbench.rehearsal import MARKER
from sdbench.rehearsal.prepare import rehearsal_prompts, write_standin_model
from sdbench.rehearsal.workload import accepted_lengths, decode_steps, load_traces
from sdbench.requesttable import expand_outputs

REPO = Path(__file__).resolve().parents[2]

# llama3.1-8b-h100 (the paper simulator's Llama8BH100), seconds.
C_KV, C_COMPUTE, C_FIXED, OVERHEAD = 3.92645679e-08, 2.10103129e-05, 5.88590713e-03, 1.20683946e-03
EAGLE_KV, EAGLE_SPEC, EAGLE_FIXED = 2.37768493e-09, 8.41429603e-07, 2.13526175e-03
# Record 0 of combined_gsm8k.jsonl (id 134): 103 prompt tokens, 178 generated, acc_eagle.acc_len[:16].
RECORD0_PROMPT, RECORD0_OUTPUT = 103, 178
RECORD0_EAGLE = [1, 5, 4, 3, 2, 1, 3, 1, 4, 1, 2, 3, 2, 1, 2, 1]


@pytest.fixture(scope="module")
def traces(published_traces_dir: Path) -> dict[str, str]:
    return {d: str(published_traces_dir / f"combined_{d}.jsonl") for d in ("gsm8k", "instructcoder")}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A stand-in Llama-3.1-8B directory (what download_model writes in a rehearsal)."""
    out = tmp_path_factory.mktemp("hub") / "llama3.1-8b"
    write_standin_model("meta-llama/Llama-3.1-8B-Instruct", "main", out)
    return str(out)


def gsm8k(traces: dict[str, str], n: int, max_tokens: int = 8192) -> pd.DataFrame:
    entry = {"source": "huggingface", "builder": "gsm8k", "num_prompts": n, "max_tokens": max_tokens, "category": "math"}
    return rehearsal_prompts("gsm8k", entry, load_traces(traces), 128256, 128009, 42, 131072)


def spec(traces: dict[str, str] | None, method: str = "none", batch_size: int = 1, max_tokens: int = 8192,
         version: str = "0.10.1.1", **run: Any) -> dict[str, Any]:  # fmt: skip
    """A cell spec as the plan resolves it; ``traces`` None: a measured cell."""
    m: dict[str, Any] = {"method": method}
    if method != "none":
        m["num_speculative_tokens"] = 3
    out = {
        "cell": {"engine": f"vllm-{version}", "model": "llama3.1-8b", "dataset": "gsm8k", "method": method,
                 "batch_size": batch_size},
        "seed": 42,
        "engine": {"vllm_version": version, "device": "cuda", "device_memory_gib": 80},
        "model": {"hf_id": "meta-llama/Llama-3.1-8B-Instruct", "dtype": "bfloat16"},
        "method": m,
        "drafter": None,
        "dataset": {"max_tokens": max_tokens, "num_prompts": 2},
        "run": {"batch_mode": "replicate", "warmup_requests": 1, "repeats": 1, **run},
    }  # fmt: skip
    if traces is not None:
        out.update(engine_mode="rehearsal", rehearsal={"published_traces": traces})
    return out


def rehearse(cell: dict[str, Any], prompts: pd.DataFrame, model_dir: str, steps_dir: str | None = None) -> Any:
    from sdbench.engine.measure.engine import start_engine

    engine = start_engine(cell, model_dir, None, steps_dir, prompts={"gsm8k": prompts})
    return engine, measure_cell(engine, cell, prompts, steps_dir, "disabled")


# ----------------------------------------------------------------------------- accepted lengths
def test_accepted_lengths_replay_the_published_trace_cut_at_k_plus_one(traces: dict[str, str]) -> None:
    record = load_traces(traces)["gsm8k"][0]
    assert record.request_id == "134"
    assert accepted_lengths(record, "eagle", RECORD0_OUTPUT)[:16].tolist() == RECORD0_EAGLE
    # k = 3: a step emits min(acc, 4, left) at position p, then p moves on by that many:
    # p=1: 4; p=5: 1; p=6: 3; p=9: 1; p=10: 2; p=12: 2; p=14: 2.
    assert decode_steps(accepted_lengths(record, "eagle", RECORD0_OUTPUT), 4, RECORD0_OUTPUT)[:7].tolist() == \
        [4, 1, 3, 1, 2, 2, 2]  # fmt: skip
    # 8 tokens: p=1: 4; p=5: 1; p=6: 2 left.
    assert decode_steps(accepted_lengths(record, "eagle", 8), 4, 8).tolist() == [4, 1, 2]
    # EAGLE-3's stand-in: one draft more where EAGLE accepts any.
    assert accepted_lengths(record, "eagle3", 8).tolist() == [1, 6, 5, 4, 3, 1, 4, 1]


def test_rehearsal_prompt_sets_have_the_published_lengths(traces: dict[str, str]) -> None:
    table = gsm8k(traces, 3)
    assert len(table) == 3
    assert len(table.at[0, "prompt_token_ids"]) == RECORD0_PROMPT
    assert table.at[0, "rehearsal_output_tokens"] == RECORD0_OUTPUT
    assert table.at[0, "rehearsal_trace"] == "gsm8k:0"
    ids = np.concatenate(table["prompt_token_ids"].to_list())
    assert ids.min() >= 0 and ids.max() < 128256 and not (ids == 128009).any()
    assert table["prompt_token_ids"].map(list).equals(gsm8k(traces, 3)["prompt_token_ids"].map(list))  # seeded
    speed = rehearsal_prompts("sb-32k", {"source": "huggingface", "builder": "speed_bench", "num_prompts": 4,
                                         "max_tokens": 4096, "local_path": "x/speed/throughput_32k"},
                              load_traces(traces), 128256, 128009, 42, 131072)  # fmt: skip
    assert speed["prompt_token_ids"].map(len).tolist() == [32768] * 4
    assert speed["category"].tolist() == ["low_entropy", "mixed", "high_entropy", "low_entropy"]


# ----------------------------------------------------------------------------- modelled time
def test_one_call_costs_the_cost_model_formula(traces: dict[str, str], llama: str) -> None:
    """No SD, batch 2, record 0: a prefill step of 2 x 103 tokens, then 177 steps of 2 sequences."""
    prompts = gsm8k(traces, 1)
    engine, (requests, calls, summary, _) = rehearse(spec(traces, batch_size=2), prompts, llama)
    p, n, b = RECORD0_PROMPT, RECORD0_OUTPUT, 2
    prefill = C_COMPUTE * b * p + C_FIXED + OVERHEAD
    decode = sum(C_KV * b * (p + j) + C_COMPUTE * b + C_FIXED + OVERHEAD for j in range(1, n))
    assert calls["duration_s"].tolist() == pytest.approx([prefill + decode], rel=1e-9)
    assert calls["tokens_per_s"].tolist() == pytest.approx([b * n / (prefill + decode)], rel=1e-9)
    # Warm-up (one call) and the timed call, on the engine's virtual clock.
    assert summary.at[0, "modelled_s"] == pytest.approx(2 * (prefill + decode), rel=1e-9)
    assert requests["num_output_tokens"].tolist() == [n, n]
    assert requests["finish_reason"].tolist() == ["stop", "stop"]
    # A call's equal outputs are stored once (sdbench.requesttable): every copy's, expanded.
    assert [ids[-1] for ids in expand_outputs(requests)["output_token_ids"]] == [128009, 128009]


def test_an_eagle_step_pays_verification_drafting_and_overhead(traces: dict[str, str], llama: str) -> None:
    """EAGLE k=3, batch 1, 8 output tokens: steps emit 4, 1, 2 after the prefill's first token."""
    prompts = gsm8k(traces, 1, max_tokens=8)
    _, (requests, calls, summary, _) = rehearse(spec(traces, "eagle", max_tokens=8), prompts, llama)
    p = RECORD0_PROMPT
    seconds = C_COMPUTE * p + C_FIXED + OVERHEAD
    for generated in (1, 5, 6):  # tokens in the cache besides the prompt, before each step
        kv = p + generated
        seconds += C_KV * kv + C_COMPUTE * 4 + C_FIXED + EAGLE_FIXED + EAGLE_KV * kv + EAGLE_SPEC * 3 + OVERHEAD
    assert calls.at[0, "duration_s"] == pytest.approx(seconds, rel=1e-9)
    assert (calls.at[0, "num_drafts"], calls.at[0, "num_draft_tokens"], calls.at[0, "num_accepted_tokens"]) == (3, 9, 4)
    assert list(calls.at[0, "accepted_per_pos"]) == [2, 1, 1]  # accepted 3, 0, 1 drafts
    assert requests["finish_reason"].tolist() == ["length"]
    assert summary.at[0, "mean_acceptance_length"] == pytest.approx(1 + 4 / 3)


def test_the_closed_form_and_the_step_loop_price_a_request_alike(traces: dict[str, str], llama: str) -> None:
    """A replicated request alone (closed form) and the same request in the general step loop (a
    closed-loop client that sends nothing more): the same steps, chunked prefill included."""
    from sdbench.rehearsal.costs import step_cost
    from sdbench.rehearsal.steps import Plan, run

    cost = step_cost(spec(traces, "eagle"), llama)
    decode = np.array([4, 1, 3, 1, 2, 2, 2])
    alone = run([Plan(10000, decode, 3, copies=4)], cost, 8, record=True)
    looped = run([Plan(10000, decode, 3, copies=4)], cost, 8, record=True, on_finish=lambda plan, t: [])
    # 40,000 prompt tokens: 4 full chunks of 8,192 and one of 7,232, then 7 verification steps.
    assert [s["num_batched_tokens"] for s in alone.steps] == [8192] * 4 + [7232] + [16] * 7
    assert pd.DataFrame(looped.steps).to_numpy() == pytest.approx(pd.DataFrame(alone.steps).to_numpy(), rel=1e-12)
    assert looped.seconds == pytest.approx(alone.seconds, rel=1e-12)


def test_replicate_cells_have_prompts_times_batch_size_rows_and_say_they_are_not_measured(
    traces: dict[str, str], llama: str, tmp_path: Path
) -> None:
    prompts = gsm8k(traces, 3, max_tokens=64)
    cell = spec(traces, "ngram", batch_size=4, max_tokens=64, repeats=2)
    _, (requests, calls, summary, steps) = rehearse(cell, prompts, llama, str(tmp_path / "steps"))
    assert len(requests) == 3 * 4 and len(calls) == 3 * 2
    assert requests.groupby("call_index")["slot"].apply(list).tolist() == [[0, 1, 2, 3]] * 3
    expanded = expand_outputs(requests)["output_token_ids"]
    assert [len(t) for t in expanded] == requests["num_output_tokens"].tolist()
    for table in (requests, calls, summary, steps):
        assert table["measured"].tolist() == [False] * len(table)
    # Greedy copies and trials agree; the breakdown's steps are the timed calls'.
    assert bool(summary.at[0, "outputs_stable"])
    assert steps["step_s"].sum() == pytest.approx(calls["duration_s"].sum(), rel=1e-9)
    assert set(steps["num_reqs"]) == {4}


def test_forced_full_acceptance_emits_k_plus_one_per_step(traces: dict[str, str], llama: str) -> None:
    prompts = gsm8k(traces, 1, max_tokens=64)
    cell = spec(traces, "eagle3", max_tokens=64, ignore_eos=True)
    cell["method"]["forced_acceptance_length"] = 4.0
    _, (requests, calls, summary, _) = rehearse(cell, prompts, llama)
    # 63 tokens after the prefill's: 15 steps of 4 and one of 3.
    assert (calls.at[0, "num_drafts"], calls.at[0, "num_accepted_tokens"]) == (16, 47)
    assert requests["num_output_tokens"].tolist() == [64]


# ----------------------------------------------------------------------------- the real columns
class _FakeVLLM:
    """Test double of ``vllm.LLM`` from vLLM's own output and metric classes: every call emits each
    prompt's 5 tokens in one second of a fake clock, SD engines accept one of 3 drafts per step."""

    def __init__(self, sd: bool) -> None:
        self.sd, self.now, self.calls = sd, 0.0, 0

    def clock(self) -> float:
        return self.now

    def generate(self, prompts: list[Any], sampling_params: Any, use_tqdm: bool = False) -> list[Any]:
        from vllm.outputs import CompletionOutput, RequestOutput
        from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

        self.now += 1.0
        self.calls += len(prompts)
        out = []
        for i, prompt in enumerate(prompts):
            metrics = None
            if self.sd:
                metrics = RequestSpecDecodeMetrics.new(3)
                for _ in range(2):
                    metrics.observe(3, 1)
            completion = CompletionOutput(0, "abc", [1, 2, 3, 4, 5], None, None, finish_reason="length",
                                          spec_decode_metrics=metrics)  # fmt: skip
            out.append(RequestOutput(str(i), None, list(prompt["prompt_token_ids"]), None, [completion], True))
        return out

    def get_metrics(self) -> list[Any]:
        from vllm.v1.metrics.reader import Counter, Vector

        n = 2 * self.calls if self.sd else 0
        labels = {"engine": "0"}
        sd = [Counter("vllm:spec_decode_num_drafts", labels, n), Counter("vllm:spec_decode_num_draft_tokens", labels, 3 * n),
              Counter("vllm:spec_decode_num_accepted_tokens", labels, n),
              Vector("vllm:spec_decode_num_accepted_tokens_per_pos", labels, [n, 0, 0])]  # fmt: skip
        return [Counter("vllm:num_preemptions", labels, 0), *(sd if self.sd else [])]


def test_a_rehearsal_cell_has_the_columns_a_real_cell_has(traces: dict[str, str], llama: str) -> None:
    """Paired cells (SD and no-SD arm) on vLLM 0.32 (per-request counters), measured by the same code
    on the test double and on the rehearsal engine: the same tables, columns and row counts."""
    pytest.importorskip("vllm")
    from sdbench.engine.measure.engine import Engine, build_llm_kwargs, start_engine
    from sdbench.engine.measure.paired import baseline_spec, measure_paired

    prompts = gsm8k(traces, 2, max_tokens=16)

    def paired(cell: dict[str, Any], make: Any) -> dict[str, pd.DataFrame]:
        cell = {**cell, "paired_baseline": {"key": "none", "method": {"method": "none"}}}
        return measure_paired(make(cell), make(baseline_spec(cell)), cell, prompts, "disabled")

    def fake(cell: dict[str, Any]) -> Engine:
        llm = _FakeVLLM(cell["method"]["method"] != "none")
        return Engine(llm, build_llm_kwargs(cell, "/m", None), 1.0, layout="inprocess", clock=llm.clock)

    def rehearsal(cell: dict[str, Any]) -> Engine:
        return start_engine(cell, llama, None, prompts={"gsm8k": prompts})

    real = paired(spec(None, "eagle", 2, 16, "0.32.0"), fake)
    rehearsed = paired(spec(traces, "eagle", 2, 16, "0.32.0"), rehearsal)
    for name in ("requests", "calls", "baseline_calls", "summary"):
        assert rehearsed[name].columns.tolist() == real[name].columns.tolist(), name
        assert len(rehearsed[name]) == len(real[name]), name
    assert real["summary"].at[0, "measured"] and not rehearsed["summary"].at[0, "measured"]
    assert rehearsed["requests"]["sd_num_steps"].notna().all()
    # Both arms' modelled seconds: the no-SD arm runs the same calls.
    assert rehearsed["summary"].at[0, "modelled_s"] > rehearsed["calls"]["duration_s"].sum()


# ----------------------------------------------------------------------------- traces and servers
def test_a_rehearsed_trace_records_the_published_accepted_lengths(traces: dict[str, str], llama: str, tmp_path: Path) -> None:
    from sdbench.engine.tracegroup import trace_group

    prompts = gsm8k(traces, 2)
    totals: dict[str, float] = {}
    out = trace_group([spec(traces, "eagle")], {"gsm8k": prompts}, llama, None, 20, 2, str(tmp_path), totals)
    trace, requests = out["gsm8k"]
    first = trace[trace["request_id"] == "0"]
    assert first["acc_len"].tolist()[:16] == RECORD0_EAGLE
    assert len(first) == RECORD0_OUTPUT and first["proposed_len"].tolist()[:3] == [0, 20, 20]
    assert requests["output_token_ids"].map(len).tolist()[0] == RECORD0_OUTPUT
    assert not trace["measured"].any() and not requests["measured"].any()
    assert totals["generate_s"] > 0 and totals["startup_s"] > 60


def test_a_rehearsed_server_level_times_requests_from_the_modelled_steps(traces: dict[str, str], llama: str) -> None:
    """Concurrency 1: each request alone on the engine, its TTFT the prefill step, one chunk per step."""
    from sdbench.engine.measure.engine import start_rehearsal_engine
    from sdbench.rehearsal.serve import RehearsalClient

    prompts = gsm8k(traces, 1, max_tokens=8)
    engine = start_rehearsal_engine(spec(traces, "eagle"), llama, None, {"gsm8k": prompts})
    assert engine.meter.reason == "rehearsal: nothing ran to meter"  # its cells' energy_reason
    client = RehearsalClient(engine, "/dev/null")
    ids = prompts.at[0, "prompt_token_ids"]
    results, wall = client.run_level(client.base_url, [("0", ids)], 8, 1, 2)
    prefill = C_COMPUTE * RECORD0_PROMPT + C_FIXED + OVERHEAD
    assert [r.ttft_s for r in results] == pytest.approx([prefill, prefill], rel=1e-9)
    assert [r.num_chunks for r in results] == [4, 4] and [r.num_output_tokens for r in results] == [8, 8]
    assert results[1].start_s == pytest.approx(results[0].latency_s, rel=1e-9)  # sent when the first ended
    assert wall == pytest.approx(2 * results[0].latency_s, rel=1e-9)
    assert results[0].tpot_s == pytest.approx((results[0].latency_s - prefill) / 7, rel=1e-9)


# ----------------------------------------------------------------------------- models, plan, modes
def test_a_standin_model_is_read_by_the_accounting_and_refused_by_a_measured_engine(llama: str, tmp_path: Path) -> None:
    from sdbench.engine.site.preflight import preflight
    from sdbench.models.spec import load_model_spec

    assert json.loads((Path(llama) / MARKER).read_text())["repo"] == "meta-llama/Llama-3.1-8B-Instruct"
    loaded = load_model_spec(llama)
    assert (loaded.vocab_size, loaded.num_hidden_layers) == (128256, 32)
    table = tmp_path / "p.parquet"
    pd.DataFrame({"request_id": ["0"], "prompt_token_ids": [[1, 2]]}).to_parquet(table)
    with pytest.raises(ValueError, match="rehearsal stand-in .* not a model"):
        preflight(spec(None), str(table), llama, None)


def test_the_plan_puts_the_mode_into_every_engine_spec_and_leaves_measured_specs_alone() -> None:
    import yaml

    from sdbench.config import validate_config
    from sdbench.workflow.plan import Plan

    raw = yaml.safe_load((REPO / ".test" / "config" / "rehearsal.yaml").read_text())
    rehearsal, measured = (Plan(validate_config({**raw, "engine_mode": m}, source="t")) for m in ("rehearsal", "measured"))
    specs = [c for g in rehearsal.groups for c in rehearsal.group_spec(g)["cells"]]
    specs += [c for g in rehearsal.breakdown_groups for c in rehearsal.breakdown_group_spec(g)["cells"]]
    specs += [c for g in rehearsal.trace_groups for c in rehearsal.trace_group_spec(g)["cells"]]
    specs += [rehearsal.server_group_spec(g) for g in rehearsal.server_groups]
    assert specs and all(s["engine_mode"] == "rehearsal" for s in specs)
    assert {s["rehearsal"]["published_traces"]["gsm8k"] for s in specs} == \
        {"resources/published-traces/llama3.1-8B/combined_gsm8k.jsonl"}  # fmt: skip
    group = sorted(measured.groups)[0]
    assert all("engine_mode" not in c for c in measured.group_spec(group)["cells"])
    assert measured.group_spec(group)["cells"] == [
        {k: v for k, v in c.items() if k not in ("engine_mode", "rehearsal")} for c in rehearsal.group_spec(group)["cells"]
    ]
    assert rehearsal.hub_datasets == [] and measured.hub_datasets
    assert "rehearsal_gsm8k" in rehearsal.engine_job_inputs(rehearsal.groups[group], group.method, group.model)


def test_the_rehearsal_imports_neither_vllm_nor_torch(traces: dict[str, str], llama: str, tmp_path: Path) -> None:
    """An offline cell, a trace group and a server level, in a fresh interpreter."""
    code = (
        "import sys, json\n"
        "sys.path.insert(0, 'tests/rehearsal')\n"
        "import test_rehearsal as t\n"
        "from sdbench.engine.tracegroup import trace_group\n"
        "from sdbench.engine.measure.engine import start_rehearsal_engine\n"
        "from sdbench.rehearsal.serve import RehearsalClient\n"
        f"traces, llama = json.loads({json.dumps(json.dumps(traces))}), {llama!r}\n"
        "prompts = t.gsm8k(traces, 1, 32)\n"
        "t.rehearse(t.spec(traces, 'eagle', 2, 32), prompts, llama)\n"
        f"trace_group([t.spec(traces, 'eagle')], {{'gsm8k': prompts}}, llama, None, 20, 2, {str(tmp_path)!r})\n"
        "client = RehearsalClient(start_rehearsal_engine(t.spec(traces, 'eagle'), llama, None, {'gsm8k': prompts}), '')\n"
        "client.run_level('', [('0', prompts.at[0, 'prompt_token_ids'])], 8, 1, 2)\n"
        "print(sorted(m for m in ('vllm', 'torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_every_standin_is_in_the_docs() -> None:
    from sdbench.rehearsal import standins

    doc = (REPO / "docs" / "methods" / "rehearsal.md").read_text()
    names = [*standins.METHOD_ACCEPTANCE, *standins.LENGTHS_BY_BUILDER, *standins.TRACE_BY_CATEGORY,
             *standins.SPEED_BENCH_INPUT, *(str(f.eos_token_id) for f in standins.MODEL_FACTS.values())]  # fmt: skip
    missing = [n for n in names if f"`{n}`" not in doc and n not in doc]
    assert not missing


def test_the_rehearsal_commands_write_a_standin_model_and_prompt_sets(traces: dict[str, str], tmp_path: Path) -> None:
    """What download_model and prepare_dataset run in a rehearsal: a hub dataset, and a built-in one
    whose tokenizer is a stand-in, both become rehearsal prompt sets of the entry's size."""
    sdbench = [sys.executable, "-m", "sdbench.cli"]
    model = tmp_path / "qwen"
    subprocess.run([*sdbench, "rehearsal", "standin-model", "--repo", "Qwen/Qwen3-8B", "--output", str(model)],
                   check=True, capture_output=True)  # fmt: skip
    config = json.loads((model / "config.json").read_text())
    assert (config["model_type"], config["vocab_size"], config["eos_token_id"]) == ("qwen3", 151936, 151645)
    arg = ["--rehearsal-traces", *(f"{d}={p}" for d, p in traces.items())]
    for name, entry in (("cnn", {"source": "huggingface", "builder": "cnn_dailymail", "num_prompts": 5, "max_tokens": 64}),
                        ("edit", {"source": "builtin", "builder": "code_edit", "num_prompts": 4, "max_tokens": 64})):  # fmt: skip
        out = tmp_path / f"{name}.parquet"
        subprocess.run([*sdbench, "rehearsal", "prepare-dataset", "--name", name, "--entry", json.dumps(entry),
                        "--tokenizer", str(model), "--output", str(out), *arg], check=True, capture_output=True)  # fmt: skip
        table = pd.read_parquet(out)
        assert len(table) == entry["num_prompts"] and table["rehearsal_trace"].str.startswith("gsm8k:").all()
        assert table["prompt_token_ids"].map(lambda ids: max(ids) < 151936).all()


# ----------------------------------------------------------------------------- the whole workflow
@pytest.mark.slow
def test_a_paper_style_config_rehearses_to_the_end(published_traces_dir: Path, tmp_path: Path) -> None:
    """.test/config/rehearsal.yaml (hub models and datasets, every engine job kind, no GPU, no
    download, no training) with --config engine_mode=rehearsal: every job ends, every engine table
    says it was not measured, every engine job has its modelled time, a second run does nothing."""
    import os

    import yaml

    from sdbench.rehearsal.report import estimates_table
    from sdbench.workflow.plan import Plan

    raw = yaml.safe_load((REPO / ".test" / "config" / "rehearsal.yaml").read_text())
    raw["published_traces"]["local_dir"] = str(published_traces_dir)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    bin_dir = Path(sys.executable).parent
    cmd = [str(bin_dir / "snakemake"), "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path),
           "--configfile", str(tmp_path / "config.yaml"), "--config", "engine_mode=rehearsal", "--cores", "2"]  # fmt: skip
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3600)
    assert run.returncode == 0, run.stderr[-3000:]
    config = {**raw, "engine_mode": "rehearsal"}
    from sdbench.config import validate_config

    plan = Plan(validate_config(config, source="test"))
    assert all((tmp_path / f).is_file() for f in plan.final_outputs())
    tables = [*tmp_path.glob("results/runs/**/*.parquet"), *tmp_path.glob("results/server/**/*.parquet"),
              *tmp_path.glob("results/traces/*/*/*/*/engine_*.parquet"), *tmp_path.glob("results/breakdown/**/steps.parquet")]  # fmt: skip
    assert len(tables) > 100
    for path in tables:
        frame = pd.read_parquet(path)
        assert "measured" in frame and not frame["measured"].any(), path
    estimates = estimates_table(validate_config(config, source="test"), tmp_path)
    assert estimates["modelled_min"].notna().all() and (estimates["modelled_min"] > 0).all()
    again = subprocess.run([*cmd, "-n"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert "Nothing to be done" in again.stdout + again.stderr


def test_a_trace_group_keeps_each_dataset_and_a_rerun_traces_only_the_rest(
    traces: dict[str, str], llama: str, tmp_path: Path
) -> None:
    """``sdbench trace-group --checkpoint-dir``: a job killed after its first dataset (here: the
    second dataset's checkpoint removed) re-traces only the second, and its tables are the same."""
    from sdbench.rehearsal.prepare import rehearsal_prompts

    paths, cells = {}, []
    for dataset, builder in (("gsm8k", "gsm8k"), ("instructcoder", "instructcoder")):
        entry = {"source": "huggingface", "builder": builder, "num_prompts": 2, "max_tokens": 256, "category": "x"}
        table = rehearsal_prompts(dataset, entry, load_traces(traces), 128256, 128009, 42, 131072)
        paths[dataset] = str(tmp_path / f"{dataset}.parquet")
        table.to_parquet(paths[dataset])
        cell = spec(traces, "eagle", max_tokens=256)
        cell["cell"]["dataset"] = dataset
        cells.append(cell)
    (tmp_path / "group.json").write_text(json.dumps({"cells": cells, "prompts": paths}))
    store = tmp_path / "store"

    def trace(out: str) -> str:
        done = subprocess.run([str(Path(sys.executable).parent / "sdbench"), "trace-group", "--spec",
                               f"@{tmp_path / 'group.json'}", "--model-dir", llama, "--num-speculative-tokens", "4",
                               "--max-num-seqs", "2", "--checkpoint-dir", str(store), "--output-dir",
                               str(tmp_path / out)], capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return next(line for line in done.stderr.splitlines() if line.startswith("trace group: "))

    assert trace("first") == "trace group: 2 of 2 dataset(s) to trace, 0 re-used"
    kept = sorted(store.iterdir())
    assert len(kept) == 2
    import shutil

    shutil.rmtree(kept[0])  # the job died before this dataset was kept
    assert trace("second") == f"trace group: 1 of 2 dataset(s) to trace, 1 re-used from {store}"
    for dataset in ("gsm8k", "instructcoder"):
        for name in ("engine_trace", "engine_requests"):
            pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "first" / dataset / f"{name}.parquet"),
                                          pd.read_parquet(tmp_path / "second" / dataset / f"{name}.parquet"))  # fmt: skip
    assert trace("third") == f"trace group: 0 of 2 dataset(s) to trace, 2 re-used from {store}"


def test_a_standin_output_distribution_has_the_datasets_expected_mean(traces: dict[str, str]) -> None:
    """The one expected output of a dataset (expected_output_tokens, else max_tokens) is the mean of
    the rehearsal's stand-in outputs: median x exp(sigma^2 / 2), the stand-in's spread kept."""
    import math

    from sdbench.rehearsal import standins
    from sdbench.rehearsal.prepare import expected_outputs, rehearsal_prompts

    moved = expected_outputs(standins.LogNormal(424, 1.05), {"max_tokens": 8192, "expected_output_tokens": 737})
    assert moved.sigma == 1.05 and moved.median == pytest.approx(737 / math.exp(1.05**2 / 2))
    budget = expected_outputs(standins.LogNormal(500, 0.8), {"max_tokens": 4096})
    assert budget.median == pytest.approx(4096 / math.exp(0.32))
    entry = {"source": "huggingface", "builder": "sharegpt", "num_prompts": 4000, "max_tokens": 8192,
             "expected_output_tokens": 737, "category": "chat"}  # fmt: skip
    table = rehearsal_prompts("sharegpt", entry, load_traces(traces), 128256, 128009, 42, 131072)
    assert table["rehearsal_output_tokens"].mean() == pytest.approx(737, rel=0.08)
