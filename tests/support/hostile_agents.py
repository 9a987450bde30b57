"""Agents and hooks that misbehave the way a hostile tester's do, for tests/worker/test_none_lost.py.

Worker subprocesses import them as ``tests.support.hostile_agents:<Class>``. The task
input picks the misbehaviour, so one worker can be fed a bad task and then good
ones, which shows that it kept serving.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from rollq.models.contract import Hook, NamedResources, Rollout, Task, Triplet
from rollq.worker.agent import LitAgent

_BASE_EXCEPTIONS: dict[str, type[BaseException]] = {
    "exit": SystemExit,
    "interrupt": KeyboardInterrupt,
    "generator_exit": GeneratorExit,
}


class Unprintable(Exception):
    """An exception whose message cannot be read: ``str()`` and ``repr()`` of it raise."""

    def __str__(self) -> str:
        raise ValueError("str() of this exception fails")

    def __repr__(self) -> str:
        raise ValueError("repr() of this exception fails")


class Unmeasurable(list[Any]):
    """A list whose ``len()`` raises: any code that reads the agent's result as a list fails on it."""

    def __len__(self) -> int:
        raise RuntimeError("len() of this result fails")


def _misbehave(spec: dict[str, Any], rollout_id: str) -> Any:
    for key, kind in _BASE_EXCEPTIONS.items():
        if key in spec:
            raise kind(spec[key])
    if "raise" in spec:
        raise ValueError(spec["raise"])
    if spec.get("unprintable"):
        raise Unprintable()
    if "cancelled" in spec:
        raise asyncio.CancelledError(spec["cancelled"])  # the agent's own, not rollq's cancel or time limit
    if spec.get("unmeasurable"):
        return Unmeasurable([1.0])
    if spec.get("leak_thread"):
        # A non-daemon thread that outlives the rollout (a forgotten executor, a library's background thread): an
        # hour for ``True``, else that many seconds.
        seconds = 3600 if spec["leak_thread"] is True else spec["leak_thread"]
        threading.Thread(target=time.sleep, args=(seconds,), name="leaked-by-the-agent", daemon=False).start()
    if spec.get("huge"):
        return 10**400  # an int no float (nor JSON number a trainer reads) can carry
    if "block" in spec:
        time.sleep(spec["block"])  # blocks the event loop when called from an async agent
    if spec.get("unserialisable") == "triplet":
        return [Triplet(prompt=object(), response="r", reward=1.0)]
    if spec.get("unserialisable"):
        return Rollout(rollout_id=rollout_id, final_reward=1.0, metadata={"obj": object()})
    return 1.0


class HostileAgent(LitAgent):
    """Async. Input keys: ``sleep`` (awaited), then ``exit``/``interrupt``/``generator_exit`` (raise that
    BaseException), ``unprintable`` (raise an exception whose ``str()`` raises), ``cancelled`` (raise
    ``asyncio.CancelledError`` of its own), ``unmeasurable`` (return a list whose ``len()`` raises),
    ``leak_thread`` (start a non-daemon thread that outlives the worker's stop; a number: for that many seconds),
    ``block`` (``time.sleep`` on the
    event loop), ``unserialisable`` (a Rollout holding an object; ``"triplet"``: a Triplet whose prompt is one),
    ``stop_loop`` (call ``stop()`` on the running event loop, then return 1.0; ``"callback"``: schedule that call
    as a callback instead)."""

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: NamedResources) -> Any:
        spec = task_input if isinstance(task_input, dict) else {}
        if "sleep" in spec:
            await asyncio.sleep(spec["sleep"])
        if spec.get("stop_loop") == "callback":
            loop = asyncio.get_running_loop()
            loop.call_soon(loop.stop)
            await asyncio.sleep(0.2)
            return 1.0
        if spec.get("stop_loop"):
            asyncio.get_running_loop().stop()
            return 1.0
        return _misbehave(spec, rollout_id)


class HostileSyncAgent(LitAgent):
    """The same misbehaviours from a sync agent (each rollout on a thread of its own)."""

    def training_rollout(self, task_input: Any, rollout_id: str, resources: NamedResources) -> Any:
        spec = task_input if isinstance(task_input, dict) else {}
        if "sleep" in spec:
            time.sleep(spec["sleep"])
        return _misbehave(spec, rollout_id)


class ExitingHook(Hook):
    """Raises SystemExit from ``on_rollout_start`` and KeyboardInterrupt from ``on_rollout_end`` when the task
    input has ``hook_exit``."""

    def on_rollout_start(self, task: Task, *args: Any) -> None:
        if isinstance(task.input, dict) and task.input.get("hook_exit"):
            raise SystemExit(f"hook exit on {task.rollout_id}")

    def on_rollout_end(self, task: Task, *args: Any) -> None:
        if isinstance(task.input, dict) and task.input.get("hook_exit"):
            raise KeyboardInterrupt(f"hook interrupt on {task.rollout_id}")


class SlowStartHook(Hook):
    """Sleeps in ``on_rollout_start`` for the task input's ``hook_sleep`` seconds (a hostile tester's 0.3-0.6 s)."""

    def on_rollout_start(self, task: Task, *args: Any) -> None:
        if isinstance(task.input, dict):
            time.sleep(float(task.input.get("hook_sleep", 0)))
