"""The rehearsal engine: every engine job of a config without a GPU, priced by the simulator's cost model.

``engine_mode: rehearsal`` (a top-level config key; ``--config engine_mode=rehearsal`` on top of
any config) puts ``engine_mode`` into every engine job's spec, and each engine job then starts
:class:`sdbench.rehearsal.llm.RehearsalLLM` instead of ``vllm.LLM``: the real timing, counting and
table code runs on it unchanged, with a virtual clock that advances by the modelled time of each
call. Nothing it writes is a measurement: every table it writes has ``measured = False``.

- :mod:`sdbench.rehearsal.standins`: every stand-in as data (docs/methods/rehearsal.md);
- :mod:`sdbench.rehearsal.workload`: what each request does (output length, accepted lengths
  replayed from the published traces);
- :mod:`sdbench.rehearsal.costs`: step times from the cost model, scaled to the model;
- :mod:`sdbench.rehearsal.steps`: the engine steps of a call (continuous batching);
- :mod:`sdbench.rehearsal.llm`: the stand-in ``vllm.LLM`` and how an engine job starts it;
- :mod:`sdbench.rehearsal.serve`: server mode without a server;
- :mod:`sdbench.rehearsal.prepare`: rehearsal prompt sets and stand-in model directories.

No module of the package imports vLLM or torch. The engine code reaches the package's modules only
through :func:`module` (by name): a measured run's code digests (:mod:`sdbench.codedigest`, what
reruns an engine job) do not cover the rehearsal's code, and a rehearsal's rules add the package.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

MEASURED = "measured"
REHEARSAL = "rehearsal"
ENGINE_MODES = (MEASURED, REHEARSAL)
# A stand-in model directory (no weights) holds this file: measured engines refuse such a directory.
MARKER = "sdbench-rehearsal.json"


def engine_mode(spec: dict[str, Any]) -> str:
    """The engine mode of a cell, group or server spec (``measured`` where the spec has none)."""
    return str(spec.get("engine_mode", MEASURED))


def is_rehearsal(spec: dict[str, Any]) -> bool:
    """Whether an engine job's spec runs on the rehearsal engine."""
    return engine_mode(spec) == REHEARSAL


def is_standin(path: str | Path) -> bool:
    """Whether ``path`` is a rehearsal stand-in model directory (:mod:`sdbench.rehearsal.prepare`)."""
    return (Path(path) / MARKER).is_file()


def module(name: str) -> ModuleType:
    """The rehearsal's module ``sdbench.rehearsal.<name>``, imported by name (module docstring)."""
    return importlib.import_module(f"{__name__}.{name}")
