"""Running the user's hooks so that one raising never costs a rollout."""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Sequence

from rollq.models.contract import AgentRunner, BaseTracer, Hook, Rollout, Task

log = logging.getLogger(__name__)


class HookSet:
    """The hooks of one worker process, called in order; a hook that raises anything (BaseExceptions included)
    is logged by name and skipped."""

    def __init__(self, hooks: Sequence[Hook]) -> None:
        self.hooks = list(hooks)

    def _call(self, hook: Hook, method: str, *args: object, context: contextvars.Context | None = None) -> None:
        try:
            fn = getattr(hook, method)
            context.run(fn, *args) if context is not None else fn(*args)
        except BaseException as exc:  # SystemExit or KeyboardInterrupt from a hook must not end a worker thread
            log.error(
                "hook %s.%s raised %s(%s); carrying on",
                type(hook).__name__,
                method,
                type(exc).__name__,
                exc,
                exc_info=True,
            )

    def init(self) -> None:
        for hook in self.hooks:
            self._call(hook, "init")

    def init_worker(self, worker_id: int) -> None:
        for hook in self.hooks:
            self._call(hook, "init_worker", worker_id)

    def teardown_worker(self, worker_id: int) -> None:
        for hook in self.hooks:
            self._call(hook, "teardown_worker", worker_id)

    def teardown(self) -> None:
        for hook in self.hooks:
            self._call(hook, "teardown")

    def rollout_start(self, task: Task, runner: AgentRunner, tracer: BaseTracer, context: contextvars.Context) -> None:
        for hook in self.hooks:
            self._call(hook, "on_rollout_start", task, runner, tracer, context=context)

    def rollout_end(
        self, task: Task, rollout: Rollout, runner: AgentRunner, tracer: BaseTracer, context: contextvars.Context
    ) -> None:
        # A copy: a sync agent that timed out is abandoned on its thread, still inside ``context``,
        # and a context cannot be entered twice at once. The copy holds the same values.
        ended = context.copy()
        for hook in self.hooks:
            self._call(hook, "on_rollout_end", task, rollout, runner, tracer, context=ended)
