"""The function every rollq RQ job names; it hands the job to the worker's runner.

Only :class:`worker.RolloutWorker` binds a runner, so a rollq job picked up by
any other RQ worker fails with an error that says how to start the right one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rq import get_current_job

if TYPE_CHECKING:
    from .runner import AgentRunner

_runner: AgentRunner | None = None


def bind(runner: AgentRunner | None) -> None:
    """Make ``runner`` run this process's rollq jobs (None unbinds)."""
    global _runner
    _runner = runner


def run_rollout(rollout_id: str) -> dict[str, Any]:
    """Run the task ``rollout_id`` through this process's runner."""
    job = get_current_job()
    if _runner is None or job is None:
        raise RuntimeError(
            "rollq jobs must be run by worker.RolloutWorker: rq worker -w worker.RolloutWorker --url URL QUEUE"
        )
    return _runner.run(rollout_id, job.id)
