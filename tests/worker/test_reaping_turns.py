"""Workers reap in turns: an idle fleet pays one command per worker per heartbeat interval, and the namespace still
gets a reaper pass every interval, kept by whichever worker holds the turn."""

from __future__ import annotations

import time

import pytest

from rollq.store.keys import Keys
from rollq.store.reaper import ReapReport
from rollq.store.transitions import Lifecycle
from rollq.worker import heartbeat as heartbeat_module
from rollq.worker.heartbeat import REAP_BATCH, Heartbeat


def _idle_heartbeats(redis_server, namespace: str, count: int, interval: float) -> list[Heartbeat]:
    lifecycle = Lifecycle(redis_server.client(), Keys(namespace))
    return [Heartbeat(lifecycle, dict, interval=interval, results_maxlen=100) for _ in range(count)]


def _commands(connection) -> int:
    return sum(int(s["calls"]) for name, s in connection.info("commandstats").items() if name != "cmdstat_info")


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    made: list[object] = []

    def fake_reap(*args: object, **kwargs: object) -> ReapReport:
        made.append(kwargs.get("clock"))
        return ReapReport()

    monkeypatch.setattr(heartbeat_module, "reap", fake_reap)
    return made


def test_of_eight_idle_workers_beating_together_one_makes_the_reaper_pass(redis_server, namespace, passes):
    for beat in _idle_heartbeats(redis_server, namespace, 8, interval=5.0):
        beat.beat()
    assert len(passes) == 1
    assert passes[0] is not None  # the clock of the turn holder's own heartbeat: no second beat.lua call


def test_an_idle_worker_without_the_turn_sends_one_command(redis_server, namespace, passes):
    first, second = _idle_heartbeats(redis_server, namespace, 2, interval=5.0)
    first.beat()
    probe = redis_server.client()
    before = _commands(probe)
    second.beat()
    assert _commands(probe) - before == 1
    assert len(passes) == 1


def test_a_lone_worker_takes_the_turn_again_every_interval(redis_server, namespace, passes):
    [beat] = _idle_heartbeats(redis_server, namespace, 1, interval=0.5)
    for _ in range(3):
        beat.beat()
        time.sleep(0.5)
    assert len(passes) == 3


def test_the_turn_holder_keeps_the_clock_so_no_stall_is_seen_between_turns(redis_server, namespace):
    beats = _idle_heartbeats(redis_server, namespace, 4, interval=0.5)
    lifecycle = beats[0].lifecycle
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        for beat in beats:
            beat.beat()
        time.sleep(0.5)
    assert not lifecycle.beat().in_grace


def test_the_turn_holder_goes_on_reaping_while_passes_come_back_full(redis_server, namespace, monkeypatch):
    # A dead host's thousands of attempts: one pass per interval would drain REAP_BATCH per interval.
    reports = [ReapReport(requeued=REAP_BATCH), ReapReport(requeued=150, failed=50), ReapReport(requeued=7)]
    made: list[object] = []

    def fake_reap(*args: object, **kwargs: object) -> ReapReport:
        made.append(kwargs.get("clock"))
        return reports[len(made) - 1]

    monkeypatch.setattr(heartbeat_module, "reap", fake_reap)
    [beat] = _idle_heartbeats(redis_server, namespace, 1, interval=5.0)
    beat.beat()
    assert len(made) == 3
    assert made[0] is not None and made[1] is None  # later passes read Redis's clock afresh
