"""The capturing proxy against a hostile LLM backend (issue 26): a backend that hangs, cuts a stream, answers
odd but valid JSON, or reuses response ids; and an agent that sends too much. The real ``openai`` SDK and a
real aiohttp backend on loopback; the proxy as a worker runs it."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from rollq.worker.capture import CaptureProxy
from rollq.worker.triplets import derive
from tests.support.capture import MESSAGES, WHERE, open_attempt, served_proxy

ODD = b'{"id": "odd-1", "object": "chat.completion", "choices": [{"index": 0, "message": "just text"}],  "x": [1,2]}'


def _answer(response_id: str, text: str) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


class HostileBackend:
    """Routes ``/<behaviour>/v1/chat/completions``: ``hang`` (never answers), ``cut`` (two chunks, then the
    connection drops), ``odd`` (200 with an odd but valid body), ``dup`` (every answer has one id)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HostileBackend:
        ready = threading.Event()

        def serve() -> None:
            loop = self._loop = asyncio.new_event_loop()
            app = web.Application()
            app.router.add_post("/{behaviour}/v1/chat/completions", self._chat)
            self._runner = web.AppRunner(app, handler_cancellation=True)
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            ready.set()
            loop.run_forever()

        threading.Thread(target=serve, daemon=True).start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        behaviour = request.match_info["behaviour"]
        body = await request.json()
        self.in_flight += 1
        try:
            if behaviour == "hang":
                await asyncio.sleep(3600)
            if behaviour == "odd":
                return web.Response(body=ODD, content_type="application/json")
            if behaviour == "dup":
                return web.json_response(_answer("chatcmpl-same", str(body["messages"][-1]["content"])))
            assert behaviour == "cut"
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for word in ("Hel", "lo"):
                chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
                chunk["choices"] = [{"index": 0, "delta": {"content": word}, "finish_reason": None}]
                await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await asyncio.sleep(0.1)
            assert request.transport is not None
            request.transport.abort()  # the backend dies mid-stream
            return response
        finally:
            self.in_flight -= 1


@pytest.fixture(scope="module")
def backend() -> Iterator[HostileBackend]:
    server = HostileBackend().start()
    yield server
    server.stop()


@pytest.fixture(params=WHERE)
def proxy(request: pytest.FixtureRequest) -> Iterator[CaptureProxy]:
    """The proxy on a thread of its own and on the agents' loop (ROLLQ_CAPTURE_ON_AGENT_LOOP): both hold."""
    with served_proxy(request.param, read_timeout=2, max_body_bytes=1024 * 1024) as started:
        yield started


def _client(endpoint: str, timeout: float = 10) -> openai.OpenAI:
    return openai.OpenAI(base_url=endpoint, api_key="x", timeout=timeout, max_retries=0)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
def test_calls_an_agent_abandons_on_a_hung_backend_close_the_backend_request_and_leak_no_socket(
    proxy: CaptureProxy, backend: HostileBackend
) -> None:
    # On 48fc877 each abandoned call left a socket and a backend request open (fds 17 -> 115).
    llm, _, _ = open_attempt(proxy, f"{backend.url}/hang/v1")
    client = _client(llm.endpoint, timeout=0.3)
    before = _fds()
    for _ in range(20):
        with pytest.raises(openai.APITimeoutError):
            client.chat.completions.create(model="m", messages=MESSAGES)
    client.close()
    deadline = time.monotonic() + 5
    while backend.in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backend.in_flight == 0, "the backend still serves calls nobody waits for"
    assert _fds() <= before + 4


@pytest.mark.slow
def test_a_backend_that_never_answers_is_a_504_after_the_read_timeout_and_recorded(
    proxy: CaptureProxy, backend: HostileBackend
) -> None:
    llm, attempt, _ = open_attempt(proxy, f"{backend.url}/hang/v1")
    began = time.monotonic()
    with pytest.raises(openai.APIStatusError) as info:
        _client(llm.endpoint).chat.completions.create(model="m", messages=MESSAGES)
    # 2 s of silence per try, and the proxy tries a failing upstream 4 times (h-proxy's retries) with backoff.
    assert info.value.status_code == 504 and time.monotonic() - began < 20
    [call] = attempt.calls
    assert call.status == 504 and "no answer in 2s" in (call.error or "")


def test_a_request_body_over_the_limit_is_refused_with_413(proxy: CaptureProxy, backend: HostileBackend) -> None:
    llm, attempt, _ = open_attempt(proxy, f"{backend.url}/dup/v1")
    huge = [{"role": "user", "content": "x" * (2 * 1024 * 1024)}]
    with pytest.raises(openai.APIStatusError) as info:
        _client(llm.endpoint).chat.completions.create(model="m", messages=huge)  # type: ignore[arg-type]
    assert info.value.status_code == 413
    assert attempt.calls == []


def test_an_odd_but_valid_answer_reaches_the_agent_byte_exact_and_is_recorded(
    proxy: CaptureProxy, backend: HostileBackend
) -> None:
    # On 48fc877 a choice whose message is a string made the proxy answer HTTP 500.
    llm, attempt, _ = open_attempt(proxy, f"{backend.url}/odd/v1")
    response = httpx.post(f"{llm.endpoint}/chat/completions", json={"model": "m", "messages": MESSAGES}, timeout=10)
    assert response.status_code == 200 and response.content == ODD
    [call] = attempt.calls
    assert call.status == 200 and call.error is None


def test_a_stream_the_backend_cuts_is_an_error_the_agent_sees_and_is_recorded_as_cut(
    proxy: CaptureProxy, backend: HostileBackend
) -> None:
    llm, attempt, _ = open_attempt(proxy, f"{backend.url}/cut/v1")
    client = _client(llm.endpoint)
    received = []
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        for chunk in client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
            received.append(chunk.choices[0].delta.content)
    assert received == ["Hel", "lo"]
    [call] = attempt.calls
    assert "stream cut" in (call.error or "")


def test_two_calls_with_one_response_id_are_two_triplets(proxy: CaptureProxy, backend: HostileBackend) -> None:
    llm, attempt, spans = open_attempt(proxy, f"{backend.url}/dup/v1")
    client = _client(llm.endpoint)
    for text in ("first", "second"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
    assert len(attempt.calls) == 2
    trace = [json.loads(span.to_json()) for span in spans.captured()]
    triplets = derive(trace).triplets
    assert [t.metadata["response_id"] for t in triplets] == ["chatcmpl-same", "chatcmpl-same"]
    assert [t.prompt["messages"][-1]["content"] for t in triplets] == ["first", "second"]
