"""A server cell's latency percentiles, recorded in its summary by the serving process.

Apart from :mod:`sdbench.analysis.goodput` (which re-exports it) because the server group writes
it: it is in the server's measurement scope (:mod:`sdbench.engine.scope`), the goodput analyses
are not.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

PERCENTILES = (50, 90, 95, 99)


def latency_percentiles(requests: pd.DataFrame) -> dict[str, float]:
    """P50/P90/P95/P99 (ms) of TTFT, TPOT and E2E over requests, and of ITL over every chunk gap."""
    gaps = [g for gs in requests["chunk_gaps_s"] for g in gs] if "chunk_gaps_s" in requests else []
    series = {"ttft": requests["ttft_s"], "tpot": requests["tpot_s"], "e2e": requests["latency_s"],
              "itl": pd.Series(gaps, dtype=float)}  # fmt: skip
    out = {}
    for name, values in series.items():
        v = values.to_numpy(dtype=float)
        v = v[~np.isnan(v)]
        for p in PERCENTILES:
            out[f"{name}_p{p}_ms"] = float(np.percentile(v, p) * 1000) if len(v) else math.nan
    return out
