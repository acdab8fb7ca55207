"""Every place where sdbench relies on vLLM, declared next to the code that relies on it.

A *touchpoint* is one fact about a vLLM build that the engine code depends on: a hook target
and the parameters or result layout the hook reads, a keyword passed to ``vllm.LLM``, a
``speculative_config`` key, a metric name, an environment variable, the server module and its
flags, the plugin entry-point group, how ``collective_rpc`` carries a call. Each module that
relies on vLLM declares its touchpoints (``TOUCHPOINTS = declare(__name__, ...)``); the
conformance check (:mod:`sdbench.engine.release.conformance`, ``sdbench engines conformance``) evaluates
every one of them against the *source* of every engine build the config can name, without
importing it (no GPU, no matching torch needed).

A check reads a :class:`SourceTree` (the ``vllm/`` package of a wheel or checkout, parsed with
:mod:`ast`) and returns ``None`` when the build conforms, else why not. Hook targets are written
``"vllm.module.path:Class.attr"``. Where the build is only known at run time (which hooks a
runner has), the same predicate (:meth:`SourceTree.has` here, :func:`live_has` in an engine
process) picks the hooks, so what the check verified is what the engine installs.

This module is standard library only: engine processes import it through the plugins.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Modules that declare touchpoints (imported by registry()); a test keeps it complete.
DECLARING_MODULES: tuple[str, ...] = (
    "sdbench.engine.release.versions",
    "sdbench.engine.measure.counters",
    "sdbench.engine.measure.engine",
    "sdbench.engine.measure.trials",
    "sdbench.engine.tracegroup",
    "sdbench.engine.measure.sampling",
    "sdbench.engine.release.acceptancetrace",
    "sdbench.engine.measure.steptiming",
    "sdbench.engine.release.enginefixes",
    "sdbench.engine.release.workerprobe",
    "sdbench.engine.measure.forcing",
    "sdbench.engine.serving.server",
    "sdbench.engine.serving.loadgen",
    "sdbench.engine.measure.energy",
    "sdbench.engine.release.cpukernels",
    "sdbench.bench.paritytool",
    "sdbench.bench.paritysides",
    "sdbench.bench.serveparity",
)


class SourceTree:
    """The Python source of one vLLM build (a directory holding ``vllm/``), read without importing.

    ``label`` names the build in reports (``0.11.1``); ``version`` is the release whose quirks
    apply (:func:`sdbench.engine.release.versions.quirks_for`).
    """

    def __init__(self, root: str | Path, version: str, label: str | None = None) -> None:
        self.root = Path(root)
        self.version = version
        self.label = label or version
        if not (self.root / "vllm" / "__init__.py").is_file():
            raise FileNotFoundError(f"{self.root}: no vllm/__init__.py (expected an unpacked wheel or a checkout)")
        self._trees: dict[str, ast.Module | None] = {}

    # ------------------------------------------------------------------ modules
    def module_file(self, module: str) -> Path | None:
        """The file of ``module`` (``a.b`` -> ``a/b.py`` or ``a/b/__init__.py``), or ``None``."""
        base = self.root.joinpath(*module.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
        return None

    def text(self, module: str) -> str | None:
        """Source text of ``module`` or ``None``."""
        path = self.module_file(module)
        return path.read_text(encoding="utf-8") if path else None

    def tree(self, module: str) -> ast.Module | None:
        """Parsed ``module`` (cached) or ``None`` if it does not exist."""
        if module not in self._trees:
            text = self.text(module)
            self._trees[module] = ast.parse(text) if text is not None else None
        return self._trees[module]

    def modules_under(self, package: str) -> list[str]:
        """Every module below ``package`` (sorted)."""
        base = self.root.joinpath(*package.split("."))
        out = []
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(self.root).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out.append(".".join(parts))
        return out

    # ------------------------------------------------------------------ definitions
    def find(self, target: str) -> ast.AST | None:
        """The definition named by ``"module:Qual.name"`` (class, function, or assigned name).

        Follows re-exports (``from .x import Name``), vLLM's lazy ``MODULE_ATTRS`` table, and
        for class attributes the base classes the module imports.
        """
        module, _, qual = target.partition(":")
        if not qual:
            return self.tree(module)
        parts = qual.split(".")
        node = self._module_attr(module, parts[0], depth=0)
        for i, part in enumerate(parts[1:], 1):
            if not isinstance(node, ast.ClassDef):
                return None
            node = self._class_attr(node, self._owner_module(module, parts[:i]), part, depth=0)
        return node

    def has(self, target: str) -> bool:
        """Whether ``target`` is defined."""
        return self.find(target) is not None

    def _owner_module(self, module: str, parts: list[str]) -> str:
        # The module a (possibly re-exported) top-level name is defined in.
        found = self._resolve_name(module, parts[0], depth=0)
        return found[0] if found else module

    def _resolve_name(self, module: str, name: str, depth: int) -> tuple[str, ast.AST] | None:
        tree = self.tree(module)
        if tree is None or depth > 8:
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                return module, node
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return module, node
        for node in ast.walk(tree):  # imports, also inside `if TYPE_CHECKING:` / try blocks
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = _absolute(module, node, self.module_file(module))
                        found = self._resolve_name(source, alias.name, depth + 1)
                        if found:
                            return found
                        sub = f"{source}.{alias.name}"
                        if self.tree(sub) is not None:
                            return sub, self.tree(sub)  # a submodule imported by name
        lazy = self._lazy_attr(tree, name)
        if lazy:
            mod, attr = lazy
            return self._resolve_name(_join_relative(module, mod, self.module_file(module)), attr, depth + 1)
        for node in tree.body:  # a module __getattr__ that answers this name (lazy attributes)
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__" and any(
                isinstance(n, ast.Constant) and n.value == name for n in ast.walk(node)
            ):
                return module, node
        return None

    def _module_attr(self, module: str, name: str, depth: int) -> ast.AST | None:
        found = self._resolve_name(module, name, depth)
        if found is None and self.tree(f"{module}.{name}") is not None:
            return self.tree(f"{module}.{name}")
        return found[1] if found else None

    @staticmethod
    def _lazy_attr(tree: ast.Module, name: str) -> tuple[str, str] | None:
        # vllm/__init__.py: MODULE_ATTRS = {"LLM": ".entrypoints.llm:LLM", ...}
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "MODULE_ATTRS"
                                                    for t in node.targets):
                if isinstance(node.value, ast.Dict):
                    for key, value in zip(node.value.keys, node.value.values):
                        if isinstance(key, ast.Constant) and key.value == name and isinstance(value, ast.Constant):
                            mod, _, attr = str(value.value).partition(":")
                            return mod, attr
        return None

    def _class_attr(self, cls: ast.ClassDef, module: str, name: str, depth: int) -> ast.AST | None:
        for node in cls.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
                return node
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
                return node
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return node
        if depth > 8:
            return None
        for base in cls.bases:
            base_name = _dotted(base)
            if not base_name:
                continue
            found = self._resolve_name(module, base_name.split(".")[-1], 0)
            if found and isinstance(found[1], ast.ClassDef):
                hit = self._class_attr(found[1], found[0], name, depth + 1)
                if hit is not None:
                    return hit
        return None

    def class_fields(self, target: str) -> set[str]:
        """Annotated field names of a (data)class and of the bases the module imports."""
        cls = self.find(target)
        if not isinstance(cls, ast.ClassDef):
            return set()
        module = target.partition(":")[0]
        return self._fields(cls, self._owner_module(module, [target.partition(":")[2].split(".")[0]]), 0)

    def _fields(self, cls: ast.ClassDef, module: str, depth: int) -> set[str]:
        names = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        if depth < 8:
            for base in cls.bases:
                base_name = _dotted(base)
                found = self._resolve_name(module, base_name.split(".")[-1], 0) if base_name else None
                if found and isinstance(found[1], ast.ClassDef):
                    names |= self._fields(found[1], found[0], depth + 1)
        return names

    def self_attributes(self, target: str) -> set[str]:
        """Attributes a class's methods assign on ``self`` (``self.x = ...``, ``self.x: T = ...``)."""
        cls = self.find(target)
        out: set[str] = set()
        for node in ast.walk(cls) if isinstance(cls, ast.ClassDef) else ():
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign | ast.AugAssign) else []
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                        out.add(sub.attr)
        return out

    def params(self, target: str) -> list[str] | None:
        """Parameter names of a function or method (positional first), or ``None``."""
        node = self.find(target)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return None
        a = node.args
        return [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]

    def source_of(self, target: str) -> str:
        """Source text of the definition ``target`` ('' if not found).

        For a re-exported name this is the text of the definition in its own module only when
        the definition lies in ``target``'s module; callers use it on functions and methods.
        """
        node = self.find(target)
        module = target.partition(":")[0]
        qual = target.partition(":")[2]
        owner = self._owner_module(module, qual.split(".")[:1]) if qual else module
        text = self.text(owner) or ""
        return (ast.get_source_segment(text, node) or "") if node is not None else ""

    def string_in(self, module: str, value: str) -> bool:
        """Whether a string constant ``value`` occurs in ``module``."""
        tree = self.tree(module)
        return tree is not None and any(
            isinstance(n, ast.Constant) and n.value == value for n in ast.walk(tree)
        )

    def literal_values(self, module: str, name: str, depth: int = 0) -> set[str]:
        """String values of ``name = Literal[...]`` (unions of such Literals followed)."""
        found = self._resolve_name(module, name, 0)
        if not found or depth > 8:
            return set()
        owner, node = found
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        out: set[str] = set()
        for sub in ast.walk(value) if value is not None else ():
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                out.add(sub.value)
            elif isinstance(sub, ast.Name) and sub.id not in {"Literal", name}:
                out |= self.literal_values(owner, sub.id, depth + 1)
        return out

    def dict_keys(self, module: str, name: str) -> set[str]:
        """String keys of a module-level dict literal ``name = {...}``."""
        found = self._resolve_name(module, name, 0)
        value = getattr(found[1], "value", None) if found else None
        if not isinstance(value, ast.Dict):
            return set()
        return {k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}

    def calls_in(self, target: str) -> list[ast.Call]:
        """Every call inside a function (source order)."""
        node = self.find(target)
        if node is None:
            return []
        calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
        return sorted(calls, key=lambda c: (c.lineno, c.col_offset))


def _dotted(node: ast.AST) -> str:
    """``a.b.c`` of a Name/Attribute chain, else ''."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def call_name(call: ast.Call) -> str:
    """Dotted name of what a call calls (``self.rejection_sampler.parse_output``), else ''."""
    return _dotted(call.func)


def _join_relative(module: str, relative: str, path: Path | None) -> str:
    level = len(relative) - len(relative.lstrip("."))
    if not level:
        return relative
    package = module if path is not None and path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    rest = relative[level:]
    return f"{package}.{rest}" if rest else package


def _absolute(module: str, node: ast.ImportFrom, path: Path | None) -> str:
    return _join_relative(module, "." * node.level + (node.module or ""), path)


# ---------------------------------------------------------------------------- the registry
@dataclass(frozen=True)
class Touchpoint:
    """One fact about a vLLM build that sdbench relies on, and how to check it in the source."""

    name: str
    check: Callable[[SourceTree], str | None]
    # Engine releases it applies to (quirks versions); empty: every release.
    versions: frozenset[str] = frozenset()
    # What it checks, as "module:Qual.name" / "module" / "env:NAME" (kept complete by a test).
    targets: tuple[str, ...] = ()
    owner: str = ""  # the declaring module (set by declare)

    def applies_to(self, version: str) -> bool:
        """Whether this touchpoint concerns ``version``."""
        return not self.versions or version in self.versions


_REGISTRY: dict[str, Touchpoint] = {}


def declare(owner: str, *touchpoints: Touchpoint) -> tuple[Touchpoint, ...]:
    """Register ``touchpoints`` as relied on by module ``owner``; returns them (idempotent)."""
    out = []
    for tp in touchpoints:
        tp = Touchpoint(tp.name, tp.check, tp.versions, tp.targets, owner)
        known = _REGISTRY.get(tp.name)
        if known is not None and known.owner != owner:
            raise ValueError(f"touchpoint {tp.name!r} declared by {known.owner} and {owner}")
        _REGISTRY[tp.name] = tp
        out.append(tp)
    return tuple(out)


def registry() -> list[Touchpoint]:
    """Every declared touchpoint (imports :data:`DECLARING_MODULES`), sorted by name."""
    for module in DECLARING_MODULES:
        importlib.import_module(module)
    return sorted(_REGISTRY.values(), key=lambda t: t.name)


def declared_targets() -> set[str]:
    """Every target some touchpoint checks."""
    return {t for tp in registry() for t in tp.targets}


# ---------------------------------------------------------------------------- check builders
def _versions(versions: Iterable[str] | None) -> frozenset[str]:
    return frozenset(versions or ())


def defined(
    name: str, target: str, params: Sequence[str] = (), versions: Iterable[str] | None = None
) -> Touchpoint:
    """``target`` exists; for a function, with (at least) the parameters ``params``."""

    def check(src: SourceTree) -> str | None:
        if src.find(target) is None:
            return f"{target} not found"
        if params:
            have = src.params(target)
            if have is None:
                return f"{target} is not a function"
            missing = [p for p in params if p not in have]
            if missing:
                return f"{target} has no parameter {', '.join(missing)} (has {', '.join(have)})"
        return None

    return Touchpoint(name, check, _versions(versions), (target,))


def positional(name: str, target: str, params: Sequence[str], versions: Iterable[str] | None = None) -> Touchpoint:
    """A function whose leading parameters are exactly ``params`` (the hook reads them by position)."""

    def check(src: SourceTree) -> str | None:
        have = src.params(target)
        if have is None:
            return f"{target} not found"
        if have[: len(params)] != list(params):
            return f"{target} takes ({', '.join(have)}), expected ({', '.join(params)}, ...)"
        return None

    return Touchpoint(name, check, _versions(versions), (target,))


def fields(name: str, target: str, names: Iterable[str], versions: Iterable[str] | None = None) -> Touchpoint:
    """A (data)class declares the fields ``names`` (or a function takes them as parameters)."""
    wanted = tuple(sorted(set(names)))

    def check(src: SourceTree) -> str | None:
        node = src.find(target)
        if node is None:
            return f"{target} not found"
        have = set(src.params(target) or ()) if isinstance(node, ast.FunctionDef) else src.class_fields(target)
        missing = [n for n in wanted if n not in have]
        return f"{target} lacks {', '.join(missing)}" if missing else None

    return Touchpoint(name, check, _versions(versions), (target,))


def strings(name: str, module: str, values: Iterable[str], versions: Iterable[str] | None = None) -> Touchpoint:
    """String constants (metric names, labels, routes) occur in ``module``."""
    wanted = tuple(values)

    def check(src: SourceTree) -> str | None:
        if src.tree(module) is None:
            return f"module {module} not found"
        missing = [v for v in wanted if not src.string_in(module, v)]
        return f"{module} never names {', '.join(repr(v) for v in missing)}" if missing else None

    return Touchpoint(name, check, _versions(versions), (module,))


def env_vars(name: str, names: Iterable[str], versions: Iterable[str] | None = None) -> Touchpoint:
    """Environment variables vLLM reads (declared in ``vllm/envs.py``'s ``environment_variables``)."""
    wanted = tuple(names)

    def check(src: SourceTree) -> str | None:
        declared = src.dict_keys("vllm.envs", "environment_variables")
        if not declared:
            return "vllm/envs.py has no environment_variables table"
        missing = [n for n in wanted if n not in declared]
        return f"vllm.envs does not read {', '.join(missing)}" if missing else None

    return Touchpoint(name, check, _versions(versions), tuple(f"env:{n}" for n in wanted))


def self_attributes(name: str, target: str, attrs: Iterable[str], versions: Iterable[str] | None = None) -> Touchpoint:
    """A class's methods set the instance attributes ``attrs`` (read off a live object elsewhere)."""
    wanted = tuple(attrs)

    def check(src: SourceTree) -> str | None:
        if src.find(target) is None:
            return f"{target} not found"
        missing = [a for a in wanted if a not in src.self_attributes(target)]
        return f"{target} never sets self.{', self.'.join(missing)}" if missing else None

    return Touchpoint(name, check, _versions(versions), (target,))


def custom(
    name: str,
    check: Callable[[SourceTree], str | None],
    targets: Sequence[str],
    versions: Iterable[str] | None = None,
) -> Touchpoint:
    """A behavioural check written out (where a name check is not enough)."""
    return Touchpoint(name, check, _versions(versions), tuple(targets))


# ---------------------------------------------------------------------------- shared analyses
def return_names(src: SourceTree | None, target: str, node: ast.AST | None = None) -> list[list[str]]:
    """Names in each ``return (a, b, ...)`` tuple of a function (one list per return statement)."""
    fn = node if node is not None else (src.find(target) if src else None)
    if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return []
    out = []
    for sub in ast.walk(fn):
        if isinstance(sub, ast.Return) and isinstance(sub.value, ast.Tuple):
            out.append([_dotted(e) or "?" for e in sub.value.elts])
    return out


def tuple_layout(returns: list[list[str]], wanted: Sequence[str]) -> dict[str, int]:
    """Index of each ``wanted`` name in every return tuple; ``ValueError`` if they disagree or lack one."""
    if not returns:
        raise ValueError("no `return (..., ...)` tuple")
    layout: dict[str, int] = {}
    for names in returns:
        for want in wanted:
            if want not in names:
                raise ValueError(f"a return tuple lacks {want!r}: ({', '.join(names)})")
            index = names.index(want)
            if layout.setdefault(want, index) != index:
                raise ValueError(f"{want!r} is at positions {layout[want]} and {index} in different returns")
    return layout


def live_layout(function: Callable[..., object], wanted: Sequence[str]) -> dict[str, int]:
    """:func:`tuple_layout` of a live function, read from its own source (``inspect``)."""
    import inspect
    import textwrap

    node = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    return tuple_layout(return_names(None, "", node), wanted)


def call_order(src: SourceTree, target: str, reaches: dict[str, Callable[[str], bool]]) -> dict[str, list[int]]:
    """Lines of the calls in function ``target`` that reach each kind of ``reaches``.

    ``reaches[kind]`` says whether a called dotted name is of that kind directly; a call of a
    method of the same class (``self.m``) or of a nested function reaches a kind when its body
    does (followed transitively).
    """
    cls_target = target.rpartition(".")[0]
    fn = src.find(target)
    if fn is None:
        return {kind: [] for kind in reaches}
    nested = {n.name: n for n in ast.walk(fn) if isinstance(n, ast.FunctionDef) and n is not fn}

    @functools.lru_cache(maxsize=None)
    def body_reaches(method: str, kind: str, depth: int = 0) -> bool:
        node = nested.get(method) if method in nested else src.find(f"{cls_target}.{method}")
        if node is None or depth > 6:
            return False
        return any(_call_reaches(c, kind, depth + 1) for c in ast.walk(node) if isinstance(c, ast.Call))

    def _call_reaches(call: ast.Call, kind: str, depth: int) -> bool:
        name = call_name(call)
        if reaches[kind](name):
            return True
        if name.startswith("self.") and name.count(".") == 1:
            return body_reaches(name[5:], kind, depth)
        if name in nested:
            return body_reaches(name, kind, depth)
        return False

    nested_nodes = {id(c) for n in nested.values() for c in ast.walk(n)}
    calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call) and id(c) not in nested_nodes]
    return {kind: sorted(c.lineno for c in calls if _call_reaches(c, kind, 0)) for kind in reaches}


def live_has(target: str) -> bool:
    """:meth:`SourceTree.has` on the imported build (engine processes)."""
    module, _, qual = target.partition(":")
    try:
        owner: object = importlib.import_module(module)
    except ImportError:
        return False
    for part in qual.split(".") if qual else ():
        if not hasattr(owner, part):
            return False
        owner = getattr(owner, part)
    return True


_SEMVER = re.compile(r"^\d+(\.\d+)*")


def base_version(version: str) -> str:
    """``0.11.1`` of ``0.11.1+cu128`` / ``0.11.1.dev3`` style version strings."""
    match = _SEMVER.match(version)
    return match.group(0) if match else version


@dataclass
class Result:
    """The outcome of one touchpoint on one build."""

    touchpoint: str
    label: str
    why: str | None  # None: ok
    skipped: bool = False
    owner: str = field(default="")

    @property
    def ok(self) -> bool:
        return self.why is None

    def line(self) -> str:
        """``touchpoint | build | ok`` or ``... | FAILED: why``."""
        status = "ok" if self.ok else f"FAILED: {self.why}"
        return f"{self.touchpoint} | {self.label} | {status}"


def evaluate(touchpoints: Iterable[Touchpoint], src: SourceTree) -> list[Result]:
    """Run every touchpoint that applies to ``src.version``; a crashing check is a failure."""
    out = []
    for tp in touchpoints:
        if not tp.applies_to(src.version):
            continue
        try:
            why = tp.check(src)
        except Exception as exc:  # noqa: BLE001 - a check that cannot read the source fails, loudly
            why = f"check raised {type(exc).__name__}: {exc}"
        out.append(Result(tp.name, src.label, why, owner=tp.owner))
    return out
