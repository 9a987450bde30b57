"""Running an Agent Lightning ``LitAgent`` subclass as it is.

When the configured agent is an ``agentlightning.LitAgent`` (the class AL 0.1/0.2
users already have), the worker wraps it: rollq calls ``training_rollout`` /
``validation_rollout`` (or their ``_async`` twins) with AL's arguments
``(task_input, rollout_id, resources)``, decides sync or async as AL's Trainer does
(an override of ``training_rollout_async`` makes it async), and hands the agent the
worker and runner through AL's own ``set_trainer``/``set_runner``. What the agent
returns is accepted by shape (see :mod:`rollq.models.coerce`). ``agentlightning`` is
never imported here: if the agent's class came from it, it is already loaded.
"""

from __future__ import annotations

import sys
from typing import Any

from .agent import LitAgent


def _al_base() -> Any:
    module = sys.modules.get("agentlightning.litagent")
    return getattr(module, "LitAgent", None) if module is not None else None


def is_agentlightning_agent(agent: Any) -> bool:
    base = _al_base()
    return base is not None and isinstance(agent, base)


class AgentLightningAgent(LitAgent):
    """rollq's LitAgent face of an Agent Lightning agent."""

    def __init__(self, agent: Any) -> None:
        super().__init__(trained_agents=getattr(agent, "trained_agents", None))
        self.wrapped = agent
        base = _al_base()
        self._async = base is not None and type(agent).training_rollout_async is not base.training_rollout_async

    @property
    def is_async(self) -> bool:
        return self._async

    def training_rollout(self, task_input: Any, rollout_id: str, resources: Any) -> Any:
        return self.wrapped.training_rollout(task_input, rollout_id, resources)

    def validation_rollout(self, task_input: Any, rollout_id: str, resources: Any) -> Any:
        return self.wrapped.validation_rollout(task_input, rollout_id, resources)

    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: Any) -> Any:
        return await self.wrapped.training_rollout_async(task_input, rollout_id, resources)

    async def validation_rollout_async(self, task_input: Any, rollout_id: str, resources: Any) -> Any:
        return await self.wrapped.validation_rollout_async(task_input, rollout_id, resources)

    def set_trainer(self, trainer: Any) -> None:
        super().set_trainer(trainer)
        self.wrapped.set_trainer(trainer)

    def set_runner(self, runner: Any) -> None:
        super().set_runner(runner)
        self.wrapped.set_runner(runner)


def as_lit_agent(agent: Any) -> LitAgent:
    """``agent`` if it is a rollq LitAgent, wrapped if it is an Agent Lightning one; TypeError otherwise."""
    if isinstance(agent, LitAgent):
        return agent
    if is_agentlightning_agent(agent):
        return AgentLightningAgent(agent)
    raise TypeError(
        f"the agent must be a rollq.worker.LitAgent or an agentlightning.LitAgent, got {type(agent).__name__}"
    )
