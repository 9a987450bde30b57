"""Agents for the rq-dashboard browser test, imported by worker subprocesses as ``tests.dashboard_agents:<Class>``."""

from __future__ import annotations

import asyncio
from typing import Any

from rollq.models.contract import NamedResources
from rollq.worker.agent import LitAgent


class HoldingAgent(LitAgent):
    """Finishes a task at once, unless its input is ``{"hold": true}``: that one runs for an hour (a busy worker)."""

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: NamedResources) -> float:
        if isinstance(task_input, dict) and task_input.get("hold"):
            await asyncio.sleep(3600)
        return 1.0
