"""vLLM's OpenAI-compatible server as a child process: start, readiness, crash check, stop.

The server runs ``python -m <server module>`` (:attr:`EngineQuirks.server_module`) with the
engine arguments a grid cell would give ``vllm.LLM``, bound to a free loopback port. Its
stdout and stderr go to a log file that is kept whatever happens. It is started in its own
process group, and dies with this process (``PR_SET_PDEATHSIG``), so that stopping it ends
its engine-core children too and a killed job leaves no server behind; the job's lifeline
(:mod:`sdbench.lifeline`) also kills it when the workflow ends.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from sdbench.engine.release.versions import engine_env, quirks_for

HOST = "127.0.0.1"
# The name requests use for the model (the directory path would also do, but is long).
SERVED_MODEL_NAME = "sdbench-target"
LOG_TAIL_LINES = 40
_PR_SET_PDEATHSIG = 1


class ServerError(RuntimeError):
    """The server did not start, died, or stopped answering; the message carries its log tail."""


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def server_argv(kwargs: dict[str, Any], vllm_version: str, port: int, python: str = sys.executable) -> list[str]:
    """The server's command line for ``vllm.LLM`` keyword arguments ``kwargs``.

    Each keyword becomes its engine-argument flag (``max_num_seqs`` -> ``--max-num-seqs``):
    booleans as ``--flag`` / ``--no-flag``, dicts (``speculative_config``) as JSON. Stats stay
    on (the server's default), so ``/metrics`` carries the SD counters.
    """
    argv = [python, "-m", quirks_for(vllm_version).server_module, "--host", HOST, "--port", str(port)]
    argv += ["--served-model-name", SERVED_MODEL_NAME]
    # LLM()-only settings: the server keeps stats on by default and has no per-output counters.
    skip = {"disable_log_stats", "per_request_spec_decode_metrics"}
    for key, value in sorted(kwargs.items()):
        if key in skip or value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, dict | list):
            argv += [flag, json.dumps(value, sort_keys=True)]
        else:
            argv += [flag, str(value)]
    return argv


# Thread counts Snakemake exports to every job (= its threads). vLLM's CPU engine core binds
# its OpenMP threads to the cores it picks (here one core, the other left to the API server);
# with these set, the BLAS pools of the engine core oversubscribe that core and a decode step
# of the small default model took ~100-150 ms instead of ~3 ms (measured on the 2-core Xeon).
WORKFLOW_THREAD_VARS = (
    "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS",
)  # fmt: skip


def server_env(engine: dict[str, Any], method: dict[str, Any], tensor_parallel_size: int = 1) -> dict[str, str]:
    """The server's environment: this one with the job's and the cell's engine variables applied.

    The server always runs its engine core in a separate process (the API server's
    event loop must stay free), so the offline runner's in-process setting is dropped; the
    workflow's thread-count variables are dropped too (:data:`WORKFLOW_THREAD_VARS`), leaving
    the engine its own thread placement (an engine entry's ``env`` may still set them). As for
    offline engine jobs (:func:`sdbench.engine.site.hardware.job_env`), a GPU server's thread pools get
    the job's cores per tensor-parallel worker, and under SLURM its compile caches are per job.
    """
    from sdbench.engine.site.hardware import job_env

    env = {k: v for k, v in os.environ.items() if k not in WORKFLOW_THREAD_VARS}
    for key, value in [*job_env(engine, tensor_parallel_size).items(), *engine_env(engine, method).items()]:
        if key == "VLLM_ENABLE_V1_MULTIPROCESSING":
            continue
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def cpu_placement(engine: dict[str, Any]) -> tuple[set[int], set[int]] | None:
    """(server cores, client cores) for a CPU engine with at least two usable cores, else ``None``.

    vLLM's CPU backend pins its worker to one core and leaves the API server and engine core
    free to float. On 2 cores that made rounds stall (first token after ~1 s, a whole response
    in one burst, throughput -60%) whenever the floating processes sat on the other core than
    the worker: measured every round with them placed apart, never with the server's processes
    on one core and the client on the other (1239-1263 output tok/s over 6 rounds, no stall).
    So the client keeps the last core and the server gets the rest.
    """
    if engine.get("device") != "cpu" or not hasattr(os, "sched_getaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    return set(cores[:-1]), {cores[-1]}


def _die_with_parent(cpus: set[int] | None = None) -> None:  # runs in the child between fork and exec
    if cpus:
        os.sched_setaffinity(0, cpus)  # inherited by the engine core and its worker
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:  # noqa: BLE001 - not Linux: the lifeline and stop() still end it
        pass
    os.setsid()  # own process group: stop() ends the server and its engine-core children


def log_tail(path: str | Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ("" if it does not exist)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class ServerProcess:
    """One vLLM server on a loopback port; use as a context manager (always stopped on exit)."""

    def __init__(
        self, argv: list[str], env: dict[str, str], log_path: str | Path, port: int, grace_s: float = 30.0,
        cpus: set[int] | None = None,
    ) -> None:
        self.argv, self.env, self.log_path, self.port, self.grace_s = argv, env, Path(log_path), port, grace_s
        self.cpus = cpus  # cores the server's processes may use (None: all; see cpu_placement)
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s = float("nan")

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://{HOST}:{self.port}"

    def start(self) -> None:
        """Start the process (returns at once; see :meth:`wait_ready`)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(("$ " + " ".join(self.argv) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                preexec_fn=functools.partial(_die_with_parent, self.cpus),  # noqa: PLW1509 - no threads run yet in this job
            )
        self._t0 = time.perf_counter()

    def _fail(self, what: str) -> ServerError:
        return ServerError(f"{what}; server log {self.log_path}, last lines:\n{log_tail(self.log_path)}")

    def check_alive(self, grace_s: float = 0.0) -> None:
        """Raise :class:`ServerError` (with the log tail) if the server process has exited.

        ``grace_s``: wait that long for an exit first (a request that just failed may have
        seen the server die a moment before the process is gone).
        """
        assert self.proc is not None, "server not started"
        try:
            code = self.proc.wait(timeout=grace_s) if grace_s > 0 else self.proc.poll()
        except subprocess.TimeoutExpired:
            code = None
        if code is not None:
            raise self._fail(f"the vLLM server (pid {self.proc.pid}) exited with code {code}")

    def wait_ready(self, timeout_s: float, poll_s: float = 0.5) -> float:
        """Block until ``GET /health`` answers 200; returns the seconds since :meth:`start`.

        Raises :class:`ServerError` if the process exits first or ``timeout_s`` passes.
        """
        deadline = self._t0 + timeout_s
        while True:
            self.check_alive()
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as resp:  # noqa: S310
                    if resp.status == 200:
                        self.startup_s = time.perf_counter() - self._t0
                        return self.startup_s
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.perf_counter() > deadline:
                raise self._fail(f"the vLLM server did not answer {self.base_url}/health within {timeout_s:g} s")
            time.sleep(poll_s)

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL whatever is left after ``grace_s``."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # the server leads its own group (setsid)
        if self.proc.poll() is None:
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=self.grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:  # engine-core children may outlive a server that died or ignored SIGTERM
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ----------------------------------------------------------------------------- touchpoints
from sdbench.engine.release import touchpoints as tp  # noqa: E402 - standard library only

_FRONTEND_MODULES = ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.launchers.cli_args")


def _check_module(src: tp.SourceTree) -> str | None:
    """``python -m <server_module>`` starts the OpenAI-compatible server."""
    module = quirks_for(src.version).server_module
    text = src.text(module)
    if text is None:
        return f"server module {module} not found"
    return None if '__name__ == "__main__"' in text else f"{module} has no __main__ block"


def _check_frontend_flags(src: tp.SourceTree) -> str | None:
    """``--host`` / ``--port`` are FrontendArgs fields; engine flags come from EngineArgs fields."""
    for module in _FRONTEND_MODULES:
        fields = src.class_fields(f"{module}:FrontendArgs")
        if fields:
            missing = {"host", "port"} - fields
            return f"FrontendArgs lacks {', '.join(sorted(missing))}" if missing else None
    return "no FrontendArgs found"


def _check_engine_flags(src: tp.SourceTree) -> str | None:
    """``--served-model-name``, ``--no-<flag>`` for booleans, ``--speculative-config`` as JSON."""
    if "served_model_name" not in src.class_fields("vllm.engine.arg_utils:EngineArgs"):
        return "EngineArgs has no served_model_name"
    text = src.text("vllm.engine.arg_utils") or ""
    if "BooleanOptionalAction" not in text:
        return "EngineArgs flags are not BooleanOptionalAction (no --no-<flag>)"
    if 'vllm_kwargs["speculative_config"]["type"] = optional_type(json.loads)' not in text:
        return "--speculative-config is not parsed as JSON"
    return None


TOUCHPOINTS = tp.declare(
    __name__,
    tp.custom("server.module", _check_module, ["vllm.entrypoints.openai.api_server",
                                               "vllm.entrypoints.launchers.api_server.entry"]),
    tp.custom("server.frontend_flags", _check_frontend_flags, [f"{m}:FrontendArgs" for m in _FRONTEND_MODULES]),
    tp.custom("server.engine_flags", _check_engine_flags, ["vllm.engine.arg_utils:EngineArgs"]),
)
