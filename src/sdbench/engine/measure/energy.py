"""Energy meters: joules a timed call cost, read from a hardware counter before and after it.

A meter is a cumulative counter in joules (:meth:`Meter.read`); a timed call's energy is
``meter.read()`` after it minus before it (:meth:`sdbench.engine.measure.trials.CellRun.time_call`).

- ``nvml``: on a GPU engine, NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``,
  millijoules since the driver loaded; Volta and later) summed over the engine's GPUs: the first
  ``tensor_parallel_size`` of the devices ``CUDA_VISIBLE_DEVICES`` names (all of the node's when
  it is unset). The board's energy, not the host's. The counter, not sampled power: nothing is
  lost between samples. It advances in the driver's own updates (tens of ms), so a call shorter than
  that reads coarse; the bootstrap over trials carries that spread.
- ``rapl``: on a CPU engine, the package domains of Linux powercap RAPL
  (``/sys/class/powercap/intel-rapl:<N>/energy_uj``, microjoules; the ``psys`` platform domain left
  out, it contains the packages) and, where the machine has them, their ``dram`` subdomains
  (``intel-rapl:<N>:<M>`` named ``dram``: the memory's energy, not part of the package's, where CPU
  decoding spends its weight reads), summed; :attr:`RaplMeter.dram_j` keeps the DRAM part apart
  (the calls' ``energy_dram_j``). Each counter wraps at its ``max_energy_range_uj``: a reading
  below the last one adds the distance to the wrap (an unchanged reading adds 0), so calls shorter
  than one wrap (minutes at full power) are exact. The whole socket's energy, neighbours' work
  included (the quiet-machine guard flags a busy machine). ``energy_uj`` is readable by root only
  on kernels patched for CVE-2020-8694 (Platypus): then no meter, and the reason says how to open it.
- ``not measured``: neither exists or can be read. The meter reads NaN, so every energy column of
  the cell is NaN and its ``energy_meter`` column says ``not measured``: never 0.

Every meter has a ``reason`` (the calls' and cells' ``energy_reason``): empty when it measures,
else why not, in words a user can act on (:func:`meter_for`; "mixed meters across trials" for a
cell whose calls read different meters, :func:`reason_of`).

:func:`energy_columns` and :func:`paired_energy_columns` turn a cell's calls into its summary's
energy columns (joules per output token with its 95% bootstrap interval; the paired energy ratio).
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

log = logging.getLogger(__name__)

NVML, RAPL, NOT_MEASURED = "nvml", "rapl", "not measured"
RAPL_ROOT = Path("/sys/class/powercap")
# A package domain: intel-rapl:<N> (its subzones, intel-rapl:<N>:<M>, are parts of it, but for
# ``dram``: the memory's own counter, outside the package's).
_RAPL_PACKAGE = re.compile(r"^intel-rapl:\d+$")
_RAPL_SUBZONE = re.compile(r"^intel-rapl:\d+:\d+$")
# Why energy_uj is root-only, and how a site opens it (docs/measurement.md, Energy).
RAPL_FIX = ("root-only since CVE-2020-8694; to meter, make it readable: "
            "`sudo chmod o+r /sys/class/powercap/intel-rapl:*/energy_uj /sys/class/powercap/intel-rapl:*:*/energy_uj` "
            "(until reboot) or a udev rule, see docs/measurement.md, Energy")
MIXED_METERS = "mixed meters across trials"
REHEARSAL_NOT_METERED = "rehearsal: nothing ran to meter"  # a rehearsed cell's energy_reason
# The per-call column a cell's energy is bootstrapped on (sdbench.engine.measure.resampling, column=...).
JOULES_PER_TOKEN = "joules_per_token"
# Summary columns of a paired cell's energy (set by paired_energy_columns; NaN when not paired).
PAIRED_ENERGY_COLUMNS = (
    "paired_baseline_joules_per_token",
    "paired_energy_ratio",
    "paired_energy_ratio_ci_low",
    "paired_energy_ratio_ci_high",
)


class Meter(Protocol):
    """A cumulative energy counter."""

    kind: str  # NVML, RAPL or NOT_MEASURED: the calls table's ``energy_meter``
    reason: str  # '' when it measures, else why not: the calls table's ``energy_reason``
    dram_j: float  # the DRAM part of the last read() (RAPL dram domains), NaN where none is metered

    def read(self) -> float:
        """Joules since the meter was made (NaN: nothing measured)."""


class NoMeter:
    """No energy counter here: every reading is NaN, so every difference is too."""

    kind = NOT_MEASURED
    dram_j = math.nan

    def __init__(self, reason: str = "no meter") -> None:
        self.reason = reason or "no meter"

    def read(self) -> float:
        return math.nan


class NvmlMeter:
    """NVML's total-energy counter of some GPUs, summed (``nvml``: the pynvml module or its double)."""

    kind = NVML
    reason = ""
    dram_j = math.nan  # the board's counter includes its memory: no part of its own

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self.nvml, self.handles = nvml, handles

    def read(self) -> float:
        return sum(float(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self.handles) / 1000.0


class RaplMeter:
    """RAPL package counters (and ``dram`` ones: ``dram``) under powercap, summed, with wraparound."""

    kind = RAPL
    reason = ""

    def __init__(self, domains: list[Path], dram: list[Path] | None = None) -> None:
        self.domains = [*domains, *(dram or [])]
        self.is_dram = [False] * len(domains) + [True] * len(dram or [])
        self.ranges = [int((d / "max_energy_range_uj").read_text()) for d in self.domains]
        self.last = [self._raw(d) for d in self.domains]
        self.total_uj = 0
        self.dram_uj = 0
        self.dram_j = 0.0 if dram else math.nan

    @staticmethod
    def _raw(domain: Path) -> int:
        return int((domain / "energy_uj").read_text())

    def read(self) -> float:
        for i, domain in enumerate(self.domains):
            raw = self._raw(domain)
            step = raw - self.last[i]
            if step < 0:  # wrapped at max_energy_range_uj since the last reading (equal: did not move)
                step += self.ranges[i]
            self.total_uj += step
            if self.is_dram[i]:
                self.dram_uj += step
            self.last[i] = raw
        if any(self.is_dram):
            self.dram_j = self.dram_uj / 1e6
        return self.total_uj / 1e6


def nvml_module() -> Any:
    """The NVML binding: ``pynvml`` (nvidia-ml-py) if installed, else the copy vLLM ships; None without either."""
    try:
        import pynvml  # type: ignore[import-not-found]

        return pynvml
    except ImportError:
        pass
    try:
        from vllm.third_party import pynvml  # type: ignore[import-not-found,no-redef]

        return pynvml
    except ImportError:
        return None


def nvml_meter(nvml: Any, devices: list[str] | None, count: int) -> NvmlMeter:
    """An NVML meter over the first ``count`` GPUs of ``devices`` in their order (indices or UUIDs
    as ``CUDA_VISIBLE_DEVICES`` names them: the engine's rank 0 runs on the first; None: the node's,
    in NVML order). Raises what NVML raises when the counter is unsupported or no GPU matches
    (RuntimeError)."""
    nvml.nvmlInit()
    found = []  # (NVML index, UUID, handle)
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        found.append((index, uuid.decode() if isinstance(uuid, bytes) else str(uuid), handle))
    if devices is None:
        handles = [handle for _, _, handle in found]
    else:  # CUDA_VISIBLE_DEVICES=3,1 with one GPU: device 3, not the first of them in NVML's order

        def named(d: str) -> Any:
            return next((h for i, u, h in found if d == str(i) or (d.startswith("GPU-") and u.startswith(d))), None)

        handles = [h for h in map(named, devices) if h is not None]
    handles = handles[: max(1, count)]
    if not handles:
        raise RuntimeError(f"no GPU among {devices}")
    meter = NvmlMeter(nvml, handles)
    meter.read()  # an unsupported counter raises here, not in the first timed call
    return meter


class MeterUnavailable(Exception):
    """No meter here; its message is the ``energy_reason`` (a user can act on it)."""


def rapl_domains(root: Path = RAPL_ROOT) -> tuple[list[Path], list[Path]]:
    """The package domains under ``root`` (``psys`` left out) and their ``dram`` subdomains."""
    packages: list[Path] = []
    dram: list[Path] = []
    if root.is_dir():
        for d in sorted(root.iterdir()):
            name = (d / "name").read_text().strip() if (d / "name").is_file() else ""
            if _RAPL_PACKAGE.match(d.name) and name != "psys":
                packages.append(d)
            elif _RAPL_SUBZONE.match(d.name) and name == "dram":
                dram.append(d)
    return packages, dram


def rapl_meter(root: Path = RAPL_ROOT) -> RaplMeter:
    """A RAPL meter over the package domains under ``root`` and their ``dram`` subdomains;
    :class:`MeterUnavailable` saying why when there are none or they cannot be read."""
    if not root.exists():
        raise MeterUnavailable(f"no RAPL: {root} does not exist (no powercap driver: a VM, or a kernel "
                               "without intel_rapl)")  # fmt: skip
    packages, dram = rapl_domains(root)
    if not packages:
        raise MeterUnavailable(f"no RAPL: no package domain (intel-rapl:<N>) under {root}")
    for d in [*packages, *dram]:
        try:
            (d / "energy_uj").read_text()
        except PermissionError:
            raise MeterUnavailable(f"RAPL unreadable: permission denied on {d / 'energy_uj'} ({RAPL_FIX})") from None
        except OSError as exc:
            raise MeterUnavailable(f"RAPL unreadable: {d / 'energy_uj'}: {exc.strerror or exc}") from None
    return RaplMeter(packages, dram)


def meter_for(
    engine: dict[str, Any],
    tensor_parallel_size: int = 1,
    nvml: Any = None,
    rapl_root: Path = RAPL_ROOT,
    env: dict[str, str] | None = None,
) -> Meter:
    """The meter of an engine (config ``engines.<name>``): NVML on ``device: cuda``, RAPL on a CPU
    engine, else :class:`NoMeter` with its reason (logged). Never raises: a missing meter must not
    fail a run."""
    from sdbench.engine.site.quietguard import visible_gpus

    try:
        if engine.get("device") == "cuda":
            nvml = nvml if nvml is not None else nvml_module()
            if nvml is None:
                raise MeterUnavailable("no NVML (pynvml not importable, nor vllm.third_party.pynvml)")
            meter: Meter = nvml_meter(nvml, visible_gpus(env), tensor_parallel_size)
        else:
            meter = rapl_meter(rapl_root)
    except MeterUnavailable as exc:
        log.info("energy: not measured (%s)", exc)
        return NoMeter(str(exc))
    except Exception as exc:  # noqa: BLE001 - see docstring
        what = "NVML" if engine.get("device") == "cuda" else "RAPL"
        log.info("energy: not measured (%s: %s: %s)", what, type(exc).__name__, exc)
        return NoMeter(f"{what} unreadable: {type(exc).__name__}: {exc}")
    log.info("energy: %s meter", meter.kind)
    return meter


def engine_meter(spec: dict[str, Any]) -> Meter:
    """The meter of a cell spec's engine (:func:`meter_for`)."""
    return meter_for(spec["engine"], int(spec["model"].get("tensor_parallel_size", 1)))


# ----------------------------------------------------------------------------- a cell's energy columns


def with_joules_per_token(calls: pd.DataFrame) -> pd.DataFrame:
    """``calls`` with :data:`JOULES_PER_TOKEN` = ``energy_j`` / output tokens (NaN without a meter)."""
    energy = calls["energy_j"] if "energy_j" in calls else pd.Series(math.nan, index=calls.index)
    return calls.assign(**{JOULES_PER_TOKEN: energy.astype(float) / calls["num_output_tokens"].astype(float)})


def meter_of(calls: pd.DataFrame) -> str:
    """The cell's ``energy_meter``: the meter every call read, else ``not measured``."""
    kinds = set(calls["energy_meter"]) if "energy_meter" in calls else set()
    return kinds.pop() if len(kinds) == 1 else NOT_MEASURED


def reason_of(calls: pd.DataFrame) -> str:
    """The cell's ``energy_reason``: '' when :func:`meter_of` names a meter; else why not: the
    calls' own reasons, or :data:`MIXED_METERS` (naming them) when its calls read different meters."""
    kinds = sorted(set(calls["energy_meter"])) if "energy_meter" in calls else []
    if len(kinds) > 1:
        return f"{MIXED_METERS} ({', '.join(kinds)})"
    if kinds and kinds[0] != NOT_MEASURED:
        return ""
    reasons = sorted({str(r) for r in calls["energy_reason"] if r}) if "energy_reason" in calls else []
    return "; ".join(reasons) or ("no calls" if calls.empty else "not recorded (calls from before energy_reason)")


def dram_of(calls: pd.DataFrame) -> float:
    """The cell's ``energy_dram_j``: the DRAM joules of its timed calls (NaN unless every call metered DRAM)."""
    if "energy_dram_j" not in calls or calls.empty or meter_of(calls) == NOT_MEASURED:
        return math.nan
    dram = calls["energy_dram_j"].astype(float)
    return float(dram.sum()) if dram.notna().all() else math.nan


def energy_columns(calls: pd.DataFrame, seed: int) -> dict[str, Any]:
    """A cell's energy summary columns (docs/schema.md): joules per output token as throughput is
    estimated (mean over prompts of each prompt's median over trials) with its 95% bootstrap
    interval and draws, the energy of the timed calls and their mean power; NaN without a meter."""
    from sdbench.engine.measure import resampling as stats

    meter = meter_of(calls)
    nan = math.nan
    if meter == NOT_MEASURED:
        return {"energy_meter": NOT_MEASURED, "energy_reason": reason_of(calls), "energy_j": nan,
                "energy_dram_j": nan, "mean_power_w": nan, JOULES_PER_TOKEN: nan,
                "joules_per_token_ci_low": nan, "joules_per_token_ci_high": nan, "joules_per_token_boot": []}  # fmt: skip
    per_call = with_joules_per_token(calls)
    draws = stats.bootstrap(per_call, seed, column=JOULES_PER_TOKEN)
    low, high = stats.interval(draws)
    total = float(calls["energy_j"].sum())
    return {
        "energy_meter": meter,
        "energy_reason": "",
        "energy_j": total,
        "energy_dram_j": dram_of(calls),
        "mean_power_w": total / float(calls["duration_s"].sum()),
        JOULES_PER_TOKEN: stats.point_estimate(per_call, column=JOULES_PER_TOKEN),
        "joules_per_token_ci_low": low,
        "joules_per_token_ci_high": high,
        "joules_per_token_boot": [float(x) for x in draws],
    }


def paired_energy_columns(calls: pd.DataFrame, baseline_calls: pd.DataFrame, seed: int) -> dict[str, float]:
    """A paired cell's energy ratio (SD joules/token over its no-SD arm's), as the paired speedup
    is computed: both arms resampled with the same draws; NaN where either arm had no meter."""
    from sdbench.engine.measure import resampling as stats

    if baseline_calls.empty or NOT_MEASURED in (meter_of(calls), meter_of(baseline_calls)):
        return {c: math.nan for c in PAIRED_ENERGY_COLUMNS}
    sd, base = with_joules_per_token(calls), with_joules_per_token(baseline_calls)
    base_point = stats.point_estimate(base, column=JOULES_PER_TOKEN)
    low, high = stats.interval(stats.paired_bootstrap(sd, base, seed, column=JOULES_PER_TOKEN))
    return {
        "paired_baseline_joules_per_token": base_point,
        "paired_energy_ratio": stats.point_estimate(sd, column=JOULES_PER_TOKEN) / base_point,
        "paired_energy_ratio_ci_low": low,
        "paired_energy_ratio_ci_high": high,
    }


# ----------------------------------------------------------------------------- touchpoints
from sdbench.engine.release import touchpoints as tp  # noqa: E402 - standard library only

# The NVML binding vLLM ships, the meter's fallback where pynvml is not installed on its own.
TOUCHPOINTS = tp.declare(__name__, tp.defined("energy.nvml_binding", "vllm.third_party:pynvml"))
