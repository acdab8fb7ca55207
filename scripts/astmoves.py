"""Show that a split moved code unchanged: every top-level definition (function, class,
assignment) of the old files at a git revision has an identical AST dump in the new files.

    python scripts/astmoves.py REV OLD_PATH [OLD_PATH ...] -- NEW_PATH [NEW_PATH ...]

Prints one Markdown table row per definition (name, old file, new file, identical / CHANGED /
MISSING) and a totals line; exits 1 when any definition changed or went missing. Imports and
the module docstring are not compared (a split rewrites both). Stdlib only.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path


def definitions(source: str) -> dict[str, str]:
    """Top-level name -> ``ast.dump`` of its definition (functions, classes, assignments)."""
    out: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = ast.dump(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    out[t.id] = ast.dump(node)
    return out


def main(argv: list[str]) -> int:
    if "--" not in argv or len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    rev, rest = argv[0], argv[1:]
    cut = rest.index("--")
    old_paths, new_paths = rest[:cut], rest[cut + 1 :]
    old: dict[str, tuple[str, str]] = {}
    for p in old_paths:
        text = subprocess.run(["git", "show", f"{rev}:{p}"], capture_output=True, text=True, check=True).stdout
        old.update({name: (p, dump) for name, dump in definitions(text).items()})
    new: dict[str, tuple[str, str]] = {}
    for p in new_paths:
        new.update({name: (p, dump) for name, dump in definitions(Path(p).read_text(encoding="utf-8")).items()})
    counts = {"identical": 0, "CHANGED": 0, "MISSING": 0}
    print("| definition | from | to | AST |\n|---|---|---|---|")
    for name, (path, dump) in old.items():
        where, now = new.get(name, ("-", None))
        verdict = "MISSING" if now is None else "identical" if now == dump else "CHANGED"
        counts[verdict] += 1
        print(f"| `{name}` | {path} | {where} | {verdict} |")
    print(f"\n{len(old)} definitions: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return 1 if counts["CHANGED"] or counts["MISSING"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
