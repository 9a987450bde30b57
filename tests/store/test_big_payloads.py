"""Big rollouts kept at payload keys beside the results stream (rollq.store.payloads): published exactly, read by every
reader, never left behind by a refused finish or a trim."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import redis

from rollq.models.contract import Rollout, Task
from rollq.models.policy import RolloutPolicy, RolloutStatus
from rollq.models.wire import rollout_json
from rollq.producer import Producer
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
