"""The producer on an in-process fake Redis (memory://), with rollouts made by an in-process RolloutWorker."""

from __future__ import annotations

import asyncio
import re
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from rollq.models.contract import LLM, Rollout
from rollq.models.errors import (
    ContractShapeError,
    InvalidTaskError,
    RolloutTimeoutError,
    RolloutTrimmedError,
    UnknownResourcesError,
    UnknownTaskError,
)
from rollq.producer import Producer
from rollq.producer.aio import AsyncProducer
from rollq.store.connection import connect
from rollq.worker.agent import LitAgent
from rollq.worker.config import WorkerSettings
from rollq.worker.rq_worker import RolloutWorker
from tests.support.rollout_agents import AsyncKindsAgent, SyncKindsAgent

WAIT = 60.0


@pytest.fixture
def run_worker(url: str, namespace: str) -> Callable[..., None]:
    """Run a RolloutWorker in this process until the queue is empty."""

    def run(agent: LitAgent | None = None, **settings: Any) -> None:
        worker = RolloutWorker(
            [namespace],
            connection=connect(url),
            agent=agent or AsyncKindsAgent(),
            settings=WorkerSettings(**{"concurrency": 4, **settings}),
        )
        # RQ installs its SIGINT/SIGTERM handlers for good; pytest's own must come back after the run.
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            worker.work(burst=True, logging_level="WARNING")
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    return run


def resources(model: str) -> dict[str, LLM]:
    return {"main_llm": LLM(endpoint="http://llm", model=model)}


def queued_job_ids(producer: Producer) -> list[str]:
    return [j.decode() for j in producer.connection.lrange(producer.keys.rq_queue, 0, -1)]


def test_enqueue_gives_fresh_ids_a_create_time_and_no_claims(producer: Producer) -> None:
    tasks = [producer.enqueue({"n": i}, mode="train") for i in range(3)] + producer.enqueue_many([1, 2], mode="val")
    assert len({t.rollout_id for t in tasks}) == 5
    for task in tasks:
        assert task.create_time is not None and task.create_time > 0
        assert task.num_claims == 0 and task.last_claim_time is None
        stored = producer.get_task(task.rollout_id)
        assert stored == task


def test_get_task_of_an_unknown_id_raises(producer: Producer) -> None:
    with pytest.raises(UnknownTaskError, match="never-enqueued"):
        producer.get_task("never-enqueued")


def test_get_rollout_returns_the_published_failure_of_an_invalid_record_as_get_rollouts_does(
    url: str, namespace: str, producer: Producer, run_worker: Callable[..., None]
) -> None:
    # An outside audit: get_rollout raised InvalidTaskError for a task whose failed rollout (naming it) was
    # published, while get_rollouts returned that rollout.
    rid = producer.enqueue({}).rollout_id
    producer.connection.hset(producer.keys.task(rid), "task", "not json")
    run_worker()

    rollout = producer.get_rollout(rid)
    assert rollout is not None and rollout.metadata["error"]["type"] == "InvalidTaskError"
    assert producer.get_rollouts([rid]) == {rid: rollout}
    assert asyncio.run(AsyncProducer.from_url(url, namespace).get_rollout(rid)) == rollout


def test_enqueueing_a_known_rollout_id_again_queues_it_once(producer: Producer) -> None:
    first = producer.enqueue({"v": 1}, mode="train", rollout_id="fixed-id")
    again = producer.enqueue({"v": 2}, mode="val", rollout_id="fixed-id")
    assert again == first and again.input == {"v": 1}
    batch = producer.enqueue_many([{"v": 3}, {"v": 4}], rollout_ids=["dup", "dup"])
    assert batch[0] == batch[1] and batch[1].input == {"v": 3}
    assert queued_job_ids(producer) == [producer.keys.job_id("fixed-id"), producer.keys.job_id("dup")]


@pytest.mark.parametrize(("count", "round_trips"), [(2000, 1), (2001, 2)])
def test_enqueue_many_sends_one_pipelined_round_trip_per_2000_tasks(
    producer: Producer, monkeypatch: pytest.MonkeyPatch, count: int, round_trips: int
) -> None:
    producer.enqueue("warm up: the enqueue script is loaded once per server")
    pipelines: list[int] = []
    make_pipeline = producer.connection.pipeline

    def counting_pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = make_pipeline(*args, **kwargs)
        execute = pipe.execute

        def counted_execute(*a: Any, **k: Any) -> Any:
            pipelines.append(len(pipe.command_stack))
            return execute(*a, **k)

        pipe.execute = counted_execute
        return pipe

    sends: list[int] = []
    connection_class = producer.connection.connection_pool.connection_class
    send = connection_class.send_packed_command

    def counting_send(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        sends.append(1)
        return send(self, command, *args, **kwargs)

    monkeypatch.setattr(producer.connection, "pipeline", counting_pipeline)
    monkeypatch.setattr(connection_class, "send_packed_command", counting_send)
    tasks = producer.enqueue_many(range(count))
    monkeypatch.undo()

    # One pipeline per 2000 tasks, whatever number of Lua calls it carries them in.
    assert len(pipelines) == round_trips
    # Each pipeline costs redis-py one SCRIPT EXISTS check besides its own round trip.
    assert len(sends) <= 2 * round_trips
    assert len(queued_job_ids(producer)) == count + 1 and len(tasks) == count


def test_each_task_is_a_queued_rq_job_that_names_the_rollout_function(producer: Producer, namespace: str) -> None:
    tasks = [producer.enqueue({"q": 1}, mode="train"), producer.enqueue({"q": 2}, rollout_id="odd id: with spaces")]
    assert queued_job_ids(producer) == [producer.keys.job_id(t.rollout_id) for t in tasks]
    for task in tasks:
        job = Job.fetch(
            producer.keys.job_id(task.rollout_id), connection=producer.connection, serializer=JSONSerializer
        )
        assert job.func_name == "rollq.worker.jobs.run_rollout"
        assert job.args == [task.rollout_id] and job.kwargs == {}
        assert job.get_status() == JobStatus.QUEUED
        assert job.origin == namespace


def test_resources_are_read_back_by_id_and_as_latest(producer: Producer) -> None:
    v1 = producer.update_resources(resources("model-1"))
    v2 = producer.update_resources(resources("model-2"))
    assert (v1, v2) == ("v1", "v2")
    assert producer.get_resources(v1).resources["main_llm"].model == "model-1"  # type: ignore[union-attr]
    latest = producer.get_resources()
    assert latest.resources_id == "v2" and isinstance(latest.resources["main_llm"], LLM)
    assert latest.resources["main_llm"].model == "model-2"


def test_unknown_resources_id_raises_and_queues_nothing(producer: Producer) -> None:
    with pytest.raises(UnknownResourcesError, match="no resources have been published"):
        producer.get_resources()
    producer.update_resources(resources("m"))
    with pytest.raises(UnknownResourcesError, match="'v7'"):
        producer.get_resources("v7")
    with pytest.raises(UnknownResourcesError, match="'v7'"):
        producer.enqueue({"q": 1}, resources_id="v7")
    with pytest.raises(UnknownResourcesError, match="'v7'"):
        producer.enqueue_many([1, 2], resources_id="v7")
    assert queued_job_ids(producer) == []


def test_old_versions_are_pruned_except_those_unfinished_tasks_pin(
    url: str, namespace: str, run_worker: Callable[..., None]
) -> None:
    producer = Producer.from_url(url, namespace, keep_versions=2)
    v1 = producer.update_resources(resources("model-1"))
    pinned = producer.enqueue({"kind": "resources"}, mode="train", resources_id=v1)
    for n in (2, 3, 4):
        producer.update_resources(resources(f"model-{n}"))
    assert producer.resources.versions() == ["v1", "v3", "v4"]
    with pytest.raises(UnknownResourcesError):
        producer.get_resources("v2")

    run_worker()
    [rollout] = producer.wait([pinned.rollout_id], timeout=WAIT)
    assert rollout.metadata["model"] == "model-1"

    producer.update_resources(resources("model-5"))
    assert producer.resources.versions() == ["v4", "v5"]


def test_unpinned_tasks_run_with_the_latest_resources_at_run_time(
    producer: Producer, run_worker: Callable[..., None]
) -> None:
    v1 = producer.update_resources(resources("model-1"))
    pinned = producer.enqueue({"kind": "resources"}, mode="train", resources_id=v1)
    unpinned = producer.enqueue({"kind": "resources"}, mode="train")
    producer.update_resources(resources("model-2"))
    run_worker()
    got = producer.wait([pinned.rollout_id, unpinned.rollout_id], timeout=WAIT)
    assert [r.metadata["model"] for r in got] == ["model-1", "model-2"]


def test_wait_returns_rollouts_in_the_order_asked(producer: Producer, run_worker: Callable[..., None]) -> None:
    tasks = producer.enqueue_many([{"kind": "float", "reward": i / 10} for i in range(8)], mode="train")
    ids = [t.rollout_id for t in reversed(tasks)]
    run_worker()
    rollouts = producer.wait(ids, timeout=WAIT)
    assert [r.rollout_id for r in rollouts] == ids
    assert [r.final_reward for r in rollouts] == [i / 10 for i in reversed(range(8))]
    assert all(r.metadata["status"] == "succeeded" and r.metadata["attempt"] == 1 for r in rollouts)
    assert all(producer.get_task(rid).num_claims == 1 for rid in ids)


def test_wait_picks_up_rollouts_published_while_it_blocks(
    producer: Producer, run_worker: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = producer.enqueue_many([{"kind": "int"}] * 5, mode="val")
    ids = [t.rollout_id for t in tasks]
    reading = threading.Event()
    xread = producer.connection.xread

    def signalling_xread(*args: Any, **kwargs: Any) -> Any:
        reading.set()
        return xread(*args, **kwargs)

    monkeypatch.setattr(producer.connection, "xread", signalling_xread)
    got: list[list[Rollout]] = []
    waiter = threading.Thread(target=lambda: got.append(producer.wait(ids, timeout=WAIT)))
    waiter.start()
    # Nothing is published before wait() has found all five missing and turned to the stream.
    assert reading.wait(WAIT)
    run_worker(SyncKindsAgent())
    waiter.join(WAIT)
    assert [[r.rollout_id for r in rollouts] for rollouts in got] == [ids]


def test_wait_times_out_naming_the_missing_ids(producer: Producer, run_worker: Callable[..., None]) -> None:
    done = producer.enqueue({"kind": "float"}, mode="train")
    run_worker()
    missing = producer.enqueue_many([{"kind": "float"}] * 2, mode="train")
    missing_ids = [t.rollout_id for t in missing]
    with pytest.raises(RolloutTimeoutError) as exc:
        producer.wait([missing_ids[0], done.rollout_id, missing_ids[1]], timeout=0.3)
    assert exc.value.missing == missing_ids
    assert all(rid in str(exc.value) for rid in missing_ids) and done.rollout_id not in str(exc.value)


def test_results_stream_stays_near_results_maxlen(producer: Producer, run_worker: Callable[..., None]) -> None:
    maxlen = 10
    tasks = producer.enqueue_many([{"kind": "float"}] * 200, mode="train")
    run_worker(results_maxlen=maxlen)
    # XADD MAXLEN ~ trims whole stream nodes (100 entries each by default).
    assert maxlen <= producer.connection.xlen(producer.keys.results) <= maxlen + 100
    assert producer.wait([tasks[-1].rollout_id], timeout=WAIT)[0].rollout_id == tasks[-1].rollout_id
    with pytest.raises(RolloutTrimmedError, match=tasks[0].rollout_id):
        producer.wait([tasks[0].rollout_id], timeout=WAIT)


@pytest.fixture
def finished(producer: Producer, run_worker: Callable[..., None]) -> list[str]:
    """Ids of 20 rollouts already on the results stream."""
    tasks = producer.enqueue_many([{"kind": "float"}] * 20, mode="train")
    run_worker()
    return [t.rollout_id for t in tasks]


def test_two_readers_of_a_group_each_get_a_share_and_none_twice(producer: Producer, finished: list[str]) -> None:
    readers: list[Iterator[Rollout]] = [
        iter(producer.rollouts("trainers", consumer=name, idle_timeout=0.3, batch=5)) for name in ("a", "b")
    ]
    seen: dict[int, list[str]] = {0: [], 1: []}
    active = {0, 1}
    while active:
        for i in sorted(active):
            rollout = next(readers[i], None)
            if rollout is None:
                active.discard(i)
            else:
                seen[i].append(rollout.rollout_id)
    assert seen[0] and seen[1]
    assert sorted(seen[0] + seen[1]) == sorted(finished)
    assert producer.connection.xpending(producer.keys.results, "trainers")["pending"] == 0


def test_rollouts_a_reader_left_unacknowledged_go_to_another_after_claim_idle(
    producer: Producer, finished: list[str]
) -> None:
    dead = iter(producer.rollouts("trainers", consumer="dead", batch=5))
    taken = next(dead).rollout_id  # handed out, never acknowledged: the reader "dies" here
    survivor = producer.rollouts("trainers", consumer="survivor", claim_idle_seconds=0.2, idle_timeout=1.0, batch=5)
    got = [r.rollout_id for r in survivor]
    assert taken in got
    assert sorted(got) == sorted(finished)
    assert producer.connection.xpending(producer.keys.results, "trainers")["pending"] == 0


@pytest.mark.parametrize(
    ("task_input", "metadata", "where"),
    [
        ({"x": [1.0, float("nan")]}, None, "input['x'][1]"),
        ({"x": 1}, {"weights": {"a": float("inf")}}, "metadata['weights']['a']"),
        (float("-inf"), None, "input"),
    ],
)
def test_a_task_holding_nan_or_infinity_is_refused_naming_where_not_queued_as_null(
    producer: Producer, task_input: Any, metadata: Any, where: str
) -> None:
    # JSON has no NaN or Infinity: stored, they would become null and the agent would see another input.
    with pytest.raises(InvalidTaskError, match=re.escape(where)):
        producer.enqueue_many([{"ok": 1}, task_input], mode="train", metadata=metadata)
    assert producer.connection.llen(producer.keys.rq_queue) == 0


def test_resources_holding_nan_are_refused_naming_where(producer: Producer) -> None:
    llm = LLM(endpoint="http://llm", model="m", sampling_parameters={"temperature": float("nan")})
    with pytest.raises(ContractShapeError, match=re.escape("resources['main_llm']['sampling_parameters']")):
        producer.update_resources({"main_llm": llm})
    assert producer.connection.get(producer.keys.resources_latest) is None


@pytest.mark.parametrize("inputs", ["abc", b"abc", {"a": 1}])
def test_inputs_given_as_a_string_or_a_mapping_are_refused_not_queued_one_per_character(
    producer: Producer, inputs: Any
) -> None:
    with pytest.raises(TypeError, match="a list of task inputs"):
        producer.enqueue_many(inputs, mode="train")
    assert producer.pending() == 0


def test_waiting_on_a_string_of_ids_or_for_nan_seconds_is_refused(producer: Producer) -> None:
    with pytest.raises(TypeError, match="a list of rollout ids"):
        producer.wait("rollout-1", timeout=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be a finite number"):
        producer.wait(["rollout-1"], timeout=float("nan"))
    with pytest.raises(ValueError, match="timeout must be a finite number"):
        producer.pause_llm(timeout=float("nan"))
