"""AsyncProducer on real Redis with real workers: many concurrent waits, the consumer-group iterator, the verbs."""

from __future__ import annotations

import asyncio
import time

import pytest

from rollq.models.errors import RolloutTimeoutError
from rollq.models.policy import TaskState
from rollq.producer.aio import AsyncProducer
from rollq.producer.producer import Producer
from rollq.store.connection import connect_async
from rollq.store.control import CancelOutcome
from rollq.store.queries import AttemptOutcome

pytestmark = pytest.mark.redis

AGENT = {"ROLLQ_AGENT": "tests.support.fault_agents:FaultAgent", "ROLLQ_GRACE_SECONDS": "0", "ROLLQ_CONCURRENCY": "64"}


def test_hundreds_of_gathered_waits_share_one_stream_reader(redis_server, namespace, workers) -> None:
    async def main() -> None:
        connection = connect_async(redis_server.url, client_name=f"{namespace}-aio")
        async with AsyncProducer(connection, Producer.from_url(redis_server.url, namespace)) as producer:
            tasks = await producer.enqueue_many([{"sleep_between": [0.0, 0.5]}] * 300)
            ids = [t.rollout_id for t in tasks]
            done_before = ids[:10]
            workers(redis_server.url, namespace, env=AGENT)
            # Some waits start after their rollout finished (found via the record), most before.
            await producer.wait(done_before, timeout=30)
            results = await asyncio.gather(*(producer.wait([rid], timeout=60) for rid in ids))
            assert [r[0].rollout_id for r in results] == ids
            assert all(r[0].metadata["status"] == "succeeded" for r in results)
            ours = [c for c in await producer.connection.client_list() if c["name"] == f"{namespace}-aio"]
            assert len(ours) <= 16, f"{len(ours)} connections for 300 concurrent waits"
            page = await producer.query_tasks(state=TaskState.SUCCEEDED, limit=1000)
            assert len(page.tasks) == 300 and page.cursor is None

    asyncio.run(main())


def test_async_wait_partial_timeout_and_cancel(redis_server, namespace, workers) -> None:
    async def main() -> None:
        async with AsyncProducer.from_url(redis_server.url, namespace) as producer:
            quick = (await producer.enqueue({"sleep": 0})).rollout_id
            slow = (await producer.enqueue({"sleep": 30})).rollout_id
            queued = (await producer.enqueue({"sleep": 0}, mode="val")).rollout_id
            [cancelled] = await producer.cancel([queued])
            assert cancelled.outcome == CancelOutcome.CANCELLED and cancelled.state == TaskState.QUEUED
            assert await producer.get_rollout(quick) is None
            workers(redis_server.url, namespace, env=AGENT)
            result = await producer.wait([quick, slow, queued], timeout=3, partial=True)
            assert [r.rollout_id for r in result.finished] == [quick, queued] and result.missing == [slow]
            with pytest.raises(RolloutTimeoutError):
                await producer.wait([slow], timeout=0.5)
            assert (await producer.task_info(slow)).state == TaskState.RUNNING
            [stopped] = await producer.cancel([slow])
            assert stopped.was_running
            [rollout] = await producer.wait([slow], timeout=5)
            assert rollout.metadata["status"] == "cancelled"
            assert [a.outcome for a in await producer.attempts(slow)] == [AttemptOutcome.CANCELLED]
            assert (await producer.get_rollout(quick)).final_reward == 1.0

    asyncio.run(main())


def test_async_for_over_rollouts_reads_each_once_as_a_group_member(redis_server, namespace, workers) -> None:
    async def main() -> None:
        async with AsyncProducer.from_url(redis_server.url, namespace) as producer:
            ids = {t.rollout_id for t in await producer.enqueue_many([{"sleep": 0}] * 40)}
            workers(redis_server.url, namespace, env=AGENT)
            await producer.wait(sorted(ids), timeout=60)  # readers stop after 2 s idle: let a slow start pass first

            async def read(name: str) -> list[str]:
                return [r.rollout_id async for r in producer.rollouts(group="g", consumer=name, idle_timeout=2)]

            a, b = await asyncio.gather(read("a"), read("b"))
            assert sorted(a + b) == sorted(ids)
            pending = await producer.connection.xpending(producer.keys.results, "g")
            assert pending["pending"] == 0

            # With a limit a reader takes no more than it hands over: the rest stay with the group.
            first = [r.rollout_id async for r in producer.rollouts(group="h", consumer="c1", limit=15, batch=10)]
            assert len(first) == 15
            assert (await producer.connection.xpending(producer.keys.results, "h"))["pending"] == 0
            rest = [r.rollout_id async for r in producer.rollouts(group="h", consumer="c2", idle_timeout=1)]
            assert sorted(first + rest) == sorted(ids)

    asyncio.run(main())


@pytest.mark.parametrize("name", ["enqueue", "enqueue_many", "batches", "weight_sync", "pause_llm"])
def test_async_methods_take_the_same_named_parameters_as_the_producers_so_a_misspelt_one_is_a_type_error(
    name: str,
) -> None:
    import inspect

    sync = inspect.signature(getattr(Producer, name)).parameters
    aio = inspect.signature(getattr(AsyncProducer, name)).parameters
    assert not [p for p in aio.values() if p.kind is inspect.Parameter.VAR_KEYWORD], f"{name} takes **kwargs"
    assert list(aio) == list(sync)
    assert [(p.default, p.kind) for p in aio.values()] == [(p.default, p.kind) for p in sync.values()]


def test_closing_right_after_a_wait_returns_at_once(redis_server, namespace, workers) -> None:
    # The follower of the results stream may be inside a blocking XREAD when the wait returns: closing must not
    # wait on it (it hung until the XREAD's block ran out and beyond).
    async def main() -> float:
        async with AsyncProducer.from_url(redis_server.url, namespace) as producer:
            ids = [t.rollout_id for t in await producer.enqueue_many([{"sleep": 0.5}] * 2)]
            workers(redis_server.url, namespace, env=AGENT)
            await producer.wait(ids, timeout=60)
            started = time.monotonic()
        return time.monotonic() - started

    assert asyncio.run(asyncio.wait_for(main(), 120)) < 3
