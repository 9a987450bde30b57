"""How a published Rollout records its outcome: ``metadata`` keys rollq always sets.

Every rollout on the results stream carries ``status`` ("succeeded"/"failed"),
``attempt`` (the claim number that produced it), ``worker`` and ``generation``
(1 for a task's first run, one more after each dead-letter requeue); a failed
one also carries ``error`` with the exception's type and message, and ``traceback`` (the formatted stack, its last
:data:`TRACEBACK_LIMIT` characters) when the exception was raised, so that the stack is where people look (the
worker log, ``rollq task``, rq-dashboard's job page, rollq's rollout page), not only inside the trace.
"""

from __future__ import annotations

import traceback
from typing import Any

from .contract import Rollout
from .policy import RolloutStatus

TRACEBACK_LIMIT = 8000
"""Characters of a formatted traceback a failed rollout keeps (the end: the frame that raised)."""


def message_of(exc: BaseException) -> str:
    """``str(exc)``, or a note saying it could not be read when that raises (an agent's exception class whose
    ``__str__`` is broken): formatting an agent's error must never keep its rollout from being published."""
    try:
        return str(exc)
    except BaseException as failure:  # whatever __str__ raises, SystemExit included, is not the caller's to stop on
        return f"(its message could not be read: str() raised {type(failure).__name__})"


def describe(exc: BaseException) -> str:
    """``"Type: message"`` for a log line or another error's message (see :func:`message_of`)."""
    return f"{type(exc).__name__}: {message_of(exc)}"


def error_info(exc: BaseException) -> dict[str, str]:
    """The ``metadata["error"]`` entry for ``exc``: type, message and, when it was raised, its traceback."""
    info = {"type": type(exc).__name__, "message": message_of(exc)}
    if exc.__traceback__ is not None:
        try:
            text = "".join(traceback.format_exception(exc))
        except Exception as failure:  # the message is kept whatever the stack holds
            text = f"(the traceback could not be formatted: {type(failure).__name__})"
        info["traceback"] = text if len(text) <= TRACEBACK_LIMIT else "…" + text[-TRACEBACK_LIMIT:]
    return info


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
