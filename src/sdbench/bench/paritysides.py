"""The two sides of ``sdbench bench parity``, each run in its own process (a fresh engine):
``python -m sdbench.bench.paritysides runner|vllm ...`` writes its result as JSON.

- ``runner``: the cell through :func:`sdbench.engine.measure.trials.run_cell`;
- ``vllm``: ``vllm bench throughput`` through its Python entry point (the console script fails
  with the CPU build), with the runner's greedy ``SamplingParams`` unless ``--sampling tool``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sdbench.bench.paritytool import vllm_bench_parser
from sdbench.cliargs import add_model_dirs, add_prompts
from sdbench.engine.measure.trials import run_cell
from sdbench.requesttable import expand_outputs, with_prompt_ids


def _engine_summary(llm: Any) -> dict[str, Any]:
    cfg = llm.llm_engine.vllm_config
    return {
        "vllm_config": str(cfg),
        "max_num_seqs": cfg.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
        "async_scheduling": getattr(cfg.scheduler_config, "async_scheduling", None),
        "kv_cache_memory_bytes": getattr(cfg.cache_config, "kv_cache_memory_bytes", None),
        "num_gpu_blocks": getattr(cfg.cache_config, "num_gpu_blocks", None),
        "block_size": getattr(cfg.cache_config, "block_size", None),
        "log_stats": getattr(llm.llm_engine, "log_stats", None),
        "VLLM_ENABLE_V1_MULTIPROCESSING": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"),
    }


def _record_engine_config(store: dict[str, Any]) -> None:
    """Record the resolved engine config of every ``vllm.LLM`` built in this process."""
    from vllm.entrypoints.llm import LLM

    original = LLM.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        store.update(_engine_summary(self))

    LLM.__init__ = init


def _child_runner(args: argparse.Namespace) -> int:
    from sdbench.engine.release.versions import apply_env, engine_env

    spec = json.loads(Path(args.spec).read_text())
    apply_env(engine_env(spec["engine"], spec["method"]))  # before vLLM is imported (run_cell does too)

    engine: dict[str, Any] = {}
    _record_engine_config(engine)
    prompts = pd.read_parquet(args.prompts)
    requests, calls, summary, _ = run_cell(spec, prompts, args.model_dir, args.drafter_dir)
    # The table names prompts by request_id and stores a call's equal outputs once (sdbench.requesttable).
    requests = with_prompt_ids(expand_outputs(requests), prompts)
    row = summary.iloc[0]
    result = {
        "side": "runner",
        "output_tokens": int(calls["num_output_tokens"].sum()),
        "elapsed_s": float(calls["duration_s"].sum()),
        "tokens_per_s": float(calls["num_output_tokens"].sum() / calls["duration_s"].sum()),
        "summary_tokens_per_s_pooled": float(row["tokens_per_s_pooled"]),
        "startup_s": float(row["startup_s"]),
        "warmup_s": float(row["warmup_s"]),
        # The runner's own quiet-machine guard, when it has one.
        "guard": {
            k: row[k].item() if hasattr(row[k], "item") else row[k]
            for k in ("contaminated", "contamination", "guard_load_max")
            if k in row.index
        },
        "prompt_token_ids": [list(map(int, x)) for x in requests["prompt_token_ids"]],
        "output_token_ids": [list(map(int, x)) for x in requests["output_token_ids"]],
        "engine": engine,
    }
    Path(args.result).write_text(json.dumps(result))
    return 0


def _child_vllm(args: argparse.Namespace, tool_argv: list[str]) -> int:
    """Run ``vllm bench throughput`` through its Python entry point (the console script fails here)."""
    import vllm
    import vllm.entrypoints.llm  # noqa: F401 - builds unions of SamplingParams at import; patch after
    from vllm.benchmarks import throughput
    from vllm.sampling_params import SamplingParams

    calls: list[dict[str, Any]] = []
    if args.sampling == "runner":
        # The tool hard-codes temperature=1.0 (throughput._run_vllm_requests reads
        # vllm.SamplingParams at call time): give it the runner's greedy params instead.
        def runner_sampling(**kw: Any) -> SamplingParams:
            kw.update(temperature=0.0, seed=args.seed)
            calls.append(kw)
            return SamplingParams(**kw)

        vllm.SamplingParams = runner_sampling  # type: ignore[misc]

    engine: dict[str, Any] = {}
    _record_engine_config(engine)
    captured: dict[str, Any] = {}
    original_run_vllm = throughput.run_vllm

    def run_vllm(*a: Any, **kw: Any) -> Any:
        elapsed, outputs = original_run_vllm(*a, **kw)
        captured["elapsed_s"] = elapsed
        captured["outputs"] = outputs
        return elapsed, outputs

    throughput.run_vllm = run_vllm
    parser = vllm_bench_parser()
    throughput.main(parser.parse_args(tool_argv))

    outputs = captured["outputs"]
    result = {
        "side": "vllm",
        "elapsed_s": float(captured["elapsed_s"]),
        "output_tokens": sum(len(o.token_ids) for ro in outputs for o in ro.outputs),
        "prompt_token_ids": [list(map(int, ro.prompt_token_ids)) for ro in outputs],
        "output_token_ids": [list(map(int, ro.outputs[0].token_ids)) for ro in outputs],
        "sampling_calls": len(calls),
        "sampling_example": {k: v for k, v in (calls[-1] if calls else {}).items()},
        "engine": engine,
    }
    result["tokens_per_s"] = result["output_tokens"] / result["elapsed_s"]
    Path(args.result).write_text(json.dumps(result))
    return 0


def _child_main(argv: Sequence[str]) -> int:
    argv = list(argv)
    tool_argv: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, tool_argv = argv[:cut], argv[cut + 1 :]
    p = argparse.ArgumentParser(prog="python -m sdbench.bench.paritysides")
    sub = p.add_subparsers(dest="side", required=True)
    r = sub.add_parser("runner")
    r.add_argument("--spec", required=True)
    add_prompts(r)
    add_model_dirs(r)
    r.add_argument("--result", required=True)
    v = sub.add_parser("vllm", help="vllm bench throughput; its arguments follow '--'")
    v.add_argument("--sampling", choices=("runner", "tool"), default="runner")
    # --seed here is required: the runner's SamplingParams seed, passed on (cliargs.add_seed has a default)
    v.add_argument("--seed", type=int, required=True, help="the runner's SamplingParams seed")
    v.add_argument("--result", required=True)
    args = p.parse_args(argv)
    if args.side == "runner":
        return _child_runner(args)
    return _child_vllm(args, tool_argv)


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))


# ----------------------------------------------------------------------------- touchpoints
from sdbench.engine.release import touchpoints as tp  # noqa: E402 - standard library only

TOUCHPOINTS = tp.declare(
    __name__,
    tp.defined("parity.bench_throughput", "vllm.benchmarks.throughput:run_vllm"),
    tp.defined("parity.bench_throughput_main", "vllm.benchmarks.throughput:main", ["args"]),
    tp.defined("parity.llm_init", "vllm.entrypoints.llm:LLM.__init__"),
    tp.defined("parity.sampling_params", "vllm.sampling_params:SamplingParams"),
)
