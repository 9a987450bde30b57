"""An agent's traceback is where people look: the worker log, `rollq task`, rq-dashboard's job page (RQ's
exc_info) and the rollout itself; before, each showed only `RuntimeError: message`."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest
from rq.job import Job
from rq.queue import Queue
from rq.serializers import JSONSerializer

from rollq.producer import Producer
from tests.support.servers import ROLLQ, RedisServer, WorkerProcess


@pytest.mark.redis
def test_an_agent_traceback_reaches_the_worker_log_rollq_task_rq_dashboard_and_the_rollout(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    producer = Producer.from_url(redis_server.url, namespace)
    worker = workers(redis_server.url, namespace, env={"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent"})
    rid = producer.enqueue({"raise": "tool call returned HTTP 500"}).rollout_id
    rollout = producer.wait([rid], timeout=60)[0]

    frame = 'fault_agents.py", line'
    assert frame in rollout.metadata["error"]["traceback"]
    assert "Traceback (most recent call last)" in worker.log() and frame in worker.log()
    shown = subprocess.run(
        [ROLLQ, "--url", redis_server.url, "-n", namespace, "task", rid], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0 and "traceback" in shown.stdout and frame in shown.stdout, shown
    queue = Queue(namespace, connection=producer.connection, serializer=JSONSerializer)
    (job_id,) = queue.failed_job_registry.get_job_ids(cleanup=False)
    job = Job.fetch(job_id, connection=producer.connection, serializer=JSONSerializer)
    assert frame in (job.exc_info or ""), job.exc_info
