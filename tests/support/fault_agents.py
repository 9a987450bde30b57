"""Agents and hooks for fault-injection tests, and the counting those tests share.

Worker subprocesses import the agents as ``tests.support.fault_agents:<Class>``; the
tests import the helpers as ``fault_agents``. The task input picks the
misbehaviour, so one worker can be fed a bad task and then a good one, which
shows that it kept serving.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import redis

from rollq.models.contract import Hook, NamedResources, Rollout, Task
from rollq.store.keys import Keys
from rollq.worker.agent import LitAgent


class FaultAgent(LitAgent):
    """Does what its input asks, then returns a reward of 1.0.

    Input keys (all optional): ``sleep`` seconds, or ``sleep_between`` ``[lo, hi]``
    for a random sleep; then ``raise`` (a message for a RuntimeError), ``wrong_type``
    (returns a dict, which is not a RolloutRawResult) or ``huge`` (returns a Rollout
    whose logs hold that many characters).
    """

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: NamedResources) -> Any:
        spec = task_input if isinstance(task_input, dict) else {}
        if "sleep_between" in spec:
            await asyncio.sleep(random.uniform(*spec["sleep_between"]))
        if "sleep" in spec:
            await asyncio.sleep(spec["sleep"])
        if "sleep_first" in spec and _attempt_of(rollout_id) == 1:
            await asyncio.sleep(spec["sleep_first"])
        if "raise" in spec:
            raise RuntimeError(spec["raise"])
        if spec.get("wrong_type"):
            return {"reward": 1.0}
        if "huge" in spec:
            return Rollout(rollout_id=rollout_id, final_reward=1.0, logs=["x" * spec["huge"]])
        return 1.0


def _attempt_of(rollout_id: str) -> int:
    # The attempt number is on the rollout's root span (see worker/tracer.py).
    from opentelemetry import trace

    attributes = getattr(trace.get_current_span(), "attributes", None) or {}
    return int(attributes.get("rollq.attempt", 1))


class RaisingHook(Hook):
    """A hook whose every callback raises; the rollout must still be published."""

    def on_rollout_start(self, task: Task, *args: Any) -> None:
        raise RuntimeError(f"on_rollout_start broke on {task.rollout_id}")

    def on_rollout_end(self, task: Task, *args: Any) -> None:
        raise RuntimeError(f"on_rollout_end broke on {task.rollout_id}")


class SlowInitHook(Hook):
    """Sleeps 3 s in ``init_worker``: the worker has reported to the LLM gate and started its threads, and RQ has
    not installed its signal handlers yet (it does so after the start-up)."""

    def init_worker(self, worker_id: int, *args: Any, **kwargs: Any) -> None:
        time.sleep(3)


def results_per_rollout(connection: redis.Redis, namespace: str) -> Counter[str]:
    """How many entries the results stream holds for each rollout id."""
    counts: Counter[str] = Counter()
    cursor = "-"
    while True:
        entries = connection.xrange(Keys(namespace).results, min=cursor, max="+", count=1000)
        for _, fields in entries:
            counts[fields[b"rollout_id"].decode()] += 1
        if len(entries) < 1000:
            return counts
        last = entries[-1][0].decode()
        cursor = "(" + last


def published(connection: redis.Redis, namespace: str) -> dict[str, Rollout]:
    """The last published rollout of each rollout id."""
    entries = connection.xrange(Keys(namespace).results)
    return {f[b"rollout_id"].decode(): Rollout.model_validate_json(f[b"rollout"]) for _, f in entries}


def assert_exactly_once(connection: redis.Redis, namespace: str, rollout_ids: Iterable[str]) -> None:
    """Every task in has exactly one rollout out, and nothing else came out."""
    wanted = set(rollout_ids)
    counts = results_per_rollout(connection, namespace)
    lost = sorted(wanted - set(counts))
    duplicated = sorted(rid for rid, n in counts.items() if n > 1)
    strangers = sorted(set(counts) - wanted)
    assert (lost, duplicated, strangers) == ([], [], []), (
        f"{len(wanted)} tasks in: {len(lost)} lost {lost[:5]}, {len(duplicated)} duplicated {duplicated[:5]}, "
        f"{len(strangers)} unexpected {strangers[:5]}"
    )
