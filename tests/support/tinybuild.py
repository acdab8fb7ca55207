"""The tiny target that several slow tests' configs build alike, built once per session.

``.test/config/{faults,server,slurm-timeout}.yaml`` build the same ``tiny-target`` (the same
``build`` block and seed) and the same tokenizer; each test used to train them again in its own
workdir (one Snakemake build job and a tokenizer job, a minute under SLURM). :func:`build` runs
those two jobs once, with the real workflow; :func:`seed` copies their outputs into a test's
workdir, mtimes kept, before the test's own run. Snakemake then sees the outputs present and newer
than their input (no metadata is copied: without a record no params or code trigger fires, as for
any output made elsewhere), so the run starts at the prompts. A config whose model or tokenizer
inputs differ from the build's is refused, never seeded with the wrong model. ``test_parity``
reads the build in place (any tiny Llama serves it: both sides run the model they are given).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CONFIG = REPO / ".test" / "config" / "faults.yaml"
MODEL = "tiny-target"
OUTPUTS = ("results/models/tokenizer", f"results/models/built/{MODEL}")


def _build_inputs(config: Path) -> dict[str, Any]:
    """What the two build jobs read from a config: the seed and the model's entry."""
    raw = yaml.safe_load(config.read_text())
    return {"seed": raw.get("seed"), "model": (raw.get("models") or {}).get(MODEL)}


def build(root: Path) -> Path:
    """The tokenizer and ``tiny-target`` of :data:`CONFIG`, built by the workflow in ``root``."""
    cmd = [str(BIN / "snakemake"), *OUTPUTS, "--snakefile", str(REPO / "Snakefile"), "--directory", str(root),
           "--configfile", str(CONFIG), "--cores", "2"]  # fmt: skip
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise AssertionError(f"the shared tiny-target build failed:\n{done.stderr[-4000:]}")
    return root


def seed(workdir: Path, built: Path, config: Path) -> None:
    """Copy the built tokenizer and model into ``workdir`` for a run of ``config``."""
    want, have = _build_inputs(config), _build_inputs(CONFIG)
    if want != have:
        raise AssertionError(f"{config}: its seed or {MODEL} entry differs from {CONFIG}'s: not seeded "
                             f"({want} != {have})")  # fmt: skip
    for output in OUTPUTS:
        shutil.copytree(built / output, workdir / output)  # copy2: mtimes kept, the model newer than its tokenizer
