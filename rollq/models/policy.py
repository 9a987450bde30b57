"""What rollq adds to the contract: per-task policy and the words for task states.

These are new models, kept apart from the contract so that a ``Task`` or
``Rollout`` stays exactly what every other producer and worker expects.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

FailureKind = Literal["exception", "timeout", "unresponsive"]
"""Why an attempt failed: the agent raised, ran past ``timeout_seconds``, or its worker stopped heartbeating."""


class TaskState(StrEnum):
    """Where a task is in its life; kept in the task record in Redis."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    """Ended by ``Producer.cancel``: it never ran, or its running attempt's result is dropped."""


class RolloutStatus(StrEnum):
    """``Rollout.metadata["status"]`` of every published rollout."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


MAX_POLICY_SECONDS = 366 * 86400
"""The longest ``timeout_seconds`` / ``unresponsive_seconds`` a policy takes (a year): a finite bound, so that a
deadline computed from it stays a number Redis and Python agree on."""


class RolloutPolicy(BaseModel):
    """How hard rollq tries with one task.

    The producer holds defaults and a task may carry its own. ``max_attempts``
    counts claims that ended in a failure or a lost worker; an attempt handed
    back by a worker that was stopped gracefully does not use one up.
    """

    # A newer rollq may add fields: an older one reads such a policy, ignoring them (store/records.py warns),
    # so that a mixed fleet during an upgrade keeps running.
    model_config = ConfigDict(extra="ignore", frozen=True)

    timeout_seconds: float = Field(
        default=300.0, gt=0, le=MAX_POLICY_SECONDS, allow_inf_nan=False, description="Hard limit on one attempt."
    )
    unresponsive_seconds: float = Field(
        default=30.0,
        gt=0,
        le=MAX_POLICY_SECONDS,
        allow_inf_nan=False,
        description="An attempt whose worker has not heartbeated for this long is requeued.",
    )
    max_attempts: int = Field(default=3, ge=1)
    retry_on: frozenset[FailureKind] = Field(
        default=frozenset({"timeout", "unresponsive"}),
        description="Failures that lead to another attempt (agent exceptions are often deterministic).",
    )

    def retries(self, kind: FailureKind, attempts_used: int) -> bool:
        """Whether a failure of ``kind`` after ``attempts_used`` attempts gets another attempt."""
        return kind in self.retry_on and attempts_used < self.max_attempts
