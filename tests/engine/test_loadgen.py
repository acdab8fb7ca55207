"""The load generator's stream-off control: a plain completion, timed end to end only."""

from __future__ import annotations

import asyncio
import json
import math
from types import SimpleNamespace

import pytest

from sdbench.engine.serving import loadgen


class _Plain:
    """A non-streamed completion as the server sends it: one JSON body."""

    def __init__(self, body: dict, status: int = 200) -> None:
        self.status, self.body = status, json.dumps(body)

    async def text(self) -> str:
        return self.body

    async def __aenter__(self) -> _Plain:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


def test_stream_off_payload_asks_for_one_answer_and_no_usage_stream() -> None:
    on, off = loadgen._payload([1, 2], 8, True, "m"), loadgen._payload([1, 2], 8, True, "m", stream=False)
    assert on["stream"] is True and on["stream_options"] == {"include_usage": True}
    assert off["stream"] is False and "stream_options" not in off  # vLLM rejects stream_options without stream
    assert {k: v for k, v in off.items() if k != "stream"} == {k: v for k, v in on.items() if k not in ("stream", "stream_options")}


def test_stream_off_request_records_latency_and_tokens_and_no_per_token_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock reads 10.0 at the send and 11.5 when the whole answer is in: latency 1.5 s."""
    monkeypatch.setattr(loadgen, "time", SimpleNamespace(perf_counter=iter([10.0, 11.5]).__next__))
    body = {"choices": [{"text": "abc"}], "usage": {"prompt_tokens": 3, "completion_tokens": 7}}
    session = SimpleNamespace(post=lambda url, json: _Plain(body))
    payload = loadgen._payload([1, 2, 3], 8, False, "m", stream=False)
    r = asyncio.run(loadgen._one_plain(session, "u", payload, 9.0, 2, 4, "r4"))
    assert (r.latency_s, r.start_s, r.num_output_tokens, r.num_prompt_tokens) == (1.5, 1.0, 7, 3)
    assert (r.round, r.index, r.request_id) == (2, 4, "r4")
    assert math.isnan(r.ttft_s) and math.isnan(r.tpot_s) and r.chunk_gaps_s == []


def test_stream_off_answer_without_usage_or_with_an_error_fails_clearly() -> None:
    with pytest.raises(loadgen.RequestFailed, match="r1: the answer has no usage.completion_tokens"):
        loadgen.parse_plain(json.dumps({"choices": [{"text": "x"}]}), "r1")
    with pytest.raises(loadgen.RequestFailed, match="r2: the answer is not JSON"):
        loadgen.parse_plain("<html>", "r2")
    session = SimpleNamespace(post=lambda url, json: _Plain({"error": "boom"}, status=500))
    with pytest.raises(loadgen.RequestFailed, match="r3: HTTP 500"):
        asyncio.run(loadgen._one_plain(session, "u", loadgen._payload([1], 4, False, "m", False), 0.0, 0, 0, "r3"))


def test_run_level_sends_plain_requests_when_stream_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_level(stream=False)`` reaches the plain sender, ``stream=True`` (the default) the streamed one."""
    seen: list[tuple[str, bool]] = []

    async def fake(kind: str, session, url, payload, t0, round_, index, rid):  # noqa: ANN001, ANN202
        seen.append((kind, payload["stream"]))
        return loadgen.RequestResult(round_, index, rid, 1, 1, 0.0, math.nan, 0.1, math.nan, 1, [])

    monkeypatch.setattr(loadgen, "_one", lambda *a: fake("streamed", *a))
    monkeypatch.setattr(loadgen, "_one_plain", lambda *a: fake("plain", *a))
    results, _ = loadgen.run_level("http://127.0.0.1:1", [("p", [1, 2])], 4, 2, 3, stream=False)
    assert [r.index for r in results] == [0, 1, 2] and set(seen) == {("plain", False)}
    seen.clear()
    loadgen.run_level("http://127.0.0.1:1", [("p", [1, 2])], 4, 1, 1)
    assert seen == [("streamed", True)]
