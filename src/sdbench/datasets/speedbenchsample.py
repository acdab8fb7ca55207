"""A stand-in with SPEED-Bench's layout, made offline: ``sdbench speed-bench-sample``.

The directory it writes is read by :func:`~sdbench.datasets.prompts.load_hf_dataset` exactly
like a local copy of ``nvidia/SPEED-Bench`` (``local_path``): a README.md whose front matter
holds the ``configs`` (``qualitative`` and ``throughput_1k``, split ``test``, data files
``<config>/test-00000-of-00001.parquet`` -- the layout ``push_to_hub`` gives a config; the
real repository's file names were not checked, and ``load_dataset`` goes by the ``configs``
either way) and parquet files with SPEED-Bench's columns and types
(:data:`~sdbench.datasets.speedbench.COLUMNS`).

**These are not SPEED-Bench's prompts.** They are the pipeline's own held-out
standard-library prompts (:mod:`sdbench.datasets.corpus`), labelled with SPEED-Bench
category names so that the per-category path (builder, prompt table, analysis) runs on a
machine without the hub: in ``qualitative``, code-edit prompts (a function plus an edit
request) stand in for ``coding`` and write-the-body prompts for ``writing``; in
``throughput_1k``, code-edit prompts (mostly copying: predictable) for ``low_entropy`` and
write-the-body prompts for ``high_entropy``, at a few hundred tokens rather than 1k.
With ``placeholders`` the ``coding`` and ``low_entropy`` rows hold SPEED-Bench's placeholder
text instead (as the hub does for rows drawn from other datasets), to exercise the refusal.
The same arguments give byte-identical files.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sdbench.datasets.speedbench import COLUMNS, PLACEHOLDER, SPLIT

# config -> (category, builtin builder standing in for it); the first of each config is the
# one --placeholders empties.
STAND_INS: dict[str, tuple[tuple[str, str], ...]] = {
    "qualitative": (("coding", "code_edit"), ("writing", "code_write")),
    "throughput_1k": (("low_entropy", "code_edit"), ("high_entropy", "code_write")),
}
DATA_FILE = "{config}/test-00000-of-00001.parquet"
DEFAULT_PER_CATEGORY = 8


def _schema() -> Any:
    """SPEED-Bench's column types (the card's ``dataset_info``)."""
    import pyarrow as pa

    types = {"turns": pa.list_(pa.string()), "multiturn": pa.bool_()}
    return pa.schema([(c, types.get(c, pa.string())) for c in COLUMNS])


def sample_rows(per_category: int, seed: int, placeholders: bool) -> dict[str, list[dict[str, Any]]]:
    """Rows per config: ``per_category`` stand-in prompts per category, sorted by ``question_id``.

    Config ``i`` takes the ``i``-th block of ``per_category`` records of its builder (sorted by
    id), so the two configs share no prompt.
    """
    from sdbench.datasets.prompts import BUILDERS

    pools = {name: sorted(BUILDERS[name]({}, seed), key=lambda r: r.request_id) for name in ("code_edit", "code_write")}
    out: dict[str, list[dict[str, Any]]] = {}
    for block, (config, stand_ins) in enumerate(STAND_INS.items()):
        rows = []
        for index, (category, source) in enumerate(stand_ins):
            records = pools[source][block * per_category : (block + 1) * per_category]
            if len(records) < per_category:
                raise ValueError(
                    f"--per-category {per_category}: the corpus has only {len(records)} {source} prompts left"
                )
            for rec in records:
                text = f"{PLACEHOLDER}\n\n{{question}}" if placeholders and index == 0 else rec.prompt_text
                rows.append(
                    {
                        "question_id": f"{config}-{rec.request_id}",
                        "category": category,
                        "sub_category": source,
                        "turns": [text],
                        "source": f"sdbench builtin corpus ({source}; a stand-in, not SPEED-Bench text)",
                        "src_id": rec.request_id,
                        "difficulty": "",
                        "multiturn": False,
                    }
                )
        out[config] = sorted(rows, key=lambda r: r["question_id"])
    return out


def _readme(placeholders: bool) -> str:
    import yaml

    configs = [{"config_name": c, "data_files": [{"split": SPLIT, "path": f"{c}/{SPLIT}-*"}]} for c in STAND_INS]
    front = yaml.safe_dump({"configs": configs}, sort_keys=False)
    note = " Rows of coding and low_entropy hold SPEED-Bench's placeholder text." if placeholders else ""
    return (
        f"---\n{front}---\n# SPEED-Bench layout, sdbench stand-in prompts\n\n"
        "Written by `sdbench speed-bench-sample`: nvidia/SPEED-Bench's configs, split and columns, holding "
        "the pipeline's own standard-library prompts under SPEED-Bench category names. Not SPEED-Bench's "
        f"prompts.{note}\n"
    )


def write_sample(output: str | Path, per_category: int = DEFAULT_PER_CATEGORY, seed: int = 42,
                 placeholders: bool = False) -> Path:  # fmt: skip
    """Write the stand-in repository to ``output`` (atomically: complete or absent); returns it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sdbench.io import atomic_dir

    if per_category < 1:
        raise ValueError(f"--per-category: {per_category} (expected at least 1)")
    rows = sample_rows(per_category, seed, placeholders)
    with atomic_dir(output) as tmp:
        (tmp / "README.md").write_text(_readme(placeholders), encoding="utf-8")
        for config, config_rows in rows.items():
            path = tmp / DATA_FILE.format(config=config)
            path.parent.mkdir(parents=True)
            pq.write_table(pa.Table.from_pylist(config_rows, schema=_schema()), path)
    return Path(output)


def _cmd_sample(args: argparse.Namespace) -> int:
    write_sample(args.output, args.per_category, args.seed, args.placeholders)
    return 0
