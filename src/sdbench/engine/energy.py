"""Energy meters: joules a timed call cost, read from a hardware counter before and after it.

A meter is a cumulative counter in joules (:meth:`Meter.read`); a timed call's energy is
``meter.read()`` after it minus before it (:meth:`sdbench.engine.trials.CellRun.time_call`).

- ``nvml``: on a GPU engine, NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``,
  millijoules since the driver loaded; Volta and later) summed over the engine's GPUs: the first
  ``tensor_parallel_size`` of the devices ``CUDA_VISIBLE_DEVICES`` names (all of the node's when
  it is unset). The board's energy, not the host's. The counter, not sampled power: nothing is
  lost between samples. It advances in the driver's own updates (tens of ms), so a call shorter than
  that reads coarse; the bootstrap over trials carries that spread.
- ``rapl``: on a CPU engine, the package domains of Linux powercap RAPL
  (``/sys/class/powercap/intel-rapl:<N>/energy_uj``, microjoules; the ``psys`` platform domain left
  out, it contains the packages), summed. Each counter wraps at its ``max_energy_range_uj``: a
  reading below the last one adds the distance to the wrap, so calls shorter than one wrap (minutes
  at full power) are exact. The whole socket's energy, neighbours' work included (the quiet-machine
  guard flags a busy machine). ``energy_uj`` is often readable by root only: then no meter.
- ``not measured``: neither exists or can be read. The meter reads NaN, so every energy column of
  the cell is NaN and its ``energy_meter`` column says ``not measured``: never 0.

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
# A package domain: intel-rapl:<N> (its subzones, intel-rapl:<N>:<M>, are parts of it).
_RAPL_PACKAGE = re.compile(r"^intel-rapl:\d+$")
# The per-call column a cell's energy is bootstrapped on (sdbench.engine.resampling, column=...).
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

    def read(self) -> float:
        """Joules since the meter was made (NaN: nothing measured)."""


class NoMeter:
    """No energy counter here: every reading is NaN, so every difference is too."""

    kind = NOT_MEASURED

    def __init__(self, reason: str = "") -> None:
        self.reason = reason

    def read(self) -> float:
        return math.nan


class NvmlMeter:
    """NVML's total-energy counter of some GPUs, summed (``nvml``: the pynvml module or its double)."""

    kind = NVML

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self.nvml, self.handles = nvml, handles

    def read(self) -> float:
        return sum(float(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self.handles) / 1000.0


class RaplMeter:
    """RAPL package counters under ``root`` (powercap), summed, with wraparound."""

    kind = RAPL

    def __init__(self, domains: list[Path]) -> None:
        self.domains = domains
        self.ranges = [int((d / "max_energy_range_uj").read_text()) for d in domains]
        self.last = [self._raw(d) for d in domains]
        self.total_uj = 0

    @staticmethod
    def _raw(domain: Path) -> int:
        return int((domain / "energy_uj").read_text())

    def read(self) -> float:
        for i, domain in enumerate(self.domains):
            raw = self._raw(domain)
            step = raw - self.last[i]
            if step < 0:  # wrapped at max_energy_range_uj since the last reading
                step += self.ranges[i]
            self.total_uj += step
            self.last[i] = raw
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


def rapl_meter(root: Path = RAPL_ROOT) -> RaplMeter:
    """A RAPL meter over the package domains under ``root``; OSError when there are none or
    they cannot be read (``energy_uj`` is root-only on many kernels)."""
    domains = []
    if root.is_dir():
        for d in sorted(root.iterdir()):
            name = (d / "name").read_text().strip() if (d / "name").is_file() else ""
            if _RAPL_PACKAGE.match(d.name) and name != "psys":
                domains.append(d)
    if not domains:
        raise FileNotFoundError(f"no RAPL package domain under {root}")
    return RaplMeter(domains)


def meter_for(
    engine: dict[str, Any],
    tensor_parallel_size: int = 1,
    nvml: Any = None,
    rapl_root: Path = RAPL_ROOT,
    env: dict[str, str] | None = None,
) -> Meter:
    """The meter of an engine (config ``engines.<name>``): NVML on ``device: cuda``, RAPL on a CPU
    engine, else :class:`NoMeter` (the reason logged). Never raises: a missing meter must not fail a run."""
    from sdbench.engine.quietguard import visible_gpus

    try:
        if engine.get("device") == "cuda":
            nvml = nvml if nvml is not None else nvml_module()
            if nvml is None:
                raise ImportError("no NVML binding (pynvml or vllm.third_party.pynvml)")
            meter: Meter = nvml_meter(nvml, visible_gpus(env), tensor_parallel_size)
        else:
            meter = rapl_meter(rapl_root)
    except Exception as exc:  # noqa: BLE001 - see docstring
        log.info("energy: not measured (%s: %s)", type(exc).__name__, exc)
        return NoMeter(f"{type(exc).__name__}: {exc}")
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


def energy_columns(calls: pd.DataFrame, seed: int) -> dict[str, Any]:
    """A cell's energy summary columns (docs/schema.md): joules per output token as throughput is
    estimated (mean over prompts of each prompt's median over trials) with its 95% bootstrap
    interval and draws, the energy of the timed calls and their mean power; NaN without a meter."""
    from sdbench.engine import resampling as stats

    meter = meter_of(calls)
    nan = math.nan
    if meter == NOT_MEASURED:
        return {"energy_meter": NOT_MEASURED, "energy_j": nan, "mean_power_w": nan, JOULES_PER_TOKEN: nan,
                "joules_per_token_ci_low": nan, "joules_per_token_ci_high": nan, "joules_per_token_boot": []}  # fmt: skip
    per_call = with_joules_per_token(calls)
    draws = stats.bootstrap(per_call, seed, column=JOULES_PER_TOKEN)
    low, high = stats.interval(draws)
    total = float(calls["energy_j"].sum())
    return {
        "energy_meter": meter,
        "energy_j": total,
        "mean_power_w": total / float(calls["duration_s"].sum()),
        JOULES_PER_TOKEN: stats.point_estimate(per_call, column=JOULES_PER_TOKEN),
        "joules_per_token_ci_low": low,
        "joules_per_token_ci_high": high,
        "joules_per_token_boot": [float(x) for x in draws],
    }


def paired_energy_columns(calls: pd.DataFrame, baseline_calls: pd.DataFrame, seed: int) -> dict[str, float]:
    """A paired cell's energy ratio (SD joules/token over its no-SD arm's), as the paired speedup
    is computed: both arms resampled with the same draws; NaN where either arm had no meter."""
    from sdbench.engine import resampling as stats

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
from sdbench.engine import touchpoints as tp  # noqa: E402 - standard library only

# The NVML binding vLLM ships, the meter's fallback where pynvml is not installed on its own.
TOUCHPOINTS = tp.declare(__name__, tp.defined("energy.nvml_binding", "vllm.third_party:pynvml"))
