"""sdbench.processexit and ``sdbench.cli.entry``: an engine command's process ends without the
interpreter's teardown, once its ``atexit`` callbacks ran, and only when nothing is left to wait for."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from sdbench.cli import entry
from sdbench.processexit import live_children, other_threads

# A script's process: an ``atexit`` callback and an object whose ``__del__`` runs only in the
# interpreter's own teardown (module globals freed), each leaving a mark.
SCRIPT = """\
import atexit, sys
from pathlib import Path
marks = Path(sys.argv[1])
atexit.register(lambda: (marks / "atexit").write_text("ran"))
class Teardown:
    def __del__(self):
        (marks / "teardown").write_text("ran")
kept = Teardown()
{setup}
print("written", end="")
{ending}
"""


def run(tmp_path: Path, ending: str, setup: str = "") -> tuple[subprocess.CompletedProcess[str], set[str]]:
    (tmp_path / "script.py").write_text(SCRIPT.format(setup=setup, ending=ending))
    done = subprocess.run([sys.executable, str(tmp_path / "script.py"), str(tmp_path)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    return done, {p.name for p in tmp_path.iterdir() if p.name in ("atexit", "teardown")}


def test_end_runs_the_atexit_callbacks_flushes_and_skips_the_teardown(tmp_path: Path) -> None:
    done, marks = run(tmp_path, "from sdbench.processexit import end; end(3)")
    assert (done.returncode, done.stdout) == (3, "written")
    assert marks == {"atexit"}


def test_a_plain_exit_tears_down(tmp_path: Path) -> None:
    """The mark the fast end skips is left by Python's own exit (the test above can fail)."""
    done, marks = run(tmp_path, "sys.exit(3)")
    assert (done.returncode, done.stdout) == (3, "written")
    assert marks == {"atexit", "teardown"}


def test_a_closed_stdout_does_not_stop_the_end(tmp_path: Path) -> None:
    done, marks = run(tmp_path, "import os; sys.stdout = open(os.devnull, 'w'); sys.stdout.close()\n"
                                "from sdbench.processexit import end; end(3)")  # fmt: skip
    assert done.returncode == 3 and marks == {"atexit"}, done.stderr


def test_a_live_child_process_gets_the_plain_exit(tmp_path: Path) -> None:
    setup = "import subprocess; child = subprocess.Popen(['sleep', '30'])"
    done, marks = run(tmp_path, "from sdbench.processexit import end\ntry:\n    end(4)\nfinally:\n    child.kill()",
                      setup)  # fmt: skip
    assert done.returncode == 4 and marks == {"atexit", "teardown"}


def test_a_thread_the_exit_would_join_gets_the_plain_exit(tmp_path: Path) -> None:
    setup = "import threading, time; threading.Thread(target=time.sleep, args=(0.5,)).start()"
    done, marks = run(tmp_path, "from sdbench.processexit import end; end(5)", setup)
    assert done.returncode == 5 and marks == {"atexit", "teardown"}


def test_only_an_engine_command_ends_at_once(tmp_path: Path) -> None:
    """``sdbench.cli.entry``: ``run-group`` (an engine command, here with a missing spec: exit 2)
    ends fast; ``check-config`` (not one) exits as Python does."""
    engine, marks = run(tmp_path, "sys.argv = ['sdbench', 'run-group', '--spec', '@missing.json', '--model-dir', 'm',"
                                  " '--output-dir', 'o']\nfrom sdbench.cli import entry; entry()")  # fmt: skip
    assert engine.returncode == 2 and marks == {"atexit"}, engine.stderr
    (tmp_path / "atexit").unlink()
    debug, marks = run(tmp_path, "sys.argv = ['sdbench', '--debug', 'run-group', '--spec', '@missing.json',"
                                 " '--model-dir', 'm', '--output-dir', 'o']\nfrom sdbench.cli import entry; entry()")  # fmt: skip
    assert debug.returncode == 2 and marks == {"atexit"}, debug.stderr  # the command after a global option
    (tmp_path / "atexit").unlink()
    other, marks = run(tmp_path, "sys.argv = ['sdbench', 'check-config', 'missing.yaml']\n"
                                 "from sdbench.cli import entry; entry()")  # fmt: skip
    assert other.returncode == 2 and marks == {"atexit", "teardown"}, other.stderr


def test_the_console_script_is_the_entry_that_ends_engine_commands() -> None:
    import tomllib

    scripts = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["sdbench"] == f"{entry.__module__}:{entry.__name__}"


def test_live_children_reads_every_threads_children(tmp_path: Path) -> None:
    for task, children in (("100", "12 13\n"), ("101", ""), ("102", "40")):
        (tmp_path / task).mkdir()
        (tmp_path / task / "children").write_text(children)
    assert sorted(live_children(tmp_path)) == [12, 13, 40]
    assert live_children(tmp_path / "none") is None  # no /proc: cannot say


def test_other_threads_are_the_ones_the_exit_would_join() -> None:
    release = threading.Event()
    joined = threading.Thread(target=release.wait, name="joined")
    daemon = threading.Thread(target=release.wait, name="daemon", daemon=True)
    joined.start(), daemon.start()
    try:
        assert other_threads() == ["joined"]
    finally:
        release.set()
        joined.join(), daemon.join()
    assert other_threads() == []
