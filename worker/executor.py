"""Where agent code runs: async agents as tasks on one event loop, sync agents on daemon threads.

One event loop thread holds every async rollout of the process, which is what
lets a single worker keep hundreds of LLM calls in flight. A sync agent gets a
daemon thread of its own per rollout: a hung sync agent cannot be interrupted,
and a daemon thread at least never keeps the process from exiting once its
attempt has been timed out or handed back.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any

from rollq.models.errors import AgentTimeoutError


def _settle(future: Future[Any], result: Any = None, error: BaseException | None = None) -> None:
    # The waiting side may already have settled it (timeout, hand-back); the late outcome is dropped.
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except InvalidStateError:
        pass


class AgentExecutor:
    """Runs agent calls in a given context and hands back a Future for each."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: dict[Future[Any], asyncio.Task[Any]] = {}

    def start(self) -> None:
        ready = threading.Event()

        def serve() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="rollq-agent-loop", daemon=True)
        self._thread.start()
        ready.wait()

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def submit(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        context: contextvars.Context,
        is_async: bool,
        timeout: float,
    ) -> Future[Any]:
        """Start ``fn(*args)`` inside ``context``.

        The Future settles with the return value or exception, or with
        :class:`AgentTimeoutError` after ``timeout`` seconds (an async agent is
        then cancelled). Nothing waits on it: add a done callback.
        """
        assert self._loop is not None, "AgentExecutor.start() was not called"
        future: Future[Any] = Future()
        future.set_running_or_notify_cancel()
        self._loop.call_soon_threadsafe(self._arm_timeout, future, timeout)
        if is_async:
            self._loop.call_soon_threadsafe(self._spawn, fn, args, context, future)
        else:

            def target() -> None:
                try:
                    _settle(future, context.run(fn, *args))
                except BaseException as exc:  # the agent's failure is the rollout's, not this thread's
                    _settle(future, error=exc)

            threading.Thread(target=target, name="rollq-sync-agent", daemon=True).start()
        return future

    def _spawn(
        self, fn: Callable[..., Any], args: tuple[Any, ...], context: contextvars.Context, future: Future[Any]
    ) -> None:
        assert self._loop is not None
        try:
            task = self._loop.create_task(fn(*args), context=context)
        except BaseException as exc:
            _settle(future, error=exc)
            return
        self._tasks[future] = task

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.pop(future, None)
            if t.cancelled():
                _settle(future, error=asyncio.CancelledError())
            elif t.exception() is not None:
                _settle(future, error=t.exception())
            else:
                _settle(future, t.result())

        task.add_done_callback(done)

    def _arm_timeout(self, future: Future[Any], timeout: float) -> None:
        assert self._loop is not None
        timer = self._loop.call_later(timeout, self._expire, future, timeout)
        future.add_done_callback(lambda _: self._loop.call_soon_threadsafe(timer.cancel))  # type: ignore[union-attr]

    def _expire(self, future: Future[Any], timeout: float) -> None:
        _settle(future, error=AgentTimeoutError(f"ran past its {timeout:g}s limit"))
        self._cancel_task(future)

    def cancel(self, future: Future[Any]) -> None:
        """Stop the async agent behind ``future`` (a sync one cannot be stopped; its thread is abandoned)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._cancel_task, future)

    def _cancel_task(self, future: Future[Any]) -> None:
        task = self._tasks.pop(future, None)
        if task is not None:
            task.cancel()
