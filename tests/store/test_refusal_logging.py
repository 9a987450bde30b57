"""Each time Redis refuses writes (OOM, READONLY...) a process says so when it starts and when it ends, and a reaper
that holds off after one names it as a refusal, not as a stall or an outage. Outages a worker's client waits out are
logged the same way: once when they start, once when they end."""

from __future__ import annotations

import logging
import time
import uuid

import pytest
import redis

from rollq.store import connection as conn
from rollq.store.connection import Refusals, connect
from rollq.store.keys import Keys
from rollq.store.reaper import reap
from rollq.store.replies import Clock
from rollq.store.transitions import Lifecycle

OOM = redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
SETTLE = 0.05


@pytest.fixture(autouse=True)
def _quick_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal within SETTLE seconds of the last one's end is a turn of it (3 s in use)."""
    monkeypatch.setattr(conn, "_SETTLE_SECONDS", SETTLE)


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_a_second_refusal_within_a_minute_of_the_first_is_logged_when_it_starts_and_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusals = Refusals()
    with caplog.at_level(logging.WARNING, logger="rollq.store.connection"):
        for _ in range(2):  # two refusals well within a minute (seconds apart in the audit)
            refusals.refused(OOM)
            refusals.refused(OOM)  # the same refusal: no second line
            refusals.accepted()
            time.sleep(2 * SETTLE)
    # Before: the second logged neither line (60 s of quiet after the first start line).
    starts = _lines(caplog, "Redis refuses commands")
    assert len(starts) == 2, caplog.text
    assert all("OOM" in line for line in starts), starts
    assert len(_lines(caplog, "Redis accepts commands again")) == 2, caplog.text
    assert refusals.episodes == 2


def test_a_long_refusal_is_logged_again_at_most_once_a_minute(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(conn.time, "monotonic", lambda: clock[0])
    refusals = Refusals()
    with caplog.at_level(logging.WARNING, logger="rollq.store.connection"):
        for _ in range(150):  # 150 s of refused commands, one a second
            refusals.refused(OOM)
            clock[0] += 1.0
        refusals.accepted()
    assert len(_lines(caplog, "Redis refuses commands")) == 1, caplog.text
    assert len(_lines(caplog, "Redis still refuses commands")) == 2, caplog.text
    (end,) = _lines(caplog, "Redis accepts commands again")
    assert "150.0s" in end


def test_a_redis_refusing_and_accepting_by_turns_logs_one_start_and_one_end_unless_a_turn_lasts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusals = Refusals()
    with caplog.at_level(logging.WARNING, logger="rollq.store.connection"):
        for _ in range(5):  # a Redis at the edge of its memory: a write accepted, the next refused
            refusals.refused(OOM)
            refusals.accepted()
        assert len(_lines(caplog, "Redis refuses commands")) == 1, caplog.text
        assert len(_lines(caplog, "Redis accepts commands again")) == 1, caplog.text
        assert refusals.episodes == 1
        # A turn that lasts is a refusal of its own: its start and end are logged.
        refusals.refused(OOM)
        time.sleep(2 * SETTLE)
        refusals.refused(OOM)
        refusals.accepted()
    assert len(_lines(caplog, "Redis refuses commands")) == 2, caplog.text
    assert len(_lines(caplog, "Redis accepts commands again")) == 2, caplog.text
    assert refusals.episodes == 2


def test_a_reaper_holding_off_after_a_refusal_names_the_refusal(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    refusals = Refusals()
    monkeypatch.setattr(conn, "REFUSALS", refusals)
    lifecycle = Lifecycle(connect(f"memory://{uuid.uuid4().hex}"), Keys("refused"))
    in_grace = Clock(now=100.0, grace_until=106.0)
    with caplog.at_level(logging.WARNING, logger="rollq.store.reaper"):
        refusals.refused(OOM)
        assert reap(lifecycle, results_maxlen=100, clock=in_grace).waited
        refusals.accepted()
        assert reap(lifecycle, results_maxlen=100, clock=in_grace).waited  # just after it ended
    # Before: "Redis was stalled or out of reach" although Redis answered every command, refusing the writes.
    lines = _lines(caplog, "judging no deadline")
    assert len(lines) == 2 and all("refused writes (OOM" in line for line in lines), lines
    assert not _lines(caplog, "stalled or out of reach")


def test_a_reaper_holding_off_with_no_refusal_seen_still_says_stalled_or_out_of_reach(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(conn, "REFUSALS", Refusals())
    lifecycle = Lifecycle(connect(f"memory://{uuid.uuid4().hex}"), Keys("stalled"))
    with caplog.at_level(logging.WARNING, logger="rollq.store.reaper"):
        reap(lifecycle, results_maxlen=100, clock=Clock(now=100.0, grace_until=106.0))
    assert _lines(caplog, "stalled or out of reach"), caplog.text


def test_a_connection_dropped_and_at_once_replaced_is_no_outage_but_one_that_lasts_is_logged_once_each_way(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(conn.time, "monotonic", lambda: clock[0])
    outages, where = conn.Outages(), "redis://127.0.0.1:6379/0"
    dropped = redis.ConnectionError("Connection closed by server.")
    refused = redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
    with caplog.at_level(logging.INFO, logger="rollq.store.connection"):
        outages.failed(where, dropped)  # an idle connection Redis closed, replaced at the next try
        outages.answered(where)
        assert caplog.records == []
        for _ in range(6):  # 6 s of refused connections, retried by three threads
            for _ in range(3):
                outages.failed(where, refused)
            clock[0] += 1.0
        outages.answered(where)
        outages.answered(where)
    [lost] = _lines(caplog, "lost Redis")
    assert where in lost and "Connection refused" in lost
    [back] = _lines(caplog, "Redis is back")
    assert where in back and "after 6.0s" in back
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]
    assert outages.down == {}
