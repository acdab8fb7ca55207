"""Progress inside a cell: the timed calls a cell has finished, kept when its job is killed.

A cell's timed part (:func:`sdbench.engine.measure.trials.timed_part`) can outlast its job's time limit
(long prompts, long outputs, large batches). Every :data:`PROGRESS_EVERY_S` seconds of timed calls it
writes what its arms recorded since the last write to a numbered shard under the cell's checkpoint
key, ``<checkpoints>/.progress/<key>/<NNNNNN>/`` (one directory, written atomically):

- ``calls-<arm>.parquet``, ``requests-<arm>.parquet``: the arm's new call rows and first-trial
  request rows with their outputs, that later trials are compared with (arm 0 is the paired no-SD
  arm when there are two, as in ``timed_part``);
- ``state.json``: where the timed part stood (trial, call), each arm's timed seconds and
  ``outputs_stable``, the hardware (:func:`sdbench.engine.site.hardware.hardware`), which engine
  process wrote it (``segment``: 0 for the first, 1 after one resume, ...), and what the
  quiet-machine guard had seen in that process so far.

When the cell's group runs again (same key: same spec, inputs, code and software), the cell warms up
on the new engine and :meth:`Progress.resume` restores the rows, so the timed part continues at the
next (trial, call). The trial rules decide on the restored rows exactly as they would have without
the interruption (they read only the call rows and the timed seconds), so a resumed cell times the
calls an uninterrupted one would have. What it cannot repeat is the engine process: calls before and
after a resume ran in different processes. The cell says so (``resumed``, ``num_resumes`` in its
summary). Partial progress is not resumed, and is deleted, when it was written on other hardware
(a cell's calls share hardware) or, under ``quiet_guard: refuse``, when its guard saw other work.
Breakdown cells are not checkpointed inside (their step timings stay in the killed process).

The interval is :data:`PROGRESS_EVERY_S` unless the environment sets :data:`ENV_PROGRESS_EVERY_S`
(seconds; a test shortens it to kill and resume a real engine's cell in seconds). It is not part
of the cell's checkpoint key: it moves where a killed job's calls are saved, not what they measure.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from sdbench.engine.site.hardware import describe_hardware, same_hardware
from sdbench.engine.site.quietguard import GuardReport

log = logging.getLogger(__name__)

# Under a group's checkpoint directory: hidden, so that neither a checkpoint scan nor a bundle reads it.
PROGRESS_DIR = ".progress"
# Seconds of timed calls (all arms) between two shards: a killed job loses at most this much
# timed work plus the call it was in; each shard is a handful of small files.
PROGRESS_EVERY_S = 300.0
# Overrides PROGRESS_EVERY_S for the process (seconds, e.g. ``SDBENCH_PROGRESS_EVERY_S=1``).
ENV_PROGRESS_EVERY_S = "SDBENCH_PROGRESS_EVERY_S"
STATE = "state.json"
# CellRun's cumulative fields a shard carries (the names sdbench.engine.measure.trials.CellRun keeps): its
# call rows (a list) and its request rows (sdbench.requesttable.RequestRows, saved as records).
ROW_LISTS = ("call_rows", "request_rows")
TABLE_OF = {"call_rows": "calls", "request_rows": "requests"}


def progress_every_s(env: dict[str, str] | None = None) -> float:
    """Seconds of timed calls between two shards: :data:`ENV_PROGRESS_EVERY_S`, else
    :data:`PROGRESS_EVERY_S`."""
    raw = (os.environ if env is None else env).get(ENV_PROGRESS_EVERY_S, "").strip()
    return float(raw) if raw else PROGRESS_EVERY_S


def _rows_to_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # pyarrow's own list conversion round-trips ints, floats, None and lists exactly (pandas would
    # turn an int column with a None into floats).
    pq.write_table(pa.Table.from_pylist(rows), path)


def _rows_from_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _guard_to_json(report: GuardReport) -> dict[str, Any]:
    out = asdict(report)
    out["engines"] = sorted(report.engines)
    out["gpu_others"] = sorted(report.gpu_others)
    return out


def _guard_from_json(data: dict[str, Any]) -> GuardReport:
    known = {f.name for f in fields(GuardReport)}
    report = GuardReport(**{k: v for k, v in data.items() if k in known})
    report.engines, report.gpu_others = set(report.engines), set(report.gpu_others)
    return report


class Progress:
    """The partial checkpoint of one cell (see the module docstring).

    ``path`` is ``<checkpoints>/.progress/<key>``; ``here`` the hardware this process runs on;
    ``every_s`` the interval (default :func:`progress_every_s`).
    """

    def __init__(self, path: str | Path, here: dict[str, Any], guard_mode: str, every_s: float | None = None):
        self.path = Path(path)
        self.here = here
        self.guard_mode = guard_mode
        self.every_s = progress_every_s() if every_s is None else float(every_s)
        #: This process's segment: 0 for a cell timed from its start, n after n resumes.
        self.segment = 0
        #: The quiet guard's reports of the earlier segments (one per engine process).
        self.earlier: list[GuardReport] = []
        self._shards = 0
        self._marks: list[dict[str, int]] = []
        self._timed_at_flush = 0.0

    # ------------------------------------------------------------------ reading
    def _discard(self, why: str) -> None:
        log.info("cell progress %s: %s: not resumed, the cell is timed from its start", self.path.name, why)
        self.clear()

    def resume(self, arms: list[Any]) -> tuple[int, int]:
        """Restore the arms' rows from the shards, if any; return the (trial, call) to time next.

        ``(0, 0)`` when there is nothing to resume. The arms must be warmed up, not yet timed.
        """
        shards = sorted(p for p in self.path.glob("[0-9]*") if p.is_dir()) if self.path.is_dir() else []
        self._marks = [self._mark(arm) for arm in arms]
        if not shards:
            return 0, 0
        try:
            states = [json.loads((s / STATE).read_text()) for s in shards]
        except (OSError, ValueError) as exc:
            self._discard(f"unreadable ({exc})")
            return 0, 0
        first = states[0]
        if len(first["arms"]) != len(arms):
            self._discard(f"written for {len(first['arms'])} arm(s), not {len(arms)}")
            return 0, 0
        if not same_hardware(first["hardware"], self.here):
            self._discard(f"its calls ran on {describe_hardware(first['hardware'])}; this job runs on "
                          f"{describe_hardware(self.here)}")  # fmt: skip
            return 0, 0
        last_of_segment: dict[int, dict[str, Any]] = {}
        for state in states:
            last_of_segment[int(state["segment"])] = state["guard"]
        earlier = [_guard_from_json(last_of_segment[s]) for s in sorted(last_of_segment)]
        if self.guard_mode == "refuse" and any(r.contaminated for r in earlier):
            self._discard("its quiet-machine guard saw other work (quiet_guard: refuse)")
            return 0, 0
        for shard in shards:
            for i, arm in enumerate(arms):
                calls = shard / f"calls-{i}.parquet"
                if calls.is_file():
                    arm.call_rows.extend(_rows_from_parquet(calls))
                requests = shard / f"requests-{i}.parquet"
                for record in _rows_from_parquet(requests) if requests.is_file() else []:
                    row = arm.request_rows.replay(record)
                    arm.first_rows.setdefault(int(record["call_index"]), row)  # a call's rows start at slot 0
        last = states[-1]
        for arm, saved in zip(arms, last["arms"], strict=True):
            arm.timed_s = float(saved["timed_s"])
            arm.outputs_stable = bool(saved["outputs_stable"])
        self.earlier = earlier
        self.segment = max(last_of_segment) + 1
        self._shards = int(shards[-1].name)
        self._marks = [self._mark(arm) for arm in arms]
        self._timed_at_flush = sum(arm.timed_s for arm in arms)
        for arm in arms:
            arm.num_resumes = self.segment
        trial, call = last["position"]
        nxt = (trial, call + 1) if call + 1 < arms[0].num_calls else (trial + 1, 0)
        log.info(
            "cell progress %s: resumed after %d shard(s) at trial %d, call %d (resume %d; calls so far: %d)",
            self.path.name, len(shards), nxt[0], nxt[1], self.segment, len(arms[0].call_rows),
        )  # fmt: skip
        return nxt

    # ------------------------------------------------------------------ writing
    @staticmethod
    def _mark(arm: Any) -> dict[str, int]:
        return {name: len(getattr(arm, name)) for name in ROW_LISTS}

    def after_call(self, arms: list[Any], trial: int, call_index: int, guard: Any) -> None:
        """Every arm has timed call ``call_index`` of ``trial``: write a shard if enough timed
        seconds have passed since the last one."""
        timed = sum(arm.timed_s for arm in arms)
        if timed - self._timed_at_flush < self.every_s:
            return
        self._write(arms, trial, call_index, guard.interim())
        self._timed_at_flush = timed

    def _write(self, arms: list[Any], trial: int, call_index: int, report: GuardReport) -> None:
        from sdbench.io import atomic_dir

        number = self._shards + 1
        with atomic_dir(self.path / f"{number:06d}") as tmp:
            saved = []
            for i, (arm, mark) in enumerate(zip(arms, self._marks, strict=True)):
                new = {"call_rows": arm.call_rows[mark["call_rows"] :],
                       "request_rows": arm.request_rows.records(mark["request_rows"])}  # fmt: skip
                for name, rows in new.items():
                    if rows:
                        _rows_to_parquet(rows, tmp / f"{TABLE_OF[name]}-{i}.parquet")
                saved.append({"timed_s": arm.timed_s, "outputs_stable": bool(arm.outputs_stable)})
            state = {
                "position": [trial, call_index],
                "segment": self.segment,
                "hardware": self.here,
                "arms": saved,
                "guard": _guard_to_json(report),
            }
            (tmp / STATE).write_text(json.dumps(state, sort_keys=True) + "\n")
        self._shards = number
        self._marks = [self._mark(arm) for arm in arms]

    def clear(self) -> None:
        """Delete the shards (the cell's checkpoint is complete, or they cannot be resumed)."""
        shutil.rmtree(self.path, ignore_errors=True)
