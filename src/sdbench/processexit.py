"""The end of an engine command's process, without the interpreter's teardown.

A process that held a vLLM engine spends seconds after its last table is written: vLLM's own
shutdown (its ``weakref.finalize`` callbacks, at exit), then the interpreter freeing torch, vLLM
and every module one object at a time. On the CPU default's tiny models a paired start (two
engines) spent 3.7 s from its last log line to its end, 1.8 s with :func:`end` (of 14.8 s and 12.4 s
in all), paid by every engine start of every job.

:func:`end` runs the ``atexit`` callbacks (vLLM's engine shutdown, logging's flush, the step
timings' last records), flushes stdout and stderr, and ends the process with ``os._exit``, but only
when nothing of the process is left that the teardown would wait for: no child process (a vLLM
worker, a server) and no other thread that is not a daemon. Otherwise it exits as Python does.
Nothing here runs before the command's outputs are written, so no measured number can change
(``sdbench.cli`` is outside the engine's measurement scope, sdbench.engine.scope).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from pathlib import Path
from typing import NoReturn


def live_children(proc: Path = Path("/proc/self/task")) -> list[int] | None:
    """The process's children (of any of its threads), or None where /proc cannot say."""
    try:
        return [int(pid) for task in proc.iterdir() for pid in (task / "children").read_text().split()]
    except OSError:
        return None


def other_threads() -> list[str]:
    """Threads the interpreter's exit would join (alive, not daemons, not this one)."""
    me = threading.current_thread()
    return [t.name for t in threading.enumerate() if t is not me and t.is_alive() and not t.daemon]


def end(code: int) -> NoReturn:
    """Exit with ``code``: at once after the ``atexit`` callbacks where nothing is left to wait for."""
    atexit._run_exitfuncs()  # run once: they are cleared, and Python's own exit does not run them again
    if live_children() == [] and not other_threads():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass  # a closed pipe: what it would have carried is gone either way
        os._exit(code)
    sys.exit(code)
