"""Many rollouts in flight in one worker process, each still a proper RQ job."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, Status, StatusCode
from rq.registry import FinishedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from rollq.models import RolloutPolicy
from rollq.producer import Producer
from rollq.store.connection import connect
from rollq.worker import LitAgent, RolloutWorker, WorkerSettings
from rollq.worker.normalize import span_json


class Gauge:
    """Counts rollouts in flight and remembers the most at once."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.threads_seen = 0
        self.lock = threading.Lock()

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.threads_seen = max(self.threads_seen, threading.active_count())

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


class SlowAsyncAgent(LitAgent):
    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge

    async def training_rollout_async(self, task_input, rollout_id, resources):  # type: ignore[no-untyped-def]
        self.gauge.enter()
        try:
            await asyncio.sleep(0.3)
        finally:
            self.gauge.leave()
        return float(task_input["i"])


def _producer() -> Producer:
    return Producer.from_url(f"memory://{uuid.uuid4().hex}", namespace="conc")


def test_one_worker_runs_its_concurrency_in_flight_without_a_thread_each() -> None:
    producer = _producer()
    tasks = producer.enqueue_many([{"i": i} for i in range(120)], mode="train")
    gauge = Gauge()
    before = threading.active_count()  # threads earlier tests of this process left running do not count
    worker = RolloutWorker(
        ["conc"], connection=producer.connection, agent=SlowAsyncAgent(gauge), settings=WorkerSettings(concurrency=60)
    )
    worker.work(burst=True, logging_level="WARNING")
    rollouts = producer.wait([t.rollout_id for t in tasks], timeout=30)
    assert [r.final_reward for r in rollouts] == [float(i) for i in range(120)]
    assert gauge.most == 60
    # 60 rollouts in flight on a handful of threads: loop, heartbeat, bookkeeping pool, main.
    assert gauge.threads_seen - before < 20, threading.enumerate()


def test_every_rollout_is_a_finished_rq_job_and_none_stays_started() -> None:
    producer = _producer()
    tasks = producer.enqueue_many([{"i": i} for i in range(30)], mode="train")
    worker = RolloutWorker(
        ["conc"], connection=producer.connection, agent=SlowAsyncAgent(Gauge()), settings=WorkerSettings(concurrency=10)
    )
    worker.work(burst=True, logging_level="WARNING")
    producer.wait([t.rollout_id for t in tasks], timeout=30)
    finished = FinishedJobRegistry("conc", connection=producer.connection, serializer=JSONSerializer)
    started = StartedJobRegistry("conc", connection=producer.connection, serializer=JSONSerializer)
    assert set(finished.get_job_ids(cleanup=False)) == {producer.keys.job_id(t.rollout_id) for t in tasks}
    assert started.get_job_ids(cleanup=False) == []


def test_span_json_equals_the_sdk_json_round_trip() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("outer", attributes={"seq": (1, 2), "s": "v"}) as outer:
        outer.add_event("event", {"xs": (1.5,)})
        with tracer.start_as_current_span("inner", links=[Link(outer.get_span_context(), {"l": 1})]) as inner:
            inner.set_status(Status(StatusCode.ERROR, "boom"))
    spans = exporter.get_finished_spans()
    assert len(spans) == 2
    for span in spans:
        assert span_json(span) == json.loads(span.to_json())


def test_a_timed_out_async_agent_is_cancelled_and_no_thread_waits_for_it() -> None:
    cancelled = threading.Event()

    class Hangs(LitAgent):
        async def training_rollout_async(self, task_input, rollout_id, resources):  # type: ignore[no-untyped-def]
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

    producer = _producer()
    task = producer.enqueue({}, mode="train", policy=RolloutPolicy(timeout_seconds=0.5, max_attempts=1))
    RolloutWorker(["conc"], connection=producer.connection, agent=Hangs()).work(burst=True, logging_level="WARNING")
    (rollout,) = producer.wait([task.rollout_id], timeout=30)
    assert rollout.metadata["status"] == "failed"
    assert rollout.metadata["error"]["type"] == "AgentTimeoutError"
    assert cancelled.wait(5)


def test_job_template_payload_is_what_rq_itself_writes() -> None:
    from rq.job import Job

    from rollq.store.jobs import ROLLOUT_FUNC, JobTemplate

    producer = _producer()
    template = JobTemplate(producer.connection, queue_name="conc", timeout_seconds=5)
    fields = template.fields("rollout-x", "rollout rollout-x (train)")
    producer.connection.hset("rq:job:tpl-check", mapping=dict(zip(fields[::2], fields[1::2], strict=True)))
    job = Job.fetch("tpl-check", connection=producer.connection, serializer=JSONSerializer)
    reference = Job.create(ROLLOUT_FUNC, args=["rollout-x"], connection=producer.connection, serializer=JSONSerializer)
    assert (job.func_name, job.args, job.kwargs) == (ROLLOUT_FUNC, ["rollout-x"], {})
    assert job.data == reference.data
    assert (job.origin, job.description, job.get_status(refresh=False)) == (
        "conc",
        "rollout rollout-x (train)",
        "queued",
    )


@pytest.mark.redis
def test_jobs_taken_ahead_but_not_started_go_back_to_the_head_of_the_queue(redis_server, namespace) -> None:  # type: ignore[no-untyped-def]
    producer = Producer.from_url(redis_server.url, namespace)
    ids = [
        producer.keys.job_id(t.rollout_id) for t in producer.enqueue_many([{"i": i} for i in range(10)], mode="train")
    ]
    worker = RolloutWorker(
        [namespace],
        connection=connect(redis_server.url),
        agent=SlowAsyncAgent(Gauge()),
        settings=WorkerSettings(concurrency=4),
    )
    keys, client = producer.keys, producer.connection
    dequeued = worker.dequeue_job_and_maintain_ttl(1)
    assert dequeued is not None and dequeued[0].id == ids[0]
    # One dequeue took as many jobs as there were free slots, the way RQ's own dequeue moves them.
    assert [j.decode() for j in client.lrange(keys.rq_intermediate, 0, -1)] == ids[:4]

    worker._give_back_taken()
    assert [j.decode() for j in client.lrange(keys.rq_queue, 0, -1)] == ids[1:]
    assert [j.decode() for j in client.lrange(keys.rq_intermediate, 0, -1)] == ids[:1]
