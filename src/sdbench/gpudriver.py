"""What a CUDA engine image needs of the NVIDIA driver, and the check of it.

Apart from :mod:`sdbench.doctor` because an image's gate (:mod:`sdbench.imagegate`) runs it in a
job: the gate's code digest is this small module's, so an edit of the doctor gates no image again
(a gate that reruns reruns every engine job of its image after it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sdbench.doctorcore import Result, failed, ok, run_command

# Image -> (CUDA major version of its base image, minimum NVIDIA driver, where they come from).
# The driver minimum is NVIDIA's for CUDA minor-version compatibility, "CUDA Toolkit 11.x, 12.x
# and 13.x Driver Version Ranges" (docs.nvidia.com/deploy/cuda-compatibility/
# minor-version-compatibility.html, Table 1): CUDA 12.x needs >= 525, CUDA 13.x >= 580. Only the
# major version decides it. The images' own Dockerfiles could not be read at their tags here.
IMAGE_CUDA: dict[str, tuple[int, str, str]] = {
    "sdbench-vllm-0.10.1.1": (
        12, "525", "vllm 0.10.1.1 pins torch==2.7.1 (PyPI metadata), built for CUDA <= 12.8; vLLM's Dockerfile: 12.8.1"
    ),
    "sdbench-vllm-0.11.1": (
        12, "525", "vllm 0.11.1 pins torch==2.9.0 (PyPI metadata); the plain v0.11.1 image tag is a CUDA 12 build"
    ),
    "sdbench-vllm-0.26.0": (
        13, "580", "vllm 0.26.0 pins torch==2.11.0 (PyPI metadata); its image is CUDA 13 (containers/images.yaml)"
    ),
}  # fmt: skip


def version_tuple(text: str) -> tuple[int, ...]:
    """Leading dotted integers of ``text`` ("580.65.06" -> (580, 65, 6))."""
    match = re.match(r"\d+(?:\.\d+)*", text.strip())
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


def first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def image_cuda(name: str) -> tuple[int, str, str] | None:
    """(CUDA major, minimum driver, source) of an engine image, from :data:`IMAGE_CUDA`."""
    return IMAGE_CUDA.get(name)


def _nvidia_smi(prefix: Sequence[str]) -> tuple[list[tuple[str, str]], str] | str:
    """GPUs as (name, driver version) and the driver's CUDA version, or the one-line error."""
    out = run_command([*prefix, "nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    if out.returncode != 0:
        return f"nvidia-smi exited {out.returncode}: {first_line(out.stderr or out.stdout)}"
    gpus = [tuple(part.strip() for part in line.rsplit(",", 1)) for line in out.stdout.splitlines() if "," in line]
    if not gpus:
        return "nvidia-smi lists no GPU"
    header = run_command([*prefix, "nvidia-smi"])
    match = re.search(r"CUDA Version:\s*([\d.]+)", header.stdout)
    return [(g[0], g[1]) for g in gpus], match.group(1) if match else "unknown"


def driver_check(check: str, prefix: Sequence[str], images: Sequence[str]) -> Result:
    """GPUs visible through ``prefix`` + ``nvidia-smi`` and the driver at least every image's minimum."""
    found = _nvidia_smi(prefix)
    if isinstance(found, str):
        inside = " inside the image" if prefix else ""
        return failed(check, f"no GPU visible{inside}: {found}",
                      "run on a GPU node with the NVIDIA driver" + (" (apptainer exec --nv)" if prefix else ""))
    gpus, cuda = found
    driver = gpus[0][1]
    names = ", ".join(sorted({g[0] for g in gpus}))
    too_old = []
    for image in images:
        facts = image_cuda(image)
        if facts and version_tuple(driver) < version_tuple(facts[1]):
            too_old.append(f"{image} needs CUDA {facts[0]} = driver >= {facts[1]} ({facts[2]})")
    check = f"{check}: {len(gpus)} x {names}, driver {driver} (CUDA {cuda})"
    if too_old:
        return failed(check, "driver too old: " + "; ".join(too_old),
                      "upgrade the NVIDIA driver, or use an image of an older CUDA (config engines.*.container)")
    return ok(check)
