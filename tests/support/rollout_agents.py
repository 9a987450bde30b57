"""Agents and hooks for rollout-path tests, run in-process or by ``rq worker`` subprocesses.

Workers load them as ``tests.support.rollout_agents:Name`` (the repo root is on their
PYTHONPATH). The task input picks what the agent returns, so one worker fleet
can exercise every RolloutRawResult case. Hooks report what they see to Redis
(``ROLLQ_TEST_REDIS_URL``, list ``ROLLQ_TEST_EVENTS_KEY``) so that the test, in
another process, can check where and how often they ran.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from typing import Any

import redis
from opentelemetry import trace

from rollq.models.contract import LLM, Hook, NamedResources, Rollout, Task, Triplet
from rollq.worker.agent import LitAgent
from rollq.worker.tracer import emit_reward, llm_call_span

KINDS = ("none_spans", "float", "int", "triplets", "dicts", "spans", "rollout", "raise", "resources")
"""Values of ``task_input["kind"]``, each selecting one kind of result."""


def _result(task_input: dict[str, Any], rollout_id: str, resources: NamedResources, method: str) -> Any:
    kind = task_input["kind"]
    if kind == "none_spans":
        with llm_call_span("test-model", f"prompt of {rollout_id}") as span:
            span.set_attribute("gen_ai.completion", f"answer of {rollout_id}")
        emit_reward(0.75)
        return None
    if kind == "float":
        return float(task_input.get("reward", 0.5))
    if kind == "int":
        return 2
    if kind == "triplets":
        return [Triplet(prompt="p1", response="r1", reward=0.1), Triplet(prompt="p2", response="r2", reward=0.25)]
    if kind == "dicts":
        return [{"name": "custom-span", "attributes": {"rollout": rollout_id}}]
    if kind == "spans":
        tracer = trace.get_tracer("tests.support.rollout_agents")
        spans = []
        for name in ("step-a", "step-b"):
            with tracer.start_as_current_span(name) as span:
                spans.append(span)
        return spans
    if kind == "rollout":
        return Rollout(rollout_id="not-the-task-id", final_reward=0.9, logs=["done"], metadata={"method": method})
    if kind == "raise":
        raise ValueError(f"agent failed on {rollout_id}")
    if kind == "resources":
        llm = resources["main_llm"]
        assert isinstance(llm, LLM)
        return Rollout(rollout_id=rollout_id, final_reward=1.0, metadata={"model": llm.model, "method": method})
    raise AssertionError(f"unknown kind {kind!r}")


class SyncKindsAgent(LitAgent):
    """A sync agent whose result kind is chosen by ``task_input["kind"]``."""

    def training_rollout(self, task_input: Any, rollout_id: str, resources: NamedResources) -> Any:
        return _result(task_input, rollout_id, resources, "training")

    def validation_rollout(self, task_input: Any, rollout_id: str, resources: NamedResources) -> Any:
        return _result(task_input, rollout_id, resources, "validation")


class AsyncKindsAgent(LitAgent):
    """The async twin of :class:`SyncKindsAgent`; it yields to the loop so rollouts overlap."""

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: NamedResources) -> Any:
        await asyncio.sleep(task_input.get("sleep", 0.001))
        return _result(task_input, rollout_id, resources, "training")

    async def validation_rollout_async(self, task_input: Any, rollout_id: str, resources: NamedResources) -> Any:
        await asyncio.sleep(task_input.get("sleep", 0.001))
        return _result(task_input, rollout_id, resources, "validation")


class RecordingHook(Hook):
    """Pushes one JSON event per lifecycle call, with this process's pid, to a Redis list."""

    def __init__(self) -> None:
        super().__init__()
        self._redis: redis.Redis | None = None
        self._lock = threading.Lock()

    def _record(self, event: str, rollout_id: str | None = None, **extra: Any) -> None:
        with self._lock:
            if self._redis is None:
                self._redis = redis.Redis.from_url(os.environ["ROLLQ_TEST_REDIS_URL"])
        entry = {"event": event, "pid": os.getpid(), "worker_id": self.worker_id, "rollout_id": rollout_id, **extra}
        self._redis.rpush(os.environ["ROLLQ_TEST_EVENTS_KEY"], json.dumps(entry))

    def init_worker(self, worker_id: int, *args: Any, **kwargs: Any) -> None:
        super().init_worker(worker_id)
        self._record("init_worker")

    def on_rollout_start(self, task: Task, runner: Any, tracer: Any) -> None:
        self._record("start", task.rollout_id)

    def on_rollout_end(self, task: Task, rollout: Rollout, runner: Any, tracer: Any) -> None:
        self._record("end", task.rollout_id, status=rollout.metadata.get("status"))

    def teardown_worker(self, worker_id: int, *args: Any, **kwargs: Any) -> None:
        self._record("teardown_worker")


class RaisingHook(Hook):
    """A hook that fails around every rollout."""

    def on_rollout_start(self, task: Task, runner: Any, tracer: Any) -> None:
        raise RuntimeError(f"hook failure before {task.rollout_id}")

    def on_rollout_end(self, task: Task, rollout: Rollout, runner: Any, tracer: Any) -> None:
        raise RuntimeError(f"hook failure after {task.rollout_id}")


def read_events(connection: redis.Redis, key: str) -> list[dict[str, Any]]:
    """The events :class:`RecordingHook` pushed to ``key``."""
    return [json.loads(raw) for raw in connection.lrange(key, 0, -1)]


def token_ids(task_input: dict[str, Any], turn: int) -> list[int]:
    """The token ids of one turn of :class:`BigTokenIdsAgent`'s rollout: ``task_input["ids"]`` of them, seeded by the
    task and the turn, so the test can check every id that comes back."""
    seed = int(task_input["seed"]) * 1000 + turn
    return [(seed * 7919 + i * 104729) % 151_936 for i in range(int(task_input["ids"]))]


class BigTokenIdsAgent(LitAgent):
    """Returns ``task_input["turns"]`` triplets of :func:`token_ids` (a big rollout when there are many)."""

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: NamedResources) -> Any:
        return [
            Triplet(prompt={"token_ids": token_ids(task_input, t)}, response={"text": "ok"}, reward=float(t))
            for t in range(int(task_input["turns"]))
        ]
