"""Engine fixes (sdbench.engine.release.enginefixes): the CPU build's float expand, which sampled SD reads,
and its rejection kernels in synthetic (forced-acceptance) mode."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support.require import import_or_fail

from sdbench.engine.release import cpukernels, enginefixes
from sdbench.engine.release.versions import quirks_for

torch = import_or_fail("torch")
REPO = Path(__file__).resolve().parents[2]


def _expected(values: list, cu: list[int], replace_from, replace_to) -> list:
    out, start = [], 0
    for value, end in zip(values, cu):
        out += [replace_to if value == replace_from else value] * (end - start)
        start = end
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_expand_fills_each_requests_tokens_in_the_outputs_dtype(dtype) -> None:
    values = torch.tensor([0.5, 0, 1.5, 2], dtype=torch.float32).to(dtype)
    cu = torch.tensor([2, 5, 5, 6], dtype=torch.int32)  # the third request has no draft tokens
    out = torch.full((6,), -7, dtype=dtype)
    enginefixes.expand_batch_values(out, values, cu, 0, 3)
    assert out.tolist() == _expected(values.tolist(), cu.tolist(), 0, 3)
    assert out.dtype == dtype


def test_expand_leaves_padding_beyond_the_last_request() -> None:
    out = torch.full((5,), -1.0)
    enginefixes.expand_batch_values(out, torch.tensor([0.7]), torch.tensor([3]), 0, 0)
    assert out.tolist() == pytest.approx([0.7, 0.7, 0.7, -1.0, -1.0])


def test_fixes_are_per_release() -> None:
    assert quirks_for("0.32.0").fixes == ("cpu_float_expand", "cpu_synthetic_rejection")
    assert quirks_for("0.11.1").fixes == () and quirks_for("0.10.1.1").fixes == ()
    assert set(quirks_for("0.32.0").fixes) <= set(enginefixes.FIX_TARGETS)


def test_install_replaces_the_platform_kernel_and_names_a_missing_target(monkeypatch) -> None:
    cpu_tl = import_or_fail("vllm.utils.cpu_triton_utils")
    monkeypatch.setattr(cpu_tl, "_expand_kernel_impl", cpu_tl._expand_kernel_impl)  # restored afterwards
    assert enginefixes.install(("cpu_float_expand",)) == ["cpu_float_expand"]
    assert cpu_tl._expand_kernel_impl is enginefixes.expand_batch_values
    monkeypatch.delattr(cpu_tl, "_expand_kernel_impl")
    with pytest.raises(RuntimeError, match=r"cpu_float_expand.*_expand_kernel_impl not found"):
        enginefixes.install(("cpu_float_expand",))


def test_the_pinned_cpu_build_still_drops_float_expands() -> None:
    """The upstream wrapper (loaded fresh from the installed file) leaves a float output unwritten:
    when this fails, the build fixed it and ``EngineQuirks.fixes`` can drop ``cpu_float_expand``."""
    cpu_tl = import_or_fail("vllm.utils.cpu_triton_utils")
    cpukernels.load_kernels()  # vLLM's own choice of build: _C_AVX2 on a CPU without AVX-512
    spec = importlib.util.spec_from_file_location("upstream_cpu_triton_utils", cpu_tl.__file__)
    upstream = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(upstream)
    out = torch.full((4,), -1.0)
    upstream._expand_kernel_impl(out, torch.tensor([0.5, 1.5]), torch.tensor([2, 4], dtype=torch.int32), 0, 0)
    assert out.tolist() == [-1.0] * 4  # the result went to an int64 copy


# ----------------------------------------------------------------------------- real engine

ENGINE_RUN = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    sys.path.insert(0, sys.argv[2])
    from support.datasets_tokenizers import save_llama3_like

    out = Path(sys.argv[1])
    if not (out / "config.json").exists():
        tok = AutoTokenizer.from_pretrained(save_llama3_like(out))
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
                          bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg)
        with torch.no_grad():  # near one-hot next-token distributions: T = 1 samples the argmax
            model.lm_head.weight.mul_(1000.0)
        model.save_pretrained(out)
    from vllm import LLM, SamplingParams
    from sdbench.engine.measure.forcing import forced_acceptance
    # argv[3]: "switch" and a JSON list of forced lengths (null: the method's own), switched in
    # one engine; else more speculative_config keys.
    switch = len(sys.argv) > 3 and sys.argv[3] == "switch"
    extra = {} if switch or len(sys.argv) <= 3 else json.loads(sys.argv[3])
    lengths = json.loads(sys.argv[4]) if switch else [None]
    llm = LLM(model=str(out), speculative_config={"method": "ngram", "num_speculative_tokens": 3,
              "prompt_lookup_min": 2, "prompt_lookup_max": 5, **extra}, enforce_eager=True, dtype="float32",
              kv_cache_memory_bytes=1 << 28, max_model_len=512, seed=0, disable_log_stats=False)
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_accepted_tokens": "accepted"}
    counts = []
    for length in lengths:
        with forced_acceptance(llm, length):
            per_t = {}
            for temperature in (0.0, 1.0):
                before = {names[m.name]: m.value for m in llm.get_metrics() if m.name in names}
                llm.generate(["def add(a, b):\\n    return a + b\\n" * 4] * (4 if extra or switch else 1),
                             SamplingParams(temperature=temperature, seed=1, max_tokens=64, ignore_eos=True),
                             use_tqdm=False)
                after = {names[m.name]: m.value for m in llm.get_metrics() if m.name in names}
                per_t[str(temperature)] = {k: after.get(k, 0) - before.get(k, 0) for k in names.values()}
        counts.append(per_t)
    print("COUNTS " + json.dumps(counts if switch else counts[0]))
    """)


@pytest.mark.slow
def test_sampled_ngram_accepts_drafts_only_with_the_fix(tmp_path: Path) -> None:
    """The real CPU engine, n-gram k=3 on a model whose T = 1 sample is its argmax: with the plugin
    (every process of this venv) sampled drafts are accepted about as often as greedy ones. With
    the plugin left out (VLLM_PLUGINS names only the others) the rejection divides by whatever
    memory held (the tiny models' runs saw 0 to half the greedy rate): it must stay below 3/4 of
    the fixed rate, or the build no longer needs the fix."""
    import_or_fail("vllm")
    script = tmp_path / "run.py"
    script.write_text(ENGINE_RUN)
    results = {}
    for label, plugins in (("fixed", None), ("upstream", "sdbench_trace,sdbench_step_timing")):
        env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
        if plugins is not None:
            env["VLLM_PLUGINS"] = plugins
        done = subprocess.run([sys.executable, str(script), str(tmp_path / "model"), str(REPO / "tests")],
                              env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        results[label] = json.loads(done.stdout.split("COUNTS ", 1)[1].splitlines()[0])
    greedy, fixed, upstream = results["fixed"]["0.0"], results["fixed"]["1.0"], results["upstream"]["1.0"]
    assert greedy["drafts"] > 0 and greedy["accepted"] > 0
    assert fixed["drafts"] > 0 and fixed["accepted"] / fixed["drafts"] > 0.8 * greedy["accepted"] / greedy["drafts"], results
    # Without the fix the rejection reads an unwritten buffer: every run seen here accepted at most
    # half the greedy rate, so three quarters of the fixed rate separates the two with room to spare.
    upstream_rate = upstream["accepted"] / upstream["drafts"]
    assert upstream["drafts"] > 0 and upstream_rate < 0.75 * fixed["accepted"] / fixed["drafts"], results
    print(f"\n[enginefixes] accepted per draft: greedy {greedy['accepted'] / greedy['drafts']:.2f}, "
          f"T=1 fixed {fixed['accepted'] / fixed['drafts']:.2f}, T=1 upstream {upstream['accepted'] / upstream['drafts']:.2f}")


# ----------------------------------------------------------------------------- synthetic acceptance
def _kernel_reference(cu, drafts, uniform, rates, bonus, rejected_ids, rows, width):
    """The Triton kernels' loop (vllm/v1/sample/rejection_sampler.py), written out per request."""
    out = [[-1] * width for _ in cu]
    start = 0
    for req, end in enumerate(cu):
        if rows[req]:
            rejected = False
            for pos in range(end - start):
                if not rejected:
                    i = start + pos
                    accepted = uniform[i] < rates[pos] and drafts[i] >= 0
                    out[req][pos] = drafts[i] if accepted else rejected_ids[i]
                    rejected = not accepted
            if not rejected:
                out[req][end - start] = bonus[req]
        start = end
    return out


def test_synthetic_rejection_follows_the_kernels_semantics() -> None:
    gen = torch.Generator().manual_seed(3)
    for _ in range(200):
        batch, k = int(torch.randint(1, 6, (1,), generator=gen)), int(torch.randint(1, 5, (1,), generator=gen))
        counts = torch.randint(0, k + 1, (batch,), generator=gen)
        cu = torch.cumsum(counts, 0).to(torch.int32)
        n = int(cu[-1]) if batch else 0
        drafts = torch.randint(-1, 50, (n,), generator=gen, dtype=torch.int32)
        uniform = torch.rand(n, generator=gen, dtype=torch.float64)
        rates = torch.sort(torch.rand(k, generator=gen), descending=True).values
        bonus = torch.randint(50, 60, (batch, 1), generator=gen)
        rejected_ids = torch.randint(60, 70, (n,), generator=gen)
        rows = torch.rand(batch, generator=gen) < 0.7
        out = torch.full((batch, k + 1), -1, dtype=torch.int32)
        enginefixes.synthetic_rejection(out, cu, drafts, uniform, rates, bonus, rejected_ids, rows)
        want = _kernel_reference(cu.tolist(), drafts.tolist(), uniform.tolist(), rates.tolist(),
                                 bonus.view(-1).tolist(), rejected_ids.tolist(), rows.tolist(), k + 1)  # fmt: skip
        assert out.tolist() == want


def test_synthetic_fix_calls_the_builds_kernel_when_the_mode_is_off(monkeypatch) -> None:
    cpu_tl = import_or_fail("vllm.utils.cpu_triton_utils")
    cpukernels.load_kernels()  # vLLM's own choice of build: _C_AVX2 on a CPU without AVX-512
    for attr in ("_rejection_greedy_sample_kernel_impl", "_rejection_random_sample_kernel_impl"):
        monkeypatch.setattr(cpu_tl, attr, getattr(cpu_tl, attr))  # restored afterwards
    assert enginefixes.install(("cpu_synthetic_rejection",)) == ["cpu_synthetic_rejection"]
    assert enginefixes.install(("cpu_synthetic_rejection",)) == ["cpu_synthetic_rejection"]  # idempotent
    greedy = cpu_tl._rejection_greedy_sample_kernel_impl
    assert greedy.sdbench_fix == "cpu_synthetic_rejection"
    out = torch.full((1, 4), -1, dtype=torch.int32)
    cu, drafts = torch.tensor([3], dtype=torch.int32), torch.tensor([5, 6, 7], dtype=torch.int32)
    # Mode off: the build's C++ kernel, greedy: accepted while the draft is the target's argmax.
    greedy(out, cu, drafts, torch.tensor([5, 6, 9]), torch.tensor([[8]]), None, 3)
    assert out.tolist() == [[5, 6, 9, -1]]
    # Mode on: accepted by the rates whatever the target says (rates 1, 1, 0: two drafts, then the argmax).
    out.fill_(-1)
    greedy(out, cu, drafts, torch.tensor([1, 2, 3]), torch.tensor([[8]]), None, 3,
           torch.full((3,), 0.5, dtype=torch.float64), torch.tensor([1.0, 1.0, 0.0]), True)  # fmt: skip
    assert out.tolist() == [[5, 6, 3, -1]]


@pytest.mark.slow
def test_forced_acceptance_lengths_switched_in_one_cpu_engine(tmp_path: Path) -> None:
    """One real CPU engine, n-gram k=3, forced cell by cell (sdbench.engine.measure.forcing, the way an
    engine group runs a method's forced-acceptance points): the measured accepted length is the
    forced one -- exactly 1 when nothing may be accepted, near 2.5 when half the second drafts
    are -- greedy and sampled; and afterwards the engine accepts exactly as it did before forcing."""
    import_or_fail("vllm")
    script = tmp_path / "run.py"
    script.write_text(ENGINE_RUN)
    lengths = [None, 1.0, 2.5, 4.0, None]
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "model"), str(REPO / "tests"), "switch",
                           json.dumps(lengths)], capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    counts = json.loads(done.stdout.split("COUNTS ", 1)[1].splitlines()[0])
    measured = [{t: 1 + c["accepted"] / c["drafts"] for t, c in per_t.items()} for per_t in counts]
    print(f"\n[forcing] {list(zip(lengths, measured))}")
    for t in ("0.0", "1.0"):
        assert measured[1][t] == 1.0
        assert 2.2 <= measured[2][t] <= 2.8, measured
        assert measured[3][t] > 3.5, measured  # n-gram pads a short draft with -1, never accepted
    # Greedy, unforced again: the method's own acceptance (the same accepted tokens; the number of
    # draft steps may differ by one between two runs of one engine).
    assert counts[4]["0.0"]["accepted"] == counts[0]["0.0"]["accepted"]
    assert abs(measured[4]["0.0"] - measured[0]["0.0"]) < 0.1 and measured[0]["0.0"] > 2.8, measured
