"""Admission of upstream LLM calls in one worker process: the proxy's side of a weight-sync pause.

Every upstream request the capturing proxy sends for a captured call is admitted here first
(:meth:`CallGate.admit`) and released when its answer has been read to the end (:meth:`CallGate.release`). While
the gate is closed no request is admitted: callers wait, up to ``wait_seconds``, then get :class:`GateTimeout`
(the proxy answers 503 with Retry-After). Requests already admitted run on; when the last one is released while
closed, ``on_drained`` is called so the worker can report at once instead of at its next heartbeat.

The gate also knows the latest resources version this worker has seen (from its heartbeat reports, the resume
announcement and its claims): each admitted request is stamped with it, the version its call ran against.

It lives on the proxy's event loop, and on the agents' loop too where calls handed over in memory are served
there (:mod:`.in_memory`): admission and the counts are taken under a lock, so a request admitted on either loop
is counted before :meth:`close` returns, and an opening wakes the waiters of every loop. :meth:`close` and
:meth:`open` are called from other threads and hand over to the proxy's loop.
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
        """The proxy's loop, where :meth:`close` and :meth:`open` run."""
        self.closed_for = 0
        """The pause epoch the gate is closed for; 0 when open."""
        self.in_flight = 0
        self.waiting = 0
        self.version: str | None = None
        self.on_drained: Callable[[GateCounts], None] | None = None
        self._open = threading.Event()  # a flag readable anywhere; waiters wait on their own loop's _opened event
        self._open.set()
        self._lock = threading.Lock()  # the flag's changes, the counts, and the events by loop
        self._opened: dict[asyncio.AbstractEventLoop, asyncio.Event] = {}
        self._closed_at = 0.0
        self.resumed_at: float | None = None
        self.first_call_after_resume: float | None = None
        """Seconds from the last opening to the first request admitted after it (None until there is one)."""

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Attach to the proxy's loop (called on it, before any request)."""
        self.loop = loop
        self._event(loop)

    def _event(self, loop: asyncio.AbstractEventLoop) -> asyncio.Event:
        """``loop``'s event of the gate's opening (made on ``loop``, the first time a call there waits)."""
        with self._lock:
            event = self._opened.get(loop)
            if event is None:
                event = self._opened[loop] = asyncio.Event()
                if self._open.is_set():
                    event.set()
            return event

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
        if self._try_admit():
            return self.version
        opened = self._event(asyncio.get_running_loop())
        started = time.monotonic()
        with self._lock:
            self.waiting += 1
        try:
            while not self._try_admit():
                left = self.wait_seconds - (time.monotonic() - started)
                if left <= 0:
                    raise GateTimeout(time.monotonic() - started, self.retry_after)
                try:
                    # asyncio.timeout, not wait_for: no task per waiter, so a resume that wakes hundreds of calls
                    # at once schedules them and nothing more.
                    async with asyncio.timeout(left):
                        await opened.wait()
                except TimeoutError:
                    continue
        finally:
            with self._lock:
                self.waiting -= 1
        return self.version

    def _try_admit(self) -> bool:
        """Count one request in flight if the gate is open: the check and the count under the lock, so that no
        request slips in on another loop between a :meth:`close` and its counts."""
        with self._lock:
            if not self._open.is_set():
                return False
            self.in_flight += 1
        if self.first_call_after_resume is None and self.resumed_at is not None:
            self.first_call_after_resume = time.monotonic() - self.resumed_at
            log.info("first LLM call admitted %.1f ms after the resume", self.first_call_after_resume * 1000)
        return True

    def release(self) -> None:
        """One admitted request is over (answered, failed or cut)."""
        with self._lock:
            self.in_flight -= 1
            drained = self.in_flight == 0 and not self._open.is_set()
            counts = self.counts()
        if drained and self.on_drained is not None:
            self.on_drained(counts)

    def counts(self) -> GateCounts:
        """The counts now (from any thread: the epoch is read first, so a closed gate's calls are never
        understated)."""
        closed_for = self.closed_for
        return GateCounts(closed_for, self.in_flight, self.waiting)

    def _close(self, epoch: int) -> GateCounts:
        with self._lock:
            if self._open.is_set():
                self._closed_at = time.monotonic()
                self._open.clear()
                for event in self._opened.values():  # clear() wakes nobody: safe from any thread
                    event.clear()
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
        with self._lock:
            self.closed_for = 0
            self._open.set()
            events = list(self._opened.items())
            counts = self.counts()
        for loop, event in events:
            _set_on(loop, event)
        return counts

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


def _set_on(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
    """Set ``loop``'s ``event``: at once on that loop's own thread, else handed to it (an asyncio event wakes its
    waiters on its loop only)."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop or not loop.is_running():
        event.set()  # a loop that is not running has nobody waiting in it: its waiters see the flag when it turns
        return
    try:
        loop.call_soon_threadsafe(event.set)
    except RuntimeError:  # closed meanwhile: nobody waits there any more
        pass
