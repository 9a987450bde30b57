"""Running the user's hooks so that one raising never costs a rollout, and one running long is reported.

The worker heartbeats an attempt from its claim, so a slow ``on_rollout_start`` no longer makes the attempt
look unresponsive; but the hooks of a batch of claims run one after another on the worker's start thread, so
a slow hook still delays every agent behind it. Each call is timed: one over ``budget_seconds`` is logged and
listed in the rollout's metadata (``hook_overruns``: ``"Hook.method"`` -> seconds).
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Sequence

from rollq.models.contract import AgentRunner, BaseTracer, Hook, Rollout, Task

log = logging.getLogger(__name__)


class HookSet:
    """The hooks of one worker process, called in order; a hook that raises anything (BaseExceptions included)
    is logged by name and skipped."""

    def __init__(self, hooks: Sequence[Hook], *, budget_seconds: float = 1.0) -> None:
        self.hooks = list(hooks)
        self.budget_seconds = budget_seconds

    def _call(self, hook: Hook, method: str, *args: object, context: contextvars.Context | None = None) -> float:
        """Call one hook method; returns the seconds it took."""
        started = time.monotonic()
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
        return time.monotonic() - started

    def _timed(
        self, hook: Hook, method: str, overruns: dict[str, float], *args: object, context: contextvars.Context
    ) -> None:
        took = self._call(hook, method, *args, context=context)
        if took > self.budget_seconds:
            name = f"{type(hook).__name__}.{method}"
            overruns[name] = round(took, 3)
            log.warning(
                "hook %s took %.2fs, over its budget of %.2fs (ROLLQ_HOOK_BUDGET_SECONDS)",
                name,
                took,
                self.budget_seconds,
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

    def rollout_start(
        self, task: Task, runner: AgentRunner, tracer: BaseTracer, context: contextvars.Context
    ) -> dict[str, float]:
        """Run every ``on_rollout_start``; returns the calls over budget (``"Hook.method"`` -> seconds)."""
        overruns: dict[str, float] = {}
        for hook in self.hooks:
            self._timed(hook, "on_rollout_start", overruns, task, runner, tracer, context=context)
        return overruns

    def rollout_end(
        self, task: Task, rollout: Rollout, runner: AgentRunner, tracer: BaseTracer, context: contextvars.Context
    ) -> dict[str, float]:
        """Run every ``on_rollout_end``; returns the calls over budget."""
        # A copy: a sync agent that timed out is abandoned on its thread, still inside ``context``,
        # and a context cannot be entered twice at once. The copy holds the same values.
        ended = context.copy()
        overruns: dict[str, float] = {}
        for hook in self.hooks:
            self._timed(hook, "on_rollout_end", overruns, task, rollout, runner, tracer, context=ended)
        return overruns
