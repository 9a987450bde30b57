"""A worker's side of a weight-sync pause (rollq.worker.capture.pause): readings that race one another."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollq.store.llm_gate import GateReading
from rollq.worker.capture.gate import CallGate
from rollq.worker.capture.pause import PauseFollower


class Reporter:
    """Stands in for GateReporter: records each report's ack; a queued report reads whatever reply it is given."""

    interval = 5.0

    def __init__(self) -> None:
        self.acks: list[int] = []

    def queue(self, pipe: Any, *, ack: int, in_flight: int, waiting: int) -> Callable[[Any], GateReading]:
        self.acks.append(ack)
        return lambda reply: reply

    def report(self, *, ack: int, in_flight: int, waiting: int) -> GateReading:
        self.acks.append(ack)
        return GateReading(None, None)


def test_a_heartbeat_reading_taken_before_a_pause_does_not_reopen_the_gate_the_pause_closed() -> None:
    # A CI run of the GRPO example: a worker's heartbeat sent its report (Redis: no pause), the pause's announcement
    # reached the worker's listener, which closed the gate and acknowledged; then the heartbeat's reply ("no pause")
    # was read as a missed resume: the gate reopened and the pause marked lifted, so every later reading of that
    # pause was ignored as stale. The worker never acknowledged again and the trainer's weight_sync timed out (60 s).
    reporter, gate = Reporter(), CallGate()
    follower = PauseFollower(reporter, gate, listen=True)  # type: ignore[arg-type]
    beat = follower.queue(pipe=None)  # the heartbeat's report is on its way: taken before the pause
    follower._apply(GateReading(14, None))  # the listener: the pause's announcement
    assert gate.closed_for == 14 and reporter.acks[-1] == 14
    beat(GateReading(None, None))  # the heartbeat's reply, read after the pause: stale
    assert not gate.is_open and gate.closed_for == 14
    # The next heartbeat, taken after the pause, still sees it, and the worker acknowledges it again.
    follower.queue(pipe=None)(GateReading(14, None))
    assert gate.closed_for == 14 and reporter.acks[-1] == 14


def test_a_heartbeat_reading_taken_after_the_gate_changed_still_reopens_it_on_a_missed_resume() -> None:
    # The protection above must not keep a gate closed for ever: a reading taken after the pause that finds no
    # pause is a resume whose announcement was missed (a dropped connection, a lease that ran out).
    reporter, gate = Reporter(), CallGate()
    follower = PauseFollower(reporter, gate, listen=True)  # type: ignore[arg-type]
    follower._apply(GateReading(14, None))
    follower.queue(pipe=None)(GateReading(None, "v2"))
    assert gate.is_open and gate.version == "v2"
