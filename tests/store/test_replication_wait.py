"""wait_replicas: enqueue, claim, finish and requeue wait (Redis WAIT) for replicas, on real redis-servers."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable

import pytest
import redis

from rollq.models.policy import RolloutPolicy, RolloutStatus
from rollq.ops.status import snapshot
from rollq.producer.producer import Producer
from rollq.store.connection import connect
from rollq.store.keys import Keys
from rollq.store.replication import PROBE_SECONDS, degraded_processes
from rollq.store.replies import Claim, Published
from rollq.store.scripts import script_source
from rollq.store.transitions import Finish, Lifecycle
from rollq.worker.config import InvalidSettingError, WorkerSettings
from tests.support.servers import RedisServer, Replicated, WorkerProcess
from tests.support.waiting import wait_until

SHORTFALL = "waiting for 1 replica(s) to acknowledge a transition got 0 within"
DEGRADED = "Degraded: transitions no longer wait for replicas until 1 is online again"
BACK = "replica(s) online again after"


def test_wait_settings_come_from_the_environment_and_a_zero_timeout_is_refused() -> None:
    settings = WorkerSettings.from_env({"ROLLQ_WAIT_REPLICAS": "1", "ROLLQ_WAIT_TIMEOUT_MS": "250"})
    assert (settings.wait_replicas, settings.wait_timeout_ms) == (1, 250)
    # Unset: decided by the URL (see the next test).
    assert (WorkerSettings.from_env({}).wait_replicas, WorkerSettings.from_env({}).wait_timeout_ms) == (None, 1000)
    assert WorkerSettings.from_env({"ROLLQ_WAIT_REPLICAS": "0"}).wait_replicas == 0
    # WAIT's timeout 0 blocks forever: one dead replica would stop every worker.
    with pytest.raises(InvalidSettingError, match="ROLLQ_WAIT_TIMEOUT_MS"):
        WorkerSettings.from_env({"ROLLQ_WAIT_TIMEOUT_MS": "0"})
    with pytest.raises(ValueError, match="wait_timeout_ms"):
        Lifecycle(connect("memory://wait-settings"), Keys("w"), wait_replicas=1, wait_timeout_ms=0)


def test_transitions_wait_for_one_replica_by_default_behind_sentinel_and_for_none_otherwise() -> None:
    # Issue 25: without WAIT, a Sentinel failover lost 10 of 2,000 acknowledged tasks in one run of 14.
    sentinel = connect("redis+sentinel://127.0.0.1:1/nowhere/0")
    assert Lifecycle(sentinel, Keys("d")).wait_replicas == 1
    assert Lifecycle(sentinel, Keys("d"), wait_replicas=0).wait_replicas == 0
    assert Lifecycle(connect("redis://127.0.0.1:1/0"), Keys("d")).wait_replicas == 0
    assert Lifecycle(connect("memory://wait-default"), Keys("d")).wait_replicas == 0
    assert Producer.from_url("redis+sentinel://127.0.0.1:1/nowhere/0", "d").lifecycle.wait_replicas == 1


@pytest.mark.redis
def test_an_enqueue_with_wait_replicas_returns_once_the_replica_holds_the_task(replicated: Replicated) -> None:
    producer = Producer(connect(replicated.url), "waited", wait_replicas=1)
    task = producer.enqueue({"q": 1})
    # No polling: WAIT returned only after the replica acknowledged the enqueue.
    assert replicated.replica.client().exists(producer.keys.task(task.rollout_id)) == 1
    assert producer.lifecycle.replication_shortfalls == 0


@pytest.mark.slow
@pytest.mark.redis
def test_a_replica_that_stops_acknowledging_costs_one_timeout_then_the_process_is_degraded_until_it_is_back(
    replicated: Replicated, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 25: waiting the full timeout on every transition while no replica answered cut a worker from ~140 to
    # ~8 rollouts/s, silently, for as long as the replica stayed away.
    waited = Producer(connect(replicated.url), "slow-replica", wait_timeout_ms=800)  # waits by default
    plain = Producer(connect(replicated.url), "slow-replica", wait_replicas=0)
    keys = waited.keys
    replicated.pause_replica()
    try:
        started = time.monotonic()
        plain.enqueue({"q": 0})
        assert time.monotonic() - started < 0.5  # told not to wait: no wait at all
        with caplog.at_level(logging.WARNING, logger="rollq.store.replication"):
            started = time.monotonic()
            first = waited.enqueue({"q": 1})
            assert time.monotonic() - started >= 0.8
            started = time.monotonic()
            for i in range(20):
                waited.enqueue({"q": 2 + i})
            assert time.monotonic() - started < 0.8  # degraded: the next transitions do not wait
            assert waited.lifecycle.replication.degraded
            assert degraded_processes(replicated.primary.client(), keys.replication_degraded) == 1
            assert snapshot(replicated.primary.client(), keys).replication_degraded == 1
    finally:
        replicated.resume_replica()
    assert replicated.primary.client().exists(waited.keys.task(first.rollout_id)) == 1
    assert waited.lifecycle.replication_shortfalls == 1
    messages = [r.getMessage() for r in caplog.records]
    assert sum(SHORTFALL in m and DEGRADED in m for m in messages) == 1, messages
    # Back: within a probe interval a transition finds the replica online, waits again, and says so once.
    time.sleep(PROBE_SECONDS + 0.1)
    with caplog.at_level(logging.WARNING, logger="rollq.store.replication"):
        last = waited.enqueue({"q": "back"})
    assert not waited.lifecycle.replication.degraded
    assert replicated.replica.client().exists(waited.keys.task(last.rollout_id)) == 1  # waited for it
    assert sum(BACK in r.getMessage() for r in caplog.records) == 1
    assert degraded_processes(replicated.primary.client(), keys.replication_degraded) == 0


@pytest.mark.redis
def test_every_wait_runs_in_the_pipeline_of_the_writes_it_confirms(replicated: Replicated) -> None:
    # WAIT covers the writes of the connection it is sent on. A WAIT sent in a round trip of its own can land on
    # a pooled connection that wrote nothing (and answer "held" at once: the pitfall shown below), or, after a
    # failover in between, on the new primary, where it covers nothing the old one wrote. So each transition
    # and its PUBLISH + WAIT go in one pipeline: MONITOR shows every WAIT right behind the transition's EVALSHA
    # and PUBLISH from the same client, never alone.
    writer, bystander = replicated.primary.client(), replicated.primary.client()
    bystander.ping()
    wait_until(lambda: bool(writer.set("warm", "1")) and writer.wait(1, 100) == 1, "the replica acknowledging")
    replicated.pause_replica()
    try:
        writer.set("written-elsewhere", "1")
        assert bystander.wait(1, 200) == 1  # the pitfall: a bare WAIT on another connection says "held"
    finally:
        replicated.resume_replica()
    producer = Producer(connect(replicated.url), "one-pipeline")
    lifecycle = producer.lifecycle
    monitor = replicated.primary.client().monitor()
    with monitor as m:
        task = producer.enqueue({"q": 1})
        claim = lifecycle.claim(task.rollout_id, producer.keys.job_id(task.rollout_id), "w1")
        assert isinstance(claim, Claim)
        finish = Finish(
            rollout_id=task.rollout_id,
            attempt=1,
            rollout_json='{"rollout_id": "x"}',
            status=RolloutStatus.SUCCEEDED,
            results_maxlen=10,
            dead_letter=False,
            now=time.time(),
        )
        assert isinstance(lifecycle.finish(finish), Published)
        commands: list[tuple[str, str]] = []
        while sum(command.startswith("WAIT") for _, command in commands) < 3:
            event = m.next_command()
            if event.get("client_type") == "lua":  # what the scripts run
                continue
            commands.append((event["client_address"] + ":" + event["client_port"], event["command"]))
    waits = [i for i, (_, command) in enumerate(commands) if command.startswith("WAIT")]
    for i in waits:
        client = commands[i][0]
        assert commands[i - 1][1].startswith("PUBLISH") and commands[i - 1][0] == client, commands
        # The enqueue's calls are one MULTI/EXEC (all or none, issue 26): its EXEC stands behind its EVALSHA.
        write = i - 3 if commands[i - 2][1] == "EXEC" else i - 2
        assert commands[write][1].startswith("EVALSHA") and commands[write][0] == client, commands
    assert lifecycle.replication_shortfalls == 0


@pytest.mark.redis
def test_with_no_replica_at_all_transitions_complete_with_a_warning(
    own_redis: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = own_redis()
    producer = Producer(
        connect(server.url), "alone", wait_replicas=1, wait_timeout_ms=100, policy=RolloutPolicy(max_attempts=2)
    )
    with caplog.at_level(logging.WARNING, logger="rollq.store.replication"):
        task = producer.enqueue({"q": 1})
    lifecycle = producer.lifecycle
    claim = lifecycle.claim(task.rollout_id, producer.keys.job_id(task.rollout_id), "w1")
    assert isinstance(claim, Claim), claim
    reply = lifecycle.finish(
        Finish(
            rollout_id=task.rollout_id,
            attempt=1,
            rollout_json='{"rollout_id": "x"}',
            status=RolloutStatus.SUCCEEDED,
            results_maxlen=10,
            dead_letter=False,
            now=time.time(),
        )
    )
    assert isinstance(reply, Published)
    # The enqueue waited and fell short; claim and finish did not wait (degraded: no replica online).
    assert lifecycle.replication_shortfalls == 1 and lifecycle.replication.degraded
    assert any(SHORTFALL in r.getMessage() for r in caplog.records)


@pytest.mark.redis
def test_a_worker_on_a_sentinel_url_keeps_its_pace_without_a_replica_and_says_so_once(
    replicated: Replicated, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    # Defaults only: a Sentinel URL waits for one replica, 1 s at most. Waiting the full second on every batch
    # while no replica answered made a worker crawl (issue 25); degraded, it runs at its usual pace.
    env = {"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent"}
    worker = workers(replicated.url, namespace, env=env)
    producer = Producer(connect(replicated.url), namespace, wait_replicas=0)
    [first] = producer.wait([producer.enqueue({"sleep": 0}).rollout_id], timeout=30)
    assert first.metadata["status"] == "succeeded" and SHORTFALL not in worker.log()
    assert replicated.replica.client().exists(producer.keys.task(first.rollout_id))
    replicated.pause_replica()
    try:
        tasks = producer.enqueue_many([{"sleep": 0}] * 200)
        started = time.monotonic()
        rollouts = producer.wait([t.rollout_id for t in tasks], timeout=60)
        took = time.monotonic() - started
        wait_until(lambda: snapshot(producer.connection, producer.keys).replication_degraded == 1, "degraded shown")
    finally:
        replicated.resume_replica()
    assert all(r.metadata["status"] == "succeeded" for r in rollouts)
    assert took < 8, f"200 no-op rollouts took {took:.1f}s without a replica"
    assert worker.log().count(DEGRADED) == 1, worker.log()
    # The next batch after the replica is back finds it online (a probe per second) and waits again.
    time.sleep(1.2)
    producer.wait([producer.enqueue({"sleep": 0}).rollout_id], timeout=30)
    wait_until(lambda: BACK in worker.log(), "the worker saying replicas are back", timeout=15)


class _EachCheckoutElsewhere(redis.ConnectionPool):
    """Hands out connections to two servers in turn: what a client sees when a failover happens between two of
    its round trips (the second reaches the new primary)."""

    def __init__(self, first: int, second: int) -> None:
        super().__init__(host="127.0.0.1", port=first)
        self._ports = itertools.cycle([first, second])

    def get_connection(self, *args: object, **kwargs: object) -> redis.Connection:
        connection = redis.Connection(host="127.0.0.1", port=next(self._ports))
        connection.connect()
        return connection

    def release(self, connection: redis.Connection) -> None:  # type: ignore[override]
        connection.disconnect()


@pytest.mark.redis
def test_a_wait_that_reaches_another_primary_than_the_write_confirms_nothing(
    replicated: Replicated, own_redis: Callable[..., RedisServer]
) -> None:
    # Issue 26: the write went to one primary, the WAIT (a round trip of its own) to the next one, whose replica
    # acknowledged at once: the transition counted as replicated although no replica of the server that took it
    # ever saw it. `alone` has no replica; the replicated primary has a healthy one.
    alone = own_redis()
    for port in (alone.port, replicated.primary.port):
        for name in ("enqueue", "claim", "finish"):
            redis.Redis(port=port).script_load(script_source(name))
    connection = redis.Redis(connection_pool=_EachCheckoutElsewhere(alone.port, replicated.primary.port))
    lifecycle = Lifecycle(connection, Keys("elsewhere"), wait_replicas=1, wait_timeout_ms=200)
    producer = Producer(connect(alone.url), "elsewhere", wait_replicas=0)
    task = producer.enqueue({"q": 1})
    claim = lifecycle.claim(task.rollout_id, producer.keys.job_id(task.rollout_id), "w1")
    assert isinstance(claim, Claim), claim
    assert lifecycle.replication_shortfalls == 1
