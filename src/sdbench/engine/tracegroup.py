"""In-engine acceptance traces: one method's cells on several prompt sets, on one tracing engine.

Apart from the timed part because nothing here is timed: the engine commits one token per step
and records, per step, how many drafted tokens the target would accept
(:mod:`sdbench.engine.release.acceptancetrace`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from sdbench.engine.measure.engine import build_llm_kwargs, start_rehearsal_engine
from sdbench.engine.site.hardware import job_env
from sdbench.engine.measure.trials import _select_prompts
from sdbench.engine.release.versions import apply_env, engine_env


def _match_trace_ids(output_ids: list[str], traced: dict[str, Any]) -> dict[str, str]:
    """Output request id -> engine-internal id (vLLM >= 0.32 appends ``-<random>`` internally)."""
    mapping: dict[str, str] = {}
    for out_id in output_ids:
        hits = [k for k in traced if k == out_id or k.startswith(f"{out_id}-")]
        if len(hits) != 1:
            raise RuntimeError(f"trace mode: request {out_id!r} matched {len(hits)} traced ids")
        mapping[out_id] = hits[0]
    return mapping


def trace_group(
    specs: list[dict[str, Any]],
    prompts: dict[str, pd.DataFrame],
    model_dir: str,
    drafter_dir: str | None,
    num_speculative_tokens: int,
    max_num_seqs: int,
    trace_dir: str,
    totals: dict[str, float] | None = None,
    on_dataset: Callable[[str, tuple[pd.DataFrame, pd.DataFrame]], None] | None = None,
) -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
    """In-engine acceptance traces of one method on several prompt sets, on one engine
    (see sdbench.engine.release.acceptancetrace).

    ``specs`` are the method's resolved cells, one per dataset, and ``prompts`` their prompt
    tables by dataset. The engine proposes up to ``num_speculative_tokens`` per step but
    commits one token per step, so outputs equal plain greedy decoding. Returns, per
    dataset, (trace table, requests). The cells must need the same engine (``ValueError``
    naming the first dataset that does not): only the prompts and output lengths differ. A
    rehearsal spec traces on the rehearsal engine (sdbench.rehearsal), whose modelled start-up and
    generate seconds go into ``totals``; every table says whether it was measured. ``on_dataset``
    gets each dataset's tables as soon as they are traced (the command keeps them).
    """
    from sdbench.engine.release.acceptancetrace import ENV_TRACE_DIR, read_trace_dir
    from sdbench.traces.records import MethodTrace, make_trace_table

    specs = [json.loads(json.dumps(s)) for s in specs]  # private copies
    for spec in specs:
        spec["method"]["num_speculative_tokens"] = num_speculative_tokens
        spec["cell"]["batch_size"] = max_num_seqs
    first = specs[0]
    engine_kwargs = build_llm_kwargs(first, model_dir, drafter_dir)
    for spec in specs[1:]:
        if build_llm_kwargs(spec, model_dir, drafter_dir) != engine_kwargs:
            raise ValueError(
                f"trace group of {first['cell']['method']}: dataset {spec['cell']['dataset']!r} needs "
                f"other engine arguments than {first['cell']['dataset']!r}"
            )
    from sdbench.rehearsal import is_rehearsal

    measured = not is_rehearsal(first)
    if measured:
        os.environ[ENV_TRACE_DIR] = trace_dir
        apply_env(job_env(first["engine"], int(first["model"].get("tensor_parallel_size", 1))))
        apply_env(engine_env(first["engine"], first["method"]))
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        # Synchronous steps: with async scheduling the runner hands back the committed rows a step
        # later (empty in _bookkeeping_sync), and the trace would have no rows to record.
        llm = LLM(**{**engine_kwargs, "seed": first["seed"], "async_scheduling": False})
    else:  # the rehearsal engine writes the trace plugin's records itself
        from sdbench import rehearsal

        SamplingParams, TokensPrompt = rehearsal.module("llm").SamplingParams, rehearsal.module("llm").TokensPrompt  # noqa: N806

        engine = start_rehearsal_engine(first, model_dir, drafter_dir, prompts, max_num_seqs=max_num_seqs,
                                        trace_dir=trace_dir)  # fmt: skip
        llm = engine.llm
    method = first["method"]["method"]
    out: dict[str, tuple[pd.DataFrame, pd.DataFrame]] = {}
    for spec in specs:
        dataset = spec["cell"]["dataset"]
        selected = _select_prompts(prompts[dataset], spec)
        default = int(spec["dataset"]["max_tokens"])
        budgets = selected["max_tokens"] if "max_tokens" in selected else [default] * len(selected)
        sampling = [SamplingParams(temperature=0.0, max_tokens=int(b), seed=spec["seed"]) for b in budgets]
        outputs = llm.generate(
            [TokensPrompt(prompt_token_ids=[int(t) for t in ids]) for ids in selected["prompt_token_ids"]],
            sampling,
            use_tqdm=False,
        )
        # Request ids are unique per engine: earlier datasets' records never match these.
        traced = read_trace_dir(trace_dir)
        ids = _match_trace_ids([o.request_id for o in outputs], traced)
        traces: list[MethodTrace] = []
        request_rows: list[dict[str, Any]] = []
        for row, completion in zip(selected.itertuples(), outputs, strict=True):
            steps = np.asarray(traced[ids[completion.request_id]], dtype=np.int32).reshape(-1, 2)
            tokens = [int(t) for t in completion.outputs[0].token_ids]
            if len(steps) != len(tokens):
                raise RuntimeError(f"trace mode: {len(steps)} steps for {len(tokens)} tokens of {row.request_id}")
            traces.append(MethodTrace(str(row.request_id), method, steps[:, 0], steps[:, 1]))
            request_rows.append(
                {
                    "request_id": str(row.request_id),
                    "prompt_token_ids": [int(t) for t in row.prompt_token_ids],
                    "output_token_ids": tokens,
                    "finish_reason": str(completion.outputs[0].finish_reason),
                }
            )
        out[dataset] = (make_trace_table(traces).assign(measured=measured), pd.DataFrame(request_rows).assign(measured=measured))
        if on_dataset is not None:  # kept as it finishes: a job killed later re-traces only the rest
            on_dataset(dataset, out[dataset])
    if not measured and totals is not None:
        totals.update(startup_s=engine.startup_s, generate_s=llm.modelled_s)
    return out


# ----------------------------------------------------------------------------- touchpoints
from sdbench.engine.release import touchpoints as tp  # noqa: E402 - standard library only


TOUCHPOINTS = tp.declare(
    __name__,
    # _match_trace_ids: the output's request id.
    tp.fields("llm.request_output", "vllm.outputs:RequestOutput.__init__", ["request_id", "outputs"]),
)
