"""``sdbench doctor``, the Hugging Face hub: the token against every repository the config
downloads, and free disk for the snapshots (sizes from the hub's file lists, counting only the
files a download selects). Skipped with ``--offline``, ``HF_HUB_OFFLINE`` or an unreachable hub.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdbench.doctorcore import Result, failed, ok, skipped
from sdbench.doctorsite import Site
from sdbench.models import hub


HUB_DIR = Path("resources/hub")


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
