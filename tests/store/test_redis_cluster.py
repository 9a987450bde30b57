"""A real Redis Cluster (3 primaries + 3 replicas started here): a namespace per shard, every key of a namespace in
its slot, one run spread over the shards and read as one, and a primary SIGKILLed under load losing nothing
acknowledged and delivering nothing twice (issue 25, point 4)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable

import pytest
import redis

from rollq.producer import Producer, Shards
from rollq.store.cluster import cluster_url, spread_namespaces, tag_slot
from rollq.store.connection import connect, connect_async
from rollq.store.keys import Keys
from tests.support.cluster import Cluster
from tests.support.servers import RedisServer, WorkerProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.slow]

_AGENT = {"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent"}


def _keys_on(node: RedisServer) -> list[str]:
    return [k.decode() for k in node.client().scan_iter(count=1000)]


def test_a_namespace_per_shard_keeps_every_key_in_its_slot_and_survives_a_primary_kill(
    cluster: Cluster, workers: Callable[..., WorkerProcess]
) -> None:
    names = spread_namespaces(cluster.seeds, f"t-{uuid.uuid4().hex[:8]}")
    assert len(names) == 3
    owners = [cluster.owner(n) for n in names]
    assert len({o.port for o in owners}) == 3, "one namespace per primary"
    urls = [cluster_url(cluster.seeds, n) for n in names]
    for url, name in zip(urls, names, strict=True):
        for _ in range(2):
            workers(url, name, env={**_AGENT, "ROLLQ_CONCURRENCY": "8"})
    shards = Shards.from_cluster(urls[0], names)
    assert all(p.lifecycle.wait_replicas == 1 for p in shards.producers), "acknowledged means replicated"

    # A first round with no failure: every key of a namespace, RQ's included, is in the namespace's slot.
    first = [t.rollout_id for _ in range(3) for t in shards.enqueue_many([{"sleep": 0.01}] * 20)]
    assert len(shards.wait(first, timeout=120)) == 60
    for name, owner in zip(names, owners, strict=True):
        slot = tag_slot(name.strip("{}"))
        keys = [k for k in _keys_on(owner) if name in k]
        assert any(k.startswith("rq:job:") for k in keys) and any(k.startswith("rq:worker:") for k in keys)
        assert {owner.client().cluster("keyslot", k) for k in keys} == {slot}
        assert Keys(name).rq_queues() in keys and Keys(name).rq_workers in keys
    for node in cluster.nodes:  # RQ's global keys exist nowhere: each namespace has its own
        assert not {"rq:queues", "rq:workers", "rq:suspended"} & set(_keys_on(node))

    # Under load: a producer keeps enqueueing over all three shards while the first namespace's primary dies.
    acknowledged: list[str] = list(first)
    stop = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            while not stop.is_set():
                acknowledged.extend(t.rollout_id for t in shards.enqueue_many([{"sleep": 0.05}] * 10))
        except BaseException as exc:  # noqa: BLE001  # reported by the test
            errors.append(exc)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    wait_until(lambda: len(acknowledged) >= 600, "600 tasks acknowledged", 120)
    victim = owners[0]
    cluster.kill(victim)
    killed_at = time.monotonic()
    wait_until(lambda: cluster.owner(names[0]).port != victim.port, "a replica promoted", 30)
    promoted_after = time.monotonic() - killed_at
    wait_until(lambda: len(acknowledged) >= 1200, "enqueueing going on after the failover", 120)
    stop.set()
    producer.join(60)
    assert not errors, errors

    # The trainer reads the three namespaces as one: every acknowledged task once, none twice.
    seen: dict[str, int] = {}
    for rollout in shards.rollouts("trainers", idle_timeout=15):
        seen[rollout.rollout_id] = seen.get(rollout.rollout_id, 0) + 1
        if len(seen) == len(set(acknowledged)) and set(seen) >= set(acknowledged):
            break
    lost = set(acknowledged) - set(seen)
    twice = {rid for rid, n in seen.items() if n > 1}
    print(
        f"promoted after {promoted_after:.1f}s; {len(acknowledged)} acknowledged, {len(lost)} lost, {len(twice)} twice"
    )
    assert not lost, f"{len(lost)} acknowledged tasks lost"
    assert not twice, f"{len(twice)} delivered twice"
    assert len(acknowledged) == len(set(acknowledged))
    statuses = {r.metadata["status"] for r in shards.wait(acknowledged[-50:], timeout=120)}
    assert statuses == {"succeeded"}


def test_a_key_outside_the_namespace_is_refused_not_retried(cluster: Cluster) -> None:
    (name,) = spread_namespaces(cluster.seeds, f"t-{uuid.uuid4().hex[:8]}", 1)
    producer = Producer.from_url(cluster_url(cluster.seeds, name), name)
    other = next(f"elsewhere-{i}" for i in range(1000) if tag_slot(f"elsewhere-{i}") != tag_slot(name.strip("{}")))
    slot_owner = cluster.owner(name)
    if cluster.owner("{" + other + "}").port == slot_owner.port:
        other = next(f"far-{i}" for i in range(10000) if cluster.owner("{" + f"far-{i}" + "}").port != slot_owner.port)
    started = time.monotonic()
    with pytest.raises(redis.exceptions.MovedError):
        producer.connection.get("{" + other + "}:x")
    assert time.monotonic() - started < 5


def test_both_clients_follow_a_moved_for_their_slot_to_the_new_primary(cluster: Cluster) -> None:
    # A coordinated failover (CLUSTER FAILOVER on the replica) leaves the old primary up, as a replica: the clients'
    # open connections to it get MOVED for their own slot, and must reconnect to the new owner, not fail.
    (name,) = spread_namespaces(cluster.seeds, f"t-{uuid.uuid4().hex[:8]}", 1)
    url = cluster_url(cluster.seeds, name)
    old = cluster.owner(name)
    blocking = connect(url)
    key = "{" + name.strip("{}") + "}:moved"

    async def main() -> None:
        client = connect_async(url)
        try:
            await client.set(key, "before")  # a connection open to the old primary
            blocking.set(key, "before")
            replica = next(n for n in cluster.nodes if n.client().info("replication").get("master_port") == old.port)
            replica.client().execute_command("CLUSTER FAILOVER")
            await asyncio.to_thread(
                wait_until, lambda: cluster.owner(name).port == replica.port, "the replica promoted", 30
            )
            moved = old.client()
            with pytest.raises(redis.exceptions.MovedError):  # what the clients' connections now hear
                moved.set(key, "x")
            started = time.monotonic()
            await client.set(key, "async")
            assert await client.get(key) == b"async"
            assert blocking.set(key, "sync") and blocking.get(key) == b"sync"
            assert time.monotonic() - started < 10
            assert replica.client().get(key) == b"sync"
        finally:
            await client.aclose()
            blocking.close()

    asyncio.run(main())


def test_packs_run_on_a_cluster_namespace_and_serve_al_splits_one_each_task_once_every_key_in_its_slot(
    cluster: Cluster, workers: Callable[..., WorkerProcess]
) -> None:
    from rollq.compat.gateway import Gateway

    (name,) = spread_namespaces(cluster.seeds, f"t-{uuid.uuid4().hex[:8]}", count=1)
    url = cluster_url(cluster.seeds, name)
    producer = Producer.from_url(url, name, tasks_per_job=4)
    k = producer.keys

    # A worker round: 16 tasks in 4 packs, run by a worker taking packs of 4.
    worked = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.01}] * 16)]
    packs = {j.decode() for j in producer.connection.lrange(k.rq_queue, 0, -1)}
    assert len(packs) == 4 and all(j.startswith(name + "rollq-pack-") for j in packs)
    worker = workers(url, name, env={**_AGENT, "ROLLQ_CONCURRENCY": "8", "ROLLQ_TASKS_PER_JOB": "4"})
    assert [r.rollout_id for r in producer.wait(worked, timeout=120)] == worked
    worker.stop(timeout=30)

    # A pack through the AL 0.1 gateway (in this process): split in the slot, each task handed out once.
    split = [t.rollout_id for t in producer.enqueue_many([{"sleep": 0.01}] * 4)]
    gateway = Gateway(connect(url), name, lease_seconds=60)
    handed = [gateway.next_task() for _ in range(5)]
    assert handed[-1] is None
    assert [t.rollout_id.partition("#")[0] for t in handed[:-1] if t is not None] == split
    for task in handed[:-1]:
        assert task is not None
        gateway.post_rollout({"rollout_id": task.rollout_id, "final_reward": 1.0}, "al-client")
    assert [r.final_reward for r in producer.wait(split, timeout=60)] == [1.0] * 4
    assert producer.connection.xlen(k.results) == 20

    owner = cluster.owner(name)
    keys = [key for key in _keys_on(owner) if name in key]
    jobs = [producer.connection.hget(k.task(rid), "job").decode() for rid in split]  # the split's, tagged
    assert all(j.startswith(name + "rollq-") and "pack" not in j for j in jobs), jobs
    assert {owner.client().cluster("keyslot", key) for key in keys} == {tag_slot(name.strip("{}"))}
