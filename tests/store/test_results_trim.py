"""Trimming the results stream keeps its byte count exact while it learns entry sizes from the summaries stream
(never reading a rollout back), and still when the summaries cannot tell it: written by an older rollq, gone, or
the stream trimmed by something else. Cancelling queued tasks publishes their cancelled rollouts through the same
trim as finishing them (lua/trim_results.lua), with no worker needed. An entry rollq did not write (no rollout
fields, or a ref that names no payload) is trimmed like any other and never stops a publication half way."""

from __future__ import annotations

import logging
import time

import pytest

from rollq.models.contract import Task
from rollq.models.policy import RolloutPolicy, RolloutStatus, TaskState
from rollq.producer import Producer
from rollq.store import replies as replies_module
from rollq.store.keys import SUMMARIES_FROM, TRIMMED_TO, StreamField
from rollq.store.replies import Published
from rollq.store.stats import StatsField
from rollq.store.transitions import Finish, Lifecycle
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


def _finish(lifecycle: Lifecycle, n: int) -> list[object]:
    """``n`` tasks queued, claimed and finished one call each, as a worker publishes them: each call's reply."""
    ids = [f"f{i}" for i in range(n)]
    tasks = [Task(rollout_id=rid, input={}, create_time=time.time(), num_claims=0) for rid in ids]
    lifecycle.enqueue_many([(t, t.model_dump_json()) for t in tasks], RolloutPolicy())
    replies: list[object] = []
    for rid in ids:
        lifecycle.claim(rid, lifecycle.keys.job_id(rid), "worker-a")
        finish = Finish(
            rollout_id=rid,
            attempt=1,
            rollout_json=f'{{"rollout_id":"{rid}","final_reward":1.0}}',
            status=RolloutStatus.SUCCEEDED,
            results_maxlen=MAXLEN,
            dead_letter=False,
            now=time.time(),
        )
        replies.append(lifecycle.finish(finish))
    return replies


FOREIGN_ENTRIES = {
    "no rollq fields": {"foo": "bar"},
    "a rollout id only": {"rollout_id": "x"},
    "a ref naming a hash": {"rollout_id": "x", "ref": "{ns}:stats"},
    "a ref naming a string that is no payload": {"rollout_id": "x", "ref": "{ns}:not-a-payload"},
    "a ref naming nothing": {"rollout_id": "x", "ref": "{ns}:payload:gone"},
}


@pytest.mark.redis
@pytest.mark.parametrize("entry", FOREIGN_ENTRIES.values(), ids=FOREIGN_ENTRIES.keys())
def test_an_entry_rollq_did_not_write_is_trimmed_and_never_stops_a_publication(
    producer: Producer, entry: dict[str, str]
) -> None:
    # Found by an outside audit: the trim measured such an entry (the length of a missing field, STRLEN of a hash)
    # and failed after finish.lua had XADDed the rollout: every later publish stood half done, its RQ job failed,
    # no summary written, the stream never trimmed.
    client, keys = producer.connection, producer.keys
    lifecycle = Lifecycle(client, keys)
    _publish(producer, 3)
    client.set(keys.results.replace(":results", ":not-a-payload"), "kept")
    client.xadd(keys.results, {k: v.replace("{ns}", keys.results.split(":")[0]) for k, v in entry.items()})
    replies = _finish(lifecycle, 12)
    assert all(isinstance(reply, Published) for reply in replies), replies
    states = [client.hget(keys.task(f"f{i}"), "state") for i in range(12)]
    assert states == [TaskState.SUCCEEDED.value.encode()] * 12
    _publish(producer, 12)  # cancel.lua: the same trim
    assert client.xlen(keys.results) <= MAXLEN
    summarised = {f[StreamField.ROLLOUT_ID.encode()] for _, f in client.xrange(keys.summaries)}
    assert {f"f{i}".encode() for i in range(12)} <= summarised
    # The keys such an entry names are not the trim's to delete.
    assert client.exists(keys.stats) and client.get(keys.results.replace(":results", ":not-a-payload")) == b"kept"
    counted, actual = _counted_and_actual(producer)
    assert counted == actual


@pytest.mark.redis
def test_a_byte_counter_that_is_not_a_number_is_counted_again_and_the_publication_stands(producer: Producer) -> None:
    client, keys = producer.connection, producer.keys
    _publish(producer, 3)
    client.hset(keys.stats, StatsField.RESULTS_BYTES, "abc")
    replies = _finish(Lifecycle(client, keys), 12)
    assert all(isinstance(reply, Published) for reply in replies), replies
    assert client.xlen(keys.results) <= MAXLEN
    counted, actual = _counted_and_actual(producer)
    assert counted == actual


@pytest.mark.redis
def test_a_trim_hash_of_another_type_is_skipped_and_named_and_the_stream_still_kept_within_its_bounds(
    producer: Producer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An operator's audit: the trim hash holding another type failed every trim (inside its pcall, after the
    # script's XADD), named only in Redis's own log; the results stream grew past its bounds. Now the scripts check
    # it with the other auxiliary keys: it is skipped (the trim reads and writes none of its bookkeeping), named in
    # the reply for the caller to log (once a minute), and the stream is trimmed all the same.
    monkeypatch.setattr(replies_module, "_damaged_logged", {})
    caplog.set_level(logging.ERROR)
    client, keys = producer.connection, producer.keys
    _publish(producer, 3)
    client.delete(keys.results_trim)
    client.rpush(keys.results_trim, "not a hash")
    replies = _finish(Lifecycle(client, keys), 12)
    assert all(isinstance(reply, Published) for reply in replies), replies
    named_in = f"the results trim hash {keys.results_trim} is a list, not a hash"
    assert all(named_in in reply.damaged for reply in replies), replies  # type: ignore[attr-defined]
    states = [client.hget(keys.task(f"f{i}"), "state") for i in range(12)]
    assert states == [TaskState.SUCCEEDED.value.encode()] * 12
    assert client.xlen(keys.summaries) == 15
    assert client.xlen(keys.results) <= MAXLEN
    _publish(producer, 12)  # cancel.lua: the same trim, the same skip
    assert client.xlen(keys.results) <= MAXLEN
    assert client.lrange(keys.results_trim, 0, -1) == [b"not a hash"]  # left for whoever wrote it to explain
    named = [r for r in caplog.records if keys.results_trim in r.getMessage()]
    assert len(named) == 1, caplog.text  # once a minute, not once a publication
    counted, actual = _counted_and_actual(producer)
    assert counted == actual
    # Repaired, the next trim starts its bookkeeping afresh.
    client.delete(keys.results_trim)
    _publish(producer, 1)
    assert client.xlen(keys.results) <= MAXLEN and client.hget(keys.results_trim, TRIMMED_TO)


@pytest.mark.redis
def test_a_wait_and_a_group_reader_read_rollouts_past_a_trim_hash_of_another_type_naming_it(
    producer: Producer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found beside the audit's trim hash: the publishing scripts now skip it, but every wait still read it (the first
    # entry the last trim kept) and failed with Redis's bare WRONGTYPE. It reads the records instead, named once.
    monkeypatch.setattr(replies_module, "_damaged_logged", {})
    caplog.set_level(logging.ERROR)
    client, keys = producer.connection, producer.keys
    reader = producer.rollouts(group="g", limit=3, idle_timeout=5)
    client.delete(keys.results_trim)
    client.rpush(keys.results_trim, "not a hash")
    ids = [t.rollout_id for t in producer.enqueue_many([{"i": i} for i in range(3)])]
    producer.cancel(ids)
    assert [r.rollout_id for r in producer.wait(ids, timeout=10)] == ids
    assert sorted(r.rollout_id for r in reader) == sorted(ids)
    named = [r for r in caplog.records if f"the results trim hash {keys.results_trim} is a list" in r.getMessage()]
    assert len(named) == 1, caplog.text
