"""The trainer-side verbs on real Redis and real workers: get_rollout, task_info, attempts, query_tasks,
wait(partial=True) and cancel of queued and running tasks."""

from __future__ import annotations

import time
import uuid

import pytest

from rollq.models.contract import Rollout
from rollq.models.errors import UnknownTaskError
from rollq.models.policy import RolloutPolicy, RolloutStatus, TaskState
from rollq.producer.producer import Producer
from rollq.store.control import CancelOutcome
from rollq.store.queries import AttemptOutcome
from rollq.store.replies import Cancelled, ClaimRefused
from rollq.store.transitions import Finish
from tests.support.fault_agents import assert_exactly_once
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis

AGENT = {
    "ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent",
    "ROLLQ_HEARTBEAT_SECONDS": "0.5",
    "ROLLQ_GRACE_SECONDS": "0",
}


@pytest.fixture
def producer(redis_server, namespace) -> Producer:
    return Producer.from_url(redis_server.url, namespace)


@pytest.fixture
def serve(redis_server, namespace, workers):
    def start(concurrency: int = 4):
        return workers(
            redis_server.url, namespace, env=AGENT, args=["--name", f"{namespace}-w{concurrency}"]
        ), f"{namespace}-w{concurrency}"

    return start


def test_get_rollout_is_none_until_the_task_finishes_and_unknown_ids_raise(producer, serve) -> None:
    rid = producer.enqueue({"sleep": 0}).rollout_id
    assert producer.get_rollout(rid) is None
    assert producer.task_info(rid).state == TaskState.QUEUED
    with pytest.raises(UnknownTaskError):
        producer.get_rollout("no-such-task")
    serve()
    producer.wait([rid], timeout=30)
    rollout = producer.get_rollout(rid)
    assert rollout is not None and rollout.final_reward == 1.0
    assert producer.get_rollouts([rid, "no-such-task"]) == {rid: rollout}


def test_task_info_shows_state_worker_attempts_and_times(producer, serve) -> None:
    rid = producer.enqueue({"sleep": 1.5}, mode="train").rollout_id
    queued = producer.task_info(rid)
    assert (queued.state, queued.attempt, queued.worker, queued.mode) == (TaskState.QUEUED, 0, None, "train")
    assert queued.created_at is not None and queued.ended_at is None
    _, name = serve()
    running = wait_until(
        lambda: (i := producer.task_info(rid)).state == TaskState.RUNNING and i,
        "the task to start running",
        timeout=20,
    )
    assert (running.attempt, running.attempts_used, running.worker) == (1, 1, name)
    producer.wait([rid], timeout=30)
    done = producer.task_info(rid)
    assert done.state == TaskState.SUCCEEDED and done.result_id is not None
    assert done.created_at <= done.last_claim_at <= done.ended_at


def test_attempts_record_a_timed_out_attempt_and_the_retry_that_succeeded(producer, serve) -> None:
    # First attempt times out (sleep 3 > 1 s limit); the input then says to succeed at once on attempt 2.
    policy = RolloutPolicy(timeout_seconds=1, max_attempts=2)
    rid = producer.enqueue({"sleep_first": 3}, policy=policy).rollout_id
    _, name = serve()
    [rollout] = producer.wait([rid], timeout=30)
    assert rollout.metadata["attempt"] == 2
    history = producer.attempts(rid)
    assert [(a.attempt, a.outcome, a.worker) for a in history] == [
        (1, AttemptOutcome.RETRY, name),
        (2, AttemptOutcome.SUCCEEDED, name),
    ]
    assert history[0].claimed_at <= history[0].ended_at <= history[1].claimed_at <= history[1].ended_at
    with pytest.raises(UnknownTaskError):
        producer.attempts("no-such-task")


def test_query_tasks_pages_through_every_match_once(producer, serve) -> None:
    train = {t.rollout_id for t in producer.enqueue_many([{"sleep": 0}] * 23, mode="train")}
    val = {t.rollout_id for t in producer.enqueue_many([{"sleep": 0}] * 5, mode="val")}
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = producer.query_tasks(mode="train", limit=7, cursor=cursor)
        assert len(page.tasks) <= 7
        seen += [t.rollout_id for t in page.tasks]
        pages += 1
        if page.cursor is None:
            break
        cursor = page.cursor
    assert sorted(seen) == sorted(train) and pages >= 4
    assert {t.rollout_id for t in producer.query_tasks(state="queued", mode="val", limit=100).tasks} == val
    serve()
    producer.wait(sorted(train | val), timeout=30)
    assert producer.query_tasks(state=TaskState.QUEUED).tasks == []
    assert len(producer.query_tasks(state=TaskState.SUCCEEDED, limit=1000).tasks) == 28


@pytest.mark.slow
def test_wait_partial_returns_what_finished_and_what_is_missing(producer, serve) -> None:
    quick = producer.enqueue({"sleep": 0}).rollout_id
    slow = producer.enqueue({"sleep": 30}).rollout_id
    serve()
    result = producer.wait([slow, quick], timeout=8, partial=True)
    assert [r.rollout_id for r in result.finished] == [quick]
    assert result.missing == [slow] and not result.complete


def test_cancel_of_a_queued_task_means_it_never_runs(producer, serve, namespace) -> None:
    doomed = producer.enqueue({"sleep": 0}).rollout_id
    kept = producer.enqueue({"sleep": 0}).rollout_id
    [result] = producer.cancel([doomed])
    assert (result.outcome, result.state, result.attempt) == (CancelOutcome.CANCELLED, TaskState.QUEUED, 0)
    serve()
    rollouts = producer.wait([doomed, kept], timeout=30)
    assert [r.metadata["status"] for r in rollouts] == ["cancelled", "succeeded"]
    assert producer.attempts(doomed) == [] and producer.task_info(doomed).state == TaskState.CANCELLED
    assert producer.get_task(doomed).num_claims == 0
    again, unknown = producer.cancel([doomed, "no-such-task"])
    assert (again.outcome, again.state, unknown.outcome) == (CancelOutcome.FINISHED, "cancelled", "unknown")
    assert_exactly_once(producer.connection, namespace, [doomed, kept])


def test_cancel_of_a_running_task_ends_it_once_and_the_worker_serves_on(producer, serve, namespace) -> None:
    rid = producer.enqueue({"sleep": 2}).rollout_id
    _, name = serve()
    wait_until(lambda: producer.task_info(rid).state == TaskState.RUNNING, "the task to start running", timeout=20)
    [result] = producer.cancel([rid])
    assert result.was_running and result.attempt == 1
    [rollout] = producer.wait([rid], timeout=5)
    assert rollout.metadata["status"] == "cancelled" and rollout.metadata["worker"] == name
    after = producer.enqueue({"sleep": 0}).rollout_id
    assert producer.wait([after], timeout=30)[0].metadata["status"] == "succeeded"
    assert producer.connection.xlen(producer.keys.superseded) == 0
    assert [a.outcome for a in producer.attempts(rid)] == [AttemptOutcome.CANCELLED]
    stats = {k.decode(): float(v) for k, v in producer.connection.hgetall(producer.keys.stats).items()}
    assert (stats["succeeded:"], stats["cancelled:"]) == (1, 1)
    assert_exactly_once(producer.connection, namespace, [rid, after])


def test_cancel_stops_a_running_agent_and_frees_its_slot(producer, workers, redis_server, namespace) -> None:
    env = {**AGENT, "ROLLQ_CONCURRENCY": "1"}
    long = producer.enqueue({"sleep": 60}).rollout_id
    workers(redis_server.url, namespace, env=env)
    wait_until(lambda: producer.task_info(long).state == TaskState.RUNNING, "the long task to start", timeout=20)
    nxt = producer.enqueue({"sleep": 0}).rollout_id
    started = time.monotonic()
    producer.cancel([long])
    # With one slot, the next task runs only once the cancelled agent was stopped (within a heartbeat).
    [rollout] = producer.wait([nxt], timeout=20)
    assert rollout.metadata["status"] == "succeeded" and time.monotonic() - started < 10


def test_a_cancelled_attempts_late_finish_is_dropped_not_superseded() -> None:
    # The worker stops a cancelled agent at its next heartbeat; one that finished just before still
    # calls finish, which must drop the result (it is neither delivered nor kept as superseded).
    producer = Producer.from_url(f"memory://{uuid.uuid4().hex}", namespace="drop")
    rid = producer.enqueue({"sleep": 0}).rollout_id
    job = producer.connection.lindex(producer.keys.rq_queue, 0).decode()
    claim = producer.lifecycle.claim(rid, job, "w1")
    assert not isinstance(claim, ClaimRefused)
    [result] = producer.cancel([rid])
    assert result.was_running and result.attempt == claim.attempt
    late = Rollout(rollout_id=rid, final_reward=1.0).model_dump_json()
    reply = producer.lifecycle.finish(
        Finish(
            rollout_id=rid,
            attempt=claim.attempt,
            rollout_json=late,
            status=RolloutStatus.SUCCEEDED,
            results_maxlen=100,
            dead_letter=False,
            now=time.time(),
        )
    )
    assert reply == Cancelled()
    assert producer.connection.xlen(producer.keys.superseded) == 0
    assert producer.connection.xlen(producer.keys.results) == 1
    assert producer.get_rollout(rid).metadata == {"status": "cancelled", "attempt": claim.attempt, "worker": "w1"}
    assert producer.connection.hget(producer.keys.stats, "dropped:cancelled") == b"1"
    assert producer.lifecycle.claim(rid, job, "w2") == ClaimRefused("stale", "cancelled")
