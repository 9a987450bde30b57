"""Agents for the training-loop tests: the reward of a group member is chosen by its input and its index.

Worker subprocesses import them as ``tests.support.train_agents:<Class>``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rollq.models.contract import NamedResources
from rollq.models.groups import membership
from rollq.worker.agent import LitAgent


class GroupAgent(LitAgent):
    """Input keys: ``rewards`` (one per member index), ``fail`` (member indices that raise), ``sleep`` seconds,
    ``no_reward`` (member indices that return no reward), ``sleep_member`` (the one member index that sleeps 3 s)."""

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: NamedResources) -> Any:
        found = membership(rollout_id, {})
        index = found.index if found is not None else 0
        spec = task_input if isinstance(task_input, dict) else {}
        await asyncio.sleep(float(spec.get("sleep", 0)))
        if index == spec.get("sleep_member"):
            await asyncio.sleep(3)
        if index in spec.get("fail", ()):
            raise RuntimeError(f"member {index} was told to fail")
        if index in spec.get("no_reward", ()):
            return None
        rewards = spec.get("rewards") or [1.0]
        return float(rewards[index % len(rewards)])
