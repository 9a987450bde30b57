"""Trainer-side control of tasks: cancelling them (``lua/cancel.lua``).

The request and reply of the script are built and read here, so the blocking
producer and the asyncio one share them and differ only in how they call Redis.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from rollq.models.contract import Rollout
from rollq.models.policy import RolloutStatus, TaskState
from rollq.models.wire import rollout_json

from .keys import Keys
from .replies import Word, report_damaged
from .scripts import script_source
from .transitions import DEFAULT_RESULTS_MAX_BYTES


class CancelOutcome(StrEnum):
    """What ``cancel`` did to one task."""

    CANCELLED = "cancelled"
    """It had not finished; it now has a cancelled rollout."""
    FINISHED = "finished"
    """It had already finished (succeeded, failed or cancelled); nothing changed."""
    UNKNOWN = "unknown"
    """No such task in the namespace."""


@dataclass(frozen=True)
class CancelResult:
    """The outcome for one rollout id; ``state`` is the state it was in before (or its final state if finished)."""

    rollout_id: str
    outcome: CancelOutcome
    state: TaskState | None = None
    attempt: int = 0
    result_id: str | None = None

    @property
    def was_running(self) -> bool:
        return self.outcome == CancelOutcome.CANCELLED and self.state == TaskState.RUNNING


def cancel_script_source() -> str:
    return script_source("cancel")


def cancel_call(
    keys: Keys, rollout_id: str, *, results_maxlen: int, now: float, results_max_bytes: int = DEFAULT_RESULTS_MAX_BYTES
) -> tuple[list[str], list[Any]]:
    """The KEYS and ARGV of ``cancel.lua`` for ``rollout_id``."""
    rollout = Rollout(rollout_id=rollout_id, metadata={"status": RolloutStatus.CANCELLED.value})
    return (
        [
            keys.task(rollout_id),
            keys.inflight,
            keys.results,
            keys.resources_refs,
            keys.stats,
            keys.results_trim,
            keys.summaries,
            keys.queued_tasks,
        ],
        [rollout_id, rollout_json(rollout), results_maxlen, now, results_max_bytes],
    )


def parse_cancel(rollout_id: str, reply: list[Any]) -> CancelResult:
    kind = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
    if kind == Word.MISSING:
        return CancelResult(rollout_id, CancelOutcome.UNKNOWN)
    if kind == Word.FINISHED:
        return CancelResult(rollout_id, CancelOutcome.FINISHED, TaskState(reply[1].decode()))
    _, previous, attempt, entry, *damaged = reply
    for text in damaged:
        report_damaged(text)
    return CancelResult(rollout_id, CancelOutcome.CANCELLED, TaskState(previous.decode()), int(attempt), entry.decode())
