"""The worker's background beat: heartbeats for running attempts, and the reaper.

It runs on its own thread so that neither a busy event loop nor a main thread
blocked on RQ's dequeue can delay a heartbeat; a missed heartbeat is what makes
another worker take the task over. Deadlines are computed by Redis when the
heartbeat arrives (``store/lua/beat.lua``), so a heartbeat held up by a stalled
Redis still counts in full.

The periodic reaper pass is the namespace's, not each worker's: workers take it in turns
(:func:`store.reaper.take_turn`), and a worker with no attempt running and no turn sends
that one ``SET NX`` and nothing else. Whoever holds the turn also keeps the namespace's
clock (``lua/beat.lua``): a turn is held for ``TURN_SHARE`` of an interval, so some
worker takes the next one within an interval and the clock's promises hold.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from rollq.store.connection import REFUSALS, transient_refusal
from rollq.store.reaper import queue_take_turn, reap, take_turn
from rollq.store.replies import Clock
from rollq.store.transitions import Lifecycle

log = logging.getLogger(__name__)

REAP_BATCH = 200
"""Stale attempts one reaper pass handles; a pass that comes back full is followed by another (see beat)."""

TURN_SHARE = 0.8
"""The reaping turn lapses after this share of an interval: before its holder's own next try, so one live worker
alone still reaps every interval, and a fleet makes about one pass per interval."""


class Heartbeat(threading.Thread):
    """Every ``interval`` seconds: push back the deadlines of the attempts ``members()`` vouches for (``member`` ->
    unresponsive_seconds), then reap stale ones."""

    def __init__(
        self,
        lifecycle: Lifecycle,
        members: Callable[[], dict[str, float]],
        *,
        interval: float,
        results_maxlen: int,
        on_beat: Callable[[], None] | None = None,
        on_lost: Callable[[list[str]], object] | None = None,
        piggyback: Callable[[Any], Callable[[Any], None]] | None = None,
    ) -> None:
        super().__init__(name="rollq-heartbeat", daemon=True)
        self.lifecycle = lifecycle
        self.members = members
        self.interval = interval
        self.results_maxlen = results_maxlen
        self.on_beat = on_beat
        self.on_lost = on_lost
        self.piggyback = piggyback
        """Queues a command of its own on the beat's first round trip (the LLM gate's report); what it returns
        reads that command's reply."""
        self._stop_event = threading.Event()
        self._refused_in_beat = False  # this beat met Redis refusing writes (see _refusal)

    def beat(self) -> None:
        members = self.members()
        turn = self._take_turn()
        if not members and not turn:
            # Idle and not this worker's turn: nothing to vouch for, and the turn's holder keeps the clock.
            if self.on_beat is not None:
                self.on_beat()
            return
        clock = self.lifecycle.beat(members, within=self.interval)
        if members and self.on_lost is not None:
            # An attempt no longer in flight was cancelled or taken over by a reaper: its agent
            # works for nothing, so the worker is told to stop it and free the slot.
            names = list(members)
            scores = self.lifecycle.connection.zmscore(self.lifecycle.keys.inflight, names)
            lost = [m for m, score in zip(names, scores, strict=True) if score is None]
            if lost:
                self.on_lost(lost)
        if self.on_beat is not None:
            self.on_beat()
        if turn:
            # One pass handles at most REAP_BATCH stale attempts; after a host with thousands in flight died,
            # the turn holder goes on while passes come back full (within half its turn), instead of the
            # namespace draining 200 per interval (40/s at the default 5 s).
            until = time.monotonic() + self.interval * TURN_SHARE / 2
            pass_clock: Clock | None = clock
            while True:
                report = reap(
                    self.lifecycle,
                    results_maxlen=self.results_maxlen,
                    limit=REAP_BATCH,
                    within=self.interval,
                    clock=pass_clock,
                )
                if report.requeued + report.failed < REAP_BATCH or time.monotonic() >= until:
                    break
                pass_clock = None  # the next pass reads Redis's clock again

    def _take_turn(self) -> bool:
        if self.piggyback is None:
            return take_turn(self.lifecycle, self.interval * TURN_SHARE)
        pipe = self.lifecycle.connection.pipeline(transaction=False)
        queue_take_turn(self.lifecycle, self.interval * TURN_SHARE, pipe)
        try:
            read = self.piggyback(pipe)
        except Exception:  # the piggyback never costs the attempts their heartbeat
            log.exception("the heartbeat's piggyback failed; trying again at the next heartbeat")
            read = None
        replies = pipe.execute(raise_on_error=False)
        if read is not None:
            try:
                read(replies[1])
            except Exception as exc:
                if _refusal(exc):
                    self._refused_in_beat = True
                else:
                    log.exception("the heartbeat's piggyback failed; trying again at the next heartbeat")
        if isinstance(replies[0], Exception):
            raise replies[0]
        return bool(replies[0])

    def run(self) -> None:
        # The first beat at once, not an interval later: it starts the namespace clock's promise (``due``), so a
        # Redis stall right after this worker's first claims is seen as a stall and not as dead workers.
        first = True
        while first or not self._stop_event.wait(self.interval):
            first = False
            self._refused_in_beat = False
            try:
                self.beat()
            except redis.RedisError as exc:
                if not _refusal(exc):
                    log.warning("heartbeat failed (%s); trying again in %.0fs", exc, self.interval)
            except Exception:
                log.exception("heartbeat failed; trying again in %.0fs", self.interval)
            else:
                if not self._refused_in_beat:  # a whole beat written: if Redis was refusing writes, no longer
                    REFUSALS.accepted()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=self.interval + 5)


def _refusal(error: BaseException) -> bool:
    """Whether ``error`` is Redis refusing commands for now (OOM, READONLY...: :func:`transient_refusal`); noted in
    the process-wide :data:`REFUSALS` (one line when a refusal starts, one when it ends), not once per beat."""
    if isinstance(error, redis.ResponseError) and transient_refusal(error) is not None:
        REFUSALS.refused(error)
        return True
    return False
