"""Server mode: a real vLLM server (CPU build) started, driven, crashed and stopped.

Unit tests cover the pieces (metrics parsing, command line, summaries, config checks, cost);
the slow tests run the real pipeline on `.test/config/server.yaml` (Snakemake, real vLLM
behind its OpenAI-compatible server), kill a server in the middle of its cells, and compare
the client with `vllm bench serve`.
"""

from __future__ import annotations

import copy
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from sdbench.analysis.latency import latency_table
from sdbench.config import ConfigError, validate_config
from sdbench.engine.serving.loadgen import parse_sd_counters
from sdbench.engine.serving.server import ServerError, ServerProcess, server_argv
from sdbench.engine.serving.servegroup import summarise_level
from sdbench.engine.measure.counters import SDCounters
from sdbench.servermode import ServerGroup, arm_spec, resolve_server_group, server_groups

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CONFIG = REPO / ".test" / "config" / "server.yaml"

METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="sdbench-target"} 60.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="sdbench-target"} 180.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="sdbench-target"} 156.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="sdbench-target",position="0"} 58.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="sdbench-target",position="2"} 47.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="sdbench-target",position="1"} 51.0
vllm:spec_decode_num_drafts_created 1.7e9
vllm:num_requests_running{engine="0"} 0.0
"""


def test_sd_counters_from_the_prometheus_text() -> None:
    c = parse_sd_counters(METRICS)
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (60, 180, 156)
    assert c.accepted_per_pos == (58, 51, 47)
    assert parse_sd_counters("# no SD\nvllm:num_requests_running 0\n") == SDCounters(0, 0, 0, ())


class _Stream:
    """A streamed completion as the server sends it: server-sent events split across reads."""

    def __init__(self, events: list[str]) -> None:
        self.status, self.content = 200, self
        self.raw = "".join(f"data: {e}\n\n" for e in events).encode()

    async def iter_any(self) -> AsyncIterator[bytes]:  # as aiohttp's StreamReader.iter_any
        for i in range(0, len(self.raw), 7):  # events cut mid-line: the client must reassemble them
            yield self.raw[i : i + 7]

    async def __aenter__(self) -> _Stream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


def test_the_client_times_ttft_tpot_and_chunk_gaps_as_vllm_bench_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's ``calculate_metrics`` (vllm/benchmarks/serve.py): TPOT = (latency - TTFT) / (output
    tokens - 1). Three chunks carry five tokens (SD accepts several a step); the clock reads 100.0 at
    the send, 100.25, 100.5 and 101.0 at the chunks, 101.25 at the end of the stream."""
    import asyncio
    from types import SimpleNamespace

    from sdbench.engine.serving import loadgen

    def timed(clock: list[float], events: list[str]) -> loadgen.RequestResult:
        monkeypatch.setattr(loadgen, "time", SimpleNamespace(perf_counter=iter(clock).__next__))
        session = SimpleNamespace(post=lambda url, json: _Stream(events))
        payload = loadgen._payload([1, 2, 3], 8, False, "m")
        return asyncio.run(loadgen._one(session, "u", payload, 99.5, 0, 0, "r0"))

    chunk = '{"choices": [{"text": "x"}]}'
    usage = '{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": %d}}'
    r = timed([100.0, 100.25, 100.5, 101.0, 101.25], [chunk] * 3 + [usage % 5, "[DONE]"])
    assert (r.ttft_s, r.latency_s, r.start_s) == (0.25, 1.25, 0.5)
    assert r.tpot_s == pytest.approx((1.25 - 0.25) / (5 - 1))  # 0.25 s per token after the first
    assert (r.num_output_tokens, r.num_chunks, r.chunk_gaps_s) == (5, 3, [0.25, 0.5])
    # One output token: no time per token (vLLM counts it 0 for goodput; the table keeps NaN).
    one = timed([100.0, 100.25, 100.5], [chunk, usage % 1, "[DONE]"])
    assert math.isnan(one.tpot_s) and (one.ttft_s, one.latency_s) == (0.25, 0.5)


def test_server_command_line_spells_engine_arguments_as_flags() -> None:
    kwargs = {"model": "/m", "enforce_eager": True, "enable_prefix_caching": False, "disable_log_stats": False,
              "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}, "max_num_seqs": 4,
              "per_request_spec_decode_metrics": "summary", "seed": 42}  # fmt: skip
    argv = server_argv(kwargs, "0.32.0", 8123, python="py")
    assert argv[:3] == ["py", "-m", "vllm.entrypoints.launchers.api_server.entry"]
    assert argv[argv.index("--port") + 1] == "8123" and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert "--enforce-eager" in argv and "--no-enable-prefix-caching" in argv
    assert argv[argv.index("--speculative-config") + 1] == '{"method": "ngram", "num_speculative_tokens": 3}'
    assert argv[argv.index("--max-num-seqs") + 1] == "4"
    # LLM()-only settings have no server flag.
    assert not any("disable-log-stats" in a or "per-request" in a for a in argv)
    assert server_argv(kwargs, "0.11.1", 1, python="py")[2] == "vllm.entrypoints.openai.api_server"


def test_level_summary_percentiles_throughput_and_acceptance() -> None:
    requests = pd.DataFrame({
        "round": [0, 0, 1, 1], "num_output_tokens": [10, 30, 20, 20], "num_prompt_tokens": [5, 5, 5, 5],
        "ttft_s": [0.1, 0.2, 0.3, 0.4], "tpot_s": [0.01, 0.02, np.nan, 0.04], "latency_s": [1.0, 2.0, 3.0, 4.0],
    })  # fmt: skip
    spec = {"method": {"method": "ngram", "num_speculative_tokens": 3}}
    s = summarise_level({"concurrency": 2}, requests, [2.0, 4.0], SDCounters(10, 30, 15, (6, 5, 4)), spec).iloc[0]
    assert s["tokens_per_s"] == pytest.approx(np.median([40 / 2.0, 40 / 4.0]))
    assert (s["tokens_per_s_min"], s["tokens_per_s_max"]) == (10.0, 20.0)
    assert s["tpot_p50_ms"] == pytest.approx(20.0)  # NaN (one-token outputs) left out
    assert s["ttft_p50_ms"] == pytest.approx(250.0)
    assert s["mean_acceptance_length"] == pytest.approx(2.5) and s["acceptance_rate"] == pytest.approx(0.5)
    assert s["rounds"] == 2 and s["requests_per_round"] == 2
    assert s["round_wall_s"] == [2.0, 4.0]  # goodput divides by them (sdbench latency)


def _config() -> dict:
    return yaml.safe_load(CONFIG.read_text())


def test_server_groups_and_their_specs() -> None:
    config = validate_config(_config())
    groups = server_groups(config)
    if config["server"].get("interleave"):  # one job, every method an arm
        assert groups == [ServerGroup("vllm-cpu", "tiny-target", ("none", "ngram-k3"), True)]
    else:
        assert groups == [ServerGroup("vllm-cpu", "tiny-target", ("ngram-k3",)), ServerGroup("vllm-cpu", "tiny-target", ("none",))]
    spec = resolve_server_group(config, groups[0])
    assert spec["server"]["concurrency"] == [1, 2] and spec["datasets"] == {"code-edit": {"max_tokens": 32, "num_prompts": 2}}
    arm = arm_spec(spec, "ngram-k3")
    assert arm["drafter"] is None and arm["method"]["method"] == "ngram" and arm["group"]["method"] == "ngram-k3"
    # Editing the server section changes every group's spec (a param: reruns them), a grid-only
    # setting does not.
    other = validate_config({**_config(), "run": {**_config()["run"], "repeats": 5}})
    assert resolve_server_group(other, groups[0]) == spec
    assert server_groups(validate_config({k: v for k, v in _config().items() if k != "server"})) == []


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["server"].update(methods=["none", "ngram-k9"]), "server.methods[1]: unknown method 'ngram-k9'"),
        (lambda c: c["server"].update(engine="vllm-gpu"), "server.engine: unknown engine 'vllm-gpu'"),
        (lambda c: c["server"].update(concurrency=[0]), "server.concurrency[0]: 0 is less than the minimum of 1"),
        (lambda c: c["server"].update(datasets=["sharegpt"]), "server.datasets[0]: unknown dataset 'sharegpt'"),
        (lambda c: c["cost"]["price_per_device_hour"].clear() or c["cost"]["price_per_device_hour"].update(x=1.0),
         "no price for engine 'vllm-cpu' (server)"),
        (lambda c: c["methods"].update(sfx={"method": "suffix", "num_speculative_tokens": 8})
         or c["server"].update(methods=["sfx"]), "server.methods[0]: 'sfx' on engine 'vllm-cpu'"),
    ],
)
def test_bad_server_section_is_refused_naming_the_key(edit, message: str) -> None:
    config = copy.deepcopy(_config())
    edit(config)
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_config(config)


def test_latency_table_costs_per_concurrency() -> None:
    cells = pd.DataFrame({
        "engine": ["e", "e"], "model": ["m", "m"], "dataset": ["d", "d"], "method": ["none", "none"],
        "concurrency": [1, 4], "tokens_per_s": [100.0, 400.0], "tokens_per_s_min": [90.0, 360.0],
        "tokens_per_s_max": [110.0, 440.0], "mean_output_tokens": [50.0, 50.0],
    })  # fmt: skip
    t = latency_table(cells, {"e": 3.6}, {"m": 2}, "USD")
    # 7.2 per hour for two devices; 100 tokens/s = 360k tokens/h -> 20 per 1M tokens.
    assert t["cost_per_1m_tokens"].tolist() == pytest.approx([20.0, 5.0])
    assert t["cost_per_request"].tolist() == pytest.approx([20.0 * 50 / 1e6, 5.0 * 50 / 1e6])
    assert t["tokens_per_s_per_device"].tolist() == [50.0, 200.0]
    assert t.loc[0, "cost_per_1m_tokens_min"] < 20.0 < t.loc[0, "cost_per_1m_tokens_max"]
    with pytest.raises(ValueError, match="no price for engine"):
        latency_table(cells, {}, {}, "USD")


def test_a_server_that_exits_at_once_fails_with_its_log(tmp_path: Path) -> None:
    """A stand-in process (no vLLM needed) that prints and exits: the readiness probe reports
    its exit code and the log's last lines instead of waiting for the timeout."""
    argv = [sys.executable, "-c", "print('boom: no such model'); raise SystemExit(3)"]
    log = tmp_path / "server.log"
    with pytest.raises(ServerError, match=r"exited with code 3(.|\n)*boom: no such model"):
        with ServerProcess(argv, dict(os.environ), log, 1) as server:
            server.wait_ready(30)
    assert "boom" in log.read_text()


def test_readiness_times_out_and_the_process_group_is_killed(tmp_path: Path) -> None:
    """A stand-in that never answers /health and ignores SIGTERM, with a child of its own."""
    code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)")  # fmt: skip
    server = ServerProcess([sys.executable, "-c", code], dict(os.environ), tmp_path / "s.log", 9, grace_s=1.0)
    with pytest.raises(ServerError, match="did not answer"):
        with server:
            server.wait_ready(2, poll_s=0.2)
    pgid = server.proc.pid
    time.sleep(0.5)
    alive = [p for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == pgid]
    assert alive == [], "a process of the server's group outlived stop()"


def _pgid(pid: int) -> int | None:
    """Process group of a live process (None for a zombie or a process that is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[2])


# --- Real vLLM server on CPU ------------------------------------------------------------


def _server_processes(marker: str) -> list[int]:
    """Live vLLM server processes whose command line mentions ``marker`` (a work dir's path)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if "api_server" in cmd and marker in cmd and state != "Z":
            found.append(int(entry))
    return found


def _snakemake(workdir: Path, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    cmd = [str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(CONFIG), "--cores", "2", *args]  # fmt: skip
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_target_build: Path) -> Path:
    """The server-mode outputs of the test config, made by the real pipeline (the tiny target as
    the session built it: support/tinybuild.py)."""
    from support.tinybuild import seed

    workdir = tmp_path_factory.mktemp("server")
    seed(workdir, tiny_target_build, CONFIG)
    done = _snakemake(workdir, "results/paper/ext11_latency_throughput.md")
    assert done.returncode == 0, done.stderr[-4000:]
    return workdir


@pytest.mark.slow
def test_server_mode_measures_every_cell_and_stops_its_servers(served: Path) -> None:
    table = pd.read_parquet(served / "results/tables/server.parquet")
    assert sorted(zip(table["method"], table["concurrency"])) == [("ngram-k3", 1), ("ngram-k3", 2), ("none", 1), ("none", 2)]
    assert (table["requests_per_round"] == 4).all() and (table["rounds"] == 2).all()
    assert (table["tokens_per_s"] > 0).all() and (table["tpot_p50_ms"] >= 0).all()
    sd = table[table["method"] == "ngram-k3"]
    assert (sd["num_drafts"] > 0).all() and (sd["mean_acceptance_length"] > 1).all()
    assert table.loc[table["method"] == "none", "num_drafts"].eq(0).all()
    requests = pd.read_parquet(served / "results/server/vllm-cpu/tiny-target/ngram-k3/code-edit/c2/requests.parquet")
    assert len(requests) == 8 and (requests["num_output_tokens"] > 0).all()
    # Two starts per arm, interleaved A B B A (none, n-gram, n-gram, none), one timed round each.
    assert requests.groupby("round")["start"].unique().map(list).to_dict() == {0: [0], 1: [1]}
    assert (table["starts"] == 2).all() and table["interleaved"].all() and table["job_id"].nunique() == 1
    assert {m: list(s) for m, s in zip(table["method"], table["start_sequence"])} == {"none": [0, 3], "ngram-k3": [1, 2]}
    assert all(list(r) == [0, 1] for r in table["round_start"]) and table["energy_meter"].notna().all()
    # The stream-off control at concurrency 1: a round per start after the timed ones, not in the figures.
    control = pd.read_parquet(served / "results/server/vllm-cpu/tiny-target/ngram-k3/code-edit/c1/requests.parquet")
    off = control[~control["stream"]]
    assert sorted(off["round"].unique()) == [2, 3] and len(off) == 8 and off["ttft_s"].isna().all()
    assert (off["num_output_tokens"] > 0).all() and (off["latency_s"] > 0).all()
    at_1 = table[table["concurrency"] == 1]
    assert (at_1["stream_off_tokens_per_s"] > 0).all() and at_1["stream_off_round_wall_s"].map(len).eq(2).all()
    assert table.loc[table["concurrency"] == 2, "stream_off_tokens_per_s"].isna().all()
    assert (requests["ttft_s"] <= requests["latency_s"]).all()
    # One gap per chunk after the first; with SD fewer chunks than tokens (a step's tokens in one chunk).
    assert (requests["chunk_gaps_s"].map(len) == requests["num_chunks"] - 1).all()
    assert (requests["num_chunks"] <= requests["num_output_tokens"]).all()
    # Goodput under the test config's targets (global, and the dataset's own e2e_ms).
    assert (table["slo_tpot_ms"] == 50).all() and (table["slo_e2e_ms"] == 10000).all()
    assert (table["goodput_rps"] <= table["requests_per_s"] * 1.5).all() and (table["goodput_rps"] >= 0).all()
    assert (table["goodput_rps_ci_low"] <= table["goodput_rps_ci_high"]).all() and table["itl_p90_ms"].notna().all()
    md = (served / "results/paper/ext11_latency_throughput.md").read_text()
    assert re.search(r"\| vllm-cpu \| tiny-target \| code-edit \| ngram-k3( \(busy\))? \| 2 \|", md), md
    assert "| tiny-target | code-edit | ngram-k3 | 2 | 2000 / 50 / 10000 |" in md, md
    assert (served / "results/paper/ext11_latency_throughput.png").stat().st_size > 0
    # Every server's own log is kept beside the job's: one log for the interleaved job's 4 starts.
    server_log = (served / "logs/serve_group/vllm-cpu/tiny-target/interleaved.server.log").read_text()
    assert server_log.count("Application startup complete") == 4, server_log[-2000:]
    assert _server_processes(str(served)) == [], "a vLLM server outlived its job"
    again = _snakemake(served, "-n", "results/paper/ext11_latency_throughput.md")
    assert "Nothing to be done" in again.stdout + again.stderr


@pytest.mark.slow
def test_a_server_crash_fails_its_cell_with_the_log_and_leaves_no_process(served: Path, tmp_path: Path) -> None:
    """kill -9 of the vLLM server while its cells run: the job fails with the server's log in
    its error, writes nothing, and no server or engine-core process is left."""
    config = validate_config(_config())
    config["server"].update(requests_per_level=40, rounds=3, starts=1, interleave=False)  # killed mid-cell
    import json
    import shlex

    spec = resolve_server_group(config, ServerGroup("vllm-cpu", "tiny-target", ("ngram-k3",)))
    out, server_log, job_log = tmp_path / "group", tmp_path / "server.log", tmp_path / "job.log"
    prompts = {"code-edit": str(served / "results/prompts/tiny-target/code-edit.parquet")}
    cmd = (f"exec {BIN / 'sdbench'} serve-group --spec {shlex.quote(json.dumps(spec))} "
           f"--prompts {shlex.quote(json.dumps(prompts))} --model-dir {served / 'results/models/built/tiny-target'} "
           f"--output-dir {out} --server-log {server_log} > {job_log} 2>&1")  # fmt: skip
    job = subprocess.Popen(["bash", "-c", cmd], cwd=tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while "server ready" not in (job_log.read_text() if job_log.exists() else ""):
            assert job.poll() is None, job_log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the server never became ready"
            time.sleep(0.2)
        time.sleep(1.0)  # inside the first cells
        pid = int(re.search(r"server ready after [\d.]+ s \(pid (\d+)", job_log.read_text())[1])
        os.kill(pid, signal.SIGKILL)
        code = job.wait(timeout=300)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    text = job_log.read_text()
    assert code == 4, text[-3000:]
    assert f"exited with code -{int(signal.SIGKILL)}" in text and str(server_log) in text, text[-3000:]
    assert "last lines:" in text and server_log.exists() and server_log.stat().st_size > 0
    assert not out.exists() and not list(tmp_path.glob(".group.*")), "a crashed group left output behind"
    time.sleep(2)
    assert _server_processes(str(served)) == [], "a server process outlived the crash"
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == pid], "the engine core outlived its server"


@pytest.mark.slow
def test_client_matches_vllm_bench_serve(served: Path) -> None:
    """The parity benchmark runs end to end on one server and prints the ratios (a benchmark, not
    a timed assertion: only the prompt token totals must be equal)."""
    done = subprocess.run(
        [str(BIN / "sdbench"), "bench", "serve-parity", "--config", str(CONFIG), "--model", "tiny-target",
         "--method", "ngram-k3", "--model-dir", str(served / "results/models/built/tiny-target"),
         "--prompts", str(served / "results/prompts/tiny-target/code-edit.parquet"), "--concurrency", "2",
         "--num-requests", "4", "--max-tokens", "16", "--rounds", "1"],
        capture_output=True, text=True, timeout=900, cwd=served,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    ratios = dict(re.findall(r"^\s+(output throughput|TPOT p50|occupancy|prompt tokens)\s.*= ([\d.]+)$", done.stdout, re.M))
    assert set(ratios) == {"output throughput", "TPOT p50", "occupancy", "prompt tokens"}, done.stdout
    assert float(ratios["prompt tokens"]) == 1.0


def test_occupancy_explains_throughput() -> None:
    """Throughput = occupancy x concurrency x tokens per request / mean E2E."""
    from sdbench.bench.serveparity import occupancy

    # 8 requests of 0.5 s at concurrency 2 in 2 s: always 2 in flight; in 2.5 s: gaps.
    assert occupancy(8 * 0.5, 2.0, 2) == 1.0 and occupancy(8 * 0.5, 2.5, 2) == 0.8


def test_server_env_drops_the_workflows_thread_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Snakemake exports thread counts to every job; left in the server's environment they
    oversubscribe the engine core's bound core (a 40x slower decode step was measured)."""
    from sdbench.engine.serving.server import WORKFLOW_THREAD_VARS, server_env

    for var in (*WORKFLOW_THREAD_VARS, "OMP_NUM_THREADS"):
        monkeypatch.setenv(var, "2")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    engine = {"vllm_version": "0.32.0", "device": "cpu", "env": {"OMP_NUM_THREADS": None}}
    env = server_env(engine, {"method": "ngram"})
    assert not {*WORKFLOW_THREAD_VARS, "OMP_NUM_THREADS"} & set(env)
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"  # the server's own process layout is kept
    pinned = server_env({**engine, "env": {"OPENBLAS_NUM_THREADS": "1"}}, {"method": "none"})
    assert pinned["OPENBLAS_NUM_THREADS"] == "1"  # an engine entry may still set one


def test_a_gpu_server_in_a_slurm_job_gets_the_jobs_threads_and_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same job environment as an offline engine job (hardware.job_env): threads per
    tensor-parallel worker, compile caches per job."""
    from sdbench.engine.site.hardware import CACHE_VARS, THREAD_VARS, job_env
    from sdbench.engine.serving.server import server_env

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("OMP_NUM_THREADS", "64")
    for var in CACHE_VARS:
        monkeypatch.delenv(var, raising=False)
    engine = {"vllm_version": "0.11.1", "device": "cuda"}
    env = server_env(engine, {"method": "eagle3"}, tensor_parallel_size=4)
    want = job_env(engine, 4)
    assert {v: env[v] for v in THREAD_VARS} == {v: want[v] for v in THREAD_VARS}
    assert all(env[v] == want[v] and "4242" in env[v] for v in CACHE_VARS)


def test_cpu_placement_keeps_the_last_core_for_the_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPU the server's processes share the other cores and the client keeps one (split apart,
    vLLM's pinned worker and its floating engine core stalled whole rounds); GPUs are left alone."""
    from sdbench.engine.serving import server

    monkeypatch.setattr(server.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    assert server.cpu_placement({"device": "cpu"}) == ({0, 1, 2}, {3})
    assert server.cpu_placement({"device": "cuda"}) is None
    monkeypatch.setattr(server.os, "sched_getaffinity", lambda _pid: {5})
    assert server.cpu_placement({"device": "cpu"}) is None
