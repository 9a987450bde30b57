"""Agents for the rq-dashboard browser test, imported by worker subprocesses as
``tests.support.dashboard_agents:<Class>``."""

from __future__ import annotations

import asyncio
from typing import Any

from rollq.models.contract import NamedResources, Rollout, Triplet
from rollq.worker.agent import LitAgent
from rollq.worker.tracer import llm_call_span


class HoldingAgent(LitAgent):
    """Finishes a task at once, unless its input is ``{"hold": true}``: that one runs for an hour (a busy worker)."""

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: NamedResources) -> float:
        if isinstance(task_input, dict) and task_input.get("hold"):
            await asyncio.sleep(3600)
        return 1.0


class WorkloadAgent(LitAgent):
    """A small live workload: two LLM turns with token ids and a reward, or a failure when the input asks.

    Input ``{"q": n}`` answers with reward ``n / 10``; ``{"fail": "why"}`` raises ValueError(why);
    ``{"hold": true}`` runs for an hour (an in-flight rollout).
    """

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: NamedResources) -> Rollout:
        if task_input.get("hold"):
            await asyncio.sleep(3600)
        if task_input.get("fail"):
            await asyncio.sleep(0.05)
            raise ValueError(task_input["fail"])
        n = int(task_input.get("q", 0))
        with llm_call_span("sim-1", f"question {n}"):
            await asyncio.sleep(0.03)
        with llm_call_span("sim-1", f"check {n}"):
            await asyncio.sleep(0.02)
        triplets = [
            Triplet(
                prompt={"text": f"question {n}", "token_ids": list(range(5))},
                response={"text": str(n), "token_ids": [1, 2]},
            ),
            Triplet(
                prompt={"text": f"check {n}", "token_ids": list(range(7))},
                response={"text": "ok", "token_ids": [3]},
                reward=n / 10,
            ),
        ]
        return Rollout(rollout_id=rollout_id, final_reward=n / 10, triplets=triplets)
