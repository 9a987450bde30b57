"""Admission of upstream LLM calls in one worker process: the proxy's side of a weight-sync pause.

Every upstream request the capturing proxy sends for a captured call is admitted here first
(:meth:`CallGate.admit`) and released when its answer has been read to the end (:meth:`CallGate.release`). While
the gate is closed no request is admitted: callers wait, up to ``wait_seconds``, then get :class:`GateTimeout`
(the proxy answers 503 with Retry-After). Requests already admitted run on; when the last one is released while
closed, ``on_drained`` is called so the worker can report at once instead of at its next heartbeat.

The gate also knows the latest resources version this worker has seen (from its heartbeat reports, the resume
announcement and its claims): each admitted request is stamped with it, the version its call ran against.

It lives on the proxy's event loop; :meth:`close` and :meth:`open` are called from other threads and hand over
to the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


class GateTimeout(Exception):
    """A call waited at the closed gate for longer than the gate's bound."""

    def __init__(self, waited: float, retry_after: int) -> None:
        self.waited, self.retry_after = waited, retry_after
        super().__init__(f"LLM calls are paused for a weight sync; waited {waited:.1f}s")


def version_number(resources_id: str | None) -> int:
    """The number of a ``v<N>`` resources id, for ordering versions (-1 for None or another form)."""
    if resources_id and resources_id[0] == "v" and resources_id[1:].isdigit():
        return int(resources_id[1:])
    return -1


@dataclass(frozen=True)
class GateCounts:
    """The gate's counts at one moment (read on the loop)."""

    closed_for: int
    in_flight: int
    waiting: int


class CallGate:
    """Open or closed for a pause epoch; counts admitted and waiting upstream requests."""

    def __init__(self, wait_seconds: float = 60.0, retry_after: int = 5) -> None:
        self.wait_seconds = wait_seconds
        self.retry_after = retry_after
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed_for = 0
        """The pause epoch the gate is closed for; 0 when open."""
        self.in_flight = 0
        self.waiting = 0
        self.version: str | None = None
        self.on_drained: Callable[[GateCounts], None] | None = None
        self._open = threading.Event()  # a flag readable anywhere; waiters wait on _opened (the loop's)
        self._open.set()
        self._opened: asyncio.Event | None = None
        self._closed_at = 0.0
        self.resumed_at: float | None = None
        self.first_call_after_resume: float | None = None
        """Seconds from the last opening to the first request admitted after it (None until there is one)."""

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Attach to the proxy's loop (called on it, before any request)."""
        self.loop = loop
        self._opened = asyncio.Event()
        if self._open.is_set():
            self._opened.set()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    def note_version(self, resources_id: str | None) -> None:
        """Remember ``resources_id`` as the latest version if it is newer than the one known (any thread)."""
        if resources_id and version_number(resources_id) >= version_number(self.version):
            self.version = resources_id

    # -- on the loop -----------------------------------------------------------------------------------------
    async def admit(self) -> str | None:
        """Wait until the gate is open (bounded) and count one request in flight; returns the version it runs
        against. :class:`GateTimeout` when it stayed closed for ``wait_seconds``."""
        if self._open.is_set():
            self._admitted()
            return self.version
        assert self._opened is not None, "the gate is bound to the proxy's loop"
        started = time.monotonic()
        self.waiting += 1
        try:
            while not self._open.is_set():
                left = self.wait_seconds - (time.monotonic() - started)
                if left <= 0:
                    raise GateTimeout(time.monotonic() - started, self.retry_after)
                try:
                    # asyncio.timeout, not wait_for: no task per waiter, so a resume that wakes hundreds of calls
                    # at once schedules them and nothing more.
                    async with asyncio.timeout(left):
                        await self._opened.wait()
                except TimeoutError:
                    continue
        finally:
            self.waiting -= 1
        self._admitted()
        return self.version

    def _admitted(self) -> None:
        self.in_flight += 1
        if self.first_call_after_resume is None and self.resumed_at is not None:
            self.first_call_after_resume = time.monotonic() - self.resumed_at
            log.info("first LLM call admitted %.1f ms after the resume", self.first_call_after_resume * 1000)

    def release(self) -> None:
        """One admitted request is over (answered, failed or cut)."""
        self.in_flight -= 1
        if self.in_flight == 0 and not self._open.is_set() and self.on_drained is not None:
            self.on_drained(self.counts())

    def counts(self) -> GateCounts:
        """The counts now (from any thread: the epoch is read first, so a closed gate's calls are never
        understated)."""
        closed_for = self.closed_for
        return GateCounts(closed_for, self.in_flight, self.waiting)

    def _close(self, epoch: int) -> GateCounts:
        if self._open.is_set():
            self._closed_at = time.monotonic()
            self._open.clear()
            if self._opened is not None:  # unbound: the proxy is not started yet, and bind() copies the state
                self._opened.clear()
        self.closed_for = epoch
        return self.counts()

    def _reopen(self, version: str | None) -> GateCounts:
        # The version first: a request admitted from here on runs against the weights published before the resume.
        self.note_version(version)
        if not self._open.is_set():
            self.resumed_at = time.monotonic()
            self.first_call_after_resume = None
            log.info(
                "LLM calls resumed after %.2fs paused (pause %d); %d call(s) waiting; version %s",
                self.resumed_at - self._closed_at,
                self.closed_for,
                self.waiting,
                self.version,
            )
        self.closed_for = 0
        self._open.set()
        if self._opened is not None:
            self._opened.set()
        return self.counts()

    # -- from other threads ----------------------------------------------------------------------------------
    def close(self, epoch: int, timeout: float = 10.0) -> GateCounts:
        """Close the gate for pause ``epoch``; returns the counts once no request can be admitted any more."""
        return self._on_loop(lambda: self._close(epoch), timeout)

    def open(self, version: str | None, timeout: float = 10.0) -> GateCounts:
        """Open the gate, with ``version`` as the latest resources version if newer."""
        return self._on_loop(lambda: self._reopen(version), timeout)

    def read(self, timeout: float = 10.0) -> GateCounts:
        return self._on_loop(self.counts, timeout)

    def _on_loop(self, action: Callable[[], GateCounts], timeout: float) -> GateCounts:
        loop = self.loop
        if loop is None or not loop.is_running():
            return action()  # not serving yet (or any more): nothing runs concurrently with us
        done: concurrent.futures.Future[GateCounts] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(action())
            except BaseException as exc:
                done.set_exception(exc)

        loop.call_soon_threadsafe(run)
        return done.result(timeout)
