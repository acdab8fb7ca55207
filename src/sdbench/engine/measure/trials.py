"""The timed part of a benchmark cell: warm-up, then every ``generate`` call timed in repeated
trials under the quiet-machine guard, giving the cell's requests, calls and summary tables
(schema in docs/schema.md).

It runs on a started engine (:mod:`sdbench.engine.measure.engine`: ``max_num_seqs`` = batch size, prefix
caching off), greedy or at the dataset's temperature with fixed per-sequence seeds
(:mod:`sdbench.engine.measure.sampling`); the SD counters it diffs around each call and the summary row it
ends with are :mod:`sdbench.engine.measure.counters` and :mod:`sdbench.engine.measure.summary`. An engine group's
cells share one engine (:mod:`sdbench.engine.groups`); the commands are in :mod:`sdbench.engine.commands`.
"""

from __future__ import annotations

import json
import logging
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from sdbench.engine.measure.counters import read_counters, request_sd_metrics
from sdbench.engine.measure.engine import Engine, start_engine
from sdbench.engine.site.hardware import provenance
from sdbench.engine.measure.summary import PAIRED_COLUMNS, cell_seed, summarise
from sdbench.engine.release.versions import engine_memory
from sdbench.requesttable import RequestRows

if TYPE_CHECKING:
    from sdbench.engine.measure.progress import Progress

log = logging.getLogger(__name__)


def _select_prompts(prompts: pd.DataFrame, spec: dict[str, Any]) -> pd.DataFrame:
    n = spec["run"].get("num_requests") or len(prompts)
    if n > len(prompts):
        raise ValueError(f"run.num_requests={n} but the prompt set has only {len(prompts)} prompts")
    return prompts.iloc[:n].reset_index(drop=True)


def _calls(prompts: pd.DataFrame, batch_mode: str, batch_size: int) -> list[list[int]]:
    """Row indices of ``prompts`` per timed generate call (replicated or distinct)."""
    if batch_mode == "replicate":
        return [[i] * batch_size for i in range(len(prompts))]
    return [list(range(len(prompts)))]


def _trial_plan(run: dict[str, Any]) -> tuple[int, float, int, float | None]:
    """(minimum trials, minimum timed seconds, maximum trials, target relative half-width) of a cell."""
    repeats = int(run.get("repeats", 1))
    target = run.get("target_half_width")
    return (
        repeats,
        float(run.get("min_measured_s", 0.0)),
        max(repeats, int(run.get("max_repeats", 50))),
        None if target is None else float(target),
    )


def _precise_enough(arms: list[CellRun], target: float | None, seed: int) -> bool:
    """Whether the cell's interval is narrow enough: the paired speedup's with two arms
    (baseline first), the throughput's with one (sdbench.engine.measure.resampling.relative_half_width)."""
    if target is None:
        return True
    from sdbench.engine.measure import resampling as stats

    calls = [pd.DataFrame(arm.call_rows)[["call_index", "trial", "tokens_per_s"]] for arm in arms]
    return stats.relative_half_width(calls, seed) <= target


def run_cell(
    spec: dict[str, Any],
    prompts: pd.DataFrame,
    model_dir: str,
    drafter_dir: str | None,
    steps_dir: str | None = None,
    guard_mode: str = "flag",
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    """Run one cell on its own engine; returns (requests, calls, summary, steps) tables.

    See :func:`measure_cell`. With ``steps_dir`` the run is in breakdown mode
    (sdbench.engine.measure.steptiming): every engine step of the timed calls is timed by stage,
    with device synchronisation; ``steps`` is then one row per step, else ``None``.
    """
    engine = start_engine(spec, model_dir, drafter_dir, steps_dir, prompts={spec["cell"]["dataset"]: prompts})
    return measure_cell(engine, spec, prompts, steps_dir, guard_mode)


def measure_cell(
    engine: Engine,
    spec: dict[str, Any],
    prompts: pd.DataFrame,
    steps_dir: str | None = None,
    guard_mode: str = "flag",
    progress: Progress | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    """Measure one cell on a started engine; returns (requests, calls, summary, steps).

    The timed workload (every prompt once, one ``generate`` call each, replicated
    batch-size times in replicate mode) runs in repeated trials (``run.repeats``,
    ``run.min_measured_s``), watched by the quiet-machine guard (``guard_mode``,
    sdbench.engine.site.quietguard): ``calls`` has one row per call and trial, ``requests`` the
    first trial's sequences (outputs, greedy or sampled with fixed seeds, are checked to be
    identical in every trial). Warm-up (``run.warmup_requests`` calls at the cell's batch size) stays
    outside the timed part. A forced-acceptance cell is forced from its warm-up to its last call
    (sdbench.engine.measure.forcing). With ``progress`` a cell whose job was killed resumes after its
    last saved call (:func:`timed_part`).
    """
    from sdbench.engine.measure.forcing import forced_acceptance, forced_length_of

    with forced_acceptance(engine.llm, forced_length_of(spec)):
        run = CellRun(engine, spec, prompts, steps_dir)
        run.warm_up()
        return run.tables(timed_part([run], spec["run"], guard_mode, progress))


def timed_part(arms: list[CellRun], run: dict[str, Any], guard_mode: str, progress: Progress | None = None) -> Any:
    """Time the arms' calls in trials under one quiet-machine guard; returns the guard's report.

    Several arms (an SD cell and its paired no-SD arm, sdbench.engine.measure.paired) time each call
    one after the other, the order alternating call by call so that no arm always goes
    second. Trials follow ``run.repeats`` / ``run.min_measured_s`` (the slowest arm decides),
    then continue while the interval is wider than ``run.target_half_width`` (relative; of
    ``arms[1] / arms[0]`` with two arms), all within ``run.max_repeats``.

    With ``progress`` (sdbench.engine.measure.progress) the arms' rows are written to the cell's partial
    checkpoint as calls finish, and a cell whose job was killed resumes at the next call: the
    rules above decide on the restored rows as they would have without the interruption.
    """
    from sdbench.engine.site.quietguard import QuietGuard

    check_layouts(arms)
    min_trials, min_seconds, max_trials, target = _trial_plan(run)
    seed = cell_seed(arms[-1].spec)

    def enough(trial: int) -> bool:
        """Whether the rules stop the timed part after ``trial``."""
        return (
            trial + 1 >= min_trials
            and min(arm.timed_s for arm in arms) >= min_seconds
            and _precise_enough(arms, target, seed)
        )

    trial, first_call = progress.resume(arms) if progress is not None else (0, 0)
    guard = QuietGuard(guard_mode)
    guard.start()
    log.info(
        "timed part: %d to %d trial(s), at least %.1f s, half-width target %s, %d arm(s)",
        min_trials,
        max_trials,
        min_seconds,
        target,
        len(arms),
    )
    # Resumed just after a trial's last call: the rules had not yet decided on that trial.
    done = first_call == 0 and trial > 0 and enough(trial - 1)
    while not done and trial < max_trials:
        for call_index in range(first_call, arms[0].num_calls):
            order = arms if (trial + call_index) % 2 == 0 else arms[::-1]
            for arm in order:
                arm.time_call(trial, call_index)
            if progress is not None:
                progress.after_call(arms, trial, call_index, guard)
        first_call = 0
        done = enough(trial)
        trial += 1
    log.info("timed part: %d trial(s)", trial)
    # Raises Contaminated in refuse mode (the engine processes before a resume included).
    return guard.stop(progress.earlier if progress is not None else ())


def check_layouts(arms: list[CellRun]) -> None:
    """Refuse to time arms of one speedup whose engines run in different process layouts."""
    layouts = {arm.engine.layout for arm in arms}
    if len(layouts) > 1:
        cell = arms[-1].spec["cell"]
        name = "/".join(str(cell[k]) for k in ("engine", "model", "dataset", "method")) + f"/bs{cell['batch_size']}"
        described = ", ".join(f"{arm.spec['cell']['method']}: {arm.engine.layout}" for arm in arms)
        raise RuntimeError(f"cell {name}: the arms of its speedup run in different process layouts ({described})")


class CellRun:
    """One cell's timed workload on a started engine, one ``generate`` call at a time.

    Calls are timed one by one so that two engines (an SD engine and its paired no-SD
    baseline, :mod:`sdbench.engine.measure.paired`) can interleave theirs.
    """

    def __init__(self, engine: Engine, spec: dict[str, Any], prompts: pd.DataFrame, steps_dir: str | None = None):
        from sdbench.engine.measure.sampling import call_sampling_params, temperature

        self.engine, self.spec, self.steps_dir = engine, spec, steps_dir
        self.prompts = _select_prompts(prompts, spec)
        run = spec["run"]
        self.batch_size = int(spec["cell"]["batch_size"])
        # Greedy with one budget: one SamplingParams for every call. Sampled, or per-request
        # budgets (the prompt table's max_tokens): built per call.
        self.budgets = [int(b) for b in self.prompts["max_tokens"]] if "max_tokens" in self.prompts else None
        self.greedy = temperature(spec) == 0
        uniform = self.budgets is None or len(set(self.budgets)) == 1
        self.sampling = call_sampling_params(spec, [], self.budgets[:1] if self.budgets else None) \
            if self.greedy and uniform else None
        self.plan = _calls(self.prompts, run.get("batch_mode", "replicate"), self.batch_size)
        self.num_calls = len(self.plan)
        # Trial 0's sequences (sdbench.requesttable: no prompt ids, a call's equal outputs once).
        self.request_rows = RequestRows()
        self.call_rows: list[dict[str, Any]] = []
        self.first_rows: dict[int, int] = {}  # call -> the row of its slot 0 in request_rows
        self.outputs_stable = True
        self.timed_s = 0.0
        self.warmup_s = 0.0
        self.warmup_steps = 0
        # Times the timed part was resumed in a new engine process (sdbench.engine.measure.progress).
        self.num_resumes = 0

    def _sampling_for(self, rows: list[int]) -> Any:
        """Sampling parameters of a call over prompt rows ``rows`` (sdbench.engine.measure.sampling)."""
        if self.sampling is not None:
            return self.sampling
        from sdbench.engine.measure.sampling import call_sampling_params

        budgets = [self.budgets[i] for i in rows] if self.budgets else None
        return call_sampling_params(self.spec, [str(self.prompts.at[i, "request_id"]) for i in rows], budgets)

    def _call_prompts(self, rows: list[int]) -> list[Any]:
        """One engine prompt per row of a call (each its own object, as distinct requests are),
        each table row looked up once: a replicated call repeats one row batch-size times."""
        ids = {i: self.prompts.at[i, "prompt_token_ids"] for i in dict.fromkeys(rows)}
        return [self.engine.prompt(ids[i]) for i in rows]

    def warm_up(self) -> None:
        """``run.warmup_requests`` untimed calls at the cell's batch size."""
        warmup = min(int(self.spec["run"].get("warmup_requests", 1)), len(self.prompts))
        clock = self.engine.clock
        t_warm = clock()
        for i in range(warmup):
            rows = [i] * self.batch_size
            self.engine.llm.generate(self._call_prompts(rows), self._sampling_for(rows), use_tqdm=False)
        self.warmup_s = clock() - t_warm
        self.warmup_steps = _steps_so_far(self.steps_dir)

    def time_call(self, trial: int, call_index: int) -> float:
        """Time one generate call of the plan; record its row (and, in trial 0, its sequences)."""
        llm, prompts = self.engine.llm, self.prompts
        rows = self.plan[call_index]
        sampling = self._sampling_for(rows)
        # Built before the clock starts: converting a batch of 32k-token prompts to Python ints takes
        # tenths of a second, which neither arm's engine spends on the GPU.
        call_prompts = self._call_prompts(rows)
        before = read_counters(llm.get_metrics())
        e0 = self.engine.meter.read()  # joules (sdbench.engine.measure.energy; NaN without a meter)
        d0 = getattr(self.engine.meter, "dram_j", math.nan)  # its DRAM part (RAPL dram domains)
        t0 = self.engine.clock()
        outputs = llm.generate(call_prompts, sampling, use_tqdm=False)
        duration = self.engine.clock() - t0
        energy_j = self.engine.meter.read() - e0
        dram_j = getattr(self.engine.meter, "dram_j", math.nan) - d0
        delta = read_counters(llm.get_metrics()) - before
        self.timed_s += duration
        n_out = 0
        first_row = self.first_rows.get(call_index)  # None in the call's first trial
        if first_row is None:
            self.first_rows[call_index] = len(self.request_rows)
        for slot, (row, out) in enumerate(zip(rows, outputs, strict=True)):
            completion = out.outputs[0]
            tokens = np.asarray(completion.token_ids, dtype=np.int32)
            n_out += len(tokens)
            if first_row is not None:
                self.outputs_stable &= np.array_equal(self.request_rows.output(first_row + slot), tokens)
                continue
            self.request_rows.add(
                call_index,
                slot,
                str(prompts.at[row, "request_id"]),
                tokens,
                completion.text or "",
                len(prompts.at[row, "prompt_token_ids"]),
                str(completion.finish_reason),
                request_sd_metrics(completion),
            )
        self.call_rows.append(
            {
                "trial": trial,
                "call_index": call_index,
                "request_id": str(prompts.at[rows[0], "request_id"]) if len(set(rows)) == 1 else "*",
                "num_seqs": len(rows),
                "duration_s": duration,
                "num_output_tokens": n_out,
                "tokens_per_s": n_out / duration,
                "energy_j": energy_j,
                "energy_meter": self.engine.meter.kind,
                "energy_reason": getattr(self.engine.meter, "reason", ""),
                "energy_dram_j": dram_j,
                "num_drafts": delta.num_drafts,
                "num_draft_tokens": delta.num_draft_tokens,
                "num_accepted_tokens": delta.num_accepted_tokens,
                "accepted_per_pos": list(delta.accepted_per_pos),
                "num_preemptions": delta.num_preemptions,
            }
        )
        return duration

    def tables(
        self, guard_report: Any
    ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
        """(requests, calls, summary, steps) of the calls timed so far."""
        spec, engine = self.spec, self.engine
        keys = {k: spec["cell"][k] for k in ("engine", "model", "dataset", "method", "batch_size")}
        steps = None
        if self.steps_dir is not None:
            from sdbench.engine.measure.steptiming import read_step_dir

            steps = read_step_dir(self.steps_dir).iloc[self.warmup_steps :].reset_index(drop=True)
            for i, (k, v) in enumerate(keys.items()):
                steps.insert(i, k, v)
            steps.insert(len(keys), "sd_method", spec["method"]["method"])
            steps["measured"] = engine.measured
        requests = self.request_rows.frame()
        calls = pd.DataFrame(self.call_rows)
        for frame in (requests, calls):
            for i, (k, v) in enumerate(keys.items()):
                frame.insert(i, k, v)
        # A stand-in engine's times are modelled: its tables say so (sdbench.rehearsal).
        requests["measured"] = engine.measured
        calls = calls.assign(contaminated=guard_report.contaminated, measured=engine.measured)
        summary = summarise(keys, spec, calls, requests)
        summary = summary.assign(
            engine_shared_by=engine.shared_by,
            engine_layout=engine.layout,
            outputs_stable=self.outputs_stable,
            resumed=self.num_resumes > 0,
            num_resumes=self.num_resumes,
            **guard_report.columns(),
            drafter=spec.get("drafter") or "",
            startup_s=engine.startup_s,
            warmup_s=self.warmup_s,
            **engine_memory(engine.llm),
            speculative_config=json.dumps(engine.kwargs.get("speculative_config"), sort_keys=True),
            **provenance(gpus=engine.measured and self.spec.get("engine", {}).get("device") != "cpu",
                         rehearsal=not engine.measured),
            **{c: np.nan for c in PAIRED_COLUMNS},  # set by sdbench.engine.measure.paired when paired
            paired_baseline_num_preemptions=0,
            # The paired no-SD arm's engine start and warm-up (sdbench.bench.timeline's breakdown).
            paired_baseline_startup_s=np.nan,
            paired_baseline_warmup_s=np.nan,
            # A rehearsal's modelled seconds of this cell on its engine: warm-up and timed calls
            # (sdbench.engine.measure.paired adds the no-SD arm's); NaN when measured.
            modelled_s=np.nan if engine.measured else self.warmup_s + self.timed_s,
        )
        return requests, calls, summary, steps


def _steps_so_far(steps_dir: str | None) -> int:
    if steps_dir is None:
        return 0
    from sdbench.engine.measure.steptiming import read_step_dir

    return len(read_step_dir(steps_dir))


# ----------------------------------------------------------------------------- touchpoints
from sdbench.engine.release import touchpoints as tp  # noqa: E402 - standard library only


def _row_truncations(src: tp.SourceTree, target: str) -> list[int]:
    """Lines of ``target`` that cut the rows parse_output returned (``rows[i] = row[:1]``, ...)."""
    import ast

    fn = src.find(target)
    if fn is None:
        return []
    rows: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                tp.call_name(node.value).endswith("parse_output"):
            for t in node.targets:
                elts = t.elts if isinstance(t, ast.Tuple) else [t]
                if elts and isinstance(elts[0], ast.Name):
                    rows.add(elts[0].id)
    lines = []
    for node in ast.walk(fn):
        if not isinstance(node, ast.Assign):
            continue
        cut = any(isinstance(v, ast.Subscript) and isinstance(v.slice, ast.Slice) for v in ast.walk(node.value))
        for t in node.targets:
            name = t.value if isinstance(t, ast.Subscript) else t
            if cut and isinstance(name, ast.Name) and name.id in rows:
                lines.append(node.lineno)
    return sorted(lines)


def _check_commits_accepted(src: tp.SourceTree) -> str | None:
    """Timed cells measure SD only if the runner commits every accepted token of a step: no
    method that reads the rejection sampler's rows may cut them (a tracing build does)."""
    runner = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
    cls = src.find(runner)
    if cls is None:
        return f"{runner} not found"
    for method in [n.name for n in getattr(cls, "body", []) if hasattr(n, "args")]:
        lines = _row_truncations(src, f"{runner}.{method}")
        if lines:
            return (f"GPUModelRunner.{method} cuts the accepted rows at line {lines[0]}: one token per step "
                    "(a tracing build), timed SD cells would show no speedup")
    return None


TOUCHPOINTS = tp.declare(
    __name__,
    tp.custom("timing.commits_accepted", _check_commits_accepted,
              ["vllm.v1.worker.gpu_model_runner:GPUModelRunner"]),
    tp.defined("llm.generate", "vllm:LLM.generate", ["prompts", "sampling_params", "use_tqdm"]),
    tp.fields("llm.tokens_prompt", "vllm.inputs:TokensPrompt", ["prompt_token_ids"]),
    tp.fields("llm.completion_output", "vllm.outputs:CompletionOutput", ["token_ids", "text", "finish_reason"]),
)
