"""The capturing proxy served on the async agents' event loop (``ROLLQ_CAPTURE_ON_AGENT_LOOP=1``): what it shares
with the agents and what it leaves alone. The proxy's own behaviour on that loop is pinned by every test of
``test_capture_proxy.py``, whose proxy fixture runs both ways."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import Iterator

import openai
import pytest

from rollq.worker.capture import CaptureProxy
from rollq.worker.executor import AgentExecutor
from tests.support.capture import MESSAGES, open_attempt, worker_proxy
from tests.support.fake_vllm import FakeVLLM


@pytest.fixture
def executor() -> Iterator[AgentExecutor]:
    started = AgentExecutor()
    started.start()
    yield started
    started.stop()


def test_an_async_client_on_the_same_loop_as_the_proxy_is_answered_and_captured(
    executor: AgentExecutor, fake: FakeVLLM
) -> None:
    """The case the setting is for: the agent's ``openai`` client and the proxy take turns on one loop, with no
    thread between them."""
    proxy = CaptureProxy(loop=executor.loop).start()
    try:
        llm, attempt, spans = open_attempt(proxy, fake.url)

        async def agent() -> list[str]:
            assert asyncio.get_running_loop() is executor.loop
            client = openai.AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0)
            replies = await asyncio.gather(
                *(client.chat.completions.create(model="m", messages=MESSAGES) for _ in range(8))
            )
            await client.close()
            return [r.id for r in replies]

        ids = asyncio.run_coroutine_threadsafe(agent(), executor.loop).result(timeout=30)
        assert sorted(c.response_id or "" for c in attempt.calls) == sorted(ids)
        for call in attempt.calls:
            assert call.response_token_ids == fake.sent[call.response_id or ""].token_ids
        assert len(spans.captured()) == 8
    finally:
        proxy.stop()


def test_on_the_agents_loop_the_proxy_leaves_the_switch_interval_alone(executor: AgentExecutor) -> None:
    saved = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        proxy = CaptureProxy(loop=executor.loop).start()
        assert sys.getswitchinterval() == pytest.approx(0.005)  # no proxy thread waits for the GIL
        proxy.stop()
    finally:
        sys.setswitchinterval(saved)


def test_a_stopped_proxy_closes_its_port_and_the_agents_loop_keeps_turning(executor: AgentExecutor) -> None:
    proxy = CaptureProxy(loop=executor.loop).start()
    port = proxy.port
    proxy.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()

    async def still_turning() -> str:
        await asyncio.sleep(0)
        return "yes"

    assert asyncio.run_coroutine_threadsafe(still_turning(), executor.loop).result(timeout=5) == "yes"


def test_starting_it_from_the_loops_own_thread_is_refused_saying_why(executor: AgentExecutor) -> None:
    async def start_here() -> None:
        CaptureProxy(loop=executor.loop).start()

    with pytest.raises(RuntimeError, match="from a thread other than its loop's own"):
        asyncio.run_coroutine_threadsafe(start_here(), executor.loop).result(timeout=5)


def test_a_weight_sync_pause_holds_calls_on_the_agents_loop_until_it_opens(
    executor: AgentExecutor, fake: FakeVLLM
) -> None:
    """The gate binds to whichever loop serves: closed and opened from the pause follower's thread, as in a worker."""
    proxy = CaptureProxy(loop=executor.loop).start()
    try:
        llm, attempt, _ = open_attempt(proxy, fake.url)
        assert proxy.gate.loop is executor.loop
        proxy.gate.close(1)
        client = openai.AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0)
        call = asyncio.run_coroutine_threadsafe(
            client.chat.completions.create(model="m", messages=MESSAGES), executor.loop
        )
        deadline = time.monotonic() + 10
        while not proxy.gate.read().waiting and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proxy.gate.read().waiting == 1 and not call.done() and not fake.received
        proxy.gate.open("v2")
        assert call.result(timeout=30).id in fake.sent
        assert len(attempt.calls) == 1
    finally:
        proxy.stop()


@pytest.mark.parametrize("on_agent_loop", [False, True])
def test_the_worker_setting_puts_its_proxy_on_the_agents_loop_or_a_thread_of_its_own(on_agent_loop: bool) -> None:
    with worker_proxy({"ROLLQ_CAPTURE_ON_AGENT_LOOP": "1" if on_agent_loop else "0"}) as (worker, proxy):
        assert (proxy._loop is worker._executor.loop) is on_agent_loop
        assert (proxy._thread is None) is on_agent_loop
        port = proxy.port
        started = time.monotonic()
    # The proxy is closed before the agents' loop stops, not left listening on a loop that no longer turns.
    assert time.monotonic() - started < 4
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
