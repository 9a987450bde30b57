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

from rollq.ops.status import snapshot
from rollq.producer.producer import Producer
from rollq.store.keys import Keys
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

