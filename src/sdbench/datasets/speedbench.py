"""SPEED-Bench (``nvidia/SPEED-Bench``) as prompt sets: the ``speed_bench`` builder.

What the dataset is (read from the sources below, 2026):

* **Hub configs** (``hf_config``): ``qualitative`` (880 rows: 11 categories of 80 --
  coding, humanities, math, multilingual, qa, rag, reasoning, roleplay, stem,
  summarization, writing) and ``throughput_1k``, ``throughput_2k``, ``throughput_8k``,
  ``throughput_16k``, ``throughput_32k`` (1,536 rows each: the input-length bucket is the
  config; its rows are three entropy tiers of 512, ``low_entropy``, ``mixed``,
  ``high_entropy``). One split, ``test``. These are vLLM 0.32's choices of
  ``--speed-bench-dataset-subset`` and the ``DATASET_CONFIG`` of NeMo-Skills' prepare.py.
* **Columns** (the card's ``dataset_info``; the same in every config): ``question_id``
  (string), ``category`` (string: the qualitative category, or the throughput entropy
  tier), ``sub_category``, ``turns`` (list<string>: the user turns), ``source``,
  ``src_id``, ``difficulty`` (strings), ``multiturn`` (bool).
* **Placeholders.** The hub ships rows whose text comes from other datasets (CNN/DailyMail,
  HLE, LiveCodeBench, MT-Bench-101, BAMBOO, ...) as *placeholders*: their ``turns`` start
  with ``FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH``
  (:data:`PLACEHOLDER`; usually followed by a blank line and a format template). Benchmarking
  them would time a model answering that sentence. They are materialised by NVIDIA
  Model-Optimizer's ``examples/specdec_bench/prepare_data.py --dataset speed --config all
  --output_dir DIR``, which writes ``DIR/speed/<config>/test.parquet`` with the same columns
  (its ``SPEEDBench`` loader then refuses any turn still starting with the marker), or by
  NeMo-Skills' ``nemo_skills/dataset/speed-bench/prepare.py --output_dir DIR``, which writes
  ``DIR/<config>.jsonl`` with ``turns`` replaced by ``messages`` (one
  ``{"role": "user", "content": turn}`` per turn).
* **vLLM 0.32** (``vllm/benchmarks/datasets/datasets.py``, ``SpeedBench``) reads only the
  NeMo-Skills JSONL (``<dataset_path>/<subset>.jsonl``), keeps rows of one
  ``--speed-bench-category`` or all, takes ``messages[0]["content"]`` -- the **first user
  turn** of a multi-turn row -- and does not check for placeholders.

What this builder does. Rows come from :func:`~sdbench.datasets.prompts.load_hf_dataset`,
so the same entry reads the hub (``hf_id: nvidia/SPEED-Bench``, ``hf_config``,
``split: test``, ``revision``) or a local copy (``local_path``): a download of the hub
repository (same ``hf_config``), Model-Optimizer's output (``local_path: DIR/speed/<config>``,
``hf_config: null``, ``split: test``) or NeMo-Skills' (``local_path: DIR``,
``data_files: <config>.jsonl``, ``split: train``, as ``load_dataset`` names a lone file's
split). A row's prompt is its first user turn, as vLLM takes it (``turns[0]``, or the first
user message's content); later turns are not sent. Its ``request_id`` is ``question_id`` and
its category the ``category`` column (for a throughput config the entropy tier; the
input-length bucket is the config, hence the dataset key). ``categories: [...]`` keeps those
categories only; a category the rows do not hold is an error naming the ones they do. Any
kept row that still holds a placeholder (or no turn text) is an error saying how many and how
to materialise them -- never a silent run on the marker sentence.

Sampling (in :func:`~sdbench.datasets.prompts.prepare`): SPEED-Bench is balanced by design
(80 prompts per qualitative category, 512 per entropy tier) and reports acceptance per
category, so a subsample keeps that balance: after the seeded shuffle the records are dealt
round-robin over the categories (sorted), and the first ``num_prompts`` -- and the first
``run.num_requests`` a cell times -- hold equally many of each category (±1).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sdbench.datasets.prompts import PromptRecord, _source, builder, load_hf_dataset
from sdbench.errors import ConfigError

HF_ID = "nvidia/SPEED-Bench"
CONFIGS: tuple[str, ...] = (
    "qualitative",
    "throughput_1k",
    "throughput_2k",
    "throughput_8k",
    "throughput_16k",
    "throughput_32k",
)
SPLIT = "test"
QUALITATIVE_CATEGORIES: tuple[str, ...] = (
    "coding", "humanities", "math", "multilingual", "qa", "rag", "reasoning", "roleplay", "stem",
    "summarization", "writing",
)  # fmt: skip
ENTROPY_TIERS: tuple[str, ...] = ("low_entropy", "mixed", "high_entropy")
COLUMNS: tuple[str, ...] = (
    "question_id", "category", "sub_category", "turns", "source", "src_id", "difficulty", "multiturn",
)  # fmt: skip
# The first words of every turn SPEED-Bench ships without its text (Model-Optimizer's and
# NeMo-Skills' TURNS_PLACEHOLDER).
PLACEHOLDER = "FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH"
MATERIALISE = (
    "python examples/specdec_bench/prepare_data.py --dataset speed --config {config} --output_dir DIR "
    "(NVIDIA Model-Optimizer; needs access to the source datasets), then set local_path: DIR/speed/{where}, "
    "hf_config: null, split: test"
)


def row_turns(row: dict[str, Any]) -> list[str]:
    """A row's user turns: ``turns`` (hub, Model-Optimizer) or the user ``messages`` (NeMo-Skills)."""
    if "turns" in row:
        return [str(t) for t in row["turns"] or []]
    return [str(m.get("content") or "") for m in row.get("messages") or [] if m.get("role", "user") == "user"]


def is_placeholder(turns: list[str]) -> bool:
    """Whether a row is not materialised: no first-turn text, or a turn starting with :data:`PLACEHOLDER`."""
    return not turns or not turns[0].strip() or any(t.startswith(PLACEHOLDER) for t in turns)


def _check_columns(entry: dict[str, Any], found: list[str]) -> None:
    """ConfigError naming what a SPEED-Bench row lacks (question_id, category, turns or messages)."""
    missing = [c for c in ("question_id", "category") if c not in found]
    if "turns" not in found and "messages" not in found:
        missing.append("turns")
    if missing:
        raise ConfigError(
            f"{_source(entry)}: rows lack column(s) {', '.join(map(repr, missing))} "
            f"(columns found: {', '.join(map(repr, found)) or 'none'}; expected SPEED-Bench's "
            f"{', '.join(COLUMNS)}, or NeMo-Skills' messages in place of turns)"
        )


def _selected_categories(entry: dict[str, Any], present: list[str]) -> set[str]:
    """The entry's ``categories`` (all present ones when absent); ConfigError on one the rows lack."""
    wanted = entry.get("categories")
    if not wanted:
        return set(present)
    unknown = [c for c in wanted if c not in present]
    if unknown:
        raise ConfigError(
            f"categories: {', '.join(map(repr, unknown))} not in {_source(entry)} "
            f"(its categories: {', '.join(present) or 'none'})"
        )
    return set(wanted)


@builder("speed_bench")
def build_speed_bench(entry: dict[str, Any], seed: int) -> Iterator[PromptRecord]:
    """SPEED-Bench rows of the entry's config as prompts: first user turn, the row's category.

    Raises ConfigError for missing columns, an unknown ``categories`` value, duplicate
    ``question_id`` values, or rows that still hold SPEED-Bench's placeholder text.
    """
    rows = load_hf_dataset(entry)
    found = list(rows.column_names)
    _check_columns(entry, found)
    present = sorted({str(c) for c in rows["category"]})
    keep = _selected_categories(entry, present)
    kept = [(str(r["question_id"]), str(r["category"]), row_turns(r)) for r in rows if str(r["category"]) in keep]
    unresolved = [qid for qid, _, turns in kept if is_placeholder(turns)]
    if unresolved:
        config = entry.get("hf_config") or "all"
        hint = MATERIALISE.format(config=config, where=entry.get("hf_config") or "<config>")
        raise ConfigError(
            f"{_source(entry)}: {len(unresolved)} of {len(kept)} rows"
            f"{' of categories ' + ', '.join(sorted(keep)) if entry.get('categories') else ''} hold SPEED-Bench's "
            f"placeholder instead of a prompt (turns starting {PLACEHOLDER[:40] + '...'!r} or empty; first: "
            f"question_id {unresolved[0]}); materialise them first: {hint}"
        )
    seen: set[str] = set()
    for qid, category, turns in kept:
        if qid in seen:
            raise ConfigError(f"{_source(entry)}: question_id {qid!r} occurs more than once (expected unique ids)")
        seen.add(qid)
        yield PromptRecord(qid, turns[0], "", category=category)
