"""The paper's published acceptance traces (SpecDecode-Bench/simulator).

One JSON object per line with ``id``, ``prompt_token_ids``, ``generated_token_ids``,
``acc_ngram.acc_len`` and ``acc_eagle.acc_len`` (see the project README, "Published traces").
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PublishedRequest:
    """One request of a published trace file."""

    request_id: str
    prompt_token_ids: list[int]
    generated_token_ids: list[int]
    acc_ngram: list[int]
    acc_eagle: list[int]


REQUIRED_KEYS = ("id", "prompt_token_ids", "generated_token_ids", "acc_ngram.acc_len", "acc_eagle.acc_len")


def _get(rec: dict[str, object], key: str) -> object:
    """``rec[key]``; a dotted key also matches the nested form the published files
    use (``{"acc_ngram": {"acc_len": [...]}}``). Raises ``KeyError`` if absent."""
    if key in rec:
        return rec[key]
    head, _, tail = key.partition(".")
    inner = rec.get(head)
    if tail and isinstance(inner, dict) and tail in inner:
        return inner[tail]
    raise KeyError(key)


def _has(rec: dict[str, object], key: str) -> bool:
    try:
        _get(rec, key)
    except KeyError:
        return False
    return True


def dataset_name(path: str | os.PathLike[str]) -> str:
    """``combined_<dataset>.jsonl`` -> ``<dataset>``; otherwise the file stem."""
    stem = Path(path).name.split(".")[0]
    return stem.removeprefix("combined_")


def read_published_jsonl(path: str | os.PathLike[str]) -> list[PublishedRequest]:
    """Read a published-trace JSONL file, in file order.

    Raises ``ValueError`` naming the file, line and missing key on malformed input.
    """
    requests: list[PublishedRequest] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc})") from exc
            missing = [k for k in REQUIRED_KEYS if not _has(rec, k)]
            if missing:
                raise ValueError(f"{path}:{lineno}: missing key(s) {', '.join(missing)}")
            acc = {k: list(_get(rec, f"{k}.acc_len")) for k in ("acc_ngram", "acc_eagle")}
            for key, values in acc.items():
                # A step emits at least the verified token; 0 would stall any replay.
                if any(not isinstance(v, int) or v < 1 for v in values):
                    raise ValueError(f"{path}:{lineno}: {key}.acc_len must hold integers >= 1")
            requests.append(
                PublishedRequest(
                    request_id=str(rec["id"]),
                    prompt_token_ids=list(rec["prompt_token_ids"]),
                    generated_token_ids=list(rec["generated_token_ids"]),
                    acc_ngram=acc["acc_ngram"],
                    acc_eagle=acc["acc_eagle"],
                )
            )
    return requests
