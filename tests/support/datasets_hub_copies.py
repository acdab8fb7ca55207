"""Local copies of the paper's six hub dataset repositories, a few rows each.

Each writer lays out a directory the way the hub repository is laid out (same file
names, formats, README.md ``configs`` and column names), so that
``datasets.load_dataset(<dir>, hf_config, split=..., data_files=...)`` resolves the
same config, split and files as ``load_dataset(hf_id, ...)`` does on the cluster. Only
the files the paper's entries select are written, plus one decoy file per repository
(another config, split or data file) whose rows must *not* come out.

Layouts, and what they are based on:

* abisee/cnn_dailymail: parquet per config directory, ``3.0.0/{train,validation,test}-0000N-of-0000M.parquet``
  (the train split in several files)
  (the repository's "Convert dataset to Parquet" commit 96df5e6) with README ``configs`` named
  ``1.0.0``/``2.0.0``/``3.0.0``; columns ``article``, ``highlights``, ``id`` (string; a SHA-1
  hex digest of the story URL), from the card's ``dataset_info``.
* anon8231489123/ShareGPT_Vicuna_unfiltered: ``ShareGPT_V3_unfiltered_cleaned_split.json`` beside
  other JSON dumps (hence the paper's explicit ``data_files``), one JSON array of
  ``{"id": "<8 chars>_<n>", "conversations": [{"from": "human"|"gpt", "value": ...}]}``
  -- the format vLLM's ShareGPT benchmark reads with ``json.load``. Real conversations
  may start with a "gpt" turn or have a single turn; both kinds are included.
* likaixin/InstructCoder: ``train.json`` and ``valid.json`` at the top (the hub's own
  pandas snippet, ``{'train': 'train.json', 'validation': 'valid.json'}``), no README configs
  (splits come from the file names); records of ``instruction``, ``input``, ``output``
  (the "instruction-input-output triplets" of qishenghu/InstructCoder, whose loader reads
  ``.json`` files as one JSON document).
* openai/gsm8k: ``main/{train,test}-00000-of-00001.parquet`` and ``socratic/...`` with README
  ``configs`` ``main`` and ``socratic``; columns ``question``, ``answer`` (the worked solution
  with ``<<...>>`` calculator annotations, ending in ``#### <number>``).
* AI-MO/aimo-validation-aime: ``data/train-00000-of-00001.parquet``, README ``configs`` ``default``
  with ``data/train-*``; columns ``id`` (int64), ``problem``, ``solution``, ``answer`` (string),
  ``url`` -- the card's ``dataset_info``.
* Idavidrein/gpqa (gated): one CSV per config, README ``configs`` ``gpqa_main: gpqa_main.csv``,
  ``gpqa_diamond: gpqa_diamond.csv``, ... (single "train" split); the CSV header is the
  long sheet export -- ``Question``, ``Correct Answer``, ``Incorrect Answer 1..3``,
  ``Explanation``, ``Subdomain``, ``Record ID``, ``High-level domain`` among ~50 columns
  (a subset is written here).

The row texts are made up in each dataset's style.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

Row = dict[str, Any]


def _readme(root: Path, configs: list[dict[str, Any]]) -> None:
    """A dataset card whose YAML front matter holds the ``configs`` (what load_dataset reads)."""
    front = yaml.safe_dump({"configs": configs}, sort_keys=False)
    (root / "README.md").write_text(f"---\n{front}---\n# Local copy for tests\n", encoding="utf-8")


def _parquet(path: Path, rows: list[Row]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def _drop(rows: list[Row], column: str | None) -> list[Row]:
    return [{k: v for k, v in r.items() if k != column} for r in rows]


def _story_id(url: str) -> str:
    return hashlib.sha1(url.encode()).hexdigest()


# --- abisee/cnn_dailymail --------------------------------------------------------------

CNN_ROWS: list[Row] = [
    {
        "article": "LONDON, England (CNN) -- A council has approved plans for a cycle bridge over the river. "
        "Work is due to start next spring and will take about a year, officials said.",
        "highlights": "Council approves cycle bridge over the river .\nWork to start next spring .",
        "id": _story_id("http://www.cnn.com/2015/04/01/cycle-bridge"),
    },
    {
        "article": "By . Daily Mail Reporter . A rare orchid has flowered at a botanic garden for the first "
        "time in 20 years. Gardeners said the bloom would last only a few days.",
        "highlights": "Rare orchid flowers for first time in 20 years .\nBloom will last only days .",
        "id": _story_id("http://www.dailymail.co.uk/news/article-1/orchid"),
    },
    {
        "article": "(CNN) -- The city marathon drew a record 40,000 runners on Sunday. "
        "The winner finished in just over two hours, race organisers said.",
        "highlights": "Record 40,000 runners in city marathon .\nWinner finished in just over two hours .",
        "id": _story_id("http://www.cnn.com/2015/04/12/marathon"),
    },
    {
        "article": "By . Associated Press . A library returned a book 60 years overdue after it was found in "
        "an attic. The library waived the fine.",
        "highlights": "Book returned 60 years overdue .\nLibrary waived the fine .",
        "id": _story_id("http://www.dailymail.co.uk/news/article-2/library"),
    },
]
CNN_TRAIN_FILES = ("train-00000-of-00002.parquet", "train-00001-of-00002.parquet")
# Decoys: the other split of 3.0.0, and 1.0.0 (which has the same columns).
CNN_DECOY = {"article": "DECOY story that must not be read.", "highlights": "DECOY .", "id": _story_id("decoy")}


def write_cnn(root: Path, drop: str | None = None) -> Path:
    """abisee/cnn_dailymail with configs 1.0.0 and 3.0.0: the rows of :data:`CNN_ROWS` in the
    train split of 3.0.0 (the paper's), split over two data files (:data:`CNN_TRAIN_FILES`), so
    that the shard order of the authors' streaming shuffle is exercised."""
    rows = _drop(CNN_ROWS, drop)
    for i, name in enumerate(CNN_TRAIN_FILES):
        _parquet(root / "3.0.0" / name, rows[2 * i : 2 * i + 2])
    _parquet(root / "3.0.0" / "test-00000-of-00001.parquet", _drop([CNN_DECOY], drop))
    _parquet(root / "1.0.0" / "train-00000-of-00001.parquet", _drop([CNN_DECOY], drop))
    _readme(
        root,
        [
            {"config_name": "1.0.0", "data_files": [{"split": "train", "path": "1.0.0/train-*"}]},
            {
                "config_name": "3.0.0",
                "data_files": [
                    {"split": "train", "path": "3.0.0/train-*"},
                    {"split": "test", "path": "3.0.0/test-*"},
                ],
            },
        ],
    )
    return root


# --- anon8231489123/ShareGPT_Vicuna_unfiltered -------------------------------------------

SHAREGPT: list[Row] = [
    {
        "id": "QWJhYvA_0",
        "conversations": [
            {"from": "human", "value": "Summarize the plot of Hamlet in two sentences."},
            {"from": "gpt", "value": "Prince Hamlet seeks revenge for his father's murder. Nearly everyone dies."},
        ],
    },
    {
        "id": "QWJhYvA_1",
        "conversations": [
            {"from": "human", "value": "Write a haiku about autumn rain."},
            {"from": "gpt", "value": "Cold rain on red leaves\nthe gutter sings all night\nmorning smells of earth"},
            {"from": "human", "value": "Now one about snow."},
            {"from": "gpt", "value": "Silent white blanket"},
        ],
    },
    {  # split conversations can start with the assistant: skipped by the builder
        "id": "i6IyJda_2",
        "conversations": [
            {"from": "gpt", "value": "...continuing the list: 4. Drink water."},
            {"from": "human", "value": "thanks"},
        ],
    },
    {"id": "A5AbcES_0", "conversations": [{"from": "human", "value": "hello?"}]},  # no answer: skipped
    {
        "id": "hRUj3mX_0",
        "conversations": [
            {"from": "human", "value": "How do I reverse a list in Python?"},
            {"from": "gpt", "value": "Use `my_list[::-1]` for a copy or `my_list.reverse()` in place."},
        ],
    },
]
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"


def write_sharegpt(root: Path, drop: str | None = None) -> Path:
    """The ShareGPT repository: the V3 split JSON (:data:`SHAREGPT`) and a decoy sibling JSON."""
    root.mkdir(parents=True, exist_ok=True)
    (root / SHAREGPT_FILE).write_text(json.dumps(_drop(SHAREGPT, drop), indent=2), encoding="utf-8")
    decoy = [{"id": "DECOY_0", "conversations": [{"from": "human", "value": "DECOY"}, {"from": "gpt", "value": "x"}]}]
    (root / "ShareGPT_V3_unfiltered_cleaned_split_no_imsorry.json").write_text(json.dumps(decoy), encoding="utf-8")
    return root


# --- likaixin/InstructCoder ----------------------------------------------------------------

INSTRUCTCODER: list[Row] = [
    {
        "instruction": "Add a docstring to the 'area' function",
        "input": "def area(r):\n    return 3.14159 * r * r\n",
        "output": 'def area(r):\n    """Area of a circle of radius r."""\n    return 3.14159 * r * r\n',
    },
    {
        "instruction": "Replace the for loop with a list comprehension",
        "input": "squares = []\nfor x in range(10):\n    squares.append(x * x)\n",
        "output": "squares = [x * x for x in range(10)]\n",
    },
    {
        "instruction": "Handle the case where the file does not exist",
        "input": "def read_config(path):\n    with open(path) as f:\n        return f.read()\n",
        "output": "import os\n\ndef read_config(path):\n    if not os.path.exists(path):\n        return ''\n"
        "    with open(path) as f:\n        return f.read()\n",
    },
    {
        "instruction": "Rename variable 'x' to 'total' for clarity",
        "input": "x = 0\nfor price in prices:\n    x += price\nprint(x)\n",
        "output": "total = 0\nfor price in prices:\n    total += price\nprint(total)\n",
    },
]


def write_instructcoder(root: Path, drop: str | None = None) -> Path:
    """InstructCoder: ``train.json`` (:data:`INSTRUCTCODER`) and a decoy ``valid.json``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.json").write_text(json.dumps(_drop(INSTRUCTCODER, drop), indent=2), encoding="utf-8")
    decoy = [{"instruction": "DECOY", "input": "pass\n", "output": "pass\n"}]
    (root / "valid.json").write_text(json.dumps(_drop(decoy, drop)), encoding="utf-8")
    return root


# --- openai/gsm8k --------------------------------------------------------------------------

GSM8K_ROWS: list[Row] = [
    {
        "question": "A baker makes 24 muffins and sells half of them in the morning. How many are left?",
        "answer": "She sells 24/2 = <<24/2=12>>12 muffins.\nSo 24 - 12 = <<24-12=12>>12 are left.\n#### 12",
    },
    {
        "question": "Tom reads 15 pages a day. How many pages does he read in 6 days?",
        "answer": "He reads 15 * 6 = <<15*6=90>>90 pages.\n#### 90",
    },
    {
        "question": "A shirt costs $20 and is 25% off. What is the sale price?",
        "answer": "The discount is 20 * 0.25 = $<<20*0.25=5>>5.\nThe price is 20 - 5 = $<<20-5=15>>15.\n#### 15",
    },
    {
        "question": "There are 3 boxes with 8 pencils each. 5 pencils are lost. How many remain?",
        "answer": "There are 3 * 8 = <<3*8=24>>24 pencils.\n24 - 5 = <<24-5=19>>19 remain.\n#### 19",
    },
]
GSM8K_DECOY = {"question": "DECOY question?", "answer": "#### 0"}


def write_gsm8k(root: Path, drop: str | None = None) -> Path:
    """openai/gsm8k with configs main (train rows, the paper's split: :data:`GSM8K_ROWS`) and socratic."""
    _parquet(root / "main" / "train-00000-of-00001.parquet", _drop(GSM8K_ROWS, drop))
    _parquet(root / "main" / "test-00000-of-00001.parquet", _drop([GSM8K_DECOY], drop))
    _parquet(root / "socratic" / "train-00000-of-00001.parquet", _drop([GSM8K_DECOY], drop))
    _readme(
        root,
        [
            {
                "config_name": "main",
                "data_files": [
                    {"split": "train", "path": "main/train-*"},
                    {"split": "test", "path": "main/test-*"},
                ],
            },
            {"config_name": "socratic", "data_files": [{"split": "train", "path": "socratic/train-*"}]},
        ],
    )
    return root


# --- AI-MO/aimo-validation-aime ------------------------------------------------------------

AIME: list[Row] = [
    {
        "id": 60,
        "problem": "Find the number of positive integers $n \\le 100$ such that $n^2 + n$ is divisible by 6.",
        "solution": "Since $n^2+n=n(n+1)$ is always even, we need $3 \\mid n(n+1)$ ... $\\boxed{067}$.",
        "answer": "067",
        "url": "https://artofproblemsolving.com/wiki/index.php/2024_AIME_I_Problems/Problem_1",
    },
    {
        "id": 61,
        "problem": "Let $x$ and $y$ be real numbers with $x + y = 10$ and $xy = 21$. Find $x^3 + y^3$.",
        "solution": "$x^3+y^3=(x+y)^3-3xy(x+y)=1000-630=\\boxed{370}$.",
        "answer": "370",
        "url": "https://artofproblemsolving.com/wiki/index.php/2024_AIME_I_Problems/Problem_2",
    },
    {
        "id": 62,
        "problem": "How many ordered pairs of positive integers $(a,b)$ satisfy $ab = 144$?",
        "solution": "$144 = 2^4 3^2$ has $(4+1)(2+1) = \\boxed{015}$ divisors.",
        "answer": "015",
        "url": "https://artofproblemsolving.com/wiki/index.php/2024_AIME_I_Problems/Problem_3",
    },
]


def write_aime(root: Path, drop: str | None = None) -> Path:
    """AI-MO/aimo-validation-aime: one train parquet (:data:`AIME`)."""
    _parquet(root / "data" / "train-00000-of-00001.parquet", _drop(AIME, drop))
    _readme(root, [{"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*"}]}])
    return root


# --- Idavidrein/gpqa -------------------------------------------------------------------------

GPQA_MAIN: list[Row] = [
    {
        "Question": "Which particle mediates the electromagnetic force?",
        "Correct Answer": "Photon",
        "Incorrect Answer 1": "Gluon",
        "Incorrect Answer 2": "W boson",
        "Incorrect Answer 3": "Higgs boson",
        "Explanation": "The photon is the gauge boson of QED.",
        "Subdomain": "Physics (general)",
        "Record ID": "recA1b2C3d4E5f6G7h",
        "High-level domain": "Physics",
    },
    {
        "Question": "What is the hybridization of the carbon atoms in ethyne? ",
        "Correct Answer": "sp",
        "Incorrect Answer 1": "sp2",
        "Incorrect Answer 2": "sp3",
        "Incorrect Answer 3": "sp3d",
        "Explanation": "Each carbon forms two sigma bonds and two pi bonds.",
        "Subdomain": "Organic Chemistry",
        "Record ID": "recH8i9J0k1L2m3N4o",
        "High-level domain": "Chemistry",
    },
    {
        "Question": "Which organelle is the site of oxidative phosphorylation?",
        "Correct Answer": " Mitochondrion",
        "Incorrect Answer 1": "Golgi apparatus",
        "Incorrect Answer 2": "Lysosome",
        "Incorrect Answer 3": "Ribosome",
        "Explanation": "The electron transport chain sits in the inner mitochondrial membrane.",
        "Subdomain": "Molecular Biology",
        "Record ID": "recP5q6R7s8T9u0V1w",
        "High-level domain": "Biology",
    },
]
GPQA_ANSWERS = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")


def _csv(path: Path, rows: list[Row]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_gpqa(root: Path, drop: str | None = None) -> Path:
    """Idavidrein/gpqa: ``gpqa_main.csv`` (:data:`GPQA_MAIN`) and a decoy ``gpqa_diamond.csv``.

    Only the configs whose CSVs exist are listed (load_dataset infers the file format
    from the first config's files).
    """
    root.mkdir(parents=True, exist_ok=True)
    _csv(root / "gpqa_main.csv", _drop(GPQA_MAIN, drop))
    _csv(root / "gpqa_diamond.csv", _drop([{**GPQA_MAIN[0], "Question": "DECOY question?"}], drop))
    _readme(
        root,
        [
            {"config_name": "gpqa_main", "data_files": "gpqa_main.csv"},
            {"config_name": "gpqa_diamond", "data_files": "gpqa_diamond.csv"},
        ],
    )
    return root


WRITERS: dict[str, Callable[..., Path]] = {
    "cnn": write_cnn,
    "sharegpt": write_sharegpt,
    "instructcoder": write_instructcoder,
    "gsm8k": write_gsm8k,
    "aime": write_aime,
    "gpqa": write_gpqa,
}
