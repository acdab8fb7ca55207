"""Hugging Face hub snapshots of models (cluster runs): downloaded once into
``resources/hub/<key>`` at a pinned revision, so run-cell jobs need no network."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

from sdbench.io import write_text


def download_model(repo: str, revision: str, output: str | os.PathLike[str]) -> Path:
    """Snapshot ``repo`` at ``revision`` into ``output`` (atomically: temp dir, then rename).

    Records the resolved commit in ``output/sdbench-source.json``.
    """
    from huggingface_hub import HfApi, snapshot_download

    final = Path(output)
    tmp = final.with_name(f".{final.name}.partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    sha = HfApi().model_info(repo, revision=revision).sha
    snapshot_download(repo_id=repo, revision=sha, local_dir=tmp)
    write_text(json.dumps({"repo": repo, "requested_revision": revision, "commit": sha}, indent=2), tmp / "sdbench-source.json")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


def _cmd_download(args: argparse.Namespace) -> int:
    download_model(args.repo, args.revision, args.output)
    return 0
