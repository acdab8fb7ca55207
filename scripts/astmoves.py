"""Show that a split moved code unchanged: every top-level definition (function, class,
assignment) of the old files at a git revision has an identical AST dump in the new files.

    python scripts/astmoves.py [--rename OLD=NEW ...] [--module OLD=NEW ...] REV OLD_PATH [OLD_PATH ...] -- NEW_PATH [NEW_PATH ...]

A new path may be ``REV:PATH`` (the file at a commit) to check a split already committed.

Methods count one by one (``Class.method``; one moved to another class, a mixin, is found by its
name when that name is unique). Prints one Markdown table row per definition (name, old file, new file, identical / CHANGED /
MISSING, or ``docstring`` when only docstrings differ) and a totals line; exits 1 when any
definition changed beyond its docstrings or went missing. Imports and
the module docstring are not compared (a split rewrites both). ``--rename _run=run_command``
reads the name ``_run`` as ``run_command`` on both sides (one helper imported under two aliases);
each one used is printed. ``--module sdbench.engine.trials=sdbench.engine.measure.trials`` reads
an import of the old module (``from``/``import``, inside a function too) as one of the new: a
module moved into a room. Stdlib only.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path


def definitions(source: str, renames: dict[str, str] | None = None, docstrings: bool = True,
                modules: dict[str, str] | None = None) -> dict[str, str]:
    """Top-level name -> ``ast.dump`` of its definition (functions, classes, assignments), with
    every name in ``renames`` read as its new name and every module in ``modules`` as its new
    module; without docstrings when ``docstrings`` is False."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and renames and node.id in renames:
            node.id = renames[node.id]
        elif isinstance(node, ast.ImportFrom) and modules:
            if node.module in modules:
                node.module = modules[node.module]
            moved = {modules.get(f"{node.module}.{a.name}", "").rpartition(".")[0] for a in node.names} - {""}
            if len(moved) == 1:  # from pkg import trials -> from pkg.measure import trials
                node.module = moved.pop()
        elif isinstance(node, ast.Import) and modules:
            for alias in node.names:
                alias.name = modules.get(alias.name, alias.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and modules:
            node.value = _moved_names(node.value, modules)  # a module named in a string
    out: dict[str, str] = {}
    for node in tree.body:
        if docstrings is False:
            for inner in ast.walk(node):
                body = getattr(inner, "body", None)
                if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body and \
                        isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                    inner.body = body[1:] or [ast.Pass()]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = ast.dump(node)
        if isinstance(node, ast.ClassDef):  # each method too, as Class.method (a class may be split)
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{node.name}.{item.name}"] = ast.dump(item)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    out[t.id] = ast.dump(node)
    return out


def _moved_names(text: str, modules: dict[str, str]) -> str:
    """``text`` with each whole dotted module name in ``modules`` replaced by its new name."""
    for old_name, new_name in modules.items():
        text = re.sub(rf"(?<![\w.]){re.escape(old_name)}(?![\w])", new_name, text)
    return text


def _read(path: str) -> str:
    """A file of the working tree, or ``REV:PATH`` of a commit."""
    if ":" in path:
        return subprocess.run(["git", "show", path], capture_output=True, text=True, check=True).stdout
    return Path(path).read_text(encoding="utf-8")


def main(argv: list[str]) -> int:
    renames: dict[str, str] = {}
    modules: dict[str, str] = {}
    while argv[:1] in (["--rename"], ["--module"]) and len(argv) > 1:
        old_name, _, new_name = argv[1].partition("=")
        (renames if argv[0] == "--rename" else modules)[old_name] = new_name
        argv = argv[2:]
    if "--" not in argv or len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    rev, rest = argv[0], argv[1:]
    cut = rest.index("--")
    old_paths, new_paths = rest[:cut], rest[cut + 1 :]
    old: dict[str, tuple[str, str, str]] = {}
    for p in old_paths:
        text = _read(f"{rev}:{p}")
        bare = definitions(text, renames, docstrings=False, modules=modules)
        for name, dump in definitions(text, renames, modules=modules).items():
            if name in old:
                print(f"note: {name} is defined in both {old[name][0]} and {p}; comparing the latter", file=sys.stderr)
            old[name] = (p, dump, bare[name])
    new: dict[str, tuple[str, str, str]] = {}
    for p in new_paths:
        text = _read(p)
        bare = definitions(text, renames, docstrings=False, modules=modules)
        new.update({name: (p, dump, bare[name]) for name, dump in definitions(text, renames, modules=modules).items()})
    counts = {"identical": 0, "docstring": 0, "CHANGED": 0, "MISSING": 0}
    print("| definition | from | to | AST |\n|---|---|---|---|")
    for name, (path, dump, bare_old) in old.items():
        where, now, bare_new = new.get(name, ("-", None, None))
        if now is None and "." in name:  # a method moved to another class (a mixin): by its name
            same = [k for k in new if "." in k and k.split(".", 1)[1] == name.split(".", 1)[1]]
            if len(same) == 1:
                where, now, bare_new = new[same[0]]
                where = f"{where} ({same[0].split('.')[0]})"
        verdict = ("MISSING" if now is None else "identical" if now == dump
                   else "docstring" if bare_new == bare_old else "CHANGED")
        counts[verdict] += 1
        print(f"| `{name}` | {path} | {where} | {verdict} |")
    for old_name, new_name in renames.items():
        print(f"\nread as renamed: `{old_name}` -> `{new_name}`")
    if modules:
        print(f"\nimports read with {len(modules)} module(s) moved (--module)")
    print(f"\n{len(old)} definitions: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return 1 if counts["CHANGED"] or counts["MISSING"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
