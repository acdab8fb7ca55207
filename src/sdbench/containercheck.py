"""``sdbench containers check``: the committed definition files against ``containers/images.yaml``.

Each definition is parsed with spython (as Apptainer tooling does, rather than trusting the
renderer of :mod:`sdbench.containers`) and must be pinned by digest, labelled, tested and
identical to a fresh rendering; the pins of images.yaml and the requirements files must agree
with ``requirements/lock.txt``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import sdbench
from sdbench.containers import (
    BASE_RE,
    HEX64_RE,
    ImagesFile,
    ImageSpec,
    canonical_name,
    image_labels,
    images_path,
    load_images,
    render_image,
    version_check,
)


@dataclass
class ParsedDefinition:
    """What spython reads from a definition file."""

    from_header: str
    labels: dict[str, str]
    environ: dict[str, str]
    files: list[str]
    post: list[str]
    test: list[str]


def parse_definition(path: str | Path) -> ParsedDefinition:
    """Parse ``path`` with spython's SingularityParser.

    spython turns %test into ``echo`` lines appended to the install steps; the subclass
    keeps the %test lines as they are instead.
    """
    from spython.main.parse.parsers import SingularityParser

    class _Parser(SingularityParser):
        def _test(self, lines: list[str]) -> None:
            self.test_lines = list(lines)

    path = Path(path)
    if not path.is_file():  # spython would sys.exit
        raise FileNotFoundError(path)
    parser = _Parser(str(path))
    recipe = parser.recipe[parser.active_layer]
    labels = {}
    for line in recipe.labels:
        key, _, value = line.partition(" ")
        labels[key] = value.strip()
    environ = {}
    for item in recipe.environ:
        key, _, value = item.partition("=")
        environ[key.strip()] = value.strip()
    return ParsedDefinition(
        from_header=recipe.fromHeader or "",
        labels=labels,
        environ=environ,
        files=list(recipe.files),
        post=list(recipe.install),
        test=list(getattr(parser, "test_lines", [])),
    )


def lock_versions(path: Path) -> dict[str, str]:
    """Canonical name -> version of a pip-freeze style file."""
    versions = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            versions[canonical_name(name)] = version.strip()
    return versions


def _check_pins(images: ImagesFile, root: Path) -> list[str]:
    """Pins of images.yaml and of the requirements files that differ from requirements/lock.txt."""
    lock_path = root / "requirements" / "lock.txt"
    if not lock_path.is_file():
        return []
    lock = lock_versions(lock_path)
    problems = []

    def compare(source: str, name: str, version: str) -> None:
        want = lock.get(canonical_name(name))
        if want is not None and want != version:
            problems.append(f"{source}: {name}=={version} differs from requirements/lock.txt ({name}=={want})")

    for image in images.images:
        for key in ("pip", "datasets_pip"):
            for pin in getattr(image, key):
                compare(f"{images.path}: image {image.name!r}: key {key!r}", *pin.split("=="))
        if image.requirements:
            req = root / image.requirements
            if not req.is_file():
                problems.append(f"{images.path}: image {image.name!r}: key 'requirements': {req} does not exist")
            elif req != lock_path:
                for name, version in lock_versions(req).items():
                    compare(str(req), name, version)
    return problems


def check_image(image: ImageSpec, path: Path, sdbench_version: str | None = None) -> list[str]:
    """Problems of one rendered definition (empty when it is fine)."""
    if not path.is_file():
        return [f"{path}: missing (run `sdbench containers render`)"]
    parsed = parse_definition(path)
    problems = []
    if not BASE_RE.match(parsed.from_header) or not HEX64_RE.match(parsed.from_header.rsplit(":", 1)[-1]):
        problems.append(f"{path}: From: {parsed.from_header!r} is not pinned by @sha256:<64 hex>")
    elif parsed.from_header != image.base.lower():  # spython lower-cases the header
        problems.append(f"{path}: From: {parsed.from_header!r} differs from images.yaml base {image.base!r}")
    for key, want in image_labels(image, sdbench_version or sdbench.__version__).items():
        got = parsed.labels.get(key)
        if got is None:
            problems.append(f"{path}: label {key} missing")
        elif got != want:
            problems.append(f"{path}: label {key} is {got!r}, images.yaml says {want!r}")
    if "HF_HUB_OFFLINE" not in parsed.environ:
        problems.append(f"{path}: %environment does not set HF_HUB_OFFLINE")
    if not parsed.test:
        problems.append(f"{path}: no %test section")
    elif image.vllm_version and version_check(image.vllm_version) not in parsed.test:
        problems.append(f"{path}: %test does not check vllm.__version__ == {image.vllm_version!r}")
    elif not image.vllm_version and "sdbench --help >/dev/null" not in parsed.test:
        problems.append(f"{path}: %test does not run sdbench --help")
    if path.read_text() != render_image(image, sdbench_version):
        problems.append(f"{path}: out of date with images.yaml / the template (run `sdbench containers render`)")
    return problems


# Where `containers check` keeps the source archives it reads (downloaded once, sha256-checked).
SOURCE_ARCHIVES = Path("resources/source-archives")
_COMPILED_SUFFIXES = {".c", ".cc", ".cpp", ".cxx", ".cu"}
_COMPILERS = ("g++", "gcc", "clang", "build-essential")


def archive_build_facts(archive: Path) -> tuple[list[str], bool]:
    """(``[build-system] requires`` of a source archive's pyproject.toml, whether it compiles code)."""
    import tarfile
    import tomllib

    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        tops = [m for m in members if m.name.count("/") == 1 and m.name.endswith("/pyproject.toml")]
        if not tops:
            raise ValueError(f"{archive.name}: no top-level pyproject.toml")
        handle = tar.extractfile(tops[0])
        assert handle is not None
        requires = tomllib.loads(handle.read().decode())["build-system"]["requires"]
        compiles = any(Path(m.name).suffix in _COMPILED_SUFFIXES or m.name.endswith("/CMakeLists.txt") for m in members)
    return list(requires), compiles


def _check_source_builds(images: ImagesFile, cache: Path, offline: bool) -> tuple[list[str], list[str]]:
    """Every build requirement of every source archive an image builds is pinned (or the image's).

    Reads each archive's own ``pyproject.toml`` (downloaded once, sha256-checked): a requirement
    must be in ``build_pip`` at a version its specifier admits, or named in ``from_image``; an
    archive with C/C++ sources needs a pinned compiler in ``apt``.
    """
    from packaging.requirements import Requirement

    from sdbench.download import DownloadError, download_verified

    problems: list[str] = []
    warnings: list[str] = []
    for image in images.images:
        for build in image.source_builds:
            where = f"{images.path}: image {image.name!r}: source build {build.requirement}"
            archive = cache / build.url.rsplit("/", 1)[-1]
            if offline and not archive.is_file():
                warnings.append(f"{where}: build requirements not verified (--offline, {archive} not cached)")
                continue
            try:
                download_verified(build.url, archive, build.sha256, timeout=60.0)
            except DownloadError as exc:
                problems.append(f"{where}: {exc} (or pass --offline to skip this check)")
                continue
            requires, compiles = archive_build_facts(archive)
            pinned = {canonical_name(p.split("==")[0]): p.split("==")[1] for p in build.build_pip}
            image_side = {canonical_name(n) for n in build.from_image}
            for text in requires:
                req = Requirement(text)
                name = canonical_name(req.name)
                if name in image_side:
                    continue
                if name not in pinned:
                    problems.append(f"{where}: build requirement {text!r} is neither in build_pip nor from_image")
                elif not req.specifier.contains(pinned[name], prereleases=True):
                    problems.append(f"{where}: build_pip pins {req.name}=={pinned[name]}, the archive requires {text!r}")
            unused = sorted(image_side - {canonical_name(Requirement(t).name) for t in requires})
            if unused:
                problems.append(f"{where}: from_image names {', '.join(unused)}, which the archive does not require")
            if compiles and not any(p.split("=")[0].startswith(_COMPILERS) for p in build.apt):
                problems.append(f"{where}: the archive compiles C/C++ but apt pins no compiler ({', '.join(_COMPILERS)})")
    return problems, warnings


def check_all(
    images_path: str | Path, output_dir: str | Path, offline: bool = False, archives: Path = SOURCE_ARCHIVES
) -> tuple[list[str], list[str]]:
    """(problems, warnings) of every rendered definition in ``output_dir``, and of the build
    requirements of every source archive an image builds (read from the archive; ``offline``
    skips those not cached)."""
    images = load_images(images_path)
    out = Path(output_dir)
    problems: list[str] = []
    for image in images.images:
        problems += check_image(image, out / f"{image.name}.def")
    known = {f"{image.name}.def" for image in images.images}
    for path in sorted(out.glob("*.def")):
        if path.name not in known:
            problems.append(f"{path}: not rendered from {images.path} (delete it or add the image there)")
    problems += _check_pins(images, out.resolve().parent)
    warnings = [f"{name}: no definition: {reason}" for name, reason in images.unresolved.items()]
    build_problems, build_warnings = _check_source_builds(images, archives, offline)
    return problems + build_problems, warnings + build_warnings


def _cmd_check(args: argparse.Namespace) -> int:
    problems, warnings = check_all(images_path(args), args.output_dir, offline=args.offline)
    for warning in warnings:
        print(f"warning: {warning}")
    for problem in problems:
        print(f"error: {problem}")
    if problems:
        return 1
    print(f"ok: definitions in {args.output_dir} match {images_path(args)}")
    return 0
