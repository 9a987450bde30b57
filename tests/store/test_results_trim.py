"""Trimming the results stream keeps its byte count exact while it learns entry sizes from the summaries stream
(never reading a rollout back), and still when the summaries cannot tell it: written by an older rollq, gone, or
the stream trimmed by something else. Cancelling queued tasks publishes their cancelled rollouts through the same
trim as finishing them (lua/trim_results.lua), with no worker needed."""

from __future__ import annotations

import pytest

from rollq.producer import Producer
from rollq.store.keys import SUMMARIES_FROM, TRIMMED_TO, StreamField
from rollq.store.stats import StatsField
from tests.support.servers import RedisServer

MAXLEN = 10


def _publish(producer: Producer, n: int) -> None:
    """``n`` results-stream entries: queued tasks cancelled, each publishing its cancelled rollout."""
    ids = [t.rollout_id for t in producer.enqueue_many([{"i": i} for i in range(n)])]
    producer.cancel(ids)


def _counted_and_actual(producer: Producer) -> tuple[int, int]:
    client, keys = producer.connection, producer.keys
    counted = int(client.hget(keys.stats, StatsField.RESULTS_BYTES) or 0)  # type: ignore[arg-type]
    entries = client.xrange(keys.results)
    actual = sum(
        len(f[StreamField.ROLLOUT_ID.encode()]) + len(f[StreamField.ROLLOUT.encode()])
        for _, f in entries  # type: ignore[union-attr]
    )
    return counted, actual


@pytest.fixture
def producer(redis_server: RedisServer, namespace: str) -> Producer:
    return Producer.from_url(redis_server.url, namespace, results_maxlen=MAXLEN)


@pytest.mark.redis
def test_trimming_by_summary_sizes_keeps_the_stream_within_maxlen_and_its_byte_count_exact(producer: Producer) -> None:
    for _ in range(5):
        _publish(producer, 7)
    client, keys = producer.connection, producer.keys
    assert client.xlen(keys.results) <= MAXLEN
    counted, actual = _counted_and_actual(producer)
    assert counted == actual
    # The next trim starts its walk at the summary of the stream's first entry.
    first = client.hget(keys.results_trim, TRIMMED_TO)
    cursor = client.hget(keys.results_trim, SUMMARIES_FROM)
    assert first and cursor
    ((_, summary),) = client.xrange(keys.summaries, cursor, "+", count=1)  # type: ignore[misc]
    assert summary[StreamField.RESULT.encode()] == first
    assert int(summary[StreamField.SIZE.encode()]) > 0


@pytest.mark.redis
def test_summaries_without_sizes_from_an_older_rollq_still_trim_exactly(producer: Producer) -> None:
    client, keys = producer.connection, producer.keys
    _publish(producer, 8)
    # Rewrite the summaries as a rollq without sizes wrote them.
    old = client.xrange(keys.summaries)
    client.delete(keys.summaries)
    for _, fields in old:  # type: ignore[union-attr]
        client.xadd(keys.summaries, {k: v for k, v in fields.items() if k != StreamField.SIZE.encode()})
    _publish(producer, 20)
    assert client.xlen(keys.results) <= MAXLEN
    counted, actual = _counted_and_actual(producer)
    assert counted == actual


@pytest.mark.redis
def test_trimming_with_the_summaries_stream_gone_reads_sizes_from_the_results(producer: Producer) -> None:
    client, keys = producer.connection, producer.keys
    _publish(producer, 8)
    client.delete(keys.summaries)
    _publish(producer, 1)  # over the bound with no summary of any older entry
    _publish(producer, 12)
    assert client.xlen(keys.results) <= MAXLEN
    counted, actual = _counted_and_actual(producer)
    assert counted == actual


@pytest.mark.redis
def test_a_stream_trimmed_by_something_else_gets_its_byte_count_recounted_at_the_next_trim(producer: Producer) -> None:
    client, keys = producer.connection, producer.keys
    _publish(producer, 9)
    client.xtrim(keys.results, maxlen=3)  # an operator's XTRIM: the counter still counts 9 entries
    _publish(producer, 12)
    assert client.xlen(keys.results) <= MAXLEN
    counted, actual = _counted_and_actual(producer)
    assert counted == actual
