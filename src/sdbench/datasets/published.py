"""``sdbench datasets check-published``: do the project's builders make the paper's prompts?

For each request of a published trace file (``id``, ``prompt_token_ids``): decode the ids with
the traces' tokenizer, take the Llama-3 chat prompt apart (system header, user turn, assistant
header), recover the dataset row the user turn was built from (the inverse of the entry's
builder format in the authors' form, :data:`sdbench.datasets.prompts.ROW_FORMATS`), build that
row again through the project's own builder format, chat template and tokenization in the
entry's form (or ``--form``), and compare token ids. The chat template is the tokenizer's own,
else the shipped Llama-3.1 template (:mod:`sdbench.datasets.chattemplate`).

This checks prompt text, template and BOS handling, request by request; which rows were drawn,
and in which order, needs the dataset itself (``prepare`` with ``form: authors``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdbench.config import load_config
from sdbench.datasets.prompts import ROW_FORMATS, SHAREGPT_FORMAT
from sdbench.errors import ConfigError

# Published dataset name (combined_<name>.jsonl) -> the builder that makes its prompts.
PUBLISHED_BUILDERS = {"gsm8k": "gsm8k", "instructcoder": "instructcoder", "sharegpt": "sharegpt", "cnn": "cnn_dailymail"}

BOS = "<|begin_of_text|>"
LLAMA3_CHAT = re.compile(
    r"(?P<bos>(?:<\|begin_of_text\|>)*)<\|start_header_id\|>system<\|end_header_id\|>\n\n(?P<system>.*?)<\|eot_id\|>"
    r"<\|start_header_id\|>user<\|end_header_id\|>\n\n(?P<user>.*)<\|eot_id\|>"
    r"<\|start_header_id\|>assistant<\|end_header_id\|>\n\n",
    re.DOTALL,
)
DEFAULT_SYSTEM = re.compile(r"Cutting Knowledge Date: December 2023\nToday Date: [^\n]*\n\n")


@dataclass
class Outcome:
    """One request's comparison: identical, or where it first differs (``note``: why no rebuild)."""

    request_id: str
    identical: bool
    position: int | None = None
    published: list[int] | None = None
    built: list[int] | None = None
    note: str = ""


def resolve_entry(config: dict[str, Any], dataset: str) -> tuple[str, dict[str, Any]]:
    """``(key, entry)`` of the config's dataset for ``dataset``: a key of the config, or a published
    name mapped by its builder (:data:`PUBLISHED_BUILDERS`) to the one hub entry using it."""
    datasets = config.get("datasets", {})
    if dataset in datasets:
        return dataset, datasets[dataset]
    builder = PUBLISHED_BUILDERS.get(dataset)
    if builder is None:
        raise ConfigError(
            f"--dataset {dataset!r}: neither a published dataset ({', '.join(PUBLISHED_BUILDERS)}) "
            f"nor a dataset of the config ({', '.join(datasets) or 'none'})"
        )
    keys = [k for k, e in datasets.items() if e.get("builder") == builder and e.get("source") == "huggingface"]
    if len(keys) != 1:
        raise ConfigError(
            f"--dataset {dataset!r}: the config has {len(keys)} hub dataset(s) with builder {builder!r} "
            f"({', '.join(keys) or 'none'}); name one with --dataset"
        )
    return keys[0], datasets[keys[0]]


def read_requests(path: str | Path) -> list[tuple[str, list[int]]]:
    """``(id, prompt_token_ids)`` of every request of a published trace file, in file order."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                out.append((str(rec["id"]), [int(t) for t in rec["prompt_token_ids"]]))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: not a published request with id and prompt_token_ids ({exc})") from exc
    if not out:
        raise ValueError(f"{path}: no requests")
    return out


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where ``a`` and ``b`` differ (the shorter length if one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check(
    entry: dict[str, Any],
    requests: list[tuple[str, list[int]]],
    tokenizer: Any,
    form: str,
    template: str,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[Outcome]:
    """Rebuild each published request as described in the module docstring.

    Raises ``ValueError`` when a prompt is not a Llama-3 chat prompt (the check is for those).
    """
    from sdbench.datasets.chattemplate import tokenize_prompt

    builder = entry.get("builder", "")
    fmt = SHAREGPT_FORMAT if builder == "sharegpt" else ROW_FORMATS.get(builder)
    if fmt is None:
        raise ConfigError(f"builder {builder!r} has no authors' format to recover rows by")
    outcomes = []
    for rid, ids in requests:
        text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        match = LLAMA3_CHAT.fullmatch(text)
        if match is None:
            raise ValueError(f"request {rid}: not a Llama-3 chat prompt (starts {text[:60]!r})")
        if not DEFAULT_SYSTEM.fullmatch(match["system"]):
            raise ValueError(f"request {rid}: the system turn is not the template's default ({match['system'][:60]!r})")
        try:
            row = fmt.parse_authors(match["user"])
        except ValueError as exc:
            outcomes.append(Outcome(rid, False, note=str(exc)))
            continue
        fields = fmt.authors(row) if form == "authors" else fmt.clean(row, 0)
        if fields is None:
            outcomes.append(Outcome(rid, False, note="the builder skips the recovered row"))
            continue
        turns = [{"role": "user", "content": fields["prompt_text"]}] if fields.get("chat", True) else None
        built = tokenize_prompt(tokenizer, turns, fields["prompt_text"], form, template, chat_template_kwargs)
        pos = first_difference(ids, built)
        outcomes.append(Outcome(rid, pos is None, pos, ids, built))
    return outcomes


def _around(tokenizer: Any, ids: list[int], pos: int, width: int = 6) -> str:
    """The decoded text of ``ids`` around ``pos``, the token at ``pos`` in [brackets]."""

    def dec(part: list[int]) -> str:
        return tokenizer.decode(part, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    before, at, after = dec(ids[max(0, pos - width) : pos]), dec(ids[pos : pos + 1]), dec(ids[pos + 1 : pos + width])
    return repr(before + "[" + at + "]" + after) if pos < len(ids) else repr(before + "[<end>]")


def _drop_extra_bos(ids: list[int], bos: int | None) -> list[int]:
    return ids[1:] if bos is not None and len(ids) > 1 and ids[0] == ids[1] == bos else ids


def report(outcomes: list[Outcome], tokenizer: Any, show: int, out: Any) -> int:
    """Print ``N/M identical`` and the first ``show`` differences; the exit code (0: all identical)."""
    same = sum(o.identical for o in outcomes)
    print(f"{same}/{len(outcomes)} identical", file=out)
    differing = [o for o in outcomes if not o.identical]
    bos = getattr(tokenizer, "bos_token_id", None)
    only_bos = sum(
        1 for o in differing if o.published is not None and _drop_extra_bos(o.published, bos) == o.built
    )
    if differing and only_bos:
        print(f"{only_bos} of the {len(differing)} differing differ only by a doubled BOS", file=out)
    for o in differing[:show]:
        if o.position is None:
            print(f"request {o.request_id}: {o.note}", file=out)
            continue
        assert o.published is not None and o.built is not None
        print(
            f"request {o.request_id}: first difference at token {o.position}: published "
            f"{_around(tokenizer, o.published, o.position)} built {_around(tokenizer, o.built, o.position)}",
            file=out,
        )
        pub, built = _drop_extra_bos(o.published, bos), o.built
        if pub is not o.published and pub != built:
            pos = first_difference(pub, built)
            assert pos is not None
            print(
                f"  past the doubled BOS, first difference at token {pos + 1}: published "
                f"{_around(tokenizer, pub, pos)} built {_around(tokenizer, built, pos)}",
                file=out,
            )
    return 0 if same == len(outcomes) else 1


def _cmd_check_published(args: argparse.Namespace) -> int:
    from sdbench.datasets.chattemplate import resolve_template

    config = load_config(args.config)
    key, entry = resolve_entry(config, args.dataset)
    requests = read_requests(args.traces)
    if not Path(args.tokenizer).is_dir():
        raise FileNotFoundError(2, "no such directory (expected the traces' tokenizer directory)", args.tokenizer)
    from transformers import AutoTokenizer  # slow: only once the arguments are known good

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    template, where = resolve_template(tokenizer, fallback="llama3.1")
    form = args.form or entry.get("form") or "clean"
    print(
        f"{args.traces}: {len(requests)} requests; config dataset {key!r} (builder {entry.get('builder')}), "
        f"form {form}, chat template: {where}",
        file=sys.stdout,
    )
    try:
        outcomes = check(entry, requests, tokenizer, form, template or "")
    except ValueError as exc:
        print(f"{args.traces}: its prompts are not Llama-3 chat prompts: {exc}", file=sys.stdout)
        return 1
    return report(outcomes, tokenizer, args.show, sys.stdout)
