"""Commands of the dataset stage: ``sdbench prepare-dataset``, ``speed-bench-sample``,
``datasets check-published``.

Argument parsing only (argparse and the standard library); the implementation
(:mod:`sdbench.datasets.prompts`) is imported when the command runs (:mod:`sdbench.lazy`).
"""

from __future__ import annotations

import argparse

from sdbench.cliargs import add_config, add_output_table, add_seed
from sdbench.lazy import lazy


def add_prepare_dataset(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench prepare-dataset``."""
    p = subparsers.add_parser("prepare-dataset", help="sample and tokenize a prompt set")
    p.add_argument("--name", required=True, help="dataset key in the config")
    p.add_argument("--entry", required=True, help="the dataset's config entry (JSON)")
    p.add_argument("--tokenizer", required=True, help="tokenizer directory (the target model's)")
    add_seed(p, 42, "the prompt sample")
    p.add_argument("--chat-template-kwargs", default="{}", help="JSON dict for apply_chat_template")
    p.add_argument("--matched", default=None, help="random_tokens datasets: the matched dataset's prompt table")
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="the model's context length (default: max_position_embeddings of config.json in --tokenizer)",
    )
    add_output_table(p, "the prompt table")
    p.set_defaults(func=lazy("sdbench.datasets.prompts", "_cmd_prepare"))


def add_speed_bench_sample(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench speed-bench-sample``."""
    p = subparsers.add_parser(
        "speed-bench-sample",
        help="write a directory laid out like nvidia/SPEED-Bench holding stand-in builtin prompts",
    )
    p.add_argument("--output", required=True, help="directory to write (replaced atomically)")
    p.add_argument("--per-category", type=int, default=8, help="prompts per category (default 8)")
    add_seed(p, 42, "the builtin prompts (code-edit requests)")
    p.add_argument(
        "--placeholders", action="store_true", help="coding / low_entropy rows hold SPEED-Bench's placeholder text"
    )
    p.set_defaults(func=lazy("sdbench.datasets.speedbenchsample", "_cmd_sample"))


def add_datasets(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench datasets check-published``."""
    p = subparsers.add_parser("datasets", help="check the paper's workload against the published prompts")
    sub = p.add_subparsers(dest="datasets_command", required=True)
    c = sub.add_parser(
        "check-published",
        help="rebuild each published request's prompt from its dataset row and compare token ids",
    )
    add_config(c, "the dataset (e.g. config/paper.yaml)", required=True)
    c.add_argument(
        "--dataset",
        required=True,
        help="published dataset (gsm8k, instructcoder, sharegpt, cnn) or a dataset key of the config",
    )
    c.add_argument("--traces", required=True, help="published trace file (JSONL with id, prompt_token_ids)")
    c.add_argument("--tokenizer", required=True, help="tokenizer directory of the traces' model")
    c.add_argument(
        "--form",
        choices=("authors", "clean"),
        default=None,
        help="rebuild in this form instead of the entry's (clean: one BOS and the clean prompt formats)",
    )
    c.add_argument("--show", type=int, default=3, help="differing requests to print (default 3)")
    c.set_defaults(func=lazy("sdbench.datasets.published", "_cmd_check_published"))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the dataset stage's commands."""
    add_prepare_dataset(subparsers)
    add_speed_bench_sample(subparsers)
    add_datasets(subparsers)
