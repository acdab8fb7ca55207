"""Commands of the trace stage: ``sdbench trace {ngram,suffix,published,stack}`` and ``sdbench fetch``.

Argument parsing only (argparse and the standard library); each command's implementation is
imported when it runs (:mod:`sdbench.lazy`).
"""

from __future__ import annotations

import argparse

from sdbench.cliargs import add_output_table
from sdbench.lazy import lazy
from sdbench.traces.fetch import DEFAULT_TIMEOUT, PUBLISHED_MODEL, PUBLISHED_SHA256


def add_trace(subparsers: argparse._SubParsersAction) -> None:
    """Add ``trace {ngram,suffix,published,stack}``."""
    trace = subparsers.add_parser("trace", help="build per-position acceptance trace tables")
    sub = trace.add_subparsers(dest="trace_command", required=True)

    ngram = sub.add_parser("ngram", help="replay vLLM's n-gram proposer over greedy outputs")
    ngram.add_argument("--input", required=True, help="published-trace .jsonl or requests .parquet")
    ngram.add_argument("--prompts", default=None, help="the prompt table of a requests .parquet (its prompt ids)")
    add_output_table(ngram, "the trace table")
    ngram.add_argument("--num-speculative-tokens", type=int, default=20)
    ngram.add_argument("--prompt-lookup-min", type=int, default=3)
    ngram.add_argument("--prompt-lookup-max", type=int, default=7)
    ngram.set_defaults(func=lazy("sdbench.traces.table", "_cmd_trace_ngram"))

    suffix = sub.add_parser("suffix", help="replay SuffixDecoding (vLLM method suffix) over greedy outputs")
    suffix.add_argument("--input", required=True, help="published-trace .jsonl or requests .parquet")
    suffix.add_argument("--prompts", default=None, help="the prompt table of a requests .parquet (its prompt ids)")
    add_output_table(suffix, "the trace table")
    suffix.add_argument("--num-speculative-tokens", type=int, default=20)
    # Defaults: vLLM 0.11.1's suffix_decoding_* (sdbench.traces.suffix; not imported here).
    suffix.add_argument("--max-tree-depth", type=int, default=24)
    suffix.add_argument("--max-spec-factor", type=float, default=1.0)
    suffix.add_argument("--min-token-prob", type=float, default=0.1)
    suffix.add_argument("--max-cached-requests", type=int, default=10000, help="0 disables the global tree")
    suffix.add_argument("--method", default="suffix", help="value of the trace table's method column")
    suffix.set_defaults(func=lazy("sdbench.traces.table", "_cmd_trace_suffix"))

    published = sub.add_parser("published", help="convert a published-trace .jsonl (ngram + eagle)")
    published.add_argument("--input", required=True, help="combined_<dataset>.jsonl")
    add_output_table(published, "the trace table")
    published.set_defaults(func=lazy("sdbench.traces.table", "_cmd_trace_published"))

    stack = sub.add_parser("stack", help="concatenate trace tables (e.g. one per method) into one")
    stack.add_argument("--inputs", nargs="+", required=True, help="trace table .parquet files")
    add_output_table(stack, "the trace table")
    stack.set_defaults(func=lazy("sdbench.traces.table", "_cmd_trace_stack"))


def add_fetch(subparsers: argparse._SubParsersAction) -> None:
    """Add ``fetch published-traces``."""
    fetch = subparsers.add_parser("fetch", help="download pinned external inputs")
    sub = fetch.add_subparsers(dest="fetch_command", required=True)
    pub = sub.add_parser(
        "published-traces", help=f"the paper's {PUBLISHED_MODEL} acceptance traces (sha256-checked)"
    )
    pub.add_argument("--dataset", required=True, choices=sorted(PUBLISHED_SHA256))
    pub.add_argument("--output", required=True, help="where to write combined_<dataset>.jsonl")
    pub.add_argument("--local-dir", default=None, help="directory to copy from if it has the file")
    pub.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds to wait for the server to connect / send (default {DEFAULT_TIMEOUT:g})",
    )
    pub.set_defaults(func=lazy("sdbench.traces.fetch", "_cmd_fetch_published"))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the trace stage's commands: ``trace`` and ``fetch``."""
    add_trace(subparsers)
    add_fetch(subparsers)
