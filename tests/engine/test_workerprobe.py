"""Worker memory through ``collective_rpc`` by name (sdbench.engine.release.workerprobe), on the real CPU engine.

With the engine core in another process (vLLM 0.11.1 runs every SD cell so), the client encodes the
call with msgpack: a function is refused unless VLLM_ALLOW_INSECURE_SERIALIZATION=1, a method name
is not. The test starts the real engine both ways and checks both facts.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support.require import import_or_fail

from conftest import REPO
from sdbench.engine.release import workerprobe

ENGINE_RUN = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path


    def main():  # a function: the multiprocess engine core is spawned, and re-imports this file
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
                              bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                              tie_word_embeddings=False)
            LlamaForCausalLM(cfg).save_pretrained(out)
        from vllm import LLM
        from sdbench.engine.release.versions import engine_memory
        llm = LLM(model=str(out), speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                  "prompt_lookup_min": 2, "prompt_lookup_max": 5}, enforce_eager=True, dtype="float32",
                  kv_cache_memory_bytes=1 << 26, max_model_len=512, seed=0, disable_log_stats=False)
        try:
            llm.collective_rpc(lambda worker: 1)
            by_function = "ok"
        except Exception as exc:
            by_function = type(exc).__name__ + ": " + str(exc)[:200]
        memory = engine_memory(llm)
        print("MEMORY " + json.dumps({"memory": memory, "by_function": by_function}), flush=True)


    if __name__ == "__main__":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = sys.argv[3]
        main()
    """)



@pytest.mark.slow
@pytest.mark.parametrize("multiprocessing", ["0", "1"])
def test_worker_memory_reaches_the_front_end_in_process_and_across_processes(
    tmp_path_factory: pytest.TempPathFactory, multiprocessing: str
) -> None:
    import_or_fail("vllm")
    work = tmp_path_factory.mktemp(f"probe-{multiprocessing}")
    script = work / "run.py"
    script.write_text(ENGINE_RUN)
    env = {k: v for k, v in os.environ.items() if k not in {"VLLM_PLUGINS", "VLLM_ALLOW_INSECURE_SERIALIZATION"}}
    done = subprocess.run([sys.executable, str(script), str(work / "model"), str(REPO / "tests"), multiprocessing],
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    result = json.loads(done.stdout.split("MEMORY ", 1)[1].splitlines()[0])
    memory = result["memory"]
    # The tiny model's tensors: the analytical count (float32) plus vLLM's vocabulary padding to a
    # multiple of 64 (260 -> 320 rows of the embedding and of the untied LM head); KV cache as asked.
    from sdbench.analysis.memory import memory_report

    analytical = memory_report(str(work / "model"))["static_gib"] * 2**30
    assert memory["measured_weights_gib"] * 2**30 == pytest.approx(analytical + (320 - 260) * 64 * 2 * 4, abs=0.5)
    assert memory["measured_kv_cache_gib"] * 2**30 == pytest.approx(1 << 26, rel=0.05)
    assert memory["peak_rss_gib"] > 0.1 and math.isnan(memory["peak_device_gib"])  # no CUDA here
    if multiprocessing == "1":
        # What the engine_memory() of 0.11.1's SD cells met before the report went by name.
        assert "VLLM_ALLOW_INSECURE_SERIALIZATION" in result["by_function"], result["by_function"]
    else:
        assert result["by_function"] == "ok"


def test_the_report_is_installed_on_the_wrapper_vllm_hands_run_method() -> None:
    import_or_fail("vllm")
    assert workerprobe.install() == "vllm.v1.worker.worker_base"
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    assert getattr(WorkerWrapperBase, workerprobe.RPC_METHOD) is workerprobe.memory_report


def test_a_cpu_runner_counts_its_tensors_a_shared_one_once() -> None:
    """On CPU the runner's profiled number misses memory-mapped weights: the loaded tensors are
    counted instead, a tensor the drafter shares with the target (its LM head) once."""
    torch = import_or_fail("torch")
    shared = torch.nn.Linear(4, 4, bias=False)  # 16 float32 = 64 bytes

    class Drafter:
        model = torch.nn.Sequential(shared, torch.nn.Linear(4, 2, bias=False))  # + 8 float32 = 32 bytes

    class Runner:
        model = shared
        drafter = Drafter()
        model_memory_usage = 12345  # what the CPU runner's host-memory profiler said: not read
        kv_caches = [torch.zeros(8, dtype=torch.float16)]  # 16 bytes

    class Worker:
        model_runner = Runner()
        device = torch.device("cpu")

    class Wrapper:
        worker = Worker()

    report = workerprobe.memory_report(Wrapper())
    assert report["weights_bytes"] == 64 + 32 and report["kv_bytes"] == 16
    assert math.isnan(report["device_peak_bytes"]) and report["pid"] == os.getpid()
