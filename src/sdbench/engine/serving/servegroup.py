"""One server job (sdbench.servermode): its arms' vLLM servers, every dataset x concurrency on each.

The job starts a server (:mod:`sdbench.engine.serving.server`) with the engine arguments an offline
cell of the same engine, model and method gets (``max_num_seqs`` = the largest concurrency),
waits for ``/health``, then per dataset and concurrency level: ``warmup_requests`` untimed
requests, then this start's share of the ``rounds`` timed rounds of ``requests_per_level``
requests at that concurrency (round r in start r % ``starts``;
:func:`sdbench.engine.serving.loadgen.run_level`), the server's SD counters read before and after, the
energy meter at each round's start and end, the quiet-machine guard watching; at a
``stream_control`` level one more round of the same requests with streaming off (a control, never
in the timed figures). It stops the server and starts the next one in
:func:`sdbench.servermode.start_order` (interleaved: start s of every arm before start s + 1). A
server is always stopped, its log kept; each arm's directory is assembled aside and renamed into
place only when every start is done, so a crash leaves the job failed with its log and no output
that looks complete.

Output, per arm and cell ``<dataset>/c<concurrency>/``: ``requests.parquet`` (one row per timed or
control request) and ``summary.parquet`` (one row, from the timed rounds of every start); columns
in docs/schema.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd

from sdbench.engine.measure.latencysummary import latency_percentiles
from sdbench.engine.site.hardware import engine_job, provenance
from sdbench.engine.serving.loadgen import RequestFailed, read_metrics, results_rows, run_level
from sdbench.engine.measure.counters import SDCounters, acceptance_stats
from sdbench.engine.measure.engine import build_llm_kwargs
from sdbench.engine.serving.server import (
    SERVED_MODEL_NAME,
    ServerError,
    ServerProcess,
    cpu_placement,
    free_port,
    server_argv,
    server_env,
)
from sdbench.io import atomic_dir, read_spec, write_parquet
from sdbench.rehearsal import is_rehearsal  # the package's __init__ only (standard library)
from sdbench.servermode import arm_spec, server_settings, start_order, start_rounds

log = logging.getLogger(__name__)


def cell_subdir(dataset: str, concurrency: int) -> str:
    """A server cell's directory inside its group's output."""
    return f"{dataset}/c{concurrency}"


def summarise_level(
    keys: dict[str, Any], requests: pd.DataFrame, walls: list[float], delta: Any, spec: dict[str, Any]
) -> pd.DataFrame:
    """The one-row summary of a server cell from its timed requests and rounds' wall times (in round order)."""
    per_round = requests.groupby("round")["num_output_tokens"].sum().to_numpy()
    tokens_per_s = per_round / np.asarray(walls)
    reqs_per_s = requests.groupby("round").size().to_numpy() / np.asarray(walls)
    method = spec["method"]
    row: dict[str, Any] = {
        **keys,
        "sd_method": method["method"],
        "num_speculative_tokens": int(method.get("num_speculative_tokens", 0)),
        "rounds": len(walls),
        "requests_per_round": int(len(requests) // max(len(walls), 1)),
        "tokens_per_s": float(np.median(tokens_per_s)),
        "tokens_per_s_min": float(tokens_per_s.min()),
        "tokens_per_s_max": float(tokens_per_s.max()),
        "requests_per_s": float(np.median(reqs_per_s)),
        "mean_output_tokens": float(requests["num_output_tokens"].mean()),
        "mean_prompt_tokens": float(requests["num_prompt_tokens"].mean()),
        **latency_percentiles(requests),  # TTFT, TPOT, E2E, ITL (sdbench.engine.measure.latencysummary)
        # Each round's wall time: goodput under the config's targets divides by it (sdbench latency).
        "round_wall_s": [float(w) for w in walls],
        "num_drafts": delta.num_drafts,
        "num_draft_tokens": delta.num_draft_tokens,
        "num_accepted_tokens": delta.num_accepted_tokens,
    }
    stats = acceptance_stats(delta)
    row["mean_acceptance_length"] = stats["mean_acceptance_length"]
    row["acceptance_rate"] = stats["acceptance_rate"]
    return pd.DataFrame([row])



def _prompt_list(prompts: pd.DataFrame, num_prompts: int) -> list[tuple[str, list[int], int | None]]:
    """(request id, token ids, the row's max_tokens or None) of the first ``num_prompts`` rows."""
    rows = prompts.iloc[:num_prompts]
    budgets = rows["max_tokens"] if "max_tokens" in rows else [None] * len(rows)
    return [
        (str(r), [int(t) for t in ids], None if b is None else int(b))
        for r, ids, b in zip(rows["request_id"], rows["prompt_token_ids"], budgets)
    ]


# The streaming client of a real server (a rehearsal brings its own: sdbench.rehearsal.serve).
HTTP_CLIENT = SimpleNamespace(run_level=run_level, read_metrics=read_metrics, measured=True)


@dataclass
class StartPart:
    """One server start's share of one cell: its timed rounds and its stream-off control."""

    start: int
    rows: list[dict[str, Any]]  # timed requests, each with its ``start`` and ``stream`` True
    walls: dict[int, float]  # round -> wall seconds
    energy_j: dict[int, float]  # round -> joules over the round (NaN: not metered)
    delta: SDCounters  # the server's SD counters over the timed rounds (not the control)
    report: Any  # the quiet guard's GuardReport over the level (control included)
    control_rows: list[dict[str, Any]] = field(default_factory=list)  # ``stream`` False
    control_walls: list[float] = field(default_factory=list)
    modelled_s: float = math.nan  # a rehearsal's modelled seconds of the level; NaN when measured


def measure_start(
    server: ServerProcess, spec: dict[str, Any], prompts: dict[str, pd.DataFrame], guard_mode: str,
    client: Any = HTTP_CLIENT, start: int = 0, meter: Any = None,
) -> dict[str, StartPart]:  # fmt: skip
    """Server start ``start``'s share of every dataset x concurrency cell of one arm (``spec``: an
    arm's, :func:`sdbench.servermode.arm_spec`) on a ready server; cell subdir -> its part.

    ``client`` sends a level's requests and reads the server's SD counters (``run_level``,
    ``read_metrics``, as :mod:`sdbench.engine.serving.loadgen`); ``meter`` (``read()`` in joules,
    :mod:`sdbench.engine.measure.energy`) is read at each timed round's start and end.
    """
    from sdbench.engine.measure.energy import NoMeter
    from sdbench.engine.site.quietguard import QuietGuard

    section, run = spec["server"], spec["run"]
    rounds, starts, _, control = server_settings(section)
    mine = start_rounds(rounds, starts, start)
    meter = meter if meter is not None else NoMeter("no meter given")
    out: dict[str, StartPart] = {}
    for dataset in sorted(spec["datasets"]):
        entry = spec["datasets"][dataset]
        plist = _prompt_list(prompts[dataset], int(entry["num_prompts"]))
        for concurrency in sorted(section["concurrency"]):
            n = max(int(section.get("requests_per_level", 16)), concurrency)
            level = dict(base_url=server.base_url, prompts=plist, max_tokens=int(entry["max_tokens"]),
                         concurrency=concurrency, ignore_eos=bool(run.get("ignore_eos", False)),
                         timeout_s=float(section.get("request_timeout_s", 600)), model=SERVED_MODEL_NAME)
            if hasattr(client, "level_s"):  # a rehearsal's modelled seconds: this start's level only
                client.level_s = 0.0
            warmup = int(section.get("warmup_requests", 2))
            if warmup:
                client.run_level(num_requests=warmup, round_=-1, **level)
            guard = QuietGuard(guard_mode)
            guard.start()
            before = client.read_metrics(server.base_url)
            part = StartPart(start, [], {}, {}, SDCounters(), None)
            for round_ in mine:
                joules = meter.read()
                results, wall = client.run_level(num_requests=n, round_=round_, **level)
                part.energy_j[round_] = meter.read() - joules
                server.check_alive()
                part.rows += [{**r, "start": start, "stream": True} for r in results_rows(results)]
                part.walls[round_] = wall
            part.delta = client.read_metrics(server.base_url) - before  # the timed rounds' counters only
            if concurrency in control:  # numbered after every timed round: one per start
                results, wall = client.run_level(num_requests=n, round_=rounds + start, stream=False, **level)
                server.check_alive()
                part.control_rows = [{**r, "start": start, "stream": False} for r in results_rows(results)]
                part.control_walls = [wall]
            part.report = guard.stop()  # raises Contaminated in refuse mode
            part.modelled_s = float(getattr(client, "level_s", math.nan))
            out[cell_subdir(dataset, concurrency)] = part
    return out


def _counters_sum(deltas: list[SDCounters]) -> SDCounters:
    """The SD counters of several starts' rounds together."""
    width = max((len(d.accepted_per_pos) for d in deltas), default=0)
    per_pos = [sum(d.accepted_per_pos[i] for d in deltas if i < len(d.accepted_per_pos)) for i in range(width)]
    return SDCounters(sum(d.num_drafts for d in deltas), sum(d.num_draft_tokens for d in deltas),
                      sum(d.num_accepted_tokens for d in deltas), tuple(per_pos))  # fmt: skip


def assemble_cell(
    keys: dict[str, Any], parts: list[StartPart], spec: dict[str, Any], measured: bool, job: dict[str, Any]
) -> dict[str, pd.DataFrame]:
    """A cell's tables from its starts' parts: the summary from the timed rounds of every start
    (in round order), the control rounds beside them; ``job``: the arm's job-level summary columns
    (``starts``, ``interleaved``, ``start_sequence``, ``job_id``, ``energy_meter``, ``energy_reason``,
    ``server_startup_s``)."""
    from sdbench.engine.site.quietguard import merge_reports

    parts = sorted(parts, key=lambda p: p.start)
    walls = {r: w for p in parts for r, w in p.walls.items()}
    order = sorted(walls)
    timed = pd.DataFrame([r for p in parts for r in p.rows]).sort_values(["round", "index"], kind="stable")
    report = merge_reports([p.report for p in parts])
    summary = summarise_level(keys, timed, [walls[r] for r in order], _counters_sum([p.delta for p in parts]), spec)
    control = [r for p in parts for r in p.control_rows]
    control_walls = [w for p in parts for w in p.control_walls]
    control_tokens = pd.DataFrame(control).groupby("round")["num_output_tokens"].sum().to_numpy() if control else []
    columns = {
        **report.columns(),
        **provenance(gpus=measured and spec.get("engine", {}).get("device") != "cpu", server=True,
                     rehearsal=not measured),  # fmt: skip
        "measured": measured,
        # A rehearsal's modelled seconds of the cell (warm-ups, rounds, controls); NaN when measured.
        "modelled_s": float(sum(p.modelled_s for p in parts)),
        **job,
        "round_start": [next(p.start for p in parts if r in p.walls) for r in order],
        "round_energy_j": [float(next(p.energy_j[r] for p in parts if r in p.walls)) for r in order],
        "stream_off_tokens_per_s": float(np.median(np.asarray(control_tokens) / np.asarray(control_walls)))
        if control_walls else math.nan,
        "stream_off_round_wall_s": [float(w) for w in control_walls],
    }
    for name, value in columns.items():
        summary[name] = [value]
    requests = pd.concat([timed, pd.DataFrame(control)], ignore_index=True) if control else timed.reset_index(drop=True)
    for i, (k, v) in enumerate(keys.items()):
        requests.insert(i, k, v)
    requests = requests.assign(contaminated=report.contaminated, measured=measured)
    return {"requests": requests, "summary": summary}


def assemble_arm(
    spec: dict[str, Any], parts: dict[str, list[StartPart]], measured: bool, job: dict[str, Any]
) -> dict[str, dict[str, pd.DataFrame]]:
    """Every cell of one arm (``spec``: the arm's) from its starts' parts; cell subdir -> tables."""
    group = spec["group"]
    out = {}
    for sub, cell_parts in sorted(parts.items()):
        dataset, level = sub.rsplit("/c", 1)
        keys = {"engine": group["engine"], "model": group["model"], "dataset": dataset, "method": group["method"],
                "concurrency": int(level)}  # fmt: skip
        out[sub] = tables = assemble_cell(keys, cell_parts, spec, measured, job)
        summary = tables["summary"]
        log.info(
            "cell %s c=%s: %.1f output tok/s, TPOT p50 %.1f ms, acceptance length %s",
            dataset, level, summary.at[0, "tokens_per_s"], summary.at[0, "tpot_p50_ms"],
            "n/a" if math.isnan(summary.at[0, "mean_acceptance_length"]) else f"{summary.at[0, 'mean_acceptance_length']:.2f}",
        )
    return out


def measure_levels(
    server: ServerProcess, spec: dict[str, Any], prompts: dict[str, pd.DataFrame], guard_mode: str,
    client: Any = HTTP_CLIENT,
) -> dict[str, dict[str, pd.DataFrame]]:  # fmt: skip
    """Every cell of a one-start arm on one ready server, as tables (cell subdir -> tables)."""
    parts = measure_start(server, spec, prompts, guard_mode, client)
    job = {"starts": 1, "interleaved": False, "start_sequence": [0], "job_id": "", "energy_meter": "none",
           "energy_reason": "no meter given", "server_startup_s": server.startup_s}  # fmt: skip
    return assemble_arm(spec, {sub: [p] for sub, p in parts.items()}, client.measured, job)


def job_id_of(group: dict[str, Any], started: float) -> str:
    """An id shared by every arm of one job: its keys and the wall-clock second it started."""
    return hashlib.sha256(json.dumps([group, round(started)], sort_keys=True).encode()).hexdigest()[:16]


def run_server_group(
    spec: dict[str, Any],
    prompts: dict[str, pd.DataFrame],
    model_dir: str,
    drafter_dirs: dict[str, str | None],
    output_dirs: dict[str, str | Path],
    server_log: str | Path,
    guard_mode: str = "flag",
) -> None:
    """Start every arm's server ``starts`` times in :func:`sdbench.servermode.start_order`, measure
    each start's share of every cell, stop it; write each arm's directory (``output_dirs``, by
    method) atomically once all are done. Every server appends to ``server_log``.

    Raises :class:`ServerError` (with the server log's tail) if a server fails to start or dies
    during a cell; then nothing is written.
    """
    from sdbench.engine.measure.energy import NoMeter, engine_meter

    methods = list(spec["group"]["methods"])
    _, starts, interleave, _ = server_settings(spec["server"])
    order = start_order(methods, starts, interleave)
    rehearsed = is_rehearsal(spec)
    meter = NoMeter("rehearsal: nothing ran to meter") if rehearsed else engine_meter(spec)
    job_id = job_id_of(spec["group"], time.time())
    parts: dict[str, dict[str, list[StartPart]]] = {m: {} for m in methods}
    startups: dict[str, list[float]] = {m: [] for m in methods}
    argvs: dict[str, list[str]] = {}
    engines: dict[str, Any] = {}
    client_cpus = None
    Path(server_log).parent.mkdir(parents=True, exist_ok=True)
    for position, (start, method) in enumerate(order):
        aspec = arm_spec(spec, method)
        kwargs = build_llm_kwargs(server_cell_spec(aspec), model_dir, drafter_dirs.get(method))
        with open(server_log, "a") as out:
            out.write(f"=== sdbench: server start {position} of the job: {method}, its start {start} ===\n")
        if rehearsed:  # no server: the rehearsal engine serves the levels (sdbench.rehearsal.serve)
            from sdbench import rehearsal
            from sdbench.engine.measure.engine import start_rehearsal_engine

            if method not in engines:
                engines[method] = start_rehearsal_engine(server_cell_spec(aspec), model_dir, drafter_dirs.get(method),
                                                         prompts)  # fmt: skip
            argvs[method] = server_argv(kwargs, spec["engine"]["vllm_version"], 0)[1:]
            client = rehearsal.module("serve").RehearsalClient(engines[method], server_log)
            found = measure_start(client, aspec, prompts, guard_mode, client=client, start=start, meter=meter)
            startups[method].append(engines[method].startup_s)
        else:
            port = free_port()
            argv = server_argv(kwargs, spec["engine"]["vllm_version"], port)
            argvs[method] = argv[1:]
            log.info("server %d (%s, start %d): %s", position, method, start, " ".join(argv))
            server_cpus, client_cpus = cpu_placement(spec["engine"]) or (None, None)
            env = server_env(spec["engine"], aspec["method"], int(spec["model"].get("tensor_parallel_size", 1)))
            with ServerProcess(argv, env, server_log, port, cpus=server_cpus) as server:
                if client_cpus:
                    os.sched_setaffinity(0, client_cpus)
                    log.info("cores: server %s, client %s (engine.server.cpu_placement)", sorted(server_cpus), sorted(client_cpus))
                startup = server.wait_ready(float(spec["server"].get("startup_timeout_s", 600)))
                log.info("server ready after %.1f s (pid %d, port %d)", startup, server.proc.pid, port)
                try:
                    found = measure_start(server, aspec, prompts, guard_mode, client=HTTP_CLIENT, start=start, meter=meter)
                except (RequestFailed, OSError) as exc:  # a request or /metrics failed
                    server.check_alive(grace_s=10.0)  # a dead server is the cause: say so, with its log
                    raise ServerError(f"{exc} (server still running; its log: {server.log_path})") from exc
            startups[method].append(startup)
        for sub, part in found.items():
            parts[method].setdefault(sub, []).append(part)
    measured = not rehearsed
    for method in methods:
        aspec = arm_spec(spec, method)
        job = {
            "starts": starts, "interleaved": bool(interleave and len(methods) > 1),
            "start_sequence": [i for i, (_, m) in enumerate(order) if m == method], "job_id": job_id,
            "energy_meter": str(getattr(meter, "kind", "")), "energy_reason": str(getattr(meter, "reason", "")),
            "server_startup_s": startups[method][0],  # its first start's (server.json has every one)
        }  # fmt: skip
        tables = assemble_arm(aspec, parts[method], measured, job)
        meta = {"argv": argvs[method], "startup_s": startups[method][0], "startups_s": startups[method],
                "group": aspec["group"], "job_id": job_id, "start_order": [list(o) for o in order],
                "cores": {"server": sorted(server_cpus or []) if not rehearsed else [],
                          "client": sorted(client_cpus or [])}}  # fmt: skip
        total = None
        if rehearsed:
            meta["rehearsal"] = True
            total = (sum(startups[method]), engines[method].llm.modelled_s)
        _write_group(output_dirs[method], tables, meta, total)


def server_cell_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The offline cell spec whose engine arguments the group's server gets (its largest concurrency)."""
    cell_spec = {
        "cell": {"batch_size": max(spec["server"]["concurrency"])},
        "seed": spec["seed"], "engine": spec["engine"], "model": spec["model"],
        "method": spec["method"], "run": spec["run"],
    }  # fmt: skip
    for key in ("engine_mode", "rehearsal"):
        if key in spec:
            cell_spec[key] = spec[key]
    return cell_spec


def _write_group(
    output_dir: str | Path, tables: dict[str, dict[str, pd.DataFrame]], meta: dict[str, Any],
    total: tuple[float, float] | None = None,
) -> None:  # fmt: skip
    """The group's directory, atomically: every cell's tables and ``server.json`` (and a rehearsal's total)."""
    with atomic_dir(output_dir) as tmp:
        for sub, frames in sorted(tables.items()):
            for name, frame in frames.items():
                write_parquet(frame, tmp / sub / f"{name}.parquet")
        (tmp / "server.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        if total is not None:
            from sdbench import rehearsal

            rehearsal.module("totals").write_job_total(tmp, "server", total[0], total[1], len(tables))


@engine_job
def _cmd_serve_group(args: argparse.Namespace) -> int:
    from sdbench.lifeline import watch_workflow
    from sdbench.engine.site.quietguard import Contaminated, mode_from_env

    watch_workflow()
    spec = read_spec(args.spec)
    paths = json.loads(args.prompts)
    missing = sorted(set(spec["datasets"]) - set(paths))
    if missing:
        raise ValueError(f"--prompts: no prompt table for dataset(s) {', '.join(missing)}")
    from sdbench.engine.site.preflight import preflight

    methods = list(spec["group"]["methods"])
    if len(args.output_dir) != len(methods):
        raise ValueError(f"--output-dir: {len(args.output_dir)} given for {len(methods)} arm(s) ({', '.join(methods)}): "
                         "one per arm, in the spec's order")
    drafters = json.loads(args.drafters) if args.drafters else {}
    if args.drafter_dir and len(methods) == 1:
        drafters.setdefault(methods[0], args.drafter_dir)
    for method in methods:  # every arm's inputs checked before the first server starts
        prompts = {d: preflight(arm_spec(spec, method), paths[d], args.model_dir, drafters.get(method))
                   for d in sorted(spec["datasets"])}  # fmt: skip
    try:
        run_server_group(
            spec, prompts, args.model_dir, drafters, dict(zip(methods, args.output_dir)), args.server_log,
            args.quiet_guard or mode_from_env(),
        )
    except ServerError as exc:  # the cell fails with the server's log attached; no output written
        print(f"error: {exc}", file=sys.stderr)
        return 4
    except Contaminated as exc:  # refuse mode: no output; a cluster retries the job
        print(f"error: {exc}", file=sys.stderr)
        return 3
    return 0
