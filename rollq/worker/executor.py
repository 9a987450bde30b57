"""Where agent code runs: async agents as tasks on one event loop, sync agents on daemon threads.

One event loop thread holds every async rollout of the process, which is what
lets a single worker keep hundreds of LLM calls in flight. A sync agent gets a
daemon thread of its own per rollout: a hung sync agent cannot be interrupted,
and a daemon thread at least never keeps the process from exiting once its
attempt has been timed out or handed back.

Time limits are kept by a watchdog thread, not by timers on the loop: an async
agent that makes a blocking call stops the loop, and with it any timer on it.
The loop stamps a tick every ``TICK_SECONDS``; the watchdog fails attempts past
their limit whatever the loop does, names the rollout blocking the loop, and
reports a loop blocked past the limit of every attempt it held (see
:class:`AgentExecutor`). No exception an agent raises, BaseExceptions included,
escapes to the loop or a thread of the worker: it settles the rollout's future.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

from rollq.models.errors import AgentExitError, AgentTimeoutError
from rollq.models.outcomes import describe

from .event_loop import new_event_loop

log = logging.getLogger(__name__)

TICK_SECONDS = 0.1
"""How often the loop stamps that it is turning."""
WATCH_SECONDS = 0.2
"""How often the watchdog looks."""
BUSY_LAG_SECONDS = 0.005
"""A loop whose callbacks wait this long for their turn (its :attr:`AgentExecutor.lag`) is busy: the capturing proxy
serves the calls its agents hand over on its own thread instead (``ROLLQ_CAPTURE_AGENT_LOOP_BUSY_MS``)."""
LAG_WEIGHT = 0.3
"""The weight of the newest tick's lateness in :attr:`AgentExecutor.lag` (a moving average over about a second)."""
STALLED_AFTER_SECONDS = 1.0
"""A loop that has not ticked for this long is stalled: the watchdog warns, heartbeats stop vouching for it."""
PAUSED_AFTER_SECONDS = 1.0
"""A watchdog that woke this much later than it asked to, while the process used less than half that time in CPU, saw
the whole process stopped (SIGSTOP, a VM paused, a machine asleep), not an agent blocking the loop."""


EVENT_LOOP_VARIABLE = "ROLLQ_EVENT_LOOP"
"""``asyncio`` runs the agents on the standard library's loop instead of uvloop's."""


def new_agent_loop() -> asyncio.AbstractEventLoop:
    """The event loop async agents run on (:func:`~rollq.worker.event_loop.new_event_loop`): uvloop's unless
    ``ROLLQ_EVENT_LOOP=asyncio`` keeps the standard library's, for an agent library that does not work on uvloop."""
    return new_event_loop(uvloop_allowed=os.environ.get(EVENT_LOOP_VARIABLE, "").lower() != "asyncio")


def _settle(future: Future[Any], result: Any = None, error: BaseException | None = None) -> None:
    # The waiting side may already have settled it (timeout, hand-back); the late outcome is dropped.
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except InvalidStateError:
        pass


class _Outcome(Future[Any]):
    """A Future that lets go of its done callbacks once they have run.

    A plain ``concurrent.futures.Future`` keeps them as long as it lives, so a
    callback that closes over whatever holds the future (the worker's record of
    the attempt) makes a reference cycle, and every attempt's spans then wait in
    memory for a full garbage collection: at 1000 rollouts in flight those took
    ~17% of a worker's CPU (bench/profile.py with gc callbacks).

    ``Future`` calls ``_invoke_callbacks`` once, after it has settled and outside its lock; a callback added
    after that is called at once by ``add_done_callback`` and never stored, so the list taken here is all of
    them. (It had a lock and a list of its own: two more lock round trips and calls per rollout.)
    """

    def _invoke_callbacks(self) -> None:
        fields = self.__dict__  # Future's own, which typeshed does not declare
        callbacks: list[Callable[[Future[Any]], object]] = fields["_done_callbacks"]
        fields["_done_callbacks"] = []
        for fn in callbacks:
            _call(fn, self)


def _call(fn: Callable[[Future[Any]], object], future: Future[Any]) -> None:
    try:
        fn(future)
    except Exception:  # as concurrent.futures does: one failing callback does not stop the others
        log.exception("exception calling callback for %r", future)


def contained(exc: BaseException, name: str) -> Exception:
    """``exc`` as the rollout's failure: a BaseException that is not an Exception (SystemExit, KeyboardInterrupt,
    GeneratorExit, a CancelledError the agent raised itself) would stop the thread or loop that sees it, or pass
    every ``except Exception`` on its way to the publication, so it becomes an :class:`AgentExitError` naming it.

    rollq's own cancels (time limit, hand-back, a lost attempt) settle the attempt before they cancel the agent, so
    the CancelledError they raise in the agent never reaches here as the rollout's failure."""
    if isinstance(exc, Exception):
        return exc
    log.error("rollout %s: the agent raised %s; failing the rollout, the worker carries on", name, describe(exc))
    error = AgentExitError(f"the agent raised {describe(exc)}")
    error.__cause__ = exc
    return error


_AGENT_CALL: contextvars.ContextVar[Future[Any] | None] = contextvars.ContextVar("rollq_agent_call", default=None)
"""The attempt whose agent code runs now (set in each async rollout's context): who called the loop's stop()."""


class BlockedByNeighbour(Exception):
    """Set on an async attempt whose time limit passed while another rollout blocked the event loop: the runner
    hands it back to the queue instead of failing it."""


@dataclass
class _Running:
    name: str
    deadline: float  # time.monotonic()
    timeout: float
    is_async: bool
    started: float


class AgentExecutor:
    """Runs agent calls in a given context and hands back a Future for each.

    ``on_wedged(blocker, stalled_for)`` is called once (from the watchdog thread) when the loop has been blocked
    for longer than the time limit of every async attempt it held when it stopped turning: nothing on it can
    still finish in time, and only a new process can run async rollouts again.
    """

    def __init__(self, on_wedged: Callable[[str, float], None] | None = None) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: dict[Future[Any], asyncio.Task[Any]] = {}
        self._running: dict[Future[Any], _Running] = {}
        self._lock = threading.Lock()
        self._tick = time.monotonic()
        self._due: float | None = None  # when the next tick is due
        self.lag = 0.0
        """Seconds the loop's ticks ran late, a moving average: how long a callback ready on the loop waits for its
        turn (what the busier loop adds to every step of every agent). Read from any thread."""
        self._stopping = threading.Event()
        self._warned_stall: float | None = None
        self._stall_limit: float | None = None  # the last deadline among the attempts a stalled loop holds
        self._wedged = False
        self.on_wedged = on_wedged
        self.stall_note = ""
        """Added to the warning about a blocked loop (the worker says when its capturing proxy shares the loop)."""
        # Async calls submitted and not yet started on the loop; one wake-up of the loop starts them all.
        self._inbox: list[tuple[Callable[..., Any], tuple[Any, ...], contextvars.Context, Future[Any], str]] = []
        self._wake_queued = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop async agents run on (its thread runs it from :meth:`start` on)."""
        assert self._loop is not None, "AgentExecutor.start() was not called"
        return self._loop

    def start(self) -> None:
        ready = threading.Event()

        def serve() -> None:
            loop = self._loop = new_agent_loop()
            loop.stop = self._refuse_stop(loop.stop)  # type: ignore[method-assign]
            asyncio.set_event_loop(loop)
            loop.call_soon(self._stamp)
            ready.set()
            while not self._stopping.is_set():
                try:
                    loop.run_forever()
                except BaseException:  # a callback let something through: log it and keep the loop turning
                    log.exception("the agent event loop stopped on an exception; restarting it")
                else:
                    if not self._stopping.is_set():  # stopped past the guard below (the loop class's own stop)
                        log.error("the agent event loop was stopped, not by rollq; restarting it")

        self._thread = threading.Thread(target=serve, name="rollq-agent-loop", daemon=True)
        self._thread.start()
        ready.wait()
        threading.Thread(target=self._watch, name="rollq-watchdog", daemon=True).start()

    def _refuse_stop(self, stop: Callable[[], None]) -> Callable[[], None]:
        """The agent loop's ``stop``: rollq's own (from :meth:`stop`) stops it; any other is refused, and the rollout
        whose code asked for it (from its task, or a callback it scheduled, which runs in its context) fails with
        an :class:`AgentExitError` saying so. A stopped loop had ended its thread, and with it every async rollout
        of the worker, until the watchdog made the worker exit."""

        def refused() -> None:
            if self._stopping.is_set():
                stop()
                return
            future = _AGENT_CALL.get()
            with self._lock:
                running = self._running.get(future) if future is not None else None
            name = running.name if running is not None else "(none: not called from a rollout)"
            log.error("rollout %s called stop() on the agent event loop: refused, the loop keeps running", name)
            if future is not None:
                error = AgentExitError(
                    "the agent called stop() on the worker's event loop, which runs every async rollout of the "
                    "worker; refused, the loop keeps running"
                )
                _settle(future, error=error)
                self.cancel(future)

        return refused

    def stop(self) -> None:
        self._stopping.set()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _stamp(self) -> None:
        assert self._loop is not None
        now = time.monotonic()
        if self._due is not None:
            self.lag += LAG_WEIGHT * (max(0.0, now - self._due) - self.lag)
        self._tick, self._due = now, now + TICK_SECONDS
        self._loop.call_later(TICK_SECONDS, self._stamp)

    def stalled_for(self) -> float:
        """Seconds since the loop last turned, when that is over ``STALLED_AFTER_SECONDS``; else 0."""
        since = time.monotonic() - self._tick
        return since if since > STALLED_AFTER_SECONDS else 0.0

    def submit(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        context: contextvars.Context,
        is_async: bool,
        timeout: float,
        name: str = "",
    ) -> Future[Any]:
        """Start ``fn(*args)`` inside ``context``; ``name`` (the rollout) is what warnings call it.

        The Future settles with the return value or exception, or with
        :class:`AgentTimeoutError` after ``timeout`` seconds (an async agent is
        then cancelled), even if the agent blocks the event loop. Nothing waits on it: add a done callback.
        """
        assert self._loop is not None, "AgentExecutor.start() was not called"
        future: Future[Any] = _Outcome()
        future.set_running_or_notify_cancel()
        future.add_done_callback(self._forget)
        started = time.monotonic()
        wake = False
        with self._lock:
            self._running[future] = _Running(name, started + timeout, timeout, is_async, started)
            if is_async:
                self._inbox.append((fn, args, context, future, name))
                wake, self._wake_queued = not self._wake_queued, True
        if not is_async:

            def target() -> None:
                try:
                    _settle(future, context.run(fn, *args))
                except BaseException as exc:  # the agent's failure is the rollout's, not this thread's
                    _settle(future, error=contained(exc, name))

            threading.Thread(target=target, name="rollq-sync-agent", daemon=True).start()
        elif wake:
            # Once per burst of submissions (the worker's start batch submits many attempts in a row): each
            # call_soon_threadsafe writes to the loop's wake-up socket and the loop reads it back.
            self._loop.call_soon_threadsafe(self._spawn_submitted)
        return future

    def _spawn_submitted(self) -> None:
        with self._lock:
            inbox, self._inbox, self._wake_queued = self._inbox, [], False
        for fn, args, context, future, name in inbox:
            self._spawn(fn, args, context, future, name)

    def _forget(self, future: Future[Any]) -> None:
        with self._lock:
            self._running.pop(future, None)

    def _spawn(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        context: contextvars.Context,
        future: Future[Any],
        name: str,
    ) -> None:
        assert self._loop is not None
        if future.done():
            return  # timed out or handed back before the loop got to it

        async def guarded() -> Any:
            try:
                return await fn(*args)
            except BaseException as exc:
                if isinstance(exc, asyncio.CancelledError) and future.done():
                    raise  # rollq's own cancel: the attempt was settled (timed out, handed back, lost) first
                raise contained(exc, name) from None

        try:
            context.run(_AGENT_CALL.set, future)  # the agent's code runs in it (its callbacks too): stop() looks
            task = self._loop.create_task(guarded(), name=name or None, context=context)
        except BaseException as exc:
            _settle(future, error=contained(exc, name))
            return
        self._tasks[future] = task

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.pop(future, None)
            if t.cancelled():  # by rollq once it settled the attempt; else by the agent's code, which fails it
                _settle(future, error=AgentExitError("the agent's task was cancelled, not by rollq"))
            elif t.exception() is not None:
                _settle(future, error=t.exception())
            else:
                _settle(future, t.result())

        task.add_done_callback(done)

    def cancel(self, future: Future[Any]) -> None:
        """Stop the async agent behind ``future`` (a sync one cannot be stopped; its thread is abandoned)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._cancel_task, future)

    def _cancel_task(self, future: Future[Any]) -> None:
        task = self._tasks.pop(future, None)
        if task is not None:
            task.cancel()

    # -- the watchdog --------------------------------------------------------

    def _watch(self) -> None:
        woke, cpu = time.monotonic(), time.process_time()
        while not self._stopping.wait(WATCH_SECONDS):
            slept, woke = woke, time.monotonic()
            ran, cpu = cpu, time.process_time()
            try:
                self._forgive_pause(woke - slept - WATCH_SECONDS, cpu - ran, slept)
                self._check()
            except Exception:
                log.exception("watchdog check failed")

    def _forgive_pause(self, late: float, cpu: float, slept: float) -> None:
        """The watchdog woke ``late`` seconds later than it asked to (it went to sleep at ``slept``), while the process
        used ``cpu`` seconds of CPU. Late by over :data:`PAUSED_AFTER_SECONDS` with the CPU time still (under half of
        it): every thread of the process was stopped, the watchdog's as much as the loop's (SIGSTOP and SIGCONT, a
        VM paused, a machine asleep). It says so in one line, and moves the loop's last tick on by the pause, which
        no agent spent: a loop that had not ticked since before the pause is not blocked by it.

        A thread that holds the GIL in a blocking call of a C extension also keeps the watchdog from running, but
        burns CPU while it computes; only one blocking without the GIL and without CPU would pass for a pause.
        Before, the watchdog could be first to run after a SIGCONT and warned that an async agent made a blocking
        call; after a pause past every attempt's limit it made the worker exit as wedged."""
        if late <= PAUSED_AFTER_SECONDS or cpu >= late / 2:
            return
        # The pause began before the watchdog was due (else it had woken): a tick older than that is from before the
        # pause, the loop not having turned since (the watchdog ran first after it).
        if self._tick < slept + WATCH_SECONDS:
            self._tick += late
            if self._due is not None:
                self._due += late
        log.warning(
            "the worker process was paused for %.1fs (stopped and continued, a VM paused or a machine asleep: "
            "every thread, not an agent); time limits kept running meanwhile",
            late,
        )

    def _blocker(self) -> str:
        task = asyncio.current_task(self._loop) if self._loop is not None else None
        return task.get_name() if task is not None else "(none: a callback, not a rollout)"

    def _check(self) -> None:
        now = time.monotonic()
        with self._lock:
            running = list(self._running.items())
        stalled = self.stalled_for()
        blocker = self._blocker() if stalled else None
        for future, r in running:
            if now >= r.deadline and not future.done():
                if stalled and r.is_async and r.name != blocker and r.deadline >= self._tick:
                    # Its time ran out while another rollout blocked the loop it runs on: not its fault. It is
                    # handed back (to run again, its attempt not charged), not failed as timed out.
                    _settle(future, error=BlockedByNeighbour(f"rollout {blocker} blocked the event loop"))
                else:
                    _settle(future, error=AgentTimeoutError(f"ran past its {r.timeout:g}s limit"))
                self.cancel(future)
        if not stalled:
            self._warned_stall = None
            return
        since = self._tick
        if self._warned_stall != since:
            # The limits of the attempts the loop holds, taken when the stall is first seen: the watchdog fails
            # them one by one, and a failed attempt is forgotten; attempts started later are not waited for.
            self._warned_stall = since
            held = [r.deadline for _, r in running if r.is_async]
            self._stall_limit = max(held) if held else None
            log.warning(
                "the agent event loop is blocked (%.1fs so far) by rollout %s: an async agent made a blocking call%s",
                stalled,
                self._blocker(),
                self.stall_note,
            )
        # Past the deadline of every attempt the loop held: the loop above has failed each of them by now.
        if self._stall_limit is not None and now >= self._stall_limit and not self._wedged:
            self._wedged = True
            if self.on_wedged is not None:
                self.on_wedged(self._blocker(), stalled)
