"""Benchmarks timed as whole processes: a fresh ``sdbench`` process, start-up included.

What a pipeline step costs is a whole process (interpreter start-up, imports, reading inputs,
writing outputs), which an in-process timer does not see; the benchmarks that compare sdbench
with another tool run as processes too (``bench simulator``: the published simulator's
``main.py``) report this time next to their in-process one.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path


def sdbench_argv() -> list[str]:
    """The command starting the ``sdbench`` CLI: the console script beside this interpreter
    (what the workflow's rules run), else ``python -m sdbench.cli``."""
    script = Path(sys.executable).parent / "sdbench"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "sdbench.cli"]


def run_sdbench(args: Sequence[str]) -> float:
    """Run ``sdbench ARGS`` as a fresh process to completion; its wall seconds, start-up included.

    Raises ``RuntimeError`` with the process's stderr if it fails.
    """
    argv = [*sdbench_argv(), *map(str, args)]
    start = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return seconds
