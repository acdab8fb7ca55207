"""Training / held-out text corpus for the pipeline's own small models.

The corpus is the Python standard library's ``.py`` sources of the running
interpreter: present on every machine, offline, license-clean and code-like
(the workload the benchmark's "code-edit" prompt set models). Files are split
deterministically into train and held-out by a stable hash of their path
relative to the stdlib root, so the split never depends on the directory
listing order or the machine.

It also provides the synthetic code-edit examples (function, edit request,
edited function) used both for training the models and, applied to held-out
files, for building the embedded InstructCoder-like prompt set.
"""

from __future__ import annotations

import ast
import hashlib
import io
import keyword
import random
import re
import sysconfig
import textwrap
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Split = Literal["train", "heldout"]
SPLITS: tuple[str, ...] = ("train", "heldout")

#: One file in ``HELDOUT_MODULUS`` goes to the held-out split.
HELDOUT_MODULUS = 10

# Directory names never taken (at any depth): test suites are huge and
# repetitive, site-packages is not the stdlib, the rest is data or generated.
_EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "pydoc_data", "__pycache__", "lib-dynload"}
)

# Cue between the edit request and the edited code: the model learns that
# what follows it is the (edited) copy of the code above.
EDIT_REQUEST_PREFIX = "# Edit request: "
EDITED_CODE_CUE = "# Edited code:\n"

# Name patterns for renames: a few fixed affixes keep the substitution
# learnable by a tiny model (copy the old name, add a known affix).
_RENAME_SUFFIXES = ("_new", "_value", "_tmp", "_var", "2", "_item")
_RENAME_PREFIXES = ("new_", "my_", "the_", "local_")
_FUNC_SUFFIXES = ("_v2", "_impl", "_new", "_helper")


def stdlib_root() -> Path:
    """Directory of the running interpreter's standard library sources."""
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def _is_excluded(rel: Path, root: Path) -> bool:
    """True for files that are not representative hand-written library code."""
    parts = rel.parts
    if any(p in _EXCLUDED_DIRS for p in parts[:-1]):
        return True
    if parts[0].startswith("config-"):  # build configuration, machine-specific
        return True
    if rel.name.startswith("_sysconfigdata"):  # machine-specific generated dict
        return True
    if parts[0] == "encodings" and len(parts) == 2:
        # gencodec.py output: 256-entry charmap tables, not code.
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        if "decoding_table" in text:
            return True
    return False


def split_of(relative_path: str) -> Split:
    """Split of one file, from the sha256 of its POSIX relative path."""
    digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
    return "heldout" if int.from_bytes(digest[:8], "big") % HELDOUT_MODULUS == 0 else "train"


def corpus_files(split: Split, root: Path | None = None) -> list[Path]:
    """Sorted list of the corpus ``.py`` files of ``split`` ("train" or "heldout").

    ``root`` defaults to the running interpreter's stdlib directory.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    root = (root or stdlib_root()).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"corpus root {root} is not a directory")
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _is_excluded(rel, root):
            continue
        if split_of(rel.as_posix()) == split:
            files.append(path)
    return files


def read_source(path: Path) -> str:
    """Text of one corpus file; undecodable bytes are replaced (a few stdlib files are latin-1)."""
    return path.read_text(encoding="utf-8", errors="replace")


def corpus_texts(split: Split, root: Path | None = None) -> Iterator[tuple[str, str]]:
    """Yield ``(relative_posix_path, text)`` for every file of ``split``, in sorted order."""
    base = (root or stdlib_root()).resolve()
    for path in corpus_files(split, base):
        yield path.relative_to(base).as_posix(), read_source(path)


def corpus_fingerprint(split: Split, root: Path | None = None) -> str:
    """sha256 over the paths and contents of ``split``: identifies the exact training data."""
    h = hashlib.sha256()
    for rel, text in corpus_texts(split, root):
        h.update(rel.encode() + b"\0" + text.encode("utf-8") + b"\0")
    return h.hexdigest()


# ----------------------------------------------------------------------------
# Functions and synthetic code edits
# ----------------------------------------------------------------------------


def _source_lines(source: str) -> list[str]:
    """Lines with their ends, split like the Python tokenizer (\\n, \\r\\n, \\r; not \\f)."""
    return _LINE_RE.findall(source)


_LINE_RE = re.compile(r".*?(?:\r\n|\r|\n)|.+$", re.S)


def _segment(lines: list[str], node: ast.AST) -> str:
    """Like ``ast.get_source_segment(padded=True)`` on pre-split lines.

    The stdlib version re-splits the whole file on every call, which is
    quadratic over a file's functions (minutes over the stdlib).
    """
    first, last = node.lineno - 1, node.end_lineno - 1  # type: ignore[attr-defined]
    start = len(lines[first].encode("utf-8")[: node.col_offset].decode("utf-8", errors="replace"))  # type: ignore[attr-defined]
    end_b = node.end_col_offset  # type: ignore[attr-defined]
    if first == last:
        head = lines[first].encode("utf-8")[node.col_offset : end_b].decode("utf-8", errors="replace")  # type: ignore[attr-defined]
        return " " * start + head
    head = " " * start + lines[first][start:]
    tail = lines[last].encode("utf-8")[:end_b].decode("utf-8", errors="replace")
    return head + "".join(lines[first + 1 : last]) + tail


def extract_functions(source: str, min_chars: int = 0, max_chars: int | None = None) -> list[str]:
    """Source text of every (possibly nested) function of ``source``, dedented.

    Decorators are not included. Functions whose text length is outside
    ``[min_chars, max_chars]`` are dropped; unparsable sources give ``[]``.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = _source_lines(source)
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    out = []
    # ast.walk is breadth-first; source order is more natural and as stable.
    for node in sorted(nodes, key=lambda n: (n.lineno, n.col_offset)):
        text = textwrap.dedent(_segment(lines, node)).rstrip() + "\n"
        if "\t" in text or len(text) < min_chars or (max_chars is not None and len(text) > max_chars):
            continue
        out.append(text)
    return out


def corpus_functions(
    split: Split, min_chars: int = 120, max_chars: int = 700, root: Path | None = None
) -> list[str]:
    """All functions of ``split`` with a source length in ``[min_chars, max_chars]``.

    Deterministic order (files sorted, functions in source order).
    Duplicated function texts are kept once.
    """
    seen: set[str] = set()
    out = []
    for _, text in corpus_texts(split, root):
        for fn in extract_functions(text, min_chars, max_chars):
            if fn not in seen:
                seen.add(fn)
                out.append(fn)
    return out


@dataclass(frozen=True)
class EditExample:
    """One synthetic code-edit example.

    ``prompt`` is the original function, the edit request and the cue
    line; ``completion`` is the edited function (ends with a newline). A
    model that learned to copy-and-edit reproduces most of the prompt's code.
    """

    prompt: str
    completion: str
    kind: str
    request: str


def _function_node(source: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ValueError(f"source_function does not parse: {exc}") from None
    if not tree.body or not isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise ValueError("source_function must start with a top-level def")
    return tree.body[0]


def _line_offsets(source: str) -> list[int]:
    """Character offset of the start of each (1-based) line; index 0 unused."""
    offsets = [0, 0]
    for line in _source_lines(source):
        offsets.append(offsets[-1] + len(line))
    return offsets


def _char_offset(source: str, offsets: list[int], lineno: int, col_utf8: int) -> int:
    """Convert an ast (line, UTF-8 byte column) into a character offset."""
    line = source[offsets[lineno] : offsets[lineno + 1] if lineno + 1 < len(offsets) else None]
    return offsets[lineno] + len(line.encode("utf-8")[:col_utf8].decode("utf-8", errors="replace"))


def _replace_spans(source: str, spans: list[tuple[int, int]], new: str) -> str:
    out, last = [], 0
    for start, end in sorted(set(spans)):
        out.append(source[last:start])
        out.append(new)
        last = end
    out.append(source[last:])
    return "".join(out)


def _identifier_spans(fn: ast.AST, source: str, name: str) -> list[tuple[int, int]] | None:
    """Character spans of every binding/use of local ``name`` in ``fn``; None if unsafe."""
    offsets = _line_offsets(source)
    spans = []
    for node in ast.walk(fn):
        if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return None
        if isinstance(node, ast.Name) and node.id == name:
            start = _char_offset(source, offsets, node.lineno, node.col_offset)
            spans.append((start, start + len(name)))
        elif isinstance(node, ast.arg) and node.arg == name:
            start = _char_offset(source, offsets, node.lineno, node.col_offset)
            spans.append((start, start + len(name)))
    # Positions inside f-strings are unreliable before 3.12: check each span.
    if any(source[s:e] != name for s, e in spans):
        return None
    return spans


class _Renamer(ast.NodeTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id == self.old:
            node.id = self.new
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        if node.arg == self.old:
            node.arg = self.new
        self.generic_visit(node)
        return node


def _same_after_rename(original: str, edited: str, old: str, new: str) -> bool:
    """Check ``edited`` is exactly ``original`` with identifier ``old`` renamed."""
    try:
        a = _Renamer(old, new).visit(ast.parse(original))
        b = ast.parse(edited)
    except SyntaxError:
        return False
    return ast.dump(a) == ast.dump(b)


def _local_names(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """Arguments and assigned local names of ``fn`` (not ``self``/``cls``), in first-seen order."""
    names: dict[str, None] = {}
    args = fn.args
    for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if a is not None and a.arg not in ("self", "cls"):
            names[a.arg] = None
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names[node.id] = None
    return [n for n in names if len(n) >= 2 and not n.startswith("__")]


def _all_identifiers(source: str) -> set[str]:
    try:
        return {
            t.string
            for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type == tokenize.NAME
        }
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return set(re.findall(r"[A-Za-z_]\w*", source))


def _new_name(
    old: str, rng: random.Random, taken: set[str], suffixes: tuple[str, ...], prefixes: tuple[str, ...]
) -> str | None:
    candidates = [old + s for s in suffixes] + [p + old.lstrip("_") for p in prefixes]
    rng.shuffle(candidates)
    for cand in candidates:
        if cand not in taken and not keyword.iskeyword(cand):
            return cand
    return None


def _edit_rename_variable(source: str, fn: ast.AST, rng: random.Random) -> tuple[str, str] | None:
    names = _local_names(fn)  # type: ignore[arg-type]
    rng.shuffle(names)
    taken = _all_identifiers(source)
    for old in names:
        spans = _identifier_spans(fn, source, old)
        if not spans:
            continue
        new = _new_name(old, rng, taken, _RENAME_SUFFIXES, _RENAME_PREFIXES)
        if new is None:
            continue
        edited = _replace_spans(source, spans, new)
        if _same_after_rename(source, edited, old, new):
            return f"rename the variable `{old}` to `{new}`.", edited
    return None


def _edit_rename_function(
    source: str, fn: ast.FunctionDef | ast.AsyncFunctionDef, rng: random.Random
) -> tuple[str, str] | None:
    old = fn.name
    new = _new_name(old, rng, _all_identifiers(source), _FUNC_SUFFIXES, ())
    if new is None:
        return None
    # The name follows "def " / "async def " on the first line; recursive calls
    # (plain Name loads) are renamed too.
    first_line = source.split("\n", 1)[0]
    m = re.match(rf"(\s*(?:async\s+)?def\s+){re.escape(old)}\b", first_line)
    if m is None:
        return None
    spans = [(m.end(1), m.end(1) + len(old))]
    offsets = _line_offsets(source)
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id == old:
            start = _char_offset(source, offsets, node.lineno, node.col_offset)
            spans.append((start, start + len(old)))
    if any(source[s:e] != old for s, e in spans):
        return None
    edited = _replace_spans(source, spans, new)
    try:
        ast.parse(edited)
    except SyntaxError:
        return None
    return f"rename the function `{old}` to `{new}`.", edited


def _edit_change_constant(source: str, fn: ast.AST, rng: random.Random) -> tuple[str, str] | None:
    offsets = _line_offsets(source)
    consts = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Constant) and type(node.value) is int and node.end_col_offset is not None:
            start = _char_offset(source, offsets, node.lineno, node.col_offset)
            end = _char_offset(source, offsets, node.end_lineno, node.end_col_offset)  # type: ignore[arg-type]
            if source[start:end].isdigit():  # plain decimal literal only
                consts.append((start, end, node.value))
    if not consts:
        return None
    start, end, value = sorted(consts)[rng.randrange(len(consts))]
    new_value = value + rng.choice((1, 2, 10)) if value < 1000 else value * 2
    edited = source[:start] + str(new_value) + source[end:]
    line = source[:start].count("\n") + 1
    return f"change the constant `{value}` on line {line} to `{new_value}`.", edited


def _edit_add_print(
    source: str, fn: ast.FunctionDef | ast.AsyncFunctionDef, rng: random.Random
) -> tuple[str, str] | None:
    body0 = fn.body[0]
    # Insert after the docstring, if any, with the body's own indentation.
    is_doc = (
        isinstance(body0, ast.Expr)
        and isinstance(body0.value, ast.Constant)
        and isinstance(body0.value.value, str)
    )
    anchor = fn.body[1] if is_doc and len(fn.body) > 1 else (None if is_doc else body0)
    lines = _source_lines(source)
    if anchor is None or anchor.lineno - 1 >= len(lines):
        return None
    target_line = lines[anchor.lineno - 1]
    indent = target_line[: len(target_line) - len(target_line.lstrip())]
    if not indent or (anchor.lineno == fn.lineno):
        return None  # one-line function body: skip
    message = rng.choice(("enter", "calling", "start"))
    stmt = f"{indent}print({message!r}, {fn.name!r})\n"
    edited = "".join(lines[: anchor.lineno - 1]) + stmt + "".join(lines[anchor.lineno - 1 :])
    try:
        ast.parse(edited)
    except SyntaxError:
        return None
    return f"print {message!r} and the function name at the start of `{fn.name}`.", edited


# Edit kinds with their sampling weights: renames dominate (copying with a
# substitution is what a tiny model can learn; it is also the commonest edit).
EDIT_KINDS: tuple[tuple[str, float], ...] = (
    ("rename_variable", 0.6),
    ("rename_function", 0.15),
    ("change_constant", 0.15),
    ("add_print", 0.10),
)
_EDITORS = {
    "rename_variable": _edit_rename_variable,
    "rename_function": _edit_rename_function,
    "change_constant": _edit_change_constant,
    "add_print": _edit_add_print,
}


def format_edit_prompt(source_function: str, request: str) -> str:
    """Prompt text of an edit example: code, request line, cue line."""
    return f"{source_function.rstrip()}\n{EDIT_REQUEST_PREFIX}{request}\n{EDITED_CODE_CUE}"


def make_edit_example(source_function: str, rng: random.Random) -> EditExample:
    """Build one synthetic edit example from the source of a single function.

    The edit kind is drawn from :data:`EDIT_KINDS` with ``rng`` (a
    ``random.Random``); a kind that does not apply (no local variable, no int
    constant, ...) falls back to the next kinds, ending with renaming the
    function, which always applies. Same ``source_function`` and rng state
    give the same example.

    Raises ``ValueError`` if ``source_function`` is not a single function definition.
    """
    source = textwrap.dedent(source_function).rstrip() + "\n"
    fn = _function_node(source)
    names = [k for k, _ in EDIT_KINDS]
    first = rng.choices(names, weights=[w for _, w in EDIT_KINDS])[0]
    order = [first] + [n for n in names if n != first]
    for kind in order:
        result = _EDITORS[kind](source, fn, rng)
        if result is not None:
            request, edited = result
            return EditExample(format_edit_prompt(source, request), edited, kind, request)
    raise ValueError(f"no edit applies to function {fn.name!r}")


def edit_examples(
    split: Split,
    seed: int,
    per_function: int = 1,
    min_chars: int = 120,
    max_chars: int = 700,
    root: Path | None = None,
) -> list[EditExample]:
    """Edit examples for every function of ``split`` (``per_function`` each), deterministic in ``seed``."""
    rng = random.Random(seed)
    out = []
    for fn in corpus_functions(split, min_chars, max_chars, root):
        for _ in range(per_function):
            try:
                out.append(make_edit_example(fn, rng))
            except ValueError:
                break
    return out
