"""Running an Agent Lightning agent as it is: ``LitAgent`` subclasses of 0.1, 0.2 and 0.3, and ``@rollout`` functions.

When the configured agent is an ``agentlightning.LitAgent`` (an ``@rollout`` / ``@llm_rollout`` /
``@prompt_rollout`` function is one too: AL wraps it in a ``FunctionalLitAgent``), the worker wraps it and calls
it the way that release's own runner does:

- sync or async: AL 0.2/0.3 ask the agent (``agent.is_async()``: an override of ``rollout_async`` or of a
  ``*_rollout_async`` method, or an async ``@rollout`` function); AL 0.1 (no such method) is async when the
  class overrides ``training_rollout_async``, as its Trainer decides;
- ``training_rollout*`` for ``mode == "train"``, ``validation_rollout*`` for every other mode;
- the arguments: a method with a ``rollout_id`` parameter has AL 0.1's signature and gets
  ``(task_input, rollout_id=..., resources=...)`` (AL 0.2's legacy runner made the same test); any other gets
  AL 0.2/0.3's ``(task_input, resources=..., rollout=...)``, ``rollout`` being AL's own ``AttemptedRollout``
  for this attempt (``rollout.rollout_id``, ``rollout.attempt.sequence_id`` = rollq's attempt number,
  ``rollout.mode``, ``rollout.resources_id``, ``rollout.config`` from the task's policy);
- the resources as AL's own classes (``LLM``, ``ProxyLLM``, ``PromptTemplate`` of the loaded release), so that
  ``isinstance`` checks in AL's code (``@rollout``'s ``llm`` argument) hold; a resource of a type the
  release has no class for (a ``ProxyLLM`` under 0.1), or that its class refuses, is passed as rollq's object.

The worker and runner reach the agent through AL's own ``set_trainer``/``set_runner``. What the agent returns
is accepted by shape (see :mod:`rollq.models.coerce`). ``agentlightning`` is never imported here: if the agent
came from it, it is already loaded.
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from rollq.models.contract import Task
from rollq.models.policy import RolloutPolicy

from .agent import LitAgent


def _al_module(name: str) -> Any:
    return sys.modules.get(f"agentlightning.{name}")


def _al_base() -> Any:
    # 0.1: agentlightning/litagent.py; 0.2/0.3: the package agentlightning/litagent/ re-exports it.
    module = _al_module("litagent")
    return getattr(module, "LitAgent", None) if module is not None else None


def is_agentlightning_agent(agent: Any) -> bool:
    base = _al_base()
    return base is not None and isinstance(agent, base)


def _is_async(agent: Any) -> bool:
    asks = getattr(agent, "is_async", None)
    if callable(asks):  # AL 0.2/0.3
        return bool(asks())
    base = _al_base()  # AL 0.1: what its Trainer.fit checks
    return base is not None and type(agent).training_rollout_async is not base.training_rollout_async


def _has_v01_signature(method: Callable[..., Any]) -> bool:
    try:
        return "rollout_id" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


def _al_resource_classes() -> dict[str, type]:
    """AL's resource classes by ``resource_type``, for the loaded release."""
    types = _al_module("types")
    found: dict[str, type] = {}
    for name in ("LLM", "ProxyLLM", "PromptTemplate"):
        cls = getattr(types, name, None)
        field = getattr(cls, "model_fields", {}).get("resource_type")
        if cls is not None and field is not None and isinstance(field.default, str):
            found[field.default] = cls
    return found


def as_al_resources(resources: Mapping[str, Any]) -> dict[str, Any]:
    """``resources`` as the loaded AL release's own classes, where it has one for the type (else as they are)."""
    classes = _al_resource_classes()
    converted: dict[str, Any] = {}
    for name, resource in resources.items():
        cls = classes.get(getattr(resource, "resource_type", None))  # type: ignore[arg-type]
        if cls is None:
            converted[name] = resource
            continue
        try:
            converted[name] = cls.model_validate(resource.model_dump())  # type: ignore[attr-defined]
        except Exception:  # a shape AL's class refuses: the agent gets rollq's object, not nothing
            converted[name] = resource
    return converted


def al_attempted_rollout(
    task: Task, attempt: int, resources_id: str | None, policy: RolloutPolicy, worker: str | None
) -> Any:
    """AL 0.2/0.3's ``AttemptedRollout`` for this attempt, or None when the loaded release has none (0.1)."""
    types = _al_module("types")
    attempted = getattr(types, "AttemptedRollout", None)
    if attempted is None:
        return None
    now = time.time()
    return attempted(
        rollout_id=task.rollout_id,
        input=task.input,
        start_time=task.create_time or now,
        mode=task.mode,
        resources_id=resources_id,
        status="running",
        config=types.RolloutConfig(
            timeout_seconds=policy.timeout_seconds,
            unresponsive_seconds=policy.unresponsive_seconds,
            max_attempts=policy.max_attempts,
        ),
        metadata=dict(task.metadata),
        attempt=types.Attempt(
            rollout_id=task.rollout_id,
            # AL's attempt ids are opaque strings; this one is also safe in a ProxyLLM's URL path.
            attempt_id=f"attempt-{attempt}",
            sequence_id=attempt,
            start_time=now,
            status="running",
            worker_id=worker,
        ),
    )


class AgentLightningAgent(LitAgent):
    """rollq's LitAgent face of an Agent Lightning agent (any release from 0.1 to 0.3)."""

    def __init__(self, agent: Any) -> None:
        super().__init__(trained_agents=getattr(agent, "trained_agents", None))
        self.wrapped = agent
        self._async = _is_async(agent)

    @property
    def is_async(self) -> bool:
        return self._async

    def rollout_arguments(
        self, task: Task, attempt: int, resources: Any, resources_id: str | None, policy: RolloutPolicy
    ) -> tuple[Any, ...]:
        worker = self.runner.worker_name if getattr(self, "_runner_ref", None) is not None else None
        rollout = al_attempted_rollout(task, attempt, resources_id, policy, worker)
        return (task, as_al_resources(resources), rollout)

    def _method(self, mode: str | None) -> Callable[..., Any]:
        train = mode == "train"
        if self._async:
            return self.wrapped.training_rollout_async if train else self.wrapped.validation_rollout_async  # type: ignore[no-any-return]
        return self.wrapped.training_rollout if train else self.wrapped.validation_rollout  # type: ignore[no-any-return]

    def rollout_call(self, mode: str | None) -> Any:
        method = self._method(mode)
        legacy = _has_v01_signature(method)

        if self._async:

            async def run_async(task: Task, resources: Any, rollout: Any) -> Any:
                if rollout is None:  # AL 0.1, called as its runner did
                    return await method(task.input, task.rollout_id, resources)
                if legacy:
                    return await method(task.input, rollout_id=task.rollout_id, resources=resources)
                return await method(task.input, resources=resources, rollout=rollout)

            return run_async

        def run(task: Task, resources: Any, rollout: Any) -> Any:
            if rollout is None:
                return method(task.input, task.rollout_id, resources)
            if legacy:
                return method(task.input, rollout_id=task.rollout_id, resources=resources)
            return method(task.input, resources=resources, rollout=rollout)

        return run

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
        "the agent must be a rollq.worker.LitAgent or an agentlightning.LitAgent (an @rollout function is one), "
        f"got {type(agent).__name__}"
    )
