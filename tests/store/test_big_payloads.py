"""Big rollouts kept at payload keys beside the results stream (rollq.store.payloads): published exactly, read by every
reader, never left behind by a refused finish or a trim."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from typing import Any

import pytest
import redis

from rollq.models.contract import Rollout, Task, Triplet
from rollq.models.policy import RolloutPolicy, RolloutStatus
from rollq.models.wire import ORJSON_WRITTEN, rollout_json
from rollq.producer import Producer
from rollq.producer.aio import AsyncProducer
from rollq.store import payloads
from rollq.store.cluster import cluster_url, tag_slot
from rollq.store.connection import connect
from rollq.store.keys import Keys, StreamField
from rollq.store.payloads import PAYLOAD_THRESHOLD
from rollq.store.replies import Cancelled, Published, Superseded
from rollq.store.stats import StatsField
from rollq.store.transitions import Finish, Lifecycle
from tests.support.cluster import Cluster
from tests.support.servers import RedisServer

pytestmark = pytest.mark.redis


def big_rollout(rollout_id: str, seed: int = 0) -> Rollout:
    tokens = [(i * 7919 + seed) % 150_000 for i in range(PAYLOAD_THRESHOLD // 3)]
    return Rollout(rollout_id=rollout_id, final_reward=0.5, metadata={"token_ids": tokens, "seed": seed})


def finish_of(rollout: Rollout, attempt: int = 1, **kwargs: Any) -> Finish:
    return Finish(
        rollout_id=rollout.rollout_id,
        attempt=attempt,
        rollout_json=rollout_json(rollout),
        status=RolloutStatus.SUCCEEDED,
        results_maxlen=kwargs.pop("results_maxlen", 100),
        dead_letter=False,
        now=time.time(),
        **kwargs,
    )


def claimed(lc: Lifecycle, *rollout_ids: str) -> None:
    tasks = [Task(rollout_id=rid, input={}, create_time=time.time(), num_claims=0) for rid in rollout_ids]
    lc.enqueue_many([(t, t.model_dump_json()) for t in tasks], RolloutPolicy())
    for rid in rollout_ids:
        lc.claim(rid, lc.keys.job_id(rid), "worker-a")


def payload_keys(client: redis.Redis, keys: Keys) -> list[bytes]:
    return sorted(client.scan_iter(match=keys.payload("*", 0, "")[: -len("|0|")] + "*"))


@pytest.fixture
def lc(redis_server: RedisServer, namespace: str) -> Lifecycle:
    return Lifecycle(redis_server.client(), Keys(namespace))


def test_a_big_rollout_is_published_by_reference_and_read_exactly(lc: Lifecycle, redis_server: RedisServer) -> None:
    claimed(lc, "r1")
    rollout = big_rollout("r1")
    reply = lc.finish(finish_of(rollout))
    assert isinstance(reply, Published)
    ((_, fields),) = lc.connection.xrange(lc.keys.results)
    assert StreamField.ROLLOUT.encode() not in fields
    ref = fields[StreamField.REF.encode()]
    assert lc.connection.get(ref) == rollout_json(rollout)
    assert lc.connection.ttl(ref) == -1  # lives as long as its entry
    producer = Producer.from_url(redis_server.url, lc.keys.namespace)
    assert producer.wait(["r1"], timeout=5) == [rollout]
    assert producer.get_rollout("r1") == rollout
    # The byte bound counts the payload, not the key name.
    size = int(lc.connection.hget(lc.keys.stats, StatsField.RESULTS_BYTES))
    assert size == len("r1") + len(rollout_json(rollout))


def test_a_small_rollout_keeps_its_entry_format(lc: Lifecycle) -> None:
    claimed(lc, "r1")
    rollout = Rollout(rollout_id="r1", final_reward=1.0)
    lc.finish(finish_of(rollout))
    ((_, fields),) = lc.connection.xrange(lc.keys.results)
    assert list(fields) == [StreamField.ROLLOUT_ID.encode(), StreamField.ROLLOUT.encode()]
    assert payload_keys(lc.connection, lc.keys) == []


def test_a_big_finish_sent_again_answers_as_the_first_and_keeps_one_payload(lc: Lifecycle) -> None:
    claimed(lc, "r1")
    finish = finish_of(big_rollout("r1"))
    first = lc.finish(finish)
    assert lc.finish(finish) == first  # the same publication (a reply lost to a dropped connection)
    assert lc.connection.xlen(lc.keys.results) == 1 and lc.connection.xlen(lc.keys.superseded) == 0
    (key,) = payload_keys(lc.connection, lc.keys)
    assert lc.connection.ttl(key) == -1  # the SET sent again gave it an expiry: the script took it away


def test_a_refused_big_finish_leaves_no_payload_key(lc: Lifecycle, redis_server: RedisServer) -> None:
    claimed(lc, "r1", "r2")
    lc.finish(finish_of(big_rollout("r1")))
    published = payload_keys(lc.connection, lc.keys)
    # Another rollout from the attempt that already published: superseded, kept whole on the superseded stream.
    other = big_rollout("r1", seed=1)
    assert lc.finish(finish_of(other)) == Superseded()
    ((_, fields),) = lc.connection.xrange(lc.keys.superseded)
    assert fields[StreamField.ROLLOUT.encode()] == rollout_json(other)
    # A stale attempt's rollout.
    assert lc.finish(finish_of(big_rollout("r1", seed=2), attempt=7)) == Superseded()
    # A cancelled task's.
    Producer.from_url(redis_server.url, lc.keys.namespace).cancel(["r2"])
    assert lc.finish(finish_of(big_rollout("r2"))) == Cancelled()
    assert payload_keys(lc.connection, lc.keys) == published


def test_trimming_the_results_stream_deletes_the_payloads_of_what_it_removes(lc: Lifecycle) -> None:
    ids = [f"r{i}" for i in range(30)]
    claimed(lc, *ids)
    for rid in ids:
        lc.finish(finish_of(big_rollout(rid), results_maxlen=10))
    entries = lc.connection.xrange(lc.keys.results)
    assert len(entries) < 30
    kept = sorted(fields[StreamField.REF.encode()] for _, fields in entries)
    assert payload_keys(lc.connection, lc.keys) == kept
    size = int(lc.connection.hget(lc.keys.stats, StatsField.RESULTS_BYTES))
    rid, ref = StreamField.ROLLOUT_ID.encode(), StreamField.REF.encode()
    assert size == sum(len(f[rid]) + lc.connection.strlen(f[ref]) for _, f in entries)


def test_trimming_by_bytes_counts_payloads(redis_server: RedisServer, namespace: str) -> None:
    one = len(rollout_json(big_rollout("r0")))
    lc = Lifecycle(redis_server.client(), Keys(namespace), results_max_bytes=8 * one)  # trimmed to ~4 rollouts
    ids = [f"r{i}" for i in range(12)]
    claimed(lc, *ids)
    for rid in ids:
        lc.finish(finish_of(big_rollout(rid)))
    entries = lc.connection.xrange(lc.keys.results)
    assert len(entries) <= 5
    assert len(payload_keys(lc.connection, lc.keys)) == len(entries)


def test_a_consumer_group_reads_big_and_small_rollouts_alike(lc: Lifecycle, redis_server: RedisServer) -> None:
    claimed(lc, "r1", "r2", "r3")
    rollouts = [big_rollout("r1"), Rollout(rollout_id="r2", final_reward=0.0), big_rollout("r3", seed=3)]
    lc.run_pipelined([lc.finish_many_call([finish_of(r) for r in rollouts])])
    producer = Producer.from_url(redis_server.url, lc.keys.namespace)
    assert list(producer.rollouts("trainers", start="0", idle_timeout=0.5)) == rollouts


def test_payload_keys_share_the_namespace_slot() -> None:
    assert Keys("{ns}").payload("r1", 1, "t").startswith("{ns}:payload:")
    assert Keys("ns").payload("r1", 1, "t").startswith("{ns}:payload:")


@pytest.mark.slow
def test_big_rollouts_of_a_cluster_namespace_publish_read_and_trim_in_its_slot(cluster: Cluster) -> None:
    name = "{t-" + uuid.uuid4().hex[:8] + "}"
    url = cluster_url(cluster.seeds, name)
    lc = Lifecycle(connect(url), Keys(name))
    ids = [f"r{i}" for i in range(12)]
    claimed(lc, *ids)
    rollouts = [big_rollout(rid) for rid in ids]
    for rollout in rollouts:
        assert isinstance(lc.finish(finish_of(rollout, results_maxlen=5)), Published)
    owner = cluster.owner(name.strip("{}")).client()
    entries = lc.connection.xrange(lc.keys.results)
    keys = payload_keys(owner, lc.keys)
    assert len(keys) == len(entries) < len(ids)
    assert {owner.cluster("keyslot", k) for k in keys} == {tag_slot(name.strip("{}"))}
    kept = [fields[StreamField.ROLLOUT_ID.encode()].decode() for _, fields in entries]
    got = Producer.from_url(url, name).get_rollouts(kept)
    assert got == {r.rollout_id: r for r in rollouts if r.rollout_id in kept}


def test_a_consumer_group_reader_fetches_a_batchs_payloads_a_few_at_a_time(
    lc: Lifecycle, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One MGET for a whole batch had Redis build, and the trainer hold, every big rollout of it at once.
    ids = [f"r{i}" for i in range(6)]
    claimed(lc, *ids)
    rollouts = [big_rollout(rid) for rid in ids]  # all of one size
    lc.run_pipelined([lc.finish_many_call([finish_of(r) for r in rollouts])])
    one = len(rollout_json(rollouts[0]))
    monkeypatch.setattr(payloads, "READ_AHEAD_BYTES", 2 * one + 1)  # two payloads per MGET once one was read
    producer = Producer.from_url(redis_server.url, lc.keys.namespace)
    lc.connection.config_resetstat()
    assert list(producer.rollouts("trainers", start="0", idle_timeout=0.5)) == rollouts
    mgets = lc.connection.info("commandstats")["cmdstat_mget"]
    assert mgets["calls"] == 4  # 1, then 2, 2, 1


def test_ReadAhead_sizes_each_read_by_the_payloads_read_so_far() -> None:
    batch: list[dict[bytes, bytes]] = [
        {b"rollout_id": b"a", b"ref": b"k1"},
        {b"rollout_id": b"b", b"rollout": b"{}"},  # inline: nothing to read
        {b"rollout_id": b"c", b"ref": b"k2"},
        {b"rollout_id": b"d", b"ref": b"k3"},
        {b"rollout_id": b"e", b"ref": b"k4"},
    ]
    plan = payloads.ReadAhead(batch, budget=250)
    first = plan.next_chunk()
    assert [ref for _, ref in first] == [b"k1"]
    plan.took(first, [b"x" * 100])
    assert batch[0][b"rollout"] == b"x" * 100
    second = plan.next_chunk()
    assert [ref for _, ref in second] == [b"k2", b"k3"]  # 250 bytes / 100 per payload
    plan.took(second, [b"y" * 100, None])  # k3 gone (trimmed meanwhile): its entry stays without a rollout
    assert payloads.missing_payload(batch[3]) == b"k3"
    assert [ref for _, ref in plan.next_chunk()] == [b"k4"]
    assert plan.next_chunk() == []


def test_a_reader_lets_go_of_each_big_rollouts_json_once_past_it(lc: Lifecycle) -> None:
    claimed(lc, "r1", "r2")
    lc.run_pipelined([lc.finish_many_call([finish_of(big_rollout("r1")), finish_of(Rollout(rollout_id="r2"))])])
    batch = [fields for _, fields in lc.connection.xrange(lc.keys.results)]
    loading = payloads.loaded_one_by_one(lc.connection, batch)
    first = next(loading)
    assert first[StreamField.ROLLOUT.encode()] == rollout_json(big_rollout("r1"))
    second = next(loading)
    assert StreamField.ROLLOUT.encode() not in first  # dropped: the entry as read, its payload key still named
    assert first[StreamField.REF.encode()]
    assert second[StreamField.ROLLOUT.encode()] == rollout_json(Rollout(rollout_id="r2"))


def test_a_reader_whose_payload_read_fails_reads_the_rest_of_its_batch_again(
    lc: Lifecycle, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [f"r{i}" for i in range(4)]
    claimed(lc, *ids)
    rollouts = [big_rollout(rid, seed=i) for i, rid in enumerate(ids)]
    lc.run_pipelined([lc.finish_many_call([finish_of(r) for r in rollouts])])
    monkeypatch.setattr(payloads, "READ_AHEAD_BYTES", 1)  # one payload per MGET
    producer = Producer.from_url(redis_server.url, lc.keys.namespace)
    real_receive, calls = payloads._SentAhead.receive, []

    def receive_failing_the_third_time(self: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            self.close()  # as a connection reset leaves it
            raise redis.ConnectionError("connection reset")
        return real_receive(self)

    monkeypatch.setattr(payloads._SentAhead, "receive", receive_failing_the_third_time)
    got = list(producer.rollouts("trainers", start="0", idle_timeout=1.0))
    assert got == rollouts  # each once, in order: the two handed over are not read again
    assert len(calls) == 5
    assert lc.connection.xpending(lc.keys.results, "trainers")["pending"] == 0


def test_a_big_rollouts_token_ids_beyond_2_53_come_back_exactly_and_nan_logprobs_as_null(
    lc: Lifecycle, redis_server: RedisServer
) -> None:
    # The policy (docs/internals.md, the number policy): ints of any size exactly (orjson writes and
    # reads those within 64 bits; a rollout holding a bigger one is written and read by pydantic); NaN and +-Infinity
    # are written as null, as pydantic writes them.
    edge = [2**53 - 1, 2**53, 2**53 + 1, 2**63 - 1, 2**64 - 1, -(2**63)]
    ids = [(i * 7919) % 150_000 for i in range(PAYLOAD_THRESHOLD // 3)] + edge
    logprobs = [-0.25, math.nan, -math.inf, math.inf, -1e-300]
    claimed(lc, "fast", "exact")
    fast = Rollout(
        rollout_id="fast",
        triplets=[Triplet(prompt={"token_ids": ids}, response={"token_ids": edge, "logprobs": logprobs}, reward=1.0)],
    )
    exact = fast.model_copy(update={"rollout_id": "exact", "metadata": {"beyond 64 bits": [2**64, -(2**63) - 1]}})
    assert rollout_json(fast).endswith(ORJSON_WRITTEN) and not rollout_json(exact).endswith(ORJSON_WRITTEN)
    lc.run_pipelined([lc.finish_many_call([finish_of(fast), finish_of(exact)])])
    producer = Producer.from_url(redis_server.url, lc.keys.namespace)
    got = list(producer.rollouts("trainers", start="0", idle_timeout=0.5))
    assert [r.rollout_id for r in got] == ["fast", "exact"]
    for rollout in got:
        assert rollout.triplets is not None
        assert rollout.triplets[0].prompt["token_ids"] == ids
        response = rollout.triplets[0].response
        assert response["token_ids"] == edge and all(type(i) is int for i in response["token_ids"])
        assert response["logprobs"] == [-0.25, None, None, None, -1e-300]
    assert got[1].metadata["beyond 64 bits"] == [2**64, -(2**63) - 1]
    assert producer.wait(["fast", "exact"], timeout=5) == got


def test_the_async_consumer_group_reader_reads_big_payloads_ahead_in_chunks(
    lc: Lifecycle, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [f"r{i}" for i in range(5)]
    claimed(lc, *ids)
    rollouts = [big_rollout(rid) for rid in ids[:2]] + [Rollout(rollout_id="r2")] + [big_rollout(r) for r in ids[3:]]
    lc.run_pipelined([lc.finish_many_call([finish_of(r) for r in rollouts])])
    monkeypatch.setattr(payloads, "READ_AHEAD_BYTES", 1)  # one payload per MGET

    async def main() -> list[Rollout]:
        async with AsyncProducer.from_url(redis_server.url, lc.keys.namespace) as producer:
            return [r async for r in producer.rollouts("trainers", start="0", idle_timeout=0.5)]

    lc.connection.config_resetstat()
    assert asyncio.run(main()) == rollouts
    assert lc.connection.info("commandstats")["cmdstat_mget"]["calls"] == 4
