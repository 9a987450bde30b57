"""Packs (issue 24): several tasks per RQ job (``tasks_per_job`` > 1), on a real redis-server and real
``rq worker -w rollq.worker.RolloutWorker`` processes.

Each task of a pack keeps its own record, attempts and outcome; these tests count tasks in and rollouts out on
every path a pack can be cut short on (SIGKILL at each step of the start path and mid-pack, SIGTERM), and check
a retry and a cancel inside a pack, and what RQ (``rq info``, rq-dashboard) counts: one job per pack.
"""

from __future__ import annotations

import asyncio
import math
import signal
import subprocess
import sys

import pytest
from rq.job import Job
from rq.queue import Queue
from rq.registry import FailedJobRegistry, FinishedJobRegistry
from rq.serializers import JSONSerializer

from rollq.models.policy import RolloutPolicy, TaskState
from rollq.producer.aio import AsyncProducer
from rollq.producer.producer import Producer
from rollq.store.jobs import read_rollq_jobs, rollout_ids_of
from rollq.store.keys import TaskField
from rollq.store.records import read_record
from tests.support.fault_agents import assert_exactly_once
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis

AGENT = {"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent", "ROLLQ_HEARTBEAT_SECONDS": "0.5"}
HOSTILE = {"ROLLQ_AGENT": "tests.support.hostile_agents:HostileAgent", "ROLLQ_HEARTBEAT_SECONDS": "0.5"}
QUICK = RolloutPolicy(unresponsive_seconds=2, timeout_seconds=30)


def packs(k: int, concurrency: int, base: dict[str, str] = AGENT) -> dict[str, str]:
    return {**base, "ROLLQ_TASKS_PER_JOB": str(k), "ROLLQ_CONCURRENCY": str(concurrency)}


def job_of(producer: Producer, rollout_id: str) -> str:
    return producer.connection.hget(producer.keys.task(rollout_id), TaskField.JOB).decode()  # type: ignore[union-attr]


def states(producer: Producer, ids: list[str]) -> list[str]:
    return [read_record(producer.connection, producer.keys, rid).state.value for rid in ids]


# -- the producer side --------------------------------------------------------------------------------------------


def test_n_tasks_in_packs_of_k_make_ceil_n_over_k_plain_rq_jobs_each_listing_its_tasks(redis_server, namespace):
    producer = Producer.from_url(redis_server.url, namespace)
    ids = [t.rollout_id for t in producer.enqueue_many([{"n": i} for i in range(10)], tasks_per_job=4)]

    queued = [j.decode() for j in producer.connection.lrange(producer.keys.rq_queue, 0, -1)]
    assert len(queued) == math.ceil(10 / 4) == len(set(queued))
    jobs = read_rollq_jobs(producer.connection, queued)
    listed = [rollout_ids_of(jobs[jid]) for jid in queued]  # type: ignore[arg-type]
    assert [len(x) for x in listed] == [4, 4, 2]
    assert [rid for pack in listed for rid in pack] == ids
    # Each task's record names its pack's job: the claim's "only the job that stands for a task" check.
    assert [job_of(producer, rid) for rid in ids] == [
        jid for jid, pack in zip(queued, listed, strict=True) for _ in pack
    ]
    # A plain RQ job, as RQ reads it (rq-dashboard, `rq info`).
    job = Job.fetch(queued[0], connection=producer.connection, serializer=JSONSerializer)
    assert (job.get_status(), job.func_name, job.args) == ("queued", "rollq.worker.jobs.run_rollout", listed[0])
    assert Queue(namespace, connection=producer.connection, serializer=JSONSerializer).count == 3


def test_the_default_is_one_job_per_task_and_the_setting_comes_from_the_environment(
    redis_server, namespace, monkeypatch
):
    producer = Producer.from_url(redis_server.url, namespace)
    rid = producer.enqueue({"n": 1}).rollout_id
    assert job_of(producer, rid) == producer.keys.job_id(rid)
    monkeypatch.setenv("ROLLQ_TASKS_PER_JOB", "3")
    packed = Producer.from_url(redis_server.url, namespace)
    ids = [t.rollout_id for t in packed.enqueue_many([{"n": i} for i in range(3)])]
    assert len({job_of(packed, r) for r in ids}) == 1
    with pytest.raises(ValueError, match="tasks_per_job"):
        packed.enqueue_many([{}], tasks_per_job=0)


def test_a_grpo_group_is_one_pack_when_tasks_per_job_is_the_group_size(redis_server, namespace):
    producer = Producer.from_url(redis_server.url, namespace)
    tasks = producer.enqueue_many([{"q": 1}, {"q": 2}, {"q": 3}], group_size=4, tasks_per_job=4)
    by_job: dict[str, set[str]] = {}
    for t in tasks:
        by_job.setdefault(job_of(producer, t.rollout_id), set()).add(t.metadata["group_id"])
    assert len(by_job) == 3 and all(len(groups) == 1 for groups in by_job.values())


def test_known_rollout_ids_in_a_pack_are_not_queued_again_and_the_others_are(redis_server, namespace):
    producer = Producer.from_url(redis_server.url, namespace)
    producer.enqueue({"n": 0}, rollout_id="known")
    producer.enqueue_many([{"n": i} for i in range(3)], rollout_ids=["known", "new-1", "new-2"], tasks_per_job=3)
    assert job_of(producer, "known") == producer.keys.job_id("known")
    assert job_of(producer, "new-1") == job_of(producer, "new-2") != producer.keys.job_id("new-1")
    assert producer.connection.llen(producer.keys.rq_queue) == 2


# -- the worker side ----------------------------------------------------------------------------------------------


def test_a_pack_runs_every_task_once_and_rq_counts_one_finished_job(redis_server, namespace, workers):
    producer = Producer.from_url(redis_server.url, namespace, policy=QUICK, tasks_per_job=4)
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.1}] * 8)]
    name = f"{namespace}-w"
    worker = workers(redis_server.url, namespace, env=packs(4, 8), args=["--name", name])
    rollouts = producer.wait(ids, timeout=30)
    assert {r.metadata["status"] for r in rollouts} == {"succeeded"}
    assert_exactly_once(producer.connection, namespace, ids)

    pack_ids = sorted({job_of(producer, rid) for rid in ids})
    finished = FinishedJobRegistry(namespace, connection=producer.connection, serializer=JSONSerializer)
    wait_until(lambda: sorted(finished.get_job_ids()) == pack_ids, "both packs in RQ's finished registry")
    job = Job.fetch(pack_ids[0], connection=producer.connection, serializer=JSONSerializer)
    assert job.get_status() == "finished"
    assert [r["status"] for r in job.return_value()] == ["succeeded"] * 4
    assert "4 succeeded" in job.description
    # `rq info` counts jobs: two packs, not eight tasks.
    wait_until(
        lambda: producer.connection.hget(f"rq:worker:{name}", "successful_job_count") == b"2",
        "RQ's worker hash to count two jobs",
    )
    info = subprocess.run(
        [sys.executable, "-m", "rq.cli", "info", "--url", redis_server.url, namespace],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert info.returncode == 0, info.stderr
    assert worker.process.poll() is None


def test_a_pack_with_a_failed_task_is_a_failed_rq_job_naming_it_and_the_others_publish(
    redis_server, namespace, workers
):
    producer = Producer.from_url(redis_server.url, namespace, policy=RolloutPolicy(max_attempts=1), tasks_per_job=3)
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.1}, {"raise": "boom"}, {"sleep": 0.1}])]
    worker = workers(redis_server.url, namespace, env=packs(3, 4))
    rollouts = {r.rollout_id: r for r in producer.wait(ids, timeout=30)}
    assert [rollouts[rid].metadata["status"] for rid in ids] == ["succeeded", "failed", "succeeded"]
    pack = job_of(producer, ids[0])
    failed = FailedJobRegistry(namespace, connection=producer.connection, serializer=JSONSerializer)
    wait_until(lambda: failed.get_job_ids() == [pack], "the pack in RQ's failed registry")
    job = Job.fetch(pack, connection=producer.connection, serializer=JSONSerializer)
    exc_string = job.latest_result().exc_string
    assert "1 of 3 tasks of the pack failed" in exc_string and ids[1] in exc_string
    assert list(job.meta["rollouts"]) == [ids[1]]
    # The agent's traceback is logged once (an operator's audit: the pack's "job ... failed" line repeated it).
    log = wait_until(lambda: f"job {pack} failed" in (text := worker.log()) and text, "the pack's end in the log")
    assert log.count("Traceback (most recent call last)") == 1, log
    assert (
        f"job {pack} failed: 1 of 3 tasks of the pack failed\nrollout {ids[1]} attempt 1 failed: RuntimeError: boom"
        in log
    )


@pytest.mark.parametrize("step", ["dequeued", "claimed", "rq-started", "agent-started"])
def test_a_worker_killed_at_any_step_of_a_packs_start_path_loses_no_task(redis_server, namespace, workers, step):
    producer = Producer.from_url(redis_server.url, namespace, policy=QUICK, tasks_per_job=4)
    victim = workers(redis_server.url, namespace, env={**packs(4, 4, HOSTILE), "ROLLQ_CRASH_AT": step})
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.1}] * 4)]
    assert victim.wait(30) == 86, f"the worker did not crash at {step!r}"

    workers(redis_server.url, namespace, env=packs(4, 4, HOSTILE))
    rollouts = producer.wait(ids, timeout=2 + 2 + 20)
    assert {r.metadata["status"] for r in rollouts} == {"succeeded"}
    assert_exactly_once(producer.connection, namespace, ids)


def test_a_worker_sigkilled_mid_pack_loses_no_task_and_reruns_only_unfinished_ones(redis_server, namespace, workers):
    producer = Producer.from_url(redis_server.url, namespace, policy=QUICK, tasks_per_job=4)
    quick = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.05}] * 4)]
    slow = [
        t.rollout_id
        for t in producer.enqueue_many([{"sleep": 0.05}, {"sleep_first": 60}, {"sleep": 0.05}, {"sleep_first": 60}])
    ]
    victim = workers(redis_server.url, namespace, env=packs(4, 8))
    wait_until(
        lambda: states(producer, quick + slow).count("succeeded") == 6,
        "all but the two long tasks to finish",
        timeout=30,
    )
    assert states(producer, [slow[1], slow[3]]) == ["running", "running"]
    victim.signal(signal.SIGKILL)
    assert victim.wait(30) == -signal.SIGKILL
    workers(redis_server.url, namespace, env=packs(4, 8))  # the long ones are quick on their second attempt
    rollouts = {r.rollout_id: r for r in producer.wait(quick + slow, timeout=2 + 20)}
    assert {r.metadata["status"] for r in rollouts.values()} == {"succeeded"}
    assert_exactly_once(producer.connection, namespace, quick + slow)
    # None ran twice: each task that had finished kept its one attempt; each cut short ran again once.
    attempts = {rid: len(producer.attempts(rid)) for rid in quick + slow}
    assert attempts == {rid: 2 if rid in (slow[1], slow[3]) else 1 for rid in quick + slow}
    # Its retries were jobs of their own.
    assert job_of(producer, slow[1]) == producer.keys.job_id(slow[1], after_attempt=1)


def test_sigterm_hands_back_every_unfinished_task_of_a_pack_and_the_unstarted_pack(redis_server, namespace, workers):
    producer = Producer.from_url(redis_server.url, namespace, policy=QUICK, tasks_per_job=4)
    running = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.05}] + [{"sleep_first": 60}] * 3)]
    waiting = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.05}] * 4)]
    victim = workers(redis_server.url, namespace, env={**packs(4, 4), "ROLLQ_GRACE_SECONDS": "0"})
    wait_until(lambda: states(producer, running) == ["succeeded"] + ["running"] * 3, "the first pack to run")
    victim.signal(signal.SIGTERM)
    assert victim.wait(30) == 0
    assert states(producer, running[1:] + waiting) == ["queued"] * 7
    assert [len(producer.attempts(rid)) for rid in running] == [1, 1, 1, 1]
    assert {producer.attempts(rid)[0].outcome for rid in running[1:]} == {"released"}
    assert all(len(producer.attempts(rid)) == 0 for rid in waiting)
    # Each handed-back task is a job of its own, ahead of the pack that never started.
    queued = [j.decode() for j in producer.connection.lrange(producer.keys.rq_queue, 0, -1)]
    assert sorted(queued) == sorted([job_of(producer, rid) for rid in running[1:]] + [job_of(producer, waiting[0])])
    assert producer.connection.llen(producer.keys.rq_intermediate) == 0

    workers(redis_server.url, namespace, env=packs(4, 4))
    producer.wait(running + waiting, timeout=30)
    assert_exactly_once(producer.connection, namespace, running + waiting)


def test_a_retry_inside_a_pack_goes_back_as_a_job_of_its_own(redis_server, namespace, workers):
    policy = RolloutPolicy(max_attempts=2, retry_on=frozenset({"exception"}), unresponsive_seconds=2)
    producer = Producer.from_url(redis_server.url, namespace, policy=policy, tasks_per_job=3)
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.05}, {"raise": "boom"}, {"sleep": 0.05}])]
    pack = job_of(producer, ids[0])
    workers(redis_server.url, namespace, env=packs(3, 4))
    rollouts = {r.rollout_id: r for r in producer.wait(ids, timeout=30)}
    assert [rollouts[rid].metadata["status"] for rid in ids] == ["succeeded", "failed", "succeeded"]
    assert [len(producer.attempts(rid)) for rid in ids] == [1, 2, 1]
    assert job_of(producer, ids[1]) == producer.keys.job_id(ids[1], after_attempt=1)
    assert_exactly_once(producer.connection, namespace, ids)
    # The pack itself ended with no failed task (the failing one was retried, elsewhere): finished in RQ.
    wait_until(
        lambda: Job.fetch(pack, connection=producer.connection, serializer=JSONSerializer).get_status() == "finished",
        "the pack to be finished in RQ",
    )


def test_cancels_inside_a_pack_end_those_tasks_and_the_others_run(redis_server, namespace, workers):
    producer = Producer.from_url(redis_server.url, namespace, policy=QUICK, tasks_per_job=4)
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.05}, {"sleep": 60}, {"sleep": 0.05}, {"sleep": 1}])]
    producer.cancel([ids[0]])  # while queued: its claim is refused, the pack's others run
    workers(redis_server.url, namespace, env=packs(4, 4))
    wait_until(lambda: states(producer, ids[1:]) == ["running", "succeeded", "succeeded"], "the pack to run")
    producer.cancel([ids[1]])  # while running
    rollouts = {r.rollout_id: r for r in producer.wait(ids, timeout=30)}
    assert [rollouts[rid].metadata["status"] for rid in ids] == ["cancelled", "cancelled", "succeeded", "succeeded"]
    assert_exactly_once(producer.connection, namespace, ids)
    pack = job_of(producer, ids[2])
    wait_until(
        lambda: Job.fetch(pack, connection=producer.connection, serializer=JSONSerializer).get_status() == "finished",
        "the pack to end in RQ once its cancelled task's agent stopped",
        timeout=30,
    )
    assert TaskState(states(producer, [ids[1]])[0]) == TaskState.CANCELLED


def test_a_worker_with_smaller_packs_than_the_producer_gives_back_jobs_taken_ahead_instead_of_deadlocking(
    redis_server, namespace, workers
):
    # The worker takes 1 slot per job (its tasks_per_job 1): it dequeues the pack with one slot and takes the three
    # single tasks behind it ahead, holding every other slot. The pack needs four: waiting for slots that only the
    # jobs taken ahead hold would wait forever; those go back to the queue instead.
    producer = Producer.from_url(redis_server.url, namespace, policy=QUICK)
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.05}] * 4, tasks_per_job=4)]
    ids += [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.05}] * 6)]
    worker = workers(redis_server.url, namespace, env=packs(1, 4), args=["--burst"])
    assert worker.wait(60) == 0
    assert states(producer, ids) == ["succeeded"] * 10
    assert_exactly_once(producer.connection, namespace, ids)


@pytest.mark.slow
def test_a_pack_larger_than_the_slots_a_worker_held_goes_back_to_the_queue_instead_of_stranding(
    redis_server, namespace, workers
):
    # The worker takes 1 slot per job (its tasks_per_job 1, concurrency 2): it starts a long single task and takes
    # the pack of 2 behind it ahead with one slot. The pack needs both: waiting for the long task's slot with the
    # pack off the queue left it in RQ's intermediate list past the stranded-job grace (unresponsive_seconds, 2 s
    # here), so a reaper pushed it back while this worker was about to start it, and RQ recorded the job twice.
    # The pack goes back to the queue at once instead, and the worker takes two slots before its next dequeue.
    producer = Producer.from_url(redis_server.url, namespace, policy=QUICK)
    ids = [producer.enqueue({"sleep": 6}).rollout_id]
    ids += [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.05}] * 2, tasks_per_job=2)]
    worker = workers(redis_server.url, namespace, env=packs(1, 2), args=["--burst"])
    assert worker.wait(60) == 0
    assert states(producer, ids) == ["succeeded"] * 3
    assert_exactly_once(producer.connection, namespace, ids)
    assert producer.connection.hget(producer.keys.stats, "requeued:stranded") is None
    pack = job_of(producer, ids[1])
    finished = FinishedJobRegistry(namespace, connection=producer.connection, serializer=JSONSerializer)
    assert pack in finished.get_job_ids()
    assert Job.fetch(pack, connection=producer.connection, serializer=JSONSerializer).get_status() == "finished"
    assert producer.connection.llen(producer.keys.rq_queue) == 0
    assert producer.connection.llen(producer.keys.rq_intermediate) == 0


def test_a_rollout_id_given_twice_in_one_packed_call_is_queued_and_run_once(redis_server, namespace, workers):
    producer = Producer.from_url(redis_server.url, namespace, policy=QUICK, tasks_per_job=4)
    tasks = producer.enqueue_many([{"sleep": 0.05}] * 4, rollout_ids=["a", "b", "a", "c"])
    assert [t.rollout_id for t in tasks] == ["a", "b", "a", "c"]
    assert job_of(producer, "a") == job_of(producer, "c")  # one pack, listing "a" once
    workers(redis_server.url, namespace, env=packs(4, 4))
    producer.wait(["a", "b", "c"], timeout=30)
    assert_exactly_once(producer.connection, namespace, ["a", "b", "c"])
    assert producer.connection.llen(producer.keys.quarantine) == 0
    assert FailedJobRegistry(namespace, connection=producer.connection, serializer=JSONSerializer).count == 0
    assert [len(producer.attempts(rid)) for rid in "abc"] == [1, 1, 1]


def test_back_pressure_counts_the_tasks_of_queued_packs_not_the_jobs(redis_server, namespace):
    producer = Producer.from_url(redis_server.url, namespace, tasks_per_job=8)
    producer.enqueue_many([{}] * 16)
    assert producer.pending() == 16


def test_the_async_producer_queues_packs_too(redis_server, namespace):
    async def main() -> list[str]:
        async with AsyncProducer.from_url(redis_server.url, namespace) as producer:
            tasks = await producer.enqueue_many([{"n": i} for i in range(6)], tasks_per_job=3)
            return [t.rollout_id for t in tasks]

    ids = asyncio.run(main())
    producer = Producer.from_url(redis_server.url, namespace)
    assert producer.connection.llen(producer.keys.rq_queue) == 2
    assert len({job_of(producer, rid) for rid in ids}) == 2
