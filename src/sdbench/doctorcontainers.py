"""``sdbench doctor``, containers (``software-deployment-method: apptainer``): Apptainer (or
Singularity) at a version Snakemake accepts, then per image the config needs: built
(``containers/sif/<name>.sif``), from the current definition with the labels of
``containers/images.yaml`` and the checkout's code, and for CUDA images the GPUs seen inside it
on a driver the image's CUDA accepts.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from sdbench.doctorcore import OK, Result, failed, ok, skipped
from sdbench.doctorcore import run_command as _run
from sdbench.doctorgpu import cuda_images
from sdbench.doctorsite import Site
from sdbench.gpudriver import driver_check
from sdbench.gpudriver import first_line as _first_line
from sdbench.gpudriver import version_tuple as _version_tuple


SIF_DIR = Path("containers/sif")


IMAGES = Path("containers/images.yaml")

# Minimum runtime versions Snakemake 9 accepts (snakemake/deployment/singularity.py, Singularity.check).
MIN_APPTAINER = (1, 0, 0)

MIN_SINGULARITY = (2, 4, 1)


def uses_apptainer(profile: Mapping[str, Any]) -> bool:
    sdm = profile.get("software-deployment-method") or profile.get("sdm") or []
    return "apptainer" in ([sdm] if isinstance(sdm, str) else list(sdm))


def container_runtime(which: Callable[[str], str | None] = shutil.which) -> tuple[Result, str | None]:
    """Apptainer (else Singularity) on PATH at a version Snakemake accepts; also its path."""
    binary = which("apptainer") or which("singularity")
    if binary is None:
        return failed("apptainer on PATH", "neither apptainer nor singularity is on PATH",
                      "install Apptainer >= 1.0 (apptainer.org/docs/admin) or `module load apptainer`"), None
    out = _run([binary, "--version"])
    text = (out.stdout or out.stderr).strip()
    if out.returncode != 0:
        return failed(f"apptainer {binary}", f"`{binary} --version` exited {out.returncode}: {_first_line(out.stderr)}",
                      "repair the Apptainer installation"), None
    need = MIN_APPTAINER if "apptainer" in text else MIN_SINGULARITY
    if _version_tuple(text.split()[-1]) < need:
        return failed(f"apptainer {binary} ({text})", f"older than {'.'.join(map(str, need))}",
                      "install Apptainer >= 1.0"), binary
    return ok(f"apptainer {binary} ({text})"), binary


def _snakefile_container(root: Path) -> str | None:
    """The Snakefile's global ``container:`` (the analysis steps' image)."""
    match = re.search(r'^container:\s*"([^"]+)"', (root / "Snakefile").read_text(), re.MULTILINE)
    return match.group(1) if match else None


def images_needed(root: Path, config: Mapping[str, Any], cells: Iterable[Any]) -> list[str]:
    """Container paths a run needs: the analysis image and the image of every engine in the grid."""
    engines = sorted({c.engine for c in cells})
    paths = [p for p in [_snakefile_container(root)] if p]
    paths += [config["engines"][e]["container"] for e in engines if config["engines"][e].get("container")]
    return list(dict.fromkeys(paths))


def image_built(root: Path, container: str, images: Mapping[str, Any]) -> Result:
    """``containers/sif/<name>.sif`` exists and ``<name>`` is an image of containers/images.yaml."""
    name = Path(container).stem
    check = f"image {container} built"
    if Path(container).parent != SIF_DIR or Path(container).suffix != ".sif":
        return skipped(check, f"not a {SIF_DIR}/<name>.sif of {IMAGES}: cannot be checked against it")
    if name not in images:
        return failed(check, f"{IMAGES} has no image {name!r}",
                      f"add it to {IMAGES} or name one of: {', '.join(images)}")
    if not (root / container).is_file():
        return failed(check, "no such file", f"bash containers/build.sh {name}")
    return ok(check)


def inspect_image(binary: str, sif: Path) -> tuple[dict[str, str], str] | str:
    """(labels, definition) of a built image (``apptainer inspect --json --labels --deffile``),
    or the one-line error."""
    out = _run([binary, "inspect", "--json", "--labels", "--deffile", str(sif)])
    if out.returncode != 0:
        return f"`{binary} inspect` exited {out.returncode}: {_first_line(out.stderr)}"
    try:
        attributes = json.loads(out.stdout)["data"]["attributes"]
    except (ValueError, KeyError, TypeError):
        return f"`{binary} inspect --json` printed no data.attributes"
    return dict(attributes.get("labels") or {}), str(attributes.get("deffile") or "")


def image_matches(root: Path, container: str, spec: Any, binary: str) -> Result:
    """A built image carries the labels of containers/images.yaml (base digest, vLLM version,
    sdbench version), was built from the current ``containers/<name>.def`` and holds the checkout's
    sdbench code (its ``org.sdbench.code.digest``: a run refuses it otherwise)."""
    import sdbench
    from sdbench.codedigest import package_digest
    from sdbench.containers import CODE_LABEL, image_labels

    name = Path(container).stem
    check = f"image {container} matches {IMAGES}"
    found = inspect_image(binary, root / container)
    if isinstance(found, str):
        return failed(check, found, f"bash containers/build.sh {name}")
    labels, deffile = found
    want = image_labels(spec, sdbench.__version__)
    wrong = [f"{k}={labels.get(k, '<none>')} (want {v})" for k, v in want.items() if labels.get(k) != v]
    rebuild = f"sdbench containers render && bash containers/build.sh {name}"
    if wrong:
        return failed(check, f"labels differ: {'; '.join(wrong[:3])}", rebuild)
    definition = root / "containers" / f"{name}.def"
    if deffile.rstrip("\n") != definition.read_text().rstrip("\n"):
        return failed(check, f"built from another definition than {definition} (its pins changed since the build)",
                      rebuild)
    checkout = package_digest()
    if labels.get(CODE_LABEL) != checkout:
        return failed(check, f"it holds sdbench code {labels.get(CODE_LABEL) or '<no digest>'}, the checkout's is "
                             f"{checkout} (a run refuses it)", f"bash containers/build.sh {name}")  # fmt: skip
    return ok(check)


def image_gpus(root: Path, container: str, binary: str) -> Result:
    """``apptainer exec --nv IMAGE nvidia-smi`` sees a GPU, on a driver the image's CUDA accepts."""
    name = Path(container).stem
    return driver_check(f"GPUs in {container}", [binary, "exec", "--nv", str(root / container)], [name])


def apptainer_checks(site: Site) -> list[Result]:
    """Runtime, then per image: built, matching images.yaml, GPUs inside (CUDA images)."""
    from sdbench.containers import load_images

    if not uses_apptainer(site.profile):
        return [skipped("apptainer", f"{site.profile_dir or 'no profile'} runs without containers "
                                     "(no software-deployment-method: apptainer)")]
    runtime, binary = container_runtime()
    results = [runtime]
    if site.config is None:
        return results
    specs = {image.name: image for image in load_images(site.root / IMAGES).images}
    gpu_images = cuda_images(site)
    for container in images_needed(site.root, site.config, site.plan.cells):
        name = Path(container).stem
        built = image_built(site.root, container, specs)
        results.append(built)
        if built.status != OK:
            continue
        if binary is None:
            results.append(skipped(f"image {container} matches {IMAGES}", "no apptainer to inspect it"))
            continue
        results.append(image_matches(site.root, container, specs[name], binary))
        if name in gpu_images:
            results.append(image_gpus(site.root, container, binary))
    return results
