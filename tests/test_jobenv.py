"""What an engine job's container gets of the host's environment, and what it sets itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from sdbench.engine.hardware import CACHE_VARS, THREAD_VARS, job_cores, job_env
from sdbench.lifeline import CONTAINER_ENV_PREFIX, container_env, export_workflow_env

REPO = Path(__file__).resolve().parents[1]
GPU = {"vllm_version": "0.11.1", "device": "cuda"}
CPU = {"vllm_version": "0.32.0", "device": "cpu", "env": {"OMP_NUM_THREADS": None}}


def _inside_cleanenv(host: dict[str, str]) -> dict[str, str]:
    """What ``apptainer exec --cleanenv`` hands the container of a host environment: only the
    ``APPTAINERENV_<NAME>`` variables, as ``<NAME>`` (the image's own variables aside)."""
    return {k[len(CONTAINER_ENV_PREFIX):]: v for k, v in host.items() if k.startswith(CONTAINER_ENV_PREFIX)}


@pytest.mark.parametrize("profile", ["slurm", "slurm-cpu", "gpu"])
def test_container_profiles_start_with_a_clean_environment(profile: str) -> None:
    settings = yaml.safe_load((REPO / "profiles" / profile / "config.yaml").read_text())
    assert "--cleanenv" in settings["apptainer-args"].split()
    assert settings["software-deployment-method"] == "apptainer"


def test_cluster_profiles_flag_on_shared_nodes() -> None:
    for profile in ("slurm", "slurm-cpu"):
        settings = yaml.safe_load((REPO / "profiles" / profile / "config.yaml").read_text())
        assert "quiet_guard=flag" in settings["config"] and not any("refuse" in str(c) for c in settings["config"])


def test_only_the_allow_list_reaches_the_container(monkeypatch: pytest.MonkeyPatch) -> None:
    host = {"SLURM_JOB_ID": "4242", "CUDA_VISIBLE_DEVICES": "2,3", "TMPDIR": "/tmp", "OMP_NUM_THREADS": "16",
            "PYTHONPATH": "/home/me/lib", "LD_LIBRARY_PATH": "/opt/x"}  # fmt: skip
    for key in list(os.environ):
        monkeypatch.delenv(key)
    for key, value in host.items():
        monkeypatch.setenv(key, value)
    # A stale value the submitting workflow exported (a SLURM job inherits its environment).
    monkeypatch.setenv(CONTAINER_ENV_PREFIX + "SLURM_JOB_NODELIST", "login1")
    export_workflow_env("flag")
    inside = _inside_cleanenv(dict(os.environ))
    assert inside["SLURM_JOB_ID"] == "4242" and inside["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert inside["SDBENCH_QUIET_GUARD"] == "flag" and inside["SDBENCH_WORKFLOW_PID"] == str(os.getpid())
    assert not {"OMP_NUM_THREADS", "PYTHONPATH", "LD_LIBRARY_PATH", "SLURM_JOB_NODELIST"} & set(inside)
    assert container_env({})[CONTAINER_ENV_PREFIX + "TMPDIR"] is None


def test_a_gpu_engine_job_sizes_threads_per_worker_and_caches_per_job(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "4242", "TMPDIR": str(tmp_path)}
    tp4 = job_env(GPU, tensor_parallel_size=4, env=env)
    assert {tp4[v] for v in THREAD_VARS} == {str(max(1, job_cores() // 4))}
    assert tp4["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "sdbench-4242" / "inductor")
    assert tp4["TRITON_CACHE_DIR"] == str(tmp_path / "sdbench-4242" / "triton")
    assert tp4["VLLM_CACHE_ROOT"] == str(tmp_path / "sdbench-4242" / "vllm")
    # A cache the user set is kept; outside SLURM (one engine job at a time) vLLM's own caches.
    assert "VLLM_CACHE_ROOT" not in job_env(GPU, 1, {**env, "VLLM_CACHE_ROOT": "/shared/vllm"})
    assert not set(CACHE_VARS) & set(job_env(GPU, 1, {"TMPDIR": str(tmp_path)}))
    # A TMPDIR the container cannot see: /tmp.
    assert job_env(GPU, 1, {"SLURM_JOB_ID": "7", "TMPDIR": "/no/such/dir"})["TRITON_CACHE_DIR"] == "/tmp/sdbench-7/triton"


def test_a_cpu_engine_keeps_its_own_thread_placement() -> None:
    from sdbench.engine.versions import apply_env, engine_env

    env = job_env(CPU, 1, {})
    assert not set(THREAD_VARS) & set(env)
    target = apply_env(engine_env(CPU, {"method": "none"}), apply_env(env, {"OMP_NUM_THREADS": "2"}))
    assert "OMP_NUM_THREADS" not in target  # the engine's env unsets what Snakemake exported

