"""Flags that several commands share: one definition, one help text each.

The stages' light ``cli`` modules add these to their parsers, so a flag reads and parses the same
in every command that takes it. Argparse and the standard library only, like those modules
(:mod:`sdbench.lazy`). A command whose flag of the same name means something else declares it
itself, with a comment saying so.
"""

from __future__ import annotations

import argparse

DEFAULT_CONFIG = "config/config.yaml"


def add_cells(p: argparse.ArgumentParser) -> None:
    """``--cells``: the joined cells table an analysis reads (``sdbench aggregate`` writes it)."""
    p.add_argument("--cells", required=True, help="joined cells table (aggregate: results/tables/cells.parquet)")


def add_labels(p: argparse.ArgumentParser) -> None:
    """``--labels``: the config's method labels, optional."""
    p.add_argument("--labels", default=None, help="JSON: method key -> label (the config's)")


def add_config(p: argparse.ArgumentParser, holding: str, *, required: bool = False) -> None:
    """``--config``: the config file a tool reads ``holding`` from (default config/config.yaml)."""
    default = None if required else DEFAULT_CONFIG
    suffix = "" if required else f" (default {DEFAULT_CONFIG})"
    p.add_argument("--config", required=required, default=default, help=f"config file holding {holding}{suffix}")


def add_seed(p: argparse.ArgumentParser, default: int, of: str) -> None:
    """``--seed``: the seed of ``of`` (what it draws differs per command; its meaning does not)."""
    p.add_argument("--seed", type=int, default=default, help=f"seed of {of} (default {default})")


def add_model_dirs(p: argparse.ArgumentParser) -> None:
    """``--model-dir`` (required) and ``--drafter-dir`` of a command that starts an engine."""
    p.add_argument("--model-dir", required=True, help="target model directory (HF format)")
    p.add_argument("--drafter-dir", default=None, help="draft model / head directory, if the method has one")


def add_prompts(p: argparse.ArgumentParser, *, many: bool = False) -> None:
    """``--prompts``: one prompt table (``many``: one or more, those of the cells' datasets)."""
    what = "prompt tables (parquet) of the cells' datasets" if many else "prompt table (parquet)"
    p.add_argument("--prompts", nargs="+" if many else None, required=True, help=f"{what} from prepare-dataset")


def add_output_dir(p: argparse.ArgumentParser, layout: str) -> None:
    """``--output-dir`` (required): the directory an engine command writes, laid out as ``layout``."""
    p.add_argument("--output-dir", required=True, help=f"output directory: {layout}")


def add_output_table(p: argparse.ArgumentParser, what: str = "the table", *, required: bool = True) -> None:
    """``--output``: a table written as parquet (not required: written only when given).

    Commands whose ``--output`` is a directory, a PNG, a CSV, YAML or an archive declare their own.
    """
    p.add_argument("--output", required=required, default=None, help=f"output: {what} (parquet)")


def add_markdown(p: argparse.ArgumentParser, what: str = "the table", *, required: bool = True) -> None:
    """``--markdown``: a Markdown rendering (not required: written only when given)."""
    p.add_argument("--markdown", required=required, default=None, help=f"output: {what} (Markdown)")


def add_figure(p: argparse.ArgumentParser, what: str, *, required: bool = True) -> None:
    """``--figure``: a PNG showing ``what`` (not required: drawn only when given)."""
    p.add_argument("--figure", required=required, default=None, help=f"output: {what} (PNG)")


def add_table_outputs(
    p: argparse.ArgumentParser, figure: str, table: str = "the table", markdown: str | None = None
) -> None:
    """``--output`` (parquet), ``--markdown`` and ``--figure`` (PNG) of an analysis, all required."""
    add_output_table(p, table)
    add_markdown(p, markdown or table)
    add_figure(p, figure)
