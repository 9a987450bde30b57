"""The GIL switch interval while the capturing proxy's thread serves a call over its socket: lowered to 1 ms (or the
worker's setting) for as long as any is served there, a lower one kept, put back after the last one and on stop; left
alone by calls handed over in memory."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future

import fakeredis
import openai
import pytest
from opentelemetry import trace
from opentelemetry.context import Context

from rollq.models.contract import LLM
from rollq.worker import LitAgent
from rollq.worker.capture import CaptureProxy
from rollq.worker.capture.gil import SWITCH_INTERVAL_SECONDS
from rollq.worker.config import InvalidSettingError, WorkerSettings
from rollq.worker.rq_worker import RolloutWorker
from tests.support.capture import MESSAGES, open_attempt, served_proxy
from tests.support.fake_vllm import FakeVLLM
from tests.support.waiting import wait_until


@pytest.fixture
def interval() -> Iterator[None]:
    saved = sys.getswitchinterval()
    yield
    sys.setswitchinterval(saved)


def _socket_call(llm: LLM) -> Future[str]:
    """A sync client's call over the proxy's socket, made on a thread of its own."""
    done: Future[str] = Future()

    def call() -> None:
        try:
            with openai.OpenAI(base_url=llm.endpoint, api_key="none", max_retries=0, timeout=30) as client:
                done.set_result(client.chat.completions.create(model="m", messages=MESSAGES).id)
        except BaseException as exc:
            done.set_exception(exc)

    threading.Thread(target=call, daemon=True).start()
    return done


def _while_at_the_backend(fake: FakeVLLM, call: Callable[[], Future[str]]) -> tuple[float, str]:
    """The switch interval while ``call``'s request waits at the backend, and the call's response id."""
    fake.delay = 0.5
    answered = call()
    wait_until(lambda: fake.in_flight == 1, "the call at the backend")
    during = sys.getswitchinterval()
    return during, answered.result(timeout=30)


def test_the_proxy_s_thread_lowers_the_interval_while_it_serves_a_socket_call_and_puts_it_back_after(
    interval: None, fake: FakeVLLM
) -> None:
    sys.setswitchinterval(0.005)  # CPython's default
    with served_proxy("own thread") as proxy:
        assert sys.getswitchinterval() == pytest.approx(0.005)  # running, no call yet: left alone
        llm, attempt, _ = open_attempt(proxy, fake.url)
        during, reply = _while_at_the_backend(fake, lambda: _socket_call(llm))
        assert during == pytest.approx(SWITCH_INTERVAL_SECONDS)
        assert sys.getswitchinterval() == pytest.approx(0.005)  # the last call served: put back
        assert [c.response_id for c in attempt.calls] == [reply]


def test_a_proxy_stopped_while_its_thread_serves_a_call_puts_the_interval_back(interval: None, fake: FakeVLLM) -> None:
    sys.setswitchinterval(0.005)
    proxy = CaptureProxy().start()
    try:
        llm, _, _ = open_attempt(proxy, fake.url)
        fake.delay = 5.0
        cut = _socket_call(llm)
        wait_until(lambda: fake.in_flight == 1, "the call at the backend")
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_SECONDS)
    finally:
        proxy.stop()
    assert sys.getswitchinterval() == pytest.approx(0.005)
    with pytest.raises(openai.APIConnectionError):
        cut.result(timeout=30)


def test_calls_handed_over_in_memory_leave_the_interval_on_the_agents_loop_and_on_the_proxy_s_thread(
    interval: None, fake: FakeVLLM
) -> None:
    """An async agent's calls handed over in memory run on its own loop, where no thread waits for the GIL; while
    that loop is busy they are served on the proxy's thread, whose answers go back to that loop, which needs the GIL
    as much: a CPU-bound worker did better at 5 ms (bench/agent_calls.py, agent_calls_switch). Only a call over the
    socket lowers it."""
    sys.setswitchinterval(0.005)
    lag = [0.0]
    with served_proxy("own thread, agents' calls on their loop", in_memory=True, agents_lag=lambda: lag[0]) as proxy:
        agents_loop = proxy._agents_loop
        assert agents_loop is not None
        llm, attempt, _ = open_attempt(proxy, fake.url)
        client = openai.AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0)

        async def agent() -> str:
            return (await client.chat.completions.create(model="m", messages=MESSAGES)).id

        def on_agents_loop() -> Future[str]:
            return asyncio.run_coroutine_threadsafe(agent(), agents_loop)

        on_loop, _ = _while_at_the_backend(fake, on_agents_loop)
        lag[0] = 1.0
        on_thread, _ = _while_at_the_backend(fake, on_agents_loop)
        over_socket, _ = _while_at_the_backend(fake, lambda: _socket_call(llm))
        assert (on_loop, on_thread) == (pytest.approx(0.005), pytest.approx(0.005))
        assert over_socket == pytest.approx(SWITCH_INTERVAL_SECONDS)
        assert sys.getswitchinterval() == pytest.approx(0.005)
        assert len(attempt.calls) == 3


def test_a_shorter_interval_set_by_the_user_is_kept(interval: None, fake: FakeVLLM) -> None:
    sys.setswitchinterval(0.0002)
    with served_proxy("own thread") as proxy:
        llm, _, _ = open_attempt(proxy, fake.url)
        during, _ = _while_at_the_backend(fake, lambda: _socket_call(llm))
        assert during == pytest.approx(0.0002)
    assert sys.getswitchinterval() == pytest.approx(0.0002)


def test_a_proxy_told_to_leave_it_leaves_it(interval: None, fake: FakeVLLM) -> None:
    sys.setswitchinterval(0.005)
    with served_proxy("own thread", switch_interval=None) as proxy:
        llm, _, _ = open_attempt(proxy, fake.url)
        during, _ = _while_at_the_backend(fake, lambda: _socket_call(llm))
        assert during == pytest.approx(0.005)


class _Noop(LitAgent):
    async def training_rollout_async(self, task_input: object, rollout_id: str, resources: object) -> float:
        return 1.0


@pytest.mark.parametrize(("setting_ms", "expected"), [(None, SWITCH_INTERVAL_SECONDS), (0.25, 0.00025), (0, None)])
def test_a_worker_gives_its_proxy_the_switch_interval_of_its_setting(
    interval: None, setting_ms: float | None, expected: float | None
) -> None:
    """ROLLQ_CAPTURE_SWITCH_INTERVAL_MS: 1 ms unless set; 0 leaves the interpreter's (a CPU-bound worker's choice)."""
    sys.setswitchinterval(0.005)
    overrides = {} if setting_ms is None else {"capture_switch_interval_ms": setting_ms}
    worker = RolloutWorker(
        ["gil"], connection=fakeredis.FakeRedis(), agent=_Noop(), settings=WorkerSettings.from_env({}, **overrides)
    )
    worker.bootstrap(logging_level="WARNING")
    try:
        capture = worker._capture
        assert capture is not None and capture.proxy is None  # the proxy starts with the first LLM resource
        _, attempt = capture.open_attempt(
            {"llm": LLM(endpoint="http://127.0.0.1:9/v1", model="m")}, Context(), trace.get_tracer(__name__)
        )
        assert attempt is not None and capture.proxy is not None
        assert capture.proxy.switch_interval == pytest.approx(expected)
        assert sys.getswitchinterval() == pytest.approx(0.005)  # until its thread serves a call
        attempt.close()
    finally:
        worker.teardown()
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_a_negative_switch_interval_setting_is_refused_naming_the_variable() -> None:
    with pytest.raises(InvalidSettingError, match="ROLLQ_CAPTURE_SWITCH_INTERVAL_MS"):
        WorkerSettings.from_env({"ROLLQ_CAPTURE_SWITCH_INTERVAL_MS": "-1"})
