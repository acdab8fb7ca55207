"""Commands of the models stage: ``sdbench download-model``, ``download-dataset``,
``build-tokenizer``, ``train-model`` and ``check-model``.

Argument parsing only (argparse and the standard library, with the stdlib-only option table
:mod:`sdbench.models.trainconfig` and roles of :mod:`sdbench.models.check`); each command's
implementation is imported when it runs (:mod:`sdbench.lazy`).
"""

from __future__ import annotations

import argparse

from sdbench.cliargs import add_seed
from sdbench.lazy import lazy
from sdbench.models.check import ROLES
from sdbench.models.headconfig import KINDS, HeadConfig
from sdbench.models.trainconfig import COMPILES, INDUCTION_INITS, OPTION_HELP, PRECISIONS, TrainConfig


def add_download_model(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench download-model``."""
    p = subparsers.add_parser("download-model", help="snapshot a Hugging Face model at a pinned revision")
    p.add_argument("--repo", required=True, help="Hugging Face repo id, e.g. meta-llama/Llama-3.1-8B-Instruct")
    p.add_argument("--revision", default="main", help="commit sha (or branch/tag, resolved and recorded)")
    p.add_argument("--output", required=True, help="output directory")
    p.set_defaults(func=lazy("sdbench.models.hub", "_cmd_download"))


def add_download_dataset(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench download-dataset``."""
    p = subparsers.add_parser(
        "download-dataset", help="copy the files of a Hugging Face dataset repository that an entry selects"
    )
    p.add_argument("--name", required=True, help="dataset key in the config")
    p.add_argument("--entry", required=True, help="the dataset's config entry (JSON: hf_id, revision, hf_config, ...)")
    p.add_argument("--output", required=True, help="output directory (the entry's local copy)")
    p.set_defaults(func=lazy("sdbench.models.hub", "_cmd_download_dataset"))


def add_build_tokenizer(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench build-tokenizer``."""
    p = subparsers.add_parser(
        "build-tokenizer", help="train the byte-level BPE tokenizer on the stdlib corpus"
    )
    p.add_argument("--output", required=True, help="tokenizer directory to write")
    p.add_argument("--vocab-size", type=int, default=2048)
    add_seed(p, 0, "the synthetic edit examples; BPE itself is deterministic")
    p.add_argument(
        "--edit-max-chars", type=int, default=700, help="longest function (characters) used for edit examples"
    )
    p.add_argument(
        "--edits-per-function", type=int, default=2, help="edit examples drawn per train/held-out function"
    )
    p.add_argument(
        "--corpus-root", default=None, help="directory of .py files instead of the interpreter's stdlib"
    )
    p.set_defaults(func=lazy("sdbench.models.tokenizer", "_cmd_build_tokenizer"))


def add_train_model(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench train-model`` (one option per :class:`~sdbench.models.trainconfig.TrainConfig` field)."""
    d = TrainConfig()
    p = subparsers.add_parser("train-model", help="train a small Llama model (target or draft) on CPU")
    p.add_argument("--tokenizer", required=True, help="directory written by build-tokenizer")
    p.add_argument("--output", required=True, help="Hugging Face model directory to write")
    for name in TrainConfig.__dataclass_fields__:
        default = getattr(d, name)
        p.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            type=type(default),
            default=default,
            choices={"induction_init": INDUCTION_INITS, "precision": PRECISIONS, "compile": COMPILES}.get(name),
            help=f"{OPTION_HELP.get(name, '')} (default {default})".lstrip(),
        )
    p.set_defaults(func=lazy("sdbench.models.training", "_cmd_train_model"))


_HEAD_HELP = {
    "kind": "eagle (EAGLE-1: fc over [embedding ; final hidden]), eagle3 (fc over aux residual streams), "
    "mtp (a MiMo MTP layer; the output is the target as MiMo with the layer) "
    "or medusa (Medusa-1 heads: a residual block and an LM head each over the final hidden state)",
    "ttt_steps": "chain steps trained on the head's own outputs (EAGLE-3's training-time test; 1 = EAGLE-1's recipe)",
    "step_decay": "loss weight of chain step j (medusa: of head j) is step_decay ** (j - 1)",
    "num_heads": "medusa only: heads trained (head j = 1, 2, ... drafts token t+1+j; vLLM runs the first num_speculative_tokens)",
    "feature_weight": "EAGLE-1 only: weight of the next-hidden-state regression (the token loss has weight 1)",
    "aux_layers": "EAGLE-3 only: residual stream entering these target layers (ascending; the layer count = the output)",
    "edit_fraction": "share of training rows made of packed code-edit examples",
    "threads": "torch threads; the same count gives bit-identical weights on a rerun",
    "eval_windows": "held-out windows scored for training.json (top-1 agreement per chain step)",
}


def add_train_head(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench train-head`` (one option per :class:`~sdbench.models.headconfig.HeadConfig` field)."""
    d = HeadConfig()
    p = subparsers.add_parser(
        "train-head",
        help="train an EAGLE / EAGLE-3 draft head, an MTP layer or Medusa heads for a built target from its activations",
    )
    p.add_argument("--target", required=True, help="the target's model directory (written by train-model)")
    p.add_argument("--tokenizer", required=True, help="directory written by build-tokenizer (training data)")
    p.add_argument("--output", required=True, help="head directory to write (config.json + model.safetensors)")
    for name in HeadConfig.__dataclass_fields__:
        default = getattr(d, name)
        choices = {"kind": KINDS, "precision": PRECISIONS, "compile": COMPILES}
        extra: dict = {"choices": choices[name]} if name in choices else {}
        if isinstance(default, tuple):
            extra.update(nargs="+", type=int)
        else:
            extra["type"] = type(default)
        p.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            default=default,
            help=f"{_HEAD_HELP.get(name, '')} (default {default})".lstrip(),
            **extra,
        )
    p.set_defaults(func=lazy("sdbench.models.eagle", "_cmd_train_head"))


def add_check_model(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sdbench check-model``."""
    p = subparsers.add_parser(
        "check-model",
        help="check a model / drafter-head directory (config, weights, tensor names) before an engine loads it",
    )
    p.add_argument("directory", help="model directory (config.json + *.safetensors or pytorch_model*.bin)")
    p.add_argument("--role", choices=ROLES, default="target", help="what the directory is (default: target)")
    p.set_defaults(func=lazy("sdbench.models.check", "_cmd_check"))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the models stage's commands."""
    for add in (
        add_download_model,
        add_download_dataset,
        add_build_tokenizer,
        add_train_model,
        add_train_head,
        add_check_model,
    ):
        add(subparsers)
