"""A worker's report to the LLM gate (``lua/llm_report.lua``, one per heartbeat): what an idle one costs Redis, and
that skipping the unchanged part of it never leaves the trainer's pause reading a stale report."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from rollq.store.keys import Keys
from rollq.store.llm_gate import GateReporter, LLMGate
from tests.support.servers import RedisServer


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of this test's own: its command counts are this test's alone."""
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def keys() -> Keys:
    return Keys(f"gate-{uuid.uuid4().hex[:8]}")


def _reporter(connection: redis.Redis, keys: Keys, worker: str = "w1", *, sweep_every: int = 1000) -> GateReporter:
    reporter = GateReporter(connection, keys, worker, interval=5.0, sweep_every=sweep_every)
    reporter.report(ack=0, in_flight=0, waiting=0)  # the first report: writes, and the script is loaded
    return reporter


def _entry(connection: redis.Redis, keys: Keys, worker: str = "w1") -> bytes | None:
    return connection.hget(keys.llm_calls, worker)  # type: ignore[return-value]


def _commands(connection: redis.Redis) -> dict[str, int]:
    info = connection.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(stats["calls"]) for name, stats in info.items()}


def test_an_idle_workers_report_runs_three_commands_inside_redis(own_redis: RedisServer, keys: Keys) -> None:
    connection = own_redis.client()
    reporter = _reporter(connection, keys)
    before = _commands(connection)
    reporter.report(ack=0, in_flight=0, waiting=0)
    after = _commands(connection)
    ran = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}
    ran["info"] -= 1  # the reading of the second count
    # Was: TIME, ZADD, HSET, ZRANGEBYSCORE, GET, GET at every heartbeat of every worker.
    assert {k: v for k, v in ran.items() if v} == {"evalsha": 1, "time": 1, "zadd": 1, "mget": 1}


def test_an_unchanged_report_leaves_the_entry_and_a_changed_one_writes_it(
    redis_server: RedisServer, keys: Keys
) -> None:
    connection = redis_server.client()
    reporter = _reporter(connection, keys)
    assert _entry(connection, keys) == b"0|0|0"
    connection.hset(keys.llm_calls, "w1", "marker")  # stands for the entry as the last report wrote it
    reporter.report(ack=0, in_flight=0, waiting=0)
    assert _entry(connection, keys) == b"marker"
    reporter.report(ack=3, in_flight=2, waiting=1)
    assert _entry(connection, keys) == b"3|2|1"


def test_a_report_after_its_entry_was_swept_writes_it_again(redis_server: RedisServer, keys: Keys) -> None:
    connection = redis_server.client()
    reporter = _reporter(connection, keys)
    connection.zrem(keys.llm_workers, "w1")  # what another worker's sweep does to a report that expired
    connection.hdel(keys.llm_calls, "w1")
    reporter.report(ack=0, in_flight=0, waiting=0)
    assert _entry(connection, keys) == b"0|0|0"
    assert LLMGate(connection, keys).status().workers == 1


def test_reports_in_flight_together_leave_the_next_one_to_write(redis_server: RedisServer, keys: Keys) -> None:
    """A heartbeat's report and one sent at once from another thread: Redis may apply them in either order, and
    their replies come back in either order, so the worker no longer knows which one Redis holds; its next report
    writes whatever it says."""
    connection = redis_server.client()
    reporter = _reporter(connection, keys)
    heartbeat, drained = connection.pipeline(transaction=False), connection.pipeline(transaction=False)
    read_heartbeat = reporter.queue(heartbeat, ack=1, in_flight=4, waiting=0)  # sent first
    read_drained = reporter.queue(drained, ack=1, in_flight=0, waiting=0)  # sent last...
    drained_reply = drained.execute(raise_on_error=False)[0]  # ...applied first
    heartbeat_reply = heartbeat.execute(raise_on_error=False)[0]
    assert _entry(connection, keys) == b"1|4|0"
    read_heartbeat(heartbeat_reply)
    read_drained(drained_reply)  # the last sent, read last: still not known to be what Redis holds
    reporter.report(ack=1, in_flight=0, waiting=0)
    assert _entry(connection, keys) == b"1|0|0"


def test_a_report_whose_reply_was_lost_leaves_the_next_one_to_write(redis_server: RedisServer, keys: Keys) -> None:
    connection = redis_server.client()
    reporter = _reporter(connection, keys)
    pipe = connection.pipeline(transaction=False)
    reporter.queue(pipe, ack=0, in_flight=0, waiting=0)  # its pipeline never runs: a heartbeat that failed
    connection.hset(keys.llm_calls, "w1", "marker")
    reporter.report(ack=0, in_flight=0, waiting=0)
    assert _entry(connection, keys) == b"0|0|0"


def test_every_nth_report_sweeps_expired_ones_and_writes_its_own(redis_server: RedisServer, keys: Keys) -> None:
    connection = redis_server.client()
    reporter = _reporter(connection, keys, sweep_every=3)
    connection.zadd(keys.llm_workers, {"gone": time.time() - 60})  # a worker that stopped reporting a minute ago
    connection.hset(keys.llm_calls, "gone", "0|0|0")
    connection.hset(keys.llm_calls, "w1", "marker")
    swept = []
    for _ in range(3):
        assert LLMGate(connection, keys).status().workers == 1  # never counted, swept or not
        reporter.report(ack=0, in_flight=0, waiting=0)
        swept.append(connection.zscore(keys.llm_workers, "gone") is None)
    assert swept.count(True) >= 1 and swept[-1]
    assert _entry(connection, keys, "gone") is None
    assert _entry(connection, keys) == b"0|0|0"  # the sweep's report rewrote what a failover could have lost


def test_a_pause_drains_across_skipped_reports(redis_server: RedisServer, keys: Keys) -> None:
    connection = redis_server.client()
    gate = LLMGate(connection, keys)
    reporter = _reporter(connection, keys)
    epoch = int(connection.eval("return redis.call('INCR', KEYS[1])", 1, keys.llm_pause))
    reading = reporter.report(ack=epoch, in_flight=2, waiting=0)
    assert reading.epoch == epoch
    assert not gate.status().drained
    reporter.report(ack=epoch, in_flight=2, waiting=0)  # unchanged: not written again
    assert not gate.status().drained
    reporter.report(ack=epoch, in_flight=0, waiting=0)
    assert gate.status().drained
