"""The agent base class users subclass."""

from __future__ import annotations

from typing import Any

from rollq.models.contract import NamedResources, RolloutRawResult, TaskInput


class LitAgent:
    """An agent rollq can run.

    Override ``training_rollout`` (used for ``mode == "train"``) and, if
    validation differs, ``validation_rollout`` (every other mode). Agents that
    await I/O override the ``*_async`` variants instead; rollq then runs them as
    tasks on one event loop, so thousands can be in flight in one process.

    ``resources`` is the task's resources version by name, e.g.
    ``resources["main_llm"].endpoint``. Return any ``RolloutRawResult``: a
    reward, triplets, spans, a full ``Rollout``, or None to let rollq build the
    rollout from the spans it captured.
    """

    def training_rollout(self, task_input: TaskInput, rollout_id: str, resources: NamedResources) -> RolloutRawResult:
        raise NotImplementedError(
            f"{type(self).__name__} implements neither training_rollout nor training_rollout_async"
        )

    def validation_rollout(self, task_input: TaskInput, rollout_id: str, resources: NamedResources) -> RolloutRawResult:
        return self.training_rollout(task_input, rollout_id, resources)

    async def training_rollout_async(
        self, task_input: TaskInput, rollout_id: str, resources: NamedResources
    ) -> RolloutRawResult:
        raise NotImplementedError(
            f"{type(self).__name__} implements neither training_rollout nor training_rollout_async"
        )

    async def validation_rollout_async(
        self, task_input: TaskInput, rollout_id: str, resources: NamedResources
    ) -> RolloutRawResult:
        return await self.training_rollout_async(task_input, rollout_id, resources)

    @property
    def is_async(self) -> bool:
        """True when the subclass overrides an ``*_async`` method; rollq then uses those."""
        cls = type(self)
        return (
            cls.training_rollout_async is not LitAgent.training_rollout_async
            or cls.validation_rollout_async is not LitAgent.validation_rollout_async
        )

    def rollout_call(self, mode: str | None) -> Any:
        """The bound method that runs a task of ``mode``."""
        train = mode == "train"
        if self.is_async:
            return self.training_rollout_async if train else self.validation_rollout_async
        return self.training_rollout if train else self.validation_rollout
