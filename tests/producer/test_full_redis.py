"""A producer against a Redis that refuses writes (``maxmemory`` reached, ``noeviction``), on a real redis-server:
a batch refused partway says which of its tasks were queued, so that a retry queues none twice (issue: the operator
audit's oom_partial.sh queued 5,000 tasks from a 3,000-line file), and a wait goes on reading (oom_wait.py: it
raised OutOfMemoryError from the reap it does to help the workers)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from rollq.models.contract import Rollout
from rollq.models.errors import EnqueueIncompleteError, RolloutTimeoutError
from rollq.models.policy import RolloutStatus, TaskState
from rollq.producer import Producer
from rollq.producer import results as results_module
from rollq.producer.aio import AsyncProducer
from rollq.store.connection import connect
from rollq.store.keys import TaskField
from rollq.store.replies import Claim
from rollq.store.transitions import Finish, Lifecycle
from tests.support.servers import RedisServer, free_port

pytestmark = pytest.mark.redis


@pytest.fixture
def server(own_redis: Any) -> Iterator[RedisServer]:
    """A redis-server of the test's own under ``noeviction`` (the policy rollq asks for), memory freed at the end."""
    server: RedisServer = own_redis()
    server.client().config_set("maxmemory-policy", "noeviction")
    yield server
    server.client().config_set("maxmemory", 0)


def _fill_after_first_chunk(monkeypatch: pytest.MonkeyPatch, producer: Producer, client: redis.Redis) -> None:
    """Make Redis full (``maxmemory 1``) once the producer's first enqueue transaction went through: its second is
    refused with OOM, as when a batch's first 2,000 tasks take the last memory Redis had."""
    real = producer.lifecycle.enqueue_many_after
    calls = 0

    def fill_then_enqueue(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        if calls:
            client.config_set("maxmemory", 1)
        calls += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(producer.lifecycle, "enqueue_many_after", fill_then_enqueue)


def _states(producer: Producer, rollout_ids: list[str]) -> set[bytes | None]:
    pipe = producer.connection.pipeline(transaction=False)
    for rid in rollout_ids:
        pipe.hget(producer.keys.task(rid), TaskField.STATE)
    return set(pipe.execute())


def test_a_batch_refused_after_its_first_chunk_raises_naming_the_tasks_it_queued(
    server: RedisServer, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: a plain OutOfMemoryError after ~20 s of retrying to cancel the first 2,000 (refused too, so they
    # stayed queued), and nothing said which: re-running the batch queued them twice.
    client = server.client()
    producer = Producer.from_url(server.url, namespace)
    _fill_after_first_chunk(monkeypatch, producer, client)
    inputs = [{"n": i} for i in range(3000)]

    with pytest.raises(EnqueueIncompleteError) as caught:
        producer.enqueue_many(inputs, mode="train")
    client.config_set("maxmemory", 0)

    error = caught.value
    assert isinstance(error.__cause__, redis.exceptions.OutOfMemoryError)  # Redis's refusal, chained
    assert (error.queued, error.batch_size, len(error.tasks)) == (2000, 3000, 2000)
    assert [t.input for t in error.tasks] == inputs[:2000]
    ids = [t.rollout_id for t in error.tasks]
    assert _states(producer, ids) == {TaskState.QUEUED.value.encode()}
    assert client.llen(producer.keys.rq_queue) == 2000
    message = str(error)
    assert message.startswith("2000 of 3000 task(s) queued before Redis refused: command not allowed when used")
    assert "the rest were not queued" in message and "give rollout_ids to make a retry safe" in message
    assert "enqueue the inputs from index 2000 on again" in message


def test_a_group_larger_than_a_chunk_is_queued_whole_or_not_at_all_when_redis_refuses_between_chunks(
    server: RedisServer, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An operator's audit: chunks of 2,000 tasks split a group of 2,500 across two transactions, and a refusal
    # between them left 2,000 of its members queued, a group no trainer batch would ever complete. A group larger
    # than a chunk now goes in a call of its own.
    client = server.client()
    producer = Producer.from_url(server.url, namespace)
    _fill_after_first_chunk(monkeypatch, producer, client)

    with pytest.raises(EnqueueIncompleteError) as caught:
        producer.enqueue_many([{"g": 0}, {"g": 1}], mode="train", group_size=2500)
    client.config_set("maxmemory", 0)

    error = caught.value
    assert (error.queued, error.batch_size) == (2500, 5000)
    assert {t.metadata["group_id"] for t in error.tasks} == {error.tasks[0].metadata["group_id"]}
    assert _states(producer, [t.rollout_id for t in error.tasks]) == {TaskState.QUEUED.value.encode()}
    assert client.scard(producer.keys.queued_tasks) == 2500  # the second group: none of it
    assert "the groups of the first 1 input(s) are queued: enqueue the inputs from index 1 on again" in str(error)


def test_a_batch_with_rollout_ids_refused_partway_is_queued_once_by_its_retry(
    server: RedisServer, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = server.client()
    producer = Producer.from_url(server.url, namespace)
    _fill_after_first_chunk(monkeypatch, producer, client)
    inputs, ids = [{"n": i} for i in range(2500)], [f"r-{i}" for i in range(2500)]

    with pytest.raises(EnqueueIncompleteError) as caught:
        producer.enqueue_many(inputs, rollout_ids=ids)
    client.config_set("maxmemory", 0)
    assert "enqueue the batch again with the same rollout_ids" in str(caught.value)
    monkeypatch.undo()
    tasks = producer.enqueue_many(inputs, rollout_ids=ids)

    assert [t.rollout_id for t in tasks] == ids
    assert client.llen(producer.keys.rq_queue) == 2500  # the first 2,000 not queued twice, nor cancelled
    assert _states(producer, ids) == {TaskState.QUEUED.value.encode()}


def test_rollq_enqueue_refused_partway_prints_the_ids_it_queued_and_says_from_which_line_on_none_were(
    server: RedisServer, namespace: str, rollq: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: exit 1 with only "rollq: command not allowed when used memory > 'maxmemory'.", no id printed, but
    # 2,000 tasks queued; re-running the file queued 3,000 more.
    client = server.client()
    real = Lifecycle.enqueue_many_after
    calls = 0

    def fill_then_enqueue(self: Lifecycle, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        if calls:
            client.config_set("maxmemory", 1)
        calls += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Lifecycle, "enqueue_many_after", fill_then_enqueue)
    lines = [f'{{"input": {{"n": {i}}}}}\n' for i in range(3000)]

    result = rollq("enqueue", input="\n" + "".join(lines), url_=server.url)  # a blank first line: line numbers
    client.config_set("maxmemory", 0)

    assert result.exit_code == 1, result.output
    printed = result.stdout.split()
    assert len(printed) == 2000
    producer = Producer.from_url(server.url, namespace)
    assert client.llen(producer.keys.rq_queue) == 2000
    assert [producer.get_task(rid).input for rid in printed[:3]] == [{"n": 0}, {"n": 1}, {"n": 2}]
    said = result.stderr.replace("\r", "\n").strip().splitlines()[-1]
    assert said.startswith(
        "rollq: 2000 of 3000 task(s) queued before Redis refused: command not allowed when used memory > 'maxmemory'"
    ), said
    assert "the rest were not queued" in said and "from line 2002 on" in said
    assert "give every line a rollout_id to make a re-run safe" in said

    monkeypatch.undo()
    again = rollq("enqueue", input="".join(lines[2000:]), url_=server.url)
    assert again.exit_code == 0, again.output
    assert client.llen(producer.keys.rq_queue) == 3000


def test_rollq_enqueue_that_loses_redis_partway_exits_3_naming_what_is_known_queued_and_how_to_resume(
    own_redis: Any, namespace: str, rollq: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An operator's audit: Redis going away partway through `rollq enqueue` exited 1 (the operation failed) with
    # "the rest may not be queued", where the CLI's exit 3 means Redis could not be reached, and nothing said that
    # the chunk in flight may have been applied, nor how to go on.
    server = own_redis(appendonly=True)  # comes back with what it had
    real = Lifecycle.enqueue_many_after
    calls = 0

    def kill_then_enqueue(self: Lifecycle, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        if calls:
            server.stop()
        calls += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Lifecycle, "enqueue_many_after", kill_then_enqueue)
    lines = "".join(f'{{"input": {{"n": {i}}}, "rollout_id": "r-{i}"}}\n' for i in range(3000))

    result = rollq("enqueue", input=lines, url_=server.url)

    assert result.exit_code == 3, result.output
    assert result.stdout.split() == [f"r-{i}" for i in range(2000)]  # those known queued
    said = result.stderr.replace("\r", "\n").strip().splitlines()[-1]
    assert said.startswith(f"rollq: lost Redis at redis://127.0.0.1:{server.port}/0 partway: "), said
    assert "2000 of 3000 task(s) are known queued (their ids are printed above)" in said, said
    assert "the chunk in flight from line 2001 on (up to 2,000 lines) may or may not have been queued" in said, said
    assert "run the file again from line 2001 on" in said and "is not queued twice" in said, said

    # Resuming as it says: the whole file again, with its rollout ids, queues each task once.
    monkeypatch.undo()
    server.start()
    again = rollq("enqueue", input=lines, url_=server.url)
    assert again.exit_code == 0, again.output
    assert "queued 1000 new task(s); 2000 already known" in again.stderr
    assert server.client().llen(Producer.from_url(server.url, namespace).keys.rq_queue) == 3000


def test_rollq_enqueue_that_loses_redis_on_its_first_chunk_says_the_chunk_may_have_been_queued_and_how_to_resume(
    own_redis: Any, namespace: str, rollq: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A helper's audit: losing Redis while the first chunk was on its way printed only "cannot reach Redis", as if
    # nothing could have been queued, where later chunks say that the chunk in flight may have been applied.
    server = own_redis(appendonly=True)
    real = Lifecycle.enqueue_many_after

    def kill_then_enqueue(self: Lifecycle, *args: Any, **kwargs: Any) -> Any:
        server.stop()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Lifecycle, "enqueue_many_after", kill_then_enqueue)
    lines = "\n" + "".join(f'{{"input": {{"n": {i}}}, "rollout_id": "r-{i}"}}\n' for i in range(3))

    result = rollq("enqueue", input=lines, url_=server.url)

    assert result.exit_code == 3, result.output
    assert result.stdout == ""
    (said,) = result.stderr.strip().splitlines()
    assert said.startswith(f"rollq: lost Redis at redis://127.0.0.1:{server.port}/0 sending the first chunk: "), said
    assert "no task is known queued" in said and "printed above" not in said, said
    assert "the chunk in flight from line 2 on (up to 2,000 lines) may or may not have been queued" in said, said
    assert "run the file again from line 2 on" in said and "is not queued twice" in said, said


def test_rollq_enqueue_that_cannot_reach_redis_before_sending_anything_says_nothing_was_queued(
    namespace: str, rollq: Any
) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"

    result = rollq("enqueue", input='{"input": 1}\n', url_=url)

    assert result.exit_code == 3, result.output
    (said,) = result.stderr.strip().splitlines()
    assert said.startswith(f"rollq: cannot reach Redis at {url}: "), said
    assert said.endswith("; nothing was queued") and "may or may not" not in said, said


def _finish(url: str, namespace: str, rollout_id: str) -> None:
    """Claim and publish ``rollout_id`` as a worker would, on a connection of its own."""
    worker = Producer.from_url(url, namespace)
    job = worker.connection.hget(worker.keys.task(rollout_id), TaskField.JOB)
    assert isinstance(job, bytes)
    claim = worker.lifecycle.claim(rollout_id, job.decode(), "w1")
    assert isinstance(claim, Claim)
    rollout = Rollout(rollout_id=rollout_id, final_reward=1.0)
    finish = Finish(
        rollout_id=rollout_id,
        attempt=claim.attempt,
        rollout_json=rollout.model_dump_json(),
        status=RolloutStatus.SUCCEEDED,
        results_maxlen=100,
        dead_letter=False,
        now=time.time(),
    )
    worker.lifecycle.finish(finish)


def _free_then_finish(client: redis.Redis, url: str, namespace: str, rollout_id: str) -> threading.Timer:
    """After 1.5 s (several reaps of the wait refused), free Redis's memory and publish ``rollout_id``."""

    def free_and_finish() -> None:
        client.config_set("maxmemory", 0)
        _finish(url, namespace, rollout_id)

    timer = threading.Timer(1.5, free_and_finish)
    timer.start()
    return timer


@pytest.fixture
def reap_often(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wait's reap every 0.2 s, not 5 (the real interval, to see a refused one within a short wait)."""
    monkeypatch.setattr(results_module, "REAP_EVERY_SECONDS", 0.2)
    monkeypatch.setattr("rollq.producer.aio.REAP_EVERY_SECONDS", 0.2)


def _refused_reap_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "reap" in r.getMessage() and "maxmemory" in r.getMessage()]


@pytest.mark.usefixtures("reap_often")
def test_a_wait_while_redis_refuses_writes_times_out_as_usual_saying_once_that_it_skips_its_reap(
    server: RedisServer, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: the reap wait does to help the workers (a Lua write) was refused, retried to the end of the producer's
    # retry budget and raised OutOfMemoryError out of wait (oom_wait.py: after 22.1 s of a 15 s wait). The budget is
    # one retry here, so that the test sees it at once.
    client = server.client()
    producer = Producer(connect(server.url, retries=1), namespace)
    producer.enqueue({"a": 1}, rollout_id="ow-1")
    client.config_set("maxmemory", 1)
    started = time.monotonic()

    with caplog.at_level(logging.INFO), pytest.raises(RolloutTimeoutError, match="ow-1"):
        producer.wait(["ow-1"], timeout=2)

    assert time.monotonic() - started < 5  # the timeout, not the producer's retry budget on top
    assert len(_refused_reap_lines(caplog)) == 1, caplog.text


@pytest.mark.usefixtures("reap_often")
def test_a_wait_through_a_spell_of_full_redis_returns_the_rollout_published_after_it(
    server: RedisServer, namespace: str
) -> None:
    client = server.client()
    producer = Producer(connect(server.url, retries=1), namespace)
    producer.enqueue({"a": 1}, rollout_id="ow-2")
    client.config_set("maxmemory", 1)
    timer = _free_then_finish(client, server.url, namespace, "ow-2")

    (rollout,) = producer.wait(["ow-2"], timeout=15)
    timer.join()

    assert rollout.rollout_id == "ow-2" and rollout.final_reward == 1.0


@pytest.mark.usefixtures("reap_often")
def test_an_async_wait_through_a_spell_of_full_redis_returns_the_rollout_published_after_it(
    server: RedisServer, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: the follower shared by the async waits died of the refused reap, and the wait timed out although the
    # rollout was published once memory was freed.
    client = server.client()

    async def main() -> Rollout:
        from rollq.store.connection import connect_async

        producer = AsyncProducer(connect_async(server.url), Producer(connect(server.url, retries=1), namespace))
        try:
            await producer.enqueue({"a": 1}, rollout_id="ow-3")
            client.config_set("maxmemory", 1)
            timer = _free_then_finish(client, server.url, namespace, "ow-3")
            (rollout,) = await producer.wait(["ow-3"], timeout=10)
            timer.join()
            return rollout
        finally:
            await producer.aclose()

    with caplog.at_level(logging.INFO):
        rollout = asyncio.run(main())

    assert rollout.rollout_id == "ow-3"
    assert len(_refused_reap_lines(caplog)) == 1, caplog.text
