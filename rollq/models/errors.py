"""Errors rollq raises on purpose; each names what went wrong and with what."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class RollqError(Exception):
    """Base of every error rollq raises on purpose."""


class UnknownResourcesError(RollqError, KeyError):
    """A resources id that was never stored, or was pruned."""

    def __init__(self, resources_id: str | None, namespace: str) -> None:
        self.resources_id = resources_id
        what = (
            "no resources have been published yet" if resources_id is None else f"unknown resources id {resources_id!r}"
        )
        super().__init__(f"{what} in namespace {namespace!r}")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class UnknownTaskError(RollqError, KeyError):
    """A rollout id with no task record (never enqueued, or expired)."""

    def __init__(self, rollout_id: str, namespace: str) -> None:
        self.rollout_id = rollout_id
        super().__init__(f"no task {rollout_id!r} in namespace {namespace!r}")

    def __str__(self) -> str:
        return str(self.args[0])


class PayloadTooLargeError(RollqError, ValueError):
    """A task or rollout whose JSON is bigger than the configured limit."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        self.size, self.limit = size, limit
        super().__init__(f"{what} is {size} bytes of JSON, over the limit of {limit} bytes")


class ContractShapeError(RollqError, ValueError):
    """An object that does not have the shape of the contract model it stands for; ``field`` names where."""

    def __init__(self, message: str, *, field: str) -> None:
        self.field = field
        super().__init__(message)


class AttemptTokenError(RollqError, PermissionError):
    """A rollout posted to a gateway without the token handed out with its attempt (forged, for another
    attempt, or for an attempt a worker runs): refused, counted, never stored."""


class InvalidTaskError(RollqError, ValueError):
    """A queue entry that is not a valid rollq task."""


def _shown(ids: Sequence[str]) -> str:
    return ", ".join(ids[:20]) + (" ..." if len(ids) > 20 else "")


class RolloutTimeoutError(RollqError, TimeoutError):
    """``wait`` gave up before every rollout arrived; ``trimmed`` lists those that ended but were trimmed."""

    def __init__(self, missing: Sequence[str], timeout: float, trimmed: Sequence[str] = ()) -> None:
        self.missing, self.trimmed = list(missing), list(trimmed)
        also = f" ({len(self.trimmed)} more ended but were trimmed from the results stream)" if self.trimmed else ""
        missing = _shown(self.missing)
        super().__init__(f"{len(self.missing)} rollout(s) still missing after {timeout:g}s: {missing}{also}")


class RolloutTrimmedError(RollqError, LookupError):
    """Rollouts that ended (their task records say so) but whose entries were trimmed from the bounded results
    stream before ``wait`` read them. ``received`` maps the ids of the others to their rollouts."""

    def __init__(self, rollout_ids: Sequence[str], received: Mapping[str, Any] | None = None) -> None:
        self.rollout_ids, self.received = list(rollout_ids), dict(received or {})
        super().__init__(
            f"{len(self.rollout_ids)} rollout(s) ended but were trimmed from the results stream before they were "
            f"read: {_shown(self.rollout_ids)}; raise results_maxlen / results_max_bytes or wait sooner "
            "(their task records say how each ended)"
        )


class AgentTimeoutError(RollqError, TimeoutError):
    """An attempt ran past its policy's ``timeout_seconds``."""


class WorkerUnresponsiveError(RollqError):
    """An attempt's worker stopped heartbeating (killed, frozen or cut off)."""


class UnsupportedResultError(RollqError, TypeError):
    """An agent returned something that is not a RolloutRawResult."""


class JobIdTakenError(RollqError):
    """A task's RQ job id holds a job hash that stands for something else; rollq never overwrites it."""

    def __init__(self, job_id: str, rollout_id: str) -> None:
        self.job_id, self.rollout_id = job_id, rollout_id
        super().__init__(f"RQ job {job_id} of rollout {rollout_id!r} already exists and stands for another job")


class RetryNotQueuedError(JobIdTakenError):
    """A failed attempt's retry could not be queued because its RQ job id holds another job: the task fails for
    good with this error, which also says why the attempt failed (``cause``)."""

    def __init__(self, job_id: str, rollout_id: str, cause: str) -> None:
        super().__init__(job_id, rollout_id)
        self.cause = cause
        self.args = (f"{self.args[0]}: the retry of a failed attempt could not be queued (the attempt: {cause})",)


class InvalidResourcesError(RollqError, ValueError):
    """A resources version whose stored JSON is not a valid ``ResourcesUpdate`` (corrupted, or not rollq's)."""


class AgentExitError(RollqError):
    """An agent raised a BaseException that is not an Exception (SystemExit, KeyboardInterrupt, GeneratorExit, a
    CancelledError of its own) or stopped the worker's event loop: the rollout fails with it, and the worker
    carries on."""


class RolloutBuildError(RollqError):
    """Turning a settled attempt into its rollout raised (a fault in rollq, or in something of the agent's it had
    to read): the rollout is published failed with this error, which names the fault and how the agent ended."""


class UnserializableResultError(RollqError, TypeError):
    """A rollout that cannot be turned into JSON (an object of a type JSON cannot hold, somewhere inside)."""


class EventLoopBlockedError(RollqError):
    """The worker's agent event loop stopped turning (an async agent made a blocking call)."""


class RolloutsTrimmedError(RollqError, LookupError):
    """The results stream's hard byte limit trimmed entries a consumer group had not yet been delivered
    (or had not acknowledged). Each reader of the group raises it once per loss; iterate again to go on."""

    def __init__(self, group: str, lost: int, from_id: str) -> None:
        self.group, self.lost, self.from_id = group, lost, from_id
        super().__init__(
            f"consumer group {group!r} lost {lost} rollout(s) to trimming of the results stream, from entry {from_id} "
            "on: the stream reached results_max_bytes; read faster or raise results_max_bytes (their task records "
            "still say how each ended)"
        )


class InvalidRewardError(RollqError, ValueError):
    """A reward that is NaN or infinite: a trainer would average it into every gradient step."""


class LLMBackendError(RollqError):
    """The LLM endpoint behind the capturing proxy answered an agent's call with an HTTP error."""

    def __init__(self, status: int, resource: str, path: str, detail: str) -> None:
        self.status = status
        super().__init__(f"LLM backend of resource {resource!r} answered HTTP {status} to {path}: {detail}")


class LLMPauseTimeoutError(RollqError, TimeoutError):
    """``pause_llm`` gave up before every live worker's capturing proxy was drained. ``busy`` maps each worker
    that still had LLM calls running to their number; ``unacknowledged`` lists the workers that had not yet closed
    their gate (not heartbeated since the pause). The pause itself stays in place."""

    def __init__(self, timeout: float, busy: Mapping[str, int], unacknowledged: Sequence[str]) -> None:
        self.timeout, self.busy, self.unacknowledged = timeout, dict(busy), list(unacknowledged)
        parts = []
        if self.busy:
            running = ", ".join(f"{w} ({n})" for w, n in list(self.busy.items())[:20])
            parts.append(f"LLM calls still running on {running}")
        if self.unacknowledged:
            parts.append(f"not yet paused: {_shown(self.unacknowledged)}")
        super().__init__(f"LLM calls not drained within {timeout:g}s: " + "; ".join(parts or ["no report"]))


class BackpressureTimeoutError(RollqError, TimeoutError):
    """``enqueue_many(max_pending=N)`` waited ``timeout`` seconds and the namespace still had too many tasks queued
    or running to take the next ones; the tasks queued before it stay queued (``queued`` counts them)."""

    def __init__(self, pending: int, max_pending: int, timeout: float, queued: int) -> None:
        super().__init__(
            f"{pending} task(s) still queued or running after {timeout:g}s (max_pending={max_pending}); "
            f"{queued} of this batch were queued before that"
        )
        self.pending, self.max_pending, self.timeout, self.queued = pending, max_pending, timeout, queued


class EnqueueUndoneError(RollqError):
    """An enqueue whose tasks the primary applied but which a failover undid before a replica held them: the
    batch is not queued (enqueue it again; known rollout ids are not queued twice)."""

    def __init__(self, missing: int, total: int) -> None:
        self.missing, self.total = missing, total
        super().__init__(
            f"{missing} of {total} task(s) of this enqueue were undone by a failover before a replica held them: "
            "enqueue the batch again (rollout ids already queued are not queued twice)"
        )


class EnqueueIncompleteError(RollqError):
    """A batch that Redis refused partway: its first chunks (``enqueue_many`` commits one transaction per 2,000
    tasks) are queued, the rest are not. ``tasks`` are the first ``len(tasks)`` of the batch's tasks, queued (or
    already known), as ``enqueue_many`` would have returned them; ``queued`` counts those newly queued,
    ``batch_size`` the batch; ``reason`` says what stopped it ("Redis refused: <its reply>"); the refused chunk's
    own error (``redis.exceptions.OutOfMemoryError``, ...) is its ``__cause__``.

    Before, that error alone was raised, and a caller who enqueued the batch again queued its first chunks twice: a
    partial enqueue is its own error, so that no ``except`` clause written for a refusal of the whole batch takes
    it for one.
    """

    def __init__(self, tasks: Sequence[Any], queued: int, batch_size: int, *, reason: str, rest: str) -> None:
        self.tasks, self.queued, self.batch_size, self.reason = list(tasks), queued, batch_size, reason
        known = len(self.tasks) - queued
        also = f" ({known} more already known)" if known else ""
        super().__init__(f"{queued} of {batch_size} task(s) queued{also} before {reason}; {rest}")
