"""A cell's requests table (``requests.parquet``, docs/schema.md): one row per generated sequence,
in bounded memory.

- **No prompt token ids.** A row names its prompt by ``request_id`` in the prepared prompt set
  (``results/prompts/<model>/<dataset>.parquet``) and keeps ``num_prompt_tokens``; a consumer that
  needs the ids joins them back (:func:`with_prompt_ids`). Copied into every row as Python ints, a
  SPEED-Bench 32k cell at batch 64 would hold about 120 GiB.
- **An output stored once per call.** In replicate mode a call is one prompt replicated batch-size
  times, and greedy replicas nearly always generate the same tokens. A sequence whose output (token
  ids and text) equals that of an earlier slot of the same call for the same prompt stores neither:
  its ``output_slot`` names the slot whose row holds them (``output_slot == slot`` on a row that
  holds its own). :func:`expand_outputs` fills them in where a consumer needs every sequence's
  output; sampled replicas, and distinct prompts, each keep their own.
- **int32 token ids**, recorded column by column (:class:`RequestRows`): no Python object per token.

A cell's request rows then take about ``rows x 170 B + stored output tokens x 4 B`` plus the stored
outputs' text while it is timed, whatever its prompt lengths (docs/measurement.md, "Memory of
request rows and of aggregate").
Tables without ``output_slot`` (every sequence's output on its own row) are read the same way.
"""

from __future__ import annotations

import os
import sys
from array import array
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

# The per-sequence engine SD counters (sdbench.engine.measure.counters.request_sd_metrics), null where none.
SD_COLUMNS = ("sd_num_steps", "sd_num_draft_tokens", "sd_num_accepted_tokens", "sd_mean_acceptance_length")
# Columns a referring row leaves null: they are on the row its output_slot names.
OUTPUT_COLUMNS = ("output_token_ids", "output_text")
# What identifies a call's rows across cells (a requests table may hold several cells' rows).
CELL_KEYS = ("engine", "model", "dataset", "method", "batch_size")


class RequestRows:
    """A cell's request rows as the timed calls record them, column by column.

    Scalars go into typed arrays; each stored output's token ids are appended to one int32
    buffer. :meth:`add` stores a sequence's output only if no earlier slot of the same call for
    the same prompt generated the same tokens and text.
    """

    def __init__(self) -> None:
        self._ints = {c: array("q") for c in ("call_index", "slot", "output_slot", "num_prompt_tokens",
                                              "num_output_tokens")}  # fmt: skip
        self.request_id: list[str] = []
        self.finish_reason: list[str] = []
        self._sd: dict[str, list[Any]] = {c: [] for c in SD_COLUMNS}
        self._output = array("q")  # per row: the stored output it has (its own or its output_slot's)
        self._tokens = array("i")  # every stored output's token ids, one after the other
        self._offsets = array("q", [0])  # stored output i is _tokens[_offsets[i]:_offsets[i + 1]]
        self._text: list[str] = []
        self._call: int | None = None
        self._seen: dict[tuple[str, bytes, str], tuple[int, int]] = {}  # this call's outputs -> (slot, stored)

    def __len__(self) -> int:
        return len(self.request_id)

    def add(
        self,
        call_index: int,
        slot: int,
        request_id: str,
        token_ids: Iterable[int],
        text: str,
        num_prompt_tokens: int,
        finish_reason: str,
        sd_metrics: Mapping[str, Any],
    ) -> int:
        """Record one sequence; returns its row. A call's rows come one after the other."""
        ids = np.asarray(token_ids if isinstance(token_ids, np.ndarray) else list(token_ids), dtype=np.int32)
        if call_index != self._call:
            self._call, self._seen = call_index, {}
        key = (request_id, ids.tobytes(), text)
        if key not in self._seen:
            self._seen[key] = (slot, len(self._text))
            self._tokens.frombytes(key[1])
            self._offsets.append(len(self._tokens))
            self._text.append(text)
        output_slot, stored = self._seen[key]
        for column, value in (("call_index", call_index), ("slot", slot), ("output_slot", output_slot),
                              ("num_prompt_tokens", num_prompt_tokens), ("num_output_tokens", len(ids))):  # fmt: skip
            self._ints[column].append(int(value))
        self._output.append(stored)
        self.request_id.append(request_id)
        self.finish_reason.append(sys.intern(str(finish_reason)))
        for column in SD_COLUMNS:
            self._sd[column].append(sd_metrics.get(column))
        return len(self.request_id) - 1

    def _buffer(self) -> np.ndarray:
        return np.frombuffer(self._tokens, dtype=np.int32) if len(self._tokens) else np.empty(0, np.int32)

    def output(self, row: int) -> np.ndarray:
        """The output token ids of row ``row`` (stored on it or on the slot it refers to)."""
        i = self._output[row]
        return self._buffer()[self._offsets[i] : self._offsets[i + 1]].copy()

    def records(self, start: int = 0) -> list[dict[str, Any]]:
        """Rows ``start``.. as :meth:`replay` takes them back (a killed cell's saved progress,
        sdbench.engine.measure.progress): :meth:`add`'s arguments, the SD counters flattened."""
        out = []
        for row in range(start, len(self)):
            out.append({
                "call_index": self._ints["call_index"][row], "slot": self._ints["slot"][row],
                "request_id": self.request_id[row], "token_ids": self.output(row).tolist(),
                "text": self._text[self._output[row]], "num_prompt_tokens": self._ints["num_prompt_tokens"][row],
                "finish_reason": self.finish_reason[row], **{c: self._sd[c][row] for c in SD_COLUMNS},
            })  # fmt: skip
        return out

    def replay(self, record: Mapping[str, Any]) -> int:
        """Record a row of :meth:`records` again (rows in their order rebuild the same table)."""
        sd = {c: record.get(c) for c in SD_COLUMNS}
        return self.add(record["call_index"], record["slot"], record["request_id"], record["token_ids"],
                        record["text"], record["num_prompt_tokens"], record["finish_reason"], sd)  # fmt: skip

    @property
    def stored_tokens(self) -> int:
        """Token ids held: those of the stored outputs."""
        return len(self._tokens)

    def frame(self) -> pd.DataFrame:
        """The rows as a requests table (without cell keys), sorted by call and slot."""
        ints = {c: np.array(a, dtype=np.int64) for c, a in self._ints.items()}
        tokens, offsets = self._buffer(), np.frombuffer(self._offsets, dtype=np.int64)
        own = ints["output_slot"] == ints["slot"]
        ids = np.full(len(self), None, dtype=object)
        text = np.full(len(self), None, dtype=object)
        for row in np.flatnonzero(own):
            i = self._output[row]
            ids[row] = tokens[offsets[i] : offsets[i + 1]]  # a view of the buffer
            text[row] = self._text[i]
        frame = pd.DataFrame(
            {
                "call_index": ints["call_index"],
                "slot": ints["slot"],
                "request_id": self.request_id,
                "output_slot": ints["output_slot"],
                "output_token_ids": ids,
                "output_text": text,
                "num_prompt_tokens": ints["num_prompt_tokens"],
                "num_output_tokens": ints["num_output_tokens"],
                "finish_reason": self.finish_reason,
                **self._sd,  # None where the engine has no counters, as pandas infers it
            }
        )
        return frame.sort_values(["call_index", "slot"], kind="stable").reset_index(drop=True)


def _call_keys(df: pd.DataFrame) -> list[str]:
    return [c for c in (*CELL_KEYS, "call_index") if c in df.columns]


def expand_outputs(requests: pd.DataFrame) -> pd.DataFrame:
    """``requests`` with every row's ``output_token_ids`` (and ``output_text``) filled in from the
    row its ``output_slot`` names; a table without ``output_slot`` is returned as it is.

    The filled-in values are the stored row's own objects (no copy of the token ids).
    """
    if "output_slot" not in requests.columns:
        return requests
    refer = requests["output_slot"].to_numpy() != requests["slot"].to_numpy()
    if not refer.any():
        return requests
    keys = _call_keys(requests)
    columns = [c for c in OUTPUT_COLUMNS if c in requests.columns]
    holders = requests.loc[~refer, [*keys, "slot", *columns]].rename(columns={"slot": "output_slot"})
    wanted = requests.loc[refer, [*keys, "output_slot"]]
    found = wanted.merge(holders, on=[*keys, "output_slot"], how="left", validate="many_to_one")
    if found[columns[0]].isna().any():
        row = wanted[found[columns[0]].isna().to_numpy()].iloc[0]
        raise ValueError(f"requests table: call {row['call_index']} refers to slot {row['output_slot']}, "
                         "which holds no output")  # fmt: skip
    out = requests.copy()
    for c in columns:
        values = out[c].to_numpy(dtype=object, copy=True)
        values[refer] = found[c].to_numpy(dtype=object)
        out[c] = values
    return out


def with_prompt_ids(requests: pd.DataFrame, prompts: pd.DataFrame, where: str = "requests table") -> pd.DataFrame:
    """``requests`` with ``prompt_token_ids`` joined from the prompt table ``prompts`` by ``request_id``
    (a table that has them is returned as it is); a request the prompt table lacks is an error."""
    if "prompt_token_ids" in requests.columns:
        return requests
    ids = dict(zip(prompts["request_id"].astype(str), prompts["prompt_token_ids"], strict=True))
    missing = sorted(set(requests["request_id"].astype(str)) - ids.keys())
    if missing:
        raise ValueError(f"{where}: request(s) {', '.join(missing[:5])} not in the prompt table "
                         f"({len(missing)} missing; is it the cell's dataset?)")  # fmt: skip
    return requests.assign(prompt_token_ids=[ids[str(r)] for r in requests["request_id"]])


def same_outputs(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Whether two requests tables of one cell hold the same output token ids, sequence by sequence."""
    if len(a) != len(b):
        return False
    a, b = expand_outputs(a), expand_outputs(b)
    return all(np.array_equal(x, y) for x, y in zip(a["output_token_ids"], b["output_token_ids"], strict=True))


# Said where a table lacks prompt_token_ids and no prompt table was given.
PROMPTS_HINT = "a cell's requests table names its prompts by request_id: give --prompts, its prompt table"


def read_with_prompts(path: str | os.PathLike[str], prompts: str | os.PathLike[str] | None,
                      what: str = "requests table", distinct: bool = False) -> pd.DataFrame:  # fmt: skip
    """A requests table (or any table with ``request_id`` and token ids) with every row's output
    filled in (:func:`expand_outputs`) and, when it has none and ``prompts`` is given,
    ``prompt_token_ids`` joined from that prompt table (only that column: its text would change
    what a consumer compares). ``distinct``: only the rows that store their own output (a copy
    equal to an earlier slot's is left out: what it would give a consumer is that slot's).
    Errors name the file."""
    from sdbench.io import read_parquet

    df = read_parquet(path, what=what)
    if distinct and {"output_slot", "slot"} <= set(df.columns):
        df = df[df["output_slot"] == df["slot"]].reset_index(drop=True)
    df = expand_outputs(df)
    if prompts is not None and "prompt_token_ids" not in df.columns and "request_id" in df.columns:
        table = read_parquet(prompts, columns=["request_id", "prompt_token_ids"], what="prompt table")
        df = with_prompt_ids(df, table, where=f"{path} (prompts {prompts})")
    return df
