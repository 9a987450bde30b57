"""Every task a RolloutWorker takes frees exactly one slot, whatever path it ends on, one task a job or in packs.

The slots are counted in ``rollq/worker/slots.py``: taken when a job is dequeued (or taken ahead), freed when
its end is recorded (``rq_lifecycle.RqLifecycle._end_tasks``) or, for a job that never starts, when it is
refused or given back (``rq_worker.RolloutWorker``). A path that freed twice would let the worker run more
rollouts than its concurrency (and is refused and counted in ``over_freed``); one that never freed would shrink
the worker for good (``held`` stays above zero). Each path runs on its own, on a real redis-server, with two
slots for three or so jobs, so that jobs are taken ahead and wait for a slot too.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from rq.queue import Queue
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer

from rollq.models.policy import RolloutPolicy, TaskState
from rollq.producer.producer import Producer
from rollq.store.keys import TaskField
from rollq.worker import RolloutWorker, WorkerSettings
from rollq.worker.slots import SlotAccountingError, Slots
from tests.support.fault_agents import FaultAgent
from tests.support.servers import RedisServer

pytestmark = pytest.mark.redis

CONCURRENCY = 2
ONE_ATTEMPT = RolloutPolicy(max_attempts=1)

# A path: (set it up on the producer, returning a check of the outcome to run after the worker ends;
#          worker settings beyond the defaults).
Check = Callable[[], None]


def _states(producer: Producer, ids: list[str]) -> list[TaskState]:
    # Read raw: some paths leave a record task_info() refuses to parse.
    return [TaskState(producer.connection.hget(producer.keys.task(rid), TaskField.STATE).decode()) for rid in ids]  # type: ignore[union-attr]


def _published(producer: Producer) -> Check:
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.05}] * 3, policy=ONE_ATTEMPT)]
    return lambda: _expect(_states(producer, ids), [TaskState.SUCCEEDED] * 3)


def _agent_exception(producer: Producer) -> Check:
    ids = [t.rollout_id for t in producer.enqueue_many([{"raise": "boom"}] * 3, policy=ONE_ATTEMPT)]
    return lambda: _expect(_states(producer, ids), [TaskState.FAILED] * 3)


def _retried_then_failed(producer: Producer) -> Check:
    policy = RolloutPolicy(max_attempts=2, retry_on=frozenset({"exception"}))
    tasks = producer.enqueue_many([{"raise": "boom"}] * 2, policy=policy)
    ids = [t.rollout_id for t in tasks]

    def check() -> None:
        _expect(_states(producer, ids), [TaskState.FAILED] * 2)
        _expect([len(producer.attempts(rid)) for rid in ids], [2, 2])

    return check


def _timed_out(producer: Producer) -> Check:
    policy = RolloutPolicy(max_attempts=1, timeout_seconds=0.3)
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 5}] * 3, policy=policy)]

    def check() -> None:
        _expect(_states(producer, ids), [TaskState.FAILED] * 3)
        rollouts = producer.get_rollouts(ids)
        _expect({r.metadata["error"]["type"] for r in rollouts.values()}, {"AgentTimeoutError"})

    return check


def _cancelled_while_queued(producer: Producer) -> Check:
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.05}] * 3, policy=ONE_ATTEMPT)]
    producer.cancel(ids)
    return lambda: _expect(_states(producer, ids), [TaskState.CANCELLED] * 3)


def _cancelled_while_running(producer: Producer) -> Check:
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 10}] * 2, policy=ONE_ATTEMPT)]

    def cancel_once_running() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _states(producer, ids) != [TaskState.RUNNING] * 2:
            time.sleep(0.05)
        producer.cancel(ids)

    threading.Thread(target=cancel_once_running, daemon=True).start()
    return lambda: _expect(_states(producer, ids), [TaskState.CANCELLED] * 2)


def _not_a_rollq_job(producer: Producer) -> Check:
    queue = Queue(producer.namespace, connection=producer.connection, serializer=JSONSerializer)
    foreign = [queue.enqueue("plain_rq_jobs.rollout", {}).id for _ in range(2)]
    (fine,) = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.05}], policy=ONE_ATTEMPT)]

    def check() -> None:
        _expect(_states(producer, [fine]), [TaskState.SUCCEEDED])
        # Refused when RQ dequeued it (failed), or set aside when taken ahead (the quarantine list).
        quarantined = {j.decode() for j in producer.connection.lrange(producer.keys.quarantine, 0, -1)}  # type: ignore[union-attr]
        _expect([j in quarantined or queue.fetch_job(j).get_status() == "failed" for j in foreign], [True, True])  # type: ignore[union-attr]

    return check


def _invalid_record(producer: Producer) -> Check:
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.05}] * 2, policy=ONE_ATTEMPT)]
    for rid in ids:
        producer.connection.hset(producer.keys.task(rid), TaskField.UNRESPONSIVE, "not a number")
    return lambda: _expect(_states(producer, ids), [TaskState.FAILED] * 2)


def _unreadable_task(producer: Producer) -> Check:
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.05}] * 2, policy=ONE_ATTEMPT)]
    for rid in ids:
        producer.connection.hset(producer.keys.task(rid), TaskField.TASK, "{not json")
    return lambda: _expect(_states(producer, ids), [TaskState.FAILED] * 2)


def _handed_back_on_stop(producer: Producer) -> Check:
    # Three tasks for two slots: two run, the third is taken ahead or still queued, when SIGTERM arrives (as
    # to a worker process; the worker runs on this process's main thread). No grace: both are handed back.
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 10}] * 3, policy=ONE_ATTEMPT)]

    def stop_once_running() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _states(producer, ids).count(TaskState.RUNNING) < CONCURRENCY:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_once_running, daemon=True).start()

    def check() -> None:
        _expect(_states(producer, ids), [TaskState.QUEUED] * 3)
        _expect(sorted(len(producer.attempts(rid)) for rid in ids), [0, 1, 1])
        _expect({a.outcome for rid in ids for a in producer.attempts(rid)}, {"released"})

    return check


PATHS: dict[str, tuple[Callable[[Producer], Check], dict[str, Any]]] = {
    "published": (_published, {}),
    "agent exception": (_agent_exception, {}),
    "retried then failed": (_retried_then_failed, {}),
    "timed out": (_timed_out, {}),
    "cancelled while queued": (_cancelled_while_queued, {}),
    "cancelled while running": (_cancelled_while_running, {"grace_seconds": 20}),
    "not a rollq job": (_not_a_rollq_job, {}),
    "invalid task record": (_invalid_record, {}),
    "unreadable task": (_unreadable_task, {}),
    "handed back on stop": (_handed_back_on_stop, {"grace_seconds": 0}),
}


def _expect(got: Any, wanted: Any) -> None:
    assert got == wanted


@pytest.mark.parametrize("tasks_per_job", [1, 2], ids=["one task a job", "packs of 2"])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_task_frees_exactly_one_slot_whatever_path_it_ends_on(
    redis_server: RedisServer, namespace: str, path: str, tasks_per_job: int
) -> None:
    arrange, overrides = PATHS[path]
    producer = Producer(redis_server.client(), namespace, tasks_per_job=tasks_per_job)
    check = arrange(producer)
    settings = WorkerSettings(
        concurrency=CONCURRENCY,
        heartbeat_seconds=0.2,
        tasks_per_job=tasks_per_job,
        **{"grace_seconds": 10, **overrides},
    )
    worker = RolloutWorker([namespace], connection=redis_server.client(), agent=FaultAgent(), settings=settings)
    worker.work(burst=True, logging_level="WARNING")

    slots = worker.slots
    assert (slots.held, slots.busy, slots.over_freed) == (0, 0, 0)
    assert 1 <= slots.most_held <= CONCURRENCY
    check()
    # Nothing is left running, in rollq's view or RQ's.
    assert producer.connection.zcard(producer.keys.inflight) == 0
    started = StartedJobRegistry(namespace, connection=producer.connection, serializer=JSONSerializer)
    assert started.get_job_ids(cleanup=False) == []
    assert producer.connection.llen(producer.keys.rq_intermediate) == 0


def test_a_pack_larger_than_the_concurrency_holds_every_slot_runs_alone_and_frees_them_all(
    redis_server: RedisServer, namespace: str
) -> None:
    producer = Producer(redis_server.client(), namespace, tasks_per_job=5)
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.2}] * 6, policy=ONE_ATTEMPT)]
    settings = WorkerSettings(concurrency=CONCURRENCY, heartbeat_seconds=0.2, tasks_per_job=5)
    worker = RolloutWorker([namespace], connection=redis_server.client(), agent=FaultAgent(), settings=settings)
    worker.work(burst=True, logging_level="WARNING")

    slots = worker.slots
    assert (slots.held, slots.busy, slots.over_freed) == (0, 0, 0)
    assert slots.most_held == CONCURRENCY
    assert _states(producer, ids) == [TaskState.SUCCEEDED] * 6
    assert producer.connection.llen(producer.keys.rq_intermediate) == 0


def test_a_slot_freed_twice_is_refused_and_counted() -> None:
    slots = Slots(2)
    assert slots.take() and slots.take()
    assert not slots.take(blocking=False)
    slots.free(2)
    with pytest.raises(SlotAccountingError):
        slots.free()
    assert (slots.held, slots.over_freed, slots.most_held) == (0, 1, 2)
    assert slots.take(blocking=False)  # the refused free gave no slot beyond the capacity
    assert slots.take(blocking=False)
    assert not slots.take(blocking=False)
