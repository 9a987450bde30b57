"""Running one claimed task: resources, hooks, tracer, agent, and the outcome to publish.

An attempt has two halves so that no thread waits while the agent runs, and the
worker runs each half for many jobs at once (:mod:`.rq_lifecycle`). The claim
itself is sent in the worker's start batch; :meth:`AgentRunner.claimed` reads its
reply, and :meth:`AgentRunner.launch` runs the start hooks and hands the agent to
the :class:`AgentExecutor`, returning a :class:`Pending` whose future settles
when the agent is done, timed out or handed back. :meth:`AgentRunner.conclude`
turns the outcome into a Rollout, runs the end hooks, and either requeues the
task for a retry or returns a :class:`Publication` whose finish call the
worker's finish batch sends (refused if a newer attempt took over);
:meth:`AgentRunner.settle` reads its reply. The worker's client retries until
Redis is back, so a finished rollout is not lost to an outage.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import math
import threading
import time
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from rollq.models.contract import NamedResources, Rollout, Task, Triplet
from rollq.models.errors import (
    AgentTimeoutError,
    InvalidResourcesError,
    InvalidTaskError,
    LLMBackendError,
    RetryNotQueuedError,
    RolloutBuildError,
    UnknownResourcesError,
)
from rollq.models.llm_options import InvalidLLMOptionsError, agent_view
from rollq.models.outcomes import describe
from rollq.models.policy import FailureKind, RolloutPolicy
from rollq.store.keys import inflight_member
from rollq.store.records import parse_task
from rollq.store.replies import Claim, ClaimRefused, FinishReply, JobTaken, TaskMissing
from rollq.store.transitions import Lifecycle

from .agent import LitAgent
from .attempt import Attempt, Attempts, Publication, PublishLimits, Settled
from .capture.ambient import CURRENT_ATTEMPT
from .config import WorkerSettings
from .executor import AgentExecutor, BlockedByNeighbour, contained
from .hooks import HookSet
from .lean_spans import set_attributes
from .normalize import to_rollout
from .resource_cache import ResourceCache
from .rewards import flag_missing_reward
from .tracer import BaseTracer, RolloutTrace

if TYPE_CHECKING:
    from .capture import AttemptCapture, OnDemandCapture

log = logging.getLogger(__name__)


class AttemptStatus(StrEnum):
    """How an attempt ended, as far as this worker is concerned."""

    SUCCEEDED = "succeeded"  # published a succeeded rollout
    FAILED = "failed"  # published a failed rollout
    RETRYING = "retrying"  # failed, and the task is queued again for another attempt
    RELEASED = "released"  # handed back to the queue on a graceful stop
    SUPERSEDED = "superseded"  # a newer attempt took over; the result was kept aside, not delivered
    TASK_MISSING = "task-missing"  # Redis had lost the task record; the result was kept aside, not delivered
    SKIPPED = "skipped"  # the job no longer stands for its task; nothing ran
    CANCELLED = "cancelled"  # the task was cancelled while the attempt ran; its result was dropped
    LOST = "lost"  # no longer in flight (cancelled, or taken over by a reaper): the agent was stopped


@dataclass(frozen=True)
class AttemptResult:
    """What running one RQ job did; the job's result in RQ (rq-dashboard shows it)."""

    rollout_id: str
    status: AttemptStatus
    attempt: int | None = None
    reason: str | None = None
    # For a published rollout, what rq-dashboard's job page and `rollq task` show of it.
    reward: float | None = None
    error: dict[str, str] | None = None
    mode: str | None = None
    resources_id: str | None = None
    input: str | None = None  # a preview: the task record and the results stream hold the whole input

    def to_json(self) -> dict[str, Any]:
        """The JSON form RQ stores (its JSON serializer cannot store a dataclass).

        What ``asdict`` gave, without its deep copy of every field (~25 us a job; the only nested value, ``error``,
        is a flat dict of strings, copied here)."""
        found = {}
        for name in _RESULT_FIELDS:
            value = getattr(self, name)
            if value is not None:
                found[name] = dict(value) if type(value) is dict else value
        return found


_RESULT_FIELDS = tuple(f.name for f in fields(AttemptResult))


class AttemptReleased(Exception):
    """Set on a running attempt's future when the worker stops before the attempt finished."""


class AttemptLost(Exception):
    """Set on a running attempt's future when it is no longer in flight: cancelled, or taken over by a reaper."""


@dataclass
class Pending:
    """An attempt whose agent is running; ``future`` settles with its outcome."""

    task: Task
    policy: RolloutPolicy
    claim: Claim
    trace: RolloutTrace
    future: concurrent.futures.Future[Any]
    attempt: Attempt
    started: float = field(default_factory=time.monotonic)
    capture: AttemptCapture | None = None
    hook_overruns: dict[str, float] = field(default_factory=dict)
    job_id: str | None = None
    """The RQ job that claimed it, for the log (a gateway's attempts have none)."""

    @property
    def member(self) -> str:
        return self.attempt.member


class AgentRunner:
    """Runs the tasks this worker process claims."""

    def __init__(
        self,
        *,
        lifecycle: Lifecycle,
        resources: ResourceCache,
        agent: LitAgent,
        hooks: HookSet,
        tracer: BaseTracer,
        executor: AgentExecutor,
        settings: WorkerSettings,
        worker_name: str,
        capture: OnDemandCapture | None = None,
    ) -> None:
        self.lifecycle = lifecycle
        self.resources = resources
        self.agent = agent
        self.hooks = hooks
        self.tracer = tracer
        self.executor = executor
        self.settings = settings
        self.worker_name = worker_name
        self.capture = capture
        self.attempts = Attempts(lifecycle, PublishLimits.of(settings))
        self.worker_id: int | None = None  # set by the worker once Redis gave it one (Agent Lightning's runner has it)
        self._running: dict[str, Pending] = {}
        # Claimed attempts not launched yet (``member`` -> unresponsive_seconds): heartbeated from the claim.
        self._claimed: dict[str, float] = {}
        self._lock = threading.Lock()

    def heartbeat_members(self) -> dict[str, float]:
        """The attempts this worker vouches for (``rollout_id|attempt`` -> unresponsive_seconds).

        Async attempts are left out while the agent event loop is stalled: an
        attempt on a loop that does not turn makes no progress, so its deadline
        runs out and a reaper hands it to a worker that can run it.
        """
        loop_stalled = self.executor.stalled_for() > 0
        with self._lock:
            return {
                **self._claimed,
                **{
                    member: p.policy.unresponsive_seconds
                    for member, p in self._running.items()
                    if not (loop_stalled and self.agent.is_async)
                },
            }

    def release_all(self) -> int:
        """Ask every running attempt to hand its task back to the queue; returns how many were asked."""
        with self._lock:
            futures = [p.future for p in self._running.values()]
        for future in futures:
            try:
                future.set_exception(AttemptReleased())
            except concurrent.futures.InvalidStateError:
                pass  # it finished on its own meanwhile
            self.executor.cancel(future)
        return len(futures)

    def abandon(self, members: list[str]) -> int:
        """Stop the agents of attempts (``rollout_id|attempt``) that are no longer this worker's; returns how many."""
        with self._lock:
            futures = [self._running[m].future for m in members if m in self._running]
        for future in futures:
            try:
                future.set_exception(AttemptLost())
            except concurrent.futures.InvalidStateError:
                continue  # it finished meanwhile; finish decides
            self.executor.cancel(future)
        return len(futures)

    def claimed(self, rollout_id: str, job_id: str, claim: Claim | ClaimRefused) -> Claim | AttemptResult:
        """What a claim's reply means for the job: the claim to launch, or the job's result when refused."""
        if not isinstance(claim, ClaimRefused):
            with self._lock:
                self._claimed[inflight_member(rollout_id, claim.attempt)] = _unresponsive_of(claim.policy_json)
            return claim
        error = self.attempts.refused(rollout_id, job_id, claim, self.worker_name)
        if error is not None:
            return AttemptResult(rollout_id, AttemptStatus.FAILED, reason=str(error))
        return AttemptResult(rollout_id, AttemptStatus.SKIPPED, reason=claim.reason)

    def launch(self, rollout_id: str, claim: Claim, job_id: str | None = None) -> Pending | AttemptResult:
        """Start the agent of a claimed attempt (``job_id``: the RQ job that claimed it, which its log lines name);
        the result at once when the task cannot run."""
        try:
            return self._launch(rollout_id, claim, job_id)
        finally:
            with self._lock:
                self._claimed.pop(inflight_member(rollout_id, claim.attempt), None)

    def _launch(self, rollout_id: str, claim: Claim, job_id: str | None) -> Pending | AttemptResult:
        try:
            task, policy = parse_task(
                rollout_id, claim.task_json, claim.policy_json, claims=claim.attempt, last_claim=claim.claimed_at
            )
        except InvalidTaskError as error:
            log.error("%s", error)
            attempt = Attempt.claimed(rollout_id, claim, self.worker_name)
            return self._publish(self.attempts.publication(attempt, attempt.failed(error), failed=True, duration=None))
        try:
            resources = self._resources(task, claim)
        except (UnknownResourcesError, InvalidResourcesError) as exc:
            log.error("task %s: %s", rollout_id, exc)
            attempt = Attempt.claimed(rollout_id, claim, self.worker_name)
            rollout = attempt.stamp(Rollout(rollout_id=rollout_id), exc)
            return self._publish(self.attempts.publication(attempt, rollout, failed=True, duration=None, task=task))
        rollout_trace = self.tracer.start_rollout(rollout_id, claim.attempt)
        set_attributes(
            rollout_trace.root,
            {
                "rollq.namespace": self.lifecycle.keys.namespace,
                "rollq.mode": task.mode or "",
                "rollq.resources_id": task.resources_id or claim.latest_resources_id or "",
            },
        )
        capture = None
        if self.capture is not None and (resources or self.capture.serves_environment):
            # The agent sees its LLM endpoints through this attempt's own proxy addresses.
            self.capture.gate.note_version(claim.latest_resources_id)
            try:
                resources, capture = self.capture.open_attempt(
                    resources,
                    trace.set_span_in_context(rollout_trace.root),
                    self.tracer.capture_tracer(),
                    rollout_id=rollout_id,
                    mode=task.mode,
                    resources_id=task.resources_id or claim.latest_resources_id,
                )
                if (
                    capture is not None and capture.header_token is not None
                ):  # its calls to $OPENAI_BASE_URL & co. say which attempt made them
                    rollout_trace.context.run(CURRENT_ATTEMPT.set, capture.header_token)
            except InvalidLLMOptionsError as exc:
                log.error("task %s: %s", rollout_id, exc)
                rollout_trace.finish(error=exc)
                attempt = Attempt.claimed(rollout_id, claim, self.worker_name)
                rollout = attempt.stamp(Rollout(rollout_id=rollout_id), exc)
                return self._publish(self.attempts.publication(attempt, rollout, failed=True, duration=None, task=task))
        else:
            resources = agent_view(resources)  # rollq's own LLM options are not the agent's to see
        overruns = self.hooks.rollout_start(task, self, self.tracer, rollout_trace.context)
        with self._lock:
            future = self.executor.submit(
                self.agent.rollout_call(task.mode),
                self.agent.rollout_arguments(
                    task, claim.attempt, resources, task.resources_id or claim.latest_resources_id, policy
                ),
                rollout_trace.context,
                self.agent.is_async,
                policy.timeout_seconds,
                rollout_id,
            )
            attempt = Attempt.claimed(rollout_id, claim, self.worker_name)
            pending = self._running[attempt.member] = Pending(
                task,
                policy,
                claim,
                rollout_trace,
                future,
                attempt,
                capture=capture,
                hook_overruns=overruns,
                job_id=job_id,
            )
        return pending

    def conclude(self, pending: Pending) -> AttemptResult | Publication:
        """Turn a settled attempt into the rollout to publish, or retry or hand it back (the job's result then).

        A :class:`Publication` still counts as running (heartbeated) until :meth:`settle` is given its reply.
        Whatever building the rollout raises (an agent's exception whose message cannot be read, say), a failed
        rollout naming it is published: a task whose attempt settled is never left for a reaper to find.
        """
        publishing = False
        try:
            outcome: AttemptResult | Publication
            try:
                outcome = self._conclude(pending)
            except BaseException as fault:
                outcome = self._unbuilt(pending, fault)
            publishing = isinstance(outcome, Publication)
            return outcome
        finally:
            if not publishing:
                self._forget(pending.member)

    def _unbuilt(self, pending: Pending, fault: BaseException) -> Publication:
        """A failed rollout of ``pending``'s attempt naming ``fault``, raised while its rollout was built, and how
        the agent ended. (The finish call publishes it only if the attempt is still the task's current one.)"""
        rid, attempt = pending.task.rollout_id, pending.claim.attempt
        agent_error = pending.future.exception(timeout=0)
        if isinstance(agent_error, AttemptReleased | AttemptLost | BlockedByNeighbour):
            raise fault  # not this attempt's to fail: left running, a reaper hands it back or drops it
        ended = f"the agent failed with {describe(agent_error)}" if agent_error is not None else "the agent returned"
        error = RolloutBuildError(f"the rollout of attempt {attempt} could not be built ({describe(fault)}); {ended}")
        error.__cause__ = fault
        log.error("task %s: %s", rid, error, exc_info=(type(fault), fault, fault.__traceback__))
        return self.attempts.publication(
            pending.attempt,
            pending.attempt.failed(error),
            failed=True,
            duration=time.monotonic() - pending.started,
            task=pending.task,
            resources_id=pending.task.resources_id or pending.claim.latest_resources_id,
            member=pending.member,
        )

    def _conclude(self, pending: Pending) -> AttemptResult | Publication:
        task, policy, claim = pending.task, pending.policy, pending.claim
        rid, attempt = task.rollout_id, claim.attempt
        if pending.capture is not None:
            pending.capture.close()  # from here on, calls on this attempt's addresses are refused
        error: BaseException | None = None
        kind: FailureKind | None = None
        raw: Any = None
        try:
            raw = pending.future.result(timeout=0)
        except (AttemptReleased, BlockedByNeighbour) as exc:
            pending.trace.finish()
            released = self.lifecycle.requeue(task, attempt, policy, "released")
            if isinstance(released, TaskMissing):
                log.warning(
                    "could not hand %s back (attempt %d): its task record %s is gone (Redis lost it: a restart "
                    "without persistence, a flush, an eviction); enqueue the task again to run it",
                    rid,
                    attempt,
                    self.lifecycle.keys.task(rid),
                )
                return AttemptResult(rid, AttemptStatus.TASK_MISSING, attempt)
            why = f" ({exc})" if isinstance(exc, BlockedByNeighbour) else ""
            log.info("handed %s back to the queue (attempt %d)%s", rid, attempt, why)
            return AttemptResult(rid, AttemptStatus.RELEASED, attempt)
        except AttemptLost:
            pending.trace.finish()
            log.info("stopped %s attempt %d: it was cancelled or taken over", rid, attempt)
            return AttemptResult(rid, AttemptStatus.LOST, attempt)
        except AgentTimeoutError as exc:
            error, kind = AgentTimeoutError(f"attempt {attempt} {exc}"), "timeout"
        except Exception as exc:
            error, kind = _backend_error(exc, pending.capture), "exception"
        except BaseException as exc:  # the executor contains these already; one that got through still fails it
            error, kind = contained(exc, rid), "exception"
        spans = pending.trace.finish(error=error, reward=_early_reward(raw))
        if error is None:
            try:
                rollout = to_rollout(rid, raw, spans, only_agent=self.settings.triplet_agent or None)
            except Exception as exc:
                error, kind = exc, "exception"
        if error is not None:
            # With the stack (the agent's frames), where an operator looks first; the only record of it in the
            # log (the job's end names the failure in one line: rq_lifecycle, packs.logged_failure).
            log.error(
                "task %s attempt %d%s failed: %s",
                rid,
                attempt,
                f" (RQ job {pending.job_id})" if pending.job_id else "",
                describe(error),
                exc_info=(type(error), error, error.__traceback__) if error.__traceback__ else None,
            )
            rollout = to_rollout(rid, None, spans, only_agent=self.settings.triplet_agent or None, strict=False)
        rollout = pending.attempt.stamp(rollout, error)
        if error is None:
            rollout = flag_missing_reward(rollout)
        overruns = {
            **pending.hook_overruns,
            **self.hooks.rollout_end(task, rollout, self, self.tracer, pending.trace.context),
        }
        if overruns:
            rollout = rollout.model_copy(update={"metadata": {**rollout.metadata, "hook_overruns": overruns}})
        if error is not None and kind is not None and policy.retries(kind, claim.attempts_used):
            reply = self.lifecycle.requeue(task, attempt, policy, "retry")
            if isinstance(reply, TaskMissing):
                # No retry was queued: the failed rollout is published below, where finish.lua keeps it aside as
                # task-missing (the Publication's settling logs that).
                log.warning("task %s attempt %d failed; its record is gone, so no retry was queued", rid, attempt)
            elif not isinstance(reply, JobTaken):
                log.warning(
                    "attempt %d/%d of %s failed (%s); retrying",
                    claim.attempts_used,
                    policy.max_attempts,
                    rid,
                    describe(error),
                )
                return AttemptResult(rid, AttemptStatus.RETRYING, attempt)
            else:
                # The retry's job id holds another job: fail for good, saying so and why the attempt failed.
                error = RetryNotQueuedError(
                    self.lifecycle.keys.job_id(rid, after_attempt=attempt), rid, describe(error)
                )
                log.error("task %s: %s", rid, error)
                rollout = pending.attempt.stamp(rollout, error)
        if rollout.trace is not None and not self._keeps_trace(failed=error is not None):
            rollout = rollout.model_copy(update={"trace": None})
        publication = self.attempts.publication(
            pending.attempt,
            rollout,
            failed=error is not None,
            duration=time.monotonic() - pending.started,
            task=task,
            resources_id=task.resources_id or claim.latest_resources_id,
            member=pending.member,
        )
        return publication

    def _keeps_trace(self, *, failed: bool) -> bool:
        """Whether a rollout is published with its trace (the worker's ``rollout_trace``)."""
        kept = self.settings.rollout_trace
        return kept == "all" or (kept == "failed" and failed)

    def _forget(self, member: str | None) -> None:
        if member is not None:
            with self._lock:
                self._running.pop(member, None)

    def _resources(self, task: Task, claim: Claim) -> NamedResources:
        resources_id = task.resources_id or claim.latest_resources_id
        if resources_id is None:
            return {}
        return self.resources.get(resources_id)

    def _publish(self, publication: Publication) -> AttemptResult:
        """Publish one rollout on its own (the batched path is the worker's finish batch)."""
        return self.settle(publication, self.attempts.publish(publication))

    def settle(self, publication: Publication, reply: FinishReply | BaseException) -> AttemptResult:
        """The job's result once the finish call has answered (or failed: the error is raised here)."""
        self._forget(publication.member)
        if isinstance(reply, BaseException):
            raise reply
        rollout_id, attempt = publication.rollout_id, publication.attempt.number
        settled = self.attempts.settled(publication, reply)
        if settled == Settled.CANCELLED:
            return AttemptResult(rollout_id, AttemptStatus.CANCELLED, attempt)
        if settled == Settled.SUPERSEDED:
            return AttemptResult(rollout_id, AttemptStatus.SUPERSEDED, attempt)
        if settled == Settled.TASK_MISSING:
            return AttemptResult(rollout_id, AttemptStatus.TASK_MISSING, attempt)
        return _published(publication.rollout, AttemptStatus(publication.status.value), attempt, publication.task)


_INPUT_PREVIEW_CHARS = 500


def _published(rollout: Rollout, status: AttemptStatus, attempt: int, task: Task | None) -> AttemptResult:
    """The job result of a published rollout, with what an operator looks for on the job's page."""
    preview = None
    if task is not None:
        text = json.dumps(task.input, default=str)
        preview = text if len(text) <= _INPUT_PREVIEW_CHARS else text[:_INPUT_PREVIEW_CHARS] + "..."
    return AttemptResult(
        rollout.rollout_id,
        status,
        attempt,
        reward=rollout.final_reward if _finite(rollout.final_reward) else None,
        error=rollout.metadata.get("error") or None,
        mode=task.mode if task else None,
        resources_id=rollout.metadata.get("resources_id") or (task.resources_id if task else None),
        input=preview,
    )


_UNRESPONSIVE: dict[bytes, float] = {}
"""``_unresponsive_of`` by policy JSON: the tasks of a run mostly share a few policies, read once each."""


def _unresponsive_of(policy_json: bytes) -> float:
    """The unresponsive_seconds of a claimed task's policy, to heartbeat it before it is parsed in full."""
    found = _UNRESPONSIVE.get(policy_json)
    if found is None:
        if len(_UNRESPONSIVE) >= 64:
            _UNRESPONSIVE.clear()
        found = _UNRESPONSIVE[policy_json] = _read_unresponsive(policy_json)
    return found


def _read_unresponsive(policy_json: bytes) -> float:
    try:
        value = json.loads(policy_json).get("unresponsive_seconds")
        return float(value) if isinstance(value, int | float) and value > 0 else RolloutPolicy().unresponsive_seconds
    except (ValueError, AttributeError, RecursionError):
        return RolloutPolicy().unresponsive_seconds


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _early_reward(raw: Any) -> float | None:
    """The reward of an agent's result when it is plain to see before the trace is read (for the root span)."""
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        try:
            return float(raw)
        except OverflowError:  # to_rollout says why it cannot be a reward
            return None
    if isinstance(raw, Rollout):
        return raw.final_reward
    if isinstance(raw, list) and raw and isinstance(raw[-1], Triplet):
        return raw[-1].reward
    return None


def _backend_error(exc: Exception, capture: AttemptCapture | None) -> Exception:
    # An agent that fails after the LLM backend refused a call fails because of it; say so with the status,
    # whatever client (and error message) the agent used.
    failure = capture.failed_last_call() if capture is not None else None
    if failure is None:
        return exc
    error = LLMBackendError(failure.status, failure.resource, failure.path, (failure.error or "")[:300])
    error.__cause__ = exc
    return error
