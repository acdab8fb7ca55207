"""``sdbench bench modes``: served speedup with its stream-off control, over interleaved server starts.

For each method of ``--methods`` (no SD first) the bench starts vLLM's OpenAI-compatible server as a
server group would (:mod:`sdbench.bench.serveparity`'s pieces: the engine arguments of an offline
cell, the CPU placement), ``--starts`` times, interleaved: start s of every method before start
s + 1, so start s of SD and start s of no SD ran next to each other in time. On each start, per
load (``--loads``, requests in flight): warm-up requests, ``--rounds`` timed streamed rounds
(:func:`sdbench.engine.serving.loadgen.run_level`), then one stream-off control round of the same requests
(plain completions, ``stream=False``), under the quiet-machine guard from the first timed round to
the control's end as a server group's levels are (``SDBENCH_QUIET_GUARD`` ``disabled`` turns it off;
``refuse`` flags as ``flag`` does: a bench keeps what it measured). It writes each arm as a server
group's output (``<output-dir>/<method>/<dataset>/c<load>/requests.parquet``, ``summary.parquet``,
the columns of docs/schema.md the analyses read, with ``round_start``, ``start_sequence``,
``job_id``, ``interleaved``, ``stream_off_tokens_per_s`` and the guard's columns over every start),
so ``sdbench latency`` / ``goodput-frontier`` and :mod:`sdbench.analysis.modeparity` read it as
they read a run's.

Then, with ``--offline-cells`` (a run's ``grid_cells.parquet``), the offline vs served table
(:func:`sdbench.analysis.modeparity.modes_table`), and per SD arm and load the widths of the
throughput and goodput ratios' 95% intervals with server starts resampled against rounds only
(``--markdown``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd

from sdbench.analysis.latency import read_server_cells, read_server_requests
from sdbench.analysis.verdict import server_points
from sdbench.engine.measure.engine import build_llm_kwargs
from sdbench.engine.measure.latencysummary import latency_percentiles
from sdbench.engine.serving.loadgen import read_metrics, results_rows, run_level
from sdbench.engine.serving.server import SERVED_MODEL_NAME, ServerProcess, cpu_placement, free_port, server_argv, server_env
from sdbench.engine.site.quietguard import GuardReport, QuietGuard, allowed_cores, merge_reports, mode_from_env
from sdbench.io import write_parquet, write_text
from sdbench.servermode import start_order


def _counters_delta(after: Any, before: Any) -> dict[str, int]:
    return {f: int(getattr(after, f)) - int(getattr(before, f)) for f in ("num_drafts", "num_accepted_tokens")}


def arm_summary(keys: dict[str, Any], method: dict[str, Any], rows: pd.DataFrame, walls: list[float],
                round_start: list[int], sequence: list[int], job_id: str, off_walls: list[float],
                off_tokens: list[int], drafts: int, accepted: int,
                guard: GuardReport | None = None) -> pd.DataFrame:  # fmt: skip
    """One server cell's summary row from its timed requests (``stream`` True, rounds in wall order);
    ``guard``: the quiet-machine guard's report over its starts' timed parts (None: no guard ran)."""
    guard = guard if guard is not None else GuardReport("disabled", allowed_cores())
    timed = rows[rows["stream"]]
    per_round = timed.groupby("round")["num_output_tokens"].sum().to_numpy() / np.asarray(walls)
    tokens_off = [t / w for t, w in zip(off_tokens, off_walls)]
    row = {
        **keys, "sd_method": method.get("method", "none"), "num_speculative_tokens": method.get("num_speculative_tokens"),
        "rounds": len(walls), "requests_per_round": int(timed.groupby("round").size().iloc[0]),
        "tokens_per_s": float(np.median(per_round)), "tokens_per_s_min": float(per_round.min()),
        "tokens_per_s_max": float(per_round.max()),
        "requests_per_s": float(len(timed) / sum(walls)), "mean_output_tokens": float(timed["num_output_tokens"].mean()),
        "mean_prompt_tokens": float(timed["num_prompt_tokens"].mean()),
        **latency_percentiles(timed),
        "round_wall_s": [float(w) for w in walls], "round_start": round_start, "starts": len(set(round_start)),
        "interleaved": True, "start_sequence": sequence, "job_id": job_id,
        "num_drafts": drafts, "num_accepted_tokens": accepted,
        "mean_acceptance_length": (1 + accepted / drafts) if drafts else math.nan,
        "stream_off_tokens_per_s": float(statistics.median(tokens_off)) if tokens_off else math.nan,
        "stream_off_round_wall_s": [float(w) for w in off_walls], **guard.columns(), "hardware": "", "measured": True,
    }  # fmt: skip
    return pd.DataFrame([row])


def width_rows(cells: pd.DataFrame, requests: pd.DataFrame, slos: dict[str, dict[str, float]],
               seed: int) -> list[dict[str, Any]]:  # fmt: skip
    """Per SD arm and load: the throughput and goodput ratios' 95% intervals, starts resampled and
    rounds only (the same data, the same seeds)."""
    from sdbench.analysis.goodput import ROUNDS_ONLY, STARTS, add_goodput
    from sdbench.analysis.stats import ratio_interval

    out = []
    tables = {mode: add_goodput(cells, requests, slos, seed, resample=mode) for mode in (STARTS, ROUNDS_ONLY)}
    points = {mode: server_points(t).set_index(["method", "load"]) for mode, t in tables.items()}
    for mode, table in tables.items():
        base = table[table["sd_method"] == "none"].set_index("concurrency")
        for r in table[table["sd_method"] != "none"].itertuples(index=False):
            b = base.loc[r.concurrency]
            t_lo, t_hi = ratio_interval(np.asarray(r.tokens_per_s_boot), np.asarray(b["tokens_per_s_boot"]))
            p = points[mode].loc[(r.method, int(r.concurrency))]
            out.append({"method": r.method, "load": int(r.concurrency), "resample": mode, "pairing": r.pairing,
                        "speedup": r.tokens_per_s / b["tokens_per_s"], "speedup_ci_low": t_lo, "speedup_ci_high": t_hi,
                        "goodput_ratio": p["goodput_ratio"], "goodput_ratio_ci_low": p["goodput_ratio_ci_low"],
                        "goodput_ratio_ci_high": p["goodput_ratio_ci_high"]})  # fmt: skip
    return out


# The streaming client of a real server: run_level and read_metrics of sdbench.engine.serving.loadgen.
HTTP_CLIENT = SimpleNamespace(run_level=run_level, read_metrics=read_metrics)


def new_part() -> dict[str, Any]:
    """One arm's share of one load, filled start by start (:func:`measure_load`)."""
    return {"rows": [], "walls": [], "round_start": [], "sequence": [], "off_walls": [], "off_tokens": [],
            "drafts": 0, "accepted": 0, "guards": []}  # fmt: skip


def measure_load(server: Any, level: dict[str, Any], part: dict[str, Any], start: int, warmup: int, rounds: int,
                 num_requests: int, guard_mode: str, client: Any = HTTP_CLIENT) -> float:  # fmt: skip
    """Server start ``start``'s share of one load on a ready ``server`` (``base_url``, ``check_alive``),
    added to ``part``: warm-up requests, ``rounds`` timed streamed rounds, one stream-off control round,
    and the quiet-machine guard's report over the timed rounds and the control (as a server group's
    level: :func:`sdbench.engine.serving.servegroup.measure_start`). ``level``: :func:`run_level`'s
    arguments but the round's; returns the timed rounds' streamed tokens per second."""
    client.run_level(num_requests=warmup, round_=-1, **level)
    guard = QuietGuard(guard_mode)
    guard.start()
    before = client.read_metrics(server.base_url)
    streamed_tokens, streamed_s = 0, 0.0
    for _ in range(rounds):
        results, wall = client.run_level(num_requests=num_requests, round_=len(part["walls"]), **level)
        part["rows"] += [{**row, "start": start, "stream": True} for row in results_rows(results)]
        part["walls"].append(wall)
        part["round_start"].append(start)
        streamed_tokens += sum(r.num_output_tokens for r in results)
        streamed_s += wall
    delta = _counters_delta(client.read_metrics(server.base_url), before)
    part["drafts"] += delta["num_drafts"]
    part["accepted"] += delta["num_accepted_tokens"]
    off, wall = client.run_level(num_requests=num_requests, round_=1000 + len(part["off_walls"]), stream=False,
                                 **level)  # fmt: skip
    part["rows"] += [{**row, "start": start, "stream": False} for row in results_rows(off)]
    part["off_walls"].append(wall)
    part["off_tokens"].append(sum(r.num_output_tokens for r in off))
    server.check_alive()
    part["guards"].append(guard.stop())
    return streamed_tokens / streamed_s


def _cmd_bench_modes(args: argparse.Namespace) -> int:  # pragma: no cover - starts vLLM servers
    from sdbench.config import load_config
    from sdbench.datasets.prompttable import read_prompt_table

    config = load_config(args.config)
    methods = list(dict.fromkeys(["none", *args.methods]))
    if args.analyse_only:  # a finished measurement's directories: the report alone
        groups = [Path(args.output_dir) / m for m in methods]
        report(read_server_cells(groups), read_server_requests(groups), args, config)
        return 0
    for key, section in ((args.engine, "engines"), (args.model, "models"), *((m, "methods") for m in methods)):
        if key not in config[section]:
            raise ValueError(f"{section}.{key}: not in {args.config} (defined: {', '.join(sorted(config[section]))})")
    drafters = json.loads(args.drafters) if args.drafters else {}
    table = read_prompt_table(args.prompts).iloc[: args.num_prompts]
    prompts = [(str(r), [int(t) for t in ids]) for r, ids in zip(table["request_id"], table["prompt_token_ids"])]
    entry = config["datasets"][args.dataset]
    max_tokens = int(args.max_tokens or entry.get("max_tokens", 128))
    ignore_eos = bool(config.get("run", {}).get("ignore_eos", False))
    job_id = f"bench-modes-{int(time.time())}"
    # Flagged, never refused: refusing would end the bench and drop every start measured so far.
    guard_mode = "disabled" if mode_from_env() == "disabled" else "flag"
    order = start_order(methods, args.starts, True)
    parts: dict[tuple[str, int], dict[str, Any]] = {}
    out_dir = Path(args.output_dir)
    server_cpus, client_cpus = (None, None)
    for position, (start, method) in enumerate(order):
        spec = {"cell": {"batch_size": max(args.loads)}, "seed": config["seed"], "engine": config["engines"][args.engine],
                "model": config["models"][args.model], "method": config["methods"][method], "run": {}}  # fmt: skip
        server_cpus, client_cpus = cpu_placement(spec["engine"]) or (None, None)
        port = free_port()
        argv = server_argv(build_llm_kwargs(spec, args.model_dir, drafters.get(method)), spec["engine"]["vllm_version"],
                           port)  # fmt: skip
        log = out_dir / "logs" / f"{method}.start{start}.server.log"
        t0 = time.perf_counter()
        with ServerProcess(argv, server_env(spec["engine"], spec["method"]), log, port, cpus=server_cpus) as server:
            if client_cpus:
                os.sched_setaffinity(0, client_cpus)
            server.wait_ready(args.startup_timeout)
            startup = time.perf_counter() - t0
            for load in args.loads:
                part = parts.setdefault((method, load), new_part())
                part["sequence"].append(position)
                level = dict(base_url=server.base_url, prompts=prompts, max_tokens=max_tokens, concurrency=load,
                             ignore_eos=ignore_eos, model=SERVED_MODEL_NAME)  # fmt: skip
                streamed = measure_load(server, level, part, start, args.warmup, args.rounds,
                                        max(args.requests_per_level, load), guard_mode)  # fmt: skip
                print(f"start {start} {method:>10} c{load}: startup {startup:5.1f} s, streamed {streamed:7.1f} tok/s, "
                      f"stream off {part['off_tokens'][-1] / part['off_walls'][-1]:7.1f} tok/s, "
                      f"guard: {part['guards'][-1].columns()['contamination'] or 'quiet'}", flush=True)  # fmt: skip
    if client_cpus:
        os.sched_setaffinity(0, server_cpus | client_cpus)
    cells, requests = [], []
    for (method, load), part in parts.items():
        keys = {"engine": args.engine, "model": args.model, "dataset": args.dataset, "method": method, "concurrency": load}
        rows = pd.DataFrame(part["rows"]).assign(**keys)
        summary = arm_summary(keys, config["methods"][method], rows, part["walls"], part["round_start"],
                              part["sequence"], job_id, part["off_walls"], part["off_tokens"], part["drafts"],
                              part["accepted"], merge_reports(part["guards"]))  # fmt: skip
        cell_dir = out_dir / method / args.dataset / f"c{load}"
        write_parquet(rows, cell_dir / "requests.parquet")
        write_parquet(summary, cell_dir / "summary.parquet")
        cells.append(summary)
        requests.append(rows)
    report(pd.concat(cells, ignore_index=True), pd.concat(requests, ignore_index=True), args, config)
    return 0


def report(cells: pd.DataFrame, requests: pd.DataFrame, args: argparse.Namespace, config: dict[str, Any]) -> None:
    """The interval widths (starts vs rounds) and, with offline cells, the offline vs served table."""
    from sdbench.analysis.modeparity import modes_markdown, modes_table
    from sdbench.io import read_parquet

    base = cells[(cells["sd_method"] == "none")].sort_values("concurrency").iloc[0]
    timed = requests[(requests["method"] == "none") & (requests["concurrency"] == base["concurrency"]) & requests["stream"]]
    # DistServe's SLO scale 2 on no SD's unloaded latency: a target needing no choice.
    slo = {"ttft_ms": 2 * float(np.median(timed["ttft_s"])) * 1000,
           "tpot_ms": 2 * float(np.nanmedian(timed["tpot_s"])) * 1000}  # fmt: skip
    widths = pd.DataFrame(width_rows(cells, requests, {args.dataset: slo}, int(config["seed"])))
    lines = [f"Targets for goodput: TTFT {slo['ttft_ms']:.3g} ms, TPOT {slo['tpot_ms']:.3g} ms (2 x no SD's p50 at "
             f"concurrency {int(base['concurrency'])}).", "",
             "| method | load | draws | resampled | speedup [95%] | width | goodput ratio [95%] | width |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in widths.sort_values(["method", "load", "resample"]).itertuples(index=False):
        lines.append(f"| {r.method} | {r.load} | {r.pairing} | {r.resample} | {r.speedup:.3f} [{r.speedup_ci_low:.3f}, "
                     f"{r.speedup_ci_high:.3f}] | {r.speedup_ci_high - r.speedup_ci_low:.3f} | {r.goodput_ratio:.3f} "
                     f"[{r.goodput_ratio_ci_low:.3f}, {r.goodput_ratio_ci_high:.3f}] | "
                     f"{r.goodput_ratio_ci_high - r.goodput_ratio_ci_low:.3f} |")  # fmt: skip
    text = "\n".join(["# Interval widths: server starts resampled vs rounds only", "", *lines, ""])
    if args.offline_cells:
        offline = read_parquet(args.offline_cells, what="grid cells table")
        server = pd.concat([cells.reset_index(drop=True)], ignore_index=True)
        from sdbench.analysis.goodput import add_goodput

        server = add_goodput(server, requests, {args.dataset: slo}, int(config["seed"]))
        modes = modes_table(offline, server)
        if args.output:
            write_parquet(modes, args.output)
        text += "\n" + modes_markdown(modes, {m: config["methods"][m].get("label", m) for m in config["methods"]})
    print(text)
    if args.markdown:
        write_text(text, args.markdown)
