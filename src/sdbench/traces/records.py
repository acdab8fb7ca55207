"""The trace table's format, and how per-request traces become one.

Apart from :mod:`sdbench.traces.table` (readers, the offline tracers, commands) because the
engine's trace group builds its tables with it (:mod:`sdbench.engine.tracegroup`): it is part of
the measurement (:mod:`sdbench.engine.scope`), the tracers are not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

# Column -> pandas dtype. proposed_len is nullable: published traces do not record it.
TRACE_DTYPES: dict[str, str] = {
    "request_id": "string",
    "position": "int32",
    "method": "string",
    "acc_len": "int32",
    "proposed_len": "Int32",
    "censored": "bool",
}
TRACE_COLUMNS: tuple[str, ...] = tuple(TRACE_DTYPES)


@dataclass(frozen=True)
class MethodTrace:
    """One request's trace for one method; ``proposed_len``/``censored`` None when unknown."""

    request_id: str
    method: str
    acc_len: np.ndarray
    proposed_len: np.ndarray | None = None
    censored: np.ndarray | None = None


def make_trace_table(traces: Iterable[MethodTrace]) -> pd.DataFrame:
    """Stack per-request traces into a trace table, rows in the given order."""
    traces = list(traces)
    lengths = [len(t.acc_len) for t in traces]

    def cat(arrays: Iterable[np.ndarray], dtype: type) -> np.ndarray:
        return np.concatenate([np.asarray(a, dtype=dtype) for a in arrays] + [np.empty(0, dtype)])

    known = [t.proposed_len is not None for t in traces]
    proposed = pd.arrays.IntegerArray(
        cat((t.proposed_len if k else np.zeros(n) for t, k, n in zip(traces, known, lengths)), np.int32),
        cat((np.full(n, not k) for k, n in zip(known, lengths)), bool),
    )
    df = pd.DataFrame(
        {
            "request_id": np.repeat(np.array([t.request_id for t in traces], dtype=object), lengths),
            "position": cat((np.arange(n) for n in lengths), np.int32),
            "method": np.repeat(np.array([t.method for t in traces], dtype=object), lengths),
            "acc_len": cat((t.acc_len for t in traces), np.int32),
            "proposed_len": proposed,
            "censored": cat(
                (t.censored if t.censored is not None else np.zeros(n) for t, n in zip(traces, lengths)), bool
            ),
        }
    )
    return df.astype(TRACE_DTYPES)
