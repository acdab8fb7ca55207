"""The paper authors' request sampling, reproduced: order, filters, oversampling, tokenization.

The authors (SpecDecode-Bench's vLLM fork, ``vllm/benchmarks/datasets_bench.py`` with
``scripts/common.py``, ``SEED=42``) drew their requests like this, and a dataset entry with
``form: authors`` draws them the same way (:func:`sdbench.datasets.prompts.prepare`):

* Hub datasets: ``load_dataset(path, name=subset, split=split, streaming=True).shuffle(seed=42)``
  and the first ``num_requests`` rows the builder accepts. That shuffle is the ``datasets``
  library's streaming shuffle as it was in its 2.x-4.x releases: the split's data files in an
  order shuffled by one copy of ``numpy.random.default_rng(seed)``, then a 1000-row shuffle
  buffer fed in that order and drawing its slots from a second, independent copy
  (:func:`buffer_shuffle`). Later ``datasets`` releases shuffle differently, so the rows are read
  in stored order and shuffled here, never by the library.
* ShareGPT: ``json.load`` of the file, entries with at least two turns, ``random.seed(42);
  random.shuffle(data)`` (:func:`sharegpt_order`).
* Request ids: the request's position in the sampled list, ``"0"``, ``"1"``, ... (what the
  published traces carry as ``id``).
* Filters (:func:`is_valid_sequence`): ShareGPT keeps a prompt only if its templated token count
  and its first answer's token count pass vLLM's defaults (at least 4 each, prompt at most 1024,
  both at most 2048); AIME likewise with a prompt of at most 2048 and a total of at most 32000.
* Fewer usable rows than requested: the fork pads the list with copies of random requests
  (``random.seed(42)``, ``random.choice``), numbered on from the last id (:func:`oversample`).
* Tokens: the chat template rendered as text, then tokenized *with* the tokenizer's special tokens
  (``vllm.LLM.generate(text)``), so a Llama-3 prompt starts with two ``<|begin_of_text|>``.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

BUFFER_SIZE = 1000  # datasets' IterableDataset.shuffle default
_RANDOM_BATCH = 1000  # slots drawn from the generator per batch, as datasets did


def shard_order(n_shards: int, seed: int) -> list[int]:
    """The order the streaming shuffle read a split's ``n_shards`` data files in."""
    import numpy as np

    order = list(range(n_shards))
    np.random.default_rng(seed).shuffle(order)
    return order


def buffer_shuffle(rows: Iterable[T], seed: int, buffer_size: int = BUFFER_SIZE) -> Iterator[T]:
    """``rows`` through the streaming shuffle buffer of ``datasets`` 2.x-4.x (one data file).

    The buffer fills to ``buffer_size``; then each new row replaces the row in a random slot,
    which is yielded; at the end the buffer is shuffled and emptied. Slots come from
    ``numpy.random.default_rng(seed).integers(0, buffer_size, size=1000)``, batch after batch.
    """
    import numpy as np

    rng = np.random.default_rng(seed)

    def slots() -> Iterator[int]:
        while True:
            yield from (int(i) for i in rng.integers(0, buffer_size, size=_RANDOM_BATCH))

    draw = slots()
    buffer: list[T] = []
    for row in rows:
        if len(buffer) == buffer_size:
            i = next(draw)
            yield buffer[i]
            buffer[i] = row
        else:
            buffer.append(row)
    rng.shuffle(buffer)
    yield from buffer


def streaming_shuffle(shards: Sequence[Iterable[T]], seed: int, buffer_size: int = BUFFER_SIZE) -> Iterator[T]:
    """Rows of a split's data files (``shards``, each in stored order, the files in the loader's
    order) as ``load_dataset(..., streaming=True).shuffle(seed)`` yielded them: files in
    :func:`shard_order`, then :func:`buffer_shuffle`. Both use their own generator from ``seed``."""
    order = shard_order(len(shards), seed)
    return buffer_shuffle((row for i in order for row in shards[i]), seed, buffer_size)


def sharegpt_order(entries: Sequence[T], seed: int) -> list[T]:
    """ShareGPT's entries in the order ``random.seed(seed); random.shuffle(data)`` left them."""
    data = list(entries)
    random.Random(seed).shuffle(data)
    return data


def is_valid_sequence(
    prompt_len: int, output_len: int, min_len: int = 4, max_prompt_len: int = 1024, max_total_len: int = 2048
) -> bool:
    """vLLM's benchmark length filter (``vllm.benchmarks.datasets.is_valid_sequence``)."""
    return not (
        prompt_len < min_len
        or output_len < min_len
        or prompt_len > max_prompt_len
        or prompt_len + output_len > max_total_len
    )


def oversample(rows: list[dict[str, Any]], num_requests: int, seed: int) -> list[dict[str, Any]]:
    """Pad ``rows`` (prompt-table rows with ``request_id`` = position) to ``num_requests`` as the
    fork's ``maybe_oversample_requests`` did: copies of ``random.choice`` picks after
    ``random.seed(seed)``, numbered on from ``len(rows)``."""
    if len(rows) >= num_requests or not rows:
        return rows
    rng = random.Random(seed)
    base = len(rows)
    extra = []
    for i in range(num_requests - base):
        row = copy.deepcopy(rng.choice(rows))
        row["request_id"] = str(base + i)
        extra.append(row)
    return rows + extra
