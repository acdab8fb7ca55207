"""Compile caches kept across engine jobs: compile once per image, vLLM version and kind of GPU.

Without it every engine job compiles from cold (TorchInductor, Triton, vLLM's torch.compile
artifacts, FlashInfer's JIT, the CUDA JIT), in its node-local scratch, removed at its end: all of
a grid's GPU jobs, and every retry, pay the same minutes. With ``SDBENCH_COMPILE_CACHE`` set to a
directory every job sees (a shared filesystem; bind it into the images), a job starts from the
newest complete snapshot of its key (:func:`cache_key`), copied into its scratch, and a job whose
command succeeded publishes what it compiled as the next snapshot. Jobs never write into a snapshot
another job reads: a snapshot is written beside, marked complete, then made current by one rename
of a symbolic link, so concurrent jobs see the old snapshot or the new one, never half of one.

A snapshot that cannot be read whole (no marker, a copy that fails) is discarded, and so is one a
job failed with (it is marked bad): its retry compiles from cold, which costs minutes, not the run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

ENV_COMPILE_CACHE = "SDBENCH_COMPILE_CACHE"
# The caches a job compiles into (sdbench.engine.site.hardware.CACHE_VARS): these are kept; the others
# (hf-xet's download chunks) stay the job's own.
COMPILED = ("inductor", "triton", "vllm", "flashinfer", "nv", "torch_extensions")
CURRENT, COMPLETE, BAD = "current", "COMPLETE", "BAD"
KEEP = 2  # snapshots kept per key: the current one and the one before (a job may still be copying it)


def cache_key(image: str, vllm_version: str, device: str) -> str:
    """The snapshot key: an image (its name, or ``host``), a vLLM version and a kind of device (a
    GPU board, or ``cpu-<model>``), in characters any filesystem takes."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{image}--vllm-{vllm_version}--{device}").strip("_")


def _current(root: Path, key: str) -> Path | None:
    """The current snapshot of ``key``: complete and not marked bad, else None."""
    link = root / key / CURRENT
    try:
        snapshot = (root / key / os.readlink(link)).resolve()
    except OSError:
        return None
    if not (snapshot / COMPLETE).is_file() or (snapshot / BAD).exists():
        return None
    return snapshot


def restore(root: Path, key: str, scratch: Path) -> str:
    """Copy ``key``'s current snapshot into ``scratch`` (its caches' parent); returns one log line.
    A snapshot that cannot be copied whole is left behind and the job compiles from cold."""
    snapshot = _current(root, key)
    if snapshot is None:
        return f"compile cache {key}: no complete snapshot, compiling from cold"
    try:
        for sub in COMPILED:
            if (snapshot / sub).exists():  # a file where its directory belongs fails here too
                shutil.copytree(snapshot / sub, scratch / sub, symlinks=True, dirs_exist_ok=True)
    except OSError as exc:
        for sub in COMPILED:
            shutil.rmtree(scratch / sub, ignore_errors=True)
        return f"compile cache {key}: snapshot {snapshot.name} unreadable ({exc}): discarded, compiling from cold"
    return f"compile cache {key}: started from snapshot {snapshot.name}"


def publish(root: Path, key: str, scratch: Path) -> str:
    """Publish what a successful job compiled (``scratch``'s caches) as ``key``'s current snapshot."""
    base = root / key
    name = f"snap-{time.time_ns():020d}-{os.getpid()}"  # sorts by age
    tmp = base / f".{name}.tmp"
    try:
        base.mkdir(parents=True, exist_ok=True)
        for sub in COMPILED:
            if (scratch / sub).is_dir():
                shutil.copytree(scratch / sub, tmp / sub, symlinks=True)
        tmp.mkdir(parents=True, exist_ok=True)
        files = sum(len(f) for _, _, f in os.walk(tmp))
        (tmp / COMPLETE).write_text(json.dumps({"files": files}) + "\n")
        os.replace(tmp, base / name)
        link = base / f".{CURRENT}.{os.getpid()}"
        link.unlink(missing_ok=True)
        os.symlink(name, link)
        os.replace(link, base / CURRENT)  # atomic: a reader sees the old snapshot or this one
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        return f"compile cache {key}: not published ({exc}); the next job compiles from cold"
    _prune(base, name)
    return f"compile cache {key}: published snapshot {name} ({files} files)"


def _prune(base: Path, newest: str) -> None:
    snapshots = sorted(p for p in base.glob("snap-*") if p.is_dir())
    for old in [p for p in snapshots if p.name != newest][: max(0, len(snapshots) - KEEP)]:
        shutil.rmtree(old, ignore_errors=True)


def discard(root: Path, key: str) -> str:
    """Mark ``key``'s current snapshot bad (a job failed with it): the next job compiles from cold."""
    snapshot = _current(root, key)
    if snapshot is None:
        return ""
    try:
        (snapshot / BAD).write_text("a job failed with this snapshot\n")
    except OSError as exc:
        return f"compile cache {key}: could not mark snapshot {snapshot.name} bad ({exc})"
    return f"compile cache {key}: snapshot {snapshot.name} discarded (the job failed with it)"
