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


def _lock_versions(path: Path) -> dict[str, str]:
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
    lock = _lock_versions(lock_path)
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
                for name, version in _lock_versions(req).items():
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


def check_all(images_path: str | Path, output_dir: str | Path) -> tuple[list[str], list[str]]:
    """(problems, warnings) of every rendered definition in ``output_dir``."""
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
    return problems, warnings


def _cmd_check(args: argparse.Namespace) -> int:
    problems, warnings = check_all(images_path(args), args.output_dir)
    for warning in warnings:
        print(f"warning: {warning}")
    for problem in problems:
        print(f"error: {problem}")
    if problems:
        return 1
    print(f"ok: definitions in {args.output_dir} match {images_path(args)}")
    return 0
