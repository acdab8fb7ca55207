"""vLLM's CPU kernels (sdbench.engine.release.cpukernels): the build each CPU loads, loaded only through
vLLM's own loader, and the kernel-touching tests run on the AVX2 build on any machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.doubles import cpuisa
from support.require import import_or_fail

from sdbench.engine.release import cpukernels
from sdbench.engine.release.cpukernels import CpuFeatures, KernelBuild

REPO = Path(__file__).resolve().parents[2]


def _features(avx2: bool = True, avx512: bool = False, bf16: bool = False, amx: bool = False,
              machine: str = "x86_64") -> CpuFeatures:  # fmt: skip
    return CpuFeatures(machine=machine, avx2=avx2, avx512=avx512, avx512_bf16=bf16, amx=amx)


@pytest.mark.parametrize(("features", "module"), [
    (_features(avx512=True, bf16=True, amx=True), "_C"),  # Sapphire Rapids
    (_features(avx512=True, bf16=True), "_C"),  # AMD EPYC 9004 (Zen 4)
    (_features(avx512=True), "_C_AVX512"),  # Skylake-SP
    (_features(), "_C_AVX2"),  # AMD EPYC 7003 (Zen 3)
    (_features(avx2=False), None),  # no build runs there
    (_features(avx2=False, machine="aarch64"), "_C"),  # the aarch64 wheel's one build
])  # fmt: skip
def test_kernel_build_follows_vllms_loader(features: CpuFeatures, module: str | None) -> None:
    assert cpukernels.kernel_build(features).module == module


def test_describe_names_the_build_and_what_the_cpu_lacks() -> None:
    features = _features()
    assert cpukernels.kernel_build(features).describe(features) == "_C_AVX2 (AVX2, no AVX-512; AMX no)"
    amx = _features(avx512=True, bf16=True, amx=True)
    assert cpukernels.kernel_build(amx).describe(amx) == "_C (AVX-512 with BF16; AMX yes)"
    assert KernelBuild(None, "no AVX2").describe(features) == "none (no AVX2)"


def test_loaded_build_is_read_from_the_process_maps(tmp_path: Path) -> None:
    site = "/venv/lib/python3.11/site-packages"
    maps = tmp_path / "maps"
    maps.write_text(f"7f00-7f10 r-xp 0 08:01 12 {site}/torch/lib/libtorch_cpu.so\n"
                    f"7f10-7f20 r-xp 0 08:01 13 {site}/vllm/_C_AVX2.abi3.so\n"
                    f"7f20-7f30 r--p 0 08:01 13 {site}/vllm/_C_AVX2.abi3.so\n")  # fmt: skip
    assert cpukernels.loaded_kernel_build(maps) == "_C_AVX2"
    maps.write_text(f"7f00-7f10 r-xp 0 08:01 12 {site}/vllm/_moe_C.abi3.so\n")
    assert cpukernels.loaded_kernel_build(maps) is None
    assert cpukernels.loaded_kernel_build(tmp_path / "absent") is None
    maps.write_text(f"1 r-xp 0 0 1 {site}/vllm/_C.abi3.so\n2 r-xp 0 0 2 {site}/vllm/_C_AVX512.abi3.so\n")
    with pytest.raises(RuntimeError, match=r"more than one.*'_C', '_C_AVX512'"):
        cpukernels.loaded_kernel_build(maps)


def test_cpu_features_are_what_the_kernel_reports() -> None:
    """torch's answers (what vLLM's loader reads) against /proc/cpuinfo's flags."""
    if os.environ.get(cpuisa.VARIABLE):
        pytest.skip(f"{cpuisa.VARIABLE} is set: this process's answers are the double's")
    flags = set(next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags")).split(":", 1)[1].split())  # fmt: skip
    features = cpukernels.cpu_features()
    assert (features.avx2, features.avx512, features.avx512_bf16, features.amx) == (
        "avx2" in flags, "avx512f" in flags, "avx512_bf16" in flags, "amx_tile" in flags)


def test_this_process_loads_the_build_its_cpu_takes() -> None:
    """vLLM's loader, asked through :func:`load_kernels`, loads the build :func:`kernel_build`
    names for this CPU (under ``SDBENCH_TEST_CPU_ISA=avx2``: ``_C_AVX2``), and its ops answer."""
    import_or_fail("vllm")
    torch = import_or_fail("torch")
    want = cpukernels.kernel_build(cpukernels.cpu_features()).module
    loaded = cpukernels.load_kernels()
    print(f"\n[cpukernels] loaded {loaded}")
    assert loaded == want
    assert hasattr(torch.ops._C, "expand_kernel_impl")


def _run(args: list[str], level: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **cpuisa.ENV[level]}
    return subprocess.run([sys.executable, *args], cwd=REPO / "tests", env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip


def test_the_kernel_tests_pass_on_the_avx2_build() -> None:
    """The fast tests that call vLLM's C++ kernels, in a process whose CPU answers as one without
    AVX-512 (support/doubles/cpuisa.py): the AVX2 build loads and every one of them passes, so a
    CI host with AVX-512 still covers an AMD EPYC 7003."""
    import_or_fail("vllm")
    done = _run(["-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-m", "not slow", "--durations=0",
                 "engine/test_enginefixes.py", "engine/test_cpukernels.py::test_this_process_loads_the_build_its_cpu_takes"],
                "avx2")  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "[cpukernels] loaded _C_AVX2" in out, out[-4000:]
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) >= 10 and " failed" not in out, out[-2000:]


def test_the_avx512_build_loads_where_the_cpu_has_avx512_without_bf16() -> None:
    """vLLM's loader on a CPU with AVX-512 but no BF16 (Skylake-SP) takes ``_C_AVX512``."""
    import_or_fail("vllm")
    if not cpukernels.cpu_features().avx512:
        pytest.skip("this CPU has no AVX-512: the AVX-512 build cannot run here (the AVX2 test covers it)")
    script = ("import sys; sys.path.insert(0, '.'); from support.doubles import cpuisa; cpuisa.pretend('avx512'); "
              "from sdbench.engine.release import cpukernels; print('LOADED', cpukernels.load_kernels())")  # fmt: skip
    done = _run(["-c", script], "avx512")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "LOADED _C_AVX512" in done.stdout, done.stdout[-2000:]


def test_an_unknown_level_is_named() -> None:
    with pytest.raises(ValueError, match=r"SDBENCH_TEST_CPU_ISA='avx1'.*avx512, avx2"):
        cpuisa.pretend("avx1")


# ----------------------------------------------------------------------------- the guard
_BUILD = r"_C(?:_AVX2|_AVX512)?\b"
# Naming a build in code: an import statement (also inside a script held in a string), or the
# module's dotted name as a whole string (importlib.import_module, import_or_fail, __import__).
DIRECT = re.compile(
    rf"(?:^|[;:\s\"'])import\s+vllm\.{_BUILD}"
    rf"|from\s+vllm\.{_BUILD}\s+import"
    rf"|from\s+vllm\s+import\s+\(?[\w\s,]*?\b{_BUILD}"
    rf"|[\"']vllm\.{_BUILD}[\"']"
)
SCANNED = ("src", "tests", "scripts", "workflow", "containers", "profiles", ".ci", "Snakefile")


def direct_kernel_imports(text: str) -> list[str]:
    """Lines of ``text`` that import a vLLM kernel build by name."""
    return [line.strip() for line in text.splitlines() if DIRECT.search(line)]


def _files() -> list[Path]:
    out = []
    for name in SCANNED:
        path = REPO / name
        found = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        out += [p for p in found if p.suffix not in {".md", ".png", ".parquet", ".json", ".jsonl", ".csv", ".pyc"}]
    return sorted(out)


def test_no_module_or_test_imports_a_kernel_build_by_name() -> None:
    """Only vLLM's loader picks a build (:func:`sdbench.engine.release.cpukernels.load_kernels`): a direct
    import of ``_C`` or ``_C_AVX512`` kills a process on a CPU without AVX-512."""
    found = []
    for path in _files():
        text = path.read_text(errors="replace")
        found += [f"{path.relative_to(REPO)}: {line}" for line in direct_kernel_imports(text)]
    assert not found, "load vLLM's kernels with sdbench.engine.release.cpukernels.load_kernels():\n" + "\n".join(found)
    assert len(_files()) > 200  # the scan reached the package and the tests


# Snippets that name a build, written without the name so that this file passes the guard.
C = "vllm." + "_C"
NAMING = [f"import {C}", f"    import {C}_AVX512 as kernels", f"from vllm import {C[5:]}",
          f"from vllm import (_custom_ops, {C[5:]}_AVX2)", f"from {C} import ops",
          f'importlib.import_module("{C}")', f"import_or_fail('{C}_AVX512')", f'__import__("{C}_AVX2")',
          f'python -c "import os; import {C}"', f"import torch; import {C}"]  # fmt: skip
NOT_NAMING = ["from vllm.platforms import current_platform", "import vllm._custom_ops",
              f"# importing ``{C}`` by name kills the process", f'x = "{C}_AVX2.abi3.so"',
              "import vllm._moe_C", "from vllm import _custom_ops"]  # fmt: skip


@pytest.mark.parametrize("line", NAMING)
def test_the_guard_flags_each_way_of_naming_a_build(line: str) -> None:
    assert direct_kernel_imports(f"x = 1\n{line}\ny = 2\n") == [line.strip()]


@pytest.mark.parametrize("line", NOT_NAMING)
def test_the_guard_lets_the_loader_and_prose_pass(line: str) -> None:
    assert direct_kernel_imports(f"{line}\n") == []
