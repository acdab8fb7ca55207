"""README.md and docs/: every relative link resolves, every quoted ``sdbench`` command parses.

Fast: reads Markdown and builds the argument parser (which imports no implementation); no engine,
no Snakemake run.

- A relative link (``[text](path)``, ``![alt](path)``, ``path#anchor``, ``#anchor``) must name an
  existing file or directory; its ``#anchor`` must be the GitHub slug of a heading of the target
  Markdown file.
- A command line in a fenced ``bash``/``sh``/``console`` (or unlabelled) block that starts with
  ``sdbench`` or ``.venv/bin/sdbench`` must name an existing subcommand path, and every ``--option``
  after it must be one of that subcommand's options.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdbench.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])


SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}
PROGRAMS = {"sdbench", ".venv/bin/sdbench"}

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def split_fences(text: str) -> Iterator[tuple[str | None, str]]:
    """``(language, block)`` for fenced code blocks and ``(None, prose)`` for the text between."""
    lines = text.splitlines()
    prose: list[str] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            prose.append(lines[i])
            i += 1
            continue
        yield None, "\n".join(prose)
        prose = []
        marker, language = match.group(2), match.group(3).lower()
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(marker):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        yield language, "\n".join(body)
    yield None, "\n".join(prose)


def prose_of(path: Path) -> str:
    """The file's text outside fenced code blocks and inline code spans."""
    text = "\n".join(block for language, block in split_fences(path.read_text(encoding="utf-8")) if language is None)
    return CODE_SPAN.sub("", text)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: rendered text, lower case, punctuation dropped, spaces as -."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in prose_of_headings(path):
        slug = github_slug(line)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def prose_of_headings(path: Path) -> Iterator[str]:
    for language, block in split_fences(path.read_text(encoding="utf-8")):
        if language is not None:
            continue
        for line in block.splitlines():
            match = HEADING.match(line)
            if match:
                yield match.group(2)


def links(path: Path) -> Iterator[str]:
    for match in LINK.finditer(prose_of(path)):
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.I):  # http:, https:, mailto: ...
            continue
        yield target


def test_the_docs_are_found() -> None:
    names = {rel(path) for path in DOCS}
    assert {"README.md", "docs/figures.md", "docs/cluster.md", "docs/results/README.md"} <= names


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_relative_links_resolve(doc: Path) -> None:
    problems = []
    for target in links(doc):
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if file_part and not dest.exists():
            problems.append(f"{target}: no such file")
            continue
        if anchor:
            if dest.suffix != ".md" or not dest.is_file():
                problems.append(f"{target}: an anchor into a file that is not Markdown")
            elif anchor not in anchors(dest):
                problems.append(f"{target}: no heading with anchor #{anchor} in {rel(dest)}")
    assert not problems, f"{rel(doc)}:\n" + "\n".join(problems)


def subparsers_of(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def flags(parser: argparse.ArgumentParser) -> set[str]:
    """Options that take no value (``--debug``): a subcommand may follow them."""
    return {option for action in parser._actions if action.nargs == 0 for option in action.option_strings}


def command_lines(path: Path) -> Iterator[str]:
    """Shell lines of the file's fenced shell blocks, continuations joined, prompts and comments dropped."""
    for language, block in split_fences(path.read_text(encoding="utf-8")):
        if language is None or language not in SHELL_LANGUAGES:
            continue
        joined = re.sub(r"\\\n", " ", block)
        for line in joined.splitlines():
            line = line.strip()
            if line.startswith("$ "):
                line = line[2:]
            if line:
                yield line


def commands(line: str) -> Iterator[list[str]]:
    """The ``sdbench`` commands of one shell line: each command of a ``&&``/``||``/``;``/``|``
    list, up to its first redirection (or placeholder such as ``<run>``)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    current: list[str] = []
    stopped = False
    for token in [*lexer, ";"]:
        if token and set(token) <= set("();<>|&"):
            if token in {";", "&&", "||", "|", "&"}:
                if current and current[0] in PROGRAMS:
                    yield current
                current, stopped = [], False
            else:
                stopped = True
        elif not stopped:
            current.append(token)


def check_command(tokens: list[str], parser: argparse.ArgumentParser) -> list[str]:
    path = ["sdbench"]
    rest = tokens[1:]
    while rest:
        token = rest[0]
        choices = subparsers_of(parser)
        if token in choices:
            parser = choices[token]
            path.append(token)
            rest = rest[1:]
        elif choices and token.startswith("-") and token.split("=", 1)[0] in flags(parser):
            rest = rest[1:]  # a flag of the command group itself, e.g. `sdbench --debug CMD`
        elif choices and not token.startswith("-"):
            return [f"{' '.join(tokens)}: no subcommand {token!r} of `{' '.join(path)}`"]
        else:
            break
    known = option_strings(parser)
    return [
        f"{' '.join(tokens)}: `{' '.join(path)}` has no option {token.split('=', 1)[0]}"
        for token in rest
        if token.startswith("--") and token != "--" and token.split("=", 1)[0] not in known
    ]


def quoted_commands() -> list[tuple[str, list[str]]]:
    return [(rel(doc), tokens) for doc in DOCS for line in command_lines(doc) for tokens in commands(line)]


def test_quoted_commands_are_found() -> None:
    """The check below sees the commands it is meant to check (the README quotes `sdbench compare`)."""
    quoted = quoted_commands()
    assert any(doc == "README.md" and tokens[1:2] == ["compare"] for doc, tokens in quoted), quoted


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_quoted_sdbench_commands_exist(doc: Path) -> None:
    parser = build_parser()
    problems = [
        problem for line in command_lines(doc) for tokens in commands(line) for problem in check_command(tokens, parser)
    ]
    assert not problems, f"{rel(doc)}:\n" + "\n".join(problems)


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    parser = build_parser()
    assert check_command(["sdbench", "compare", "A", "B", "--threshold", "0.1"], parser) == []
    assert check_command([".venv/bin/sdbench", "--debug", "bench", "compare-runs", "--runs", "A", "B"], parser) == []
    assert check_command(["sdbench", "compare", "A", "B", "--no-such-flag"], parser)
    assert check_command(["sdbench", "no-such-command"], parser)
    assert check_command(["sdbench", "bench", "no-such-bench"], parser)
    # A command that runs itself and also has sub-actions (`simulate`, `simulate compare`).
    assert check_command(["sdbench", "simulate", "--traces", "T.jsonl", "--proposer", "eagle"], parser) == []
    assert check_command(["sdbench", "simulate", "figures", "--results", "r.csv"], parser) == []
    doc = tmp_path / "x.md"
    doc.write_text("# A title: `x`\n\n```bash\nsdbench compare A \\\n  --bogus\n```\n\n```python\nsdbench --nope\n```\n")
    assert [list(commands(line)) for line in command_lines(doc)] == [[["sdbench", "compare", "A", "--bogus"]]]
    assert list(commands("bash x.sh && sdbench bundle verify B > log 2>&1; .venv/bin/sdbench compare A B")) == [
        ["sdbench", "bundle", "verify", "B"],
        [".venv/bin/sdbench", "compare", "A", "B"],
    ]
    assert anchors(doc) == {"a-title-x"}
    assert github_slug("Figure index: paper item → rule → output → function") == (
        "figure-index-paper-item--rule--output--function"
    )
    assert github_slug("Is it the same result? (`sdbench compare A B`)") == "is-it-the-same-result-sdbench-compare-a-b"
