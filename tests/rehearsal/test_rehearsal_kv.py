"""The rehearsal's KV cache (sdbench.rehearsal.steps.KVCache): admission by blocks and preemption
as vLLM's V1 scheduler does them, hand-traced on small cases; an unbounded cache runs exactly as
the rehearsal did before it modelled one; preemptions reach ``vllm:num_preemptions`` and a cell's
``num_preemptions`` column.

Costs here are one second per step (``c_fixed`` 1, nothing else), so a call's seconds count its
steps. Run as a script, it prints the before / after table of the paper grid's over-full cells
(docs/methods/rehearsal.md).
"""

from __future__ import annotations

import math
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import pytest

from sdbench.rehearsal import standins, steps
from sdbench.rehearsal.costs import StepCost
from sdbench.rehearsal.steps import UNBOUNDED, KVCache, Plan, run
from sdbench.simulator.costmodel import DrafterCost, TargetCost

REPO = Path(__file__).resolve().parents[2]
BUDGET = standins.MAX_NUM_BATCHED_TOKENS  # 8,192 tokens a step


def unit_cost() -> StepCost:
    """One second a step, whatever it holds."""
    nothing = DrafterCost("linear", c_kv=0.0, c_spec=0.0, c_fixed=0.0)
    return StepCost(TargetCost(0.0, 0.0, 1.0), 0.0, None, 0.0, nothing, 0.0, 0)


def eagle_cost() -> StepCost:
    """llama3.1-8b-h100's coefficients with its EAGLE head (as tests/rehearsal/test_rehearsal.py types them in)."""
    head = DrafterCost("linear", c_kv=2.37768493e-09, c_spec=8.41429603e-07, c_fixed=2.13526175e-03)
    return StepCost(TargetCost(3.92645679e-08, 2.10103129e-05, 5.88590713e-03), 1.20683946e-03, "eagle", 0.005875,
                    head, 0.375, 3)  # fmt: skip


def batched(result: steps.Result) -> list[int]:
    return [int(s["num_batched_tokens"]) for s in result.steps]


# ----------------------------------------------------------------------------- hand-traced cases
@pytest.mark.parametrize("gate", [True, False])
def test_a_request_waits_for_blocks_and_without_the_prompt_gate_is_preempted_instead(gate: bool) -> None:
    """Blocks of 1,024 slots, 20 in the cache. X: 8,192 prompt tokens, 4 verification steps (8 then
    9 blocks); Y: 16,384 prompt tokens (16 blocks), one step. Step 1 prefills X. From step 2 X
    verifies one token a step (9 blocks held, 11 free) and Y, arrived with it, asks to start with
    the 8,191 tokens left in the budget: with the full-prompt gate (vLLM 0.32) its 16 blocks are
    not free and it waits until X finishes after step 5; then 8,192 + 8,192 prefill tokens
    (steps 6, 7) and its step (8). Without it (0.10 / 0.11) it starts with 8 blocks at step 2,
    cannot have the 8 of its next chunk at step 3 and is preempted (its chunk lost), starts
    again at step 4, is preempted at step 5, and runs from step 6 as with the gate."""
    x = Plan(8192, np.ones(4, np.int64), 0)
    y = Plan(16384, np.ones(1, np.int64), 0)
    kv = KVCache(20, 1024, 0, gate)
    result = run([x, y], unit_cost(), 2, record=True, kv=kv)
    assert result.seconds == 8.0 and result.num_steps == 8
    if gate:
        assert batched(result) == [8192, 1, 1, 1, 1, 8192, 8192, 1]
        assert result.preemptions == 0
    else:
        assert batched(result) == [8192, 8192, 1, 8192, 1, 8192, 8192, 1]
        assert result.preemptions == 2
    assert (x.first_token_s, x.finish_s, y.first_token_s, y.finish_s) == (1.0, 5.0, 7.0, 8.0)
    # Sequences holding blocks: X (steps 1-5; Y too where it started: steps 2 and 4 without the
    # gate), Y (steps 6-8).
    assert result.running == (8.0 if gate else 10.0)
    # Unbounded: X prefilled at step 1, Y beside X's steps 2-4 (8,191, 8,191, 2), both end at step 5.
    unbounded = run([Plan(8192, np.ones(4, np.int64), 0), Plan(16384, np.ones(1, np.int64), 0)], unit_cost(), 2,
                    record=True)  # fmt: skip
    assert batched(unbounded) == [8192, 8192, 8192, 3, 2]
    assert unbounded.preemptions == 0


def test_a_running_sequence_is_preempted_and_recomputed() -> None:
    """Blocks of 4 slots, 4 in the cache. X: 8 prompt tokens, 5 verification steps of one token;
    Y: 4 prompt tokens, 4 steps. Step 1 prefills both (2 + 1 blocks). At step 2 X takes the free
    block (9 tokens: 3 blocks); Y needs a second block for its 5th token, none is free, and Y,
    the last admitted, preempts itself: its block freed, it waits with 4 + 1 tokens to
    recompute (2 blocks), while X runs to its end at step 6 (taking the last block there). Step
    7 recomputes Y's 5 tokens and samples its next one; steps 8-10 finish it."""
    x = Plan(8, np.ones(5, np.int64), 0)
    y = Plan(4, np.ones(4, np.int64), 0)
    result = run([x, y], unit_cost(), 2, record=True, kv=KVCache(4, 4))
    assert result.seconds == 10.0 and result.preemptions == 1
    assert batched(result) == [12, 1, 1, 1, 1, 1, 5, 1, 1, 1]
    # Tokens in the cache a step reads: X's prompt + generated (steps 2-6), Y's (steps 8-10).
    assert [int(s["num_kv_tokens"]) for s in result.steps] == [0, 9, 10, 11, 12, 13, 0, 6, 7, 8]
    assert (x.first_token_s, x.finish_s, y.first_token_s, y.finish_s) == (1.0, 6.0, 1.0, 10.0)
    unbounded = run([Plan(8, np.ones(5, np.int64), 0), Plan(4, np.ones(4, np.int64), 0)], unit_cost(), 2)
    assert unbounded.seconds == 6.0 and unbounded.preemptions == 0


def test_a_preempted_request_waits_a_step_and_restarts_on_its_first_chunk() -> None:
    """Blocks of 16, 628 in the cache; X: 16 prompt tokens, Y: 10,000, 20 steps of one token each.
    Step 1: X's prompt (1 block) and 8,176 of Y's (511); step 2: X's first step (2 blocks) and
    Y's last 1,824 (625); step 3: Y's 10,001st token takes the last block. Steps 3-17 verify
    both; at step 18 X's 33rd token needs a 3rd block: Y, the last admitted, is preempted (626
    blocks freed, 10,016 tokens to recompute) and, in the step that preempted, not started
    again. Step 19 starts it with the 8,191 tokens of the budget (512 blocks, 113 left); at step
    20 the rest needs 114 and it preempts itself; step 21 starts it again beside X's last step,
    step 22 takes the rest (X gone), steps 23-26 finish it."""
    x = Plan(16, np.ones(20, np.int64), 0)
    y = Plan(10_000, np.ones(20, np.int64), 0)
    result = run([x, y], unit_cost(), 2, record=True, kv=KVCache(628, 16))
    assert batched(result) == [8192, 1825] + [2] * 15 + [1, 8192, 1, 8192, 1825] + [1] * 4
    assert result.preemptions == 2
    assert (x.first_token_s, x.finish_s, y.first_token_s, y.finish_s) == (1.0, 21.0, 2.0, 26.0)


@pytest.mark.parametrize("gate", [True, False])
def test_a_replicated_request_that_just_fits_runs_in_closed_form_and_one_block_less_preempts(gate: bool) -> None:
    """4 copies of a 10,000-token prompt (625 blocks of 16), 20 steps of one token: each copy's
    last verification holds 10,020 slots, 627 blocks, so 2,508 blocks hold the call (the
    closed form, as unbounded). With 2,507, at the 17th step (10,017 slots: 627 blocks each)
    three copies take the 3 free blocks and the fourth, the last admitted, preempts itself; it
    recomputes 10,017 tokens. The other three end at step 25 (5 prefill steps, 20 of 3-4 tokens).
    With the gate it waits for them (627 blocks; 626 free), then 8,192 + 1,825 prefill tokens
    and its last 3 steps: 30 steps. Without it, it starts at step 23 with 8,189 tokens (512
    blocks of the 626), cannot have the 115 blocks of the rest at step 24 and is preempted,
    starts again at step 25, takes the rest at step 26 (the three gone): 29 steps."""

    def plan() -> Plan:
        return Plan(10_000, np.ones(20, np.int64), 0, copies=4)

    alone = run([plan()], eagle_cost(), 4, record=True)
    fits = run([plan()], eagle_cost(), 4, record=True, kv=KVCache(2508, 16, 0, gate))
    assert (fits.seconds, fits.steps, fits.preemptions) == (alone.seconds, alone.steps, 0)
    short = run([plan()], unit_cost(), 4, record=True, kv=KVCache(2507, 16, 0, gate))
    prefill = [8192] * 4 + [7232]
    if gate:
        assert batched(short) == prefill + [4] * 16 + [3] * 4 + [8192, 1825] + [1] * 3
        assert short.preemptions == 1
    else:
        assert batched(short) == prefill + [4] * 16 + [3, 8192, 3, 8192, 1828] + [1] * 3
        assert short.preemptions == 2
    assert short.seconds == len(short.steps) == (30 if gate else 29)


def test_a_sequence_longer_than_the_cache_is_refused_drafts_and_lookahead_included() -> None:
    """vLLM refuses to start an engine whose cache cannot hold one sequence of max_model_len. A
    sequence's last verification holds its 100 prompt and 7 generated tokens, 3 drafts and (an
    EAGLE-type drafter's) 3 lookahead slots: 113 slots, 8 blocks of 16; 110 without the lookahead."""
    plan = Plan(100, np.ones(7, np.int64), 3)
    assert run([plan], unit_cost(), 1, kv=KVCache(7, 16, 0)).seconds == 8.0  # closed form: 1 + 7 steps
    with pytest.raises(ValueError, match="needs 8 KV blocks; the cache holds 7"):
        run([plan], unit_cost(), 1, kv=KVCache(7, 16, 3))


# ----------------------------------------------------------------------------- unbounded: as before
@dataclass(eq=False)
class _OldRunning:
    plan: Plan
    prefilled: int = 0
    step: int = 0
    generated: int = 0


def _old_run(plans: list[Plan], cost: StepCost, max_seqs: int, record: bool = False,
             on_finish: Callable[[Plan, float], list[Plan]] | None = None) -> steps.Result:  # fmt: skip
    """The step loop of sdbench.rehearsal.steps.run before the KV cache was modelled (verbatim, but
    for the closed form of a lone plan, which is unchanged)."""
    trace: list[dict[str, float]] | None = [] if record else None
    waiting: deque[Plan] = deque(plans)
    running: list[_OldRunning] = []
    now = 0.0
    while waiting or running:
        if not running and waiting and waiting[0].arrival > now:
            now = waiting[0].arrival
        seqs = sum(r.plan.copies for r in running)
        while waiting and waiting[0].arrival <= now and seqs + waiting[0].copies <= max_seqs:
            plan = waiting.popleft()
            running.append(_OldRunning(plan))
            seqs += plan.copies
        if not running:
            continue
        kv = batch = kv_draft = proposed = seqs_draft = 0.0
        budget = BUDGET
        decoding = [r for r in running if r.generated > 0]
        for r in decoding:
            c = r.plan.copies
            batch += c * (1 + r.plan.proposed)
            kv += c * (r.plan.prompt_len + r.generated)
            kv_draft += c * (r.plan.prompt_len + r.generated)
            proposed += c * r.plan.proposed
            seqs_draft += c
        budget -= int(batch)
        chunks: list[tuple[_OldRunning, int]] = []
        for r in running:
            if r.generated > 0 or budget <= 0:
                continue
            chunk = min(r.plan.copies * r.plan.prompt_len - r.prefilled, budget)
            chunks.append((r, chunk))
            batch += chunk
            kv += r.prefilled
            budget -= chunk
        now += steps._price(cost, kv, batch, kv_draft, proposed, seqs_draft, seqs, trace)
        finished: list[_OldRunning] = []
        for r in decoding:
            r.generated += int(r.plan.decode[r.step])
            r.step += 1
            if r.step == len(r.plan.decode):
                finished.append(r)
        for r, chunk in chunks:
            r.prefilled += chunk
            if r.prefilled == r.plan.copies * r.plan.prompt_len:
                r.generated = 1
                r.plan.first_token_s = now
                if len(r.plan.decode) == 0:
                    finished.append(r)
        for r in finished:
            running.remove(r)
            r.plan.finish_s = now
            if on_finish is not None:
                waiting.extend(on_finish(r.plan, now))
    return steps.Result(now, trace or [])


def _random_plans(seed: int, long: bool = False) -> list[Plan]:
    rng = np.random.default_rng(seed)
    plans, t = [], 0.0
    for _ in range(int(rng.integers(1, 8))):
        t += float(rng.exponential(0.05)) if seed % 2 else 0.0
        prompt = int(rng.integers(1, 40_000 if long else 12_000))
        decode = rng.integers(1, 5, size=int(rng.integers(0, 300)))
        plans.append(Plan(prompt, decode, int(rng.integers(0, 4)), copies=int(rng.integers(1, 6)), arrival=t))
    return plans


def _closed_loop(seed: int) -> Callable[[Plan, float], list[Plan]]:
    more = _random_plans(seed + 1000)

    def on_finish(plan: Plan, t: float) -> list[Plan]:
        if not more:
            return []
        nxt = more.pop()
        nxt.arrival = t
        return [nxt]

    return on_finish


def _times(plans: list[Plan]) -> list[tuple[float, float]]:
    return [(p.first_token_s, p.finish_s) for p in plans]


@pytest.mark.parametrize("seed", range(12))
def test_an_unbounded_cache_runs_exactly_as_before(seed: int) -> None:
    """Several requests (arrivals, copies, drafts), and a closed loop: bit for bit the old loop's
    seconds, steps and token times."""
    old, new = _random_plans(seed), _random_plans(seed)
    loop = seed % 3 == 0
    before = _old_run(old, eagle_cost(), 8, record=True, on_finish=_closed_loop(seed) if loop else None)
    after = run(new, eagle_cost(), 8, record=True, on_finish=_closed_loop(seed) if loop else None, kv=UNBOUNDED)
    assert (after.seconds, after.steps, after.preemptions) == (before.seconds, before.steps, 0)
    assert _times(new) == _times(old)


@pytest.mark.parametrize("seed", range(12))
def test_steps_priced_at_once_are_the_step_loops(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stretches of decoding (and the restarts of a long prompt in a full cache) priced at once:
    the same seconds, steps, preemptions and token times as one step at a time, in caches from
    just one sequence to 2.5 times that, with and without the full-prompt gate."""
    rng = np.random.default_rng(seed)
    lookahead = int(rng.integers(0, 4))
    plans = _random_plans(seed, long=True)
    peak = max(KVCache(lookahead=lookahead).peak(p) for p in plans)
    kv = KVCache(int(peak * rng.uniform(1.0, 2.5)), 16, lookahead, bool(seed % 2))
    at_once = run(plans, eagle_cost(), 8, record=True, kv=kv)
    monkeypatch.setattr(steps, "_ahead", lambda *args: None)
    again = _random_plans(seed, long=True)
    one_by_one = run(again, eagle_cost(), 8, record=True, kv=kv)
    assert (at_once.seconds, at_once.steps, at_once.preemptions, at_once.running) == (
        one_by_one.seconds, one_by_one.steps, one_by_one.preemptions, one_by_one.running)  # fmt: skip
    assert _times(plans) == _times(again)
    assert all(not math.isnan(t) for t in np.ravel(_times(plans)))


# ----------------------------------------------------------------------------- the engine's counter
def _spec(traces: dict[str, str], batch_size: int) -> dict[str, Any]:
    return {
        "cell": {"engine": "vllm-0.11.1", "model": "llama3.1-8b", "dataset": "gsm8k", "method": "none",
                 "batch_size": batch_size},
        "seed": 42,
        "engine": {"vllm_version": "0.11.1", "device": "cuda", "device_memory_gib": 80},
        "model": {"hf_id": "meta-llama/Llama-3.1-8B-Instruct", "dtype": "bfloat16"},
        "method": {"method": "none"},
        "drafter": None,
        "dataset": {"max_tokens": 8192, "num_prompts": 1},
        "run": {"batch_mode": "replicate", "warmup_requests": 1, "repeats": 1},
        "engine_mode": "rehearsal",
        "rehearsal": {"published_traces": traces},
    }  # fmt: skip


def test_preemptions_reach_the_engine_counter_and_the_cell_tables(published_traces_dir: Path, tmp_path: Path) -> None:
    """GSM8K record 0 (103 prompt tokens, 178 output tokens) twice in lock step, in a cache of 30
    blocks of 16: each copy holds 15 blocks up to 240 tokens; at the 241st both need a 16th, none
    is free, and the second copy is preempted (once: alone, the first needs 18 of the 30, and the
    second, recomputing 241 tokens, waits for it). vLLM's counter counts 1 a call; the cell's
    timed call reads 1 (calls.num_preemptions, summary.num_preemptions)."""
    from sdbench.engine.measure.engine import start_engine
    from sdbench.engine.measure.trials import measure_cell
    from sdbench.rehearsal.prepare import rehearsal_prompts, write_standin_model
    from sdbench.rehearsal.workload import load_traces

    traces = {d: str(published_traces_dir / f"combined_{d}.jsonl") for d in ("gsm8k", "instructcoder")}
    model = tmp_path / "llama3.1-8b"
    write_standin_model("meta-llama/Llama-3.1-8B-Instruct", "main", model)
    entry = {"source": "huggingface", "builder": "gsm8k", "num_prompts": 1, "max_tokens": 8192, "category": "math"}
    prompts = rehearsal_prompts("gsm8k", entry, load_traces(traces), 128256, 128009, 42, 131072)
    assert (len(prompts.at[0, "prompt_token_ids"]), int(prompts.at[0, "rehearsal_output_tokens"])) == (103, 178)
    spec = _spec(traces, 2)
    engine = start_engine(spec, str(model), None, None, prompts={"gsm8k": prompts})
    llm = engine.llm
    assert llm.kv.blocks == llm.llm_engine.vllm_config.cache_config.num_gpu_blocks  # the modelled cache
    assert (llm.kv.lookahead, llm.kv.full_prompt_gate) == (0, False)  # no drafter; 0.11.1 admits on a chunk
    llm.kv = KVCache(30, 16)
    _, calls, summary, _ = measure_cell(engine, spec, prompts, None, "disabled")
    counter = [m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions"]
    assert counter == [2]  # the warm-up call's and the timed call's
    assert calls["num_preemptions"].tolist() == [1]
    assert int(summary.at[0, "num_preemptions"]) == 1


def test_an_engine_release_sets_its_admission_rule_and_a_drafter_its_lookahead() -> None:
    """vLLM 0.32 admits on the whole prompt's blocks (scheduler_reserve_full_isl), 0.10 / 0.11 on a
    chunk's; EAGLE-type drafters and draft models write k slots past the drafts, n-gram none."""
    from sdbench.rehearsal.llm import kv_cache

    def spec(version: str, method: str) -> dict[str, Any]:
        return {"engine": {"vllm_version": version}, "method": {"method": method}}

    assert kv_cache(spec("0.32.0", "eagle3"), 100, 3) == KVCache(100, 16, 3, True)
    assert kv_cache(spec("0.11.1", "ngram"), 100, 3) == KVCache(100, 16, 0, False)
    assert kv_cache(spec("0.10.1.1", "eagle"), 100, 3) == KVCache(100, 16, 3, False)
    assert kv_cache(spec("0.26.0", "draft_model"), 100, 3) == KVCache(100, 16, 3, False)
    assert kv_cache(spec("0.11.1", "none"), 0, 0).blocks == math.inf  # no modelled cache: unbounded


# ----------------------------------------------------------------------------- the paper grid's over-full cells
OVERFULL = [("speed-bench-throughput-32k", 16), ("speed-bench-throughput-32k", 64), ("speed-bench-throughput-8k", 64)]


def overfull_cells(config: str = "config/paper.yaml", every: int = 0) -> pd.DataFrame:
    """Before (unbounded) and after (the modelled cache) of the paper grid's over-full cells
    (vllm-0.11.1, Llama-3.1-8B, SPEED-Bench throughput 32k at batch 16 and 64, 8k at batch 64):
    one timed call's modelled seconds, effective batch (sequences holding KV, averaged over the
    steps), preemptions and wall time, from :func:`sdbench.rehearsal.steps.run` on the cells'
    rehearsal prompt sets; ``gated``: the same cache admitting on the whole prompt's blocks (vLLM
    0.32). ``every`` 0: the call of the median output length; n: the mean of every n-th call."""
    import dataclasses
    import tempfile
    import time

    from sdbench.config import load_config
    from sdbench.grid import Cell, resolve_cell
    from sdbench.rehearsal.llm import RehearsalLLM, model_facts
    from sdbench.rehearsal.prepare import rehearsal_prompts, write_standin_model
    from sdbench.rehearsal.workload import Workload, budget, load_traces, prompt_key

    shared = REPO.parent / "shared" / "data" / "published-traces" / "llama3.1-8B"
    traces = load_traces({d: str(shared / f"combined_{d}.jsonl") for d in ("gsm8k", "instructcoder")})
    cfg = load_config(REPO / config)
    tmp = Path(tempfile.mkdtemp())
    rows = []
    for dataset, bs in OVERFULL:
        for method in ("none", "ngram-k3", "eagle3-k3"):
            spec = resolve_cell(cfg, Cell("vllm-0.11.1", "llama3.1-8b", dataset, method, bs))
            dirs = []
            for key in ("llama3.1-8b", spec.get("drafter")):
                if key and not (tmp / key).exists():
                    write_standin_model(cfg["models"][key]["hf_id"], "main", tmp / key)
                dirs.append(str(tmp / key) if key else None)
            vocab, eos = model_facts(dirs[0])
            prompts = rehearsal_prompts(dataset, cfg["datasets"][dataset], traces, vocab, eos, spec["seed"], 131072)
            workload = Workload({dataset: prompts}, traces, vocab, eos, spec["seed"])
            llm = RehearsalLLM(spec, dirs[0], dirs[1], workload, bs)
            calls = []
            for ids in prompts["prompt_token_ids"]:
                info = llm.workload.lookup(ids)
                n, _ = budget(info, int(spec["dataset"]["max_tokens"]), False)
                calls.append((len(ids), *llm._schedule(info, prompt_key(ids), n), n))
            outputs = np.array([c[3] for c in calls])
            picked = [int(np.argsort(outputs)[len(outputs) // 2])] if every == 0 else range(0, len(calls), every)
            row: dict[str, Any] = {"dataset": dataset, "batch_size": bs, "method": method, "kv_blocks": llm.kv.blocks,
                                   "output_tokens": float(outputs[list(picked)].mean())}  # fmt: skip
            gated = dataclasses.replace(llm.kv, full_prompt_gate=True)  # as vLLM 0.32 admits
            for when, kv in (("before", UNBOUNDED), ("after", llm.kv), ("gated", gated)):
                seconds, held, preempted, wall = [], [], 0, 0.0
                for j in picked:
                    prompt_len, decode, proposed, _ = calls[j]
                    t0 = time.perf_counter()
                    result = run([Plan(prompt_len, decode, proposed, copies=bs)], llm.cost, bs, kv=kv)
                    wall += time.perf_counter() - t0
                    seconds.append(result.seconds)
                    held.append(result.mean_running)
                    preempted += result.preemptions
                row.update({f"{when}_s": float(np.mean(seconds)), f"{when}_batch": float(np.mean(held)),
                            f"{when}_preemptions": preempted / len(picked),
                            f"{when}_wall_ms": 1e3 * wall / len(picked)})  # fmt: skip
            rows.append(row)
    return pd.DataFrame(rows)


if __name__ == "__main__":  # python tests/rehearsal/test_rehearsal_kv.py [every]
    pd.set_option("display.width", 200)
    print(overfull_cells(every=int(sys.argv[1]) if len(sys.argv) > 1 else 0).round(2).to_string(index=False))
