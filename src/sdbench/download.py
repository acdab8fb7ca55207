"""Files fetched by URL and pinned by sha256: verified while streamed, written atomically.

Used for the paper's published traces (:mod:`sdbench.traces.fetch`), the engine release wheels
the conformance check reads (:mod:`sdbench.engine.release.conformance`) and the source archives an image
builds (:mod:`sdbench.containercheck`). A file whose hash differs never appears at its path.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import BinaryIO

from sdbench.io import atomic_path

CHUNK = 1 << 20
DEFAULT_TIMEOUT = 20.0  # seconds per connect/read: an offline machine fails fast


class ChecksumError(ValueError):
    """A fetched file does not have the pinned sha256."""


class DownloadError(OSError):
    """A pinned URL could not be fetched (offline machine, timeout, HTTP error)."""


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def copy_verified(src: BinaryIO, source: str, output: Path, expected: str) -> None:
    """Stream ``src`` to ``output`` atomically; raise ``ChecksumError`` (output untouched) on a
    sha256 mismatch."""
    digest = hashlib.sha256()
    with atomic_path(output) as tmp:
        with open(tmp, "wb") as dst:
            while chunk := src.read(CHUNK):
                digest.update(chunk)
                dst.write(chunk)
        actual = digest.hexdigest()
        if actual != expected:
            raise ChecksumError(f"{source}: sha256 {actual} does not match the pinned {expected}")


def download_verified(url: str, output: str | os.PathLike[str], expected: str, timeout: float = DEFAULT_TIMEOUT) -> Path:
    """Download ``url`` to ``output`` if it does not already hold the pinned sha256.

    Raises ``DownloadError`` whose message starts with the URL and the reason (an offline
    machine, a timeout) and ``ChecksumError`` when the bytes differ from the pin.
    """
    import http.client  # the network modules only when downloading
    import urllib.error
    import urllib.request

    output = Path(output)
    if output.is_file() and sha256_file(output) == expected:
        return output
    try:
        with urllib.request.urlopen(url, timeout=timeout) as src:  # noqa: S310 (pinned https URL)
            copy_verified(src, url, output, expected)
    except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", None) or exc
        reason = "timed out" if isinstance(reason, TimeoutError) else " ".join(str(reason).split())
        raise DownloadError(f"{url}: download failed ({reason}; timeout {timeout:g} s)") from exc
    return output
