"""Random-token control prompts: token ids drawn at random, matched in length to a real prompt set.

SPEED-Bench found that random-token inputs misstate SD throughput (about 23% too high with SD
on): a model answers noise with low-entropy filler, or anchors on one keyword. A dataset entry
``source: random_tokens, matched_to: <dataset>`` builds, for each of that dataset's prompts
(the same model's prompt table), a prompt of exactly as many token ids drawn uniformly (seeded)
from the tokenizer's ordinary vocabulary. A leading special token (the BOS the chat template or
tokenizer wrote) is kept, so the two sets differ only in content. Every cell then runs both
sets the same way; ``sdbench random-inputs`` compares them (sdbench.analysis.randominputs).
"""

from __future__ import annotations

import random
from typing import Any

import pandas as pd

from sdbench.errors import ConfigError


def ordinary_token_ids(tokenizer: Any) -> list[int]:
    """Every id of the tokenizer's vocabulary that is not a special or added token, sorted."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    added = set(getattr(tokenizer, "get_added_vocab", dict)().values())
    ids = sorted(set(tokenizer.get_vocab().values()) - special - added)
    if not ids:
        raise ConfigError("the tokenizer has no ordinary tokens to draw random prompts from")
    return ids


def random_token_prompts(name: str, entry: dict[str, Any], matched: pd.DataFrame, tokenizer: Any, seed: int) -> pd.DataFrame:
    """The prompt table of random-token dataset ``name``: one prompt per matched prompt, same length.

    ``matched`` is the prompt table of ``entry["matched_to"]`` for the same model; its first
    ``num_prompts`` rows are matched, in its order. Raises :class:`ConfigError` naming the
    dataset when the matched set has fewer prompts.
    """
    n = int(entry["num_prompts"])
    if len(matched) < n:
        raise ConfigError(
            f"datasets.{name}.num_prompts: {n}, but {entry['matched_to']!r} has only {len(matched)} prompts"
        )
    vocab = ordinary_token_ids(tokenizer)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    rng = random.Random(f"{seed}:{name}")
    rows = []
    for rec in matched.iloc[:n].itertuples(index=False):
        real = [int(t) for t in rec.prompt_token_ids]
        keep = real[:1] if real and real[0] in special else []
        ids = keep + [rng.choice(vocab) for _ in range(len(real) - len(keep))]
        rows.append(
            {
                "request_id": f"random-{rec.request_id}",
                "dataset": name,
                "category": entry.get("category", "random"),
                "prompt_text": tokenizer.decode(ids),
                "prompt_token_ids": ids,
                "reference": "",
                "max_tokens": int(entry["max_tokens"]),
            }
        )
    return pd.DataFrame(rows)
