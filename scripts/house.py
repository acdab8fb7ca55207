"""The house in numbers (issue #51): rooms, floors, imports that run back up, the largest modules
and the engine job's import closure of a checkout of ``src/sdbench``, as Markdown.

    python scripts/house.py [CHECKOUT]      # default: this checkout

Definitions (``import`` means an import of an ``sdbench`` module, resolved as
``tests/package/test_imports.py`` resolves it: ``from sdbench import x`` imports ``sdbench.x``):

* **room**: the package a module sits in (``sdbench.engine.measure``, ``sdbench.engine`` for the
  engine's job drivers, ``sdbench`` itself for its top-level modules); its files and lines (``wc -l``).
* **floor** of a module: 1 + the highest floor of the modules it imports, anywhere in its body (at
  module level or inside a function: the graph test_imports keeps free of cycles); a module that
  imports none is on floor 1 (the modules of an import cycle share one floor; the cycle is
  named). **Floors**: the highest floor, with one longest chain. This
  reproduces the issue's 15 floors at 75f3cb5. The same over module-level imports only (what runs
  at import time) is given beside it.
* **import that runs back up**: an import inside a function (deferred to call time) of a module on
  a higher module-level floor than the importer's: the import a module could not make at its top
  without going up. (The issue's "17 upward imports" at 75f3cb5 is reproduced by no definition
  tried; see docs/results/2026-11-29-house.md.) **Rooms that import each other**: pairs of rooms
  with imports both ways, and the imports in the direction with fewer.
* **the engine job's closure**: the checkout's own :func:`sdbench.engine.scope.measurement_modules`
  when it has one (the measurement scope), and :func:`sdbench.codedigest.module_closure` of
  ``sdbench.engine.cli`` and ``sdbench.engine.commands`` (the ``run_engine`` rule's code, which
  gives the issue's 53 modules at 75f3cb5), both run by the checkout's own code.

Stdlib only; the closures run in a child Python with ``PYTHONPATH=<CHECKOUT>/src``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

LIMIT = 800  # issue #51: no module over this many lines
TOP = "sdbench"


def modules(src: Path) -> dict[str, Path]:
    """Module name -> file, for every ``*.py`` under ``src/sdbench``."""
    found = {}
    for path in sorted((src / TOP).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if "__pycache__" not in parts:
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The ``sdbench`` modules one import statement imports (the package root left out)."""
    if isinstance(node, ast.Import):
        out = {a.name for a in node.names}
    else:
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            module = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        out = ({f"{module}.{a.name}" for a in node.names} & known) or {module}
    return {t for t in out if t in known and t not in (name, TOP)}


def _module_level(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Import statements that run when the module is imported (``if TYPE_CHECKING`` left out)."""
    out: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            out += _module_level(node.body) + _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            out += _module_level(node.body) + _module_level(node.orelse) + _module_level(node.finalbody)
            for handler in node.handlers:
                out += _module_level(handler.body)
    return out


def import_graphs(mods: dict[str, Path]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(every import, module-level imports): module -> the modules it imports."""
    known = set(mods)
    every: dict[str, set[str]] = {}
    top: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        is_package = path.name == "__init__.py"
        at_top = {id(n) for n in _module_level(tree.body)}
        every[name], top[name] = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets = _targets(node, name, is_package, known)
                every[name] |= targets
                if id(node) in at_top:
                    top[name] |= targets
    return every, top


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: its strongly connected components of more than one module
    (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, deps = work[-1]
            dep = next(deps, None)
            if dep is not None:
                if dep not in index:
                    index[dep] = low[dep] = len(index)
                    stack.append(dep)
                    on_stack.add(dep)
                    work.append((dep, iter(sorted(graph[dep]))))
                elif dep in on_stack:
                    low[node] = min(low[node], index[dep])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Module -> its floor in ``graph``: 1 + the highest floor it imports. The modules of an import
    cycle (:func:`cycles`) share one floor, as if they were one module."""
    home = {m: m for m in graph}
    for component in cycles(graph):
        for m in component:
            home[m] = component[0]
    merged: dict[str, set[str]] = {}
    for m, deps in graph.items():
        merged.setdefault(home[m], set()).update(home[d] for d in deps if home[d] != home[m])
    floor: dict[str, int] = {}
    for name in sorted(merged):  # iterative depth-first: the graph may be deep
        todo = [name]
        while todo:
            top = todo[-1]
            if top in floor:
                todo.pop()
                continue
            missing = [d for d in sorted(merged[top]) if d not in floor]
            if missing:
                todo += missing
                continue
            floor[top] = 1 + max((floor[d] for d in merged[top]), default=0)
            todo.pop()
    return {m: floor[home[m]] for m in graph}


def longest_chain(graph: dict[str, set[str]], floor: dict[str, int]) -> list[str]:
    """One chain of imports from the highest floor down to floor 1 (a step inside an import cycle,
    on one floor, is not taken)."""
    name = max(sorted(graph), key=lambda m: floor[m])
    chain = [name]
    while below := [d for d in sorted(graph[name]) if floor[d] < floor[name]]:
        name = max(below, key=lambda m: floor[m])
        chain.append(name)
    return chain


def room(name: str, mods: dict[str, Path]) -> str:
    """The package a module sits in (a package's ``__init__`` is its own room): a room inside a
    room (``sdbench.engine.measure``) counts apart from its parent."""
    if mods[name].name == "__init__.py":
        return name
    return name.rpartition(".")[0]


def back_up(every: dict[str, set[str]], top: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) of every import inside a function of a module on a higher
    module-level floor than the importer's."""
    floor_top = floors(top)
    return [(m, d) for m in sorted(every) for d in sorted(every[m] - top[m]) if floor_top[d] > floor_top[m]]


def room_imports(graph: dict[str, set[str]], mods: dict[str, Path]) -> dict[tuple[str, str], int]:
    """(importing room, imported room) -> how many module imports run between them."""
    pairs: dict[tuple[str, str], int] = {}
    for m in sorted(graph):
        for d in graph[m]:
            if room(m, mods) != room(d, mods):
                key = (room(m, mods), room(d, mods))
                pairs[key] = pairs.get(key, 0) + 1
    return pairs


def lines(path: Path) -> int:
    return path.read_bytes().count(b"\n")


_CLOSURES = """
import json, importlib.util
from sdbench.codedigest import module_closure
out = {"run_engine": module_closure("sdbench.engine.cli", "sdbench.engine.commands")}
if importlib.util.find_spec("sdbench.engine.scope") is not None:
    from sdbench.engine.scope import measurement_modules
    out["scope"] = measurement_modules()
print(json.dumps(out))
"""


def closures(src: Path) -> dict[str, list[str]]:
    """The engine job's closures, computed by the checkout's own code (see the module docstring)."""
    out = subprocess.run([sys.executable, "-c", _CLOSURES], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}, cwd=src.parent)  # fmt: skip
    return json.loads(out.stdout)


def report(checkout: Path) -> str:
    src = checkout / "src"
    mods = modules(src)
    every, top = import_graphs(mods)
    floor, floor_top = floors(every), floors(top)
    size = {m: lines(p) for m, p in mods.items()}
    commit = subprocess.run(["git", "-C", str(checkout), "log", "-1", "--format=%h %cs"], capture_output=True,
                            text=True).stdout.strip() or "not a git checkout"  # fmt: skip
    out = [f"## The house at {commit}", ""]
    rooms: dict[str, list[str]] = {}
    for m in mods:
        rooms.setdefault(room(m, mods), []).append(m)
    out += ["| room | files | lines | highest floor |", "|---|---:|---:|---:|"]
    for r in sorted(rooms):
        its = rooms[r]
        out.append(f"| `{r}` | {len(its)} | {sum(size[m] for m in its):,} | {max(floor[m] for m in its)} |")
    out.append(f"| **all** | {len(mods)} | {sum(size.values()):,} | {max(floor.values())} |")
    tests = sorted((checkout / "tests").rglob("test_*.py"))
    out += ["", f"Tests: {len(tests)} `test_*.py` files, {sum(map(lines, tests)):,} lines."]
    for label, graph in (("every import", every), ("module-level imports", top)):
        for component in cycles(graph):
            out += ["", f"**Import cycle** ({label}; its modules share a floor): " + ", ".join(f"`{m}`" for m in component)]
    chain = longest_chain(every, floor)
    out += ["", f"**Floors: {max(floor.values())}** (every import); {max(floor_top.values())} over module-level "
            "imports only. One longest chain:", "", " -> ".join(f"`{m}`" for m in chain)]  # fmt: skip
    deferred = back_up(every, top)
    out += ["", f"**Imports that run back up: {len(deferred)}** (imports inside a function of a module on a "
            f"higher module-level floor), from {len({m for m, _ in deferred})} modules."]  # fmt: skip
    pairs = room_imports(every, mods)
    both = sorted((a, b) for a, b in pairs if (b, a) in pairs and a < b)
    minority = sum(min(pairs[(a, b)], pairs[(b, a)]) for a, b in both)
    out += ["", f"**Rooms that import each other: {len(both)} pairs**, {minority} imports in the direction with "
            "fewer:", ""]  # fmt: skip
    out += [f"- `{a}` -> `{b}` {pairs[(a, b)]}, `{b}` -> `{a}` {pairs[(b, a)]}" for a, b in both] or ["- none"]
    big = sorted(mods, key=lambda m: (-size[m], m))[:12]
    over = [m for m in mods if size[m] > LIMIT]
    out += ["", f"**Largest modules** ({len(over)} over {LIMIT} lines):", "", "| module | lines | floor |",
            "|---|---:|---:|"]  # fmt: skip
    out += [f"| `{m}` | {size[m]:,} | {floor[m]} |" for m in big]
    found = closures(src)
    for key, title in (("run_engine", "the run_engine rule's code (`module_closure(\"sdbench.engine.cli\", "
                                      "\"sdbench.engine.commands\")`)"),
                       ("scope", "the measurement scope (`sdbench.engine.scope.measurement_modules()`)")):  # fmt: skip
        if key not in found:
            out += ["", f"The engine job's closure, {title}: none at this commit."]
            continue
        names = found[key]
        by_room: dict[str, list[str]] = {}
        for m in names:
            by_room.setdefault(room(m, mods) if m in mods else TOP, []).append(m)
        out += ["", f"**The engine job's closure, {title}: {len(names)} modules**", ""]
        out += [f"- `{r}` ({len(ms)}): " + ", ".join("`__init__`" if m == r else m.removeprefix(r + ".") for m in ms)
                for r, ms in sorted(by_room.items())]
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    checkout = Path(argv[0]) if argv else Path(__file__).resolve().parents[1]
    if not (checkout / "src" / TOP).is_dir():
        print(f"house.py: {checkout} has no src/{TOP}", file=sys.stderr)
        return 2
    sys.stdout.write(report(checkout.resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
