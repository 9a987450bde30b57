"""A producer against a Redis that refuses writes (``maxmemory`` reached, ``noeviction``), on a real redis-server:
a batch refused partway says which of its tasks were queued, so that a retry queues none twice (issue: the operator
audit's oom_partial.sh queued 5,000 tasks from a 3,000-line file), and a wait goes on reading (oom_wait.py: it
raised OutOfMemoryError from the reap it does to help the workers)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from rollq.models.errors import EnqueueIncompleteError
from rollq.models.policy import TaskState
from rollq.producer import Producer
from rollq.store.keys import TaskField
from rollq.store.transitions import Lifecycle
from tests.support.servers import RedisServer

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
    assert isinstance(error, redis.exceptions.OutOfMemoryError)  # what `except` clauses written before still catch
    assert (error.queued, error.batch_size, len(error.tasks)) == (2000, 3000, 2000)
    assert [t.input for t in error.tasks] == inputs[:2000]
    ids = [t.rollout_id for t in error.tasks]
    assert _states(producer, ids) == {TaskState.QUEUED.value.encode()}
    assert client.llen(producer.keys.rq_queue) == 2000
    message = str(error)
    assert message.startswith("2000 of 3000 task(s) queued before Redis refused: command not allowed when used")
    assert "the rest were not queued" in message and "give rollout_ids to make a retry safe" in message
    assert "enqueue the inputs from index 2000 on again" in message


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
