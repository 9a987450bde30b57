"""Running one claimed task: resources, hooks, tracer, agent, and publishing the outcome.

``AgentRunner.run`` is called from an RQ job thread. It claims the task (one
Lua call), runs the agent through the :class:`AgentExecutor` with the attempt's
time limit, turns the return value into a Rollout, and then either publishes
it (one Lua call, refused if a newer attempt took over) or requeues the task
for a retry. Redis errors while publishing are retried until Redis is back, so
a finished rollout is not lost to an outage.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import redis
from pydantic import ValidationError

from models.contract import NamedResources, Rollout, Task
from models.errors import AgentTimeoutError, InvalidTaskError, PayloadTooLargeError, UnknownResourcesError
from models.lifecycle import Claim, ClaimRefused, Lifecycle, RequeueReason
from models.outcomes import failed_rollout, stamp
from models.policy import FailureKind, RolloutPolicy, RolloutStatus

from .agent import LitAgent
from .config import WorkerSettings
from .executor import AgentExecutor
from .hooks import HookSet
from .normalize import to_rollout
from .resource_cache import ResourceCache
from .tracer import BaseTracer

log = logging.getLogger(__name__)

# Errors about the task itself: running it again cannot help, whatever the policy says.
_NEVER_RETRIED = (InvalidTaskError, UnknownResourcesError)


class AttemptReleased(Exception):
    """Set on a running attempt's future when the worker stops before the attempt finished."""


@dataclass
class _Running:
    unresponsive_seconds: float
    future: concurrent.futures.Future[Any] | None = None


@dataclass
class _Outcome:
    rollout: Rollout
    error: BaseException | None = None
    kind: FailureKind | None = None
    released: bool = False
    started: float = field(default_factory=time.monotonic)


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
    ) -> None:
        self.lifecycle = lifecycle
        self.resources = resources
        self.agent = agent
        self.hooks = hooks
        self.tracer = tracer
        self.executor = executor
        self.settings = settings
        self.worker_name = worker_name
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()

    def heartbeat_deadlines(self, now: float) -> dict[str, float]:
        """The new heartbeat deadline of every attempt running here (``rollout_id|attempt`` -> time)."""
        with self._lock:
            return {member: now + r.unresponsive_seconds for member, r in self._running.items()}

    def release_all(self) -> int:
        """Ask every running attempt to hand its task back to the queue; returns how many were asked."""
        with self._lock:
            futures = [r.future for r in self._running.values() if r.future is not None]
        for future in futures:
            try:
                future.set_exception(AttemptReleased())
            except concurrent.futures.InvalidStateError:
                pass  # it finished on its own meanwhile
            self.executor.cancel(future)
        return len(futures)

    def run(self, rollout_id: str, job_id: str) -> dict[str, Any]:
        """Claim and run ``rollout_id``; the returned dict is the RQ job's result."""
        claimed_at = time.time()
        claim = self.lifecycle.claim(rollout_id, job_id, self.worker_name, claimed_at)
        if isinstance(claim, ClaimRefused):
            log.warning("skipped job %s: task %s is %s", job_id, rollout_id, claim.reason + (f" ({claim.state})" if claim.state else ""))
            return {"rollout_id": rollout_id, "status": "skipped", "reason": claim.reason}
        member = f"{rollout_id}|{claim.attempt}"
        try:
            task = Task.model_validate_json(claim.task_json).model_copy(
                update={"num_claims": claim.attempt, "last_claim_time": claimed_at}
            )
            policy = RolloutPolicy.model_validate_json(claim.policy_json)
        except ValidationError as exc:
            error = InvalidTaskError(f"task {rollout_id} is not a valid rollq task: {exc}")
            log.error("%s", error)
            rollout = failed_rollout(rollout_id, attempt=claim.attempt, worker=self.worker_name, error=error)
            return self._publish(rollout_id, claim.attempt, rollout, failed=True, duration=None)
        with self._lock:
            self._running[member] = running = _Running(policy.unresponsive_seconds)
        try:
            outcome = self._attempt(task, policy, claim, running)
            if outcome.released:
                self._requeue(task, claim.attempt, policy, "released")
                log.info("handed %s back to the queue (attempt %d)", rollout_id, claim.attempt)
                return {"rollout_id": rollout_id, "attempt": claim.attempt, "status": "released"}
            error = outcome.error
            if error is not None and outcome.kind is not None and not isinstance(error, _NEVER_RETRIED):
                if policy.retries(outcome.kind, claim.attempts_used):
                    self._requeue(task, claim.attempt, policy, "retry")
                    log.warning(
                        "attempt %d/%d of %s failed (%s: %s); retrying",
                        claim.attempts_used, policy.max_attempts, rollout_id, type(error).__name__, error,
                    )
                    return {"rollout_id": rollout_id, "attempt": claim.attempt, "status": "retrying"}
            duration = time.monotonic() - outcome.started
            return self._publish(rollout_id, claim.attempt, outcome.rollout, failed=error is not None, duration=duration)
        finally:
            with self._lock:
                self._running.pop(member, None)

    def _attempt(self, task: Task, policy: RolloutPolicy, claim: Claim, running: _Running) -> _Outcome:
        rid, attempt = task.rollout_id, claim.attempt
        try:
            resources = self._resources(task, claim)
        except UnknownResourcesError as exc:
            log.error("task %s: %s", rid, exc)
            return _Outcome(self._stamp(Rollout(rollout_id=rid), attempt, exc), exc, "exception")
        rollout_trace = self.tracer.start_rollout(rid, attempt)
        self.hooks.rollout_start(task, self, self.tracer, rollout_trace.context)
        call = self.agent.rollout_call(task.mode)
        with self._lock:
            running.future = self.executor.submit(
                call, (task.input, rid, resources), rollout_trace.context, self.agent.is_async
            )
        error: BaseException | None = None
        kind: FailureKind | None = None
        raw: Any = None
        try:
            raw = running.future.result(timeout=policy.timeout_seconds)
        except AttemptReleased:
            rollout_trace.finish()
            return _Outcome(Rollout(rollout_id=rid), released=True)
        except concurrent.futures.TimeoutError:
            self.executor.cancel(running.future)
            error, kind = AgentTimeoutError(f"attempt {attempt} ran past its {policy.timeout_seconds:g}s limit"), "timeout"
        except Exception as exc:
            error, kind = exc, "exception"
        spans = rollout_trace.finish()
        if error is None:
            try:
                rollout = to_rollout(rid, raw, spans)
            except Exception as exc:
                error, kind = exc, "exception"
        if error is not None:
            log.error("task %s attempt %d failed: %s: %s", rid, attempt, type(error).__name__, error)
            rollout = to_rollout(rid, None, spans)
        rollout = self._stamp(rollout, attempt, error)
        self.hooks.rollout_end(task, rollout, self, self.tracer, rollout_trace.context)
        return _Outcome(rollout, error, kind)

    def _resources(self, task: Task, claim: Claim) -> NamedResources:
        resources_id = task.resources_id or claim.latest_resources_id
        if resources_id is None:
            return {}
        return self.resources.get(resources_id)

    def _stamp(self, rollout: Rollout, attempt: int, error: BaseException | None) -> Rollout:
        status = RolloutStatus.FAILED if error is not None else RolloutStatus.SUCCEEDED
        return stamp(rollout, status=status, attempt=attempt, worker=self.worker_name, error=error)

    def _publish(self, rollout_id: str, attempt: int, rollout: Rollout, *, failed: bool, duration: float | None) -> dict[str, Any]:
        data = rollout.model_dump_json()
        if len(data) > self.settings.max_result_bytes:
            error = PayloadTooLargeError(f"rollout {rollout_id}", len(data), self.settings.max_result_bytes)
            log.error("%s; publishing a failed rollout instead", error)
            data = failed_rollout(rollout_id, attempt=attempt, worker=self.worker_name, error=error).model_dump_json()
            failed = True
        status = RolloutStatus.FAILED if failed else RolloutStatus.SUCCEEDED
        reply = self._with_redis(
            f"publishing {rollout_id}",
            lambda: self.lifecycle.finish(
                rollout_id, attempt, data, status.value,
                results_maxlen=self.settings.results_maxlen,
                dead_letter=failed,
                now=time.time(),
                duration=duration,
                keep_seconds=self.settings.keep_seconds,
            ),
        )
        if reply == 0:
            log.warning("result of %s attempt %d arrived after a newer attempt took over; kept as superseded", rollout_id, attempt)
            return {"rollout_id": rollout_id, "attempt": attempt, "status": "superseded"}
        return {"rollout_id": rollout_id, "attempt": attempt, "status": status.value}

    def _requeue(self, task: Task, attempt: int, policy: RolloutPolicy, reason: RequeueReason) -> None:
        self._with_redis(f"requeueing {task.rollout_id}", lambda: self.lifecycle.requeue(task, attempt, policy, reason))

    def _with_redis(self, what: str, call: Any) -> Any:
        """``call()``, retried across a Redis outage; the client already retried briefly before raising."""
        delay = 0.5
        while True:
            try:
                return call()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.error("Redis unavailable while %s (%s); retrying in %.1fs", what, exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
