"""Issue 11, "None lost, really": each defect a hostile tester found, reproduced on a real redis-server and
real ``rq worker -w rollq.worker.RolloutWorker`` processes.

Every test counts tasks in and rollouts out and fails if one was lost, delivered twice, or ended for the
wrong reason.
"""

from __future__ import annotations

import hashlib
import json
import re
import signal
import time
import zlib

import pytest
from rq.job import Job
from rq.queue import Queue
from rq.serializers import JSONSerializer

from rollq.models.policy import RolloutPolicy
from rollq.producer.producer import Producer
from rollq.store.keys import Keys, TaskField
from rollq.store.records import read_record
from rollq.store.transitions import Lifecycle
from tests.support.fault_agents import assert_exactly_once
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis

ASYNC = {"ROLLQ_AGENT": "tests.support.hostile_agents:HostileAgent", "ROLLQ_HEARTBEAT_SECONDS": "0.5"}
SYNC = {"ROLLQ_AGENT": "tests.support.hostile_agents:HostileSyncAgent", "ROLLQ_HEARTBEAT_SECONDS": "0.5"}
QUICK = RolloutPolicy(unresponsive_seconds=2, timeout_seconds=30)


def error_of(rollout) -> tuple[str, str]:
    error = rollout.metadata.get("error", {})
    return error.get("type", ""), error.get("message", "")


# -- 1. a worker dying anywhere on the start path --------------------------------------------------------------


@pytest.mark.parametrize("step", ["dequeued", "claimed", "rq-started", "agent-started"])
def test_a_worker_killed_at_any_step_of_the_start_path_loses_no_task(redis_server, namespace, workers, step):
    producer = Producer.from_url(redis_server.url, namespace, policy=QUICK)
    victim = workers(redis_server.url, namespace, env={**ASYNC, "ROLLQ_CRASH_AT": step})
    rid = producer.enqueue({"sleep": 0.1}).rollout_id
    assert victim.wait(30) == 86, f"the worker did not crash at {step!r}"

    workers(redis_server.url, namespace, env=ASYNC)
    # unresponsive_seconds (2) + the stranded-job grace (at most unresponsive_seconds) + a few seconds.
    [rollout] = producer.wait([rid], timeout=2 + 2 + 10)
    assert rollout.metadata["status"] == "succeeded"
    assert_exactly_once(producer.connection, namespace, [rid])


# -- 2. BaseExceptions from agents and hooks -------------------------------------------------------------------


@pytest.mark.parametrize("env", [ASYNC, SYNC], ids=["async", "sync"])
def test_an_agent_raising_a_base_exception_fails_its_rollout_and_the_worker_runs_later_ones(
    redis_server, namespace, workers, env
):
    producer = Producer.from_url(redis_server.url, namespace, policy=QUICK)
    worker = workers(redis_server.url, namespace, env={**env, "ROLLQ_CONCURRENCY": "2"})
    kinds = {"exit": "SystemExit", "interrupt": "KeyboardInterrupt", "generator_exit": "GeneratorExit"}
    # Twice each: more than the worker's bookkeeping threads (min(concurrency, 8) = 2).
    bad = {
        producer.enqueue({key: f"{key} from the agent"}).rollout_id: name for key, name in kinds.items() for _ in (1, 2)
    }
    good = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.05}] * 4)]

    rollouts = {r.rollout_id: r for r in producer.wait([*bad, *good], timeout=20)}
    for rid, name in bad.items():
        assert rollouts[rid].metadata["status"] == "failed"
        assert name in " ".join(error_of(rollouts[rid])), error_of(rollouts[rid])
    assert all(rollouts[rid].metadata["status"] == "succeeded" for rid in good)
    assert worker.process.poll() is None
    assert all(name in worker.log() for name in kinds.values())


# One attempt, and no reaper before the test gives up: a rollout that is not published at once is lost to the test.
ONCE = RolloutPolicy(unresponsive_seconds=60, timeout_seconds=30, max_attempts=1)


@pytest.mark.parametrize("env", [ASYNC, SYNC], ids=["async", "sync"])
def test_an_agent_error_whose_message_cannot_be_read_fails_its_rollout_at_once_naming_its_type(
    redis_server, namespace, workers, env
):
    # str() and repr() of the exception raise: building the failed rollout raised in its turn, nothing was
    # published, and only the reaper failed the task (WorkerUnresponsiveError) unresponsive_seconds later.
    producer = Producer.from_url(redis_server.url, namespace, policy=ONCE)
    worker = workers(redis_server.url, namespace, env=env)
    bad = producer.enqueue({"unprintable": True}).rollout_id
    good = producer.enqueue({"sleep": 0.05}).rollout_id

    rollouts = {r.rollout_id: r for r in producer.wait([bad, good], timeout=20)}
    kind, message = error_of(rollouts[bad])
    assert (rollouts[bad].metadata["status"], kind) == ("failed", "Unprintable")
    assert "could not be read" in message and "ValueError" in message, message
    assert rollouts[good].metadata["status"] == "succeeded"
    assert worker.process.poll() is None
    assert "Unprintable" in worker.log()


@pytest.mark.parametrize("env", [ASYNC, SYNC], ids=["async", "sync"])
def test_an_agent_raising_cancelled_error_of_its_own_fails_its_rollout_at_once_naming_it(
    redis_server, namespace, workers, env
):
    # Not rollq's cancel or time limit (those settle the attempt before they cancel the agent): the agent's own
    # CancelledError, a BaseException, went past the runner and left the task unpublished until a reaper came.
    producer = Producer.from_url(redis_server.url, namespace, policy=ONCE)
    worker = workers(redis_server.url, namespace, env=env)
    bad = producer.enqueue({"cancelled": "cancelled by the agent"}).rollout_id
    good = producer.enqueue({"sleep": 0.05}).rollout_id

    rollouts = {r.rollout_id: r for r in producer.wait([bad, good], timeout=20)}
    kind, message = error_of(rollouts[bad])
    assert (rollouts[bad].metadata["status"], kind) == ("failed", "AgentExitError")
    assert "CancelledError" in message and "cancelled by the agent" in message, message
    assert rollouts[good].metadata["status"] == "succeeded"
    assert worker.process.poll() is None
    assert "handed" not in worker.log() and "timed out" not in worker.log()


def test_a_result_whose_reading_raises_fails_its_rollout_at_once_naming_the_fault(redis_server, namespace, workers):
    # Whatever raises while a settled attempt is turned into its rollout (here len() of the agent's list), the
    # attempt is published failed saying so, not left for a reaper to fail as an unresponsive worker's.
    producer = Producer.from_url(redis_server.url, namespace, policy=ONCE)
    worker = workers(redis_server.url, namespace, env=SYNC)
    bad = producer.enqueue({"unmeasurable": True}).rollout_id
    good = producer.enqueue({"sleep": 0.05}).rollout_id

    rollouts = {r.rollout_id: r for r in producer.wait([bad, good], timeout=20)}
    kind, message = error_of(rollouts[bad])
    assert (rollouts[bad].metadata["status"], kind) == ("failed", "RolloutBuildError")
    assert "len() of this result fails" in message and "the agent returned" in message, message
    assert rollouts[good].metadata["status"] == "succeeded"
    assert worker.process.poll() is None


def test_an_async_agent_stopping_the_event_loop_fails_its_rollout_and_the_worker_runs_the_others(
    redis_server, namespace, workers
):
    # loop.stop() from an agent ended the loop's thread: the rollout that did it was published as succeeded, the
    # others on the loop never ended, and the watchdog made the worker exit with status 3.
    producer = Producer.from_url(redis_server.url, namespace, policy=ONCE)
    worker = workers(redis_server.url, namespace, env={**ASYNC, "ROLLQ_CONCURRENCY": "4"})
    neighbours = [t.rollout_id for t in producer.enqueue_many([{"sleep": 1.5}] * 2)]
    stopper = producer.enqueue({"stop_loop": True}).rollout_id
    scheduler = producer.enqueue({"stop_loop": "callback"}).rollout_id  # loop.call_soon(loop.stop)

    rollouts = {r.rollout_id: r for r in producer.wait([stopper, scheduler, *neighbours], timeout=20)}
    for rid in (stopper, scheduler):
        kind, message = error_of(rollouts[rid])
        assert (rollouts[rid].metadata["status"], kind) == ("failed", "AgentExitError")
        assert "stop()" in message and "event loop" in message, message
    assert [rollouts[rid].metadata["status"] for rid in neighbours] == ["succeeded"] * 2
    [later] = producer.wait([producer.enqueue({"sleep": 0.05}).rollout_id], timeout=20)
    assert later.metadata["status"] == "succeeded"
    assert worker.process.poll() is None
    assert "is blocked" not in worker.log()


def test_hooks_raising_system_exit_are_logged_and_the_worker_keeps_its_threads(redis_server, namespace, workers):
    producer = Producer.from_url(redis_server.url, namespace, policy=QUICK)
    env = {**ASYNC, "ROLLQ_CONCURRENCY": "2", "ROLLQ_HOOKS": "tests.support.hostile_agents:ExitingHook"}
    worker = workers(redis_server.url, namespace, env=env)
    hooked = [t.rollout_id for t in producer.enqueue_many([{"hook_exit": True}] * 4)]
    plain = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.05}] * 4)]

    rollouts = producer.wait(hooked + plain, timeout=20)
    assert [r.metadata["status"] for r in rollouts] == ["succeeded"] * 8  # a hook's failure is logged, not fatal
    assert worker.process.poll() is None
    assert "SystemExit" in worker.log() and "KeyboardInterrupt" in worker.log()


# -- 3. an agent that blocks the event loop --------------------------------------------------------------------


@pytest.mark.slow
def test_a_watchdog_fails_an_attempt_that_blocks_the_event_loop_past_its_limit(redis_server, namespace, workers):
    producer = Producer.from_url(redis_server.url, namespace)
    worker = workers(redis_server.url, namespace, env={**ASYNC, "ROLLQ_CONCURRENCY": "4"})
    producer.wait([producer.enqueue({}).rollout_id], timeout=30)  # the worker is up
    strict = RolloutPolicy(timeout_seconds=2, unresponsive_seconds=30, max_attempts=1)
    began = time.monotonic()
    blocker = producer.enqueue({"block": 12}, policy=strict).rollout_id
    neighbours = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.5}] * 3)]

    [failed] = producer.wait([blocker], timeout=20)
    assert time.monotonic() - began < 10, "the time limit held only once the loop came back (after 12 s)"
    assert (failed.metadata["status"], error_of(failed)[0]) == ("failed", "AgentTimeoutError")
    wait_until(lambda: blocker in worker.log() and "blocked" in worker.log(), "a warning naming the blocker", timeout=5)
    rollouts = producer.wait(neighbours, timeout=30)
    assert [r.metadata["status"] for r in rollouts] == ["succeeded"] * 3
    assert worker.process.poll() is None


def test_a_worker_stopped_and_continued_says_it_was_paused_and_blames_no_agent(redis_server, namespace, workers):
    # An operator's audit: a worker thawed from SIGSTOP logged "the agent event loop is blocked ... by rollout ...: an
    # async agent made a blocking call", blaming an agent for the seconds the whole process was stopped.
    producer = Producer.from_url(redis_server.url, namespace, policy=RolloutPolicy(timeout_seconds=60))
    worker = workers(redis_server.url, namespace, env={**ASYNC, "ROLLQ_CONCURRENCY": "4"})
    producer.wait([producer.enqueue({}).rollout_id], timeout=30)  # the worker is up
    running = [t.rollout_id for t in producer.enqueue_many([{"sleep": 4}] * 2)]
    wait_until(
        lambda: all(read_record(producer.connection, producer.keys, rid).state == "running" for rid in running),
        "both rollouts to run",
        timeout=20,
    )
    for _ in range(3):  # three pauses: the agents' loop or the watchdog may be the first to run after each
        worker.signal(signal.SIGSTOP)
        time.sleep(2.5)
        worker.signal(signal.SIGCONT)
        time.sleep(0.5)

    rollouts = producer.wait(running, timeout=30)
    assert [r.metadata["status"] for r in rollouts] == ["succeeded"] * 2
    assert "blocking call" not in worker.log() and "is blocked" not in worker.log(), worker.log()[-3000:]
    log = worker.log()
    paused = [float(m.group(1)) for m in re.finditer(r"was paused for ([0-9.]+)s", log)]
    assert len([seconds for seconds in paused if 2.0 <= seconds < 4]) == 3, paused  # a starved machine may add some
    assert worker.process.poll() is None


def test_a_loop_blocked_past_every_limit_hands_rollouts_back_and_exits_non_zero(redis_server, namespace, workers):
    producer = Producer.from_url(redis_server.url, namespace, policy=QUICK)
    wedged = workers(redis_server.url, namespace, env={**ASYNC, "ROLLQ_CONCURRENCY": "4"})
    warm_up = producer.enqueue({}).rollout_id
    producer.wait([warm_up], timeout=30)
    strict = RolloutPolicy(timeout_seconds=2, unresponsive_seconds=30, max_attempts=1)
    blocker = producer.enqueue({"block": 3600}, policy=strict).rollout_id
    wait_until(lambda: "is blocked" in wedged.log(), "the watchdog to see the loop blocked", timeout=10)
    # Claimed on the blocked loop after it stopped, these can never start there: they go back to the queue.
    later = [
        t.rollout_id for t in producer.enqueue_many([{"sleep": 0.1}] * 2, policy=RolloutPolicy(timeout_seconds=60))
    ]

    code = wedged.wait(30)
    assert code not in (0, None)
    assert "handing" in wedged.log()
    workers(redis_server.url, namespace, env=ASYNC)
    rollouts = {r.rollout_id: r for r in producer.wait([blocker, *later], timeout=30)}
    assert error_of(rollouts[blocker])[0] == "AgentTimeoutError"
    assert [rollouts[rid].metadata["status"] for rid in later] == ["succeeded"] * 2
    assert_exactly_once(producer.connection, namespace, [warm_up, blocker, *later])


@pytest.mark.slow
def test_heartbeats_stop_vouching_for_attempts_on_a_stalled_loop(redis_server, namespace, workers):
    producer = Producer.from_url(redis_server.url, namespace)
    workers(redis_server.url, namespace, env={**ASYNC, "ROLLQ_CONCURRENCY": "4"})
    producer.wait([producer.enqueue({}).rollout_id], timeout=30)
    # A long time limit, so only the missing heartbeats can end these attempts.
    silent = RolloutPolicy(timeout_seconds=600, unresponsive_seconds=3, max_attempts=1)
    blocker = producer.enqueue({"block": 12}, policy=silent).rollout_id
    [rollout] = producer.wait([blocker], timeout=20)
    assert error_of(rollout)[0] == "WorkerUnresponsiveError"


# -- 4. corrupt and newer-format records -----------------------------------------------------------------------


@pytest.mark.parametrize("field", [TaskField.UNRESPONSIVE, TaskField.ATTEMPTS, TaskField.CLAIMS, TaskField.STATE])
def test_a_task_record_with_a_bad_number_or_state_fails_naming_invalid_task_error(
    redis_server, namespace, workers, field
):
    # A state rollq never writes was skipped as "stale" by every worker (an outside audit): nothing was published
    # and wait() ran into its timeout.
    producer = Producer.from_url(redis_server.url, namespace, policy=QUICK)
    bad, good = (t.rollout_id for t in producer.enqueue_many([{}, {}]))
    producer.connection.hset(producer.keys.task(bad), field.value, "not-a-number")
    workers(redis_server.url, namespace, env=ASYNC)

    rollouts = {r.rollout_id: r for r in producer.wait([bad, good], timeout=20)}
    assert (rollouts[bad].metadata["status"], error_of(rollouts[bad])[0]) == ("failed", "InvalidTaskError")
    assert field.value in error_of(rollouts[bad])[1]
    assert rollouts[good].metadata["status"] == "succeeded"
    assert producer.connection.zcard(producer.keys.inflight) == 0


def test_one_unparseable_record_never_stops_reaping_or_waiting_for_the_others(redis_server, namespace):
    producer = Producer.from_url(
        redis_server.url, namespace, policy=RolloutPolicy(unresponsive_seconds=1, max_attempts=1)
    )
    lifecycle = Lifecycle(producer.connection, producer.keys)
    bad, good = (t.rollout_id for t in producer.enqueue_many([{}, {}]))
    for rid in (bad, good):
        lifecycle.claim(rid, producer.keys.job_id(rid), "gone-worker")
    producer.connection.hset(producer.keys.task(bad), TaskField.TASK.value, "{not json")
    producer.connection.hset(producer.keys.task(bad), TaskField.POLICY.value, '{"max_attempts": "many"}')
    time.sleep(3)  # both attempts are now past their deadline

    report = producer.reap()
    assert report.failed == 2
    rollouts = {r.rollout_id: r for r in producer.wait([bad, good], timeout=5)}
    assert error_of(rollouts[bad])[0] == "InvalidTaskError"
    assert error_of(rollouts[good])[0] == "WorkerUnresponsiveError"


def test_records_and_policies_from_a_newer_version_are_read_with_a_warning(redis_server, namespace, workers):
    producer = Producer.from_url(redis_server.url, namespace, policy=QUICK)
    rid = producer.enqueue({}).rollout_id
    key = producer.keys.task(rid)
    policy = json.loads(producer.connection.hget(key, TaskField.POLICY.value))
    task = json.loads(producer.connection.hget(key, TaskField.TASK.value))
    producer.connection.hset(key, TaskField.POLICY.value, json.dumps({**policy, "priority_from_the_future": 3}))
    producer.connection.hset(key, TaskField.TASK.value, json.dumps({**task, "field_from_the_future": 1}))
    producer.connection.hset(key, "another_field_from_the_future", "x")
    assert read_record(producer.connection, producer.keys, rid).policy.max_attempts == policy["max_attempts"]

    worker = workers(redis_server.url, namespace, env=ASYNC)
    [rollout] = producer.wait([rid], timeout=20)
    assert rollout.metadata["status"] == "succeeded"
    assert "priority_from_the_future" in worker.log()


# -- 5. job ids that cannot collide ----------------------------------------------------------------------------


def test_a_rollout_id_equal_to_another_rollouts_hashed_job_id_runs_both(redis_server, namespace, workers):
    producer = Producer.from_url(redis_server.url, namespace, policy=QUICK)
    spaced = "needs hashing"
    lookalike = "h" + hashlib.sha256(spaced.encode()).hexdigest()[:40]  # the job id the old scheme gave `spaced`
    producer.enqueue({}, rollout_id=spaced)
    producer.enqueue({}, rollout_id=lookalike)
    workers(redis_server.url, namespace, env=ASYNC)
    rollouts = producer.wait([spaced, lookalike], timeout=20)
    assert [r.metadata["status"] for r in rollouts] == ["succeeded"] * 2
    assert_exactly_once(producer.connection, namespace, [spaced, lookalike])


def test_a_rollout_and_the_retry_of_another_never_share_a_job(redis_server, namespace, workers):
    producer = Producer.from_url(redis_server.url, namespace, policy=QUICK)
    retried = RolloutPolicy(timeout_seconds=1, max_attempts=2, unresponsive_seconds=2)
    producer.enqueue({"sleep": 3}, rollout_id="x", policy=retried)
    workers(redis_server.url, namespace, env=ASYNC)
    wait_until(lambda: read_record(producer.connection, producer.keys, "x").attempt == 2, "the retry of x", timeout=20)
    producer.enqueue({}, rollout_id="x-r1")
    rollouts = {r.rollout_id: r for r in producer.wait(["x", "x-r1"], timeout=20)}
    assert rollouts["x-r1"].metadata["status"] == "succeeded"
    assert_exactly_once(producer.connection, namespace, ["x", "x-r1"])


def test_enqueue_refuses_to_overwrite_a_job_hash_that_stands_for_another_task(redis_server, namespace):
    producer = Producer.from_url(redis_server.url, namespace)
    taken = producer.keys.job_id("mine")
    producer.connection.hset(Keys.rq_job(taken), mapping={"data": "someone else's job", "status": "queued"})
    with pytest.raises(Exception, match=taken):
        producer.enqueue({}, rollout_id="mine")
    assert producer.connection.hget(Keys.rq_job(taken), "data") == b"someone else's job"
    assert not producer.connection.exists(producer.keys.task("mine"))


def test_the_same_rollout_id_in_two_namespaces_runs_as_two_jobs(redis_server, namespace, workers):
    # RQ's job hashes are per database: were the job id the rollout id's alone, the second enqueue would rewrite
    # the first's job hash (its origin queue) and one job id would sit on both namespaces' queues.
    kinds = {"ROLLQ_AGENT": "tests.support.rollout_agents:AsyncKindsAgent", "ROLLQ_HEARTBEAT_SECONDS": "0.5"}
    rewards = {namespace: 0.25, f"{namespace}-b": 0.75}
    producers = {ns: Producer.from_url(redis_server.url, ns, policy=QUICK) for ns in rewards}
    for ns, reward in rewards.items():
        producers[ns].enqueue_many([{"kind": "float", "reward": reward}], rollout_ids=["shared"])
    connection = producers[namespace].connection
    jobs = {ns: _job_of(connection, p.keys, "shared") for ns, p in producers.items()}
    assert len(set(jobs.values())) == 2, jobs
    for ns, p in producers.items():
        assert connection.hget(Keys.rq_job(jobs[ns]), "origin") == p.keys.queue_name.encode()
        assert [j.decode() for j in connection.lrange(p.keys.rq_queue, 0, -1)] == [jobs[ns]]

    for ns in rewards:
        workers(redis_server.url, ns, env=kinds)
    for ns, p in producers.items():
        [rollout] = p.wait(["shared"], timeout=20)
        assert (rollout.metadata["status"], rollout.final_reward) == ("succeeded", rewards[ns])
        assert_exactly_once(connection, ns, ["shared"])


def test_a_task_queued_before_job_ids_hashed_the_namespace_still_runs(redis_server, namespace, workers):
    # What a rollq whose job ids hashed the rollout id alone left queued: the worker claims by the job id the
    # task's record holds, not by one it computes.
    producer = Producer.from_url(redis_server.url, namespace, policy=QUICK)
    keys, connection = producer.keys, producer.connection
    rid = producer.enqueue({}).rollout_id
    new, old = keys.job_id(rid), "rollq-" + hashlib.sha256(rid.encode()).hexdigest()[:40] + "-0"
    connection.rename(Keys.rq_job(new), Keys.rq_job(old))
    connection.lset(keys.rq_queue, 0, old)
    connection.hset(keys.task(rid), TaskField.JOB.value, old)
    workers(redis_server.url, namespace, env=ASYNC)
    [rollout] = producer.wait([rid], timeout=20)
    assert rollout.metadata["status"] == "succeeded"
    assert_exactly_once(connection, namespace, [rid])


# -- 6. foreign and malformed jobs on a rollq queue ------------------------------------------------------------


def _foreign_job(connection, keys: Keys, job: str, **fields: str) -> None:
    payload = zlib.compress(JSONSerializer.dumps(("rollq.worker.jobs.run_rollout", None, ["nobody"], {})))
    base = {"data": payload, "status": "queued", "origin": keys.queue_name, "created_at": "2026-01-01T00:00:00.000000Z"}
    connection.hset(Keys.rq_job(job), mapping={**base, **fields})
    connection.rpush(keys.rq_queue, job)


@pytest.mark.slow
def test_malformed_jobs_on_a_rollq_queue_are_moved_aside_and_no_worker_dies(redis_server, namespace, workers):
    producer = Producer.from_url(redis_server.url, namespace, policy=QUICK)
    keys, connection = producer.keys, producer.connection
    first = producer.enqueue({}).rollout_id
    _foreign_job(connection, keys, "bogus-status", status="bogus")
    _foreign_job(connection, keys, "bad-created-at", created_at="yesterday")
    _foreign_job(connection, keys, "bad-dependencies", dependency_ids="{not json")
    connection.lpush(keys.rq_intermediate, "bogus-status-left-behind")
    _foreign_job(connection, keys, "bogus-status-left-behind", status="bogus")
    connection.lrem(keys.rq_queue, 1, "bogus-status-left-behind")
    broken_task = producer.enqueue({}).rollout_id
    connection.hset(Keys.rq_job(_job_of(connection, keys, broken_task)), "status", "bogus")
    last = producer.enqueue({}).rollout_id

    one = workers(redis_server.url, namespace, env=ASYNC)
    rollouts = {r.rollout_id: r for r in producer.wait([first, last, broken_task], timeout=30)}
    assert all(r.metadata["status"] == "succeeded" for r in rollouts.values())
    two = workers(redis_server.url, namespace, env=ASYNC)
    time.sleep(3)
    assert one.process.poll() is None and two.process.poll() is None
    quarantined = {j.decode() for j in connection.lrange(keys.quarantine, 0, -1)}
    assert {"bogus-status", "bad-created-at", "bad-dependencies", "bogus-status-left-behind"} <= quarantined
    assert "quarantine" in one.log() + two.log()
    producer.reap()
    assert connection.llen(keys.rq_intermediate) == 0


def _job_of(connection, keys: Keys, rollout_id: str) -> str:
    return connection.hget(keys.task(rollout_id), TaskField.JOB.value).decode()


# -- 7. a result that cannot be serialised ---------------------------------------------------------------------


@pytest.mark.parametrize("what", [True, "triplet"], ids=["metadata", "triplet"])
def test_an_unserialisable_result_fails_at_once_naming_the_type(redis_server, namespace, workers, what):
    policy = RolloutPolicy(unresponsive_seconds=2, max_attempts=3, retry_on=frozenset({"exception", "unresponsive"}))
    producer = Producer.from_url(redis_server.url, namespace, policy=policy)
    workers(redis_server.url, namespace, env=ASYNC)
    rid = producer.enqueue({"unserialisable": what}).rollout_id
    [rollout] = producer.wait([rid], timeout=20)
    assert rollout.metadata["attempt"] == 1
    kind, message = error_of(rollout)
    assert kind != "WorkerUnresponsiveError" and "object" in message, (kind, message)


# -- 8. Redis stalls -------------------------------------------------------------------------------------------


def _stall_under_load(own_redis, workers, namespace, *, policy, stall, sleep_between):
    """32 attempts in flight on 2 workers, Redis SIGSTOPped for ``stall`` seconds in their middle. The attempts
    outlast the stall: when Redis resumes, every one is alive and must be judged so."""
    server = own_redis()
    producer = Producer.from_url(server.url, namespace, policy=policy)
    env = {**ASYNC, "ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent", "ROLLQ_CONCURRENCY": "16"}
    for _ in range(2):
        workers(server.url, namespace, env=env)
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep_between": sleep_between}] * 32)]
    wait_until(lambda: producer.connection.zcard(producer.keys.inflight) == 32, "32 rollouts in flight", timeout=30)
    time.sleep(1)
    server.process.send_signal(signal.SIGSTOP)
    try:
        time.sleep(stall)
    finally:
        server.process.send_signal(signal.SIGCONT)
    # A reaper that gets to Redis first after the stall (any worker's or producer's) must judge no attempt dead.
    report = producer.reap()
    assert (report.requeued, report.failed) == (0, 0), report
    rollouts = producer.wait(ids, timeout=60)  # reaps as it waits, racing the workers' first heartbeats
    stats = {k.decode(): v.decode() for k, v in producer.connection.hgetall(producer.keys.stats).items()}
    assert_exactly_once(producer.connection, namespace, ids)
    return rollouts, stats


@pytest.mark.slow
def test_a_40s_redis_stall_under_load_makes_no_live_attempt_look_dead(own_redis, workers, namespace):
    rollouts, stats = _stall_under_load(
        own_redis, workers, namespace, policy=RolloutPolicy(unresponsive_seconds=3), stall=40, sleep_between=[44, 48]
    )
    assert [r.rollout_id for r in rollouts if r.metadata["status"] != "succeeded"] == []
    assert [r.metadata["attempt"] for r in rollouts] == [1] * 32
    assert stats.get("superseded", "0") == "0" and stats.get("requeued:unresponsive", "0") == "0", stats


@pytest.mark.slow
def test_a_15s_stall_fails_nothing_with_one_attempt_and_10s_unresponsive(own_redis, workers, namespace):
    policy = RolloutPolicy(unresponsive_seconds=10, max_attempts=1)
    rollouts, _ = _stall_under_load(own_redis, workers, namespace, policy=policy, stall=15, sleep_between=[18, 22])
    assert [r.rollout_id for r in rollouts if r.metadata["status"] != "succeeded"] == []


# -- 9. RQ jobs deleted behind rollq's back --------------------------------------------------------------------


def test_a_queued_task_whose_rq_job_was_deleted_is_requeued_by_the_reaper(own_redis, namespace, workers):
    # A server of its own: the reapers' sweep reads the whole database, 1000 keys a second.
    redis_server = own_redis()
    producer = Producer.from_url(redis_server.url, namespace, policy=QUICK)
    keys, connection = producer.keys, producer.connection
    deleted, flushed = (t.rollout_id for t in producer.enqueue_many([{}] * 2))
    Job.fetch(_job_of(connection, keys, deleted), connection=connection, serializer=JSONSerializer).delete()
    connection.lrem(keys.rq_queue, 1, _job_of(connection, keys, flushed))  # a flushed or trimmed list
    emptied = [t.rollout_id for t in producer.enqueue_many([{}] * 2)]
    Queue(keys.queue_name, connection=connection, serializer=JSONSerializer).empty()  # `rq empty`, Empty button
    fresh = producer.enqueue({}).rollout_id
    assert connection.llen(keys.rq_queue) == 1

    workers(redis_server.url, namespace, env=ASYNC)
    ids = [deleted, flushed, *emptied, fresh]
    rollouts = producer.wait(ids, timeout=30)
    assert [r.metadata["status"] for r in rollouts] == ["succeeded"] * 5
    assert_exactly_once(producer.connection, namespace, ids)


@pytest.mark.slow
def test_the_lost_job_sweep_reads_only_queued_tasks_and_sends_no_lpos_while_every_job_is_on_its_list(own_redis):
    # Issue 25: the sweep SCANned the whole database (every namespace's keys) and sent LPOS, 13.7 ms each with 1M
    # queued, for 20 jobs a second. It now walks the index of queued tasks the transitions keep, and LPOS only when
    # RQ's lists hold fewer jobs than there are queued tasks.
    from rollq.store.reaper import _audit

    server = own_redis()
    producer = Producer.from_url(server.url, "indexed", policy=QUICK)
    keys, connection = producer.keys, producer.connection
    connection.mset({f"elsewhere:{i}": 1 for i in range(3000)})
    tasks = producer.enqueue_many([{}] * 30)
    assert connection.scard(keys.queued_tasks) == 30
    claimed = tasks[0].rollout_id
    assert producer.lifecycle.claim(claimed, producer.keys.job_id(claimed), "w1") is not None
    producer.cancel([tasks[1].rollout_id])
    assert connection.scard(keys.queued_tasks) == 28
    connection.sadd(keys.queued_tasks, keys.task(claimed))  # a stale member: the sweep drops it
    with server.client().monitor() as monitor:
        _audit(producer.lifecycle, producer.lifecycle.beat())
        connection.ping()
        sent = []
        while not sent or sent[-1] != "PING":
            event = monitor.next_command()
            if event.get("client_type") != "lua":
                sent.append(event["command"].split()[0].upper())
    assert "SSCAN" in sent and "SCAN" not in sent and "LPOS" not in sent, sent
    assert connection.scard(keys.queued_tasks) == 28
    connection.delete(keys.rq_queue)  # a flushed list: now the sweep looks for the jobs and queues them again
    for _ in range(3):
        connection.delete(keys.audit_lock)
        _audit(producer.lifecycle, producer.lifecycle.beat())
        time.sleep(2.1)
    connection.delete(keys.audit_lock)
    _audit(producer.lifecycle, producer.lifecycle.beat())
    assert connection.llen(keys.rq_queue) > 0


def test_the_rollq_dashboard_disables_rq_dashboards_delete_buttons():
    from rollq.ops.dashboard import create_app

    app = create_app("redis://127.0.0.1:1/0")
    assert app.config["RQ_DASHBOARD_DISABLE_DELETE"] is True
