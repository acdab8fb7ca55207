"""Reports built on simulations: compat vs exact mode (each correction alone), and the causal
policies against the best fixed policy and oracle-combine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from sdbench.simulator.compat import COMPAT_NUM_REQUESTS, COMPAT_SEED
from sdbench.simulator.core import (
    DEFAULT_BATCH_SIZES,
    PAPER_POLICIES,
    _training_arrays,
    prepare,
    simulate_prepared,
    sort_results,
)
from sdbench.simulator.costmodel import CostModel
from sdbench.simulator.policytypes import COMPAT, EXACT, PROPOSERS, Fidelity
from sdbench.simulator.tracesets import TraceSet, with_ngram_proposals
from sdbench.simulator.choices import ADAPTIVE_SPECS


# Each correction of exact mode alone on top of compat, then all of them (exact).
COMPARE_VARIANTS: dict[str, Fidelity] = {
    "compat": COMPAT,
    "+ngram_proposals": replace(COMPAT, true_ngram_proposals=True),
    "+aligned_positions": replace(COMPAT, aligned_positions=True),
    "+drafter_cost": replace(COMPAT, drafter_cost=True),
    "+batch_draft_cost": replace(COMPAT, batch_draft_cost=True),
    "exact": EXACT,
}
# The published simulator's grid: fixed-1/3/5 and oracle for EAGLE and n-gram, the combined oracle.
PAPER_GRID: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("eagle", PAPER_POLICIES),
    ("ngram", PAPER_POLICIES),
    ("combined", ("oracle",)),
)


def compare_modes(
    trace_sets: Sequence[TraceSet],
    cm: CostModel,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    *,
    continuous: bool = True,
    num_requests: int = COMPAT_NUM_REQUESTS,
    seed: int = COMPAT_SEED,
) -> pd.DataFrame:
    """Speedup of the paper's grid under each :data:`COMPARE_VARIANTS` fidelity (one column each),
    plus exact mode with continuous batching (``exact_continuous``)."""
    frames = []
    for ts in trace_sets:
        ts = with_ngram_proposals(ts)
        for proposer, policies in PAPER_GRID:
            prep = prepare(ts, proposer, num_requests=num_requests, seed=seed)
            for variant, fidelity in COMPARE_VARIANTS.items():
                frames.append(simulate_prepared(prep, policies, batch_sizes, cm, fidelity, mode=variant))
            if continuous:
                frames.append(
                    simulate_prepared(
                        prep, policies, batch_sizes, cm, EXACT, mode="exact_continuous", batching="continuous"
                    )
                )
    long = pd.concat(frames, ignore_index=True)
    keys = ["dataset", "proposer", "policy", "batch_size"]
    wide = long.pivot_table(index=keys, columns="mode", values="speedup", sort=False).reset_index()
    order = [*COMPARE_VARIANTS, *(["exact_continuous"] if continuous else [])]
    wide.columns.name = None
    return sort_results(wide[keys + order])


# ----------------------------------------------------------------------------- adaptive policies
FIXED_GRID: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("eagle", ("fixed-1", "fixed-3", "fixed-5")),
    ("ngram", ("fixed-1", "fixed-3", "fixed-5")),
)


def _parse_spec(spec: str) -> tuple[str, str]:
    proposer, sep, policy = spec.partition(":")
    if not sep or proposer not in PROPOSERS:
        raise ValueError(f"policy spec {spec!r} is not <proposer>:<policy> with proposer in {', '.join(PROPOSERS)}")
    return proposer, policy


def adaptive_report(
    trace_sets: Sequence[TraceSet],
    cm: CostModel,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    specs: Sequence[str] = ADAPTIVE_SPECS,
    *,
    batching: str = "replicated",
    train_sets: Sequence[TraceSet] | None = None,
    num_requests: int = COMPAT_NUM_REQUESTS,
    seed: int = COMPAT_SEED,
) -> pd.DataFrame:
    """Causal policies against the best fixed policy (EAGLE or n-gram, fixed-1/3/5) and
    oracle-combine, exact mode: one row per (dataset, batch size, policy) with ``gap_closed`` =
    (policy - best fixed) / (oracle-combine - best fixed). Trained policies train on the other
    trace sets (or ``train_sets``)."""
    parsed = [_parse_spec(s) for s in specs]
    trace_sets = [with_ngram_proposals(ts) for ts in trace_sets]
    train_sets = None if train_sets is None else [with_ngram_proposals(ts) for ts in train_sets]
    rows = []
    for ts in trace_sets:
        preps = {p: prepare(ts, p, num_requests=num_requests, seed=seed) for p in PROPOSERS}
        run = lambda proposer, policies, train=(): simulate_prepared(  # noqa: E731
            preps[proposer], policies, batch_sizes, cm, EXACT, batching=batching, mode="exact", train=train
        )
        fixed = pd.concat([run(p, pols) for p, pols in FIXED_GRID], ignore_index=True)
        best = fixed.loc[fixed.groupby("batch_size")["speedup"].idxmax()].set_index("batch_size")
        oracle = run("combined", ["oracle-combine"]).set_index("batch_size")["speedup"]
        for proposer, policy in parsed:
            train = _training_arrays(ts, trace_sets, train_sets, proposer, None, [policy], EXACT, num_requests)
            res = run(proposer, [policy], train).set_index("batch_size")
            for b in batch_sizes:
                bf, oc, sp = best.loc[b, "speedup"], oracle.loc[b], res.loc[b, "speedup"]
                rows.append(
                    {
                        "dataset": ts.dataset,
                        "batch_size": int(b),
                        "policy": f"{proposer}:{policy}",
                        "speedup": sp,
                        "best_fixed": bf,
                        "best_fixed_policy": f"{best.loc[b, 'proposer']}:{best.loc[b, 'policy']}",
                        "oracle_combine": oc,
                        "vs_best_fixed": sp / bf,
                        "gap_closed": (sp - bf) / (oc - bf) if oc > bf else float("nan"),
                    }
                )
    return pd.DataFrame(rows).sort_values(["dataset", "policy", "batch_size"], kind="stable").reset_index(drop=True)


def adaptive_summary(report: pd.DataFrame) -> pd.DataFrame:
    """Gap closed per (dataset, batch size) for each policy (columns), with a per-dataset mean row
    and the worst ratio to the best fixed policy."""
    wide = report.pivot_table(index=["dataset", "batch_size"], columns="policy", values="gap_closed", sort=False)
    means = report.groupby(["dataset", "policy"])["gap_closed"].mean().unstack("policy")
    means.index = pd.MultiIndex.from_tuples([(d, "mean") for d in means.index], names=["dataset", "batch_size"])
    worst = report.groupby(["dataset", "policy"])["vs_best_fixed"].min().unstack("policy")
    worst.index = pd.MultiIndex.from_tuples(
        [(d, "min vs best fixed") for d in worst.index], names=["dataset", "batch_size"]
    )
    # Three decimals for the worst ratio: "1.00" must not hide a 0.4% loss.
    worst = worst.map(lambda v: f"{v:.3f}")
    out = pd.concat([wide.astype(object), means.astype(object), worst.astype(object)])
    out = out.reset_index()
    out["_o"] = out["batch_size"].map(lambda b: (0, b) if isinstance(b, (int, np.integer)) else (1, str(b)))
    out = out.sort_values(["dataset", "_o"], kind="stable").drop(columns="_o").reset_index(drop=True)
    out.columns.name = None
    return out
