"""Fault injection on real processes: kill workers, stop them, restart Redis, let agents overrun.

Each test counts tasks in and rollouts out (results-stream entries per rollout
id) and asserts that none was lost and none delivered twice.
"""

from __future__ import annotations

import re
import signal

import pytest
from rq.registry import StartedJobRegistry

from rollq.models.policy import RolloutPolicy
from rollq.ops.status import render_text, snapshot
from rollq.producer.producer import Producer
from rollq.store.keys import Keys
from rollq.store.reaper import reap
from rollq.store.records import read_record
from tests.support.fault_agents import assert_exactly_once, published
from tests.support.servers import WorkerProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis

AGENT = {"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent"}


def worker_name(worker: WorkerProcess) -> str:
    return re.search(r"Worker (\S+): started with PID", worker.log()).group(1)


def running_on(producer: Producer, rollout_ids: list[str], worker: str) -> bool:
    records = [read_record(producer.connection, producer.keys, rid) for rid in rollout_ids]
    return all(r.state == "running" and r.worker == worker for r in records)


@pytest.mark.slow
def test_task_of_a_sigkilled_worker_completes_on_another_worker_as_attempt_2(redis_server, namespace, workers):
    producer = Producer.from_url(redis_server.url, namespace, policy=RolloutPolicy(unresponsive_seconds=3))
    env = {**AGENT, "ROLLQ_HEARTBEAT_SECONDS": "0.5", "ROLLQ_CONCURRENCY": "2"}
    victim_name, survivor_name = f"{namespace}-victim", f"{namespace}-survivor"
    victim = workers(redis_server.url, namespace, env=env, args=["--name", victim_name])
    doomed = [t.rollout_id for t in producer.enqueue_many([{"sleep": 3}] * 2)]
    wait_until(lambda: running_on(producer, doomed, victim_name), "the victim to run both tasks", timeout=30)

    survivor = workers(redis_server.url, namespace, env=env, args=["--name", survivor_name])
    victim.signal(signal.SIGKILL)
    assert victim.wait(30) == -signal.SIGKILL
    others = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.2}] * 4)]

    # Generous on purpose: the point is that the reaper acts within seconds, not RQ's minutes.
    rollouts = producer.wait(doomed + others, timeout=3 + 20 + 3)
    by_id = {r.rollout_id: r for r in rollouts}
    for rid in doomed:
        meta = by_id[rid].metadata
        assert (meta["status"], meta["attempt"], meta["worker"]) == ("succeeded", 2, survivor_name)
    assert all(by_id[rid].metadata["status"] == "succeeded" for rid in others)
    assert_exactly_once(producer.connection, namespace, doomed + others)
    assert survivor.process.poll() is None


def test_a_sigkilled_worker_is_listed_dead_once_a_reaper_requeued_its_tasks(redis_server, namespace, workers):
    # An operator's audit: after `kill -9` and the reaper's requeue, `rollq status` (and the dashboard's workers,
    # rollq_workers_alive) still listed the worker "busy" and alive until its last heartbeat was 30 s old.
    producer = Producer.from_url(redis_server.url, namespace, policy=RolloutPolicy(unresponsive_seconds=2))
    name = f"{namespace}-victim"
    victim = workers(
        redis_server.url, namespace, env={**AGENT, "ROLLQ_HEARTBEAT_SECONDS": "0.5"}, args=["--name", name]
    )
    rid = producer.enqueue({"sleep": 60}).rollout_id
    wait_until(lambda: running_on(producer, [rid], name), "the victim to run the task", timeout=30)
    victim.signal(signal.SIGKILL)
    assert victim.wait(30) == -signal.SIGKILL

    reaped = wait_until(
        lambda: reap(producer.lifecycle, results_maxlen=100, within=5).requeued, "a reaper to requeue it", timeout=15
    )
    assert reaped == 1 and read_record(producer.connection, producer.keys, rid).state == "queued"
    s = snapshot(producer.connection, producer.keys)
    (row,) = [w for w in s.workers if w["name"] == name]
    assert not row["alive"] and row["in_flight"] == 0 and s.workers_alive == 0, row
    assert row["reaped_at"] >= row["last_heartbeat"]
    assert f"    {name}: dead (a reaper took its tasks back), 0 in flight of 1" in render_text(s).splitlines()


def test_sigterm_lets_the_running_rollout_finish_and_takes_no_new_task(redis_server, namespace, workers):
    producer = Producer.from_url(redis_server.url, namespace)
    stopping = workers(
        redis_server.url, namespace, env={**AGENT, "ROLLQ_CONCURRENCY": "2", "ROLLQ_GRACE_SECONDS": "30"}
    )
    first = producer.enqueue({"sleep": 2}).rollout_id
    wait_until(
        lambda: read_record(producer.connection, producer.keys, first).state == "running",
        "the first task to start",
        timeout=30,
    )

    stopping.signal(signal.SIGTERM)
    wait_until(lambda: "shut down requested" in stopping.log(), "the worker to take the signal", timeout=10)
    late = producer.enqueue({"sleep": 0}).rollout_id

    assert stopping.wait(60) == 0
    [finished] = producer.wait([first], timeout=5)
    assert (finished.metadata["status"], finished.metadata["attempt"]) == ("succeeded", 1)
    untouched = read_record(producer.connection, producer.keys, late)
    assert (untouched.state, untouched.task.num_claims) == ("queued", 0)
    assert "Traceback" not in stopping.log()

    workers(redis_server.url, namespace, env=AGENT)
    [after] = producer.wait([late], timeout=30)
    assert (after.metadata["status"], after.metadata["attempt"]) == ("succeeded", 1)
    assert_exactly_once(producer.connection, namespace, [first, late])


def test_a_sigterm_while_the_worker_starts_stops_it_cleanly_leaving_no_llm_gate_report(
    redis_server, namespace, workers
):
    # A worker reports to the LLM gate (and starts its heartbeat) before its hooks' init_worker runs, and RQ
    # installs its signal handlers only after the whole start-up. A SIGTERM in between used to kill the process
    # on the spot (Python's default), leaving its gate report for a weight-sync pause to wait on.
    producer = Producer.from_url(redis_server.url, namespace)
    worker = workers(
        redis_server.url, namespace, env={**AGENT, "ROLLQ_HOOKS": "tests.support.fault_agents:SlowInitHook"}
    )
    wait_until(lambda: producer.llm_gate_status().workers == 1, "the worker to report to the LLM gate")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert producer.llm_gate_status().workers == 0
    assert f"rq:worker:{worker_name(worker)}".encode() not in producer.connection.smembers(producer.keys.rq_workers)
    assert "Traceback" not in worker.log()


def test_a_sigterm_during_rqs_registry_clean_up_stops_the_worker(redis_server, namespace, workers):
    # RQ's registry clean-up runs first thing in the worker's loop, under RQ's SIGTERM handler, which raises
    # StopRequested in whatever the main thread is doing. rollq's clean_registries caught every Exception around
    # it: the stop was logged as a failed clean-up and the worker went on taking tasks until it was killed.
    producer = Producer.from_url(redis_server.url, namespace)
    started = StartedJobRegistry(name=producer.keys.queue_name, connection=producer.connection)
    for first in range(0, 60_000, 5_000):  # expired entries of jobs long gone: RQ fetches each, for seconds
        producer.connection.zadd(started.key, {f"gone-{i}": 1 for i in range(first, first + 5_000)})
    worker = workers(redis_server.url, namespace, env=AGENT)
    wait_until(lambda: "cleaning registries" in worker.log(), "RQ's registry clean-up to begin", timeout=30)
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert producer.connection.zcard(started.key) > 0, "the clean-up ended before the signal: nothing was tested"
    assert "clean-up failed" not in worker.log()
    late = producer.enqueue({"sleep": 0}).rollout_id
    untouched = read_record(producer.connection, producer.keys, late)
    assert (untouched.state, untouched.task.num_claims) == ("queued", 0)


def test_a_sigterm_as_an_idle_worker_is_handed_a_task_gives_the_task_back_at_once(redis_server, namespace, workers):
    # The worker is stopped inside its blocking pop; Redis hands it the new task's job (moving it to RQ's
    # intermediate list) and the reply waits in the socket; SIGTERM lands before the worker reads it. RQ's handler
    # raised StopRequested there, dropping the reply: the job sat in the intermediate list until the reaper's
    # stranded-job pass put it back, 30 s and more later.
    producer = Producer.from_url(redis_server.url, namespace)
    stopping = workers(redis_server.url, namespace, env=AGENT)
    wait_until(lambda: "cleaning registries" in stopping.log(), "the worker to start", timeout=30)
    blocked = lambda: any(c.get("cmd") == "blmove" for c in producer.connection.client_list())  # noqa: E731
    wait_until(blocked, "a blocking pop", timeout=10)
    stopping.signal(signal.SIGSTOP)
    rid = producer.enqueue({"sleep": 0}).rollout_id
    wait_until(lambda: producer.connection.llen(producer.keys.rq_intermediate) == 1, "Redis to hand the job over")
    stopping.signal(signal.SIGTERM)
    stopping.signal(signal.SIGCONT)
    assert stopping.wait(30) == 0
    assert producer.connection.llen(producer.keys.rq_intermediate) == 0
    assert producer.connection.llen(producer.keys.rq_queue) == 1

    workers(redis_server.url, namespace, env=AGENT)
    [rollout] = producer.wait([rid], timeout=10)
    assert (rollout.metadata["status"], rollout.metadata["attempt"]) == ("succeeded", 1)
    assert_exactly_once(producer.connection, namespace, [rid])


@pytest.mark.slow
def test_sigterm_hands_an_unfinished_rollout_back_at_once_after_the_grace_period(redis_server, namespace, workers):
    # A reaper would wait 120 s; the hand-back must not.
    producer = Producer.from_url(redis_server.url, namespace, policy=RolloutPolicy(unresponsive_seconds=120))
    leaving_name, staying_name = f"{namespace}-leaving", f"{namespace}-staying"
    leaving = workers(
        redis_server.url, namespace, env={**AGENT, "ROLLQ_GRACE_SECONDS": "1"}, args=["--name", leaving_name]
    )
    rid = producer.enqueue({"sleep": 4}).rollout_id
    wait_until(lambda: running_on(producer, [rid], leaving_name), "the task to start", timeout=30)

    leaving.signal(signal.SIGTERM)
    assert leaving.wait(60) == 0
    handed_back = read_record(producer.connection, producer.keys, rid)
    assert (handed_back.state, handed_back.attempts_used) == ("queued", 0)
    stats = producer.connection.hgetall(producer.keys.stats)
    assert stats.get(b"requeued:released") == b"1" and b"requeued:unresponsive" not in stats
    assert "Traceback" not in leaving.log()

    workers(redis_server.url, namespace, env=AGENT, args=["--name", staying_name])
    [rollout] = producer.wait([rid], timeout=60)
    assert (rollout.metadata["status"], rollout.metadata["attempt"], rollout.metadata["worker"]) == (
        "succeeded",
        2,
        staying_name,
    )
    assert_exactly_once(producer.connection, namespace, [rid])


def test_redis_restart_under_load_loses_and_doubles_nothing(own_redis, namespace, workers):
    server = own_redis(appendonly=True)
    env = {**AGENT, "ROLLQ_CONCURRENCY": "8", "ROLLQ_HEARTBEAT_SECONDS": "1"}
    pool = [workers(server.url, namespace, env=env) for _ in range(2)]
    # A job whose dequeue reply the restart swallowed is put back after unresponsive_seconds; keep that short.
    producer = Producer.from_url(server.url, namespace, policy=RolloutPolicy(unresponsive_seconds=10))
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.05}] * 300)]
    results_key = Keys(namespace).results
    wait_until(lambda: server.client().xlen(results_key) >= 30, "the first rollouts", timeout=60)

    server.restart(down_seconds=1.5)

    rollouts = producer.wait(ids, timeout=120)
    assert {r.metadata["status"] for r in rollouts} == {"succeeded"}
    assert_exactly_once(producer.connection, namespace, ids)
    assert [w.process.poll() for w in pool] == [None, None]


def test_agent_past_its_timeout_is_retried_then_dead_lettered_and_can_be_requeued(redis_server, namespace, workers):
    policy = RolloutPolicy(timeout_seconds=1, max_attempts=2, retry_on=frozenset({"timeout"}))
    producer = Producer.from_url(redis_server.url, namespace, policy=policy)
    workers(redis_server.url, namespace, env=AGENT)
    rid = producer.enqueue({"sleep": 30}).rollout_id

    [rollout] = producer.wait([rid], timeout=60)
    assert rollout.metadata["status"] == "failed"
    assert rollout.metadata["error"]["type"] == "AgentTimeoutError"
    assert rollout.metadata["attempt"] == 2
    assert producer.dead_letter() == [rid]
    assert producer.connection.hget(producer.keys.stats, "requeued:retry") == b"1"
    assert_exactly_once(producer.connection, namespace, [rid])

    assert producer.requeue_dead([rid]) == [rid]
    assert producer.dead_letter() == []
    # A revived task gets a fresh budget of two attempts, and its new outcome is published once more.
    wait_until(lambda: producer.dead_letter() == [rid], "the revived task to fail again", timeout=30)
    again = published(producer.connection, namespace)[rid]
    assert (again.metadata["error"]["type"], again.metadata["attempt"]) == ("AgentTimeoutError", 4)
    assert producer.connection.xlen(producer.keys.results) == 2


def test_job_stranded_between_dequeue_and_start_is_put_back_on_the_queue(redis_server, namespace, workers):
    # What a worker leaves behind when Redis goes down between its BLMOVE and the reply.
    producer = Producer.from_url(redis_server.url, namespace, policy=RolloutPolicy(unresponsive_seconds=2))
    rid = producer.enqueue({"sleep": 0}).rollout_id
    keys = producer.keys
    assert producer.connection.lmove(keys.rq_queue, keys.rq_intermediate, "LEFT", "RIGHT") == keys.job_id(rid).encode()
    workers(redis_server.url, namespace, env={**AGENT, "ROLLQ_HEARTBEAT_SECONDS": "0.5"})

    [rollout] = producer.wait([rid], timeout=2 + 20)
    assert (rollout.metadata["status"], rollout.metadata["attempt"]) == ("succeeded", 1)
    assert producer.connection.llen(keys.rq_intermediate) == 0
    assert producer.connection.hget(keys.stats, "requeued:stranded") == b"1"
    assert_exactly_once(producer.connection, namespace, [rid])
