"""The agent base class users subclass."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from rollq.models.contract import NamedResources, RolloutRawResult, Task, TaskInput
from rollq.models.policy import RolloutPolicy

if TYPE_CHECKING:
    from .rq_worker import RolloutWorker
    from .runner import AgentRunner
    from .tracer import BaseTracer


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

    As in Agent Lightning, ``trained_agents`` names the agent(s) being trained (for
    filtering LLM calls by agent), and an agent can reach what runs it:

    - ``trainer``: the :class:`~rollq.worker.RolloutWorker` process running the agent
      (rollq has no client-side Trainer; the worker plays its part: it owns the tracer,
      the hooks and the worker id), set when the worker starts;
    - ``runner``: the worker's :class:`~rollq.worker.AgentRunner` (``runner.worker_id``,
      ``runner.tracer``, ``runner.agent``);
    - ``tracer``: the tracer capturing each rollout's spans; ``tracer.get_last_trace()``
      inside a rollout gives the spans that rollout has finished so far.

    A subclass whose ``__init__`` does not call ``super().__init__()`` still works.
    """

    trained_agents: str | None = None

    def __init__(self, *, trained_agents: str | None = None) -> None:
        self.trained_agents = trained_agents
        self._trainer_ref: weakref.ReferenceType[RolloutWorker] | None = None
        self._runner_ref: weakref.ReferenceType[AgentRunner] | None = None

    def set_trainer(self, trainer: RolloutWorker) -> None:
        """Called by the worker that runs this agent (rollq's ``trainer`` is that worker)."""
        self._trainer_ref = weakref.ref(trainer)

    def set_runner(self, runner: AgentRunner) -> None:
        """Called by the worker with the runner that calls this agent's rollout methods."""
        self._runner_ref = weakref.ref(runner)

    @staticmethod
    def _deref(ref: weakref.ReferenceType[Any] | None, what: str) -> Any:
        target = ref() if ref is not None else None
        if target is None:
            raise ValueError(what)
        return target

    @property
    def trainer(self) -> RolloutWorker:
        """The RolloutWorker running this agent; ValueError outside one."""
        return self._deref(getattr(self, "_trainer_ref", None), "this agent is not running in a RolloutWorker")

    @property
    def runner(self) -> AgentRunner:
        """The AgentRunner calling this agent; ValueError before a worker set one."""
        return self._deref(getattr(self, "_runner_ref", None), "no runner has been set for this agent")

    @property
    def tracer(self) -> BaseTracer:
        """The tracer capturing this agent's rollouts (the runner's)."""
        return self.runner.tracer

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

    def rollout_arguments(
        self, task: Task, attempt: int, resources: NamedResources, resources_id: str | None, policy: RolloutPolicy
    ) -> tuple[Any, ...]:
        """The arguments :meth:`rollout_call`'s method is called with: ``(task_input, rollout_id, resources)``.

        Wrappers of other agent APIs (Agent Lightning 0.2/0.3's ``rollout(task, resources, rollout)``) override
        it together with :meth:`rollout_call`.
        """
        return (task.input, task.rollout_id, resources)

    def rollout_call(self, mode: str | None) -> Any:
        """The bound method that runs a task of ``mode``."""
        train = mode == "train"
        if self.is_async:
            return self.training_rollout_async if train else self.validation_rollout_async
        return self.training_rollout if train else self.validation_rollout
