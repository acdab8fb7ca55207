"""The CLI's parser is light: argparse and the standard library only, every command's
implementation imported when the command runs; its plain constants match the implementation's;
the benchmarks report whole-process timings."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdbench import cli
from sdbench.lazy import LazyCommand

SDBENCH = Path(sys.executable).with_name("sdbench")
# Third-party packages (and the network modules) no parser may import.
HEAVY = (
    "numpy",
    "pandas",
    "pyarrow",
    "matplotlib",
    "yaml",
    "jsonschema",
    "sacrebleu",
    "rocrate",
    "torch",
    "transformers",
    "tokenizers",
    "vllm",
    "http.client",
    "urllib.request",
)


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every (sub)command path of ``parser`` whose parser sets a ``func``."""
    if "func" in parser._defaults:
        yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def _parser_of(path: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = cli.build_parser()
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def test_building_the_parser_imports_no_implementation() -> None:
    code = "import json, sys; from sdbench import cli; cli.build_parser(); print(json.dumps(sorted(sys.modules)))"
    modules = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    heavy = [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert heavy == [], heavy


def test_every_command_is_lazy_and_resolves() -> None:
    paths = list(_commands(cli.build_parser()))
    assert len(paths) > len(cli.COMMANDS)  # sub-actions (trace ngram, bench simulator, ...) included
    for path in paths:
        func = _parser_of(path)._defaults["func"]
        assert isinstance(func, LazyCommand), path
        assert func.name.startswith("_cmd_"), (path, func)  # one naming convention for command functions
        assert callable(func.resolve()), (path, func)


def test_a_shared_flag_reads_the_same_in_every_command() -> None:
    # sdbench.cliargs defines these once; a command meaning something else keeps its own (listed here).
    own = {("aggregate", "--cells")}  # aggregate writes the cells table the others read
    seen: dict[str, set[tuple]] = {}
    for path in _commands(cli.build_parser()):
        for action in _parser_of(path)._actions:
            for flag in set(action.option_strings) & {"--cells", "--model-dir", "--drafter-dir", "--quiet-guard"}:
                if (" ".join(path), flag) not in own:
                    seen.setdefault(flag, set()).add((action.required, action.default, action.nargs, action.help))
    assert set(seen) == {"--cells", "--model-dir", "--drafter-dir", "--quiet-guard"}
    assert all(len(forms) == 1 for forms in seen.values()), seen


def test_every_help_renders() -> None:
    for path in _commands(cli.build_parser()):
        assert _parser_of(path).format_help().startswith("usage: sdbench"), path
    help_text = _parser_of(("containers", "check")).format_help()
    assert help_text  # a literal % in a help string once broke `sdbench containers --help`


def test_help_lists_the_users_tools_first_then_the_pipelines_steps() -> None:
    proc = subprocess.run([str(SDBENCH), "--help"], capture_output=True, text=True, timeout=60, check=True)
    tools, _, steps = proc.stdout.partition("\npipeline steps")
    tools = tools.split("\ntools:", 1)[1]
    names = lambda text: [line.split()[0] for line in text.splitlines() if line.startswith("    ") and not line.startswith("     ")]  # noqa: E731
    steps_listed = [line.split()[0] for line in steps.splitlines()[1:] if line.startswith("  ") and not line.startswith("   ")]
    assert names(tools) == list(cli.TOOLS)
    assert steps_listed == [n for n in cli.COMMANDS if n not in cli.TOOLS]
    assert set(cli.TOOLS) <= set(cli.COMMANDS)


def test_cli_constants_match_the_implementation() -> None:
    from sdbench.analysis import bleu, memory
    from sdbench.analysis import cli as analysis_cli
    from sdbench.bench import cli as bench_cli
    from sdbench.bench import parity
    from sdbench.engine import cli as engine_cli
    from sdbench.engine.site import quietguard
    from sdbench.models import spec
    from sdbench.simulator import cli as simulator_cli
    from sdbench.simulator import compat, core, costmodel, policytypes, reports

    assert simulator_cli.PROPOSERS == policytypes.PROPOSERS
    assert simulator_cli.DEFAULT_BATCH_SIZES == core.DEFAULT_BATCH_SIZES
    assert simulator_cli.PAPER_POLICIES == core.PAPER_POLICIES
    assert simulator_cli.MODES == tuple(core.MODES)
    assert simulator_cli.BATCHING == core.BATCHING
    assert (simulator_cli.COMPAT_NUM_REQUESTS, simulator_cli.COMPAT_SEED) == (
        compat.COMPAT_NUM_REQUESTS,
        compat.COMPAT_SEED,
    )
    assert simulator_cli.ADAPTIVE_SPECS == reports.ADAPTIVE_SPECS
    assert simulator_cli.STEP_COLUMNS == costmodel.STEP_COLUMNS
    assert analysis_cli.METHODS == memory.METHODS
    assert analysis_cli.DTYPES == tuple(sorted(spec.DTYPE_BYTES))
    assert (analysis_cli.DEFAULT_ORDER, analysis_cli.MAX_ORDER, analysis_cli.BASES) == (
        bleu.DEFAULT_ORDER,
        bleu.MAX_ORDER,
        bleu.BASES,
    )
    assert engine_cli.QUIET_GUARD_MODES == quietguard.MODES
    assert bench_cli.PARITY_REPEATS == parity.DEFAULT_REPEATS


def _tiny_trace(path: Path) -> Path:
    """Four requests in the published-trace form (``acc_len`` = accepted drafts + 1)."""
    rows = []
    for i in range(4):
        n = 40 + i
        rows.append(
            {
                "id": f"r{i}",
                "prompt_token_ids": list(range(5 + i)) * 3,
                "generated_token_ids": [(7 * j + i) % 11 for j in range(n)],
                "acc_ngram": {"acc_len": [1 + (j + i) % 3 for j in range(n)]},
                "acc_eagle": {"acc_len": [1 + (j * (i + 1)) % 4 for j in range(n)]},
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_bench_simulator_times_whole_processes_too(tmp_path: Path) -> None:
    trace = _tiny_trace(tmp_path / "combined_gsm8k.jsonl")
    proc = subprocess.run(
        [str(SDBENCH), "bench", "simulator", "--traces", str(trace), "--batch-sizes", "1", "8", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("sdbench compat: 18 configurations"), lines
    assert lines[1].startswith("sdbench compat as whole processes (one `sdbench simulate --mode compat` per proposer")
    assert "results identical" in lines[1], lines[1]


def test_bench_tracer_times_whole_processes_too(tmp_path: Path) -> None:
    trace = _tiny_trace(tmp_path / "combined_tiny.jsonl")
    cmd = [str(SDBENCH), "bench", "tracer", "--traces", str(trace), "--reference-budget", "0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "fast tracer: 4 requests, 166 positions" in out
    assert "fast tracer as whole processes (`sdbench trace ngram` per file" in out
    assert "speed-up fast vs reference as whole processes:" in out


@pytest.mark.parametrize("argv", [["--help"], ["simulate", "--help"], ["bench", "tracer", "--help"]])
def test_help_exits_zero(argv: list[str]) -> None:
    proc = subprocess.run([str(SDBENCH), *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: sdbench"), proc.stderr
