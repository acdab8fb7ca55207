"""The doctor's RAPL check for CPU engines (sdbench.doctormeters), on fake powercap trees in tmp_path.

No RAPL exists on this VM (no /sys/class/powercap), so every tree here is made by hand: a
package with its DRAM domain, a package without one, an unreadable counter, no powercap at all.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from sdbench import doctormeters
from sdbench.doctormeters import RAPL_CHECK, RAPL_FIX, meter_checks, rapl_check
from tests.support.doubles.rootonly import refuse_reads


def tree(root: Path, domains: dict[str, str]) -> Path:
    for name, label in domains.items():
        (root / name).mkdir(parents=True)
        (root / name / "name").write_text(label + "\n")
        (root / name / "max_energy_range_uj").write_text("262143328850\n")
        (root / name / "energy_uj").write_text("123456\n")
    return root


def site(*devices: str) -> SimpleNamespace:
    engines = {f"e{i}": {"device": d} for i, d in enumerate(devices)}
    cells = [SimpleNamespace(engine=e) for e in engines]
    return SimpleNamespace(config={"engines": engines}, plan=SimpleNamespace(cells=cells))


def test_the_rapl_check_says_what_reads_what_does_not_and_how_to_open_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = tree(tmp_path / "full", {"intel-rapl:0": "package-0", "intel-rapl:0:0": "core", "intel-rapl:0:1": "dram",
                                    "intel-rapl:1": "psys"})  # fmt: skip
    assert rapl_check(full).line() == f"{RAPL_CHECK}: packages intel-rapl:0; DRAM intel-rapl:0:1 | ok"
    amd = tree(tmp_path / "amd", {"intel-rapl:0": "package-0"})
    assert rapl_check(amd).line() == f"{RAPL_CHECK}: packages intel-rapl:0; no DRAM domain (package energy only) | ok"
    absent = tmp_path / "absent"
    assert rapl_check(absent).line() == (
        f"{RAPL_CHECK} | skipped: no RAPL: {absent} does not exist (no powercap driver: a VM, or a kernel without "
        "intel_rapl): CPU energy will be 'not measured'")  # fmt: skip
    # Root-only since CVE-2020-8694 (the test runs as root: the read itself is refused).
    locked = full / "intel-rapl:0" / "energy_uj"
    refuse_reads(monkeypatch, locked)
    result = rapl_check(full)
    assert (result.status, result.why, result.fix) == (
        "FAILED", f"RAPL unreadable: permission denied on {locked} (root-only since CVE-2020-8694)", RAPL_FIX)
    assert "sudo chmod o+r /sys/class/powercap/intel-rapl:*/energy_uj" in result.fix and "udev" in result.fix


def test_the_doctor_checks_rapl_for_cpu_engines_only(tmp_path: Path) -> None:
    root = tree(tmp_path / "pc", {"intel-rapl:0": "package-0"})
    assert [r.check.split(":")[0] for r in meter_checks(site("cpu"), root)] == [RAPL_CHECK]
    assert [r.check.split(":")[0] for r in meter_checks(site("cuda", "cpu"), root)] == [RAPL_CHECK]
    assert meter_checks(site("cuda"), root) == []
    assert meter_checks(SimpleNamespace(config=None, plan=None), root) == []
    # The doctor runs it: its run_checks calls this module.
    import inspect

    from sdbench import doctor

    assert "doctormeters.meter_checks(site)" in inspect.getsource(doctor.run_checks)
    assert doctormeters.grid_uses(site("cpu"), "cpu")
