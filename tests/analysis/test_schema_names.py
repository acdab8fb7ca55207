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

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "docs" / "schema.md"
SOURCES = sorted((REPO / "src" / "sdbench").rglob("*.py"))

# Column names the Naming section allows outside the rule, and why.
EXCEPTIONS = {
    "break_even_low", "break_even_high",  # verdict: loads where the speedup's bounds cross 1
    "served_speedup_low", "served_speedup_high",  # offline vs served: the verdict's judged bounds, either kind
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


# ----------------------------------------------------------------------------- every column documented
def declared_tables() -> dict[str, tuple[str, ...]]:
    """The columns each table is declared with in code (the builders return exactly these:
    sdbench.columns.conform), by table."""
    from sdbench.analysis import breakdown, categories, cost, energy, forced, proposal, randominputs, temperature, verdict
    from sdbench.analysis.bleu import BUCKET_COLUMNS
    from sdbench.analysis.memory import ANALYTICAL_COLUMNS
    from sdbench.bench.jobusage import COLUMNS as JOB_USAGE_COLUMNS
    from sdbench.drawn import DRAWN_COLUMNS
    from sdbench.engine.measure.steptiming import STEP_COLUMNS
    from sdbench.engine.measure.summary import PAIRED_COLUMNS
    from sdbench.simulator import core, forcedcheck, validation
    from sdbench.traces.table import REQUESTS_COLUMNS, TRACE_COLUMNS

    return {
        "simulated_vs_measured.parquet": validation.COLUMNS,
        "verdict.parquet": verdict.COLUMNS,
        "cost.parquet": cost.COLUMNS,
        "energy.parquet": energy.COLUMNS,
        "proposal_length.parquet": proposal.COLUMNS,
        "random_inputs.parquet": randominputs.COLUMNS,
        "temperature.parquet": temperature.COLUMNS,
        "temperature_recommendation.parquet": temperature.RECOMMENDATION_COLUMNS,
        "forced_acceptance.parquet": forced.COLUMNS,
        "sd_gap.parquet": forced.GAP_COLUMNS,
        "forced_check.parquet": forcedcheck.COLUMNS,
        "category_acceptance.parquet": categories.COLUMNS,
        "breakdown.parquet": breakdown.COLUMNS,
        "simulator CSVs": core.WRITTEN_COLUMNS,
        "drawn tables": DRAWN_COLUMNS,
        "steps.parquet": STEP_COLUMNS,
        "summary.parquet (paired)": PAIRED_COLUMNS,
        "memory.parquet (analytical)": ANALYTICAL_COLUMNS,
        "buckets.parquet": BUCKET_COLUMNS,
        "engine_trace.parquet": TRACE_COLUMNS,
        "engine_requests.parquet": REQUESTS_COLUMNS,
        "job usage": JOB_USAGE_COLUMNS,
    }


def names_in_code() -> set[str]:
    """Column-like names the package writes: its string constants, and the keywords of its
    ``frame.assign(name=...)`` and ``dict(name=...)`` calls."""
    import ast

    names: set[str] = set()
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and IDENTIFIER.match(node.value):
                names.add(node.value)
            elif isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called in ("assign", "dict"):
                    names.update(k.arg for k in node.keywords if k.arg)
    return names


TABLE_ROW = re.compile(r"^\|\s*(`[^|]*)\|", re.MULTILINE)


def documented_columns(text: str) -> set[str]:
    """The columns the schema doc's column tables name (their first cells' code spans)."""
    return schema_names("\n".join(TABLE_ROW.findall(text)))


def test_every_declared_column_is_documented_and_every_documented_one_exists() -> None:
    text = SCHEMA.read_text(encoding="utf-8")
    documented = schema_names(text)
    undocumented = {t: [c for c in cols if c not in documented] for t, cols in declared_tables().items()}
    assert not {t: c for t, c in undocumented.items() if c}, f"columns not in docs/schema.md: {undocumented}"
    declared = {c for cols in declared_tables().values() for c in cols}
    ghosts = sorted(documented_columns(text) - declared - names_in_code())
    assert not ghosts, f"docs/schema.md documents columns no code declares or writes: {ghosts}"


def test_the_check_catches_a_renamed_or_invented_column() -> None:
    assert {"num_seqs", "duration_s", "panel"} <= documented_columns(SCHEMA.read_text(encoding="utf-8"))
    assert documented_columns("| `a_b`, `c` | int | x |\n| column | type |\n") == {"a_b", "c"}
    from sdbench.columns import conform

    import pandas as pd
    import pytest

    frame = pd.DataFrame({"speedup": [1.0], "speed": [2.0]})
    with pytest.raises(ValueError, match="t: the table's columns differ from its declaration "
                                         r"\(missing: tokens_per_s; not declared: speed\)"):  # fmt: skip
        conform(frame, ("speedup", "tokens_per_s"), "t")
    assert list(conform(frame, ("speed", "speedup"), "t").columns) == ["speed", "speedup"]
    assert list(conform(pd.DataFrame([]), ("a",), "t").columns) == ["a"]
