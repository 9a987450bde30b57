"""One attempt of a task, from its claim to its published rollout: spelled once for workers and gateways.

A worker (:mod:`.runner`) and the Agent Lightning gateway (:mod:`rollq.compat.gateway`) both claim tasks
and publish what an attempt produced. Everything they must agree on is decided here, so that the two cannot
drift apart (they had: a rollout posted through ``serve-al`` for a revived task said generation 1 while the
task record said 2):

- what a published rollout says of its attempt (``status``, ``attempt``, ``worker``, ``generation``,
  ``error``, ``resources_id``, the task's group): :meth:`Attempt.stamp`, :meth:`Attempt.failed`,
  :meth:`Attempts.publication`;
- how a claim the store refused is answered (an invalid task record is failed and dead-lettered, a missing
  or stale one skipped): :meth:`Attempts.refused`;
- how a rollout that cannot be stored (not serialisable, too big) becomes a failed one saying so, and the
  finish transition that publishes it: :meth:`Attempts.publication`;
- what the finish transition's reply means (delivered, superseded by a newer attempt, cancelled):
  :meth:`Attempts.settled`.

Claiming itself, heartbeats and retries stay with their callers: a worker claims in batches and retries by
its policy; a gateway claims per poll and leaves retries to the reaper.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from enum import StrEnum

import redis

from rollq.models.contract import Rollout, Task
from rollq.models.errors import InvalidTaskError, PayloadTooLargeError, UnserializableResultError
from rollq.models.groups import GROUP_FIELDS
from rollq.models.outcomes import failed_rollout, stamp
from rollq.models.policy import RolloutStatus
from rollq.models.wire import rollout_json
from rollq.store.keys import TASK_MISSING, TaskField, inflight_member
from rollq.store.payloads import goes_to_payload, payload_token
from rollq.store.records import wrong_type
from rollq.store.replies import Cancelled, Claim, ClaimRefused, FinishReply, Published, Superseded, TaskMissing
from rollq.store.summaries import summary_json
from rollq.store.transitions import Finish, Lifecycle

from .config import WorkerSettings
from .rewards import REWARD_MISSING

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Attempt:
    """One claim of a task: the task, the claim's number, which run of the task it belongs to, who runs it.

    ``generation`` is fixed when the attempt is claimed (1 for a task's first run, one more after each
    dead-letter requeue); every rollout the attempt publishes carries it.
    """

    rollout_id: str
    number: int
    generation: int
    worker: str

    @classmethod
    def claimed(cls, rollout_id: str, claim: Claim, worker: str) -> Attempt:
        """The attempt a successful claim started."""
        return cls(rollout_id, claim.attempt, claim.generation, worker)

    @property
    def member(self) -> str:
        """The attempt's entry in the in-flight set (``rollout_id|attempt``)."""
        return inflight_member(self.rollout_id, self.number)

    def run_by(self, worker: str) -> Attempt:
        """The same attempt, reported by ``worker`` (a gateway's client, say)."""
        return replace(self, worker=worker)

    def stamp(self, rollout: Rollout, error: BaseException | None = None) -> Rollout:
        """``rollout`` with this attempt's outcome keys in its metadata: failed with ``error``, else succeeded."""
        return stamp(
            rollout,
            status=RolloutStatus.FAILED if error is not None else RolloutStatus.SUCCEEDED,
            attempt=self.number,
            worker=self.worker,
            error=error,
            generation=self.generation,
        )

    def failed(self, error: BaseException) -> Rollout:
        """A rollout of this attempt that carries only ``error``."""
        return failed_rollout(
            self.rollout_id, attempt=self.number, worker=self.worker, error=error, generation=self.generation
        )


@dataclass(frozen=True)
class PublishLimits:
    """Bounds on what an attempt publishes (the worker settings of the same names)."""

    results_maxlen: int
    max_result_bytes: int
    keep_seconds: int

    @classmethod
    def of(cls, settings: WorkerSettings) -> PublishLimits:
        return cls(settings.results_maxlen, settings.max_result_bytes, settings.keep_seconds)


@dataclass(frozen=True)
class Publication:
    """An attempt's rollout, ready to publish: ``finish`` is the finish transition's input, to run alone
    (:meth:`Attempts.publish`) or in one call with others (``Lifecycle.finish_many_call``);
    :meth:`Attempts.settled` reads its reply."""

    rollout: Rollout
    attempt: Attempt
    status: RolloutStatus  # what the rollout says of itself
    finish: Finish
    task: Task | None = None
    member: str | None = None  # the running attempt this publishes, heartbeated until it is settled

    @property
    def rollout_id(self) -> str:
        return self.rollout.rollout_id


class Settled(StrEnum):
    """What became of a published rollout."""

    DELIVERED = "delivered"
    """On the results stream: the task's outcome."""
    SUPERSEDED = "superseded"
    """Its attempt was no longer current (a newer attempt took over, or the task ended): recorded in the
    superseded stream, never delivered."""
    CANCELLED = "cancelled"
    """The task was cancelled while the attempt ran: dropped."""
    TASK_MISSING = "task-missing"
    """The task record was gone (Redis lost it): kept on the superseded stream, marked so, never delivered."""


class Attempts:
    """Answers refused claims and publishes attempts' rollouts in one namespace (thread-safe)."""

    def __init__(self, lifecycle: Lifecycle, limits: PublishLimits) -> None:
        self.lifecycle = lifecycle
        self.limits = limits

    def generation_of(self, rollout_id: str) -> int:
        """The task's current generation as its record says (1 when the record has none or a bad one, or is no hash).

        For a rollout whose attempt is known only by number (posted to a gateway that did not hand it out):
        attempt numbers are never reused across generations, so a current attempt is of the current one.
        """
        try:
            raw = self.lifecycle.connection.hget(self.lifecycle.keys.task(rollout_id), TaskField.GENERATION)
            return max(1, int(raw)) if raw is not None else 1  # type: ignore[arg-type]
        except ValueError:
            return 1
        except redis.ResponseError as exc:  # a task key holding no hash: claim.lua names it, this must not hide it
            if not wrong_type(exc):
                raise
            return 1

    def refused(self, rollout_id: str, job_id: str, refusal: ClaimRefused, worker: str) -> InvalidTaskError | None:
        """Answer a claim the store refused: a task whose record cannot be run is failed (a failed rollout
        published and dead-lettered; returns its error); a missing or stale one is skipped (None)."""
        if refusal.reason != "invalid":
            log.warning(
                "skipped job %s: task %s is %s",
                job_id,
                rollout_id,
                refusal.reason + (f" ({refusal.state})" if refusal.state else ""),
            )
            return None
        error = InvalidTaskError(f"task {rollout_id} cannot be claimed: {refusal.state}")
        log.error("%s; failing it", error)
        rollout = failed_rollout(
            rollout_id, attempt=0, worker=worker, error=error, generation=self.generation_of(rollout_id)
        )
        self.lifecycle.reject(
            rollout_id,
            job_id,
            rollout_json(rollout),
            results_maxlen=self.limits.results_maxlen,
            now=time.time(),
            summary=summary_json(rollout, status=RolloutStatus.FAILED),
        )
        return error

    def publication(
        self,
        attempt: Attempt,
        rollout: Rollout,
        *,
        failed: bool,
        duration: float | None,
        task: Task | None = None,
        resources_id: str | None = None,
        member: str | None = None,
    ) -> Publication:
        """``rollout`` (stamped by ``attempt``) as it will be published, with its finish call; one that cannot
        be serialised or is larger than ``max_result_bytes`` becomes a failed rollout that says so."""
        rollout_id = attempt.rollout_id
        # The task's group (GRPO-style) and mode travel with its rollout, for Producer.batches.
        stamped = {k: task.metadata[k] for k in GROUP_FIELDS if k in task.metadata} if task is not None else {}
        if task is not None and task.mode is not None:
            stamped["mode"] = task.mode
        if resources_id:
            stamped["resources_id"] = resources_id
        if stamped:
            rollout = rollout.model_copy(update={"metadata": {**rollout.metadata, **stamped}})
        try:
            data = rollout_json(rollout)
        except Exception as exc:  # pydantic's error names the type it could not serialise
            error: Exception = UnserializableResultError(f"rollout {rollout_id} cannot be serialised: {exc}")
            log.error("%s; publishing a failed rollout instead", error)
            rollout = attempt.failed(error)
            data = rollout_json(rollout)
            failed = True
        if len(data) > self.limits.max_result_bytes:
            error = PayloadTooLargeError(f"rollout {rollout_id}", len(data), self.limits.max_result_bytes)
            log.error("%s; publishing a failed rollout instead", error)
            rollout = attempt.failed(error)
            data = rollout_json(rollout)
            failed = True
        status = RolloutStatus.FAILED if failed else RolloutStatus.SUCCEEDED
        reward = (
            rollout.final_reward if rollout.final_reward is not None and math.isfinite(rollout.final_reward) else None
        )
        finish = Finish(
            rollout_id=rollout_id,
            attempt=attempt.number,
            rollout_json=data,
            status=status,
            results_maxlen=self.limits.results_maxlen,
            dead_letter=failed,
            now=time.time(),
            duration=duration,
            keep_seconds=self.limits.keep_seconds,
            reward=reward,
            resources_id=resources_id,
            reward_missing=not failed and rollout.metadata.get(REWARD_MISSING) is True,
            summary=summary_json(rollout, status=status, duration=duration),
            # Only a rollout kept in a payload key has its key named by the token: drawing one for every rollout
            # was an os.urandom call, which lets go of the GIL (a hand-off to another thread of the worker).
            payload_token=payload_token() if goes_to_payload(data) else "",
        )
        return Publication(rollout, attempt, status, finish, task, member)

    def publish(self, publication: Publication) -> FinishReply:
        """Run one publication's finish call on its own (a worker batches them instead)."""
        return self.lifecycle.finish(publication.finish)

    def settled(self, publication: Publication, reply: FinishReply) -> Settled:
        """What the finish call's ``reply`` means for the publication (logged when it was not delivered)."""
        attempt = publication.attempt
        if isinstance(reply, Published):
            return Settled.DELIVERED
        if isinstance(reply, Cancelled):
            log.info(
                "task %s was cancelled while attempt %d ran; its result is dropped", attempt.rollout_id, attempt.number
            )
            return Settled.CANCELLED
        if isinstance(reply, Superseded):
            log.warning(
                "result of %s attempt %d (from %s) arrived after a newer attempt took over; kept as superseded",
                attempt.rollout_id,
                attempt.number,
                attempt.worker,
            )
            return Settled.SUPERSEDED
        if isinstance(reply, TaskMissing):
            log.warning(
                "result of %s attempt %d (from %s): the task record %s is gone (Redis lost it: a restart without "
                "persistence, a flush, an eviction); the rollout is kept on the superseded stream %s with reason %r, "
                "not delivered (enqueue the task again to run it)",
                attempt.rollout_id,
                attempt.number,
                attempt.worker,
                self.lifecycle.keys.task(attempt.rollout_id),
                self.lifecycle.keys.superseded,
                TASK_MISSING,
            )
            return Settled.TASK_MISSING
        raise ValueError(f"a finish call without stale_before cannot answer {reply!r}")
