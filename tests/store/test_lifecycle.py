"""The Lua transitions: a call sent twice (a reply lost to a connection drop) answers as the first time did; a bad
record gets no partial write; heartbeats and stalls are timed by Redis."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from rq.serializers import JSONSerializer

from rollq.models.contract import Task
from rollq.models.errors import InvalidTaskError
from rollq.models.policy import RolloutPolicy, RolloutStatus, TaskState
from rollq.store import replies
from rollq.store.connection import connect
from rollq.store.control import cancel_call, cancel_script_source, parse_cancel
from rollq.store.jobs import ROLLOUT_FUNC, JobRegistries, RollqJob, read_rollq_jobs
from rollq.store.keys import Keys, job_id
from rollq.store.reaper import ReapReport, reap
from rollq.store.records import wrong_type
from rollq.store.replies import (
    Claim,
    ClaimRefused,
    Clock,
    Enqueued,
    FinishReply,
    Published,
    Requeued,
    Superseded,
    TaskMissing,
)
from rollq.store.scripts import lua_header
from rollq.store.stats import DURATION_PREFIX, StatsField, duration_bucket
from rollq.store.summaries import recent_summaries
from rollq.store.transitions import Finish, Lifecycle

JOB = job_id("lc", "r1")
LUA = Path(__file__).resolve().parents[2] / "rollq" / "store" / "lua"


@pytest.fixture
def lifecycle() -> Lifecycle:
    lc = Lifecycle(connect(f"memory://{uuid.uuid4().hex}"), Keys("lc"))
    task = Task(rollout_id="r1", input={}, create_time=time.time(), num_claims=0)
    assert lc.enqueue_many([(task, task.model_dump_json())], RolloutPolicy()) == [Enqueued.QUEUED]
    return lc


def _publish(lc: Lifecycle, rollout_json: str) -> FinishReply:
    return lc.finish(
        Finish(
            rollout_id="r1",
            attempt=1,
            rollout_json=rollout_json,
            status=RolloutStatus.SUCCEEDED,
            results_maxlen=100,
            dead_letter=False,
            now=time.time(),
        )
    )


def test_a_claim_sent_again_by_the_same_worker_gets_the_same_attempt(lifecycle: Lifecycle) -> None:
    first = lifecycle.claim("r1", JOB, "worker-a")
    again = lifecycle.claim("r1", JOB, "worker-a")
    assert isinstance(first, Claim) and isinstance(again, Claim)
    assert (again.attempt, again.attempts_used) == (first.attempt, first.attempts_used) == (1, 1)
    assert lifecycle.connection.hget(lifecycle.keys.task("r1"), "claims") == b"1"


def test_another_worker_cannot_claim_a_running_task(lifecycle: Lifecycle) -> None:
    lifecycle.claim("r1", JOB, "worker-a")
    assert lifecycle.claim("r1", JOB, "worker-b") == ClaimRefused("stale", "running")


def test_a_publish_sent_again_returns_the_first_entry_and_records_nothing_superseded(lifecycle: Lifecycle) -> None:
    lifecycle.claim("r1", JOB, "worker-a")
    first = _publish(lifecycle, '{"rollout_id": "r1"}')
    assert isinstance(first, Published)
    assert _publish(lifecycle, '{"rollout_id": "r1"}') == first
    keys = lifecycle.keys
    assert (lifecycle.connection.xlen(keys.results), lifecycle.connection.xlen(keys.superseded)) == (1, 0)


def test_a_different_result_from_an_attempt_that_already_published_is_superseded(lifecycle: Lifecycle) -> None:
    lifecycle.claim("r1", JOB, "worker-a")
    _publish(lifecycle, '{"rollout_id": "r1", "final_reward": 1.0}')
    assert _publish(lifecycle, '{"rollout_id": "r1", "final_reward": 0.0}') == Superseded()
    keys = lifecycle.keys
    assert (lifecycle.connection.xlen(keys.results), lifecycle.connection.xlen(keys.superseded)) == (1, 1)


def _cancel(lc: Lifecycle, rid: str) -> tuple[dict[str, Any], Any]:
    """Cancel ``rid``; the cancelled rollout's metadata and its dashboard summary."""
    keys, args = cancel_call(lc.keys, rid, results_maxlen=100, now=time.time(), results_max_bytes=10**9)
    parse_cancel(rid, lc.connection.eval(cancel_script_source(), len(keys), *keys, *args))  # type: ignore[arg-type]
    [(_, fields)] = lc.connection.xrange(lc.keys.results)
    return json.loads(fields[b"rollout"])["metadata"], recent_summaries(lc.connection, lc.keys)[0]


def test_a_cancel_of_a_task_requeued_after_a_claim_names_no_worker(lifecycle: Lifecycle) -> None:
    # A helper's audit: cancel.lua read the record's worker field (the worker of the attempt a retry took back) into
    # the cancelled rollout and its summary, though no worker held the queued task.
    task = Task(rollout_id="r1", input={}, create_time=time.time(), num_claims=0)
    assert isinstance(lifecycle.claim("r1", JOB, "worker-a"), Claim)
    assert isinstance(lifecycle.requeue(task, 1, RolloutPolicy(), "retry"), Requeued)
    metadata, summary = _cancel(lifecycle, "r1")
    assert (metadata["status"], metadata["worker"], summary.worker) == ("cancelled", "", None)


def test_a_cancel_of_a_running_task_names_its_worker(lifecycle: Lifecycle) -> None:
    assert isinstance(lifecycle.claim("r1", JOB, "worker-a"), Claim)
    metadata, summary = _cancel(lifecycle, "r1")
    assert (metadata["status"], metadata["worker"], summary.worker) == ("cancelled", "worker-a", "worker-a")


def test_enqueueing_a_known_rollout_id_writes_nothing_and_says_known(lifecycle: Lifecycle) -> None:
    again = Task(rollout_id="r1", input={"other": True}, create_time=time.time(), num_claims=0)
    assert lifecycle.enqueue_many([(again, again.model_dump_json())], RolloutPolicy()) == [Enqueued.KNOWN]
    assert lifecycle.connection.llen(lifecycle.keys.rq_queue) == 1


def test_every_field_name_the_scripts_use_comes_from_the_generated_header() -> None:
    # The scripts spell no field of a task hash or stream themselves: each reads them from F.* / S.*.
    header = lua_header()
    for field in ("task", "policy", "state", "claims", "attempt", "attempts", "worker", "result", "job"):
        assert f"{field} = '{field}'" in header
    for name in ("claim", "enqueue", "finish", "requeue", "restore", "revive", "reject", "reissue", "beat"):
        source = (Path(__file__).resolve().parents[2] / "rollq" / "store" / "lua" / f"{name}.lua").read_text()
        code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("--"))
        for field in ("'task'", "'policy'", "'claims'", "'attempt'", "'attempts'", "'worker'", "'result'", "'job'"):
            assert field not in code, f"{name}.lua spells {field}"


def _code_lines(source: str) -> list[str]:
    """A Lua source's lines with comments cut off (no rollq script has ``--`` inside a string)."""
    return [line.split("--", 1)[0].rstrip() for line in source.splitlines()]


def lua_problems(source: str) -> list[str]:
    """What a script does against the house rules: a task state spelled as a string instead of ``STATE.<state>``;
    ``KEYS``/``ARGV`` read anywhere but in the block of ``local`` names at its top; an index of them skipped or
    named twice."""
    lines = _code_lines(source)
    problems = [
        f"spells the state '{state}'"
        for state in TaskState
        if re.search(rf"""['"]{state.value}['"]""", "\n".join(lines))
    ]
    header: list[str] = []
    in_header = True
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        named = re.search(r"\b(KEYS|ARGV)\b", line)
        if in_header and named:
            if not line.startswith("local ") or "redis.call" in line:
                problems.append(f"line {number} uses {named.group(1)} in more than a local's name: {line}")
            header.append(line)
            continue
        in_header = False  # the first line that names neither ends the header block
        if named:
            problems.append(f"line {number} reads {named.group(1)} below the header block: {line}")
    for table in ("KEYS", "ARGV"):
        indices = sorted(int(i) for i in re.findall(rf"\b{table}\[(\d+)\]", "\n".join(header)))
        if indices != list(range(1, len(indices) + 1)):
            problems.append(f"names {table} {indices}: each of 1..n once")
    return problems


def test_every_script_names_its_keys_and_args_at_the_top_and_spells_no_task_state() -> None:
    header = lua_header()
    for state in TaskState:
        assert f"{state.name.lower()} = '{state.value}'" in header  # STATE.<state>, generated from TaskState
    scripts = sorted(LUA.glob("*.lua"))
    assert len(scripts) >= 12
    problems = {path.name: lua_problems(path.read_text()) for path in scripts}
    assert {name: found for name, found in problems.items() if found} == {}


def test_the_lua_rules_catch_a_spelled_state_and_a_late_argv() -> None:
    # The check above would pass on anything if it could not see these: the shape of the scripts before the rule.
    before = "local t = redis.call('HGET', KEYS[1], F.state)\nif t == 'running' then\n  return ARGV[1]\nend"
    assert lua_problems(before) == [
        "spells the state 'running'",
        "line 1 uses KEYS in more than a local's name: local t = redis.call('HGET', KEYS[1], F.state)",
        "line 3 reads ARGV below the header block:   return ARGV[1]",
    ]
    skipped = "local a = KEYS[1]\nlocal b = ARGV[2]  -- 'queued' in a comment is fine\nreturn a"
    assert lua_problems(skipped) == ["names ARGV [2]: each of 1..n once"]


def test_a_claim_of_a_record_with_a_bad_number_writes_nothing(lifecycle: Lifecycle) -> None:
    key = lifecycle.keys.task("r1")
    lifecycle.connection.hset(key, "attempts", "many")
    before = lifecycle.connection.hgetall(key)
    refused = lifecycle.claim("r1", JOB, "worker-a")
    assert isinstance(refused, ClaimRefused) and refused.reason == "invalid" and "attempts" in refused.state
    assert lifecycle.connection.hgetall(key) == before
    assert lifecycle.connection.zcard(lifecycle.keys.inflight) == 0


def test_a_call_that_finds_every_promise_overdue_holds_reaping_off_for_the_longest_interval(
    lifecycle: Lifecycle,
) -> None:
    assert isinstance(lifecycle.claim("r1", JOB, "worker-a"), Claim)  # an attempt whose heartbeats the stall held up
    first = lifecycle.beat(within=2)
    assert not first.in_grace
    # As if Redis had been stopped for 10 s since that call promised the next within 2 s.
    lifecycle.connection.hset(lifecycle.keys.clock, "due", first.now - 10)
    after = lifecycle.beat()
    assert after.in_grace and after.grace_until is not None and after.grace_until >= after.now + 2


def test_a_stall_holds_reaping_off_once_not_at_every_later_call_that_promises_nothing(lifecycle: Lifecycle) -> None:
    # Producer.reap() promises no next call (within=0). With every worker gone (kill -9 of the fleet), the promise the
    # last worker broke stayed broken, so each reap() found it overdue and granted a fresh grace: the producer's reaps
    # never judged a deadline, however long it went on calling them.
    assert isinstance(lifecycle.claim("r1", JOB, "worker-a"), Claim)
    first = lifecycle.beat(within=2)
    lifecycle.connection.hset(lifecycle.keys.clock, "due", first.now - 10)
    assert lifecycle.beat().in_grace  # the stall (or the fleet's death, which the clock cannot tell apart)
    lifecycle.connection.hset(lifecycle.keys.clock, "grace_until", first.now - 1)  # as if that grace had run out
    assert not lifecycle.beat().in_grace


def test_the_first_call_after_every_worker_stopped_with_nothing_in_flight_is_no_stall(lifecycle: Lifecycle) -> None:
    # A fleet that stopped cleanly (a restart, a deploy) broke its promises, but no attempt's deadline could have
    # passed unseen: the next worker's first pass neither waits nor logs that Redis was stalled.
    first = lifecycle.beat(within=2)
    lifecycle.connection.hset(lifecycle.keys.clock, "due", first.now - 10)
    assert not lifecycle.beat(within=2).in_grace


def test_a_heartbeat_counts_from_when_it_reaches_redis(lifecycle: Lifecycle) -> None:
    claim = lifecycle.claim("r1", JOB, "worker-a")
    assert isinstance(claim, Claim)
    member = f"r1|{claim.attempt}"
    clock = lifecycle.beat({member: 30.0, "gone|1": 30.0})
    deadline = lifecycle.connection.zscore(lifecycle.keys.inflight, member)
    assert deadline is not None and abs(deadline - (clock.now + 30)) < 0.01
    assert lifecycle.connection.zscore(lifecycle.keys.inflight, "gone|1") is None  # never re-added


def test_malformed_job_hashes_are_judged_one_by_one(lifecycle: Lifecycle) -> None:
    connection = lifecycle.connection
    good = dict(connection.hgetall(Keys.rq_job(JOB)))
    connection.hset(Keys.rq_job("bogus"), mapping={**good, b"status": b"bogus"})
    connection.hset(Keys.rq_job("foreign"), mapping={**good, b"data": b"not rollq"})
    found = read_rollq_jobs(connection, ["bogus", JOB, "foreign", "absent"])
    assert isinstance(found["bogus"], InvalidTaskError) and isinstance(found["foreign"], InvalidTaskError)
    assert found["absent"] is None
    assert not isinstance(found[JOB], InvalidTaskError) and found[JOB] is not None and found[JOB].id == JOB


def test_a_corrupt_stats_counter_is_left_alone_and_the_rollout_still_published(lifecycle: Lifecycle) -> None:
    # finish.lua adds to its counters with redis.pcall (one command each, issue 24): a value that is not a number
    # must neither stop the publication half way nor be overwritten.
    stats = lifecycle.keys.stats
    assert isinstance(lifecycle.claim("r1", JOB, "worker-a"), Claim)
    lifecycle.connection.hset(stats, mapping={"succeeded:": "twelve", StatsField.DURATION_SUM: "lots"})
    reply = lifecycle.finish(
        Finish(
            rollout_id="r1",
            attempt=1,
            rollout_json="{}",
            status=RolloutStatus.SUCCEEDED,
            results_maxlen=100,
            dead_letter=False,
            now=time.time(),
            duration=1.5,
        )
    )
    assert isinstance(reply, Published)
    assert lifecycle.connection.hget(lifecycle.keys.task("r1"), "state") == TaskState.SUCCEEDED.value.encode()
    counters = lifecycle.connection.hgetall(stats)
    assert counters[b"succeeded:"] == b"twelve" and counters[StatsField.DURATION_SUM.encode()] == b"lots"
    assert counters[f"{DURATION_PREFIX}{duration_bucket(1.5)}".encode()] == b"1"


def test_reading_rollq_jobs_costs_one_command_a_job(redis_server, namespace) -> None:  # type: ignore[no-untyped-def]
    # The take-ahead read of every dequeued job (issue 24): its HGETALL only, no SMEMBERS of a dependencies set.
    lc = Lifecycle(connect(redis_server.url), Keys(namespace))
    tasks = [Task(rollout_id=f"r{i}", input={}, create_time=time.time(), num_claims=0) for i in range(5)]
    lc.enqueue_many([(t, t.model_dump_json()) for t in tasks], RolloutPolicy())
    ids = [lc.keys.job_id(t.rollout_id) for t in tasks]
    before = lc.connection.info("commandstats")
    jobs = read_rollq_jobs(lc.connection, ids)
    after = lc.connection.info("commandstats")
    calls = {k: v["calls"] - before.get(k, {}).get("calls", 0) for k, v in after.items() if k != "cmdstat_info"}
    assert all(job is not None and not isinstance(job, Exception) for job in jobs.values())
    assert {k: v for k, v in calls.items() if v} == {"cmdstat_hgetall": 5}


def test_a_job_given_its_queues_registries_reads_those_instead_of_building_new_ones() -> None:
    # RQ 2.12 builds a registry (and resolves its serializer, ~12 us) at every read of these properties; a worker
    # gives each job it runs one shared set per queue (issue 24).
    connection = connect(f"memory://{uuid.uuid4().hex}")
    job = RollqJob.create(ROLLOUT_FUNC, args=["r1"], connection=connection, origin="q", serializer=JSONSerializer)
    fresh = (job.started_job_registry, job.finished_job_registry, job.failed_job_registry)
    assert fresh[0] is not job.started_job_registry  # RQ's own: a new object each time
    shared = JobRegistries.of(job)
    assert shared.serve(job) and (shared.started, shared.finished, shared.failed) == fresh
    assert [type(r) for r in (shared.started, shared.finished, shared.failed)] == [type(r) for r in fresh]
    job.shared_registries = shared
    assert job.started_job_registry is shared.started
    assert job.finished_job_registry is shared.finished
    assert job.failed_job_registry is shared.failed
    other = RollqJob.create(ROLLOUT_FUNC, args=["r2"], connection=connection, origin="other", serializer=JSONSerializer)
    assert not shared.serve(other)


def _claimed_lifecycle(url: str, namespace: str, n: int) -> Lifecycle:
    lc = Lifecycle(connect(url), Keys(namespace))
    tasks = [Task(rollout_id=f"r{i}", input={}, create_time=time.time(), num_claims=0) for i in range(n)]
    lc.enqueue_many([(t, t.model_dump_json()) for t in tasks], RolloutPolicy())
    for t in tasks:
        assert isinstance(lc.claim(t.rollout_id, lc.keys.job_id(t.rollout_id), "worker-a"), Claim)
    return lc


def _finish(rollout_id: str, duration: float) -> Finish:
    return Finish(
        rollout_id=rollout_id,
        attempt=1,
        rollout_json=f'{{"rollout_id": "{rollout_id}"}}',
        status=RolloutStatus.SUCCEEDED,
        results_maxlen=100,
        dead_letter=False,
        now=time.time(),
        duration=duration,
    )


def _calls_of(lc: Lifecycle, action: Callable[[], object]) -> dict[str, int]:
    before = lc.connection.info("commandstats")
    action()
    after = lc.connection.info("commandstats")
    calls = {k: v["calls"] - before.get(k, {}).get("calls", 0) for k, v in after.items() if k != "cmdstat_info"}
    return {k.removeprefix("cmdstat_"): v for k, v in calls.items() if v}


def test_a_batch_of_finishes_publishes_each_and_adds_to_each_stats_counter_once(redis_server, namespace) -> None:  # type: ignore[no-untyped-def]
    # One finish.lua call for a worker's batch of ended rollouts (issue 24): the counters are summed in the script
    # and each is added to once, the results stream is measured (XLEN) once.
    lc = _claimed_lifecycle(redis_server.url, namespace, 4)
    finishes = [_finish(f"r{i}", 1.0 + i) for i in range(4)]
    replies: list[Any] = []
    calls = _calls_of(
        lc, lambda: replies.extend(lc.read_finishes(lc.run_pipelined([lc.finish_many_call(finishes)])[0]))
    )
    assert all(isinstance(r, Published) for r in replies) and len({r.entry_id for r in replies}) == 4
    counters = lc.connection.hgetall(lc.keys.stats)
    assert counters[b"succeeded:"] == b"4"
    assert float(counters[StatsField.DURATION_SUM.encode()]) == pytest.approx(1.0 + 2.0 + 3.0 + 4.0)
    buckets = {duration_bucket(f.duration or 0) for f in finishes}
    assert sum(int(counters[f"{DURATION_PREFIX}{b}".encode()]) for b in buckets) == 4
    # succeeded: and each duration bucket once (the new stream's byte count is set, with an HSET); the sum once.
    assert calls["hincrby"] == 1 + len(buckets) and calls["hincrbyfloat"] == 1
    assert calls["xlen"] == 1
    # Each rollout has its summary, in the results' order (the dashboard reads them).
    summaries = lc.connection.xrange(lc.keys.summaries)
    assert [s[1][b"result"].decode() for s in summaries] == [r.entry_id for r in replies]
    for i in range(4):
        assert lc.connection.hget(lc.keys.task(f"r{i}"), "state") == TaskState.SUCCEEDED.value.encode()


def test_a_task_whose_part_of_a_finish_batch_fails_gets_the_error_and_the_others_are_published(
    redis_server,  # type: ignore[no-untyped-def]
    namespace,
) -> None:
    lc = _claimed_lifecycle(redis_server.url, namespace, 3)
    lc.connection.delete(lc.keys.task("r1"))
    lc.connection.set(lc.keys.task("r1"), "not a hash")  # its HMGET fails: WRONGTYPE
    replies = lc.read_finishes(lc.run_pipelined([lc.finish_many_call([_finish(f"r{i}", 1.0) for i in range(3)])])[0])
    assert isinstance(replies[0], Published) and isinstance(replies[2], Published)
    assert isinstance(replies[1], redis.ResponseError) and "WRONGTYPE" in str(replies[1])
    assert lc.connection.xlen(lc.keys.results) == 2
    assert lc.connection.hget(lc.keys.stats, "succeeded:") == b"2"


def test_a_finish_batch_refused_for_memory_fails_whole_and_writes_nothing(own_redis) -> None:  # type: ignore[no-untyped-def]
    # Redis refuses a script's first write when full (OOM); the whole call must fail as one (nothing was written),
    # so that the caller sends it again (Lifecycle.settle_all) instead of reading a refusal as a task's own error.
    server = own_redis()
    lc = _claimed_lifecycle(server.url, "full", 2)
    call = lc.finish_many_call([_finish("r0", 1.0), _finish("r1", 1.0)])
    lc.connection.script_load(call.script.script)
    client = server.client()
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)
    try:
        pipe = lc.connection.pipeline(transaction=False)
        call.queue(pipe)
        (raw,) = pipe.execute(raise_on_error=False)
    finally:
        client.config_set("maxmemory", 0)
    assert isinstance(raw, redis.exceptions.OutOfMemoryError)
    assert lc.connection.xlen(lc.keys.results) == 0
    assert lc.connection.hget(lc.keys.task("r0"), "state") == TaskState.RUNNING.value.encode()


def _enqueue(lc: Lifecycle, rollout_id: str) -> Enqueued:
    task = Task(rollout_id=rollout_id, input={}, create_time=time.time(), num_claims=0)
    (got,) = lc.enqueue_many([(task, task.model_dump_json())], RolloutPolicy())
    return got


def test_enqueueing_a_new_task_checks_its_record_and_job_with_one_command(redis_server, namespace) -> None:  # type: ignore[no-untyped-def]
    # One EXISTS of both keys for the usual case (issue 24: an EXISTS and an HGET were two).
    lc = Lifecycle(connect(redis_server.url), Keys(namespace))
    _enqueue(lc, "warm")  # loads the script
    calls = _calls_of(lc, lambda: _enqueue(lc, "new"))
    assert calls.get("exists") == 1 and "hget" not in calls
    assert lc.connection.hget(lc.keys.task("new"), "state") == TaskState.QUEUED.value.encode()


def test_a_job_id_holding_another_jobs_hash_is_not_overwritten(redis_server, namespace) -> None:  # type: ignore[no-untyped-def]
    lc = Lifecycle(connect(redis_server.url), Keys(namespace))
    job_key = lc.keys.rq_job(lc.keys.job_id("taken"))
    lc.connection.hset(job_key, mapping={"data": "someone else's", "status": "queued"})
    assert _enqueue(lc, "taken") is Enqueued.JOB_TAKEN
    assert lc.connection.hget(job_key, "data") == b"someone else's"
    assert not lc.connection.exists(lc.keys.task("taken"))


def test_a_rollout_id_whose_record_expired_but_job_is_kept_is_queued_again(redis_server, namespace) -> None:  # type: ignore[no-untyped-def]
    # A succeeded task's record expires after keep_seconds, its finished job only after result_ttl: the same
    # rollout id queues again over its own old job.
    lc = Lifecycle(connect(redis_server.url), Keys(namespace))
    assert _enqueue(lc, "again") is Enqueued.QUEUED
    lc.connection.delete(lc.keys.task("again"))
    assert _enqueue(lc, "again") is Enqueued.QUEUED
    assert _enqueue(lc, "again") is Enqueued.KNOWN


def test_a_pack_split_queues_each_waiting_task_as_its_own_job_at_the_front_all_or_nothing() -> None:
    lc = Lifecycle(connect(f"memory://{uuid.uuid4().hex}"), Keys("lc"))
    k, r = lc.keys, lc.connection
    tasks = [Task(rollout_id=f"p{i}", input={}, create_time=time.time(), num_claims=0) for i in range(3)]
    policy = RolloutPolicy()
    lc.enqueue_many([(t, t.model_dump_json()) for t in tasks], policy, tasks_per_job=3)
    lc.enqueue_many([(Task(rollout_id="later", input={}), "{}")], policy)
    pack = r.lmove(k.rq_queue, k.rq_intermediate, "LEFT", "RIGHT").decode()
    r.hset(k.task("p1"), "state", TaskState.CANCELLED.value)  # the middle task no longer waits for the pack
    pairs = [(t, policy) for t in tasks]

    r.hset(k.rq_job(k.job_id("p2")), "data", b"another job's")
    assert lc.split(pack, pairs) == -1  # nothing written
    assert r.lrange(k.rq_intermediate, 0, -1) == [pack.encode()] and r.exists(k.rq_job(pack))
    assert r.hget(k.task("p0"), "job") == pack.encode() and r.llen(k.rq_queue) == 1

    r.delete(k.rq_job(k.job_id("p2")))
    assert lc.split(pack, pairs) == 2
    assert [j.decode() for j in r.lrange(k.rq_queue, 0, -1)] == [
        k.job_id("p0"),
        k.job_id("p2"),
        k.job_id("later"),
    ]
    assert [r.hget(k.task(rid), "job").decode() for rid in ("p0", "p1", "p2")] == [
        k.job_id("p0"),
        pack,
        k.job_id("p2"),
    ]
    assert r.llen(k.rq_intermediate) == 0 and not r.exists(k.rq_job(pack))
    jobs = read_rollq_jobs(r, [k.job_id("p0"), k.job_id("p2")])
    assert [j.args for j in jobs.values()] == [["p0"], ["p2"]]  # type: ignore[union-attr]
    assert lc.claim("p0", k.job_id("p0"), "w").attempt == 1  # type: ignore[union-attr]
    assert lc.split(pack, pairs) == -2  # no longer in the intermediate list: nothing to split


DAMAGEABLE = ["summaries", "inflight", "dead_letter", "stats", "resources_refs", "queued_tasks", "results_trim"]
SHARED = {"summaries", "stats", "resources_refs", "results_trim"}
CHECKED = {  # the keys each script writes besides the results stream and the task record
    "finish": SHARED | {"inflight", "dead_letter"},
    "dead-letter": SHARED | {"inflight", "dead_letter"},
    "cancel": SHARED | {"inflight", "queued_tasks"},
    "reject": SHARED | {"dead_letter", "queued_tasks"},
}


def _end_with(lc: Lifecycle, how: str, rid: str) -> object:
    """End task ``rid`` (claimed unless ``how`` is a queued task's ending) the way ``how`` says; the script's reply."""
    now = time.time()
    if how == "cancel":
        keys, args = cancel_call(lc.keys, rid, results_maxlen=100, now=now, results_max_bytes=10**9)
        return parse_cancel(rid, lc.connection.eval(cancel_script_source(), len(keys), *keys, *args))  # type: ignore[arg-type]
    if how == "reject":
        lc.connection.hset(lc.keys.task(rid), "state", "weird")
        return lc.reject(rid, lc.keys.job_id(rid), f'{{"rollout_id": "{rid}"}}', results_maxlen=100, now=now)
    finish = _finish(rid, 1.0)
    return lc.finish(replace(finish, status=RolloutStatus.FAILED, dead_letter=True) if how == "dead-letter" else finish)


@pytest.mark.parametrize("damaged", DAMAGEABLE)
@pytest.mark.parametrize("how", ["finish", "dead-letter", "cancel", "reject"])
def test_a_namespace_key_of_another_type_is_skipped_and_named_and_the_task_ends_once(  # type: ignore[no-untyped-def]
    redis_server, namespace, caplog, how, damaged
) -> None:
    # An outside audit: finish/cancel/reject wrote the summaries stream, the in-flight set, the dead-letter set and
    # the queued-task index after their XADD; one of them holding a string failed the script there (Redis does not
    # undo it): the rollout was published with its task still running (a cancelled one out of the in-flight set,
    # never reaped) or still waiting for its job, or ended but not counted, and the caller got a raw WRONGTYPE.
    lc = (
        _claimed_lifecycle(redis_server.url, namespace, 1)
        if how != "reject"
        else _queued_lifecycle(redis_server.url, namespace)
    )
    key = getattr(lc.keys, damaged)
    lc.connection.delete(key)
    lc.connection.set(key, "junk")
    caplog.set_level(logging.ERROR)
    reply = _end_with(lc, how, "r0")
    assert not isinstance(reply, Exception), reply
    assert lc.connection.xlen(lc.keys.results) == 1
    state = {"finish": b"succeeded", "cancel": b"cancelled"}.get(how, b"failed")
    assert lc.connection.hget(lc.keys.task("r0"), "state") == state
    assert lc.connection.get(key) == b"junk"  # left for whoever wrote it to explain
    if damaged in CHECKED[how]:
        assert f"{key} is a string, not a " in caplog.text, caplog.text
    if damaged != "stats":  # counted once
        assert int(lc.connection.hget(lc.keys.stats, f"{state.decode()}:") or 0) == 1
    if damaged != "summaries":
        assert lc.connection.xlen(lc.keys.summaries) == 1
    # A second call (a reply lost, a reaper after the worker) publishes nothing more.
    again = _end_with(lc, how, "r0") if how != "reject" else None
    assert lc.connection.xlen(lc.keys.results) == 1, again


def test_a_results_stream_of_another_type_refuses_the_finish_naming_it_with_nothing_written(  # type: ignore[no-untyped-def]
    redis_server, namespace
) -> None:
    lc = _claimed_lifecycle(redis_server.url, namespace, 1)
    lc.connection.delete(lc.keys.results)
    lc.connection.set(lc.keys.results, "junk")
    with pytest.raises(redis.ResponseError, match=re.escape(f"the results stream {lc.keys.results} is a string")):
        lc.finish(_finish("r0", 1.0))
    assert lc.connection.hget(lc.keys.task("r0"), "state") == b"running"
    assert lc.connection.zcard(lc.keys.inflight) == 1


def _queued_lifecycle(url: str, namespace: str) -> Lifecycle:
    lc = Lifecycle(connect(url), Keys(namespace))
    task = Task(rollout_id="r0", input={}, create_time=time.time(), num_claims=0)
    lc.enqueue_many([(task, task.model_dump_json())], RolloutPolicy())
    return lc


def _snapshot(connection: redis.Redis) -> dict[bytes, bytes | None]:
    """Every persistent key of the test's Redis with its DUMP: equal before and after a call that wrote nothing.
    Keys with a TTL are left out: the shared server holds earlier tests' expiring keys (audit locks, RQ's results),
    which may expire between the two snapshots (a CI run failed so), and none of the calls checked writes one."""
    keys = list(connection.scan_iter(count=1000))
    pipe = connection.pipeline(transaction=False)
    for key in keys:
        pipe.pttl(key)
        pipe.dump(key)
    replies = pipe.execute()
    return {key: dump for key, ttl, dump in zip(keys, replies[::2], replies[1::2], strict=True) if ttl == -1}


@pytest.mark.parametrize(("damaged", "kind"), [("inflight", "zset"), ("resources_latest", "string")])
def test_a_claim_with_an_essential_key_of_another_type_is_refused_naming_it_with_nothing_written(  # type: ignore[no-untyped-def]
    redis_server, namespace, damaged, kind
) -> None:
    # An outside audit: claim.lua marked the task running and then failed at the ZADD to an in-flight set holding a
    # string: the task was left running out of the in-flight set, where no reaper looks, and never ended. (A resources
    # pointer of another type failed likewise, after both writes.) Without either key a claim cannot be made safely:
    # it is refused whole, the task left queued for a later job (the lost-job sweep issues one: see claim.lua).
    lc = _queued_lifecycle(redis_server.url, namespace)
    key = getattr(lc.keys, damaged)
    lc.connection.delete(key)
    if kind == "zset":
        lc.connection.set(key, "junk")
    else:
        lc.connection.hset(key, "junk", "1")
    before = _snapshot(lc.connection)
    want = "zset" if kind == "zset" else "string"
    with pytest.raises(
        redis.ResponseError, match=re.escape(f"{key} is a {'string' if kind == 'zset' else 'hash'}, not a {want}")
    ):
        lc.claim("r0", lc.keys.job_id("r0"), "worker-a")
    assert _snapshot(lc.connection) == before
    lc.connection.delete(key)  # repaired: the same job claims it
    claim = lc.claim("r0", lc.keys.job_id("r0"), "worker-a")
    assert isinstance(claim, Claim) and claim.attempt == 1, claim
    assert lc.connection.zcard(lc.keys.inflight) == 1


def test_a_claim_with_a_queued_task_index_of_another_type_skips_it_and_names_it(  # type: ignore[no-untyped-def]
    redis_server, namespace, caplog
) -> None:
    lc = _queued_lifecycle(redis_server.url, namespace)
    lc.connection.delete(lc.keys.queued_tasks)
    lc.connection.set(lc.keys.queued_tasks, "junk")
    caplog.set_level(logging.ERROR)
    claim = lc.claim("r0", lc.keys.job_id("r0"), "worker-a")
    assert isinstance(claim, Claim) and claim.attempt == 1, claim
    assert lc.connection.hget(lc.keys.task("r0"), "state") == b"running"
    assert lc.connection.zcard(lc.keys.inflight) == 1  # where the reaper finds it
    assert lc.connection.get(lc.keys.queued_tasks) == b"junk"
    assert f"the queued-task index {lc.keys.queued_tasks} is a string, not a set" in caplog.text, caplog.text


def _task(rollout_id: str) -> Task:
    return Task(rollout_id=rollout_id, input={}, create_time=time.time(), num_claims=0)


_DAMAGED: list[tuple[redis.Redis, str]] = []


def _damage(connection: redis.Redis, key: str) -> None:
    """Replace ``key`` with a string; repaired (deleted) after the test by :func:`_repair_damaged`."""
    _DAMAGED.append((connection, key))
    connection.delete(key)
    connection.set(key, "junk")


@pytest.fixture(autouse=True)
def _repair_damaged() -> Iterator[None]:
    """Delete the keys a test damaged: the session's Redis is shared, and an RQ queue left a string (listed in
    rq:queues) made rq-dashboard's queue list answer 500 for a later test of another file (a CI run failed so)."""
    yield
    while _DAMAGED:
        connection, key = _DAMAGED.pop()
        connection.delete(key)


@pytest.fixture
def cleanup(redis_server):  # type: ignore[no-untyped-def]
    """Keys to delete after the test: rq:queues is shared by every namespace of the session's Redis."""
    keys: list[str] = []
    yield keys
    if keys:
        connect(redis_server.url).delete(*keys)


@pytest.fixture(autouse=True)
def _log_damaged_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees its damaged keys logged: a process logs the same text once a minute (rq:queues is shared)."""
    monkeypatch.setattr(replies, "_damaged_logged", {})


def _dead_lettered(url: str, namespace: str) -> Lifecycle:
    lc = _claimed_lifecycle(url, namespace, 1)
    assert isinstance(lc.finish(replace(_finish("r0", 1.0), status=RolloutStatus.FAILED, dead_letter=True)), Published)
    return lc


def _requeue(lc: Lifecycle) -> object:
    return lc.requeue(_task("r0"), 1, RolloutPolicy(), "retry")


def _revive(lc: Lifecycle) -> object:
    return lc.revive(_task("r0"), RolloutPolicy(), 1)


def _key(lc: Lifecycle, name: str) -> str:
    """The key ``name`` of ``lc``'s namespace; ``new_job`` the RQ job a requeue or revive of r0 writes."""
    if name == "new_job":
        return lc.keys.rq_job(lc.keys.job_id("r0", after_attempt=1))
    if name == "task":
        return lc.keys.task("r0")
    key = getattr(lc.keys, name)
    return key() if callable(key) else key  # type: ignore[no-any-return]


@pytest.mark.parametrize("reason", ["retry", "released", "unresponsive"])
def test_a_requeue_of_a_task_whose_record_is_gone_answers_task_missing_not_superseded(  # type: ignore[no-untyped-def]
    redis_server, namespace, reason
) -> None:
    # An operator's audit: requeue.lua answered 'superseded' for a task record Redis lost (a restart without
    # persistence, a flush, an eviction), as if a newer attempt had taken over. It writes nothing either way; the
    # word tells the caller which it was, as finish.lua's 'missing' does.
    lc = _claimed_lifecycle(redis_server.url, namespace, 1)
    lc.connection.delete(lc.keys.task("r0"))
    queued = lc.connection.llen(lc.keys.rq_queue)
    stale_before = time.time() + 60 if reason == "unresponsive" else None
    reply = lc.requeue(_task("r0"), 1, RolloutPolicy(), reason, stale_before=stale_before)
    assert reply == TaskMissing(), reply
    assert not lc.connection.exists(lc.keys.task("r0"))
    assert not lc.connection.exists(lc.keys.rq_job(lc.keys.job_id("r0", after_attempt=1)))
    assert lc.connection.llen(lc.keys.rq_queue) == queued
    # A record that is there but on another attempt is still superseded.
    lc.connection.hset(lc.keys.task("r0"), mapping={"state": "running", "attempt": "2"})
    assert lc.requeue(_task("r0"), 1, RolloutPolicy(), reason, stale_before=stale_before) == Superseded()


REQUEUE_OR_REVIVE = {"requeue": (_claimed_lifecycle, _requeue), "revive": (_dead_lettered, _revive)}


@pytest.mark.parametrize(
    ("how", "damaged", "what"),
    [
        ("requeue", "queued_tasks", "queued-task index"),
        ("requeue", "rq_queues", "RQ queue set"),
        ("requeue", "inflight", "in-flight set"),
        ("requeue", "stats", "stats hash"),
        ("revive", "queued_tasks", "queued-task index"),
        ("revive", "rq_queues", "RQ queue set"),
        ("revive", "resources_refs", "resources refs hash"),
    ],
)
def test_a_requeue_or_revive_skips_an_auxiliary_key_of_another_type_names_it_and_queues_the_task(  # type: ignore[no-untyped-def]
    redis_server, namespace, caplog, cleanup, how, damaged, what
) -> None:
    # An outside audit: requeue.lua ZREMed the attempt from the in-flight set and then failed at the SADD to a queued-
    # task index holding a string: the task was left running out of the in-flight set, never reaped, never ended.
    # revive.lua likewise left a task queued with no job pushed and in no index, for no sweep to find.
    setup, call = REQUEUE_OR_REVIVE[how]
    lc = setup(redis_server.url, namespace, 1) if how == "requeue" else setup(redis_server.url, namespace)
    key = _key(lc, damaged)
    cleanup.append(key)
    _damage(lc.connection, key)
    caplog.set_level(logging.ERROR)
    assert call(lc) in (Requeued(), True)
    assert lc.connection.hget(lc.keys.task("r0"), "state") == b"queued"
    assert lc.connection.lrange(lc.keys.rq_queue, -1, -1) == [lc.keys.job_id("r0", after_attempt=1).encode()]
    assert lc.connection.get(key) == b"junk"
    assert f"the {what} {key} is a string, not a " in caplog.text, caplog.text
    if damaged != "inflight":
        assert lc.connection.zcard(lc.keys.inflight) == 0


@pytest.mark.parametrize(
    ("how", "damaged", "what"),
    [
        ("requeue", "rq_queue", "RQ queue"),
        ("requeue", "new_job", "RQ job hash"),
        ("revive", "rq_queue", "RQ queue"),
        ("revive", "new_job", "RQ job hash"),
        ("revive", "task", "task record"),
        ("revive", "dead_letter", "dead-letter set"),
    ],
)
def test_a_requeue_or_revive_with_an_essential_key_of_another_type_is_refused_naming_it_with_nothing_written(  # type: ignore[no-untyped-def]
    redis_server, namespace, cleanup, how, damaged, what
) -> None:
    # An outside audit: a requeue's or a revive's RPUSH to an RQ queue holding a string failed after the task was
    # marked queued with its new job written: the job was on no list (the lost-job sweep failed on the queue too),
    # and a revive's HGET of a task key holding a string failed after the dead-letter entry was removed.
    setup, call = REQUEUE_OR_REVIVE[how]
    lc = setup(redis_server.url, namespace, 1) if how == "requeue" else setup(redis_server.url, namespace)
    key = _key(lc, damaged)
    cleanup.append(key)
    _damage(lc.connection, key)
    before = _snapshot(lc.connection)
    with pytest.raises(redis.ResponseError, match=re.escape(f"the {what} {key} is a string, not a ")) as refused:
        call(lc)
    assert _snapshot(lc.connection) == before
    # Not Redis's WRONGTYPE, on which a reaper drops the in-flight member (a task key holding no hash): it tries again.
    assert not wrong_type(refused.value)


def _enqueue_two(lc: Lifecycle) -> list[Enqueued]:
    tasks = [_task("r0"), _task("r1")]
    return lc.enqueue_many([(t, t.model_dump_json()) for t in tasks], RolloutPolicy())


@pytest.mark.parametrize(("damaged", "what"), [("queued_tasks", "queued-task index"), ("rq_queues", "RQ queue set")])
def test_an_enqueue_skips_an_auxiliary_key_of_another_type_names_it_and_queues_the_tasks(  # type: ignore[no-untyped-def]
    redis_server, namespace, caplog, cleanup, damaged, what
) -> None:
    # An outside audit: enqueue.lua wrote each task's record and job and then failed at the SADD to a queued-task
    # index holding a string: the tasks had records but no job on RQ's queue, and enqueueing them again answered
    # 'known' (their records exist): never run.
    lc = Lifecycle(connect(redis_server.url), Keys(namespace))
    key = _key(lc, damaged)
    cleanup.append(key)
    _damage(lc.connection, key)
    caplog.set_level(logging.ERROR)
    assert _enqueue_two(lc) == [Enqueued.QUEUED] * 2
    assert lc.connection.lrange(lc.keys.rq_queue, 0, -1) == [lc.keys.job_id(r).encode() for r in ("r0", "r1")]
    assert lc.connection.get(key) == b"junk"
    assert f"the {what} {key} is a string, not a set" in caplog.text, caplog.text


def test_an_enqueue_to_an_rq_queue_of_another_type_is_refused_naming_it_with_nothing_written(  # type: ignore[no-untyped-def]
    redis_server, namespace
) -> None:
    # The RPUSH came last: the tasks were written and indexed with their jobs on none of RQ's lists.
    lc = Lifecycle(connect(redis_server.url), Keys(namespace))
    _damage(lc.connection, lc.keys.rq_queue)
    before = _snapshot(lc.connection)
    with pytest.raises(
        redis.ResponseError, match=re.escape(f"the RQ queue {lc.keys.rq_queue} is a string, not a list")
    ):
        _enqueue_two(lc)
    assert _snapshot(lc.connection) == before


def test_an_enqueue_whose_job_key_holds_another_type_answers_job_taken_for_that_task_only(  # type: ignore[no-untyped-def]
    redis_server, namespace, cleanup
) -> None:
    # The HGET of r1's job key (a string) failed after r0's record and job were written, before any push or index:
    # r0 was left with a job on no list and in no index, and enqueueing it again answered 'known'.
    lc = Lifecycle(connect(redis_server.url), Keys(namespace))
    cleanup.append(lc.keys.rq_job(lc.keys.job_id("r1")))  # RQ's job keys live outside the namespace
    _damage(lc.connection, cleanup[-1])
    assert _enqueue_two(lc) == [Enqueued.QUEUED, Enqueued.JOB_TAKEN]
    assert lc.connection.lrange(lc.keys.rq_queue, 0, -1) == [lc.keys.job_id("r0").encode()]
    assert lc.connection.smembers(lc.keys.queued_tasks) == {lc.keys.task("r0").encode()}
    assert not lc.connection.exists(lc.keys.task("r1"))


def _vanished(url: str, namespace: str) -> Lifecycle:
    """r0 queued, its RQ job deleted (rq-dashboard's Delete): the lost-job sweep's reissue.lua queues it again."""
    lc = _queued_lifecycle(url, namespace)
    lc.connection.delete(lc.keys.rq_job(lc.keys.job_id("r0")), lc.keys.rq_queue)
    return lc


def _reissue(lc: Lifecycle) -> object:
    return lc.reissue(_task("r0"), RolloutPolicy(), lc.keys.job_id("r0"), 0, time.time(), deep=False)


def _stranded(url: str, namespace: str) -> Lifecycle:
    """r0 queued, its RQ job left in RQ's intermediate list since a pass marked it a minute ago."""
    lc = _queued_lifecycle(url, namespace)
    jid = lc.keys.job_id("r0")
    lc.connection.lmove(lc.keys.rq_queue, lc.keys.rq_intermediate, "LEFT", "RIGHT")
    lc.connection.set(lc.keys.stranded(jid), time.time() - 60)
    return lc


def _restore(lc: Lifecycle) -> object:
    return lc.restore("r0", lc.keys.job_id("r0"), time.time())


def _taken_pack(url: str, namespace: str) -> Lifecycle:
    """r0 and r1 queued as one pack, taken off the queue into RQ's intermediate list (the AL 0.1 gateway)."""
    lc = Lifecycle(connect(url), Keys(namespace))
    tasks = [_task("r0"), _task("r1")]
    lc.enqueue_many([(t, t.model_dump_json()) for t in tasks], RolloutPolicy(), tasks_per_job=2)
    lc.connection.lmove(lc.keys.rq_queue, lc.keys.rq_intermediate, "LEFT", "RIGHT")
    return lc


def _split(lc: Lifecycle) -> object:
    (pack,) = lc.connection.lrange(lc.keys.rq_intermediate, 0, -1)  # type: ignore[misc]
    return lc.split(pack.decode(), [(_task("r0"), RolloutPolicy()), (_task("r1"), RolloutPolicy())])


def _beat(lc: Lifecycle) -> object:
    return lc.beat({"r0|1": 30.0}, within=5)


QUEUE_AGAIN: dict[str, tuple[Callable[[str, str], Lifecycle], Callable[[Lifecycle], object], object]] = {
    "reissue": (_vanished, _reissue, 1),
    "restore": (_stranded, _restore, True),
    "split": (_taken_pack, _split, 2),
}


@pytest.mark.parametrize(
    ("how", "damaged", "what"),
    [
        ("reissue", "rq_queue", "RQ queue"),
        ("restore", "rq_queue", "RQ queue"),
        ("split", "rq_queue", "RQ queue"),
    ],
)
def test_a_script_that_queues_a_job_again_refuses_an_essential_key_of_another_type_with_nothing_written(  # type: ignore[no-untyped-def]
    redis_server, namespace, cleanup, how, damaged, what
) -> None:
    # An outside audit: reissue.lua, restore.lua and split.lua pointed the task at its new job (or took the job off
    # RQ's intermediate list) and then failed at the push to an RQ queue holding a string: the job was on none of
    # RQ's lists, and a raw WRONGTYPE reached the reaper.
    setup, call, _ = QUEUE_AGAIN[how]
    lc = setup(redis_server.url, namespace)
    key = _key(lc, damaged)
    cleanup.append(key)
    _damage(lc.connection, key)
    before = _snapshot(lc.connection)
    with pytest.raises(redis.ResponseError, match=re.escape(f"the {what} {key} is a string, not a ")) as refused:
        call(lc)
    assert _snapshot(lc.connection) == before
    assert not wrong_type(refused.value)


@pytest.mark.parametrize("how", ["reissue", "restore", "split"])
@pytest.mark.parametrize(("damaged", "what"), [("rq_queues", "RQ queue set"), ("stats", "stats hash")])
def test_a_script_that_queues_a_job_again_skips_an_auxiliary_key_of_another_type_and_names_it(  # type: ignore[no-untyped-def]
    redis_server, namespace, caplog, cleanup, how, damaged, what
) -> None:
    setup, call, done = QUEUE_AGAIN[how]
    lc = setup(redis_server.url, namespace)
    key = _key(lc, damaged)
    cleanup.append(key)
    _damage(lc.connection, key)
    caplog.set_level(logging.ERROR)
    assert call(lc) == done
    assert lc.connection.llen(lc.keys.rq_queue) == (2 if how == "split" else 1)
    assert lc.connection.get(key) == b"junk"
    if how != "restore" or damaged == "stats":  # restore writes no RQ queue set
        assert f"the {what} {key} is a string, not a " in caplog.text, caplog.text


def test_a_beat_and_a_reaper_pass_skip_an_in_flight_set_of_another_type_and_name_it(  # type: ignore[no-untyped-def]
    redis_server, namespace, caplog
) -> None:
    # beat.lua wrote the clock and then failed at the ZADD to an in-flight set holding a string (a raw WRONGTYPE every
    # heartbeat); the reaper's pass then failed at its ZRANGEBYSCORE. The clock is kept, the set skipped and named.
    lc = _claimed_lifecycle(redis_server.url, namespace, 1)
    _damage(lc.connection, lc.keys.inflight)
    caplog.set_level(logging.ERROR)
    clock = _beat(lc)
    assert isinstance(clock, Clock) and lc.connection.hget(lc.keys.clock, "due") is not None
    assert lc.connection.get(lc.keys.inflight) == b"junk"
    assert f"the in-flight set {lc.keys.inflight} is a string, not a zset" in caplog.text, caplog.text
    assert reap(lc, results_maxlen=100) == ReapReport()


@pytest.mark.parametrize(
    ("damaged", "what"),
    [("rq_queue", "RQ queue"), ("rq_intermediate", "RQ intermediate list"), ("queued_tasks", "queued-task index")],
)
def test_a_reaper_pass_with_a_damaged_rq_list_or_index_still_judges_stale_attempts_and_names_the_key(  # type: ignore[no-untyped-def]
    redis_server, namespace, caplog, damaged, what
) -> None:
    # The pass put back stranded jobs (LRANGE of the intermediate list) and swept the queued tasks (SSCAN of the index,
    # LLEN of RQ's lists) before judging deadlines: a WRONGTYPE there failed the whole pass, every pass, so no stale
    # attempt was ever requeued or failed while the key was damaged.
    lc = Lifecycle(connect(redis_server.url), Keys(namespace))
    tasks = [_task("r0"), _task("r1")]  # r1 stays queued, for the sweep to look at
    lc.enqueue_many([(t, t.model_dump_json()) for t in tasks], RolloutPolicy(unresponsive_seconds=0.05, max_attempts=1))
    assert isinstance(lc.claim("r0", lc.keys.job_id("r0"), "gone"), Claim)
    key = _key(lc, damaged)
    _damage(lc.connection, key)
    time.sleep(0.1)
    caplog.set_level(logging.ERROR)
    assert reap(lc, results_maxlen=100).failed == 1
    assert lc.connection.hget(lc.keys.task("r0"), "state") == b"failed"
    assert f"the {what} {key} is a string, not a " in caplog.text, caplog.text


def test_a_quarantine_list_of_another_type_refuses_the_move_naming_it_with_nothing_written(  # type: ignore[no-untyped-def]
    redis_server, namespace
) -> None:
    # quarantine.lua took the job off RQ's list and then failed at the quarantine list holding a string: the job was
    # on no list at all, neither where RQ nor where an operator looks.
    lc = Lifecycle(connect(redis_server.url), Keys(namespace))
    lc.connection.rpush(lc.keys.rq_intermediate, "malformed")
    _damage(lc.connection, lc.keys.quarantine)
    before = _snapshot(lc.connection)
    with pytest.raises(redis.ResponseError, match=re.escape(f"the quarantine list {lc.keys.quarantine} is a string")):
        lc.quarantine(lc.keys.rq_intermediate, "malformed")
    assert _snapshot(lc.connection) == before


def test_a_reaper_pass_leaves_a_malformed_job_where_it_is_when_the_quarantine_list_is_damaged(  # type: ignore[no-untyped-def]
    redis_server, namespace, caplog
) -> None:
    lc = Lifecycle(connect(redis_server.url), Keys(namespace))
    lc.connection.hset(lc.keys.rq_job("malformed"), mapping={"status": "bogus"})
    lc.connection.rpush(lc.keys.rq_intermediate, "malformed")
    _damage(lc.connection, lc.keys.quarantine)
    caplog.set_level(logging.ERROR)
    assert reap(lc, results_maxlen=100).quarantined == 0  # the pass goes on
    assert lc.connection.lrange(lc.keys.rq_intermediate, 0, -1) == [b"malformed"]
    assert f"the quarantine list {lc.keys.quarantine} is a string" in caplog.text, caplog.text
