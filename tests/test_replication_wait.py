"""wait_replicas: enqueue, claim, finish and requeue wait (Redis WAIT) for replicas, on real redis-servers."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest
from servers import RedisServer, Replicated, WorkerProcess, wait_until

from rollq.models.policy import RolloutPolicy, RolloutStatus
from rollq.producer.producer import Producer
from rollq.store.connection import connect
from rollq.store.keys import Keys, job_id
from rollq.store.replies import Claim, Published
from rollq.store.transitions import Finish, Lifecycle
from rollq.worker.config import InvalidSettingError, WorkerSettings

SHORTFALL = "only 0 of 1 replica(s) acknowledged a transition within"


def test_wait_settings_come_from_the_environment_and_a_zero_timeout_is_refused() -> None:
    settings = WorkerSettings.from_env({"ROLLQ_WAIT_REPLICAS": "1", "ROLLQ_WAIT_TIMEOUT_MS": "250"})
    assert (settings.wait_replicas, settings.wait_timeout_ms) == (1, 250)
    assert (WorkerSettings.from_env({}).wait_replicas, WorkerSettings.from_env({}).wait_timeout_ms) == (0, 1000)
    # WAIT's timeout 0 blocks forever: one dead replica would stop every worker.
    with pytest.raises(InvalidSettingError, match="ROLLQ_WAIT_TIMEOUT_MS"):
        WorkerSettings.from_env({"ROLLQ_WAIT_TIMEOUT_MS": "0"})
    with pytest.raises(ValueError, match="wait_timeout_ms"):
        Lifecycle(connect("memory://wait-settings"), Keys("w"), wait_replicas=1, wait_timeout_ms=0)


@pytest.mark.redis
def test_an_enqueue_with_wait_replicas_returns_once_the_replica_holds_the_task(replicated: Replicated) -> None:
    producer = Producer(connect(replicated.url), "waited", wait_replicas=1)
    task = producer.enqueue({"q": 1})
    # No polling: WAIT returned only after the replica acknowledged the enqueue.
    assert replicated.replica.client().exists(producer.keys.task(task.rollout_id)) == 1
    assert producer.lifecycle.replication_shortfalls == 0


@pytest.mark.redis
def test_a_replica_that_does_not_acknowledge_delays_each_transition_by_the_timeout_and_is_logged(
    replicated: Replicated, caplog: pytest.LogCaptureFixture
) -> None:
    waited = Producer(connect(replicated.url), "slow-replica", wait_replicas=1, wait_timeout_ms=800)
    plain = Producer(connect(replicated.url), "slow-replica")
    replicated.pause_replica()
    try:
        started = time.monotonic()
        plain.enqueue({"q": 0})
        assert time.monotonic() - started < 0.5  # off by default: no wait at all
        with caplog.at_level(logging.WARNING, logger="rollq.store.replication"):
            started = time.monotonic()
            first = waited.enqueue({"q": 1})
            assert time.monotonic() - started >= 0.8
            waited.enqueue({"q": 2})
    finally:
        replicated.resume_replica()
    # Applied on the primary all the same; one warning line for both (rate-limited), both counted.
    assert replicated.primary.client().exists(waited.keys.task(first.rollout_id)) == 1
    assert waited.lifecycle.replication_shortfalls == 2
    assert [r.getMessage() for r in caplog.records].count(
        f"{SHORTFALL} 800 ms (1 such transitions so far): it is applied on the primary but a failover now could undo it"
    ) == 1


@pytest.mark.redis
def test_wait_covers_a_write_made_on_another_connection(replicated: Replicated) -> None:
    # WAIT only waits for the writes of the connection it is sent on. A worker's transitions run on several
    # pooled connections, so a bare WAIT could land on one that wrote nothing and answer "1 replica" at once
    # for a write the replica never saw: measured so with the replica frozen.
    lifecycle = Lifecycle(connect(replicated.url), Keys("other-conn"), wait_replicas=1, wait_timeout_ms=200)
    lifecycle.connection.ping()  # its pooled connection exists and has written nothing
    writer, bystander = replicated.primary.client(), replicated.primary.client()
    bystander.ping()
    # A connection's WAIT covers what the primary had written when it connected, or its own last write:
    # once the replica acknowledged a later write, the bystander's WAIT has nothing left to wait for.
    wait_until(lambda: bool(writer.set("warm", "1")) and writer.wait(1, 100) == 1, "the replica acknowledging")
    replicated.pause_replica()
    try:
        writer.set("written-elsewhere", "1")
        assert bystander.wait(1, 200) == 1  # the pitfall: a bare WAIT on another connection says "held"
        lifecycle.replication.after_write()
    finally:
        replicated.resume_replica()
    assert lifecycle.replication_shortfalls == 1


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
    claim = lifecycle.claim(task.rollout_id, job_id(task.rollout_id), "w1")
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
    assert lifecycle.replication_shortfalls == 3  # enqueue, claim, finish: each waited, none failed
    assert any(SHORTFALL in r.getMessage() for r in caplog.records)


@pytest.mark.redis
def test_a_worker_with_wait_replicas_runs_rollouts_and_logs_a_replica_that_stopped_acknowledging(
    replicated: Replicated, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    env = {"ROLLQ_AGENT": "tests.fault_agents:FaultAgent", "ROLLQ_WAIT_REPLICAS": "1", "ROLLQ_WAIT_TIMEOUT_MS": "200"}
    worker = workers(replicated.primary.url, namespace, env=env)
    producer = Producer(connect(replicated.url), namespace)
    [first] = producer.wait([producer.enqueue({"sleep": 0}).rollout_id], timeout=30)
    assert first.metadata["status"] == "succeeded" and SHORTFALL not in worker.log()
    replicated.pause_replica()
    try:
        [second] = producer.wait([producer.enqueue({"sleep": 0}).rollout_id], timeout=30)
    finally:
        replicated.resume_replica()
    assert second.metadata["status"] == "succeeded"
    wait_until(lambda: SHORTFALL in worker.log(), "the worker logging the shortfall", timeout=10)
