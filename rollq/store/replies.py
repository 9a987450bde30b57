"""What the Lua scripts answer, as small types: a caller matches on :class:`Published`, :class:`Superseded`,
:class:`StillAlive`, ... and never on a bare code.

The words a script answers with are :class:`Word` and :class:`Enqueued`; the scripts read them from the
generated Lua header (``REPLY.<word>``, ``ENQUEUED.<word>``, see :func:`rollq.store.scripts.lua_header`), so a
script and its reader cannot spell a word two ways. The ``read_*`` functions turn a raw reply into its type.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

log = logging.getLogger(__name__)


class Word(StrEnum):
    """The words the transition scripts answer with (``REPLY.<value>`` in Lua)."""

    CLAIMED = "claimed"
    MISSING = "missing"
    STALE = "stale"
    INVALID = "invalid"
    PUBLISHED = "published"
    SUPERSEDED = "superseded"
    CANCELLED = "cancelled"
    ALIVE = "alive"
    REQUEUED = "requeued"
    CONFLICT = "conflict"
    FINISHED = "finished"


class Enqueued(StrEnum):
    """What enqueueing did with one task (``ENQUEUED.<value>`` in Lua)."""

    QUEUED = "queued"
    KNOWN = "known"  # the rollout id was known already; nothing was written for it
    UNKNOWN_RESOURCES = "unknown_resources"  # the pinned version does not exist; nothing of the batch was written
    JOB_TAKEN = "job_taken"  # the task's job id holds a job hash that stands for something else; nothing written


@dataclass(frozen=True)
class Published:
    """The rollout is on the results stream at ``entry_id``."""

    entry_id: str
    damaged: str = field(default="", compare=False)
    """The keys of the namespace the script skipped because they hold another type than rollq writes there
    (``foreign_key`` in the Lua header), '' when none: the rollout was published and its task ended all the same."""


@dataclass(frozen=True)
class Requeued:
    """The attempt ended and the task is queued again as a new RQ job."""


@dataclass(frozen=True)
class Superseded:
    """The attempt is no longer the task's current one: a newer attempt took over, or the task ended."""


@dataclass(frozen=True)
class TaskMissing:
    """The task record is gone: Redis lost it (a restart without persistence, a flush, an eviction). Not a newer
    attempt: the rollout is kept on the superseded stream with ``reason`` ``task-missing``, not delivered."""


@dataclass(frozen=True)
class Cancelled:
    """The task was cancelled (``lua/cancel.lua``): the attempt's result is dropped."""


@dataclass(frozen=True)
class StillAlive:
    """A reaper's transition lost the race: the attempt heartbeated after the reaper judged it stale."""


@dataclass(frozen=True)
class JobTaken:
    """Nothing was written: the new job id holds a job hash that stands for something else."""


FinishReply = Published | Superseded | StillAlive | Cancelled | TaskMissing
RequeueReply = Requeued | Superseded | StillAlive | JobTaken | TaskMissing


@dataclass(frozen=True)
class Clock:
    """Redis's time, and until when reapers hold off because Redis was just stalled or out of reach."""

    now: float
    grace_until: float | None

    @property
    def in_grace(self) -> bool:
        return self.grace_until is not None and self.now < self.grace_until


@dataclass(frozen=True)
class Claim:
    """What a worker learns by claiming a task."""

    attempt: int
    task_json: bytes
    policy_json: bytes
    latest_resources_id: str | None
    attempts_used: int
    claimed_at: float  # Redis's time
    generation: int = 1  # which run of the task: 1, then one more per dead-letter requeue


@dataclass(frozen=True)
class ClaimRefused:
    """Why a claim did not happen: the task record is missing, the task is not waiting for this job, or its
    record holds a field that is not what rollq wrote (``state`` then says which; nothing was written)."""

    reason: Literal["missing", "stale", "invalid"]
    state: str = ""


_OUTCOMES: dict[Word, Superseded | StillAlive | Requeued | JobTaken | Cancelled] = {
    Word.SUPERSEDED: Superseded(),
    Word.CANCELLED: Cancelled(),
    Word.ALIVE: StillAlive(),
    Word.REQUEUED: Requeued(),
    Word.CONFLICT: JobTaken(),
}


def read_claim(reply: Any) -> Claim | ClaimRefused:
    """``claim.lua``'s reply; the damaged keys it names are logged."""
    if reply[0] != Word.CLAIMED.encode():
        return ClaimRefused(reply[0].decode(), reply[1].decode() if len(reply) > 1 else "")  # type: ignore[arg-type]
    _, attempt, task_json, policy_json, latest, used, claimed_at, generation, *damaged = reply
    for text in damaged:
        report_damaged(text, CLAIMED_ANYWAY)
    return Claim(
        int(attempt), task_json, policy_json, latest.decode() or None, int(used), float(claimed_at), int(generation)
    )


DAMAGED_LOG_SECONDS = 60.0
"""How often a process logs the same damaged keys again: a worker meets them at every publication."""
_damaged_logged: dict[str, float] = {}


PUBLISHED_ANYWAY = "the rollout was published and its task ended all the same"
CLAIMED_ANYWAY = "the task was claimed all the same"
QUEUED_ANYWAY = "the task was queued all the same"


def report_damaged(damaged: bytes | str, anyway: str = PUBLISHED_ANYWAY) -> str:
    """Log the damaged keys a script skipped (its reply's text, '' when none) and what the script did ``anyway``, at
    most once a :data:`DAMAGED_LOG_SECONDS` for the same text; returns the text."""
    text = damaged.decode(errors="replace") if isinstance(damaged, bytes) else damaged
    if text:
        now = time.monotonic()
        if now - _damaged_logged.get(text, -DAMAGED_LOG_SECONDS) >= DAMAGED_LOG_SECONDS:
            _damaged_logged[text] = now
            log.error("skipped damaged keys (%s): %s", anyway, text)
    return text


def without_damaged(reply: Any, anyway: str = QUEUED_ANYWAY) -> Any:
    """The one-word (or number) reply of a script that answers ``{reply, damaged keys}`` when it skipped damaged keys
    (``with_damaged`` in the Lua header): the reply, the keys logged with what the script did ``anyway``."""
    if isinstance(reply, list):
        reply, damaged = reply
        report_damaged(damaged, anyway)
    return reply


def read_finish(reply: Any) -> FinishReply:
    """``finish.lua``'s (and ``reject.lua``'s) reply; the damaged keys it names are logged."""
    if reply[0] == Word.PUBLISHED.encode():
        return Published(reply[1].decode(), report_damaged(reply[2]) if len(reply) > 2 else "")
    if reply[0] == Word.MISSING.encode():
        return TaskMissing()
    return _OUTCOMES[Word(reply[0].decode())]  # type: ignore[return-value]


def read_requeue(reply: Any) -> RequeueReply:
    """``requeue.lua``'s reply; the damaged keys it names are logged."""
    word = Word(without_damaged(reply).decode())
    if word == Word.MISSING:
        return TaskMissing()
    return _OUTCOMES[word]  # type: ignore[return-value]


def read_enqueue(reply: Any, size: int) -> list[Enqueued]:
    """``enqueue.lua``'s reply for a batch of ``size`` tasks: a word per task (then the damaged keys it skipped, if
    any: logged), or one word for the batch."""
    words = reply[:size] if isinstance(reply, list) else [reply] * size
    for damaged in reply[size:] if isinstance(reply, list) else []:
        report_damaged(damaged, QUEUED_ANYWAY)
    return [Enqueued(word.decode()) for word in words]


def read_clock(reply: Any) -> Clock:
    """``beat.lua``'s reply; the damaged keys it names are logged."""
    now, grace_until, *damaged = reply
    for text in damaged:
        report_damaged(text, "the clock was kept; no attempt's heartbeat could be recorded")
    return Clock(float(now), float(grace_until) if grace_until else None)
