"""How a published Rollout records its outcome: ``metadata`` keys rollq always sets.

Every rollout on the results stream carries ``status`` ("succeeded"/"failed"),
``attempt`` (the claim number that produced it), ``worker`` and ``generation``
(1 for a task's first run, one more after each dead-letter requeue); a failed
one also carries ``error`` with the exception's type and message.
"""

from __future__ import annotations

from typing import Any

from .contract import Rollout
from .policy import RolloutStatus


def error_info(exc: BaseException) -> dict[str, str]:
    """The ``metadata["error"]`` entry for ``exc``."""
    return {"type": type(exc).__name__, "message": str(exc)}


def stamp(
    rollout: Rollout,
    *,
    status: RolloutStatus,
    attempt: int,
    worker: str,
    error: BaseException | None = None,
    generation: int = 1,
) -> Rollout:
    """``rollout`` with rollq's outcome keys added to its metadata (the agent's own keys are kept)."""
    extra: dict[str, Any] = {"status": status.value, "attempt": attempt, "worker": worker, "generation": generation}
    if error is not None:
        extra["error"] = error_info(error)
    return rollout.model_copy(update={"metadata": {**rollout.metadata, **extra}})


def failed_rollout(rollout_id: str, *, attempt: int, worker: str, error: BaseException, generation: int = 1) -> Rollout:
    """A rollout that carries only the failure."""
    return stamp(
        Rollout(rollout_id=rollout_id),
        status=RolloutStatus.FAILED,
        attempt=attempt,
        worker=worker,
        error=error,
        generation=generation,
    )
