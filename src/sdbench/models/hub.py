"""Hugging Face hub snapshots of models and dataset repositories (cluster runs).

Downloaded once, at a pinned revision, by the workflow's local rules on the submitting host
(the one place with network): models into ``resources/hub/<key>``, dataset repositories into
``resources/datasets/<name>``; compute jobs then read these copies offline.

* A model snapshot takes only what vLLM loads (:func:`select_model_files`): the config,
  tokenizer and generation files and ONE weight format (safetensors when the repository has
  any, else ``*.bin``, else ``*.pt``); never ``original/`` (meta-llama's consolidated ``*.pth``),
  gguf, onnx, flax, tf or h5 files.
* A dataset copy takes the files the entry selects (:func:`select_dataset_files`): its
  ``data_files``, or the files of its ``hf_config`` in the dataset card's ``configs``, so that
  ``datasets.load_dataset(<copy>, hf_config, split=...)`` reads the same rows as from the hub.

Both decide from the repository's file list at the resolved commit and record it, with what
was taken, in ``<output>/sdbench-source.json``. The hub is reached whatever the machine's image
exports (``HF_HUB_OFFLINE=1`` in the images: :func:`hub_online`); the token is huggingface_hub's
(``HF_TOKEN``, which the workflow sets for its download jobs). Hub errors end in one line
(:class:`HubError`): a gated repository names ``HF_TOKEN`` and the page where access is requested.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import json
import os
import shutil
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sdbench.errors import ConfigError
from sdbench.io import write_text

SOURCE_FILE = "sdbench-source.json"
HUB_PAGE = "https://huggingface.co"
# Environment variables that switch huggingface_hub / datasets offline (read at their import).
OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")

# Model files vLLM never loads: meta-llama's original checkpoints, other runtimes' formats.
EXCLUDED_DIRS = ("original/", "onnx/")
EXCLUDED_SUFFIXES = (".pth", ".gguf", ".onnx", ".onnx_data", ".msgpack", ".h5", ".tflite", ".ot", ".mlmodel")
EXCLUDED_PREFIXES = ("flax_model", "tf_model", "rust_model", "coreml")
# Weight formats in order of preference: (name, suffix of the weight files, suffix of their index).
WEIGHT_FORMATS = (
    ("safetensors", ".safetensors", ".safetensors.index.json"),
    ("bin", ".bin", ".bin.index.json"),
    ("pt", ".pt", ".pt.index.json"),
)
# Config, tokenizer and generation files (config.json, tokenizer.json, tokenizer.model,
# merges.txt, chat_template.jinja, a remote-code *.py, ...).
SUPPORT_SUFFIXES = (".json", ".txt", ".model", ".tiktoken", ".jinja", ".py")


class HubError(OSError):
    """A hub request failed (gated, missing repository or revision, unreachable hub): one line."""


@contextmanager
def hub_online() -> Iterator[None]:
    """Reach the hub inside this block whatever the environment says.

    The images export ``HF_HUB_OFFLINE=1`` so that compute jobs never try the network; a download
    job runs in the same image. huggingface_hub reads the variable when it is imported, so it is
    cleared here before the import (and the constant switched back if it was imported already).
    """
    saved = {k: os.environ.get(k) for k in OFFLINE_ENV}
    for key in OFFLINE_ENV:
        os.environ[key] = "0"
    constants = sys.modules.get("huggingface_hub.constants")
    was = getattr(constants, "HF_HUB_OFFLINE", None)
    if constants is not None:
        constants.HF_HUB_OFFLINE = False
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if constants is not None:
            constants.HF_HUB_OFFLINE = was


def hub_page(repo: str, repo_type: str = "model") -> str:
    """The repository's page on the hub (where a gated repository's access is requested)."""
    return f"{HUB_PAGE}/{repo}" if repo_type == "model" else f"{HUB_PAGE}/{repo_type}s/{repo}"


def hub_error(exc: BaseException, repo: str, revision: str, repo_type: str = "model") -> HubError | None:
    """One-line :class:`HubError` for a huggingface_hub/httpx failure; None if ``exc`` is not one."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    kind = "dataset" if repo_type == "dataset" else "model"
    token = "HF_TOKEN is not set" if not os.environ.get("HF_TOKEN") else "the token in HF_TOKEN was refused"
    if isinstance(exc, GatedRepoError):
        return HubError(
            f"{repo}: gated {kind} repository ({token}): request access at {hub_page(repo, repo_type)} "
            "and set HF_TOKEN to a token of an account that has it"
        )
    if isinstance(exc, RevisionNotFoundError):
        return HubError(f"{repo}: revision {revision!r} not found in the {kind} repository on {constants.ENDPOINT}")
    if isinstance(exc, RepositoryNotFoundError):
        return HubError(
            f"{repo}: {kind} repository not found on {constants.ENDPOINT} (or private: {token}; "
            f"see {hub_page(repo, repo_type)})"
        )
    if isinstance(exc, HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return HubError(f"{repo}: hub request failed (HTTP {status}): {first}")
    if isinstance(exc, (LocalEntryNotFoundError, OfflineModeIsEnabled)) or type(exc).__module__.startswith("httpx"):
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        return HubError(f"{repo}: cannot reach the hub at {constants.ENDPOINT} ({reason})")
    return None


def _matches(path: str, pattern: str) -> bool:
    pattern = pattern.removeprefix("./")
    return path == pattern or fnmatch.fnmatchcase(path, pattern)


def select_model_files(files: Iterable[str]) -> tuple[list[str], str]:
    """The files of a model repository vLLM loads, and the weight format taken.

    One weight format: ``safetensors`` if the repository has any (outside the excluded folders),
    else ``bin``, else ``pt`` (``none`` for a tokenizer-only repository); plus the config,
    tokenizer and generation files. Never ``original/``, ``*.pth``, gguf, onnx, flax, tf or h5.
    """
    kept = []
    for f in sorted(files):
        name = f.rsplit("/", 1)[-1]
        if f.startswith(EXCLUDED_DIRS) or f.endswith(EXCLUDED_SUFFIXES) or name.startswith(EXCLUDED_PREFIXES):
            continue
        kept.append(f)
    fmt, suffix, index = next(
        (w for w in WEIGHT_FORMATS if any(f.endswith(w[1]) for f in kept)), ("none", None, None)
    )
    # Mistral-style repositories ship the original checkpoint as consolidated*.safetensors beside
    # the Hugging Face shards: the shards are what vLLM loads.
    consolidated = [f for f in kept if f.rsplit("/", 1)[-1].startswith("consolidated")]
    if suffix is not None and any(f.endswith(suffix) for f in set(kept) - set(consolidated)):
        kept = [f for f in kept if f not in consolidated]
    other_weights = tuple(s for w in WEIGHT_FORMATS for s in w[1:] if w[0] != fmt)
    taken = [
        f
        for f in kept
        if (suffix is not None and (f.endswith(suffix) or f.endswith(index)))
        or (f.endswith(SUPPORT_SUFFIXES) and not f.endswith(other_weights))
    ]
    return taken, fmt


def _front_matter(readme: str | None) -> dict[str, Any]:
    """The YAML front matter of a dataset card ({} when it has none)."""
    import yaml

    if not readme or not readme.startswith("---"):
        return {}
    end = readme.find("\n---", 3)
    if end < 0:
        return {}
    data = yaml.safe_load(readme[3:end])
    return data if isinstance(data, dict) else {}


def _split_patterns(data_files: Any) -> dict[str, list[str]]:
    """``data_files`` of an entry or a card config (str, list of str, list of {split, path},
    or {split: str | list}) as split -> patterns."""
    if isinstance(data_files, str):
        return {"train": [data_files]}
    if isinstance(data_files, dict):
        return {str(k): [v] if isinstance(v, str) else list(v) for k, v in data_files.items()}
    out: dict[str, list[str]] = {}
    for item in data_files or []:
        if isinstance(item, dict):
            path = item.get("path", [])
            out.setdefault(str(item.get("split", "train")), []).extend([path] if isinstance(path, str) else path)
        else:
            out.setdefault("train", []).append(str(item))
    return out


def select_dataset_files(files: Iterable[str], readme: str | None, entry: dict[str, Any], name: str = "") -> list[str]:
    """The files of a dataset repository that ``load_dataset(<copy>, hf_config, split, data_files)``
    reads for ``entry``, with ``README.md`` (its ``configs``).

    * The entry's ``data_files``: the files they match.
    * Else the card's ``configs``: every file of the entry's ``hf_config`` (the card's default or
      first one when it names none), all its splits (load_dataset resolves them all), and one file
      per split of the card's first config (load_dataset infers the file format from it).
    * Else (no configs: splits come from file names) every file but ``.gitattributes``.

    Raises ``ConfigError`` naming ``datasets.<name>`` for an unknown config or when nothing matches.
    """
    files = sorted(files)
    key = f"datasets.{name}" if name else str(entry.get("hf_id"))
    card = ["README.md"] if "README.md" in files else []

    def matched(patterns: list[str]) -> list[str]:
        return [f for f in files if any(_matches(f, p) for p in patterns)]

    if entry.get("data_files"):
        patterns = [p for ps in _split_patterns(entry["data_files"]).values() for p in ps]
        data = matched(patterns)
        if not data:
            raise ConfigError(f"{key}.data_files: {patterns} match no file of {entry.get('hf_id')} ({len(files)} files)")
        return sorted(set(card + data))
    configs = [c for c in _front_matter(readme).get("configs") or [] if isinstance(c, dict)]
    if not configs:
        return [f for f in files if f != ".gitattributes"]
    by_name = {str(c.get("config_name", "default")): c for c in configs}
    wanted = entry.get("hf_config")
    if wanted is None:
        chosen = next((c for c in configs if c.get("default")), by_name.get("default", configs[0]))
    elif str(wanted) in by_name:
        chosen = by_name[str(wanted)]
    else:
        raise ConfigError(
            f"{key}.hf_config: {wanted!r} is not a config of {entry.get('hf_id')} (its configs: {', '.join(by_name)})"
        )
    data = matched([p for ps in _split_patterns(chosen.get("data_files")).values() for p in ps])
    if not data:
        raise ConfigError(f"{key}: config {chosen.get('config_name')!r} of {entry.get('hf_id')} matches no file")
    first = [m[0] for ps in _split_patterns(configs[0].get("data_files")).values() if (m := matched(ps))]
    return sorted(set(card + data + first))


def _escape(files: list[str]) -> list[str]:
    """Exact file names as huggingface_hub's allow_patterns (fnmatch): ``[``, ``*``, ``?`` escaped."""
    return [glob.escape(f) for f in files]


def _snapshot(
    repo: str,
    revision: str,
    output: str | os.PathLike[str],
    repo_type: str,
    choose: Any,
) -> Path:
    """Resolve ``revision``, list the repository, download what ``choose(api, sha, files, tmp)``
    returns (``(taken, extra_record)``) into ``output`` atomically, with its record."""
    final = Path(output)
    tmp = final.with_name(f".{final.name}.partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    with hub_online():
        from huggingface_hub import HfApi, constants, snapshot_download

        api = HfApi()
        try:
            sha = api.repo_info(repo, repo_type=repo_type, revision=revision).sha
            files = api.list_repo_files(repo, repo_type=repo_type, revision=sha)
            taken, record = choose(sha, files, tmp)
            snapshot_download(
                repo_id=repo, repo_type=repo_type, revision=sha, local_dir=tmp, allow_patterns=_escape(taken)
            )
        except Exception as exc:
            error = hub_error(exc, repo, revision, repo_type)
            if error is None:
                raise
            raise error from exc
        endpoint = constants.ENDPOINT
    shutil.rmtree(tmp / ".cache", ignore_errors=True)  # huggingface_hub's download metadata
    missing = [f for f in taken if not (tmp / f).is_file()]
    if missing:
        raise HubError(f"{repo}: {len(missing)} selected file(s) not downloaded: {', '.join(missing[:3])}")
    source = {
        "repo": repo,
        "repo_type": repo_type,
        "endpoint": endpoint,
        "requested_revision": revision,
        "commit": sha,
        **record,
        "files": taken,
        "skipped": sorted(set(files) - set(taken)),
    }
    write_text(json.dumps(source, indent=2) + "\n", tmp / SOURCE_FILE)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


def download_model(repo: str, revision: str, output: str | os.PathLike[str]) -> Path:
    """Snapshot what vLLM loads of model ``repo`` at ``revision`` into ``output`` (atomically).

    ``output/sdbench-source.json`` records the resolved commit, the weight format and the files
    taken and skipped (:func:`select_model_files`).
    """

    def choose(sha: str, files: list[str], tmp: Path) -> tuple[list[str], dict[str, Any]]:
        taken, fmt = select_model_files(files)
        return taken, {"weight_format": fmt}

    return _snapshot(repo, revision, output, "model", choose)


def download_dataset(entry: dict[str, Any], output: str | os.PathLike[str], name: str = "") -> Path:
    """Copy the files of dataset repository ``entry['hf_id']`` (at ``entry['revision']``, default
    ``main``) that the entry selects into ``output`` (atomically; :func:`select_dataset_files`).

    ``prepare_dataset`` then reads the copy offline as the entry's ``local_path``.
    """
    repo = entry["hf_id"]

    def choose(sha: str, files: list[str], tmp: Path) -> tuple[list[str], dict[str, Any]]:
        readme = None
        if "README.md" in files:
            from huggingface_hub import hf_hub_download

            readme = Path(
                hf_hub_download(repo, "README.md", repo_type="dataset", revision=sha, local_dir=tmp)
            ).read_text(encoding="utf-8")
        taken = select_dataset_files(files, readme, entry, name)
        selected = {k: entry[k] for k in ("hf_config", "split", "data_files") if entry.get(k) is not None}
        return taken, {"selected_by": selected}

    return _snapshot(repo, str(entry.get("revision", "main")), output, "dataset", choose)


def _cmd_download(args: argparse.Namespace) -> int:
    download_model(args.repo, args.revision, args.output)
    return 0


def _cmd_download_dataset(args: argparse.Namespace) -> int:
    try:
        entry = json.loads(args.entry)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--entry: not valid JSON ({exc}): {args.entry[:60]!r}") from exc
    if not isinstance(entry, dict) or not entry.get("hf_id"):
        raise ConfigError(f"datasets.{args.name}: no hf_id to download")
    download_dataset(entry, args.output, args.name)
    return 0


def export_hub_token(environ: dict[str, str] | None = None) -> bool:
    """Put the submitting user's hub token into ``HF_TOKEN`` of ``environ`` (``os.environ``) for the
    download jobs this workflow process runs; True when a token is there.

    ``HF_TOKEN`` already set wins; otherwise the token file huggingface_hub reads on this host
    (``hf auth login``; ``HF_TOKEN_PATH``, ``$HF_HOME/token``), which a job inside an image
    whose home is the working directory would not see. The token never enters a command line,
    a param or a log.
    """
    environ = os.environ if environ is None else environ
    if environ.get("HF_TOKEN"):
        return True
    try:
        from huggingface_hub import get_token
    except ImportError:  # no huggingface_hub beside Snakemake: jobs resolve their own token
        return False
    token = get_token()
    if token:
        environ["HF_TOKEN"] = token
    return bool(token)
