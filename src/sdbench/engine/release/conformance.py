"""``sdbench engines conformance``: every engine touchpoint checked against the real vLLM sources.

The touchpoints (:mod:`sdbench.engine.release.touchpoints`) are declared by the modules that rely on them;
this command evaluates each one against the Python source of every engine release the config
can name (:func:`sdbench.engine.release.versions.known_versions`), without importing it. The sources are
the released wheels, pinned by exact URL and sha256 in ``containers/images.yaml``
(``engine_sources``, next to the image pins): each is downloaded once, checked, and only its
``vllm/**/*.py`` and metadata kept in the cache directory. ``--source-dir VERSION=DIR`` reads an
unpacked wheel or checkout instead (a machine without network, or a fork).

It also checks what the shipped configs pass straight through to vLLM: the
``speculative_config`` keys of every method and the ``llm_kwargs`` of every engine, against the
release that engine names.

Output: one line per touchpoint and release, ``touchpoint | release | ok`` or
``... | FAILED: why``; exit status 1 if any failed, 2 if a source cannot be had.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from sdbench.config import load_config
from sdbench.download import ChecksumError, DownloadError, download_verified
from sdbench.engine.release import touchpoints as tp
from sdbench.engine.release.versions import known_versions
from sdbench.errors import ConfigError
from sdbench.grid import breakdown_cells, cells

DEFAULT_IMAGES = Path("containers/images.yaml")
DEFAULT_CACHE = Path("resources/engine-sources")
DEFAULT_CONFIGS = ("config/config.yaml", "config/paper.yaml", "config/gpu-smoke.yaml")
_STAMP = "sdbench-source.json"  # what an unpacked cache entry came from


@dataclass(frozen=True)
class SourcePin:
    """Where one release's source comes from: a wheel by URL and sha256."""

    version: str
    distribution: str
    url: str
    sha256: str

    @property
    def filename(self) -> str:
        """The wheel's file name."""
        return self.url.rsplit("/", 1)[-1]


def load_pins(images: str | Path = DEFAULT_IMAGES) -> dict[str, SourcePin]:
    """The ``engine_sources`` of ``images.yaml``: release -> pin (``ConfigError`` naming a bad key)."""
    path = Path(images)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    entries = (raw or {}).get("engine_sources")
    if not isinstance(entries, dict) or not entries:
        raise ConfigError(f"{path}: key 'engine_sources': missing (release -> {{distribution, url, sha256}})")
    pins = {}
    for version, entry in entries.items():
        where = f"{path}: engine_sources.{version}"
        if not isinstance(version, str):
            raise ConfigError(f"{where}: quote the release as a string")
        if not isinstance(entry, dict) or set(entry) != {"distribution", "url", "sha256"}:
            raise ConfigError(f"{where}: expected exactly the keys distribution, url, sha256")
        sha = str(entry["sha256"])
        if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise ConfigError(f"{where}: key 'sha256': expected 64 lowercase hex digits, got {sha!r}")
        url = str(entry["url"])
        if not url.startswith("https://") or not url.endswith(".whl"):
            raise ConfigError(f"{where}: key 'url': expected an https URL of a .whl, got {url!r}")
        pins[version] = SourcePin(version, str(entry["distribution"]), url, sha)
    return pins


class SourceUnavailable(RuntimeError):
    """A release's source could not be had (no network, no cache, no --source-dir)."""


def _unpack(wheel: Path, dest: Path, pin: SourcePin) -> None:
    """Keep the wheel's Python sources and metadata in ``dest`` (written aside, then renamed)."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                keep = (name.startswith("vllm/") and name.endswith(".py")) or (
                    ".dist-info/" in name and name.rsplit("/", 1)[-1] in {"METADATA", "entry_points.txt"}
                )
                if keep:
                    zf.extract(name, tmp)
        (tmp / _STAMP).write_text(json.dumps({"url": pin.url, "sha256": pin.sha256}, sort_keys=True))
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def obtain(pin: SourcePin, cache_dir: str | Path, offline: bool = False) -> Path:
    """The unpacked source of ``pin`` in ``cache_dir`` (downloaded and verified once)."""
    cache = Path(cache_dir)
    dest = cache / pin.version
    stamp = dest / _STAMP
    if stamp.is_file() and json.loads(stamp.read_text()).get("sha256") == pin.sha256:
        return dest
    if offline:
        raise SourceUnavailable(
            f"vLLM {pin.version}: not in {cache} and --offline; give it with --source-dir {pin.version}=DIR"
        )

    wheel = cache / pin.filename
    try:
        download_verified(pin.url, wheel, pin.sha256, timeout=60.0)
    except DownloadError as exc:
        raise SourceUnavailable(
            f"vLLM {pin.version}: {exc}; give the unpacked wheel with --source-dir {pin.version}=DIR "
            f"(pip download --no-deps {pin.distribution}=={pin.version}; unzip -q the .whl 'vllm/*' -d DIR)"
        ) from None
    except ChecksumError as exc:
        raise SourceUnavailable(f"vLLM {pin.version}: {exc} (images.yaml engine_sources)") from None
    try:
        _unpack(wheel, dest, pin)
    finally:
        wheel.unlink(missing_ok=True)
    return dest


# ---------------------------------------------------------------------------- config pass-through
def config_touchpoints(configs: Iterable[str | Path]) -> list[tp.Touchpoint]:
    """Touchpoints for what the configs hand to vLLM unchanged, per release their engines name."""
    from sdbench.servermode import server_groups

    spec_keys: dict[str, dict[str, str]] = {}  # version -> key -> where
    llm_keys: dict[str, dict[str, str]] = {}
    for path in configs:
        config = load_config(str(path))
        pairs = {(c.engine, c.method) for c in [*cells(config), *breakdown_cells(config)]}
        pairs |= {(g.engine, m) for g in server_groups(config) for m in g.methods}  # every arm of a server job
        for engine_name, method_name in sorted(pairs):
            version = config["engines"][engine_name]["vllm_version"]
            for key in config["engines"][engine_name].get("llm_kwargs", {}):
                llm_keys.setdefault(version, {}).setdefault(key, f"{path}: engines.{engine_name}.llm_kwargs")
            for key in config["methods"][method_name].get("speculative_config", {}):
                spec_keys.setdefault(version, {}).setdefault(
                    key, f"{path}: methods.{method_name}.speculative_config (engine {engine_name})"
                )
    out = []
    for version, keys in sorted(spec_keys.items()):
        out.append(_keys_touchpoint("config.speculative_config", version, "vllm.config:SpeculativeConfig", keys))
    for version, keys in sorted(llm_keys.items()):
        out.append(_keys_touchpoint("config.llm_kwargs", version, "vllm.engine.arg_utils:EngineArgs", keys))
    return out


def _keys_touchpoint(name: str, version: str, target: str, keys: dict[str, str]) -> tp.Touchpoint:
    def check(src: tp.SourceTree) -> str | None:
        fields = src.class_fields(target)
        missing = sorted(k for k in keys if k not in fields)
        return "; ".join(f"{keys[k]}: {k!r} is not a field of {target}" for k in missing) or None

    return tp.Touchpoint(name, check, frozenset({version}), (target,), owner=__name__)


# ---------------------------------------------------------------------------- the command
def _source_dirs(values: list[str]) -> dict[str, Path]:
    out = {}
    for value in values:
        version, sep, directory = value.partition("=")
        if not sep or not version or not directory:
            raise ConfigError(f"--source-dir {value!r}: expected VERSION=DIR")
        out[version] = Path(directory)
    return out


def run(
    versions: list[str],
    pins: dict[str, SourcePin],
    source_dirs: dict[str, Path],
    cache_dir: Path,
    configs: list[str],
    offline: bool = False,
    out: object = sys.stdout,
) -> int:
    """Check every touchpoint on every release in ``versions``; print the lines; exit status."""
    touchpoints = tp.registry() + config_touchpoints(configs)
    failed = 0
    for version in versions:
        if version in source_dirs:
            root = source_dirs[version]
        elif version in pins:
            root = obtain(pins[version], cache_dir, offline)
        else:
            raise ConfigError(f"vLLM {version}: no engine_sources pin in images.yaml and no --source-dir {version}=DIR")
        src = tp.SourceTree(root, version)
        for result in tp.evaluate(touchpoints, src):
            failed += not result.ok
            print(result.line(), file=out)  # type: ignore[call-arg]
    total = len(touchpoints)
    print(f"# {total} touchpoints declared, {len(versions)} releases, {failed} failed", file=out)  # type: ignore[call-arg]
    return 1 if failed else 0


def _cmd_conformance(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    pins = load_pins(args.images)
    versions = args.version or known_versions()
    unknown = sorted(set(versions) - set(known_versions()))
    if unknown:
        raise ConfigError(f"--version {unknown[0]}: not an engine release sdbench knows ({', '.join(known_versions())})")
    configs = args.config if args.config is not None else [c for c in DEFAULT_CONFIGS if os.path.exists(c)]
    try:
        status = run(versions, pins, _source_dirs(args.source_dir), Path(args.cache_dir), configs, args.offline)
    except SourceUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"# {time.perf_counter() - t0:.1f} s", file=sys.stdout)
    return status
