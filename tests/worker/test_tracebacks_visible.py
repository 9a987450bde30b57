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
from tests.support.waiting import wait_until


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


@pytest.mark.redis
def test_a_failed_rollouts_traceback_is_logged_once_with_its_rollout_and_job_and_rq_still_records_it(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    # An operator's audit: the worker log carried an agent's traceback twice, once from rollq ("task ... attempt 1
    # failed") and once more in RQ's "job ... failed" line.
    producer = Producer.from_url(redis_server.url, namespace)
    worker = workers(redis_server.url, namespace, env={"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent"})
    rid = producer.enqueue({"raise": "tool call returned HTTP 500"}).rollout_id
    producer.wait([rid], timeout=60)
    queue = Queue(namespace, connection=producer.connection, serializer=JSONSerializer)
    # RQ's end of the job is written just after the rollout is published, and logged after that.
    (job_id,) = wait_until(lambda: queue.failed_job_registry.get_job_ids(cleanup=False), "RQ's failed job")
    job = Job.fetch(job_id, connection=producer.connection, serializer=JSONSerializer)

    log = wait_until(lambda: f"job {job_id} failed" in (text := worker.log()) and text, "the job's end in the log")
    assert log.count("Traceback (most recent call last)") == 1, log
    assert log.count('fault_agents.py", line') == 1, log
    lines = log.splitlines()
    head = lines[lines.index("Traceback (most recent call last):") - 1]
    assert f"task {rid} attempt 1 (RQ job {job_id}) failed: RuntimeError: tool call returned HTTP 500" in head, log
    # The job's end names the failure in one line.
    assert f"job {job_id} failed: rollout {rid} attempt 1 failed: RuntimeError: tool call returned HTTP 500" in log
    # RQ's record of the job is as before: failed, with the traceback (rq-dashboard's job page shows it).
    assert job.get_status() == "failed" and 'fault_agents.py", line' in (job.exc_info or "")
    assert f"rollout {rid} attempt 1 failed" in (job.exc_info or "")
