"""An image's gate: one small GPU job per CUDA engine image, before any of its engine jobs.

Inside the image, on a node of the engine partition, it checks what the image needs of the site:
a GPU visible through ``--nv`` and a driver at least the image's CUDA minimum
(:data:`sdbench.gpudriver.IMAGE_CUDA`: CUDA 13, the draft-model image's, needs driver >= 580). Where
it fails, the job fails in one line, and Snakemake starts none of the engine jobs that read its
output (every other image's jobs run on: ``keep-going``); where it passes it writes what it saw
(``results/gates/<image>.json``). Its rule retries nothing: a driver does not change between two
attempts. A rehearsal gates too (:func:`gate`), where ``nvidia-smi`` answers (a site double) and
says so where none does.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from sdbench.io import atomic_path


def gate(image: str, rehearsal: bool = False) -> tuple[bool, str]:
    """(passed, one line) of the image's gate, run inside the image."""
    from sdbench.gpudriver import driver_check

    if rehearsal and shutil.which("nvidia-smi") is None:
        return True, f"image {image} | skipped: a rehearsal, no nvidia-smi to ask (no GPU checked)"
    result = driver_check(f"image {image}", [], [image])
    return not result.failed, result.line()


def _cmd_image_gate(args: argparse.Namespace) -> int:
    passed, line = gate(args.image, args.rehearsal)
    if not passed:
        print(f"error: {line}: none of the engine jobs of image {args.image} start (the other images' jobs run)",
              file=sys.stderr)  # fmt: skip
        return 1
    print(line)
    with atomic_path(Path(args.output)) as tmp:
        tmp.write_text(json.dumps({"image": args.image, "check": line}, sort_keys=True) + "\n")
    return 0
