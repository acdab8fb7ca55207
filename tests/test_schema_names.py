"""One spelling per quantity (docs/schema.md, "Naming"): the schema doc and the code agree on it.

Fast: reads docs/schema.md and the package's source as text.

- throughput is ``tokens_per_s`` everywhere (``output_tokens_per_s`` is not a column name);
- a bound named ``..._low`` / ``..._high`` is a 95% interval's, ``<quantity>_ci_low`` /
  ``<quantity>_ci_high``; a range is ``_min`` / ``_max``. The verdict's break-even loads and the
  drawn tables' ``x_lo`` / ``x_hi`` are the documented exceptions.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "docs" / "schema.md"
SOURCES = sorted((REPO / "src" / "sdbench").rglob("*.py"))

# Column names the Naming section allows outside the rule, and why.
EXCEPTIONS = {
    "break_even_low", "break_even_high",  # verdict: loads where the speedup's bounds cross 1
    "x_lo", "x_hi",  # drawn tables: the interval drawn on x, whatever its kind
}  # fmt: skip
CODE_SPAN = re.compile(r"`([^`]+)`")
IDENTIFIER = re.compile(r"^[a-z][a-z0-9_]*$")
STRING_LITERAL = re.compile(r"""(?<![\w.])["']([a-z][a-z0-9_]*)["']""")


def offences(name: str) -> list[str]:
    """What is wrong with column name ``name`` under the naming rule (empty: nothing)."""
    if name in EXCEPTIONS:
        return []
    found = []
    if "output_tokens_per_s" in name:
        found.append("throughput is tokens_per_s")
    if "ci95" in name:
        found.append("a 95% interval is <quantity>_ci_low/_ci_high")
    if re.search(r"_(low|high|lo|hi)$", name) and not re.search(r"_ci_(low|high)$", name):
        found.append("bounds are <quantity>_ci_low/_ci_high (95% interval) or _min/_max (range)")
    return found


def schema_names(text: str) -> set[str]:
    """Column names quoted in the schema doc; ``a_ci_low/high`` and ``a, b`` spans expanded."""
    names: set[str] = set()
    for span in CODE_SPAN.findall(text):
        for part in re.split(r"[,\s]+", span):
            first, *rest = part.split("/")
            if not IDENTIFIER.match(first):
                continue
            names.add(first)
            stem = first.rsplit("_", 1)[0]
            names.update(f"{stem}_{r}" for r in rest if IDENTIFIER.match(r))
    return names


def test_the_rule_catches_what_it_is_for() -> None:
    assert offences("tokens_per_s") == offences("speedup_ci_low_a") == offences("tokens_per_s_max") == []
    assert offences("break_even_low") == []
    for bad in ("output_tokens_per_s", "speedup_low", "cost_per_1m_tokens_high", "ci95_low", "measured_lo"):
        assert offences(bad), bad
    assert {"speedup_ci_low", "speedup_ci_high", "tokens_per_s_min", "tokens_per_s_max", "n"} <= schema_names(
        "`speedup_ci_low/high`, `tokens_per_s_min/max` and `n`"
    )


def test_the_schema_doc_spells_each_quantity_one_way() -> None:
    names = schema_names(SCHEMA.read_text(encoding="utf-8"))
    assert {"tokens_per_s", "speedup_ci_low", "tokens_per_s_min", "tokens_per_s_per_device"} <= names
    bad = {n: offences(n) for n in sorted(names) if offences(n)}
    assert not bad, f"docs/schema.md: {bad}"


def test_the_code_spells_each_quantity_one_way() -> None:
    bad = {
        f"{path.relative_to(REPO)}: {name}": offences(name)
        for path in SOURCES
        for name in sorted(set(STRING_LITERAL.findall(path.read_text(encoding="utf-8"))))
        if offences(name)
    }
    assert not bad, bad
