"""One server group (sdbench.servermode): one vLLM server, every dataset x concurrency on it.

The job starts the server (:mod:`sdbench.engine.server`) with the engine arguments an offline
cell of the same engine, model and method gets (``max_num_seqs`` = the largest concurrency),
waits for ``/health``, then per dataset and concurrency level: ``warmup_requests`` untimed
requests, then ``rounds`` timed rounds of ``requests_per_level`` requests at that
concurrency (:func:`sdbench.engine.loadgen.run_level`), the server's SD counters read before
and after, the quiet-machine guard watching. The server is always stopped, its log kept;
the output directory is assembled aside and renamed into place only when every cell is done,
so a crash leaves the job failed with its log and no output that looks complete.

Output, per cell ``<dataset>/c<concurrency>/``: ``requests.parquet`` (one row per timed
request) and ``summary.parquet`` (one row); columns in docs/schema.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd

from sdbench.engine.latencysummary import latency_percentiles
from sdbench.engine.hardware import engine_job, provenance
from sdbench.engine.loadgen import RequestFailed, read_metrics, results_rows, run_level
from sdbench.engine.counters import acceptance_stats
from sdbench.engine.engine import build_llm_kwargs
from sdbench.engine.server import (
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

log = logging.getLogger(__name__)


def cell_subdir(dataset: str, concurrency: int) -> str:
    """A server cell's directory inside its group's output."""
    return f"{dataset}/c{concurrency}"


def summarise_level(
    keys: dict[str, Any], requests: pd.DataFrame, walls: list[float], delta: Any, spec: dict[str, Any]
) -> pd.DataFrame:
    """The one-row summary of a server cell from its timed requests and rounds' wall times."""
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
        **latency_percentiles(requests),  # TTFT, TPOT, E2E, ITL (sdbench.engine.latencysummary)
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


def measure_levels(
    server: ServerProcess, spec: dict[str, Any], prompts: dict[str, pd.DataFrame], guard_mode: str,
    client: Any = HTTP_CLIENT,
) -> dict[str, dict[str, pd.DataFrame]]:  # fmt: skip
    """Every dataset x concurrency cell of the group on a ready server; cell subdir -> tables.

    ``client`` sends a level's requests and reads the server's SD counters (``run_level``,
    ``read_metrics``, as :mod:`sdbench.engine.loadgen`); its ``measured`` goes into every table.
    """
    from sdbench.engine.quietguard import QuietGuard

    section, run = spec["server"], spec["run"]
    group = spec["group"]
    out: dict[str, dict[str, pd.DataFrame]] = {}
    for dataset in sorted(spec["datasets"]):
        entry = spec["datasets"][dataset]
        plist = _prompt_list(prompts[dataset], int(entry["num_prompts"]))
        for concurrency in sorted(section["concurrency"]):
            keys = {"engine": group["engine"], "model": group["model"], "dataset": dataset,
                    "method": group["method"], "concurrency": int(concurrency)}
            n = max(int(section.get("requests_per_level", 16)), concurrency)
            level = dict(base_url=server.base_url, prompts=plist, max_tokens=int(entry["max_tokens"]),
                         concurrency=concurrency, ignore_eos=bool(run.get("ignore_eos", False)),
                         timeout_s=float(section.get("request_timeout_s", 600)), model=SERVED_MODEL_NAME)
            warmup = int(section.get("warmup_requests", 2))
            if warmup:
                client.run_level(num_requests=warmup, round_=-1, **level)
            guard = QuietGuard(guard_mode)
            guard.start()
            before = client.read_metrics(server.base_url)
            rows, walls = [], []
            for round_ in range(int(section.get("rounds", 2))):
                results, wall = client.run_level(num_requests=n, round_=round_, **level)
                server.check_alive()
                rows += results_rows(results)
                walls.append(wall)
            delta = client.read_metrics(server.base_url) - before
            report = guard.stop()  # raises Contaminated in refuse mode
            requests = pd.DataFrame(rows)
            for i, (k, v) in enumerate(keys.items()):
                requests.insert(i, k, v)
            summary = summarise_level(keys, requests, walls, delta, spec).assign(
                server_startup_s=server.startup_s, **report.columns(), **provenance(gpus=client.measured and spec.get("engine", {}).get("device") != "cpu", server=True,
                                      rehearsal=not client.measured), measured=client.measured,
                # A rehearsal's modelled seconds of the cell (warm-up and rounds); NaN when measured.
                modelled_s=getattr(client, "level_s", float("nan")),
            )
            requests = requests.assign(contaminated=report.contaminated, measured=client.measured)
            log.info(
                "cell %s c=%d: %.1f output tok/s, TPOT p50 %.1f ms, acceptance length %s",
                dataset, concurrency, summary.at[0, "tokens_per_s"], summary.at[0, "tpot_p50_ms"],
                "n/a" if math.isnan(summary.at[0, "mean_acceptance_length"]) else f"{summary.at[0, 'mean_acceptance_length']:.2f}",
            )
            out[cell_subdir(dataset, concurrency)] = {"requests": requests, "summary": summary}
    return out


def run_server_group(
    spec: dict[str, Any],
    prompts: dict[str, pd.DataFrame],
    model_dir: str,
    drafter_dir: str | None,
    output_dir: str | Path,
    server_log: str | Path,
    guard_mode: str = "flag",
) -> None:
    """Start the group's server, measure every cell, stop it; write the group directory atomically.

    Raises :class:`ServerError` (with the server log's tail) if the server fails to start or
    dies during a cell; then nothing is written.
    """
    cell_spec = server_cell_spec(spec)
    kwargs = build_llm_kwargs(cell_spec, model_dir, drafter_dir)
    if is_rehearsal(spec):  # no server: the rehearsal engine serves the levels (sdbench.rehearsal.serve)
        from sdbench import rehearsal
        from sdbench.engine.engine import start_rehearsal_engine

        engine = start_rehearsal_engine(cell_spec, model_dir, drafter_dir, prompts)
        Path(server_log).parent.mkdir(parents=True, exist_ok=True)
        Path(server_log).write_text("rehearsal: no server ran; the rehearsal engine served every level\n")
        client = rehearsal.module("serve").RehearsalClient(engine, server_log)
        tables = measure_levels(client, spec, prompts, guard_mode, client=client)  # type: ignore[arg-type]
        meta = {"argv": server_argv(kwargs, spec["engine"]["vllm_version"], 0)[1:], "startup_s": engine.startup_s,
                "group": spec["group"], "cores": {"server": [], "client": []}, "rehearsal": True}  # fmt: skip
        _write_group(output_dir, tables, meta, (engine.startup_s, engine.llm.modelled_s))
        return
    port = free_port()
    argv = server_argv(kwargs, spec["engine"]["vllm_version"], port)
    log.info("server: %s", " ".join(argv))
    server_cpus, client_cpus = cpu_placement(spec["engine"]) or (None, None)
    env = server_env(spec["engine"], spec["method"], int(spec["model"].get("tensor_parallel_size", 1)))
    with ServerProcess(argv, env, server_log, port, cpus=server_cpus) as server:
        if client_cpus:
            os.sched_setaffinity(0, client_cpus)
            log.info("cores: server %s, client %s (engine.server.cpu_placement)", sorted(server_cpus), sorted(client_cpus))
        startup = server.wait_ready(float(spec["server"].get("startup_timeout_s", 600)))
        log.info("server ready after %.1f s (pid %d, port %d)", startup, server.proc.pid, port)
        try:
            tables = measure_levels(server, spec, prompts, guard_mode)
        except (RequestFailed, OSError) as exc:  # a request or /metrics failed
            server.check_alive(grace_s=10.0)  # a dead server is the cause: say so, with its log
            raise ServerError(f"{exc} (server still running; its log: {server.log_path})") from exc
    _write_group(output_dir, tables, {"argv": argv[1:], "startup_s": startup, "group": spec["group"],
                                      "cores": {"server": sorted(server_cpus or []), "client": sorted(client_cpus or [])}})


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
    from sdbench.engine.quietguard import Contaminated, mode_from_env

    watch_workflow()
    spec = read_spec(args.spec)
    paths = json.loads(args.prompts)
    missing = sorted(set(spec["datasets"]) - set(paths))
    if missing:
        raise ValueError(f"--prompts: no prompt table for dataset(s) {', '.join(missing)}")
    from sdbench.engine.preflight import preflight

    prompts = {d: preflight(spec, paths[d], args.model_dir, args.drafter_dir) for d in sorted(spec["datasets"])}
    try:
        run_server_group(
            spec, prompts, args.model_dir, args.drafter_dir, args.output_dir, args.server_log,
            args.quiet_guard or mode_from_env(),
        )
    except ServerError as exc:  # the cell fails with the server's log attached; no output written
        print(f"error: {exc}", file=sys.stderr)
        return 4
    except Contaminated as exc:  # refuse mode: no output; a cluster retries the job
        print(f"error: {exc}", file=sys.stderr)
        return 3
    return 0
