"""A closed-loop streaming client for vLLM's OpenAI-compatible server, and its ``/metrics``.

:func:`run_level` keeps exactly ``concurrency`` requests in flight (a new one starts when
one finishes) until ``num_requests`` are done. Each request posts the prompt's token ids to
``/v1/completions`` with ``stream: true`` and usage reporting, and records, as vLLM's own
``vllm bench serve`` does (``benchmarks/lib/endpoint_request_func.py``):

- TTFT: from sending to the first streamed chunk that carries a choice;
- end-to-end latency: from sending to the end of the stream;
- output tokens: the final usage chunk's ``completion_tokens``;
- TPOT: (latency - TTFT) / (output tokens - 1), for requests with more than one token.

- chunk gaps: the time between consecutive chunks that carry a choice (vLLM's ``itl``).

With ``stream=False`` (the stream-off control) a request is one plain JSON answer: end-to-end
latency and output tokens only.

TPOT is the time per token; with SD the accepted tokens of a step arrive in one chunk, so a gap
between chunks is the wait between steps, not a per-token time (ITL, :mod:`sdbench.analysis.goodput`).

The SD counters come from the server's Prometheus text (``GET /metrics``) read before and
after a level; their difference is that level's drafts and acceptances.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

from sdbench.engine.measure.counters import SD_COUNTERS, SD_PER_POS, SDCounters


class RequestFailed(RuntimeError):
    """A request got no complete streamed answer (HTTP error, dropped connection, timeout)."""


@dataclass
class RequestResult:
    """One request of a level (``requests.parquet`` of a server cell, docs/schema.md)."""

    round: int
    index: int
    request_id: str
    num_prompt_tokens: int
    num_output_tokens: int
    start_s: float  # from the level's start
    ttft_s: float
    latency_s: float
    tpot_s: float  # NaN for a single-token output
    num_chunks: int
    chunk_gaps_s: list[float]  # between consecutive chunks with a choice (vLLM's itl)


def _payload(
    prompt_ids: list[int], max_tokens: int, ignore_eos: bool, model: str, stream: bool = True
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "model": model,
        "prompt": prompt_ids,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": ignore_eos,
        "stream": stream,
    }
    if stream:
        payload["stream_options"] = {"include_usage": True}
    return payload


def parse_plain(body: str, request_id: str) -> tuple[int | None, int]:
    """(prompt tokens or None, output tokens) of a non-streamed completion's JSON body."""
    try:
        usage = json.loads(body).get("usage") or {}
    except json.JSONDecodeError as exc:
        raise RequestFailed(f"request {request_id}: the answer is not JSON: {body[:200]!r}") from exc
    if usage.get("completion_tokens") is None:
        raise RequestFailed(f"request {request_id}: the answer has no usage.completion_tokens: {body[:200]!r}")
    prompt = usage.get("prompt_tokens")
    return (int(prompt) if prompt is not None else None), int(usage["completion_tokens"])


async def _one_plain(
    session: Any, url: str, payload: dict[str, Any], level_t0: float, round_: int, index: int, request_id: str
) -> RequestResult:
    """Send one non-streamed completion (the stream-off control): only end-to-end latency and
    output tokens exist, so TTFT, TPOT and chunk gaps are NaN / empty."""
    t0 = time.perf_counter()
    async with session.post(url, json=payload) as resp:
        body = await resp.text()
        if resp.status != 200:
            raise RequestFailed(f"request {request_id}: HTTP {resp.status}: {body[:300]}")
    latency = time.perf_counter() - t0
    prompt_tokens, output_tokens = parse_plain(body, request_id)
    nan = float("nan")
    return RequestResult(
        round_, index, request_id, int(prompt_tokens if prompt_tokens is not None else len(payload["prompt"])),
        output_tokens, t0 - level_t0, nan, latency, nan, 1, [],
    )


async def _one(
    session: Any, url: str, payload: dict[str, Any], level_t0: float, round_: int, index: int, request_id: str
) -> RequestResult:
    """Send one streamed completion and time it (the parsing follows vLLM's bench client)."""
    ttft, chunks, output_tokens, prompt_tokens = float("nan"), 0, None, len(payload["prompt"])
    gaps: list[float] = []
    last = 0.0
    buffer = ""
    t0 = time.perf_counter()
    async with session.post(url, json=payload) as resp:
        if resp.status != 200:
            body = (await resp.text())[:300]
            raise RequestFailed(f"request {request_id}: HTTP {resp.status}: {body}")
        async for raw in resp.content.iter_any():
            buffer += raw.decode("utf-8", errors="replace")
            *messages, buffer = buffer.split("\n\n")  # server-sent events end with a blank line
            for message in messages:
                message = message.strip()
                if not message or message.startswith(":"):
                    continue
                data = message.removeprefix("data: ")
                if data == "[DONE]":
                    continue
                event = json.loads(data)
                if event.get("choices"):
                    now = time.perf_counter()
                    if chunks == 0:
                        ttft = now - t0
                    else:
                        gaps.append(now - last)
                    last = now
                    chunks += 1
                elif event.get("usage"):
                    output_tokens = event["usage"].get("completion_tokens")
                    prompt_tokens = event["usage"].get("prompt_tokens", prompt_tokens)
    latency = time.perf_counter() - t0
    if output_tokens is None or chunks == 0:
        raise RequestFailed(f"request {request_id}: the stream ended without tokens or usage")
    tpot = (latency - ttft) / (output_tokens - 1) if output_tokens > 1 else float("nan")
    return RequestResult(
        round_, index, request_id, int(prompt_tokens), int(output_tokens), t0 - level_t0, ttft, latency, tpot, chunks,
        gaps,
    )


async def _level(
    base_url: str,
    prompts: list[tuple[Any, ...]],
    max_tokens: int,
    concurrency: int,
    num_requests: int,
    ignore_eos: bool,
    timeout_s: float,
    round_: int,
    model: str,
    stream: bool = True,
) -> tuple[list[RequestResult], float]:
    import aiohttp

    url = f"{base_url}/v1/completions"
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    next_index = 0
    results: list[RequestResult] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        t0 = time.perf_counter()

        async def worker() -> None:
            nonlocal next_index
            while next_index < num_requests:
                i = next_index
                next_index += 1
                rid, ids, *budget = prompts[i % len(prompts)]  # (id, token ids[, its own max_tokens])
                own = min(int(budget[0]), max_tokens) if budget and budget[0] else max_tokens  # capped: the cell's
                payload = _payload(ids, own, ignore_eos, model, stream)
                send = _one if stream else _one_plain
                try:
                    results.append(await send(session, url, payload, t0, round_, i, rid))
                except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as exc:
                    raise RequestFailed(f"request {rid} (#{i}): {type(exc).__name__}: {exc}") from exc

        await asyncio.gather(*(worker() for _ in range(min(concurrency, num_requests))))
        wall = time.perf_counter() - t0
    return sorted(results, key=lambda r: r.index), wall


def run_level(
    base_url: str,
    prompts: list[tuple[Any, ...]],
    max_tokens: int,
    concurrency: int,
    num_requests: int,
    ignore_eos: bool = False,
    timeout_s: float = 600.0,
    round_: int = 0,
    model: str = "sdbench-target",
    stream: bool = True,
) -> tuple[list[RequestResult], float]:
    """Send ``num_requests`` requests (prompts cycled in order), ``concurrency`` at a time.

    ``stream=False`` sends plain (non-streamed) completions, the stream-off control: each
    request records its end-to-end latency and output tokens; TTFT, TPOT and chunk gaps are
    NaN / empty (nothing arrives before the whole answer).

    A prompt is ``(request id, token ids)`` or ``(request id, token ids, max_tokens)``: its own
    output budget (a user's prompts file), else ``max_tokens``.

    Returns the requests (sorted by index) and the level's wall time, first send to last
    answer. Raises :class:`RequestFailed` on the first request that fails.
    """
    if concurrency < 1 or num_requests < 1 or not prompts:
        raise ValueError(f"concurrency {concurrency}, num_requests {num_requests}, {len(prompts)} prompts: need >= 1 each")
    return asyncio.run(
        _level(base_url, prompts, max_tokens, concurrency, num_requests, ignore_eos, timeout_s, round_, model, stream)
    )


def results_rows(results: list[RequestResult]) -> list[dict[str, Any]]:
    """Rows of a requests table."""
    return [asdict(r) for r in results]


_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_sd_counters(text: str) -> SDCounters:
    """The SD counters in a Prometheus text exposition, summed over label sets.

    Counters appear with Prometheus' ``_total`` suffix (``vllm:spec_decode_num_drafts_total``);
    the per-position acceptances carry a ``position`` label. Absent counters (no SD) are 0.
    """
    wanted = {name: field for field, name in SD_COUNTERS.items()}
    totals = {field: 0 for field in SD_COUNTERS}
    per_pos: dict[int, int] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        name = match["name"].removesuffix("_total")
        value = int(float(match["value"]))
        if name in wanted:
            totals[wanted[name]] += value
        elif name == SD_PER_POS:
            labels = dict(_LABEL.findall(match["labels"] or ""))
            pos = int(labels.get("position", 0))
            per_pos[pos] = per_pos.get(pos, 0) + value
    width = max(per_pos) + 1 if per_pos else 0
    return SDCounters(**totals, accepted_per_pos=tuple(per_pos.get(i, 0) for i in range(width)))


def read_metrics(base_url: str, timeout_s: float = 30.0) -> SDCounters:
    """``GET /metrics`` of the server, parsed (:func:`parse_sd_counters`)."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=timeout_s) as resp:  # noqa: S310 - loopback
        return parse_sd_counters(resp.read().decode("utf-8", errors="replace"))


# ----------------------------------------------------------------------------- touchpoints
from sdbench.engine.release import touchpoints as tp  # noqa: E402 - standard library only

ROUTES = ("/health", "/metrics", "/v1/completions")


def _check_routes(src: tp.SourceTree) -> str | None:
    """The server answers the routes the client calls (route strings under vllm.entrypoints)."""
    missing = set(ROUTES)
    for module in src.modules_under("vllm.entrypoints"):
        missing -= {r for r in missing if src.string_in(module, r)}
        if not missing:
            return None
    return f"no route {', '.join(sorted(missing))} under vllm.entrypoints"


TOUCHPOINTS = tp.declare(__name__, tp.custom("server.routes", _check_routes, ["vllm.entrypoints"]))
