"""Fetch the paper's published acceptance traces, pinned by commit and sha256.

``sdbench fetch published-traces --dataset D --output OUT [--local-dir DIR]`` copies
``DIR/combined_D.jsonl`` when it exists (offline machines), otherwise downloads it from the
simulator repository at :data:`SIMULATOR_COMMIT`. Either way the sha256 is checked before the
output appears (written atomically), so a corrupted or changed file never reaches the pipeline.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from sdbench.download import (
    DEFAULT_TIMEOUT,
    ChecksumError,  # noqa: F401 - callers catch it from here
    DownloadError,
    copy_verified,
    download_verified,
    sha256_file,  # noqa: F401 - re-exported
)


SIMULATOR_REPO = "SpecDecode-Bench/simulator"
SIMULATOR_COMMIT = "2fdccbd61b62be339fb85fd90caf43f5e8392aa6"
PUBLISHED_MODEL = "llama3.1-8B"
URL_TEMPLATE = "https://raw.githubusercontent.com/{repo}/{commit}/data/{model}/combined_{dataset}.jsonl"
PUBLISHED_SHA256: dict[str, str] = {
    "gsm8k": "6d6bfb9993f4a540ff73cb330bdd4348dc3e6a6c77a111d3e35b96caf83c26f1",
    "instructcoder": "cfd6b6b156076a704f7aff0f060920bb7c5e4c3b80ef32efbe858b62d85cd910",
    "sharegpt": "748df2df1e89b986009aad1a42fee604b1fe57558b690aef0da7d9c7b9708b75",
    "cnn": "90637b8cb4c410b3de6cdf2898ef1104d41b0fc5bff5e8692a6bfc836101899b",
}


def published_file_name(dataset: str) -> str:
    """``combined_<dataset>.jsonl``; raises ``ValueError`` for an unknown dataset."""
    if dataset not in PUBLISHED_SHA256:
        raise ValueError(f"unknown dataset {dataset!r}; known: {', '.join(PUBLISHED_SHA256)}")
    return f"combined_{dataset}.jsonl"


def published_url(dataset: str) -> str:
    """Raw-GitHub URL of the published trace file of ``dataset`` at the pinned commit."""
    published_file_name(dataset)  # validates the name
    return URL_TEMPLATE.format(
        repo=SIMULATOR_REPO, commit=SIMULATOR_COMMIT, model=PUBLISHED_MODEL, dataset=dataset
    )


def fetch_published_traces(
    dataset: str,
    output: str | os.PathLike[str],
    local_dir: str | os.PathLike[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Path:
    """Place the verified ``combined_<dataset>.jsonl`` at ``output`` and return its path.

    Source: ``local_dir/combined_<dataset>.jsonl`` if that file exists, else the pinned URL.
    An ``output`` that already has the pinned hash is kept as is. A failed download raises
    ``OSError`` naming the URL, the local file that was looked for and the timeout.
    """
    name = published_file_name(dataset)
    expected = PUBLISHED_SHA256[dataset]
    output = Path(output)
    if output.is_file() and sha256_file(output) == expected:
        return output
    local = Path(local_dir) / name if local_dir is not None else None
    if local is not None and local.is_file():
        with open(local, "rb") as src:
            copy_verified(src, str(local), output, expected)
        return output
    url = published_url(dataset)
    try:
        download_verified(url, output, expected, timeout)
    except DownloadError as exc:
        where = (
            f"or in --local-dir, but {local} does not exist"
            if local is not None
            else "or pass --local-dir DIR holding it (offline machines)"
        )
        raise OSError(f"{exc}: expected {name} (sha256 {expected[:12]}...) from this URL, {where}") from exc
    return output


def _cmd_fetch_published(args: argparse.Namespace) -> int:
    # ChecksumError (ValueError) and OSError become one `error:` line in sdbench.cli.main.
    path = fetch_published_traces(args.dataset, args.output, args.local_dir, args.timeout)
    print(path)
    return 0

