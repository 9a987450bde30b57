"""A worker's side of a weight-sync pause: reports on the heartbeat, closing and opening the proxy's gate.

At each heartbeat the worker reports its gate (the pause epoch it is closed for, calls running upstream, calls
waiting) in the heartbeat's own round trip and reads back the pause epoch and the latest resources id
(``store/lua/llm_report.lua``). On a new pause it closes the gate and reports again at once with the calls still
running; when the last of them ends it reports at once again (the trainer's pause is waiting for exactly that).

With ``listen`` (the worker setting ``llm_gate_listen``, on by default) the worker also follows the gate's
channel for as long as it runs: a pause closes the gate at once, not at the next heartbeat, for one idle Redis
connection per worker process. Without it, it listens only while paused, so a resume still opens the gate at
once. Either way the heartbeat catches up with whatever an announcement missed (a dropped connection, a lease
that ran out).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Any

import redis

from rollq.store.llm_gate import GateReading, GateReporter, parse_event

from .gate import CallGate, GateCounts

log = logging.getLogger(__name__)


class PauseFollower:
    """Keeps one worker's :class:`CallGate` in step with its namespace's LLM gate."""

    def __init__(self, reporter: GateReporter, gate: CallGate, *, listen: bool = True) -> None:
        self.reporter = reporter
        self.gate = gate
        self.listen_always = listen
        self._lock = threading.Lock()  # one report decision at a time (heartbeat, drained, listener)
        self._listener: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lifted = 0  # the newest pause epoch this worker saw lifted: a reading taken before that is stale
        # How many times this follower closed or opened the gate: a heartbeat's reading asked for before the latest
        # change (the listener applied an announcement while the reading was on its way) says nothing newer.
        self._changes = 0
        # Reports made when the last call ends: off the proxy's loop, one at a time.
        self._reports = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollq-llm-gate")
        gate.on_drained = self._drained

    # -- start and stop --------------------------------------------------------------------------------------
    def start(self) -> None:
        """Report once before the proxy admits any call: a worker that starts during a pause honours it. With
        ``listen``, subscribe first, so no announcement falls between the reading and the subscription."""
        pubsub = self._subscribe() if self.listen_always else None
        counts = self.gate.counts()
        self._apply(self.reporter.report(ack=counts.closed_for, in_flight=counts.in_flight, waiting=counts.waiting))
        if pubsub is not None:
            self._start_listener(pubsub)

    def stop(self) -> None:
        self._stopping.set()
        self._reports.shutdown(wait=True, cancel_futures=True)
        if self._listener is not None:
            self._listener.join(timeout=5)
        try:
            self.reporter.leave()
        except redis.RedisError as exc:
            log.warning("could not take this worker's LLM gate report away (%s); it expires on its own", exc)

    # -- the heartbeat's piggyback ---------------------------------------------------------------------------
    def queue(self, pipe: Any) -> Callable[[Any], None]:
        """Queue this beat's report on the heartbeat's pipeline; the returned function reads its reply.

        The counts are read off the proxy's loop, without waiting for it (a busy loop never delays a heartbeat):
        the epoch first, then the calls, so a report can only overstate what runs under a closed gate."""
        taken = self._changes
        counts = self.gate.counts()
        read = self.reporter.queue(pipe, ack=counts.closed_for, in_flight=counts.in_flight, waiting=counts.waiting)

        def done(reply: Any) -> None:
            self._apply(read(reply), taken=taken)

        return done

    # -- what a reading means ----------------------------------------------------------------------------------
    def _apply(self, reading: GateReading, *, taken: int | None = None) -> None:
        """Follow ``reading``: a heartbeat's (``taken``: :attr:`_changes` when it was asked for) or an announcement's
        or a report's of its own (None: newer than any change this follower made)."""
        with self._lock:
            if taken is not None and taken != self._changes:
                # The gate changed while this reading was on its way: read as a missed resume, a "no pause" taken
                # before a pause's announcement reopened the gate and marked the pause lifted, so the worker
                # never acknowledged it (a trainer's weight_sync timed out). The next heartbeat reads afresh.
                return
            if reading.epoch is None:
                if not self.gate.is_open:
                    # The resume announcement was missed, or the pause's lease ran out.
                    self._lifted = max(self._lifted, self.gate.closed_for)
                    self._changes += 1
                    self.gate.open(reading.latest)
                else:
                    self.gate.note_version(reading.latest)
                return
            self.gate.note_version(reading.latest)
            if self.gate.closed_for == reading.epoch or reading.epoch <= self._lifted:
                return
            self._changes += 1
            counts = self.gate.close(reading.epoch)
            log.info(
                "LLM calls paused (pause %d): %d running upstream, new calls wait", reading.epoch, counts.in_flight
            )
            # At once, not at the next heartbeat: the trainer's pause waits for this acknowledgement.
            self.reporter.report(ack=counts.closed_for, in_flight=counts.in_flight, waiting=counts.waiting)
            if not self.listen_always:
                self._listen()

    def _drained(self, counts: GateCounts) -> None:
        # On the proxy's loop: the last running call of a paused worker ended. Report from a thread.
        if self._stopping.is_set():
            return
        try:
            self._reports.submit(self._report_drained)
        except RuntimeError:
            pass  # shut down meanwhile

    def _report_drained(self) -> None:
        try:
            counts = self.gate.read()
            if counts.closed_for and counts.in_flight == 0:
                self.reporter.report(ack=counts.closed_for, in_flight=0, waiting=counts.waiting)
        except Exception as exc:  # the next heartbeat reports anyway
            log.warning("could not report the LLM gate drained (%s); the next heartbeat will", exc)

    # -- the gate's channel ------------------------------------------------------------------------------------
    def _subscribe(self) -> Any:
        try:
            return self.reporter.listen()
        except redis.RedisError as exc:
            log.warning("cannot listen on the LLM gate's channel (%s); the heartbeat will see pauses", exc)
            return None

    def _listen(self) -> None:
        """While paused, when not listening all along: follow the channel until the gate opens."""
        if self._listener is not None and self._listener.is_alive():
            return
        pubsub = self._subscribe()
        if pubsub is not None:
            self._start_listener(pubsub)

    def _start_listener(self, pubsub: Any) -> None:
        self._listener = threading.Thread(target=self._follow, args=(pubsub,), name="rollq-llm-gate", daemon=True)
        self._listener.start()

    def _follow(self, pubsub: Any) -> None:
        try:
            if not self.listen_always:
                # A resume between the reading that closed the gate and the subscription was announced to nobody.
                reading = self.reporter.latest()
                if reading.epoch is None:
                    self._resumed(reading.latest)
                    return
            while not self._stopping.is_set() and (self.listen_always or not self.gate.is_open):
                try:
                    message = pubsub.get_message(timeout=1.0)
                except redis.RedisError as exc:
                    if not self.listen_always:
                        raise
                    # redis-py connects and subscribes again on the next read; the heartbeat covers meanwhile.
                    log.warning("lost the LLM gate's channel (%s); the heartbeat covers until it is back", exc)
                    self._stopping.wait(self.reporter.interval)
                    continue
                if message is None or message.get("type") != "message":
                    continue
                try:
                    event = parse_event(message["data"])
                except ValueError as exc:
                    log.warning("%s on the LLM gate's channel; ignored", exc)
                    continue
                if event.kind == "pause" and event.epoch is not None:
                    self._apply(GateReading(event.epoch, None))
                elif event.kind == "resume" and self._resumed(event.latest, event.epoch) and not self.listen_always:
                    return
        except redis.RedisError as exc:
            log.warning("lost the LLM gate's channel (%s); the heartbeat will see the resume", exc)
        except Exception:
            log.exception("following the LLM gate's channel failed; the heartbeat will follow the gate")
        finally:
            try:
                pubsub.close()
            except redis.RedisError:
                pass

    def _resumed(self, latest: str | None, epoch: int | None = None) -> bool:
        """Open the gate unless it is closed for a pause newer than the one lifted (``epoch``); True if open."""
        with self._lock:
            if epoch is not None and self.gate.closed_for > epoch:
                return False
            self._lifted = max(self._lifted, epoch or self.gate.closed_for)
            self._changes += 1
            self.gate.open(latest)
            return True
