"""Digests of the package code behind a pipeline step, for Snakemake's rerun decisions.

Snakemake's ``code`` trigger sees only a rule's ``shell:`` text, not the package
function it calls. Each rule therefore carries ``params: code=<digest>`` of the
module implementing its step plus every ``sdbench`` module that module imports
(transitively), so an edit of the BLEU code reruns the BLEU steps and nothing else.

The digest covers the parsed syntax tree without docstrings: comments, formatting
and documentation do not rerun a measurement; a changed statement does. Modules
are located with :func:`importlib.util.find_spec` and parsed, never imported, so
the DAG stays fast and a workflow host without vLLM can compute the digest of the
engine runner. A package stands for all its modules. A step's command is parsed in its
stage's light ``cli`` module (defaults live there) and implemented in another module:
name both, or the package.

:func:`package_digest` is another digest: of the source bytes of every module of the *imported*
package, the same under any Python version. An image records it when it is built
(``org.sdbench.code.digest``, :mod:`sdbench.containers`), every engine job records the one of the
code it ran (``code_digest`` in its summary, :mod:`sdbench.engine.site.hardware`), and a run refuses an
image whose digest is not the checkout's. ``python -m sdbench.codedigest`` prints it.

Parsing every module costs about 1.8 CPU-seconds, and every SLURM job loads the workflow twice
(its batch step and its ``srun`` step): :func:`use_cache` keeps the digests in a file named by the
package's bytes and the Python version, so only the first process after an edit parses.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

PACKAGE = "sdbench"

# Where :func:`code_digest` keeps its results (None: no cache); see :func:`use_cache`.
_cache_dir: Path | None = None
# (its file, its entries), read once per process: the package does not change under a workflow.
_cache: tuple[Path, dict[str, str]] | None = None


def _module_path(name: str) -> Path | None:
    """Source file of ``name`` (``None`` for a module that does not exist)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                if isinstance(body[0].value.value, str):
                    node.body = body[1:] or [ast.Pass()]
    return tree


def _package_imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Names of the ``sdbench`` modules that ``module`` imports (absolute or relative)."""
    found: set[str] = set()
    base = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base[: len(base) - node.level + 1]
                target = ".".join(parent + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PACKAGE:
                continue
            found.add(target)
            # ``from sdbench import io`` names a module, not an attribute.
            found.update(f"{target}.{a.name}" for a in node.names)
    return found


@functools.cache
def _parsed(name: str) -> tuple[str, frozenset[str]] | None:
    """(AST dump without docstrings, imported package modules) of one module."""
    path = _module_path(name)
    if path is None:
        return None
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    imports = _package_imports(tree, name, path.name == "__init__.py")
    return ast.dump(_strip_docstrings(tree), include_attributes=False), frozenset(imports)


def _package_modules(name: str) -> list[str] | None:
    """Every module of package ``name`` (itself included), or None when ``name`` is no package."""
    path = _module_path(name)
    if path is None or path.name != "__init__.py":
        return None
    found = []
    for p in path.parent.rglob("*.py"):
        parts = p.relative_to(path.parent).with_suffix("").parts
        if "__pycache__" not in parts:
            found.append(".".join((name, *(parts[:-1] if parts[-1] == "__init__" else parts))))
    return sorted(found)


def step_modules(*names: str) -> list[str]:
    """``names`` with packages expanded to their modules."""
    out: list[str] = []
    for name in names:
        out += _package_modules(name) or [name]
    return out


def module_closure(*modules: str, outside: Iterable[str] = ()) -> list[str]:
    """The given modules (see :func:`step_modules`) and every ``sdbench`` module they import,
    transitively, sorted; a module in ``outside`` is left out with everything only it imports."""
    modules = tuple(step_modules(*modules))
    stop = set(outside)
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        name = todo.pop()
        if name in seen or name in stop:
            continue
        parsed = _parsed(name)
        if parsed is None:
            if name in modules:
                raise ValueError(f"code digest: no source for module {name!r}")
            continue  # an attribute imported with ``from sdbench.x import y``
        seen.add(name)
        todo.extend(parsed[1] - seen)
        # Importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py`` first.
        todo.extend(name.rsplit(".", n)[0] for n in range(1, name.count(".") + 1))
    return sorted(seen)


def use_cache(directory: str | Path | None) -> None:
    """Keep :func:`code_digest`'s results in ``directory`` (None: no cache), one JSON file per
    state of the package's source bytes and Python version: an edit of any module, or another
    Python (whose syntax trees differ), reads another file."""
    global _cache_dir, _cache
    _cache_dir = Path(directory).resolve() if directory is not None else None
    _cache = None


def _loaded_cache() -> tuple[Path, dict[str, str]] | None:
    global _cache
    root = _module_path(PACKAGE)
    if _cache_dir is None or root is None:
        return None
    if _cache is None:
        version = ".".join(map(str, sys.version_info[:3]))
        path = _cache_dir / f"{package_digest(root.parent)}-py{version}.json"
        _cache = (path, _read_cache(path))
    return _cache


def _read_cache(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: computed again and rewritten
    return data if isinstance(data, dict) else {}


def _write_cache(path: Path, key: str, digest: str) -> None:
    """Add one entry, merged with what other processes wrote meanwhile; written to a temporary
    file and renamed, so a reader never sees half a file (an entry lost to a race is recomputed)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {**_read_cache(path), key: digest}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only or full directory: the digest is still right, only not kept


def code_digest(*modules: str, outside: Iterable[str] = ()) -> str:
    """Short sha256 over the syntax trees of ``modules`` and their package imports (but
    ``outside``, see :func:`module_closure`)."""
    cache = _loaded_cache()
    outside = tuple(sorted(outside))
    key = " ".join(modules) + "".join(f" !{name}" for name in outside)
    if cache is not None and key in cache[1]:
        return cache[1][key]
    digest = _compute_digest(*modules, outside=outside)
    if cache is not None:
        cache[1][key] = digest
        _write_cache(cache[0], key, digest)
    return digest


def _compute_digest(*modules: str, outside: Iterable[str] = ()) -> str:
    h = hashlib.sha256()
    for name in module_closure(*modules, outside=outside):
        parsed = _parsed(name)
        assert parsed is not None
        h.update(name.encode() + b"\0" + parsed[0].encode() + b"\0")
    return h.hexdigest()[:16]


def package_digest(root: str | Path | None = None) -> str:
    """Short sha256 over the bytes of every ``*.py`` file of the package (``root``, default the
    directory of the imported ``sdbench``), by relative path.

    Bytes, not syntax trees: :func:`code_digest` dumps trees whose layout changes between Python
    versions, and an image's Python need not be the checkout's; any edit counts here.
    """
    if root is None:
        import sdbench

        root = Path(sdbench.__file__).parent
    root = Path(root)
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if "__pycache__" in rel.split("/"):
            continue
        h.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


if __name__ == "__main__":  # an image's build records the digest of the package it installed
    import sys

    # ``--label NAME``: as a line of Apptainer's label file ("NAME DIGEST").
    print(*sys.argv[2:3], package_digest()) if sys.argv[1:2] == ["--label"] else print(package_digest())
