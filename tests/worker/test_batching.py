"""A worker starts and ends its jobs in batches: few round trips per rollout, RQ's view of every job intact."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import redis
from redis.connection import Connection
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from rollq.producer import Producer
from rollq.store.transitions import Lifecycle
from rollq.worker import LitAgent, RolloutWorker, WorkerSettings
from tests.support.servers import RedisServer


class _Counting(Connection):
    """Counts round trips: every packed send (a command, a pipeline, a Lua call) is one."""

    sends = 0
    lock = threading.Lock()

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        with _Counting.lock:
            _Counting.sends += 1
        super().send_packed_command(command, check_health)


class Quick(LitAgent):
    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: Any) -> float:
        await asyncio.sleep(0.05)
        if task_input["i"] % 10 == 9:
            raise ValueError(f"task {task_input['i']} fails on purpose")
        return float(task_input["i"])


def _run(server: RedisServer, namespace: str, jobs: int, concurrency: int) -> tuple[Producer, list[Any], int]:
    producer = Producer(server.client(), namespace)
    tasks = producer.enqueue_many([{"i": i} for i in range(jobs)], mode="train")
    client = redis.Redis(
        connection_pool=redis.ConnectionPool(connection_class=_Counting, host="127.0.0.1", port=server.port)
    )
    worker = RolloutWorker(
        [namespace], connection=client, agent=Quick(), settings=WorkerSettings(concurrency=concurrency)
    )
    _Counting.sends = 0
    worker.work(burst=True, logging_level="WARNING")
    return producer, tasks, _Counting.sends


def test_round_trips_per_rollout_fall_when_many_rollouts_are_in_flight(
    redis_server: RedisServer, namespace: str
) -> None:
    producer, tasks, sends = _run(redis_server, namespace, jobs=200, concurrency=50)
    producer.wait([t.rollout_id for t in tasks], timeout=60)
    # One job at a time took about 10 round trips before batching (6 now, start-up aside); 50 in flight
    # share their claims', publications' and RQ bookkeeping's pipelines.
    assert sends / 200 < 2.0, f"{sends / 200:.2f} round trips per rollout"


def test_batched_jobs_look_to_rq_as_jobs_run_one_by_one(redis_server: RedisServer, namespace: str) -> None:
    producer, tasks, _ = _run(redis_server, namespace, jobs=40, concurrency=20)
    rollouts = producer.wait([t.rollout_id for t in tasks], timeout=60)
    connection = redis_server.client()
    ids = {t.rollout_id: producer.keys.job_id(t.rollout_id) for t in tasks}
    failed = {t.rollout_id for t, r in zip(tasks, rollouts, strict=True) if r.metadata["status"] == "failed"}
    assert len(failed) == 4  # i = 9, 19, 29, 39
    finished = FinishedJobRegistry(namespace, connection=connection, serializer=JSONSerializer)
    failed_registry = FailedJobRegistry(namespace, connection=connection, serializer=JSONSerializer)
    started = StartedJobRegistry(namespace, connection=connection, serializer=JSONSerializer)
    assert set(finished.get_job_ids(cleanup=False)) == {ids[r] for r in ids if r not in failed}
    assert set(failed_registry.get_job_ids(cleanup=False)) == {ids[r] for r in failed}
    assert started.get_job_ids(cleanup=False) == []
    for rollout_id, jid in ids.items():
        job = Job.fetch(jid, connection=connection, serializer=JSONSerializer)
        if rollout_id in failed:
            assert job.get_status() == JobStatus.FAILED
            assert "fails on purpose" in (job.latest_result().exc_string or "")  # type: ignore[union-attr]
        else:
            assert job.get_status() == JobStatus.FINISHED
            assert job.return_value()["status"] == "succeeded"  # what rq-dashboard's job page shows
            assert job.started_at is not None and job.ended_at is not None


def test_a_redis_that_forgot_the_scripts_still_claims_and_publishes(redis_server: RedisServer, namespace: str) -> None:
    # Batches send EVALSHA without redis-py's SCRIPT EXISTS check; after a restart or failover Redis answers
    # NOSCRIPT, and each call is then run on its own (which loads the script).
    producer = Producer(redis_server.client(), namespace)
    lifecycle = Lifecycle(redis_server.client(), producer.keys)
    task = producer.enqueue_many([{"i": 1}], mode="train")[0]
    redis_server.client().script_flush()
    call = lifecycle.claim_call(task.rollout_id, producer.keys.job_id(task.rollout_id), "w")
    pipe = redis_server.client().pipeline(transaction=False)
    call.queue(pipe)
    (raw,) = pipe.execute(raise_on_error=False)
    assert isinstance(raw, redis.exceptions.NoScriptError)
    (settled,) = lifecycle.settle_all([call], [raw])
    claim = lifecycle.read_claim(settled)
    assert getattr(claim, "attempt", None) == 1

    others = producer.enqueue_many([{"i": i} for i in range(20)], mode="train")
    redis_server.client().script_flush()
    worker = RolloutWorker(
        [namespace], connection=redis_server.client(), agent=Quick(), settings=WorkerSettings(concurrency=10)
    )
    worker.work(burst=True, logging_level="WARNING")
    rollouts = producer.wait([t.rollout_id for t in others], timeout=60)
    assert len(rollouts) == 20


def test_a_jobs_result_is_every_field_of_its_attempt_result_that_is_set_as_asdict_gives_it() -> None:
    import dataclasses

    from rollq.worker.runner import AttemptResult, AttemptStatus

    results = [
        AttemptResult("r1", AttemptStatus.SUCCEEDED, 2, reward=0.5, mode="train", resources_id="v1", input="[1]"),
        AttemptResult("r2", AttemptStatus.FAILED, 1, error={"type": "ValueError", "message": "no"}),
        AttemptResult("r3", AttemptStatus.SKIPPED, reason="cancelled"),
    ]
    for result in results:
        as_rq_stores_it = result.to_json()
        assert as_rq_stores_it == {k: v for k, v in dataclasses.asdict(result).items() if v is not None}
        if result.error is not None:  # a copy: what RQ stores does not change with the rollout's metadata
            assert as_rq_stores_it["error"] is not result.error
