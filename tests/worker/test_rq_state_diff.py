"""RQ pinned by behaviour: the same jobs through a stock ``rq worker`` and through ``RolloutWorker`` leave the
Redis state RQ users and rq-dashboard read the same.

Each side runs as a real subprocess against a private redis-server: plain function jobs
(``tests/support/plain_rq_jobs.py``) on a plain RQ queue with the JSON serializer for the stock worker, rollq tasks
(``tests.support.fault_agents:FaultAgent``, the same inputs) for ``rq worker -w rollq.worker.RolloutWorker``; three
succeed, one fails. Read with RQ's own API afterwards: the registries' membership, each job's status, result
(``Job.latest_result()``) and hash fields, the worker (``Worker.all()``, its fields and state while it idles,
and after it stops), and every ``rq:`` key left in Redis. What legitimately differs is normalised before the
comparison and listed in :data:`ALLOWED_DIFFERENCES`; everything else must be equal.

When RQ moves (see docs/rq.md): run this with tests/worker/test_rq_contract.py and tests/worker/test_slots.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis
from rq.job import Job
from rq.queue import Queue
from rq.registry import (
    CanceledJobRegistry,
    DeferredJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)
from rq.results import Result
from rq.serializers import JSONSerializer
from rq.worker import Worker

from rollq.models.policy import RolloutPolicy
from rollq.producer.producer import Producer
from tests.support.servers import REPO, RQ, RedisServer, WorkerProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis

SPECS: list[dict[str, Any]] = [
    {"sleep": 0.05},
    {"sleep": 0.05},
    {"raise": "fails on purpose"},
    {"sleep": 0.05},
]
FAILING = {2}

ALLOWED_DIFFERENCES = {
    "job hash fields": "rollq jobs never carry a callback, dependency or retry field a stock job may get, and their"
    " 'data' names rollq's function; both sides' fields are compared minus the ones listed in _JOB_FIELD_EXTRAS",
    "worker hash fields": "RolloutWorker adds rollq_concurrency (its capacity, read by rollq status)",
    "result values": "a rollq job's result is its AttemptResult (rollout_id, status, attempt, reward, mode, input);"
    " compared by status and reward, the stock function returns the same two",
    "descriptions": "a rollq job's description names the rollout and its outcome; a stock one the function call",
    "TTLs": "rollq keeps finished jobs for its result_ttl (a day by default), RQ 500 s: compared as 'expires'",
    "failure_ttl": "rollq jobs carry a failure_ttl (bounded memory), so a failed job's result stream expires with"
    " the job where a stock job's (no failure_ttl) is kept: compared as 'as failure_ttl says'",
    "exc_string": "a stock job's is the traceback, a rollq job's the error line then the attempt: compared by the"
    " line naming the exception",
}
# Job hash fields only one side writes, by design (see ALLOWED_DIFFERENCES).
_JOB_FIELD_EXTRAS = {"meta", "failure_ttl"}
_WORKER_FIELD_EXTRAS = {"rollq_concurrency"}


def _registries(connection: redis.Redis, queue: str) -> dict[str, list[str]]:
    kinds = {
        "started": StartedJobRegistry,
        "finished": FinishedJobRegistry,
        "failed": FailedJobRegistry,
        "deferred": DeferredJobRegistry,
        "scheduled": ScheduledJobRegistry,
        "canceled": CanceledJobRegistry,
    }
    return {
        name: cls(queue, connection=connection, serializer=JSONSerializer).get_job_ids(cleanup=False)
        for name, cls in kinds.items()
    }


def _done(connection: redis.Redis, queue: str) -> bool:
    registries = _registries(connection, queue)
    return len(registries["finished"]) + len(registries["failed"]) == len(SPECS) and not registries["started"]


def _ttl(connection: redis.Redis, key: str) -> str:
    ttl = int(connection.ttl(key))  # type: ignore[arg-type]
    return {-2: "gone", -1: "kept"}.get(ttl, "expires")


def snapshot(
    connection: redis.Redis, queue: str, job_ids: list[str], stopped: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """What RQ's API and rq-dashboard read of ``queue``'s jobs and worker, with ids, names and times replaced by
    placeholders (``job-<i>`` in enqueue order, ``Q``, ``W``, ``E``); ``stopped``: names of workers that ran
    and stopped (RQ leaves their hash to expire)."""
    alias = {jid: f"job-{i}" for i, jid in enumerate(job_ids)}
    state: dict[str, Any] = {}
    state["registries"] = {k: sorted(alias[j] for j in v) for k, v in _registries(connection, queue).items()}
    q = Queue(queue, connection=connection, serializer=JSONSerializer)
    state["queue"] = {
        "count": q.count,
        "intermediate": connection.llen(q.intermediate_queue_key),
        "in rq:queues": connection.sismember("rq:queues", q.key),
    }
    workers = Worker.all(connection=connection, serializer=JSONSerializer)
    worker_names = {w.name for w in workers}
    jobs: dict[str, Any] = {}
    for jid, name in alias.items():
        job = Job.fetch(jid, connection=connection, serializer=JSONSerializer)
        result = job.latest_result()
        fields = {k.decode() for k in connection.hkeys(job.key)}  # type: ignore[union-attr]
        value = result.return_value if result is not None else None
        jobs[name] = {
            "status": job.get_status(),
            "hash fields": sorted(fields - _JOB_FIELD_EXTRAS),
            "ttl": _ttl(connection, job.key),
            "origin is the queue": job.origin == queue,
            "worker_name is the worker": job.worker_name in worker_names,
            "started_at <= ended_at": job.started_at is not None
            and job.ended_at is not None
            and job.started_at <= job.ended_at,
            "result type": result.type.name if result is not None else None,
            "result worker is the worker": result is not None and result.worker_name in worker_names,
            "result has an execution": result is not None and bool(result.execution_id),
            "result status, reward": (value.get("status"), value.get("reward")) if isinstance(value, dict) else None,
            "exc_string names": _exception_line(result.exc_string if result else None),
            "results kept": len(Result.all(job, serializer=JSONSerializer)),
            "results ttl": _results_ttl(connection, job),
        }
    state["jobs"] = jobs
    state["workers"] = [
        {
            "state": w.get_state(),
            "queues": [n.replace(queue, "Q") for n in w.queue_names()],
            "successful_job_count": w.successful_job_count,
            "failed_job_count": w.failed_job_count,
            "total_working_time > 0": w.total_working_time > 0,
            "current job": w.get_current_job_id(),
            "hash fields": sorted({k.decode() for k in connection.hkeys(w.key)} - _WORKER_FIELD_EXTRAS),  # type: ignore[union-attr]
            "in rq:workers": connection.sismember("rq:workers", w.key),
            "in rq:workers:Q": connection.sismember(f"rq:workers:{queue}", w.key),
        }
        for w in workers
    ]
    state["stopped workers' hash fields"] = [
        sorted({k.decode() for k in connection.hkeys(f"rq:worker:{name}")} - _WORKER_FIELD_EXTRAS)  # type: ignore[union-attr]
        for name in sorted(stopped)
    ]
    state["rq keys"] = sorted(_key_shapes(connection, queue, alias, worker_names | stopped))
    return state


def _exception_line(exc_string: str | None) -> str | None:
    """The line of ``exc_string`` that names the exception (``Type: message``)."""
    lines = [line for line in (exc_string or "").splitlines() if re.match(r"^\w+(Error|Exception): ", line)]
    return lines[-1] if lines else None


def _results_ttl(connection: redis.Redis, job: Job) -> str:
    ttl = _ttl(connection, f"rq:results:{job.id}")
    if job.get_status() == "failed" and (ttl == "expires") == (job.failure_ttl is not None):
        return "as failure_ttl says"
    return ttl


def _key_shapes(connection: redis.Redis, queue: str, alias: dict[str, str], workers: set[str]) -> set[str]:
    """Every ``rq:`` key, with ids and names replaced (rollq's own keys live under its namespace, not ``rq:``)."""
    shapes = set()
    for raw in connection.scan_iter("rq:*"):
        if raw.startswith(b"rq:results:"):
            job = Job.fetch(raw.decode().removeprefix("rq:results:"), connection=connection, serializer=JSONSerializer)
            shapes.add(f"rq:results:{alias[job.id]} (stream, {_results_ttl(connection, job)})")
            continue
        key = raw.decode()
        for jid, name in alias.items():
            key = key.replace(jid, name)
        for worker in workers:
            key = key.replace(worker, "W")
        key = key.replace(f":{queue}", ":Q")
        key = re.sub(r"rq:execution:job-(\d+):[0-9a-f-]+", r"rq:execution:job-\1:E", key)
        shapes.add(f"{key} ({connection.type(raw).decode()}, {_ttl(connection, raw.decode())})")  # type: ignore[union-attr]
    return shapes


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_stock(server: RedisServer, log: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The jobs through a stock ``rq worker`` (its default forking Worker) on queue ``plain``."""
    connection = server.client()
    queue = Queue("plain", connection=connection, serializer=JSONSerializer)
    ids = [queue.enqueue("plain_rq_jobs.rollout", spec, description=f"rollout {i}").id for i, spec in enumerate(SPECS)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests" / "support"), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [RQ, "worker", "-S", "rq.serializers.JSONSerializer", "--url", server.url, "plain"],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
        cwd=REPO,
    )
    try:
        wait_until(lambda: _done(connection, "plain"), "the stock worker to end every job", timeout=60)
        wait_until(lambda: _idle(connection), "the stock worker to idle", timeout=60)
        running = snapshot(connection, "plain", ids)
        names = frozenset(w.name for w in Worker.all(connection=connection, serializer=JSONSerializer))
    finally:
        _stop(process)
    return running, snapshot(connection, "plain", ids, names)


def run_rollq(server: RedisServer, log: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same inputs as rollq tasks through ``rq worker -w rollq.worker.RolloutWorker`` (one attempt each)."""
    producer = Producer(server.client(), "roll", policy=RolloutPolicy(max_attempts=1))
    ids = [producer.keys.job_id(t.rollout_id) for t in producer.enqueue_many(SPECS, mode="train")]
    connection = server.client()
    worker = WorkerProcess(
        server.url, "roll", log, env={"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent", "ROLLQ_CONCURRENCY": "4"}
    )
    try:
        wait_until(lambda: _done(connection, "roll"), "RolloutWorker to end every job", timeout=60)
        wait_until(lambda: _idle(connection), "RolloutWorker to idle", timeout=60)
        running = snapshot(connection, "roll", ids)
        names = frozenset(w.name for w in Worker.all(connection=connection, serializer=JSONSerializer))
    finally:
        worker.stop(timeout=30)
    return running, snapshot(connection, "roll", ids, names)


def _idle(connection: redis.Redis) -> bool:
    workers = Worker.all(connection=connection, serializer=JSONSerializer)
    return len(workers) == 1 and workers[0].get_state() == "idle"


def test_rolloutworker_leaves_the_redis_state_a_stock_rq_worker_leaves(own_redis, tmp_path) -> None:  # type: ignore[no-untyped-def]
    stock_running, stock_stopped = run_stock(own_redis(), tmp_path / "stock.log")
    rollq_running, rollq_stopped = run_rollq(own_redis(), tmp_path / "rollq.log")
    print("stock:", stock_running, stock_stopped, "\nrollq:", rollq_running, rollq_stopped)
    # The run did what it should on both sides (so that equal states are not two equally broken ones).
    assert stock_running["registries"]["failed"] == ["job-2"]
    assert stock_running["jobs"]["job-0"]["result status, reward"] == ("succeeded", 1.0)
    assert stock_running["workers"][0]["successful_job_count"] == 3
    for part in ("registries", "queue", "jobs", "workers", "rq keys"):
        assert rollq_running[part] == stock_running[part], part
    # After the worker stops: its keys are gone, the jobs' state stays.
    assert stock_stopped["workers"] == []
    assert len(stock_stopped["stopped workers' hash fields"]) == 1
    for part in ("registries", "queue", "jobs", "workers", "stopped workers' hash fields", "rq keys"):
        assert rollq_stopped[part] == stock_stopped[part], part
