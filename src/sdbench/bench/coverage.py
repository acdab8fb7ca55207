"""``sdbench bench coverage``: do the 95% intervals cover 95%? A simulation where the truth is known.

Synthetic measurements from a generative model with the levels a real run has, through the
package's own interval functions: the bootstrap the measurement records today
(:func:`sdbench.engine.measure.resampling.paired_bootstrap` offline, the server table's start /
round / request bootstrap :func:`sdbench.analysis.goodput.resample_weights` with
:func:`sdbench.analysis.stats.ratio_interval`) against the interval at the level that varies
(:mod:`sdbench.analysis.intervals`). For each design it reports how often the interval holds the
true speedup (coverage) and how often an A/A comparison (both arms no SD: true speedup 1) is
judged ``pays`` or ``loses`` (false verdicts), over ``--runs`` simulated runs.

The model of one call's log tokens per second (arm a, engine start s, trial t, prompt p):

    log y = log(truth if a is SD else 1) + prompt_p + process_s + instance_(s,a) + trial noise

``process_s`` (``--process-sd``) is shared by the engines of one process (paired arms share it;
unpaired arms run in processes of their own, so each arm has its own), ``instance_(s,a)``
(``--instance-sd``) is an engine instance's own factor that pairing cannot cancel, and trial noise
(``--trial-sd``) is per call. Server mode: one round per (start, round), its tokens per second
drawn the same way with ``--round-sd`` as the round's noise and the requests' output lengths
fixed (greedy: both arms emit the same tokens). Defaults are this project's measured spreads on
a 2-core VM: no-SD arms of one batch-1 cell ran 489-545 tok/s from one process to the next
(about 4% sd), calls within a process a few percent.

A benchmark, not a test: it prints a table and asserts nothing (the fast tier checks it on a few
runs). Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sdbench.analysis import intervals
from sdbench.analysis.goodput import resample_weights
from sdbench.analysis.stats import interval, paired_bootstrap, ratio_interval
from sdbench.analysis.stats import bootstrap as trial_bootstrap
from sdbench.io import write_parquet, write_text


@dataclass(frozen=True)
class Design:
    """One replicated design: ``starts`` engine processes (server starts) per arm, ``trials`` timed
    trials (rounds) in each, ``paired``: both arms in one process (server: interleaved, drawn jointly)."""

    name: str
    mode: str  # "offline" or "server"
    paired: bool
    starts: int
    trials: int
    prompts: int = 8


@dataclass(frozen=True)
class Spreads:
    """Standard deviations of the model's log-scale levels (module docstring)."""

    process: float = 0.04
    instance: float = 0.03
    trial: float = 0.03
    prompt: float = 0.3
    round: float = 0.02


# The shipped designs before this study (default: paired, 1 start, 3 trials; paper: unpaired, 1
# start, 1 trial; server: 2 starts x 1 round per arm, interleaved) and the replicated ones after.
DESIGNS = (
    Design("default (1 start x 3 trials, paired)", "offline", True, 1, 3),
    Design("paper (1 start x 1 trial, unpaired)", "offline", False, 1, 1),
    Design("server (2 starts x 1 round, interleaved)", "server", True, 2, 1),
    Design("3 starts x 1 trial, paired", "offline", True, 3, 1),
    Design("4 starts x 1 trial, paired", "offline", True, 4, 1),
    Design("3 starts x 1 trial, unpaired", "offline", False, 3, 1),
    Design("server 4 starts x 1 round, interleaved", "server", True, 4, 1),
)
BEFORE, AFTER = "bootstrap (before)", "t at the start level (after)"


def _offline_calls(rng: np.random.Generator, d: Design, sp: Spreads, truth: float) -> tuple[pd.DataFrame, ...]:
    """The SD arm's and the no-SD arm's calls tables (engine_start, call_index, trial, tokens_per_s)."""
    prompt = rng.normal(0, sp.prompt, d.prompts) + math.log(500.0)
    shared = rng.normal(0, sp.process, d.starts)
    arms = []
    for log_truth in (math.log(truth), 0.0):
        process = shared if d.paired else rng.normal(0, sp.process, d.starts)
        instance = rng.normal(0, sp.instance, d.starts)
        s, t, p = (a.ravel() for a in np.meshgrid(range(d.starts), range(d.trials), range(d.prompts), indexing="ij"))
        log_y = log_truth + prompt[p] + process[s] + instance[s] + rng.normal(0, sp.trial, s.size)
        arms.append(pd.DataFrame({"engine_start": s, "trial": t, "call_index": p, "tokens_per_s": np.exp(log_y)}))
    return tuple(arms)


def _offline(rng: np.random.Generator, d: Design, sp: Spreads, truth: float, seed: int,
             resamples: int) -> dict[str, intervals.Interval]:  # fmt: skip
    sd, base = _offline_calls(rng, d, sp, truth)
    if d.starts == 1:  # as the measurement records it: no engine_start column
        sd, base = sd.drop(columns="engine_start"), base.drop(columns="engine_start")
    if d.paired:
        low, high = interval(paired_bootstrap(sd, base, seed, resamples))
        after = intervals.replicate_interval(intervals.paired_start_log_ratios(sd, base))
    else:
        low, high = ratio_interval(trial_bootstrap(sd, seed, resamples), trial_bootstrap(base, seed + 1, resamples))
        after = intervals.welch_interval(intervals.start_log_throughputs(sd), intervals.start_log_throughputs(base))
    before = intervals.Interval(math.nan, low, high, d.starts, math.nan)
    return {BEFORE: before, AFTER: after}


def _server(rng: np.random.Generator, d: Design, sp: Spreads, truth: float, seed: int,
            resamples: int) -> dict[str, intervals.Interval]:  # fmt: skip
    """One round per (start, trial) per arm, ``prompts`` requests each with fixed output lengths."""
    lengths = rng.integers(64, 256, d.prompts).astype(float)
    shared = rng.normal(0, sp.process, d.starts)  # interleaved starts share a slow period
    rounds = np.repeat(np.arange(d.starts * d.trials), d.prompts)
    round_start = [s for s in range(d.starts) for _ in range(d.trials)]
    tokens = np.tile(lengths, d.starts * d.trials)
    draws, per_start = [], []
    for log_truth in (math.log(truth), 0.0):
        instance = rng.normal(0, math.hypot(sp.instance, 0.0 if d.paired else sp.process), d.starts)
        log_tps = [log_truth + math.log(2000.0) + shared[s] + instance[s] + rng.normal(0, sp.round)
                   for s in round_start]  # fmt: skip
        walls = [lengths.sum() / math.exp(x) for x in log_tps]
        weights, wall = resample_weights(rounds, walls, seed + len(draws), resamples, round_start=round_start,
                                         start_seed=seed)  # fmt: skip
        draws.append(weights @ tokens / wall)
        walls_s = np.asarray(walls).reshape(d.starts, d.trials).sum(axis=1)
        per_start.append(np.log(lengths.sum() * d.trials / walls_s))
    low, high = ratio_interval(draws[0], draws[1])
    after = intervals.replicate_interval(per_start[0] - per_start[1]) if d.paired \
        else intervals.welch_interval(per_start[0], per_start[1])  # fmt: skip
    return {BEFORE: intervals.Interval(math.nan, low, high, d.starts, math.nan), AFTER: after}


def study(designs: tuple[Design, ...] = DESIGNS, runs: int = 200, truths: tuple[float, ...] = (1.0, 1.2),
          spreads: Spreads = Spreads(), seed: int = 0, resamples: int = 400,
          margin: float = intervals.DEFAULT_MARGIN) -> pd.DataFrame:  # fmt: skip
    """Per design x method x true speedup: coverage of the 95% interval, share judged, verdict shares."""
    rows = []
    for di, d in enumerate(designs):
        for ti, truth in enumerate(truths):
            rng = np.random.default_rng([seed, di, ti])
            found: dict[str, list[intervals.Interval]] = {BEFORE: [], AFTER: []}
            for run in range(runs):
                measure = _offline if d.mode == "offline" else _server
                for method, iv in measure(rng, d, spreads, truth, seed * 100_003 + run, resamples).items():
                    found[method].append(iv)
            for method, ivs in found.items():
                judged = [iv for iv in ivs if iv.judged]
                words = [intervals.judge(iv.low, iv.high, margin) for iv in ivs]
                covered = [iv.low <= truth <= iv.high for iv in judged]
                rows.append({
                    "design": d.name, "mode": d.mode, "paired": d.paired, "starts": d.starts, "trials": d.trials,
                    "method": method, "true_speedup": truth, "runs": runs,
                    "judged": len(judged) / runs,
                    "coverage": float(np.mean(covered)) if covered else math.nan,
                    **{f"share_{w.replace(' ', '_').replace('-', '_')}": words.count(w) / runs
                       for w in intervals.VERDICTS},
                    "median_half_width": float(np.median([(iv.high - iv.low) / 2 for iv in judged]))
                    if judged else math.nan,
                })  # fmt: skip
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame, spreads: Spreads) -> str:
    """The study as a Markdown table: A/A rows give the false-verdict rate (pays + loses)."""
    t = table.assign(false_verdicts=table["share_pays"] + table["share_loses"])
    lines = [f"Spreads (log sd): process {spreads.process}, instance {spreads.instance}, trial {spreads.trial}, "
             f"round {spreads.round}; {int(t['runs'].iloc[0])} runs per row.", "",
             "| design | interval | true speedup | judged | coverage | false verdicts (A/A) | pays | loses | even "
             "| undecided | median half-width |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in t.itertuples():
        false = f"{r.false_verdicts:.1%}" if r.true_speedup == 1.0 else ""
        cov = "none" if math.isnan(r.coverage) else f"{r.coverage:.1%}"
        lines.append(f"| {r.design} | {r.method} | {r.true_speedup:g} | {r.judged:.0%} | {cov} | {false} "
                     f"| {r.share_pays:.1%} | {r.share_loses:.1%} | {r.share_break_even:.1%} | {r.share_undecided:.1%} "
                     f"| {r.median_half_width:.3f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _cmd_bench_coverage(args: argparse.Namespace) -> int:
    spreads = Spreads(args.process_sd, args.instance_sd, args.trial_sd, round=args.round_sd)
    table = study(runs=args.runs, spreads=spreads, seed=args.seed, resamples=args.resamples, margin=args.margin)
    text = markdown(table, spreads)
    print(text, end="")
    if args.output:
        write_parquet(table, args.output)
    if args.markdown:
        write_text(text, args.markdown)
    return 0
