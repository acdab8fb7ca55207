"""Inputs of a rehearsal where the real ones are out of reach: stand-in model directories and
rehearsal prompt sets.

- :func:`write_standin_model` (``sdbench rehearsal standin-model``, what ``download_model`` runs): a directory holding a
  ``config.json`` built from the repository's shipped architecture config
  (``src/sdbench/data/models``) plus :data:`~sdbench.rehearsal.standins.MODEL_FACTS`, and the
  marker :data:`~sdbench.rehearsal.MARKER`; no weights, no tokenizer. Memory accounting and the
  rehearsal engine read it; a measured engine refuses it.
- :func:`rehearsal_prompts` (``sdbench rehearsal prepare-dataset``, what ``prepare_dataset`` runs): the dataset's
  request count (``num_prompts``) with prompt and output lengths from
  :data:`~sdbench.rehearsal.standins.LENGTHS_BY_BUILDER` (the published traces' own for GSM8K and
  InstructCoder), token ids drawn with a seeded generator below the model's vocabulary size, and
  the columns the real builders write (``prompt_text`` says what it is; ``reference`` empty) plus
  ``rehearsal_trace`` (the acceptance record) and ``rehearsal_output_tokens`` (the greedy output
  length, before the budget).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sdbench.datasets.speedbench import ENTROPY_TIERS, QUALITATIVE_CATEGORIES
from sdbench.rehearsal import MARKER, is_standin, standins
from sdbench.rehearsal.llm import model_facts
from sdbench.rehearsal.workload import OUTPUT_COLUMN, TRACE_COLUMN, stable_index, trace_for

# config.json model_type / architectures of each architecture YAML kind.
_HF_TYPES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "glm4_moe": ("glm4_moe", "Glm4MoeForCausalLM"),
    "eagle": ("llama", "LlamaForCausalLM"),
    "eagle3": ("llama", "LlamaForCausalLMEagle3"),
}


def standin_config(repo: str) -> tuple[dict[str, Any], str]:
    """(config.json, where it came from) of a stand-in for hub repository ``repo``."""
    from dataclasses import asdict

    from sdbench.models.spec import load_model_spec

    try:
        spec, source = load_model_spec(repo), f"shipped architecture config of {repo}"
    except ValueError:
        spec = load_model_spec(standins.BASE_MODEL)
        source = f"stand-in: {standins.BASE_MODEL}'s architecture (no shipped architecture config for {repo})"
    data = {k: v for k, v in asdict(spec).items() if v is not None and k not in ("repo_id", "source", "architecture")}
    model_type, arch = _HF_TYPES.get(spec.architecture, (spec.architecture, spec.architecture))
    facts = standins.MODEL_FACTS.get(spec.target_repo_id or repo) or standins.MODEL_FACTS.get(repo)
    config = {
        "_name_or_path": repo,
        "model_type": model_type,
        "architectures": [arch],
        **data,
        "eos_token_id": facts.eos_token_id if facts else spec.vocab_size - 1,
        "max_position_embeddings": facts.max_position_embeddings if facts else standins.DEFAULT_CONTEXT,
    }
    if facts and facts.bos_token_id is not None:
        config["bos_token_id"] = facts.bos_token_id
    return config, source


def write_standin_model(repo: str, revision: str, output: str | Path) -> None:
    """Write a stand-in model directory for ``repo`` (atomically; see the module docstring)."""
    from sdbench.io import atomic_dir

    config, source = standin_config(repo)
    with atomic_dir(output) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        marker = {"repo": repo, "revision": revision, "stand_in": True, "config": source,
                  "note": "rehearsal stand-in: no weights, no tokenizer (sdbench.rehearsal.prepare)"}  # fmt: skip
        (tmp / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    print(f"{output}: rehearsal stand-in of {repo} ({source})", file=sys.stderr)


def needs_rehearsal_set(entry: dict[str, Any], tokenizer_dir: str | Path) -> bool:
    """Whether a dataset's prompts are a rehearsal set: a hub dataset (out of reach), or any
    dataset whose tokenizer is a stand-in (nothing can tokenize it)."""
    return entry.get("source") == "huggingface" or is_standin(tokenizer_dir)


def _seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


def expected_outputs(dist: standins.LogNormal, entry: dict[str, Any]) -> standins.LogNormal:
    """A stand-in output distribution moved to the mean the runtime estimate assumes
    (:func:`sdbench.expectedlengths.output_tokens`): the dataset's ``expected_output_tokens``, else its
    budget ``max_tokens``; the stand-in's spread. One expected length per dataset for the
    estimate, the KV check and the rehearsal (outputs past the budget stop at it)."""
    budget = int(entry["max_tokens"])
    mean = min(budget, int(entry.get("expected_output_tokens") or budget))
    return standins.LogNormal(mean / math.exp(dist.sigma**2 / 2), dist.sigma)


def _draw(dist: standins.LogNormal, rng: np.random.Generator, n: int) -> np.ndarray:
    return np.maximum(1, np.round(dist.median * np.exp(dist.sigma * rng.standard_normal(n)))).astype(np.int64)


def _token_ids(rng: np.random.Generator, n: int, vocab: int, eos: int) -> np.ndarray:
    ids = rng.integers(0, vocab - 1, size=n)
    ids[ids >= eos] += 1  # the end-of-sequence id never inside a prompt
    return ids.astype(np.int32)


def _speed_bench_config(entry: dict[str, Any]) -> str:
    return str(entry.get("hf_config") or Path(str(entry.get("local_path") or "qualitative")).name)


def rehearsal_prompts(
    name: str,
    entry: dict[str, Any],
    traces: dict[str, Any],
    vocab: int,
    eos: int,
    seed: int,
    context: int | None = None,
    matched: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The rehearsal prompt table of dataset ``name`` (module docstring); ``traces``: the published
    traces by name (:func:`sdbench.rehearsal.workload.load_traces`), ``matched``: a random-token
    dataset's matched table."""
    n = int(entry["num_prompts"])
    rng = np.random.default_rng(_seed(seed, name))
    category = str(entry.get("category", ""))
    categories = [category] * n
    builder = entry.get("builder", "")
    if entry.get("source") == "random_tokens":
        if matched is None or len(matched) < n:
            raise ValueError(f"datasets.{name}: a random-token rehearsal set needs {n} prompts of {entry.get('matched_to')!r}")
        rows = matched.iloc[:n]
        prompt_lens = np.asarray([len(ids) for ids in rows["prompt_token_ids"]], np.int64)
        outputs = rows[OUTPUT_COLUMN].to_numpy(np.int64) if OUTPUT_COLUMN in rows else None
        sources = list(rows[TRACE_COLUMN]) if TRACE_COLUMN in rows else None
        ids_of = [f"random-{r}" for r in rows["request_id"]]
        categories = [category or "random"] * n
    else:
        ids_of = [str(j) for j in range(n)]
        if builder == "speed_bench":
            config = _speed_bench_config(entry)
            tiers = ENTROPY_TIERS if config in standins.SPEED_BENCH_INPUT else QUALITATIVE_CATEGORIES
            categories = [tiers[j % len(tiers)] for j in range(n)]
            lengths = (standins.Lengths(prompt=standins.SPEED_BENCH_INPUT[config], output=standins.SPEED_BENCH_THROUGHPUT_OUTPUT)
                       if config in standins.SPEED_BENCH_INPUT else standins.SPEED_BENCH_QUALITATIVE)  # fmt: skip
        else:
            lengths = standins.LENGTHS_BY_BUILDER.get(builder, standins.DEFAULT_LENGTHS)
        if lengths.trace is not None:
            records = traces[lengths.trace]
            picked = [j % len(records) for j in range(n)]
            prompt_lens = np.asarray([len(records[i].prompt_token_ids) for i in picked], np.int64)
            outputs = np.asarray([len(records[i].generated_token_ids) for i in picked], np.int64)
            sources = [f"{lengths.trace}:{i}" for i in picked]
        else:
            prompt = lengths.prompt
            prompt_lens = np.full(n, prompt, np.int64) if isinstance(prompt, int) else _draw(prompt, rng, n)
            outputs = _draw(expected_outputs(lengths.output, entry), rng, n) if lengths.output is not None else None
            sources = None
    if sources is None:  # the acceptance record of each request's dataset or category
        sources = []
        for rid, cat in zip(ids_of, categories):
            trace = trace_for(name, cat)
            sources.append(f"{trace}:{stable_index(f'{name}/{rid}', len(traces[trace]))}")
    if outputs is None:
        outputs = np.asarray([len(traces[s.split(':')[0]][int(s.split(':')[1])].generated_token_ids) for s in sources])
    max_tokens = np.full(n, int(entry["max_tokens"]), np.int64)
    if context is not None:  # as prepare(): the prompt leaves room for one token, the budget fits after it
        prompt_lens = np.minimum(prompt_lens, context - 1)
        max_tokens = np.minimum(max_tokens, context - prompt_lens)
    table = pd.DataFrame(
        {
            "request_id": ids_of,
            "dataset": name,
            "category": categories,
            "prompt_text": [f"(rehearsal: {int(p)} random token ids)" for p in prompt_lens],
            "prompt_token_ids": [_token_ids(rng, int(p), vocab, eos) for p in prompt_lens],
            "reference": "",
            "max_tokens": max_tokens,
            TRACE_COLUMN: sources,
            OUTPUT_COLUMN: np.maximum(1, outputs).astype(np.int64),
        }
    )
    return table


def _cmd_prepare(args: Any) -> int:
    """``sdbench rehearsal prepare-dataset``: ``sdbench prepare-dataset`` of a rehearsal, which
    writes a rehearsal prompt set where :func:`needs_rehearsal_set`, else prepares the real one."""
    from sdbench.datasets.prompts import _cmd_prepare as prepare_real
    from sdbench.datasets.prompts import _json_arg, model_context, read_prompt_table
    from sdbench.io import write_parquet
    from sdbench.rehearsal.workload import load_traces

    entry = _json_arg("--entry", args.entry)
    if not Path(args.tokenizer).is_dir():
        raise FileNotFoundError(2, "no such directory (expected the target's tokenizer directory)", args.tokenizer)
    if not needs_rehearsal_set(entry, args.tokenizer):
        return prepare_real(args)
    traces = load_traces(dict(item.split("=", 1) for item in args.rehearsal_traces))
    vocab, eos = model_facts(args.tokenizer)
    matched = read_prompt_table(args.matched) if entry.get("source") == "random_tokens" and args.matched else None
    context = model_context(args.tokenizer, args.max_model_len)
    table = rehearsal_prompts(args.name, entry, traces, vocab, eos, args.seed, context, matched)
    lengths = f"those of {entry.get('matched_to')}" if matched is not None else "per docs/methods/rehearsal.md"
    print(f"datasets.{args.name}: {len(table)} rehearsal prompts, not the dataset's (lengths {lengths}, token ids "
          f"drawn below {vocab}); mean prompt {table['prompt_token_ids'].map(len).mean():.0f}, mean greedy output "
          f"{table[OUTPUT_COLUMN].mean():.0f} tokens", file=sys.stderr)  # fmt: skip
    write_parquet(table, Path(args.output))
    return 0


def _cmd_standin_model(args: Any) -> int:
    """``sdbench rehearsal standin-model``: :func:`write_standin_model`."""
    write_standin_model(args.repo, args.revision, args.output)
    return 0
