"""Async httpx calls to this process's capturing proxy handed to it in memory (``rollq.worker.capture.in_memory``,
``ROLLQ_CAPTURE_IN_MEMORY``): answered and captured as over the socket, with the socket's failures, timeouts and
cancellations, for the proxy on a thread of its own, on the agents' loop, and on a thread of its own serving the
agents' calls on their loop (a worker's default); and the httpx internals it wraps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import httpx
import httpx2
import openai
import pytest

from rollq.worker.capture import CaptureProxy, in_memory
from rollq.worker.config import WorkerSettings
from tests.support.capture import IN_MEMORY_WHERE, MESSAGES, WHERE, open_attempt, served_proxy, worker_proxy
from tests.support.fake_vllm import FakeVLLM

T = TypeVar("T")


@pytest.fixture(params=IN_MEMORY_WHERE)
def proxy(request: pytest.FixtureRequest) -> Iterator[CaptureProxy]:
    with served_proxy(request.param, in_memory=True) as started:
        yield started


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the calls handed to a proxy in memory."""
    paths: list[str] = []
    serve = in_memory._serve

    async def counted(handler: Any, request: Any) -> None:
        paths.append(request.path)
        await serve(handler, request)

    monkeypatch.setattr(in_memory, "_serve", counted)
    return paths


def run(proxy: CaptureProxy, agent: Callable[[], Awaitable[T]]) -> T:
    """``agent()`` as a worker runs it: on the agents' loop when the proxy knows one (it serves there, or serves
    the calls made there), else on a loop of its own."""
    loop = proxy._loop if proxy._shares_loop else proxy._agents_loop
    if loop is not None:
        return asyncio.run_coroutine_threadsafe(agent(), loop).result(timeout=60)  # type: ignore[arg-type]
    return asyncio.run(agent())  # type: ignore[arg-type]


def test_an_openai_client_s_calls_are_handed_over_in_memory_and_captured_as_over_the_socket(
    proxy: CaptureProxy, fake: FakeVLLM, handed: list[str]
) -> None:
    llm, attempt, spans = open_attempt(proxy, fake.url)

    async def agent() -> list[str]:
        async with openai.AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0) as client:
            replies = await asyncio.gather(
                *(client.chat.completions.create(model="m", messages=MESSAGES) for _ in range(6))
            )
            return [r.id for r in replies]

    ids = run(proxy, agent)
    assert len(handed) == 6 and all(path.endswith("/chat/completions") for path in handed)
    assert sorted(c.response_id or "" for c in attempt.calls) == sorted(ids)
    for call in attempt.calls:
        assert call.status == 200
        assert call.prompt_token_ids == fake.sent[call.response_id or ""].prompt_token_ids
        assert call.response_token_ids == fake.sent[call.response_id or ""].token_ids
    assert len(spans.captured()) == 6
    assert all(body.get("return_token_ids") is True for body in fake.received)  # the proxy's fields were added


def test_a_streamed_answer_arrives_in_pieces_and_is_captured_whole(
    proxy: CaptureProxy, fake: FakeVLLM, handed: list[str]
) -> None:
    llm, attempt, _ = open_attempt(proxy, fake.url)

    async def agent() -> tuple[int, str]:
        async with openai.AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0) as client:
            stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            pieces = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
            return len(pieces), "".join(pieces)

    count, text = run(proxy, agent)
    assert handed and count > 1
    (call,) = attempt.calls
    assert call.streamed and call.text == text == fake.sent[call.response_id or ""].text
    assert call.response_token_ids == fake.sent[call.response_id or ""].token_ids


def test_a_backend_error_reaches_the_agent_as_its_status(proxy: CaptureProxy, fake: FakeVLLM) -> None:
    llm, attempt, _ = open_attempt(proxy, fake.url)
    fake.fail_next, fake.fail_next_status = 1, 400

    async def agent() -> None:
        async with openai.AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0) as client:
            await client.chat.completions.create(model="m", messages=MESSAGES)

    with pytest.raises(openai.BadRequestError):
        run(proxy, agent)
    (call,) = attempt.calls
    assert call.status == 400 and call.error


def test_a_failing_handler_is_a_500_and_the_next_call_is_answered(
    proxy: CaptureProxy, fake: FakeVLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm, _, _ = open_attempt(proxy, fake.url)
    capture = proxy._capture
    failures = [RuntimeError("broken on purpose")]

    async def failing_once(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return await capture(*args, **kwargs)

    monkeypatch.setattr(proxy, "_capture", failing_once)

    async def agent() -> str:
        async with openai.AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0) as client:
            with pytest.raises(openai.InternalServerError):
                await client.chat.completions.create(model="m", messages=MESSAGES)
            return (await client.chat.completions.create(model="m", messages=MESSAGES)).id

    assert run(proxy, agent).startswith("chatcmpl-")


def test_the_client_s_read_timeout_holds_and_cancels_the_backend_request(proxy: CaptureProxy, fake: FakeVLLM) -> None:
    llm, attempt, _ = open_attempt(proxy, fake.url)
    fake.delay = 1.5

    async def agent() -> float:
        started = time.monotonic()
        async with openai.AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0, timeout=0.5) as client:
            with pytest.raises(openai.APITimeoutError):
                await client.chat.completions.create(model="m", messages=MESSAGES)
        return time.monotonic() - started

    assert run(proxy, agent) < 1.4
    # The handler was cancelled with its call: once the backend would have answered, still nothing is recorded.
    time.sleep(1.5)
    assert attempt.calls == [] and len(fake.received) == 1


def test_a_stream_closed_early_by_its_agent_cancels_the_call(proxy: CaptureProxy, fake: FakeVLLM) -> None:
    llm, attempt, _ = open_attempt(proxy, fake.url)
    fake.chunk_chars, fake.chunk_pause = 1, 0.2  # "reply 1": 7 pieces, 1.4 s

    async def agent() -> str:
        async with openai.AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0) as client:
            stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            async for _ in stream:
                break
            await stream.close()
            return (await client.chat.completions.create(model="m", messages=MESSAGES)).id

    second = run(proxy, agent)
    time.sleep(1.6)  # the stream would have ended by now
    assert [(c.response_id, c.streamed) for c in attempt.calls] == [(second, False)]


def test_an_agent_reading_a_stream_slowly_holds_the_proxy_to_a_bounded_lead_and_gets_it_whole(
    proxy: CaptureProxy, fake: FakeVLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Over a socket the proxy waits for its send buffer to drain; handed over in memory, it waits for the agent to
    # take what it wrote: a slow reader must not have the whole answer piled up in memory ahead of it.
    llm, attempt, _ = open_attempt(proxy, fake.url)
    fake.answer = lambda body: "x" * 200_000
    fake.chunk_chars, fake.chunk_pause = 100, 0  # 2,000 events of about 200 bytes, written as fast as they go
    leads: list[int] = []
    write = in_memory._Connection.write

    def measured(self: Any, data: bytes) -> None:
        leads.append(self.written - self.taken)  # unread when the handler writes again (one write may be large)
        write(self, data)

    monkeypatch.setattr(in_memory._Connection, "write", measured)

    async def agent() -> int:
        async with httpx2.AsyncClient() as client:
            body = {"model": "m", "messages": MESSAGES, "stream": True}
            async with client.stream("POST", f"{llm.endpoint}/chat/completions", json=body) as response:
                pieces = response.aiter_bytes()
                got = len(await anext(pieces))
                await asyncio.sleep(1.0)  # the backend's whole answer would be written by now
                async for piece in pieces:
                    got += len(piece)
                return got

    got = run(proxy, agent)
    assert leads and max(leads) <= in_memory.HIGH_WATER, f"wrote with {max(leads):,} bytes unread by the agent"
    (call,) = attempt.calls
    assert call.streamed and call.text == "x" * 200_000 and got > 200_000


def test_a_body_past_the_proxy_s_limit_goes_over_the_socket_and_is_refused_413(
    fake: FakeVLLM, handed: list[str]
) -> None:
    with served_proxy("own thread", in_memory=True, max_body_bytes=1000) as proxy:
        llm, attempt, _ = open_attempt(proxy, fake.url)

        async def agent() -> None:
            async with openai.AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0) as client:
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 5000}])

        with pytest.raises(openai.APIStatusError) as failed:
            run(proxy, agent)
    assert failed.value.status_code == 413 and handed == [] and attempt.calls == []


@pytest.mark.parametrize("where", WHERE)
def test_without_in_memory_calls_go_over_the_socket(where: str, fake: FakeVLLM, handed: list[str]) -> None:
    with served_proxy(where) as proxy:
        llm, attempt, _ = open_attempt(proxy, fake.url)

        async def agent() -> str:
            async with openai.AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0) as client:
                return (await client.chat.completions.create(model="m", messages=MESSAGES)).id

        assert run(proxy, agent) == attempt.calls[0].response_id
    assert handed == []


def test_a_sync_client_still_goes_over_the_socket(fake: FakeVLLM, handed: list[str]) -> None:
    with served_proxy("own thread", in_memory=True) as proxy:
        llm, attempt, _ = open_attempt(proxy, fake.url)
        with openai.OpenAI(base_url=llm.endpoint, api_key="none", max_retries=0) as client:
            reply = client.chat.completions.create(model="m", messages=MESSAGES)
    assert handed == [] and [c.response_id for c in attempt.calls] == [reply.id]


def test_a_stopped_proxy_s_address_is_no_longer_handed_over(fake: FakeVLLM, handed: list[str]) -> None:
    with served_proxy("agents' loop", in_memory=True) as proxy:
        llm, _, _ = open_attempt(proxy, fake.url)
        loop = proxy._loop
        assert loop is not None
        proxy.stop()  # its loop (the agents') keeps turning

        async def agent() -> None:
            async with openai.AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0) as client:
                await client.chat.completions.create(model="m", messages=MESSAGES)

        with pytest.raises(openai.APIConnectionError):
            asyncio.run_coroutine_threadsafe(agent(), loop).result(timeout=30)
    assert handed == []


@pytest.mark.parametrize("module", [httpx2, httpx], ids=["httpx2", "httpx"])
def test_the_httpx_internals_it_wraps(module: Any, fake: FakeVLLM) -> None:
    with served_proxy("own thread", in_memory=True) as proxy:
        assert module.__name__ in in_memory.LIBRARIES
        transport = module.AsyncHTTPTransport
        assert transport.handle_async_request.__wrapped__  # wrapped once, by install
        llm, attempt, _ = open_attempt(proxy, fake.url)

        async def agent() -> tuple[Any, Any]:
            async with module.AsyncClient(timeout=5) as client:
                whole = await client.post(f"{llm.endpoint}/chat/completions", json={"model": "m", "messages": MESSAGES})
                async with client.stream(
                    "POST",
                    f"{llm.endpoint}/chat/completions",
                    json={"model": "m", "messages": MESSAGES, "stream": True},
                ) as streamed:
                    body = b"".join([piece async for piece in streamed.aiter_bytes()])
                return whole, (streamed.status_code, streamed.headers["content-type"], body)

        whole, (status, content_type, body) = run(proxy, agent)
    assert whole.status_code == 200 and whole.json()["id"] == attempt.calls[0].response_id
    assert whole.headers["content-type"].startswith("application/json")
    assert status == 200 and content_type.startswith("text/event-stream") and body.endswith(b"data: [DONE]\n\n")
    assert len(attempt.calls) == 2


def test_the_openai_sdk_s_default_async_client_goes_through_the_wrapped_transport() -> None:
    client = openai.AsyncOpenAI(api_key="none")
    transport = client._client._transport  # the SDK's httpx2 client and its default transport
    assert isinstance(transport, httpx2.AsyncHTTPTransport)
    assert type(transport).handle_async_request is httpx2.AsyncHTTPTransport.handle_async_request


@pytest.mark.parametrize("setting", ["1", "0"])
def test_the_worker_setting_hands_calls_over_in_memory_or_not(setting: str) -> None:
    assert WorkerSettings.from_env({}).capture_in_memory is True
    with worker_proxy({"ROLLQ_CAPTURE_IN_MEMORY": setting}) as (_, proxy):
        key = (proxy.host, proxy.port)
        assert (in_memory._proxies.get(key) is proxy) is (setting == "1")
    assert key not in in_memory._proxies


AGENTS_CALLS_ON_THEIR_LOOP = "own thread, agents' calls on their loop"


@pytest.fixture
def served_on(monkeypatch: pytest.MonkeyPatch) -> list[asyncio.AbstractEventLoop]:
    """The loop each call handed over in memory was served on."""
    loops: list[asyncio.AbstractEventLoop] = []
    serve = in_memory._serve

    async def noted(handler: Any, request: Any) -> None:
        loops.append(asyncio.get_running_loop())
        await serve(handler, request)

    monkeypatch.setattr(in_memory, "_serve", noted)
    return loops


def test_calls_made_on_the_agents_loop_are_served_there_and_calls_from_other_loops_on_the_proxy_s_thread(
    fake: FakeVLLM, served_on: list[asyncio.AbstractEventLoop]
) -> None:
    with served_proxy(AGENTS_CALLS_ON_THEIR_LOOP, in_memory=True) as proxy:
        agents_loop, proxy_loop = proxy._agents_loop, proxy._loop
        assert agents_loop is not None and proxy_loop is not None and agents_loop is not proxy_loop
        llm, attempt, spans = open_attempt(proxy, fake.url)

        async def agent() -> str:
            async with openai.AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0) as client:
                return (await client.chat.completions.create(model="m", messages=MESSAGES)).id

        on_agents_loop = asyncio.run_coroutine_threadsafe(agent(), agents_loop).result(timeout=30)
        elsewhere = asyncio.run(agent())  # an agent's own loop on another thread (a sync agent's asyncio.run)
        assert served_on == [agents_loop, proxy_loop]
        assert set(proxy._clients) == {agents_loop, proxy_loop}  # each loop forwards on connections of its own
        assert [c.response_id for c in attempt.calls] == [on_agents_loop, elsewhere]
        assert len(spans.captured()) == 2
        proxy.stop()
        # Its connections on the agents' loop are closed there, and that loop keeps turning for the agents.
        assert proxy._clients == {}
        assert asyncio.run_coroutine_threadsafe(asyncio.sleep(0, "turning"), agents_loop).result(timeout=5) == "turning"


def test_a_weight_sync_pause_holds_calls_served_on_the_agents_loop_and_counts_those_running(
    fake: FakeVLLM, served_on: list[asyncio.AbstractEventLoop]
) -> None:
    """The gate is closed and opened on the proxy's thread; the calls it holds and counts run on the agents' loop."""
    with served_proxy(AGENTS_CALLS_ON_THEIR_LOOP, in_memory=True) as proxy:
        agents_loop = proxy._agents_loop
        assert agents_loop is not None
        llm, attempt, _ = open_attempt(proxy, fake.url)
        drained: list[Any] = []
        proxy.gate.on_drained = drained.append
        client = openai.AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0)

        def call() -> Any:
            return asyncio.run_coroutine_threadsafe(
                client.chat.completions.create(model="m", messages=MESSAGES), agents_loop
            )

        fake.delay = 1.0
        running = call()
        deadline = time.monotonic() + 10
        while not fake.received and time.monotonic() < deadline:
            time.sleep(0.02)
        counts = proxy.gate.close(1)  # the call already sent runs on, and is counted
        assert counts.in_flight == 1 and counts.closed_for == 1
        held = call()
        while not proxy.gate.read().waiting and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proxy.gate.read().waiting == 1 and not held.done()
        assert running.result(timeout=30).id in fake.sent
        assert len(drained) == 1 and drained[0].in_flight == 0  # the last one out reported drained
        assert len(fake.received) == 1 and not held.done()  # the held call never reached the backend
        fake.delay = 0
        proxy.gate.open("v2")
        assert held.result(timeout=30).id in fake.sent
        assert [c.resources_id for c in attempt.calls] == [None, "v2"]
        assert served_on == [agents_loop, agents_loop]


def test_a_sync_client_on_the_agents_loop_is_answered_by_the_proxy_s_thread(
    fake: FakeVLLM, served_on: list[asyncio.AbstractEventLoop]
) -> None:
    """What the proxy's own thread is for: an async agent that calls a sync client blocks its loop, so that call
    must be served elsewhere; it goes over the socket to the proxy's thread and is answered."""
    with served_proxy(AGENTS_CALLS_ON_THEIR_LOOP, in_memory=True) as proxy:
        agents_loop = proxy._agents_loop
        assert agents_loop is not None
        llm, attempt, _ = open_attempt(proxy, fake.url)

        async def agent() -> str:
            with openai.OpenAI(base_url=llm.endpoint, api_key="none", max_retries=0, timeout=10) as client:
                return client.chat.completions.create(model="m", messages=MESSAGES).id

        reply = asyncio.run_coroutine_threadsafe(agent(), agents_loop).result(timeout=30)
    assert served_on == [] and [c.response_id for c in attempt.calls] == [reply]


def test_while_the_agents_loop_is_busy_its_calls_are_served_on_the_proxy_s_thread(
    fake: FakeVLLM, served_on: list[asyncio.AbstractEventLoop]
) -> None:
    """On a loop whose callbacks wait for their turn, each step of a call served there would wait again: a CPU-bound
    worker's calls go to the proxy's thread until its agents' loop keeps up again."""
    lag = [0.0]
    with served_proxy(AGENTS_CALLS_ON_THEIR_LOOP, in_memory=True, agents_lag=lambda: lag[0]) as proxy:
        agents_loop, proxy_loop = proxy._agents_loop, proxy._loop
        assert agents_loop is not None and proxy.agents_busy_lag == 0.005
        llm, attempt, _ = open_attempt(proxy, fake.url)

        async def agent() -> str:
            async with openai.AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0) as client:
                return (await client.chat.completions.create(model="m", messages=MESSAGES)).id

        for lag[0] in (0.001, 0.005, 0.02, 0.004):
            asyncio.run_coroutine_threadsafe(agent(), agents_loop).result(timeout=30)
    assert served_on == [agents_loop, proxy_loop, proxy_loop, agents_loop]
    assert len(attempt.calls) == 4


@pytest.mark.parametrize("setting", ["1", "0"])
def test_the_worker_setting_serves_calls_handed_over_on_the_agents_loop_or_on_the_proxy_s_thread(
    setting: str,
) -> None:
    assert WorkerSettings.from_env({}).capture_in_memory_on_agent_loop is True
    with worker_proxy({"ROLLQ_CAPTURE_IN_MEMORY_ON_AGENT_LOOP": setting}) as (worker, proxy):
        assert proxy._thread is not None  # the socket is served on the proxy's thread either way
        assert (proxy._agents_loop is worker._executor.loop) is (setting == "1")
        assert proxy._agents_lag is not None and proxy.agents_busy_lag == 0.005
        worker._executor.lag = 0.123
        assert proxy._agents_lag() == 0.123  # the worker's own agents' loop, as it lags now


def test_the_worker_setting_sets_how_busy_the_agents_loop_may_be() -> None:
    with worker_proxy({"ROLLQ_CAPTURE_AGENT_LOOP_BUSY_MS": "12"}) as (_, proxy):
        assert proxy.agents_busy_lag == 0.012
