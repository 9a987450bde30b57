"""rq-dashboard's Requeue on a rollq job re-runs the task (dead-lettered) or refuses saying why; before, it
answered OK, the worker skipped the job, RQ filed it as finished, and nothing re-ran."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from rq.queue import Queue
from rq.serializers import JSONSerializer

from rollq.ops.dashboard import create_app
from rollq.producer import Producer
from tests.support.servers import RedisServer, WorkerProcess

AGENT = {"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent"}


def _failed_job(producer: Producer) -> str:
    queue = Queue(producer.namespace, connection=producer.connection, serializer=JSONSerializer)
    deadline = time.monotonic() + 30
    while not (ids := queue.failed_job_registry.get_job_ids(cleanup=False)):
        assert time.monotonic() < deadline, "no failed RQ job"
        time.sleep(0.1)
    (job_id,) = ids
    return job_id


def _browser(redis_url: str, namespace: str) -> tuple[Any, dict[str, str]]:
    """A test client of the dashboard and the CSRF header its own scripts send (the cookie's token)."""
    client = create_app(redis_url, namespace).test_client()
    cookie = client.get("/").headers.get("Set-Cookie", "")
    return client, {"X-CSRFToken": cookie.split(";")[0].split("=", 1)[1]}


@pytest.mark.redis
def test_requeue_of_a_dead_lettered_rollq_job_runs_the_task_again(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    producer = Producer.from_url(redis_server.url, namespace)
    workers(redis_server.url, namespace, env=AGENT)
    rid = producer.enqueue({"raise": "tool call returned HTTP 500"}).rollout_id
    assert producer.wait([rid], timeout=60)[0].metadata["status"] == "failed"
    job_id = _failed_job(producer)

    client, csrf = _browser(redis_server.url, namespace)
    reply = client.post(f"/job/{job_id}/requeue", headers=csrf).get_json()

    assert reply["status"] == "OK" and "queued again" in reply["message"]
    deadline = time.monotonic() + 60
    while producer.get_task(rid).num_claims < 2:  # it really ran again
        assert time.monotonic() < deadline, "the task did not run again"
        time.sleep(0.1)
    queue = Queue(namespace, connection=producer.connection, serializer=JSONSerializer)
    assert job_id not in queue.failed_job_registry.get_job_ids(cleanup=False)


@pytest.mark.redis
def test_requeue_of_a_rollq_job_whose_task_is_not_dead_lettered_is_refused_saying_why(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    producer = Producer.from_url(redis_server.url, namespace)
    workers(redis_server.url, namespace, env=AGENT)
    rid = producer.enqueue({"raise": "boom"}).rollout_id
    producer.wait([rid], timeout=60)
    job_id = _failed_job(producer)
    # Taken out of the dead-letter set (handled some other way): there is nothing for the button to re-run.
    producer.connection.zrem(producer.keys.dead_letter, rid)

    client, csrf = _browser(redis_server.url, namespace)
    reply = client.post(f"/job/{job_id}/requeue", headers=csrf).get_json()
    assert reply["status"] == "ERROR" and f"task {rid} is failed, not in the dead-letter set" in reply["message"]
    bulk = client.post(f"/requeue/{namespace}", headers=csrf).get_json()
    assert bulk["status"] == "ERROR" and bulk["count"] == 0 and len(bulk["refused"]) == 1
    assert producer.get_task(rid).num_claims == 1  # nothing ran
