"""Issue 26, case 3 at start-up: a stock ``rq worker -w rollq.worker.RolloutWorker`` started into a Redis that
refuses writes (``maxmemory`` reached, ``noeviction``) stays up, says so once, and starts claiming once memory is
freed, on a real redis-server."""

from __future__ import annotations

import time

import pytest

from rollq.producer.producer import Producer
from tests.support.fault_agents import assert_exactly_once
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis

AGENT = {"ROLLQ_AGENT": "tests.support.hostile_agents:HostileAgent", "ROLLQ_HEARTBEAT_SECONDS": "0.5"}


def test_a_worker_started_into_a_full_redis_waits_for_memory_then_claims(own_redis, namespace, workers):
    # Before: RQ's start-up writes (register_birth's HSET, the worker-key heartbeat) were refused with OOM and the
    # process exited at once.
    server = own_redis()
    client = server.client()
    producer = Producer.from_url(server.url, namespace)
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.1}] * 8)]
    # 1 MB below what Redis holds (a 2 MB key of the test's own): buffers coming and going cannot bring it under.
    before = int(client.info("memory")["used_memory"])
    client.set("rollq-test-padding", b"x" * 2_000_000)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", before + 1_000_000)

    worker = workers(server.url, namespace, env={**AGENT, "ROLLQ_CONCURRENCY": "4"})
    noticed = lambda: "Redis refuses commands" in worker.log() or worker.process.poll() is not None  # noqa: E731
    wait_until(noticed, "a log line", timeout=30)
    time.sleep(5)
    log = worker.log()
    assert worker.process.poll() is None, log[-3000:]
    assert log.count("Redis refuses commands") == 1, log[-3000:]
    assert client.llen(producer.keys.rq_queue) == len(ids)  # nothing claimed while Redis refuses writes

    client.config_set("maxmemory", 0)
    rollouts = producer.wait(ids, timeout=90)
    assert [r.metadata["status"] for r in rollouts] == ["succeeded"] * len(ids)
    assert_exactly_once(producer.connection, namespace, ids)
    log = worker.log()
    assert worker.process.poll() is None
    assert "found an unhandled exception" not in log and "Traceback" not in log, log[-3000:]
    assert "Redis accepts commands again" in log, log[-3000:]


def test_a_running_worker_says_once_that_redis_refuses_writes_without_a_line_per_heartbeat(
    own_redis, namespace, workers
):
    # Before: each heartbeat while Redis was full logged "heartbeat failed (command not allowed when used memory >
    # 'maxmemory')", and the LLM gate's piggybacked report a traceback: a line per beat instead of one.
    server = own_redis()
    client = server.client()
    worker = workers(server.url, namespace, env={**AGENT, "ROLLQ_CONCURRENCY": "4"})
    wait_until(lambda: "concurrency 4" in worker.log(), "the worker to start", timeout=30)
    before = int(client.info("memory")["used_memory"])
    client.set("rollq-test-padding", b"x" * 2_000_000)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", before + 1_000_000)
    wait_until(lambda: "Redis refuses commands" in worker.log(), "the worker noticing", timeout=30)
    time.sleep(4)  # eight heartbeats
    client.config_set("maxmemory", 0)
    wait_until(lambda: "Redis accepts commands again" in worker.log(), "the worker noticing memory is back", timeout=30)
    producer = Producer.from_url(server.url, namespace)
    [rollout] = producer.wait([producer.enqueue({"sleep": 0}).rollout_id], timeout=60)
    assert rollout.metadata["status"] == "succeeded"
    log = worker.log()
    assert worker.process.poll() is None
    assert log.count("Redis refuses commands") == 1, log[-3000:]
    assert "heartbeat failed" not in log and "Traceback" not in log, log[-3000:]
