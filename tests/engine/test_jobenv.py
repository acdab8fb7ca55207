"""What an engine job's container gets of the host's environment, and what it sets itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from sdbench.engine.site.hardware import CACHE_VARS, THREAD_VARS, job_cores, job_env
from sdbench.lifeline import CONTAINER_ENV_PREFIX, container_env, export_workflow_env

REPO = Path(__file__).resolve().parents[2]
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
    from sdbench.engine.release.versions import apply_env, engine_env

    env = job_env(CPU, 1, {})
    assert not set(THREAD_VARS) & set(env)
    target = apply_env(engine_env(CPU, {"method": "none"}), apply_env(env, {"OMP_NUM_THREADS": "2"}))
    assert "OMP_NUM_THREADS" not in target  # the engine's env unsets what Snakemake exported



# --- the job's CPUs and its caches ---------------------------------------------------------------
def test_a_job_has_the_cpus_snakemake_gave_it_outside_slurm_and_its_allocation_under_slurm() -> None:
    from sdbench.engine.site.hardware import ENV_JOB_THREADS

    mask = len(os.sched_getaffinity(0))
    assert job_cores({}) == mask  # no --threads: the affinity mask
    assert job_cores({ENV_JOB_THREADS: "1"}) == 1  # a workstation job given 1 of the machine's cores
    assert job_cores({ENV_JOB_THREADS: str(mask + 8)}) == mask  # never beyond the mask
    assert job_cores({ENV_JOB_THREADS: "1", "SLURM_JOB_ID": "9"}) == mask  # SLURM binds the job to its CPUs
    env = job_env(GPU, tensor_parallel_size=1, env={ENV_JOB_THREADS: "1"})
    assert {env[v] for v in THREAD_VARS} == {"1"}


def test_caches_of_a_container_job_go_to_its_scratch_and_leave_with_it(tmp_path: Path) -> None:
    from sdbench.engine.site.hardware import ENV_JOB_SCRATCH, job_scratch

    env = {"TMPDIR": str(tmp_path), "APPTAINER_CONTAINER": "/w/containers/sif/sdbench-vllm-0.11.1.sif"}
    with job_scratch(threads=4, env=env) as root:
        assert env[ENV_JOB_SCRATCH] == root and root.startswith(str(tmp_path / "sdbench-pid"))
        caches = job_env(GPU, 1, env)
        # FlashInfer's JIT, the CUDA JIT cache (~/.nv), hf-xet and the compile caches: none in the home.
        assert {caches[v] for v in ("FLASHINFER_WORKSPACE_BASE", "CUDA_CACHE_PATH", "HF_XET_CACHE",
                                    "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT",
                                    "TORCH_EXTENSIONS_DIR")} == {  # fmt: skip
            f"{root}/flashinfer", f"{root}/nv", f"{root}/xet", f"{root}/inductor", f"{root}/triton", f"{root}/vllm",
            f"{root}/torch_extensions"}
        (Path(caches["TRITON_CACHE_DIR"]) / "kernel").mkdir(parents=True)  # what a compile leaves
        with job_scratch(env=env) as inner:  # an engine start run by the job's command
            assert inner == root
        assert Path(root, "triton", "kernel").is_dir()  # the inner command leaves it to the job
        assert env["SDBENCH_JOB_THREADS"] == "4"
    assert not Path(root).exists() and ENV_JOB_SCRATCH not in env
    with pytest.raises(RuntimeError), job_scratch(env=env) as root:  # removed however the job ends
        raise RuntimeError("engine failed")
    assert not Path(root).exists()


def test_an_engine_command_runs_in_its_job_scratch(tmp_path: Path) -> None:
    """``sdbench run-group --threads 3`` (its argument parsing and the decorator of the real command),
    stopped where the spec is read: the scratch existed while it ran and is gone after."""
    import subprocess
    import sys

    probe = tmp_path / "spec.json"
    code = (
        "import os, sys, json\n"
        "from sdbench.engine import commands\n"
        "seen = {}\n"
        "def read_spec(path):\n"
        "    seen.update(scratch=os.environ['SDBENCH_JOB_SCRATCH'], threads=os.environ['SDBENCH_JOB_THREADS'])\n"
        "    seen['existed'] = os.path.isdir(seen['scratch'])\n"
        "    raise SystemExit(0)\n"
        "commands.read_spec = read_spec\n"
        "from sdbench.cli import main\n"
        "try:\n"
        "    main(['run-group', '--spec', sys.argv[1], '--model-dir', '.', '--output-dir', 'o', '--threads', '3'])\n"
        "finally:\n"
        "    print(json.dumps(seen))\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path), "SLURM_JOB_ID": "77"}
    out = subprocess.run([sys.executable, "-c", code, str(probe)], env=env, capture_output=True, text=True, timeout=120)
    import json

    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"scratch": str(tmp_path / "sdbench-77"), "threads": "3", "existed": True}, out.stderr[-2000:]
    assert not (tmp_path / "sdbench-77").exists()
