"""AsyncProducer on a Redis Cluster namespace (``{name}`` over ``redis+cluster://``), on a real 3 + 3 cluster: it
enqueues, stock ``rq worker``s run the tasks, its ``wait()`` and ``rollouts()`` read them over the asyncio cluster
client, and a SIGKILL of the namespace's primary under load loses nothing acknowledged and delivers nothing twice
(issue 25, point 1)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import pytest
import redis

from rollq.producer.aio import AsyncProducer
from rollq.store.cluster import cluster_url, spread_namespaces
from rollq.store.cluster_aio import AsyncSlotConnectionPool
from tests.support.cluster import Cluster
from tests.support.servers import WorkerProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.slow]

_AGENT = {"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent", "ROLLQ_CONCURRENCY": "8"}


def test_an_async_producer_on_a_cluster_namespace_survives_a_primary_kill(
    cluster: Cluster, workers: Callable[..., WorkerProcess]
) -> None:
    (name,) = spread_namespaces(cluster.seeds, f"t-{uuid.uuid4().hex[:8]}", 1)
    url = cluster_url(cluster.seeds, name)
    for _ in range(2):
        workers(url, name, env=_AGENT)
    victim = cluster.owner(name)
    other = next(f"elsewhere-{i}" for i in range(10000) if cluster.owner("{" + f"elsewhere-{i}" + "}") != victim)

    async def main() -> None:
        async with AsyncProducer.from_url(url, name) as producer:
            assert isinstance(producer.connection.connection_pool, AsyncSlotConnectionPool)
            assert producer.sync.lifecycle.wait_replicas == 1, "acknowledged means replicated"

            # A first round: enqueued, run by the stock workers, read by wait(); the asyncio connections are on
            # the slot's primary, named as connect_async names them.
            first = [t.rollout_id for t in await producer.enqueue_many([{"sleep": 0.01}] * 30)]
            done = await producer.wait(first, timeout=120)
            assert [r.rollout_id for r in done] == first
            assert {r.metadata["status"] for r in done} == {"succeeded"}
            named = [c["name"] for c in victim.client().client_list()]
            assert any(n.startswith("rollq-async-producer:") for n in named), named

            # A key outside the namespace is another slot's MOVED: refused at once, not retried as a failover.
            started = time.monotonic()
            with pytest.raises(redis.exceptions.MovedError):
                await producer.connection.get("{" + other + "}:x")
            assert time.monotonic() - started < 5

            # Under load: enqueueing goes on, and a wait() is pending, while the namespace's primary dies.
            acknowledged = list(first)
            stop = asyncio.Event()

            async def produce() -> None:
                # Paced (at most 200 tasks/s), so what it enqueues while the replica is promoted stays bounded:
                # the two workers run 160 tasks/s at best, and everything acknowledged must drain in the timeout.
                while not stop.is_set():
                    acknowledged.extend(t.rollout_id for t in await producer.enqueue_many([{"sleep": 0.1}] * 10))
                    await asyncio.sleep(0.05)

            producing = asyncio.create_task(produce())
            await asyncio.to_thread(wait_until, lambda: len(acknowledged) >= 400, "400 tasks acknowledged", 120)
            before_kill = list(acknowledged)
            pending = asyncio.create_task(producer.wait(before_kill, timeout=240))
            await asyncio.sleep(0.2)
            assert not pending.done(), "the wait spans the failover"
            cluster.kill(victim)
            killed_at = time.monotonic()
            await asyncio.to_thread(
                wait_until, lambda: cluster.owner(name).port != victim.port, "a replica promoted", 30
            )
            promoted_after = time.monotonic() - killed_at
            after = len(acknowledged)
            await asyncio.to_thread(
                wait_until, lambda: len(acknowledged) >= after + 300, "enqueueing going on after the failover", 120
            )
            stop.set()
            await asyncio.wait_for(producing, 120)

            waited = await pending
            assert [r.rollout_id for r in waited] == before_kill

            # The trainer's consumer group, over the asyncio client: every acknowledged task once, none twice.
            seen: dict[str, int] = {}
            async for rollout in producer.rollouts("trainers", idle_timeout=15):
                seen[rollout.rollout_id] = seen.get(rollout.rollout_id, 0) + 1
                if set(seen) >= set(acknowledged):
                    break
            lost = set(acknowledged) - set(seen)
            twice = {rid for rid, n in seen.items() if n > 1}
            print(
                f"promoted after {promoted_after:.1f}s; {len(acknowledged)} acknowledged "
                f"({len(before_kill)} before the kill), {len(lost)} lost, {len(twice)} twice"
            )
            assert not lost, f"{len(lost)} acknowledged tasks lost"
            assert not twice, f"{len(twice)} delivered twice"
            assert len(acknowledged) == len(set(acknowledged))
            latest = await producer.wait(acknowledged[-50:], timeout=120)
            assert {r.metadata["status"] for r in latest} == {"succeeded"}
            # The asyncio connections followed the slot to its new owner.
            named = [c["name"] for c in cluster.owner(name).client().client_list()]
            assert any(n.startswith("rollq-async-producer:") for n in named), named

    asyncio.run(main())
