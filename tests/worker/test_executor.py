"""AgentExecutor's futures: what they hold on to once settled."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
import time
import weakref
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import fakeredis
import pytest

from rollq.models.errors import AgentExitError
from rollq.worker import LitAgent, RolloutWorker, WorkerSettings
from rollq.worker.collector import YOUNG_THRESHOLD, widen_young_generation
from rollq.worker.executor import EVENT_LOOP_VARIABLE, AgentExecutor, new_agent_loop


@pytest.fixture
def executor() -> Iterator[AgentExecutor]:
    running = AgentExecutor()
    running.start()
    yield running
    running.stop()


class Holder:
    """Stands for the worker's record of an attempt: it holds the future, whose callback closes over it."""

    def __init__(self, future: Future[Any], seen: list[Any], called: threading.Event) -> None:
        self.future = future
        future.add_done_callback(lambda f: (seen.append((self.future is f, f.result())), called.set()))


async def answer(gate: threading.Event) -> int:
    while not gate.is_set():
        await asyncio.sleep(0.001)
    return 42


def sync_answer(gate: threading.Event) -> int:
    gate.wait(10)
    return 42


@pytest.mark.parametrize("is_async", [True, False], ids=["async", "sync"])
def test_a_settled_future_lets_go_of_its_callbacks_so_its_holder_is_freed_without_the_cycle_collector(
    executor: AgentExecutor, is_async: bool
) -> None:
    # A reference cycle per rollout (holder -> future -> callback -> holder) sent every attempt's spans
    # into the oldest GC generation; full collections then took ~17% of a worker's CPU at 1000 in flight.
    called = threading.Event()
    seen: list[Any] = []
    gc.collect()
    gc.disable()
    try:
        fn = answer if is_async else sync_answer
        gate = threading.Event()
        holder = Holder(executor.submit(fn, (gate,), contextvars.copy_context(), is_async, 10.0, "r"), seen, called)
        gate.set()  # the callback is in place before the agent returns, as in the worker
        assert called.wait(10)
        assert seen == [(True, 42)]
        ref = weakref.ref(holder)
        del holder
        assert ref() is None
    finally:
        gc.enable()


def test_a_callback_added_after_settling_runs_at_once(executor: AgentExecutor) -> None:
    gate = threading.Event()
    gate.set()
    future = executor.submit(sync_answer, (gate,), contextvars.copy_context(), False, 10.0, "r")
    assert future.result(timeout=10) == 42
    seen: list[int] = []
    future.add_done_callback(lambda f: seen.append(f.result()))
    assert seen == [42]


def test_a_failing_callback_does_not_stop_the_next(executor: AgentExecutor, caplog: pytest.LogCaptureFixture) -> None:
    gate = threading.Event()
    future = executor.submit(sync_answer, (gate,), contextvars.copy_context(), False, 10.0, "r")
    seen: list[int] = []
    future.add_done_callback(lambda f: 1 / 0)
    future.add_done_callback(lambda f: seen.append(f.result()))
    gate.set()
    assert future.result(timeout=10) == 42
    deadline = threading.Event()
    while not seen and not deadline.wait(0.01):
        pass
    assert seen == [42]
    assert "exception calling callback" in caplog.text


def test_a_burst_of_async_submissions_wakes_the_loop_once_and_runs_each_call_in_its_own_context(
    executor: AgentExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each wake-up of the loop from another thread is a write to its socket and a read back; the worker's
    # start batch submits many attempts in a row, and one wake-up starts them all.
    loop = executor._loop
    assert loop is not None
    blocked, release = threading.Event(), threading.Event()
    loop.call_soon_threadsafe(lambda: (blocked.set(), release.wait(10)))
    assert blocked.wait(10)
    wakes: list[int] = []
    drain = executor._spawn_submitted

    def counting() -> None:
        wakes.append(1)
        drain()

    monkeypatch.setattr(executor, "_spawn_submitted", counting)
    var: contextvars.ContextVar[str] = contextvars.ContextVar("rollout")

    async def read(i: int) -> tuple[int, str]:
        await asyncio.sleep(0)
        return i, var.get()

    def submit(i: int) -> Future[Any]:
        context = contextvars.Context()
        context.run(var.set, f"c{i}")
        return executor.submit(read, (i,), context, True, 10.0, f"r{i}")

    try:
        futures = [submit(i) for i in range(50)]
    finally:
        release.set()
    assert [f.result(timeout=10) for f in futures] == [(i, f"c{i}") for i in range(50)]
    assert len(wakes) == 1
    # Once the loop has taken the burst, the next submission wakes it again.
    assert submit(50).result(timeout=10) == (50, "c50")
    assert len(wakes) == 2


def test_agents_run_on_uvloop_unless_the_environment_asks_for_asyncios_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    uvloop = pytest.importorskip("uvloop")
    monkeypatch.delenv(EVENT_LOOP_VARIABLE, raising=False)
    loop = new_agent_loop()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
    monkeypatch.setenv(EVENT_LOOP_VARIABLE, "asyncio")
    loop = new_agent_loop()
    try:
        assert not isinstance(loop, uvloop.Loop) and isinstance(loop, asyncio.BaseEventLoop)
    finally:
        loop.close()


@pytest.fixture
def gc_threshold() -> Iterator[None]:
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


@pytest.mark.usefixtures("gc_threshold")
def test_starting_a_worker_widens_the_young_generation_but_never_narrows_it_or_turns_collection_back_on() -> None:
    gc.set_threshold(700, 10, 10)
    worker = RolloutWorker(
        ["gc"], connection=fakeredis.FakeRedis(), agent=_Noop(), settings=WorkerSettings(capture_llm=False)
    )
    worker.bootstrap(logging_level="WARNING")
    try:
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
    finally:
        worker.teardown()
    gc.set_threshold(20_000, 5, 5)
    widen_young_generation()
    assert gc.get_threshold() == (20_000, 5, 5)
    gc.set_threshold(0, 10, 10)
    widen_young_generation()
    assert gc.get_threshold() == (0, 10, 10)


class _Noop(LitAgent):
    async def training_rollout_async(self, task_input: object, rollout_id: str, resources: object) -> float:
        return 1.0


def test_the_loop_s_lag_rises_while_its_callbacks_wait_for_their_turn_and_falls_once_they_do_not(
    executor: AgentExecutor,
) -> None:
    """What the capturing proxy reads to leave a busy agents' loop alone: how late the loop's ticks run."""
    time.sleep(0.5)
    assert executor.lag < 0.005, f"an idle loop lags {executor.lag * 1000:.1f} ms"
    busy_until = time.monotonic() + 1.0

    def hog() -> None:  # each turn of the loop holds it 30 ms, as a CPU-bound worker's agents do
        time.sleep(0.03)
        if time.monotonic() < busy_until:
            executor.loop.call_soon(hog)

    executor.loop.call_soon_threadsafe(hog)
    time.sleep(1.0)
    assert executor.lag > 0.01, f"a loop held 30 ms a turn lags {executor.lag * 1000:.1f} ms"
    time.sleep(1.5)
    assert executor.lag < 0.005, f"{executor.lag * 1000:.1f} ms once it turns freely again"


async def stop_the_loop(how: str) -> float:
    loop = asyncio.get_running_loop()
    if how == "stop":
        loop.stop()
    elif how == "callback":
        loop.call_soon(loop.stop)
    else:  # past any guard on the instance: the loop class's own stop
        type(loop).stop(loop)
    await asyncio.sleep(0.3)
    return 1.0


@pytest.mark.parametrize("how", ["stop", "callback", "class"])
def test_an_agent_stopping_the_loop_leaves_it_turning_for_the_others(executor: AgentExecutor, how: str) -> None:
    # loop.stop() from an agent had ended the loop's thread: no async rollout of the worker could finish after it.
    gate = threading.Event()
    neighbour = executor.submit(answer, (gate,), contextvars.copy_context(), True, 10.0, "neighbour")
    stopper = executor.submit(stop_the_loop, (how,), contextvars.copy_context(), True, 10.0, "stopper")
    if how == "class":  # nothing can tell this one from rollq's own stop: the loop is run again, the rollout goes on
        assert stopper.result(timeout=5) == 1.0
    else:  # the stop is refused, and the rollout that asked for it fails saying what it did
        with pytest.raises(AgentExitError, match=r"stop\(\).*event loop"):
            stopper.result(timeout=5)
    gate.set()
    assert neighbour.result(timeout=5) == 42
    time.sleep(1.5)
    assert executor.stalled_for() == 0
    later = executor.submit(answer, (gate,), contextvars.copy_context(), True, 10.0, "later")
    assert later.result(timeout=5) == 42
