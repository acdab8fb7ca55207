"""Downloads from the Hugging Face hub: the real huggingface_hub client against a hub on
127.0.0.1 (tests/support/hubserver.py), the file selection, the one-line hub errors, and the
download rules as local rules of the workflow (Snakemake, locally and under real SLURM)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sdbench.models.hub import (
    DOWNLOAD_VARS,
    download_env,
    hub_token,
    select_dataset_files,
    select_model_files,
    withhold_download_env,
)
from sdbench.workflow.plan import NETWORK_RULES, Plan
from support.datasets_hub_copies import WRITERS
from support.hubserver import HubServer, write_model_repo
from support.proxy import LoopbackProxy

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DOUBLES = REPO / "tests" / "support" / "doubles"
TOKEN = "hf_test_token_0123456789"
PAPER = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
# The paper's six hub datasets: config key -> the entry of config/paper.yaml.
PAPER_DATASETS = {k: PAPER["datasets"][k] for k in ("cnn", "sharegpt", "instructcoder", "gsm8k", "aime", "gpqa")}
GATED_DATASETS = {"gpqa"}


def files_of(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    """The loopback hub: tiny/llama, its gated twin (token :data:`TOKEN`), and the paper's six
    dataset repositories in their real layouts (Idavidrein/gpqa gated, as on the hub)."""
    root = tmp_path_factory.mktemp("hub")
    model = write_model_repo(root / "model")
    with HubServer() as server:
        server.add("tiny/llama", model)
        server.add("tiny/llama-gated", model, token=TOKEN)
        for key, entry in PAPER_DATASETS.items():
            server.add(entry["hf_id"], WRITERS[key](root / "datasets" / key), "dataset",
                       token=TOKEN if key in GATED_DATASETS else None)  # fmt: skip
        yield server


def hub_env(hub: HubServer, home: Path, token: str | None = None) -> dict[str, str]:
    """The environment of a job in the images (offline switches on) pointed at the loopback hub."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=hub.endpoint, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(home),
               HF_HUB_DISABLE_TELEMETRY="1", PYTHONPATH=str(REPO / "src"))  # fmt: skip
    if token:
        env["HF_TOKEN"] = token
    return env


def sdbench(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "sdbench"), *args], env=env, capture_output=True, text=True, timeout=120)


def error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


# --- what a snapshot takes ----------------------------------------------------------------
LLAMA_70B_FILES = [
    ".gitattributes", "LICENSE", "README.md", "USE_POLICY.md", "config.json", "generation_config.json",
    *[f"model-{i:05d}-of-00030.safetensors" for i in range(1, 31)], "model.safetensors.index.json",
    "original/consolidated.00.pth", "original/consolidated.07.pth", "original/params.json",
    "original/tokenizer.model", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
]  # fmt: skip


def test_model_snapshot_takes_one_weight_format_and_no_original() -> None:
    taken, fmt = select_model_files(LLAMA_70B_FILES)
    assert fmt == "safetensors"
    assert not [f for f in taken if f.startswith("original/") or f.endswith(".pth")]
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "model.safetensors.index.json"} <= set(taken)  # fmt: skip
    assert sum(f.endswith(".safetensors") for f in taken) == 30
    assert not {".gitattributes", "README.md", "LICENSE", "USE_POLICY.md"} & set(taken)
    # Both formats: safetensors only (no duplicate .bin, nor its index); no flax / tf / onnx / gguf.
    both = ["config.json", "model.safetensors", "pytorch_model.bin", "pytorch_model.bin.index.json",
            "flax_model.msgpack", "tf_model.h5", "onnx/model.onnx", "model-q4.gguf", "tokenizer.json"]  # fmt: skip
    assert select_model_files(both) == (["config.json", "model.safetensors", "tokenizer.json"], "safetensors")
    # An EAGLE head shipped as .bin; a .pt checkpoint; a tokenizer-only repository.
    eagle = ["config.json", "pytorch_model.bin", "training_args.bin.json"]
    assert select_model_files(eagle) == (["config.json", "pytorch_model.bin", "training_args.bin.json"], "bin")
    assert select_model_files(["config.json", "model.pt", "original/x.pth"]) == (["config.json", "model.pt"], "pt")
    assert select_model_files(["tokenizer.json", "README.md"]) == (["tokenizer.json"], "none")
    mistral = ["config.json", "consolidated.safetensors", "model-00001-of-00001.safetensors", "params.json"]
    assert select_model_files(mistral)[0] == ["config.json", "model-00001-of-00001.safetensors", "params.json"]


@pytest.mark.parametrize("key", sorted(PAPER_DATASETS))
def test_dataset_copy_takes_the_files_the_entry_reads(key: str, tmp_path: Path) -> None:
    root = WRITERS[key](tmp_path / key)
    readme = (root / "README.md").read_text() if (root / "README.md").is_file() else None
    taken = select_dataset_files(files_of(root), readme, PAPER_DATASETS[key], key)
    expected = {
        # 3.0.0 (both of its splits: load_dataset resolves them all) and one file of the card's
        # first config (load_dataset infers the file format from it).
        "cnn": ["1.0.0/train-00000-of-00001.parquet", "3.0.0/test-00000-of-00001.parquet",
                "3.0.0/train-00000-of-00002.parquet", "3.0.0/train-00001-of-00002.parquet", "README.md"],
        "sharegpt": ["ShareGPT_V3_unfiltered_cleaned_split.json"],  # data_files names it
        "instructcoder": ["train.json", "valid.json"],  # no configs: splits come from the file names
        "gsm8k": ["README.md", "main/test-00000-of-00001.parquet", "main/train-00000-of-00001.parquet"],
        "aime": ["README.md", "data/train-00000-of-00001.parquet"],
        "gpqa": ["README.md", "gpqa_main.csv"],
    }  # fmt: skip
    assert taken == expected[key]


def test_dataset_copy_unknown_config_is_one_line(tmp_path: Path) -> None:
    from sdbench.errors import ConfigError

    root = WRITERS["gsm8k"](tmp_path / "gsm8k")
    with pytest.raises(ConfigError, match=r"datasets\.gsm8k\.hf_config: 'mainn' is not a config of openai/gsm8k"):
        select_dataset_files(files_of(root), (root / "README.md").read_text(), {**PAPER_DATASETS["gsm8k"], "hf_config": "mainn"}, "gsm8k")


# --- the plan: network rules are local, hub datasets are downloaded first --------------------
def test_plan_downloads_hub_datasets_and_prepares_them_offline() -> None:
    from sdbench.config import validate_config

    config = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    validate_config(config, source="paper.yaml")
    plan = Plan(config)
    assert plan.hub_datasets == sorted(PAPER_DATASETS)  # SPEED-Bench has a local_path; random tokens: offline
    assert plan.prepare_inputs("llama3.1-8b", "gsm8k")["hub_copy"] == "resources/datasets/gsm8k"
    assert plan.dataset_entry("gsm8k")["local_path"] == "resources/datasets/gsm8k"
    assert "hub_copy" not in plan.prepare_inputs("llama3.1-8b", "speed-bench-qualitative")
    assert plan.dataset_entry("speed-bench-qualitative")["local_path"] == "resources/speed-bench/speed/qualitative"
    assert plan.download_entry("sharegpt") == {
        "hf_id": "anon8231489123/ShareGPT_Vicuna_unfiltered", "revision": "main", "hf_config": None, "split": "train",
        "data_files": "ShareGPT_V3_unfiltered_cleaned_split.json",
    }  # fmt: skip
    assert plan.network_rules() == NETWORK_RULES


def test_localrules_are_the_network_rules() -> None:
    """common.smk's `localrules:` lists exactly the plan's network rules, each a rule of the workflow."""
    text = (REPO / "workflow" / "rules" / "common.smk").read_text()
    block = re.search(r"^localrules:\n((?:    \w+,\n)+)", text, re.M)
    assert block, "common.smk has no localrules: block"
    assert tuple(re.findall(r"\w+", block.group(1))) == NETWORK_RULES
    rules = set(re.findall(r"^rule (\w+):", "".join(p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk")), re.M))
    assert set(NETWORK_RULES) <= rules


def test_the_token_and_the_network_settings_leave_the_workflow_for_the_downloads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the workflow process withholds from its environment (every job inherits it) and what a
    download job's command gets instead: the token from the token file, the site's settings."""
    (tmp_path / "token").write_text(TOKEN + "\n")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    environ = {"https_proxy": "http://proxy.site:3128", "NO_PROXY": "localhost", "HF_ENDPOINT": "https://hub.site",
               "SSL_CERT_FILE": "/etc/site-ca.pem", "APPTAINERENV_HF_TOKEN": "stale", "HF_HOME": "/h", "PATH": "/bin"}  # fmt: skip
    held = withhold_download_env(environ)
    assert environ == {"HF_HOME": "/h", "PATH": "/bin"}  # what every job inherits
    assert held == {"https_proxy": "http://proxy.site:3128", "NO_PROXY": "localhost", "HF_ENDPOINT": "https://hub.site",
                    "SSL_CERT_FILE": "/etc/site-ca.pem"}  # fmt: skip
    job = download_env(held)
    assert job["HF_TOKEN"] == TOKEN == job["APPTAINERENV_HF_TOKEN"]  # the token file's, for --cleanenv images too
    assert job["APPTAINERENV_https_proxy"] == job["https_proxy"] == "http://proxy.site:3128"
    assert job["APPTAINERENV_SSL_CERT_FILE"] == "/etc/site-ca.pem" and "HF_HOME" not in job
    assert download_env({"HF_TOKEN": "mine"})["HF_TOKEN"] == "mine"  # the variable wins over the file
    assert hub_token({}) == TOKEN


def test_a_download_goes_through_the_sites_proxy(hub: HubServer, tmp_path: Path) -> None:
    """``http_proxy`` with ``HF_ENDPOINT`` (a hub reached only through the site's proxy): every hub
    request of the download goes through the loopback proxy."""
    env = {k: v for k, v in hub_env(hub, tmp_path / "home").items() if k.lower() not in ("no_proxy", "all_proxy")}
    with LoopbackProxy() as proxy:
        env.update(http_proxy=proxy.url, HTTP_PROXY=proxy.url)
        result = sdbench(env, "download-model", "--repo", "tiny/llama", "--output", str(tmp_path / "llama"))
        assert result.returncode == 0, result.stderr[-2000:]
        through = [url for _, url in proxy.requests]
    model = write_model_repo(tmp_path / "served")
    assert (tmp_path / "llama" / "model.safetensors").read_bytes() == (model / "model.safetensors").read_bytes()
    assert through and all(url.startswith(hub.endpoint + "/") for url in through)
    assert any(url.endswith("/model.safetensors") for url in through), through


# --- the real client against the loopback hub ------------------------------------------------
def test_download_model_leaves_original_and_duplicates_behind(hub: HubServer, tmp_path: Path) -> None:
    out = tmp_path / "llama"
    result = sdbench(hub_env(hub, tmp_path / "home"), "download-model", "--repo", "tiny/llama", "--output", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert files_of(out) == ["config.json", "generation_config.json", "model.safetensors", "sdbench-source.json",
                             "tokenizer.json", "tokenizer_config.json"]  # fmt: skip
    assert not (out / "original").exists()
    fetched = hub.fetched("tiny/llama")
    assert not [f for f in fetched if f.startswith("original/") or f.endswith((".pth", ".bin", ".msgpack"))], fetched
    source = json.loads((out / "sdbench-source.json").read_text())
    assert source["repo"] == "tiny/llama" and source["weight_format"] == "safetensors"
    assert re.fullmatch(r"[0-9a-f]{40}", source["commit"])
    assert "original/consolidated.00.pth" in source["skipped"] and "pytorch_model.bin" in source["skipped"]
    assert not list(tmp_path.glob(".llama.partial"))


def test_gated_model_one_line_without_token_and_success_with_it(hub: HubServer, tmp_path: Path) -> None:
    args = ("download-model", "--repo", "tiny/llama-gated", "--output", str(tmp_path / "gated"))
    for token, why in ((None, "HF_TOKEN is not set"), ("hf_wrong", "the token in HF_TOKEN was refused")):
        result = sdbench(hub_env(hub, tmp_path / "home", token), *args)
        assert result.returncode == 2
        assert error_lines(result) == [
            f"error: tiny/llama-gated: gated model repository ({why}): request access at "
            "https://huggingface.co/tiny/llama-gated and set HF_TOKEN to a token of an account that has it"
        ], result.stderr[-2000:]
        assert not (tmp_path / "gated").exists()
    result = sdbench(hub_env(hub, tmp_path / "home", TOKEN), *args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "gated" / "model.safetensors").is_file()
    assert TOKEN not in result.stderr + result.stdout


def test_gated_dataset_and_missing_repo_or_revision_are_one_line(hub: HubServer, tmp_path: Path) -> None:
    env = hub_env(hub, tmp_path / "home")
    entry = json.dumps(PAPER_DATASETS["gpqa"])
    result = sdbench(env, "download-dataset", "--name", "gpqa", "--entry", entry, "--output", str(tmp_path / "g"))
    assert error_lines(result) == [
        "error: Idavidrein/gpqa: gated dataset repository (HF_TOKEN is not set): request access at "
        "https://huggingface.co/datasets/Idavidrein/gpqa and set HF_TOKEN to a token of an account that has it"
    ], result.stderr[-2000:]
    result = sdbench(env, "download-model", "--repo", "tiny/absent", "--output", str(tmp_path / "a"))
    assert len(error_lines(result)) == 1 and "tiny/absent: model repository not found on http://127.0.0.1:" in result.stderr
    result = sdbench(env, "download-model", "--repo", "tiny/llama", "--revision", "v9", "--output", str(tmp_path / "a"))
    assert error_lines(result) == [f"error: tiny/llama: revision 'v9' not found in the model repository on {hub.endpoint}"]


@pytest.mark.parametrize("key", sorted(PAPER_DATASETS))
def test_every_paper_dataset_downloads_and_loads_offline(key: str, hub: HubServer, tmp_path: Path) -> None:
    """``sdbench download-dataset`` through the real client, then the copy read as prepare_dataset
    reads it (load_hf_dataset with the copy as local_path): the entry's rows, none of the decoys."""
    from sdbench.datasets.prompts import load_hf_dataset

    entry = PAPER_DATASETS[key]
    copy = tmp_path / key
    result = sdbench(hub_env(hub, tmp_path / "home", TOKEN), "download-dataset", "--name", key,
                     "--entry", json.dumps(entry), "--output", str(copy))  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    source = json.loads((copy / "sdbench-source.json").read_text())
    assert source["files"] == [f for f in files_of(copy) if f != "sdbench-source.json"]
    rows = load_hf_dataset({**entry, "local_path": str(copy)})
    expected = {"cnn": 4, "sharegpt": 5, "instructcoder": 4, "gsm8k": 4, "aime": 3, "gpqa": 3}[key]
    assert len(rows) == expected and "DECOY" not in json.dumps(rows.to_list(), default=str), key


# --- Snakemake: downloads as local rules, prepare_dataset offline ----------------------------
# Three paper datasets through each run (the six in all), kept small for time.
LOCAL_RUN = ["cnn", "gpqa", "sharegpt"]
SLURM_RUN = ["aime", "gsm8k", "instructcoder"]


def hub_config(datasets: list[str]) -> dict:
    """A grid of the tiny hub model on paper datasets (their config/paper.yaml entries)."""
    return {
        "seed": 42,
        "engines": {"vllm-cpu": {"vllm_version": "0.32.0", "device": "cpu",
                                 "container": "containers/sif/sdbench-vllm-cpu-0.32.0.sif"}},
        "models": {"tiny": {"hf_id": "tiny/llama", "max_model_len": 512}},
        "datasets": {k: {**PAPER_DATASETS[k], "num_prompts": 2, "max_tokens": 16} for k in datasets},
        "methods": {"none": {"method": "none"}},
        "grid": [{"engine": "vllm-cpu", "models": ["tiny"], "methods": ["none"], "datasets": datasets,
                  "batch_sizes": [1]}],
    }  # fmt: skip


def check_prompt_tables(workdir: Path, datasets: list[str]) -> None:
    for key in datasets:
        table = pd.read_parquet(workdir / "results" / "prompts" / "tiny" / f"{key}.parquet")
        assert len(table) == 2 and not table["prompt_text"].str.contains("DECOY").any(), key
        copy = workdir / "resources" / "datasets" / key
        assert json.loads((copy / "sdbench-source.json").read_text())["repo"] == PAPER_DATASETS[key]["hf_id"]
    assert not (workdir / "resources" / "hub" / "tiny" / "original").exists()


@pytest.mark.slow
def test_snakemake_runs_downloads_locally_and_prepares_offline(hub: HubServer, tmp_path: Path) -> None:
    """Paper datasets through Snakemake with the images' HF_HUB_OFFLINE=1 exported; the token
    comes from huggingface_hub's token file on this host (gpqa is gated)."""
    datasets = LOCAL_RUN
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(hub_config(datasets)))
    home = tmp_path / "hf-home"
    home.mkdir()
    (home / "token").write_text(TOKEN)
    targets = [f"results/prompts/tiny/{k}.parquet" for k in datasets]
    result = subprocess.run(
        [str(BIN / "snakemake"), *targets, "--cores", "2", "--snakefile", str(REPO / "Snakefile"),
         "--directory", str(tmp_path), "--configfile", str(tmp_path / "config.yaml")],
        cwd=tmp_path, env={**hub_env(hub, home), "PATH": os.pathsep.join([str(BIN), os.environ["PATH"]])},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    check_prompt_tables(tmp_path, datasets)
    out = result.stdout + result.stderr
    assert out.count("localrule download_dataset:") == len(datasets) and "localrule download_model:" in out
    assert TOKEN not in out and not [p for p in (tmp_path / "logs").rglob("*.log") if TOKEN in p.read_text()]


def probed(probe_dir: Path) -> list[dict]:
    """What each Python process of a run had (tests/support/envprobe)."""
    return [json.loads(p.read_text()) for p in sorted(probe_dir.glob("*.json"))]


def sdbench_processes(probes: list[dict], command: str) -> list[dict]:
    return [p for p in probes if "sdbench" in " ".join(p["argv"][:2]) and command in p["argv"]]


@pytest.mark.slow
def test_token_file_and_proxy_reach_the_downloads_and_no_compute_job(hub: HubServer, tmp_path: Path) -> None:
    """The gated model and dataset through Snakemake (local executor, threads as the profiles run it)
    with the token only in huggingface_hub's token file (no HF_TOKEN variable) and the hub reached
    through the site's proxy (http_proxy, HF_ENDPOINT): the downloads get both and go through the
    proxy; prepare_dataset, a compute job, has neither in its process's environment."""
    config = hub_config(["gpqa"])
    config["models"]["tiny"]["hf_id"] = "tiny/llama-gated"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    home, probe = tmp_path / "hf-home", tmp_path / "probe"
    home.mkdir()
    probe.mkdir()
    (home / "token").write_text(TOKEN)
    with LoopbackProxy() as proxy:
        env = {k: v for k, v in hub_env(hub, home).items() if k.lower() not in ("no_proxy", "all_proxy")}
        env.update(http_proxy=proxy.url, SDBENCH_ENV_PROBE_DIR=str(probe),
                   PATH=os.pathsep.join([str(BIN), os.environ["PATH"]]),
                   PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO / "tests" / "support" / "envprobe")]))  # fmt: skip
        assert "HF_TOKEN" not in env
        result = subprocess.run(
            [str(BIN / "snakemake"), "results/prompts/tiny/gpqa.parquet", "--cores", "2", "--force-use-threads",
             "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path),
             "--configfile", str(tmp_path / "config.yaml")],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        through = [url for _, url in proxy.requests]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    check_prompt_tables(tmp_path, ["gpqa"])
    assert (tmp_path / "resources" / "hub" / "tiny" / "model.safetensors").is_file()  # the gated model
    assert any(url.endswith("/model.safetensors") for url in through)
    assert any("/datasets/Idavidrein/gpqa/" in url for url in through)
    probes = probed(probe)
    downloads = sdbench_processes(probes, "download-model") + sdbench_processes(probes, "download-dataset")
    assert len(downloads) == 2, [p["argv"] for p in probes]
    for job in downloads:
        assert job["env"]["HF_TOKEN"] == TOKEN and job["env"]["http_proxy"] == proxy.url
        assert job["env"]["HF_ENDPOINT"] == hub.endpoint
    (compute,) = sdbench_processes(probes, "prepare-dataset")
    withheld = {*DOWNLOAD_VARS, *(f"APPTAINERENV_{name}" for name in DOWNLOAD_VARS)}
    assert not withheld & set(compute["env"]), compute["env"]  # no token, proxy, CA or hub endpoint
    out = result.stdout + result.stderr
    assert TOKEN not in out and not [p for p in (tmp_path / "logs").rglob("*.log") if TOKEN in p.read_text()]


@pytest.mark.slow
def test_slurm_downloads_run_on_the_submitting_host(slurm_cluster, hub: HubServer, tmp_path: Path) -> None:
    """Under the SLURM executor the download rules run in the workflow process (never sbatch);
    prepare_dataset is a SLURM job reading the copy offline. The token is an HF_TOKEN variable of
    the submitting shell: sbatch --export=ALL hands the workflow's environment to every job, and
    the job's process has no token in it."""
    datasets = SLURM_RUN
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(hub_config(datasets)))
    probe = tmp_path / "probe"
    probe.mkdir()
    env = {**slurm_cluster.env, **hub_env(hub, tmp_path / "hf-home", TOKEN),
           "PATH": os.pathsep.join([str(DOUBLES), str(BIN), slurm_cluster.env.get("PATH", os.environ["PATH"])]),
           "SDBENCH_APPTAINER_CALLS": str(tmp_path / "apptainer_calls.jsonl"), "SDBENCH_ENV_PROBE_DIR": str(probe),
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests" / "support" / "envprobe")])}  # fmt: skip
    targets = [f"results/prompts/tiny/{k}.parquet" for k in datasets]
    cmd = [str(BIN / "snakemake"), *targets, "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path),
           "--profile", str(REPO / "profiles" / "slurm-cpu"),
           "--workflow-profile", str(REPO / ".test" / "profiles" / "slurm-ci"),
           "--configfile", str(tmp_path / "config.yaml")]  # fmt: skip
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        subprocess.run([*cmd, "--unlock"], cwd=tmp_path, env=env, capture_output=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    check_prompt_tables(tmp_path, datasets)
    out = result.stdout + result.stderr
    assert "localrule download_model:" in out and out.count("localrule download_dataset:") == len(datasets), out[-3000:]
    # The SLURM executor logs each job it submits under logs/slurm/rule_<name>/.
    submitted = {p.name.removeprefix("rule_") for p in (tmp_path / "logs" / "slurm").glob("rule_*")}
    assert "prepare_dataset" in submitted and not submitted & set(NETWORK_RULES), submitted
    assert TOKEN not in out
    probes = probed(probe)
    jobs = sdbench_processes(probes, "prepare-dataset")
    assert len(jobs) == len(datasets) and all(p["env"].get("HF_TOKEN") is None for p in jobs), jobs
    # The token is in the workflow process (the user's shell gave it) and the downloads, nowhere else:
    # not in a SLURM job's Snakemake (--target-jobs) nor in anything it starts.
    # (A download runs in the analysis image: the apptainer double's process holds it too.)
    holders = [" ".join(p["argv"]) for p in probes if TOKEN in json.dumps(p["env"])]
    assert all("--target-jobs" not in cmd and ("sdbench download-" in cmd or cmd.split()[1].endswith("snakemake"))
               for cmd in holders), holders  # fmt: skip
    assert any("sdbench download-model" in cmd for cmd in holders), holders


@pytest.mark.slow
def test_paper_plan_under_slurm_runs_network_rules_locally(tmp_path: Path) -> None:
    """The paper grid planned with profiles/slurm (Snakemake's API, as tests/workflow/test_cluster_plan.py):
    every network rule is a local rule, no engine or analysis rule is. (Snakemake's `-n` output
    prints each job as `rule`: a dry run does not say where a job would run.)"""
    from tests.workflow.test_cluster_plan import PROFILE, planned_jobs

    jobs = planned_jobs(PROFILE, REPO / "config" / "paper.yaml", tmp_path)
    workflow = jobs[0].dag.workflow
    local = {j.rule.name for j in jobs if j.rule.name in workflow._localrules}
    rules = {j.rule.name for j in jobs}
    assert set(NETWORK_RULES) <= rules and set(NETWORK_RULES) <= local, local
    # Local besides them: the target, and the rules that copy a cell's tables out of its engine job.
    assert local - set(NETWORK_RULES) <= {"all", "run_cell", "trace_cell", "breakdown_cell"}, local
    assert not {"run_engine", "trace_group", "breakdown_group", "serve_group", "prepare_dataset", "aggregate"} & local
    downloads = [j for j in jobs if j.rule.name in NETWORK_RULES]
    print(f"\nlocal network jobs: {len(downloads)}; local rules: {sorted(local)}")
