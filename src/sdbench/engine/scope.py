"""The measurement scope: the code an engine job's numbers depend on, named in one place.

An engine job (``run_engine``, ``trace_group``, ``breakdown_group``, ``server_group``) costs
GPU-hours, so it runs again, and its checkpointed cells are measured again, only when what it
measures changes: the cell's spec, its prompts, the model files, the software (the image), and
the code of :func:`measurement_modules`. That code is every ``sdbench`` module the engine job's
process runs: :data:`ENTRIES` (the engine commands, and the vLLM plugins that vLLM loads into the
engine by entry point, never imported by name) and everything they import, transitively
(:func:`sdbench.codedigest.module_closure`), but :data:`OUTSIDE`: modules the process runs that
cannot change a number, each with its reason. The intervals a cell records are in the scope
(:mod:`sdbench.engine.measure.resampling`): with ``run.target_half_width`` they decide how many trials
a cell takes.

Everything computed from the recorded tables afterwards (analyses, figures, the simulator), and
what builds the inputs (trainers, dataset builders, tracers), is outside: an edit there re-runs
those steps only. A cell records the digest of the scope it was measured under
(``measurement_digest``) beside the whole package's (``code_digest``, provenance), and
``sdbench aggregate`` names the cells measured under an older scope (:func:`stale_cells`).
"""

from __future__ import annotations

from collections.abc import Iterable

from sdbench.codedigest import code_digest, module_closure

# What an engine job's process starts from: the commands, then the vLLM plugins (pyproject.toml,
# entry points ``vllm.general_plugins``; a test keeps this list complete).
ENTRIES: tuple[str, ...] = (
    "sdbench.engine.cli",
    "sdbench.engine.commands",
    "sdbench.engine.release.acceptancetrace",
    "sdbench.engine.measure.steptiming",
    "sdbench.engine.release.enginefixes",
    "sdbench.engine.release.workerprobe",
    "sdbench.engine.measure.forcing",
)
# Server mode's process runs these as well (``sdbench serve-group``).
SERVER_ENTRIES: tuple[str, ...] = ("sdbench.engine.serving.servegroup", "sdbench.engine.serving.server", "sdbench.engine.serving.loadgen")
# Modules the engine process runs that cannot change a measured number (module -> why).
OUTSIDE: dict[str, str] = {
    "sdbench.engine.site.preflight": (
        "reads and checks a cell's inputs before the engine starts (prompt-table columns, model and "
        "drafter files): it hands on the prompt table as read or stops the job, and the table's bytes "
        "are keyed on their own (sdbench.engine.groups.measurement_context)"
    ),
}
# What a rehearsal's engine jobs run besides: its stand-in engine, loaded by name
# (``sdbench.rehearsal.module``; a test keeps this list complete).
REHEARSAL_ENTRIES: tuple[str, ...] = ("sdbench.rehearsal.llm", "sdbench.rehearsal.serve", "sdbench.rehearsal.totals")
# The command that measures again the cells of an older scope: their checkpoint keys hold the old
# digest, so forcing the engine jobs re-uses every current cell and measures only those.
REMEASURE_COMMAND = "snakemake --forcerun run_engine trace_group breakdown_group serve_group"


def entries(rehearsal: bool = False, server: bool = False) -> tuple[str, ...]:
    """The scope's entry modules for an engine job (a rehearsal's, a server group's)."""
    return ENTRIES + (SERVER_ENTRIES if server else ()) + (REHEARSAL_ENTRIES if rehearsal else ())


def measurement_modules(rehearsal: bool = False, server: bool = False) -> list[str]:
    """Every module in the scope, sorted."""
    return module_closure(*entries(rehearsal, server), outside=OUTSIDE)


def measurement_digest(rehearsal: bool = False, server: bool = False) -> str:
    """The digest engine jobs and checkpoints are keyed on (:func:`sdbench.codedigest.code_digest`
    of :func:`measurement_modules`: syntax trees, so comments and docstrings do not count)."""
    return code_digest(*entries(rehearsal, server), outside=OUTSIDE)


def stale_cells(recorded: Iterable[tuple[str, str]], current: str) -> list[str]:
    """Names of the cells (``(name, measurement_digest)`` pairs) measured under another scope
    than ``current``; a cell that recorded none (older than the column) counts as stale."""
    return sorted(name for name, digest in recorded if digest != current)
