"""TEST DOUBLE: a CPU with less than this one has (no AVX-512, or AVX-512 without BF16).

vLLM's CPU kernel loader (``CpuPlatform.import_kernels``) asks torch which ISA the CPU has
(``torch.cpu._is_avx512_supported`` and kin). :func:`pretend` makes those answers say less, so
that the loader takes the build such a CPU would load (``_C_AVX2`` for ``avx2``) and
``sdbench.engine.release.cpukernels`` reports it. The build then runs on this CPU, which has what it
needs. :data:`ENV` also brings torch's own kernels down to the level in a process started with
it (ATen's dispatch and oneDNN read these variables at start-up).

``tests/conftest.py`` calls :func:`pretend` when ``SDBENCH_TEST_CPU_ISA`` names a level, before
any test imports vLLM: ``SDBENCH_TEST_CPU_ISA=avx2 .venv/bin/python -m pytest -m "not slow"``
runs the fast tier as on an AMD EPYC 7003 (AVX2, no AVX-512). Engines that tests start in
subprocesses load what this CPU really has.
"""

from __future__ import annotations

import os

VARIABLE = "SDBENCH_TEST_CPU_ISA"
# The torch predicates each level answers False, on top of the levels above it.
_DENIED = {
    "avx512": ("_is_avx512_bf16_supported", "_is_amx_tile_supported", "_is_amx_fp16_supported"),
    "avx2": ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_vnni_supported",
             "_is_amx_tile_supported", "_is_amx_fp16_supported"),
}  # fmt: skip
LEVELS = tuple(_DENIED)
# What a process started at a level gets: the level for conftest, ATen's and oneDNN's caps.
ENV = {
    "avx512": {VARIABLE: "avx512", "ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "avx2": {VARIABLE: "avx2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}


def pretend(level: str) -> None:
    """Make torch's CPU-feature answers those of a CPU at ``level`` (``avx2`` or ``avx512``)."""
    if level not in _DENIED:
        raise ValueError(f"{VARIABLE}={level!r}: expected one of {', '.join(LEVELS)}")
    import torch

    for name in _DENIED[level]:
        setattr(torch.cpu, name, _false)


def _false() -> bool:
    return False


def pretend_from_environment() -> str | None:
    """:func:`pretend` at ``$SDBENCH_TEST_CPU_ISA`` when it is set; returns the level."""
    level = os.environ.get(VARIABLE) or None
    if level is not None:
        pretend(level)
    return level
