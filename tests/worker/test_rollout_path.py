"""The rollout path end to end: a real redis-server, stock ``rq worker -w rollq.worker.RolloutWorker`` subprocesses.

Agents and hooks come from ``tests/support/rollout_agents.py``; the hooks report to a
Redis list what ran, in which process, so the test can check it from outside.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from rollq.models.contract import LLM, Rollout
from rollq.producer import Producer
from tests.support.rollout_agents import read_events
from tests.support.servers import RedisServer, WorkerProcess

pytestmark = pytest.mark.redis

WAIT = 60.0
AGENTS = "tests.support.rollout_agents"
RESULT_KINDS = ("none_spans", "float", "int", "triplets", "dicts", "spans", "rollout")


def hook_env(
    url: str, events_key: str, *, agent: str, concurrency: int, hooks: str = "RecordingHook"
) -> dict[str, str]:
    return {
        "ROLLQ_AGENT": f"{AGENTS}:{agent}",
        "ROLLQ_HOOKS": ",".join(f"{AGENTS}:{h}" for h in hooks.split(",")),
        "ROLLQ_CONCURRENCY": str(concurrency),
        "ROLLQ_TEST_REDIS_URL": url,
        "ROLLQ_TEST_EVENTS_KEY": events_key,
    }


def wait_for_events(
    client: redis.Redis, key: str, event: str, count: int, procs: list[WorkerProcess]
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        found = [e for e in read_events(client, key) if e["event"] == event]
        if len(found) >= count:
            return found
        assert all(p.process.poll() is None for p in procs), "a worker exited:\n" + "\n".join(
            p.log()[-3000:] for p in procs
        )
        time.sleep(0.05)
    raise AssertionError(
        f"fewer than {count} {event} events after {WAIT}s:\n" + "\n".join(p.log()[-3000:] for p in procs)
    )


@dataclass
class Fleet:
    """Two async-agent workers (8 rollouts each at once) with a raising hook before a recording one."""

    producer: Producer
    client: redis.Redis
    events_key: str
    procs: list[WorkerProcess]

    @property
    def pids(self) -> set[int]:
        return {p.pid for p in self.procs}

    def events(self, rollout_ids: set[str] | None = None) -> list[dict[str, Any]]:
        found = read_events(self.client, self.events_key)
        return found if rollout_ids is None else [e for e in found if e["rollout_id"] in rollout_ids]

    def logs(self) -> str:
        return "\n".join(p.log() for p in self.procs)


@pytest.fixture(scope="module")
def fleet(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    # Module-scoped, unlike the `workers` fixture: starting workers is the slow part, and these tests share them.
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    events_key = f"rollq-test:{namespace}:events"
    env = hook_env(
        redis_server.url, events_key, agent="AsyncKindsAgent", concurrency=8, hooks="RaisingHook,RecordingHook"
    )
    logs = tmp_path_factory.mktemp("fleet")
    procs = [WorkerProcess(redis_server.url, namespace, logs / f"worker-{i}.log", env=env) for i in range(2)]
    try:
        client = redis_server.client()
        wait_for_events(client, events_key, "init_worker", 2, procs)
        yield Fleet(Producer.from_url(redis_server.url, namespace), client, events_key, procs)
    finally:
        for proc in procs:
            proc.stop(timeout=30)


def stream_counts(producer: Producer, stream: str) -> Counter[str]:
    """How many entries each rollout id has in ``stream``."""
    entries = producer.connection.xrange(stream)
    return Counter(fields[b"rollout_id"].decode() for _, fields in entries)


def enqueue_kinds(producer: Producer, mode: str = "train") -> dict[str, str]:
    tasks = producer.enqueue_many([{"kind": kind} for kind in RESULT_KINDS], mode=mode)
    return {kind: task.rollout_id for kind, task in zip(RESULT_KINDS, tasks, strict=True)}


def assert_kind_normalised(kind: str, rid: str, rollout: Rollout) -> None:
    assert rollout.rollout_id == rid
    assert rollout.metadata["status"] == "succeeded" and rollout.metadata["attempt"] == 1, rollout.metadata
    if kind == "none_spans":
        assert rollout.trace is not None
        assert [s["name"] for s in rollout.trace] == ["rollout", "chat test-model", "reward"]
        assert [(t.prompt, t.response, t.reward) for t in rollout.triplets or []] == [
            ({"text": f"prompt of {rid}"}, {"text": f"answer of {rid}"}, 0.75)
        ]
        assert rollout.final_reward == 0.75
    elif kind == "float":
        assert rollout.final_reward == 0.5
    elif kind == "int":
        assert rollout.final_reward == 2.0
    elif kind == "triplets":
        assert [(t.prompt, t.reward) for t in rollout.triplets or []] == [("p1", 0.1), ("p2", 0.25)]
        assert rollout.final_reward == 0.25
    elif kind == "dicts":
        assert rollout.trace == [{"name": "custom-span", "attributes": {"rollout": rid}}]
        assert rollout.final_reward is None
    elif kind == "spans":
        assert [s["name"] for s in rollout.trace or []] == ["step-a", "step-b"]
        assert all(s["context"]["trace_id"] for s in rollout.trace or [])
    elif kind == "rollout":
        assert (rollout.final_reward, rollout.logs, rollout.metadata["method"]) == (0.9, ["done"], "training")
    else:
        raise AssertionError(kind)


def assert_failed_with_agent_error(producer: Producer, rid: str, rollout: Rollout) -> None:
    assert rollout.metadata["status"] == "failed"
    error = rollout.metadata["error"]
    assert {k: error[k] for k in ("type", "message")} == {"type": "ValueError", "message": f"agent failed on {rid}"}
    # The stack travels with the failure, ending at the agent's raise.
    assert error["traceback"].startswith("Traceback") and f"ValueError: agent failed on {rid}" in error["traceback"]
    assert rollout.final_reward is None
    assert rid in producer.dead_letter()
    assert producer.get_task(rid).num_claims == 1  # agent exceptions are not retried by default


def assert_mode_dispatch(producer: Producer) -> None:
    modes: list[Any] = ["train", "val", "test", None]
    tasks = [producer.enqueue({"kind": "rollout"}, mode=mode) for mode in modes]
    rollouts = producer.wait([t.rollout_id for t in tasks], timeout=WAIT)
    assert [r.metadata["method"] for r in rollouts] == ["training", "validation", "validation", "validation"]


def test_200_tasks_give_200_rollouts_each_published_once_and_claimed_once(fleet: Fleet) -> None:
    producer = fleet.producer
    tasks = producer.enqueue_many([{"kind": "float", "reward": i / 1000} for i in range(200)], mode="train")
    ids = [t.rollout_id for t in tasks]
    rollouts = producer.wait(ids, timeout=WAIT)
    assert [r.final_reward for r in rollouts] == [i / 1000 for i in range(200)]

    published = stream_counts(producer, producer.keys.results)
    assert {rid: published[rid] for rid in ids} == dict.fromkeys(ids, 1)
    assert not set(stream_counts(producer, producer.keys.superseded)) & set(ids)
    assert [producer.get_task(rid).num_claims for rid in ids] == [1] * 200
    # Both processes took part: the ids are spread over two worker pids.
    assert {e["pid"] for e in fleet.events(set(ids))} == fleet.pids


def test_init_worker_ran_once_in_each_worker_process_with_distinct_ids(fleet: Fleet) -> None:
    inits = [e for e in fleet.events() if e["event"] == "init_worker"]
    assert len(inits) == 2
    assert {e["pid"] for e in inits} == fleet.pids
    assert len({e["worker_id"] for e in inits}) == 2


def test_rollout_hooks_ran_once_per_rollout_inside_the_worker_processes(fleet: Fleet) -> None:
    producer = fleet.producer
    tasks = producer.enqueue_many([{"kind": "float"}] * 40, mode="train")
    ids = {t.rollout_id for t in tasks}
    producer.wait(list(ids), timeout=WAIT)
    worker_ids = {e["pid"]: e["worker_id"] for e in fleet.events() if e["event"] == "init_worker"}

    events = fleet.events(ids)
    for event in ("start", "end"):
        assert Counter(e["rollout_id"] for e in events if e["event"] == event) == Counter(ids)
    for e in events:
        assert e["pid"] in fleet.pids
        assert e["worker_id"] == worker_ids[e["pid"]]
    for rid in ids:
        start, end = [(e["event"], e["pid"]) for e in events if e["rollout_id"] == rid]
        assert start[0] == "start" and end[0] == "end" and start[1] == end[1]
    assert {e["status"] for e in events if e["event"] == "end"} == {"succeeded"}


def test_a_raising_hook_is_logged_by_name_and_the_rollout_still_published(fleet: Fleet) -> None:
    producer = fleet.producer
    task = producer.enqueue({"kind": "float"}, mode="train")
    [rollout] = producer.wait([task.rollout_id], timeout=WAIT)
    assert rollout.metadata["status"] == "succeeded" and rollout.final_reward == 0.5
    logs = fleet.logs()
    assert "hook RaisingHook.on_rollout_start raised" in logs
    assert "hook RaisingHook.on_rollout_end raised" in logs
    assert f"RuntimeError: hook failure before {task.rollout_id}" in logs
    # The hook after the raising one still ran.
    assert [e["event"] for e in fleet.events({task.rollout_id})] == ["start", "end"]


def test_async_agent_results_of_every_kind_become_the_right_rollouts(fleet: Fleet) -> None:
    producer = fleet.producer
    ids = enqueue_kinds(producer)
    rollouts = producer.wait(list(ids.values()), timeout=WAIT)
    for (kind, rid), rollout in zip(ids.items(), rollouts, strict=True):
        assert_kind_normalised(kind, rid, rollout)


def test_async_agent_exception_gives_a_failed_rollout_with_the_error(fleet: Fleet) -> None:
    task = fleet.producer.enqueue({"kind": "raise"}, mode="train")
    [rollout] = fleet.producer.wait([task.rollout_id], timeout=WAIT)
    assert_failed_with_agent_error(fleet.producer, task.rollout_id, rollout)


def test_async_agent_mode_train_runs_training_and_other_modes_validation(fleet: Fleet) -> None:
    assert_mode_dispatch(fleet.producer)


def test_sync_agent_on_one_slot_handles_every_kind_failures_and_modes(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    producer = Producer.from_url(redis_server.url, namespace)
    workers(redis_server.url, namespace, env={"ROLLQ_AGENT": f"{AGENTS}:SyncKindsAgent", "ROLLQ_CONCURRENCY": "1"})
    ids = enqueue_kinds(producer)
    failing = producer.enqueue({"kind": "raise"}, mode="val")
    rollouts = producer.wait([*ids.values(), failing.rollout_id], timeout=WAIT)
    for (kind, rid), rollout in zip(ids.items(), rollouts[:-1], strict=True):
        assert_kind_normalised(kind, rid, rollout)
    assert_failed_with_agent_error(producer, failing.rollout_id, rollouts[-1])
    assert_mode_dispatch(producer)


def test_pinned_tasks_use_their_version_and_unpinned_ones_the_latest_when_they_run(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    producer = Producer.from_url(redis_server.url, namespace)
    v1 = producer.update_resources({"main_llm": LLM(endpoint="http://llm", model="model-v1")})
    early_pinned = producer.enqueue_many([{"kind": "resources"}] * 3, mode="train", resources_id=v1)
    early_unpinned = producer.enqueue_many([{"kind": "resources"}] * 3, mode="train")
    producer.update_resources({"main_llm": LLM(endpoint="http://llm", model="model-v2")})
    late_pinned = producer.enqueue({"kind": "resources"}, mode="val", resources_id=v1)
    late_unpinned = producer.enqueue({"kind": "resources"}, mode="val")
    # The worker starts only now, so every task runs after v2 became the latest.
    workers(redis_server.url, namespace, env={"ROLLQ_AGENT": f"{AGENTS}:SyncKindsAgent", "ROLLQ_CONCURRENCY": "1"})

    pinned = producer.wait([t.rollout_id for t in [*early_pinned, late_pinned]], timeout=WAIT)
    unpinned = producer.wait([t.rollout_id for t in [*early_unpinned, late_unpinned]], timeout=WAIT)
    assert [r.metadata["model"] for r in pinned] == ["model-v1"] * 4
    assert [r.metadata["model"] for r in unpinned] == ["model-v2"] * 4
    assert [r.metadata["method"] for r in pinned] == ["training"] * 3 + ["validation"]


def test_teardown_worker_runs_in_each_worker_process_on_sigterm(
    redis_server: RedisServer, namespace: str, workers: Callable[..., WorkerProcess]
) -> None:
    client = redis_server.client()
    events_key = f"rollq-test:{namespace}:events"
    env = hook_env(redis_server.url, events_key, agent="SyncKindsAgent", concurrency=2)
    procs = [workers(redis_server.url, namespace, env=env) for _ in range(2)]
    inits = wait_for_events(client, events_key, "init_worker", 2, procs)
    producer = Producer.from_url(redis_server.url, namespace)
    tasks = producer.enqueue_many([{"kind": "float"}] * 6, mode="train")
    producer.wait([t.rollout_id for t in tasks], timeout=WAIT)
    assert not [e for e in read_events(client, events_key) if e["event"] == "teardown_worker"]

    for proc in procs:
        proc.signal(signal.SIGTERM)
    assert [proc.wait(timeout=WAIT) for proc in procs] == [0, 0]

    teardowns = [e for e in read_events(client, events_key) if e["event"] == "teardown_worker"]
    assert sorted((e["pid"], e["worker_id"]) for e in teardowns) == sorted((e["pid"], e["worker_id"]) for e in inits)
    assert {e["pid"] for e in teardowns} == {p.pid for p in procs}
