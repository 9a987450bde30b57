"""A Redis restarted without persistence (or flushed) under running workers: they carry on, and say what was lost.

The restart empties Redis: RQ's worker registry (``rq:workers`` and the queue's worker set, written only at a worker's
start) and the task records of the rollouts in flight. Workers must show up again in ``rollq status`` within a
heartbeat or two, and a rollout whose task record vanished must not be taken for a superseded attempt.
"""

from __future__ import annotations

import re

import pytest
from rq.queue import Queue
from rq.worker import Worker

from rollq.models.policy import RolloutPolicy
from rollq.ops.status import snapshot
from rollq.producer.producer import Producer
from rollq.store.keys import Keys
from rollq.store.stats import StatsField
from tests.support.servers import WorkerProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis

AGENT = {"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent", "ROLLQ_HEARTBEAT_SECONDS": "0.5"}


def worker_name(worker: WorkerProcess) -> str:
    found = re.search(r"Worker (\S+): started with PID", worker.log())
    assert found, worker.log()
    return found.group(1)


def test_running_workers_are_listed_again_after_a_restart_that_lost_the_worker_registry(own_redis, namespace, workers):
    server = own_redis()  # no persistence: a restart comes back empty
    worker = workers(server.url, namespace, env=AGENT)
    producer = Producer.from_url(server.url, namespace)
    rid = producer.enqueue({"sleep": 0}).rollout_id
    assert producer.wait([rid], timeout=60)[0].metadata["status"] == "succeeded"
    name = worker_name(worker)
    assert [w["name"] for w in snapshot(server.client(), Keys(namespace)).workers] == [name]

    server.restart(down_seconds=0.5)

    # The worker reconnects and runs new tasks...
    producer = Producer.from_url(server.url, namespace)
    rid = producer.enqueue({"sleep": 0}).rollout_id
    assert producer.wait([rid], timeout=60)[0].metadata["status"] == "succeeded", worker.log()
    # ...and is listed again within a heartbeat or two (before: "0 alive" for ever), with RQ's birth fields.
    client = server.client()
    wait_until(
        lambda: [w["name"] for w in snapshot(client, Keys(namespace)).workers if w["alive"]] == [name],
        "the worker to be listed alive again",
        timeout=10,
    )
    assert [w.name for w in Worker.all(queue=Queue(namespace, connection=client))] == [name]
    listed = Worker.find_by_key(f"rq:worker:{name}", connection=client)
    assert listed is not None and listed.queue_names() == [namespace] and listed.birth_date is not None
    assert client.hget(listed.key, "rollq_concurrency") is not None
    assert "re-registered" in worker.log()
    assert worker.process.poll() is None


def test_a_result_whose_task_record_redis_lost_is_not_counted_as_superseded(own_redis, namespace, workers):
    server = own_redis()
    # The agent ends before the worker's next heartbeat, which would have seen its attempt gone and stopped it.
    worker = workers(server.url, namespace, env={**AGENT, "ROLLQ_HEARTBEAT_SECONDS": "10"})
    producer = Producer.from_url(server.url, namespace)
    rid = producer.enqueue({"sleep": 3}).rollout_id
    keys = Keys(namespace)
    wait_until(lambda: server.client().zcard(keys.inflight) == 1, "the rollout to run", timeout=30)

    server.restart(down_seconds=0.5)

    client = server.client()
    wait_until(lambda: "is gone" in worker.log(), "the worker to say the task record is gone", timeout=30)
    log = worker.log()
    # Before: "result of <rid> attempt 1 ... arrived after a newer attempt took over; kept as superseded".
    assert "newer attempt" not in log, log
    assert f"the task record {keys.task(rid)} is gone" in log, log
    assert "restart without persistence" in log
    assert client.hget(keys.stats, StatsField.SUPERSEDED) is None
    # The rollout is not dropped silently: it is kept where the operator finds it, marked as orphaned.
    entries = client.xrange(keys.superseded)
    assert [e[1][b"rollout_id"].decode() for e in entries] == [rid], entries
    assert entries[0][1].get(b"reason") == b"task-missing", entries
    status = snapshot(client, keys)
    assert (status.superseded, status.task_missing) == (0, 1)
    assert worker.process.poll() is None


def test_a_failed_attempt_whose_task_record_redis_lost_is_not_retried_nor_said_to_be(own_redis, namespace, workers):
    # An operator's audit: requeue.lua answered 'superseded' for a task record Redis had lost, and the worker logged
    # "retrying" with nothing queued. It answers missing: the worker says the record is gone, queues nothing, and
    # keeps the failed rollout aside as task-missing, as for a result.
    server = own_redis()
    worker = workers(server.url, namespace, env={**AGENT, "ROLLQ_HEARTBEAT_SECONDS": "10"})
    policy = RolloutPolicy(retry_on=frozenset({"exception"}), max_attempts=3)
    producer = Producer.from_url(server.url, namespace, policy=policy)
    rid = producer.enqueue({"sleep": 2, "raise": "boom"}).rollout_id
    keys = Keys(namespace)
    client = server.client()
    wait_until(lambda: client.zcard(keys.inflight) == 1, "the rollout to run", timeout=30)
    client.delete(keys.task(rid))  # an eviction, a FLUSHDB: Redis lost the record

    wait_until(lambda: client.xlen(keys.superseded) == 1, "the failed rollout to be kept aside", timeout=30)
    log = worker.log()
    assert f"task {rid} attempt 1 failed; its record is gone, so no retry was queued" in log, log
    assert "retrying" not in log, log
    assert client.xrange(keys.superseded)[0][1].get(b"reason") == b"task-missing"
    assert client.llen(keys.rq_queue) == 0 and not client.exists(keys.task(rid))
