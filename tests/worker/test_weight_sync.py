"""Weight-sync pause across stock ``rq worker`` processes: calls in flight finish, new calls wait, resume releases.

The workers heartbeat every second (so they see a pause within a second); the fake vLLM answers each call after a
delay, so calls are in flight when the pause comes. ``fake.in_flight`` counts the calls it is answering.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable

import pytest

from rollq.models.contract import LLM
from rollq.models.errors import LLMPauseTimeoutError
from rollq.ops.metrics import render_prometheus
from rollq.ops.status import render_text, snapshot
from rollq.producer import Producer
from rollq.producer.aio import AsyncProducer
from tests.support.fake_vllm import FakeVLLM
from tests.support.servers import RedisServer, WorkerProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis

AGENT = {"ROLLQ_AGENT": "tests.support.capture_agents:AsyncCaptureAgent", "ROLLQ_HEARTBEAT_SECONDS": "1"}


def _producer(redis_server: RedisServer, namespace: str, fake: FakeVLLM) -> tuple[Producer, str]:
    producer = Producer.from_url(redis_server.url, namespace=namespace)
    return producer, producer.update_resources({"llm": LLM(endpoint=fake.url, model="fake-model")})


def _live(producer: Producer, count: int) -> None:
    wait_until(lambda: producer.llm_gate_status().workers == count, f"{count} worker(s) reporting to the LLM gate")


@pytest.mark.parametrize(
    ("listen", "on_loop"),
    [("1", "0"), ("0", "0"), ("1", "1")],
    ids=["listening", "heartbeat-only", "listening, proxy on the agents' loop"],
)
@pytest.mark.slow
def test_a_pause_across_two_workers_lets_running_calls_finish_holds_new_ones_and_resume_releases_them(
    redis_server: RedisServer,
    namespace: str,
    workers: Callable[..., WorkerProcess],
    fake: FakeVLLM,
    listen: str,
    on_loop: str,
) -> None:
    producer, v1 = _producer(redis_server, namespace, fake)
    env = {**AGENT, "ROLLQ_CONCURRENCY": "4", "ROLLQ_LLM_GATE_LISTEN": listen, "ROLLQ_CAPTURE_ON_AGENT_LOOP": on_loop}
    for _ in range(2):
        workers(redis_server.url, namespace, env=env)
    _live(producer, 2)
    fake.delay = 1.5
    tasks = producer.enqueue_many([{"steps": ["async", "async"]} for _ in range(8)], mode="train")
    wait_until(lambda: fake.in_flight == 8, "8 first calls in flight on two workers")

    report = producer.pause_llm(timeout=30)
    assert fake.in_flight == 0  # drained: nothing runs on the inference server
    assert report.workers == 2 and report.calls_at_pause >= 2 and report.seconds_to_drained < 5, report
    received = len(fake.received)
    assert received == 8  # the first calls finished; the second calls wait at the gates
    wait_until(lambda: producer.llm_gate_status().waiting == 8, "8 calls waiting at the gates")
    time.sleep(1.5)
    assert len(fake.received) == received, "a call reached the server while paused"
    v2 = producer.update_resources({"llm": LLM(endpoint=fake.url, model="fake-model")})

    fake.delay = 0.0
    resumed = time.monotonic()
    producer.resume_llm()
    wait_until(lambda: len(fake.received) > received, "a call after the resume", timeout=5)
    assert time.monotonic() - resumed < 1.0  # the announcement, not the next heartbeat
    rollouts = producer.wait([t.rollout_id for t in tasks], timeout=60)
    for rollout in rollouts:
        assert rollout.metadata["status"] == "succeeded", rollout.metadata
        first, second = rollout.triplets or []
        # Each call carries the version it ran against: before the sync v1, after it v2 (the task ran on v1).
        assert (first.metadata["resources_id"], second.metadata["resources_id"]) == (v1, v2)
        assert rollout.metadata["resources_id"] == v1
    assert not producer.llm_gate_status().paused


def test_a_call_that_waits_past_the_bound_gets_503_and_the_rollout_fails_naming_the_pause(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess], fake: FakeVLLM
) -> None:
    producer, _ = _producer(redis_server, namespace, fake)
    workers(redis_server.url, namespace, env={**AGENT, "ROLLQ_LLM_PAUSE_WAIT_SECONDS": "1"})
    _live(producer, 1)
    with producer.weight_sync(timeout=10):
        [task] = producer.enqueue_many([{"steps": ["async"]}], mode="train")
        [rollout] = producer.wait([task.rollout_id], timeout=30)
    assert fake.received == []
    assert rollout.metadata["status"] == "failed"
    error = rollout.metadata["error"]
    assert error["type"] == "LLMBackendError" and "HTTP 503" in error["message"], error
    assert "paused for a weight sync" in error["message"]
    [span] = [s for s in rollout.trace or [] if (s["attributes"] or {}).get("rollq.llm.captured")]
    assert span["attributes"]["error.type"] == "503"


@pytest.mark.parametrize("on_loop", ["0", "1"], ids=["proxy thread", "proxy on the agents' loop"])
def test_a_worker_that_starts_during_a_pause_honours_it(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess], fake: FakeVLLM, on_loop: str
) -> None:
    """The gate is closed before any proxy runs; the proxy binds it to whichever loop serves when it starts."""
    producer, _ = _producer(redis_server, namespace, fake)
    report = producer.pause_llm(timeout=5)
    assert report.workers == 0  # no worker yet: drained at once
    try:
        workers(redis_server.url, namespace, env={**AGENT, "ROLLQ_CAPTURE_ON_AGENT_LOOP": on_loop})
        [task] = producer.enqueue_many([{"steps": ["async"]}], mode="train")
        wait_until(lambda: producer.llm_gate_status().waiting == 1, "the call waiting at the new worker's gate")
        status = producer.llm_gate_status()
        assert status.workers == status.acknowledged == 1 and status.drained
        assert fake.received == []
        taken = snapshot(producer.connection, producer.keys)
        shown = render_text(taken)
        assert "LLM calls         paused (pause 1): 1 of 1 worker(s) holding, 0 still running, 1 waiting" in shown
        exposition = render_prometheus(taken)
        assert f'rollq_llm_paused{{namespace="{namespace}"}} 1.0' in exposition
        assert f'rollq_llm_calls_waiting{{namespace="{namespace}"}} 1.0' in exposition
    finally:
        producer.resume_llm()
    [rollout] = producer.wait([task.rollout_id], timeout=30)
    assert rollout.metadata["status"] == "succeeded", rollout.metadata


def test_a_pause_that_does_not_drain_in_time_names_the_busy_worker_and_weight_sync_resumes(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess], fake: FakeVLLM
) -> None:
    producer, _ = _producer(redis_server, namespace, fake)
    workers(redis_server.url, namespace, env=AGENT)
    _live(producer, 1)
    fake.delay = 4.0
    [task] = producer.enqueue_many([{"steps": ["async"]}], mode="train")
    wait_until(lambda: fake.in_flight == 1, "a call in flight")
    with pytest.raises(LLMPauseTimeoutError) as caught, producer.weight_sync(timeout=1.5):
        pass
    [(worker, calls)] = caught.value.busy.items()
    assert calls == 1 and worker in str(caught.value)
    assert not producer.llm_gate_status().paused  # weight_sync resumed although the pause raised
    [rollout] = producer.wait([task.rollout_id], timeout=30)
    assert rollout.metadata["status"] == "succeeded"


def test_a_weight_sync_inside_another_keeps_the_pause_until_the_outer_block_ends(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess], fake: FakeVLLM
) -> None:
    producer, _ = _producer(redis_server, namespace, fake)
    workers(redis_server.url, namespace, env=AGENT)
    _live(producer, 1)
    with producer.weight_sync(timeout=10) as outer:
        with producer.weight_sync(timeout=10) as inner:  # e.g. a helper that syncs, called inside a step that does
            assert inner is outer
        assert producer.llm_gate_status().paused  # the inner block's end did not lift the outer's pause
    assert not producer.llm_gate_status().paused

    async def nested() -> tuple[bool, bool]:
        async with AsyncProducer.from_url(redis_server.url, namespace=namespace) as aio:
            async with aio.weight_sync(timeout=10):
                async with aio.weight_sync(timeout=10):
                    pass
                inside = (await aio.llm_gate_status()).paused
            return inside, (await aio.llm_gate_status()).paused

    assert asyncio.run(nested()) == (True, False)


def test_the_async_producer_pauses_and_resumes(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess], fake: FakeVLLM
) -> None:
    producer, _ = _producer(redis_server, namespace, fake)
    workers(redis_server.url, namespace, env=AGENT)
    _live(producer, 1)

    async def main() -> tuple[float, bool, bool]:
        async with AsyncProducer.from_url(redis_server.url, namespace=namespace) as aio:
            async with aio.weight_sync(timeout=10) as report:
                paused = (await aio.llm_gate_status()).drained
            return report.seconds_to_drained, paused, (await aio.llm_gate_status()).paused

    seconds, paused, after = asyncio.run(main())
    assert paused and not after and seconds < 5


def test_a_listening_worker_sees_a_pause_at_once_not_at_its_next_heartbeat(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess], fake: FakeVLLM
) -> None:
    producer, _ = _producer(redis_server, namespace, fake)
    for _ in range(2):
        workers(redis_server.url, namespace, env={**AGENT, "ROLLQ_HEARTBEAT_SECONDS": "30"})
    _live(producer, 2)
    times = []
    for _ in range(3):
        with producer.weight_sync(timeout=10) as report:
            times.append(report.seconds_to_drained)
        assert report.workers == 2
    assert max(times) < 2.0, times  # a heartbeat is 30 s here
    [task] = producer.enqueue_many([{"steps": ["async"]}], mode="train")
    [rollout] = producer.wait([task.rollout_id], timeout=30)
    assert rollout.metadata["status"] == "succeeded"  # and the gates opened again


def test_a_worker_that_stops_is_no_longer_waited_for(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess], fake: FakeVLLM
) -> None:
    producer, _ = _producer(redis_server, namespace, fake)
    worker = workers(redis_server.url, namespace, env=AGENT)
    _live(producer, 1)
    worker.stop(timeout=30)
    assert producer.llm_gate_status().workers == 0
    assert producer.pause_llm(timeout=2).workers == 0
    producer.resume_llm()


@pytest.mark.slow
def test_a_worker_killed_with_calls_running_holds_a_pause_only_until_its_report_expires(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess], fake: FakeVLLM
) -> None:
    producer, _ = _producer(redis_server, namespace, fake)
    worker = workers(redis_server.url, namespace, env=AGENT)  # heartbeat 1 s: a report lives 3 s
    _live(producer, 1)
    fake.delay = 30.0
    producer.enqueue_many([{"steps": ["async"]}], mode="train")
    wait_until(lambda: fake.in_flight == 1, "a call in flight")
    worker.signal(signal.SIGKILL)
    try:
        report = producer.pause_llm(timeout=15)
    finally:
        producer.resume_llm()
    assert report.workers == 0 and report.seconds_to_drained < 6, report
