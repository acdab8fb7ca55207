"""The package's import graph (every module of every subpackage) has no cycles, counting imports
inside functions too; the stage subpackages' ``__init__`` files import nothing; every name a
module reads is bound (an import moved or dropped cannot leave a function that fails only when run)."""

from __future__ import annotations

import ast
import builtins
import symtable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "sdbench"
STAGES = ("analysis", "bench", "datasets", "engine", "models", "simulator", "traces")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """sdbench module -> the sdbench modules it imports anywhere in its body."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sdbench"):
                # `from sdbench import x` imports the module sdbench.x when there is one
                subs = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
                deps |= subs or {node.module}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("sdbench")}
        graph[name] = {d for d in deps if d in modules and d != name and d != "sdbench"}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (as a path of module names), or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return stack[stack.index(dep) :] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        state[node] = 2
        stack.pop()
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_find_cycle_sees_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert "sdbench.config" in graph and "sdbench.errors" in graph["sdbench.config"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_graph_walks_the_subpackages() -> None:
    graph = import_graph()
    for stage in STAGES:
        modules = {m for m in graph if m.startswith(f"sdbench.{stage}.")}
        assert f"sdbench.{stage}.cli" in modules, stage
        assert len(modules) >= 2, (stage, modules)
    assert "sdbench.engine.cli" in graph["sdbench.cli"]
    assert "sdbench.simulator.core" in graph["sdbench.simulator.commands"]


def test_subpackage_inits_import_nothing() -> None:
    for stage in STAGES:
        tree = ast.parse((PACKAGE / stage / "__init__.py").read_text(encoding="utf-8"))
        assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))], stage


MODULE_ATTRIBUTES = {"__file__", "__name__", "__doc__", "__spec__", "__path__", "__package__", "__loader__"}


def unbound_names(source: str, filename: str) -> list[tuple[str, str]]:
    """(scope, name) of every name read at module level, or as a global inside a function or class,
    that the module neither assigns nor imports at its top and that is no builtin."""
    top = symtable.symtable(source, filename, "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    known = bound | set(dir(builtins)) | MODULE_ATTRIBUTES
    found: set[tuple[str, str]] = set()

    def walk(table: symtable.SymbolTable) -> None:
        for sym in table.get_symbols():
            read_globally = table.get_type() == "module" or sym.is_global()
            if sym.is_referenced() and read_globally and sym.get_name() not in known:
                found.add((table.get_name(), sym.get_name()))
        for child in table.get_children():
            walk(child)

    walk(top)
    return sorted(found)


def test_unbound_names_finds_a_name_no_import_binds() -> None:
    source = "import os\nfrom x import y\n\n\ndef f(a):\n    import json\n    return a, os, y, json, len, z\n"
    assert unbound_names(source, "m.py") == [("f", "z")]
    assert unbound_names("print(q)\nclass C:\n    w = v\n", "m.py") == [("C", "v"), ("top", "q")]


def test_every_name_a_module_reads_is_bound() -> None:
    root = PACKAGE.parents[1]
    files = [p for folder in ("src", "scripts", "tests") for p in sorted((root / folder).rglob("*.py"))]
    assert len(files) > 300
    unbound = {str(p.relative_to(root)): u for p in files if (u := unbound_names(p.read_text(encoding="utf-8"), str(p)))}
    assert unbound == {}
