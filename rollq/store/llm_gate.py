"""The namespace's LLM gate: pausing every worker's capturing proxy for a weight sync, and seeing it drained.

A trainer that loads new weights into its inference servers must not let an LLM call run on half-updated ones.
:meth:`LLMGate.pause` sets ``{ns}:llm-pause`` (``lua/llm_pause.lua``); each worker's proxy sees it at its next
heartbeat (``lua/llm_report.lua``, piggybacked on the heartbeat's round trip), closes its gate so no new
upstream call starts (calls wait, bounded, then get 503 + Retry-After), and reports the calls still running. The
pause returns once every live worker has closed its gate and has none running (``lua/llm_status.lua``).
:meth:`LLMGate.resume` deletes the key and announces it on a channel the paused workers listen on, with the
latest resources id, so the calls they admit from then on carry the version they run against.

A worker is live while its report has not expired (three heartbeats): a worker that dies during a pause stops
holding it within that time. A worker that starts during a pause reads the key before its proxy admits a call.

The blocking and the asyncio gate share the script calls and the reading of their replies (this module).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import redis
import redis.asyncio
from redis.exceptions import NoScriptError

from rollq.models.errors import LLMPauseTimeoutError

from .keys import Keys
from .scripts import script_source

POLL_SECONDS = 0.05
"""How often a pause reads the gate's status while it waits for the workers to drain."""
LISTED = 20
"""Workers named in a status (and a timeout error) at most."""
REPORT_TTL_BEATS = 3
"""A worker's report stays live for this many of its heartbeat intervals."""
SWEEP_EVERY = 10
"""A worker's report drops the expired reports of other workers on one report in this many (from a random start),
and writes its own then even if unchanged: the fleet sweeps, and a report a failover lost is written again."""
PAUSE, RESUME = "pause", "resume"
"""The kinds of message on the gate's channel (see :func:`parse_event`)."""


@dataclass(frozen=True)
class PauseReport:
    """What a pause found: how long the workers took to drain, and how many there were."""

    seconds_to_drained: float
    """From the pause being set to the status that showed every live worker drained."""
    workers: int
    """Live workers whose capturing proxy reports to the gate (each one closed it)."""
    epoch: int
    """The pause's number (pauses so far in this namespace)."""
    calls_at_pause: int = 0
    """LLM calls the workers reported running when they first saw the pause, summed."""
    waiting: int = 0
    """Calls waiting at the workers' gates when drained (as of their last report)."""


@dataclass(frozen=True)
class GateStatus:
    """One reading of the gate: the pause epoch (None: not paused) and the live workers' reports."""

    epoch: int | None
    workers: int
    acknowledged: int
    in_flight: int
    waiting: int
    now: float
    busy: dict[str, int] = field(default_factory=dict)
    """Workers not drained (up to :data:`LISTED`): in-flight count, or -1 when they have not closed their gate."""

    @property
    def paused(self) -> bool:
        return self.epoch is not None

    @property
    def drained(self) -> bool:
        return self.paused and self.acknowledged == self.workers and self.in_flight == 0


@dataclass(frozen=True)
class GateReading:
    """What a worker's report got back: the pause epoch (None: not paused) and the latest resources id."""

    epoch: int | None
    latest: str | None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def pause_args(keys: Keys, lease: float | None) -> tuple[list[str], list[Any]]:
    return [keys.llm_pause, keys.llm_gate], [round(lease * 1000) if lease else 0, keys.llm_gate_channel]


def resume_args(keys: Keys) -> tuple[list[str], list[Any]]:
    return [keys.llm_pause, keys.llm_gate, keys.resources_latest], [keys.llm_gate_channel]


def status_args(keys: Keys) -> tuple[list[str], list[Any]]:
    return [keys.llm_pause, keys.llm_workers, keys.llm_calls], [LISTED]


def report_args(
    keys: Keys,
    worker: str,
    *,
    ack: int,
    in_flight: int,
    waiting: int,
    interval: float,
    write: bool = True,
    sweep: bool = True,
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of ``llm_report.lua`` for one worker's report (``write``: even if the worker's entry is there;
    ``sweep``: drop expired reports too)."""
    ttl = max(REPORT_TTL_BEATS * interval, 2.0)
    return (
        [keys.llm_workers, keys.llm_calls, keys.llm_pause, keys.resources_latest],
        [worker, ack, in_flight, waiting, ttl, int(write), int(sweep)],
    )


def parse_status(reply: list[Any]) -> GateStatus:
    epoch = _text(reply[0])
    rest = reply[6:]
    busy: dict[str, int] = {}
    for i in range(0, len(rest) - 2, 3):
        worker, ack, calls = _text(rest[i]), _text(rest[i + 1]), int(rest[i + 2])
        busy[worker] = calls if epoch and ack == epoch else -1
    return GateStatus(
        epoch=int(epoch) if epoch else None,
        workers=int(reply[1]),
        acknowledged=int(reply[2]),
        in_flight=int(reply[3]),
        waiting=int(reply[4]),
        now=float(_text(reply[5])),
        busy=dict(list(busy.items())[:LISTED]),
    )


def parse_reading(reply: list[Any]) -> GateReading:
    epoch, latest = _text(reply[0]), _text(reply[1])
    return GateReading(int(epoch) if epoch else None, latest or None)


@dataclass(frozen=True)
class GateEvent:
    """A message on the gate's channel: a pause (its epoch) or a resume (the epoch lifted, the latest version)."""

    kind: Literal["pause", "resume"]
    epoch: int | None
    latest: str | None = None


def parse_event(data: Any) -> GateEvent:
    """The :class:`GateEvent` of a channel message (``pause|<epoch>`` or ``resume|<epoch>|<latest>``);
    ValueError for anything else."""
    text = _text(data)
    kind, _, rest = text.partition("|")
    epoch, _, latest = rest.partition("|")
    if kind == PAUSE and epoch.isdigit():
        return GateEvent("pause", int(epoch))
    if kind == RESUME:
        return GateEvent("resume", int(epoch) if epoch.isdigit() else None, latest or None)
    raise ValueError(f"not a gate event: {text[:80]!r}")


class _Drain:
    """The arithmetic of waiting for a pause to drain, shared by the blocking and the asyncio gate."""

    def __init__(self, epoch: int, timeout: float) -> None:
        self.epoch = epoch
        self.timeout = timeout
        self.started = time.monotonic()
        self.calls_at_pause = 0

    def check(self, status: GateStatus) -> PauseReport | None:
        """The report once ``status`` shows the pause drained; raises when the timeout has passed."""
        self.calls_at_pause = max(self.calls_at_pause, status.in_flight)
        if status.drained:
            return PauseReport(
                seconds_to_drained=time.monotonic() - self.started,
                workers=status.workers,
                epoch=self.epoch,
                calls_at_pause=self.calls_at_pause,
                waiting=status.waiting,
            )
        if time.monotonic() - self.started >= self.timeout:
            busy = {w: n for w, n in status.busy.items() if n > 0}
            raise LLMPauseTimeoutError(self.timeout, busy, [w for w, n in status.busy.items() if n < 0])
        return None


class LLMGate:
    """The trainer's side of the gate, on a blocking client."""

    def __init__(self, connection: redis.Redis, keys: Keys) -> None:
        self.connection = connection
        self.keys = keys
        self._pause = connection.register_script(script_source("llm_pause"))
        self._resume = connection.register_script(script_source("llm_resume"))
        self._status = connection.register_script(script_source("llm_status"))

    def pause(self, timeout: float = 60.0, *, lease: float | None = None) -> PauseReport:
        """Pause and return once no LLM call runs on any live worker; :class:`LLMPauseTimeoutError` after
        ``timeout`` (the pause stays). ``lease``: the pause lifts itself after that many seconds."""
        keys, args = pause_args(self.keys, lease)
        drain = _Drain(int(_text(self._pause(keys=keys, args=args)[0])), timeout)
        while True:
            report = drain.check(self.status())
            if report is not None:
                return report
            time.sleep(POLL_SECONDS)

    def resume(self) -> None:
        """Lift the pause (a no-op when not paused); paused workers hear it at once."""
        keys, args = resume_args(self.keys)
        self._resume(keys=keys, args=args)

    def status(self) -> GateStatus:
        keys, args = status_args(self.keys)
        return parse_status(self._status(keys=keys, args=args))


class AsyncLLMGate:
    """The trainer's side of the gate, on an asyncio client."""

    def __init__(self, connection: redis.asyncio.Redis, keys: Keys) -> None:
        self.connection = connection
        self.keys = keys
        self._pause = connection.register_script(script_source("llm_pause"))
        self._resume = connection.register_script(script_source("llm_resume"))
        self._status = connection.register_script(script_source("llm_status"))

    async def pause(self, timeout: float = 60.0, *, lease: float | None = None) -> PauseReport:
        """See :meth:`LLMGate.pause`."""
        keys, args = pause_args(self.keys, lease)
        drain = _Drain(int(_text((await self._pause(keys=keys, args=args))[0])), timeout)
        while True:
            report = drain.check(await self.status())
            if report is not None:
                return report
            await asyncio.sleep(POLL_SECONDS)

    async def resume(self) -> None:
        keys, args = resume_args(self.keys)
        await self._resume(keys=keys, args=args)

    async def status(self) -> GateStatus:
        keys, args = status_args(self.keys)
        return parse_status(await self._status(keys=keys, args=args))


class GateReporter:
    """A worker's side of the gate: its reports (queued in the heartbeat's pipeline, or sent alone).

    A report writes the worker's entry (``ack|in_flight|waiting``) only when the worker does not know that Redis
    holds it already: most heartbeats of an idle worker cost ``TIME``, ``ZADD`` and ``MGET`` inside Redis. It knows
    only after a report whose reply it read while no other of its reports was on the way (the heartbeat's and one
    sent at once from another thread may be applied in either order); a report whose reply never came counts as
    on the way for :data:`REPORT_TTL_BEATS` intervals. One report in :data:`SWEEP_EVERY` writes in any case.
    """

    def __init__(
        self, connection: redis.Redis, keys: Keys, worker: str, interval: float, *, sweep_every: int = SWEEP_EVERY
    ) -> None:
        self.connection = connection
        self.keys = keys
        self.worker = worker
        self.interval = interval
        self.sweep_every = sweep_every
        self._report = connection.register_script(script_source("llm_report"))
        self._lock = threading.Lock()
        self._held: str | None = None
        """The entry Redis holds for this worker, when the worker knows it (else None)."""
        self._sent = 0  # reports sent so far (the number of the latest)
        self._unread: dict[int, float] = {}  # reports on the way: number -> when sent (monotonic)
        self._overlapped: set[int] = set()  # reports that were on the way at the same time as another
        self._count = random.randrange(sweep_every)  # reports so far, from a random start: the fleet's sweeps spread

    def _begin(self, value: str) -> tuple[int, bool, bool]:
        """Number the report of ``value``; whether it must write its entry, and whether it sweeps."""
        with self._lock:
            now = time.monotonic()
            settled = now - REPORT_TTL_BEATS * self.interval  # a reply this late never comes: its connection failed
            for number in [n for n, at in self._unread.items() if at < settled]:
                self._end_locked(number, None)
            self._count += 1
            sweep = self._count % self.sweep_every == 0
            write = sweep or bool(self._unread) or value != self._held
            self._sent += 1
            if self._unread:
                self._overlapped.update((*self._unread, self._sent))
            self._unread[self._sent] = now
            return self._sent, write, sweep

    def _end(self, number: int, value: str | None) -> None:
        """The report ``number`` came back (``value``: what it reported) or failed (None)."""
        with self._lock:
            self._end_locked(number, value)

    def _end_locked(self, number: int, value: str | None) -> None:
        # Known held: it came back, alone on the way all along, and no report was sent after it. A reply that
        # comes after its report was given up (or any failure) leaves the worker not knowing.
        # (Alone all along implies the latest: a report sent while it was on the way would have overlapped it.)
        alone = self._unread.pop(number, None) is not None and number not in self._overlapped
        self._overlapped.discard(number)
        self._held = value if alone and value is not None else None

    def _args(self, ack: int, in_flight: int, waiting: int) -> tuple[int, str, list[str], list[Any]]:
        value = f"{ack}|{in_flight}|{waiting}"
        number, write, sweep = self._begin(value)
        keys, args = report_args(
            self.keys,
            self.worker,
            ack=ack,
            in_flight=in_flight,
            waiting=waiting,
            interval=self.interval,
            write=write,
            sweep=sweep,
        )
        return number, value, keys, args

    def queue(self, pipe: Any, *, ack: int, in_flight: int, waiting: int) -> Callable[[Any], GateReading]:
        """Queue the report on ``pipe`` (``EVALSHA`` alone, no ``SCRIPT EXISTS`` round trip); returns the reader of
        its reply (``execute(raise_on_error=False)``), which runs the script on its own after a ``NOSCRIPT``."""
        number, value, keys, args = self._args(ack, in_flight, waiting)
        pipe.evalsha(self._report.sha, len(keys), *keys, *args)

        def read(reply: Any) -> GateReading:
            def script_reply() -> Any:
                if isinstance(reply, NoScriptError):
                    return self._report(keys=keys, args=args)
                if isinstance(reply, BaseException):
                    raise reply
                return reply

            return self._read(number, value, script_reply)

        return read

    def report(self, *, ack: int, in_flight: int, waiting: int) -> GateReading:
        """Send the report on its own."""
        number, value, keys, args = self._args(ack, in_flight, waiting)
        return self._read(number, value, lambda: self._report(keys=keys, args=args))

    def _read(self, number: int, value: str, reply: Callable[[], Any]) -> GateReading:
        """The reading of report ``number``'s reply, noting that it came back (or failed)."""
        try:
            reading = parse_reading(reply())
        except BaseException:
            self._end(number, None)
            raise
        self._end(number, value)
        return reading

    def leave(self) -> None:
        """Take this worker's report away (it stops): a pause no longer waits for it."""
        pipe = self.connection.pipeline(transaction=True)
        pipe.zrem(self.keys.llm_workers, self.worker)
        pipe.hdel(self.keys.llm_calls, self.worker)
        pipe.execute()

    def latest(self) -> GateReading:
        """The pause epoch and latest resources id, read without reporting."""
        epoch, latest = self.connection.mget([self.keys.llm_pause, self.keys.resources_latest])
        return GateReading(int(_text(epoch)) if epoch else None, _text(latest) if latest else None)

    def listen(self) -> Any:
        """A pub/sub subscription to the gate's pause and resume announcements (close it when done)."""
        pubsub = self.connection.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(self.keys.llm_gate_channel)
        return pubsub
