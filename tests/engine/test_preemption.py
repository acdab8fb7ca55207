"""A batch that does not fit a deliberately small KV cache: the real CPU engine preempts, and
the cell is flagged (``num_preemptions`` in its tables, ``preempted`` in cells.parquet)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from support.require import import_or_fail

from conftest import REPO

CELL_RUN = textwrap.dedent("""
    import json, sys
    from pathlib import Path

    import pandas as pd


    def main():
        sys.path.insert(0, sys.argv[2])
        from support.datasets_tokenizers import save_tiny_llama

        out = Path(sys.argv[1])
        save_tiny_llama(out, max_position_embeddings=256)
        from sdbench.engine.measure.trials import run_cell

        batch = int(sys.argv[4])
        spec = {
            "cell": {"engine": "vllm-cpu", "model": "tiny", "dataset": "d", "method": "none", "batch_size": batch},
            "seed": 0,
            # 2 layers x K,V x 2 heads x 32 x 4 bytes = 1 KiB per token: 160 KiB hold 160 tokens,
            # 8 sequences of 20 + 60 tokens need 640.
            "engine": {"vllm_version": "0.32.0", "device": "cpu", "env": {"OMP_NUM_THREADS": None},
                       "llm_kwargs": {"enforce_eager": True, "kv_cache_memory_bytes": 160 * 1024,
                                      "block_size": 32}},
            "model": {"dtype": "float32", "max_model_len": 128},
            "method": {"method": "none"},
            "dataset": {"max_tokens": 60},
            "run": {"batch_mode": "replicate", "warmup_requests": 0, "ignore_eos": True, "repeats": 1},
        }
        prompts = pd.DataFrame({"request_id": ["r0"], "prompt_token_ids": [list(range(10, 30))]})
        _, calls, summary, _ = run_cell(spec, prompts, str(out), None, guard_mode="disabled")
        row = summary.iloc[0]
        print("CELL " + json.dumps({"calls": calls["num_preemptions"].tolist(),
                                    "num_preemptions": int(row["num_preemptions"]),
                                    "engine_layout": row["engine_layout"],
                                    "kv_cache_capacity_tokens": float(row["kv_cache_capacity_tokens"])}), flush=True)
        summary.to_parquet(sys.argv[3])


    if __name__ == "__main__":
        main()
    """)


def _run(tmp_path: Path, batch: int) -> tuple[dict, pd.DataFrame]:
    script = tmp_path / "run.py"
    script.write_text(CELL_RUN)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    summary = tmp_path / f"summary-bs{batch}.parquet"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "model"), str(REPO / "tests"), str(summary), str(batch)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return json.loads(done.stdout.split("CELL ", 1)[1].splitlines()[0]), pd.read_parquet(summary)


@pytest.mark.slow
def test_a_batch_beyond_the_kv_cache_is_preempted_and_flagged(tmp_path: Path) -> None:
    from sdbench.analysis.endtoend import join_cells

    import_or_fail("vllm")
    seen, summary = _run(tmp_path, batch=8)
    print(f"bs 8 on a {seen['kv_cache_capacity_tokens']:.0f}-token KV cache: {seen}")
    assert seen["kv_cache_capacity_tokens"] < 8 * (20 + 60)  # the batch cannot fit
    assert seen["num_preemptions"] > 0 and sum(seen["calls"]) == seen["num_preemptions"], seen
    assert seen["engine_layout"] == "inprocess"
    cells = join_cells([summary], baseline="none")
    assert bool(cells.loc[0, "preempted"]) and int(cells.loc[0, "num_preemptions"]) == seen["num_preemptions"]
