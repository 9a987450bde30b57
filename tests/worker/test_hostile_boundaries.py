"""Issue 26, "trust nothing that crosses a boundary": what a hostile tester found at the worker's boundaries
(hooks, a full Redis, deep records, agents' results), each reproduced on a real redis-server and real
``rq worker -w rollq.worker.RolloutWorker`` processes."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time

import pytest
import redis

from rollq.models.contract import Rollout
from rollq.models.errors import InvalidTaskError
from rollq.models.policy import RolloutPolicy
from rollq.producer.aio import AsyncProducer
from rollq.producer.producer import Producer
from rollq.store.connection import connect
from rollq.store.keys import TaskField
from rollq.store.replies import ClaimRefused
from rollq.store.stats import requeue_stat
from rollq.store.transitions import Lifecycle
from tests.support.fault_agents import assert_exactly_once
from tests.support.servers import ROLLQ
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis

ASYNC = {"ROLLQ_AGENT": "tests.support.hostile_agents:HostileAgent", "ROLLQ_HEARTBEAT_SECONDS": "0.5"}


# -- 2. a slow on_rollout_start hook ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_slow_start_hook_fails_no_healthy_task_and_is_reported_over_its_budget(redis_server, namespace, workers):
    # 16 claims at once, each start hook 0.4 s: the last agent starts ~6 s after its claim, three times the 2 s
    # unresponsive limit. On 48fc877 claims were heartbeated only once launched, and the reaper took them over.
    producer = Producer.from_url(
        redis_server.url, namespace, policy=RolloutPolicy(unresponsive_seconds=2, timeout_seconds=60)
    )
    ids = [t.rollout_id for t in producer.enqueue_many([{"hook_sleep": 0.4}] * 32)]
    env = {
        **ASYNC,
        "ROLLQ_CONCURRENCY": "16",
        "ROLLQ_HOOKS": "tests.support.hostile_agents:SlowStartHook",
        "ROLLQ_HOOK_BUDGET_SECONDS": "0.2",
    }
    worker = workers(redis_server.url, namespace, env=env)
    rollouts = producer.wait(ids, timeout=90)
    assert [r.metadata["status"] for r in rollouts] == ["succeeded"] * len(ids)
    assert [r.metadata["attempt"] for r in rollouts] == [1] * len(ids)
    assert int(producer.connection.hget(producer.keys.stats, requeue_stat("unresponsive")) or 0) == 0
    for rollout in rollouts:
        assert rollout.metadata["hook_overruns"]["SlowStartHook.on_rollout_start"] >= 0.4
    assert "hook SlowStartHook.on_rollout_start took" in worker.log()


# -- 3. a full Redis -------------------------------------------------------------------------------------------


def _fill_up(client: redis.Redis) -> None:
    """Make Redis refuse every write that needs memory: maxmemory below what it uses, under noeviction.

    Half of what it uses, not just under it: 1 KB under, a client buffer freed or a key expiring took Redis below the
    limit for a moment, a refused command ran, and the worker saw two refusals where it met one full Redis (CI: refused
    at :35, "accepts commands again" at :37, refused again at :41)."""
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", max(1, int(client.info("memory")["used_memory"]) // 2))


@pytest.mark.slow
def test_a_full_redis_pauses_workers_who_resume_when_memory_frees(own_redis, namespace, workers):
    # On 48fc877 every worker exited at the first refused write ("found an unhandled exception, quitting").
    server = own_redis()
    client = server.client()
    producer = Producer.from_url(server.url, namespace, policy=RolloutPolicy(unresponsive_seconds=30))
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.3}] * 60)]
    fleet = [workers(server.url, namespace, env={**ASYNC, "ROLLQ_CONCURRENCY": "4"}) for _ in range(2)]
    wait_until(lambda: producer.connection.xlen(producer.keys.results) >= 4, "some rollouts to finish", timeout=30)
    # Both running (a worker that starts into a full Redis exits at once, as it does when Redis is down).
    wait_until(lambda: all("concurrency 4" in w.log() for w in fleet), "both workers to start", timeout=30)

    _fill_up(client)
    time.sleep(6)
    assert [w.process.poll() for w in fleet] == [None, None]
    status = subprocess.run(
        [ROLLQ, "--url", server.url, "-n", namespace, "status"], capture_output=True, text=True, timeout=60
    )
    assert "FULL: refusing writes" in status.stdout, status.stdout + status.stderr
    metrics = subprocess.run(
        [ROLLQ, "--url", server.url, "-n", namespace, "status", "--prometheus"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert f'rollq_redis_refusing_writes{{namespace="{namespace}"}} 1.0' in metrics.stdout, metrics.stderr

    client.config_set("maxmemory", 0)
    rollouts = producer.wait(ids, timeout=90)
    assert [r.metadata["status"] for r in rollouts] == ["succeeded"] * len(ids)
    assert_exactly_once(producer.connection, namespace, ids)
    for worker in fleet:
        log = worker.log()
        assert "found an unhandled exception" not in log
        assert log.count("Redis refuses commands") == 1, log[-3000:]
        assert "Redis accepts commands again" in log
    wait_until(
        lambda: int(client.hget(producer.keys.stats, "redis:refusals") or 0) >= 2, "refusals counted", timeout=20
    )


def test_an_enqueue_refused_by_a_full_redis_queues_none_of_its_batch(own_redis, namespace):
    # On 48fc877 a batch refused part way had queued the Lua calls sent before memory ran out (300 of them).
    server = own_redis()
    client = server.client()
    producer = Producer(connect(server.url, retries=1), namespace)
    producer.enqueue({"warm": True})
    client.config_set("maxmemory-policy", "noeviction")
    big = "x" * 4000
    # Room for a few hundred of these tasks but not 1500: the refusal comes part way through the batch.
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + 1_500_000)
    before = client.llen(producer.keys.rq_queue)
    try:
        queued = producer.enqueue_many([{"pad": big, "i": i} for i in range(1500)])
    except redis.exceptions.OutOfMemoryError:
        queued = []
    after = client.llen(producer.keys.rq_queue)
    assert after - before in (0, 1500) and after - before == len(queued)
    # And a batch enqueued while Redis is full is refused whole.
    _fill_up(client)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        producer.enqueue_many([{"i": i} for i in range(300)])
    assert client.llen(producer.keys.rq_queue) == after


def test_an_evicting_maxmemory_policy_is_warned_about_at_start(own_redis, namespace, workers, caplog):
    server = own_redis()
    server.client().config_set("maxmemory-policy", "allkeys-lru")
    with caplog.at_level("WARNING", logger="rollq"):
        Producer.from_url(server.url, namespace).enqueue({"sleep": 0})
    assert "maxmemory-policy is allkeys-lru" in caplog.text
    worker = workers(server.url, namespace, env=ASYNC)
    wait_until(lambda: "maxmemory-policy is allkeys-lru" in worker.log(), "the worker's warning", timeout=30)
    status = subprocess.run(
        [ROLLQ, "--url", server.url, "-n", namespace, "status"], capture_output=True, text=True, timeout=60
    )
    assert "may EVICT rollq's keys" in status.stdout


# -- 4. task records nested deeper than a parser goes ----------------------------------------------------------


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_a_record_nested_100000_deep_fails_its_task_and_never_stops_reaping_or_waiting(redis_server, namespace):
    # On 48fc877 reap() and Producer.wait raised RecursionError: no stale attempt of the namespace was reaped.
    producer = Producer.from_url(
        redis_server.url, namespace, policy=RolloutPolicy(unresponsive_seconds=1, max_attempts=1)
    )
    lifecycle = Lifecycle(producer.connection, producer.keys)
    deep, good = (t.rollout_id for t in producer.enqueue_many([{}, {}]))
    for rid in (deep, good):
        lifecycle.claim(rid, producer.keys.job_id(rid), "gone-worker")
    task = json.loads(producer.connection.hget(producer.keys.task(deep), TaskField.TASK.value))
    record = json.dumps(task).replace('"input": {}', '"input": ' + _deep(100_000))
    producer.connection.hset(producer.keys.task(deep), TaskField.TASK.value, record)
    time.sleep(3)  # both attempts are now past their deadline

    report = producer.reap()
    assert report.failed == 2
    rollouts = {r.rollout_id: r for r in producer.wait([deep, good], timeout=5)}
    error = rollouts[deep].metadata["error"]
    assert error["type"] == "InvalidTaskError" and "nested too deep" in error["message"]
    assert rollouts[good].metadata["error"]["type"] == "WorkerUnresponsiveError"


@pytest.mark.parametrize(
    "broken", ["task key holding a string", "in-flight member with no attempt", "running task key holding a string"]
)
def test_one_broken_key_is_skipped_once_and_the_rest_of_the_namespace_is_still_reaped(
    redis_server, namespace, caplog, broken
):
    # An outside audit: a queued task's key overwritten with a string made the lost-job sweep raise WRONGTYPE, a
    # junk member of the in-flight set made parsing it raise ValueError; either way every reaper pass (and
    # Producer.wait for any id) raised before it reached stale attempts, so a killed worker's task ran forever.
    producer = Producer.from_url(
        redis_server.url, namespace, policy=RolloutPolicy(unresponsive_seconds=1, max_attempts=1)
    )
    lifecycle = Lifecycle(producer.connection, producer.keys)
    victim, _queued, poisoned = (t.rollout_id for t in producer.enqueue_many([{}, {}, {}]))
    lifecycle.claim(victim, producer.keys.job_id(victim), "gone-worker")
    if broken == "running task key holding a string":
        lifecycle.claim(poisoned, producer.keys.job_id(poisoned), "gone-worker")
    if broken != "in-flight member with no attempt":
        producer.connection.delete(producer.keys.task(poisoned))
        producer.connection.set(producer.keys.task(poisoned), "garbage")
        named = producer.keys.task(poisoned)
    else:
        producer.connection.zadd(producer.keys.inflight, {"junk-member-without-attempt": 0})
        named = "junk-member-without-attempt"
    time.sleep(2)  # the victim's attempt is now past its deadline

    [rollout] = producer.wait([victim], timeout=15)  # the producer's own reaping fails it
    assert rollout.metadata["error"]["type"] == "WorkerUnresponsiveError"
    time.sleep(1.1)  # past the sweep's one-pass-a-second lock
    producer.reap()
    assert len([r for r in caplog.records if named in r.getMessage()]) == 1


def test_a_record_nested_too_deep_fails_one_task_on_a_worker_which_runs_the_others(redis_server, namespace, workers):
    producer = Producer.from_url(redis_server.url, namespace, policy=RolloutPolicy(timeout_seconds=30))
    deep, *good = (t.rollout_id for t in producer.enqueue_many([{}] * 4))
    task = json.loads(producer.connection.hget(producer.keys.task(deep), TaskField.TASK.value))
    record = json.dumps(task).replace('"input": {}', '"input": ' + _deep(100_000))
    producer.connection.hset(producer.keys.task(deep), TaskField.TASK.value, record)
    worker = workers(redis_server.url, namespace, env=ASYNC)
    rollouts = {r.rollout_id: r for r in producer.wait([deep, *good], timeout=30)}
    assert rollouts[deep].metadata["error"]["type"] == "InvalidTaskError"
    assert [rollouts[rid].metadata["status"] for rid in good] == ["succeeded"] * 3
    assert worker.process.poll() is None


def test_an_input_nested_deeper_than_json_allows_is_refused_naming_its_task_and_queues_nothing(redis_server, namespace):
    producer = Producer.from_url(redis_server.url, namespace)
    with pytest.raises(InvalidTaskError, match="cannot be queued: its input") as info:
        producer.enqueue_many([{"ok": 1}, json.loads(_deep(300))], rollout_ids=["fine", "too-deep"])
    assert "too-deep" in str(info.value)
    assert producer.connection.llen(producer.keys.rq_queue) == 0


# -- 5. the true cause in every failed rollout -----------------------------------------------------------------


def test_a_reward_no_float_can_carry_fails_its_rollout_naming_the_cause(redis_server, namespace, workers):
    # On 48fc877 returning 10**400 raised OverflowError outside the attempt's error handling: the task was
    # retried until every attempt was spent and failed as "worker unresponsive".
    producer = Producer.from_url(redis_server.url, namespace, policy=RolloutPolicy(unresponsive_seconds=2))
    huge, fine = (t.rollout_id for t in producer.enqueue_many([{"huge": True}, {}]))
    worker = workers(redis_server.url, namespace, env=ASYNC)
    rollouts = {r.rollout_id: r for r in producer.wait([huge, fine], timeout=30)}
    error = rollouts[huge].metadata["error"]
    assert error["type"] == "InvalidRewardError" and "too large for a float" in error["message"], error
    assert rollouts[huge].metadata["attempt"] == 1
    assert rollouts[fine].metadata["status"] == "succeeded"
    assert worker.process.poll() is None


def test_a_corrupted_resources_version_fails_the_rollout_naming_it(redis_server, namespace, workers):
    producer = Producer.from_url(redis_server.url, namespace, policy=RolloutPolicy(unresponsive_seconds=2))
    version = producer.update_resources({"llm": {"resource_type": "llm", "endpoint": "http://x", "model": "m"}})
    producer.connection.set(producer.keys.resources(version), b'{"resources_id": "v", "resources": [1, 2')
    rid = producer.enqueue({}).rollout_id
    workers(redis_server.url, namespace, env=ASYNC)
    (rollout,) = producer.wait([rid], timeout=30)
    error = rollout.metadata["error"]
    assert error["type"] == "InvalidResourcesError" and version in error["message"], error
    assert rollout.metadata["attempt"] == 1


def test_a_retry_whose_job_id_is_squatted_fails_naming_both_causes(redis_server, namespace, workers):
    policy = RolloutPolicy(max_attempts=3, retry_on={"exception"}, unresponsive_seconds=2)
    producer = Producer.from_url(redis_server.url, namespace, policy=policy)
    rid = producer.enqueue({"raise": "first attempt fails"}).rollout_id
    squatter = producer.keys.job_id(rid, after_attempt=1)
    producer.connection.hset(f"rq:job:{squatter}", mapping={"data": "another job's", "status": "queued"})
    workers(redis_server.url, namespace, env=ASYNC)
    (rollout,) = producer.wait([rid], timeout=30)
    error = rollout.metadata["error"]
    assert error["type"] == "RetryNotQueuedError", error
    assert squatter in error["message"] and "first attempt fails" in error["message"]
    assert producer.connection.hget(f"rq:job:{squatter}", "data") == b"another job's"


def test_neighbours_of_a_loop_blocking_agent_are_handed_back_not_failed(redis_server, namespace, workers):
    # On 48fc877 all 6 neighbours were failed as timed out: their time ran out while another agent held the loop.
    producer = Producer.from_url(redis_server.url, namespace)
    blocked = workers(redis_server.url, namespace, env={**ASYNC, "ROLLQ_CONCURRENCY": "8"})
    warm_up = producer.enqueue({}).rollout_id
    producer.wait([warm_up], timeout=30)  # the worker is up
    strict = RolloutPolicy(timeout_seconds=3, unresponsive_seconds=30, max_attempts=1)
    neighbours = [t.rollout_id for t in producer.enqueue_many([{"sleep": 1}] * 6, policy=strict)]
    wait_until(lambda: producer.connection.zcard(producer.keys.inflight) == 6, "the neighbours to run", timeout=10)
    blocker = producer.enqueue({"block": 8}, policy=strict).rollout_id
    wait_until(lambda: "is blocked" in blocked.log(), "the watchdog to see the loop blocked", timeout=10)
    workers(redis_server.url, namespace, env={**ASYNC, "ROLLQ_CONCURRENCY": "8"})

    rollouts = {r.rollout_id: r for r in producer.wait([blocker, *neighbours], timeout=60)}
    assert rollouts[blocker].metadata["error"]["type"] == "AgentTimeoutError"
    assert [rollouts[rid].metadata["status"] for rid in neighbours] == ["succeeded"] * 6
    assert_exactly_once(producer.connection, namespace, [warm_up, blocker, *neighbours])


def test_a_redis_stall_right_after_a_namespace_starts_fails_no_live_task(own_redis, namespace, workers):
    # On 48fc877 the namespace clock started at a worker's first heartbeat, an interval after its first claims:
    # a stall in between looked like dead workers to the first reaper after it (2 of 600 failed in one run).
    server = own_redis()
    producer = Producer.from_url(
        server.url, namespace, policy=RolloutPolicy(unresponsive_seconds=3, max_attempts=1, timeout_seconds=60)
    )
    ids = [t.rollout_id for t in producer.enqueue_many([{"sleep": 1}] * 8)]
    worker = workers(server.url, namespace, env={**ASYNC, "ROLLQ_CONCURRENCY": "8", "ROLLQ_HEARTBEAT_SECONDS": "2"})
    wait_until(lambda: producer.connection.zcard(producer.keys.inflight) == 8, "the first claims", timeout=20)
    # Redis and the worker stall together (a paused VM), past every deadline; the producer's reaper then comes
    # back first.
    assert server.process is not None
    worker.signal(signal.SIGSTOP)
    server.process.send_signal(signal.SIGSTOP)
    time.sleep(5)
    server.process.send_signal(signal.SIGCONT)
    try:
        report = producer.reap()
        assert report.waited and report.failed == 0 and report.requeued == 0, report
    finally:
        worker.signal(signal.SIGCONT)
    rollouts = producer.wait(ids, timeout=30)
    assert [r.metadata["status"] for r in rollouts] == ["succeeded"] * 8


# -- 6. rollq's own keys overwritten with another type ---------------------------------------------------------


@pytest.mark.parametrize("wait_from", ["right after enqueue", "a later wait"])
def test_a_task_whose_record_key_is_a_string_fails_naming_it_and_its_pack_runs(
    redis_server, namespace, workers, wait_from
):
    # An outside audit: the claim's HMGET on a task key holding a string answered WRONGTYPE, the RQ job failed with
    # that raw error, nothing was published, and Producer.wait raised redis's WRONGTYPE ResponseError.
    producer = Producer.from_url(redis_server.url, namespace, policy=RolloutPolicy(timeout_seconds=30))
    ids = [t.rollout_id for t in producer.enqueue_many([{}] * 4, tasks_per_job=4)]
    poisoned = ids[1]
    key = producer.keys.task(poisoned)
    producer.connection.delete(key)
    producer.connection.set(key, "garbage")
    if wait_from == "a later wait":
        producer = Producer.from_url(redis_server.url, namespace)  # no memory of where the tasks were queued
    worker = workers(redis_server.url, namespace, env=ASYNC)
    rollouts = {r.rollout_id: r for r in producer.wait(ids, timeout=30)}
    error = rollouts[poisoned].metadata["error"]
    assert error["type"] == "InvalidTaskError", error
    assert f"the task record {key} is a string, not a hash" in error["message"], error
    assert [rollouts[rid].metadata["status"] for rid in ids if rid != poisoned] == ["succeeded"] * 3
    assert producer.connection.get(key) == b"garbage"  # the foreign key is left as it was
    # The worker published it (for readers of the stream) once, dead-lettered it, logged it, and lives on.
    wait_until(
        lambda: producer.connection.zscore(producer.keys.dead_letter, poisoned) is not None, "its dead-letter entry"
    )
    entries = [f for _, f in producer.connection.xrange(producer.keys.results)]
    assert [f[b"rollout_id"].decode() for f in entries].count(poisoned) == 1
    assert f"the task record {key} is a string, not a hash" in worker.log()
    assert worker.process.poll() is None


def test_a_task_key_holding_no_hash_is_failed_by_its_first_job_only(redis_server, namespace):
    # With no record to say which job stands for the task, a second job of the same rollout id (a retry, a
    # duplicate) must not publish a second failed rollout: the dead-letter set says it was failed.
    producer = Producer.from_url(redis_server.url, namespace)
    rid = producer.enqueue({}).rollout_id
    producer.connection.delete(producer.keys.task(rid))
    producer.connection.rpush(producer.keys.task(rid), "a list")
    lifecycle = Lifecycle(producer.connection, producer.keys)
    refusal = lifecycle.claim(rid, producer.keys.job_id(rid), "w")
    assert isinstance(refusal, ClaimRefused) and refusal.reason == "invalid", refusal
    assert f"the task record {producer.keys.task(rid)} is a list, not a hash" in str(refusal.state)
    replies = [
        lifecycle.reject(rid, jid, '{"rollout_id": "x"}', results_maxlen=1000, now=time.time())
        for jid in (producer.keys.job_id(rid), producer.keys.job_id(rid, after_attempt=1))
    ]
    assert [type(r).__name__ for r in replies] == ["Published", "Superseded"]
    assert producer.connection.xlen(producer.keys.results) == 1
    assert producer.connection.lrange(producer.keys.task(rid), 0, -1) == [b"a list"]
    (rollout,) = producer.wait([rid], timeout=1)  # no record to find it by: the same cause, named
    assert "is a list, not a hash: something other than rollq wrote it" in rollout.metadata["error"]["message"]

    async def get_async() -> Rollout:
        async with AsyncProducer.from_url(redis_server.url, namespace) as aio:
            return (await aio.get_rollouts([rid]))[rid]

    assert asyncio.run(get_async()).metadata["error"] == rollout.metadata["error"]


def test_a_damaged_summaries_stream_is_named_by_the_worker_which_publishes_every_rollout_once(
    redis_server, namespace, workers
):
    # An outside audit: finish.lua XADDed each rollout and then failed at the summaries stream holding a string:
    # every batch's RQ jobs failed with a raw WRONGTYPE though their rollouts were published, and nothing counted.
    producer = Producer.from_url(redis_server.url, namespace, policy=RolloutPolicy(timeout_seconds=30))
    producer.connection.set(producer.keys.summaries, "junk")
    ids = [t.rollout_id for t in producer.enqueue_many([{}] * 4)]
    worker = workers(redis_server.url, namespace, env={**ASYNC, "ROLLQ_CONCURRENCY": "4"})
    rollouts = producer.wait(ids, timeout=30)
    assert [(r.metadata["status"], r.metadata["attempt"]) for r in rollouts] == [("succeeded", 1)] * 4
    assert_exactly_once(producer.connection, namespace, ids)
    assert int(producer.connection.hget(producer.keys.stats, "succeeded:") or 0) == 4
    wait_until(lambda: f"the summaries stream {producer.keys.summaries} is a string" in worker.log(), "the log")
    assert "WRONGTYPE" not in worker.log()
    assert worker.process.poll() is None


def test_a_damaged_in_flight_set_refuses_every_claim_and_the_tasks_run_once_it_is_repaired(
    redis_server, namespace, workers
):
    # An outside audit: claim.lua marked each task running and then failed at the ZADD to an in-flight set holding a
    # string: the tasks were left running out of the in-flight set, where no reaper looks, and never ended.
    producer = Producer.from_url(
        redis_server.url, namespace, policy=RolloutPolicy(unresponsive_seconds=2, timeout_seconds=60)
    )
    producer.connection.set(producer.keys.inflight, "junk")
    ids = [t.rollout_id for t in producer.enqueue_many([{}] * 3)]
    worker = workers(redis_server.url, namespace, env=ASYNC)
    named = f"the in-flight set {producer.keys.inflight} is a string, not a zset"
    wait_until(lambda: named in worker.log(), "the log naming the key")
    states = [producer.connection.hget(producer.keys.task(rid), TaskField.STATE) for rid in ids]
    assert states == [b"queued"] * 3  # refused with nothing written
    assert producer.connection.xlen(producer.keys.results) == 0
    assert worker.process.poll() is None
    producer.connection.delete(producer.keys.inflight)  # repaired: the lost-job sweep queues each task again
    rollouts = producer.wait(ids, timeout=60)
    assert [(r.metadata["status"], r.metadata["attempt"]) for r in rollouts] == [("succeeded", 1)] * 3
    assert_exactly_once(producer.connection, namespace, ids)
    assert "WRONGTYPE" not in worker.log()  # no heartbeat nor reaper pass failed on the key, each named it
    assert "Traceback" not in worker.log()  # each refused job's failure is Redis's words, not redis-py's stack
    assert worker.process.poll() is None
