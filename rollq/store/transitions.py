"""A task's life as atomic Redis transitions: enqueue, claim, finish, requeue, revive, restore.

Each transition is one Lua script (``store/lua``), so producers, workers and
reapers on any number of machines can race and exactly one of them wins. A task
moves ``queued -> running -> succeeded | failed``; ``requeue`` sends a running
attempt back to ``queued`` as a new RQ job, ``revive`` does the same for a task
in the dead-letter set. Each script's reply comes back as a small type
(:class:`Published`, :class:`Superseded`, :class:`StillAlive`, ...), never as a bare code.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources as package_files
from typing import Any, Literal

import redis
from redis.client import Pipeline
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from rollq.models.contract import Task
from rollq.models.errors import JobIdTakenError
from rollq.models.policy import RolloutPolicy

from .connection import transient_refusal
from .jobs import JobTemplate
from .keys import Keys, job_id, lua_header

log = logging.getLogger(__name__)

RequeueReason = Literal["retry", "unresponsive", "released"]

# At most one shortfall warning per this many seconds per Lifecycle: with no replica (right after a failover)
# every transition falls short, and a line per transition would drown the log.
_SHORTFALL_LOG_SECONDS = 10.0

# Tasks per enqueue Lua call: big enough to share the per-call cost, small enough
# that one call never holds Redis for long.
_ENQUEUE_BATCH = 100

DURATION_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Upper bounds (seconds) of the rollout duration histogram kept in the stats hash."""


def duration_bucket(seconds: float) -> str:
    """The histogram bucket label (``le``) a rollout of ``seconds`` falls in."""
    i = bisect.bisect_left(DURATION_BUCKETS, seconds)
    return "+Inf" if i == len(DURATION_BUCKETS) else repr(DURATION_BUCKETS[i])


REWARD_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 2.0, 5.0, 10.0)
"""Upper bounds of the final-reward histogram kept in the stats hash, by mode and resources version.

Negative rewards count in the first bucket: prometheus_client leaves out _sum and _count of a histogram
with negative bounds, and a trainer wants the mean (sum / count) most of all.
"""


def reward_bucket(reward: float) -> str:
    """The histogram bucket label (``le``) a final reward falls in."""
    i = bisect.bisect_left(REWARD_BUCKETS, reward)
    return "+Inf" if i == len(REWARD_BUCKETS) else repr(REWARD_BUCKETS[i])


class Enqueued(StrEnum):
    """What enqueueing did with one task."""

    QUEUED = "queued"
    KNOWN = "known"  # the rollout id was known already; nothing was written for it
    UNKNOWN_RESOURCES = "unknown_resources"  # the pinned version does not exist; nothing of the batch was written
    JOB_TAKEN = "job_taken"  # the task's job id holds a job hash that stands for something else; nothing written


@dataclass(frozen=True)
class Published:
    """The rollout is on the results stream at ``entry_id``."""

    entry_id: str


@dataclass(frozen=True)
class Requeued:
    """The attempt ended and the task is queued again as a new RQ job."""


@dataclass(frozen=True)
class Superseded:
    """The attempt is no longer the task's current one: a newer attempt took over, or the task ended."""


@dataclass(frozen=True)
class Cancelled:
    """The task was cancelled (``lua/cancel.lua``): the attempt's result is dropped."""


@dataclass(frozen=True)
class StillAlive:
    """A reaper's transition lost the race: the attempt heartbeated after the reaper judged it stale."""


@dataclass(frozen=True)
class JobTaken:
    """Nothing was written: the new job id holds a job hash that stands for something else."""


FinishReply = Published | Superseded | StillAlive | Cancelled
RequeueReply = Requeued | Superseded | StillAlive | JobTaken

_SUPERSEDED, _STILL_ALIVE, _REQUEUED = Superseded(), StillAlive(), Requeued()
_WORDS: dict[bytes, Superseded | StillAlive | Requeued | JobTaken | Cancelled] = {
    b"superseded": _SUPERSEDED,
    b"cancelled": Cancelled(),
    b"alive": _STILL_ALIVE,
    b"requeued": _REQUEUED,
    b"conflict": JobTaken(),
}


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


DEFAULT_RESULTS_MAX_BYTES = 1024**3
"""The results stream's hard byte limit (payload bytes); routine trimming keeps it under half of this."""

# Libraries of Lua functions put before a script (after the header).
_LIBRARIES = {"finish": ("trim_results",), "reject": ("trim_results",), "cancel": ("trim_results",)}


def _file(name: str) -> str:
    return package_files.files("rollq.store").joinpath("lua", f"{name}.lua").read_text()


@functools.cache
def script_source(name: str) -> str:
    """The source of ``store/lua/<name>.lua`` as Redis receives it."""
    # Every script starts with the generated names of fields and formats (see keys.lua_header).
    return lua_header() + "".join(_file(lib) + "\n" for lib in _LIBRARIES.get(name, ())) + _file(name)


def _load(connection: redis.Redis, name: str) -> Script:
    return connection.register_script(script_source(name))


@dataclass(frozen=True)
class ScriptCall:
    """One transition's script, keys and arguments: run alone, or queued in a pipeline with others.

    A worker sends the claims (or publications) of many rollouts, with RQ's
    bookkeeping for their jobs, as one pipeline: one round trip where each used
    to cost two to four (measured: 8.5 -> 2.0 per rollout at concurrency 16,
    fewer under load; see bench/noop.py). The pipeline sends ``EVALSHA`` without
    redis-py's per-pipeline ``SCRIPT EXISTS`` check (a round trip of its own);
    a Redis that has forgotten the script (restarted, failed over) answers
    ``NOSCRIPT`` and :meth:`Lifecycle.settle_all` runs that call again on its own, which loads it.
    """

    script: Script
    keys: list[str]
    args: list[Any]

    def run(self) -> Any:
        return self.script(keys=self.keys, args=self.args)

    def queue(self, pipe: Pipeline) -> None:
        pipe.evalsha(self.script.sha, len(self.keys), *self.keys, *self.args)


def replied(reply: Any) -> Any:
    """A reply from :meth:`Lifecycle.settle_all`: the reply itself, or the error it stands for raised."""
    if isinstance(reply, BaseException):
        raise reply
    return reply


class Lifecycle:
    """The transitions for one namespace, over one connection.

    ``results_max_bytes`` is the results stream's hard byte limit (see :meth:`finish`). ``wait_replicas`` > 0
    makes enqueue, claim, finish and requeue wait (``WAIT``) until that many replicas hold the write, for at
    most ``wait_timeout_ms``; a shortfall is logged and counted in ``replication_shortfalls``, never raised:
    the transition is already applied on the primary, so raising would only report a success as a failure.
    """

    def __init__(
        self,
        connection: redis.Redis,
        keys: Keys,
        *,
        results_max_bytes: int = DEFAULT_RESULTS_MAX_BYTES,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
    ) -> None:
        if wait_replicas < 0 or wait_timeout_ms < 1:
            # WAIT's timeout 0 means "block forever": a dead replica would stop every transition.
            raise ValueError(
                f"wait_replicas must be >= 0 and wait_timeout_ms >= 1, got {wait_replicas}, {wait_timeout_ms}"
            )
        self.connection = connection
        self.keys = keys
        self.results_max_bytes = results_max_bytes
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.replication_shortfalls = 0
        self._shortfall_lock = threading.Lock()
        self._shortfall_logged: float | None = None
        self._enqueue = _load(connection, "enqueue")
        self._claim = _load(connection, "claim")
        self._finish = _load(connection, "finish")
        self._requeue = _load(connection, "requeue")
        self._revive = _load(connection, "revive")
        self._restore = _load(connection, "restore")
        self._reject = _load(connection, "reject")
        self._beat = _load(connection, "beat")
        self._quarantine = _load(connection, "quarantine")
        self._reissue = _load(connection, "reissue")

    def _replicated(self) -> None:
        """Wait until ``wait_replicas`` replicas hold every write this process made so far (no-op when 0).

        ``WAIT`` only covers writes made on the connection it is sent on, and the pool may hand out another
        one: measured with the replica frozen, a bare ``WAIT 1`` on a second connection answered 1 at once
        for a write it never saw. So the WAIT follows a PUBLISH on the same connection, in one round trip;
        the replication stream is ordered, so a replica that acknowledged the PUBLISH holds every earlier
        write, the transition's included.
        """
        if not self.wait_replicas:
            return
        pipe = self.connection.pipeline(transaction=False)
        pipe.publish(self.keys.replication_mark, b"")
        pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
        self._count_acknowledged(pipe.execute()[-1])

    def queue_wait(self, pipe: Pipeline) -> bool:
        """End a pipeline of transitions with one ``WAIT`` for all of them (on the connection that wrote them,
        so no PUBLISH is needed); False, and nothing queued, when ``wait_replicas`` is 0. Pass the pipeline's
        last reply to :meth:`settle_all` as ``acknowledged``."""
        if not self.wait_replicas:
            return False
        pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
        return True

    def run_pipelined(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Send ``calls`` in one pipeline (ended by a ``WAIT`` when ``wait_replicas`` is set); each item of the
        result is a reply or the exception its call got (see :meth:`settle_all`)."""
        if not calls:
            return []
        pipe = self.connection.pipeline(transaction=False)
        for call in calls:
            call.queue(pipe)
        waits = self.queue_wait(pipe)
        replies = pipe.execute(raise_on_error=False)
        return self.settle_all(calls, replies[: len(calls)], acknowledged=replies[-1] if waits else None)

    def settle_all(self, calls: Sequence[ScriptCall], replies: Sequence[Any], *, acknowledged: Any = None) -> list[Any]:
        """The replies of ``calls`` sent in a pipeline (``execute(raise_on_error=False)``), each a reply or the
        exception its call got; a call Redis answered ``NOSCRIPT``, or refused for now (OOM, READONLY, BUSY: it
        did not run), is run again on its own, which loads the script or waits until Redis accepts it, then
        waited for like :meth:`claim` waits. ``acknowledged``: the reply of the pipeline's
        ``WAIT`` (see :meth:`queue_wait`)."""
        if acknowledged is not None:
            self._count_acknowledged(acknowledged)
        settled: list[Any] = []
        rerun = False
        for call, reply in zip(calls, replies, strict=True):
            if isinstance(reply, NoScriptError) or (
                isinstance(reply, redis.ResponseError) and transient_refusal(reply) is not None
            ):
                # Not run: the script is loaded (NOSCRIPT) or Redis accepts it again (OOM, READONLY, BUSY...;
                # the connection's retry backs off until it does) when it is sent on its own.
                rerun = True
                try:
                    reply = call.run()
                except Exception as exc:
                    reply = exc
            settled.append(reply)
        if rerun:
            self._replicated()
        return settled

    def _count_acknowledged(self, acknowledged: Any) -> None:
        if isinstance(acknowledged, Exception) or int(acknowledged) >= self.wait_replicas:
            if isinstance(acknowledged, Exception):
                log.warning("WAIT for replicas failed: %s", acknowledged)
            return
        with self._shortfall_lock:
            self.replication_shortfalls += 1
            now = time.monotonic()
            if self._shortfall_logged is not None and now - self._shortfall_logged < _SHORTFALL_LOG_SECONDS:
                return
            self._shortfall_logged = now
            count = self.replication_shortfalls
        log.warning(
            "only %d of %d replica(s) acknowledged a transition within %d ms (%d such transitions so far): "
            "it is applied on the primary but a failover now could undo it",
            int(acknowledged),
            self.wait_replicas,
            self.wait_timeout_ms,
            count,
        )

    def _template(self, policy: RolloutPolicy) -> JobTemplate:
        return JobTemplate(self.connection, queue_name=self.keys.queue_name, timeout_seconds=policy.timeout_seconds)

    @staticmethod
    def _description(task: Task) -> str:
        return f"rollout {task.rollout_id} ({task.mode or 'no mode'})"

    def enqueue_many(self, tasks: Sequence[tuple[Task, str]], policy: RolloutPolicy) -> list[Enqueued]:
        """Queue each ``(task, task_json)`` unless its rollout id is known, in one transaction (all or none).

        Tasks that share a mode and a resources pin go in Lua calls of up to
        100, the job template sent once per call. Returns what happened to each task.
        """
        k = self.keys
        template = self._template(policy)
        shared = [policy.model_dump_json(), policy.unresponsive_seconds]
        # One MULTI/EXEC: Redis decides "out of memory" once for the whole EXEC, so a full Redis refuses all of
        # the chunk's calls or none (a plain pipeline queued the calls sent before memory ran out).
        pipe = self.connection.pipeline(transaction=True)
        sizes = []
        for (mode, pinned), group in itertools.groupby(tasks, key=lambda t: (t[0].mode or "", t[0].resources_id or "")):
            items = list(group)
            for start in range(0, len(items), _ENQUEUE_BATCH):
                batch = items[start : start + _ENQUEUE_BATCH]
                keys = [k.rq_queue, k.rq_queues(), k.resources_refs, k.resources(pinned) if pinned else k.rq_queue]
                args = [*shared, pinned, mode, len(template.shared), *template.shared]
                for task, task_json in batch:
                    jid = job_id(task.rollout_id)
                    keys += [k.task(task.rollout_id), k.rq_job(jid)]
                    args += [task_json, jid, template.payload(task.rollout_id), self._description(task)]
                self._enqueue(keys=keys, args=args, client=pipe)
                sizes.append(len(batch))
        replies = pipe.execute()
        self._replicated()
        outcomes: list[Enqueued] = []
        for size, reply in zip(sizes, replies, strict=True):
            words = reply if isinstance(reply, list) else [reply] * size
            outcomes += [Enqueued(word.decode()) for word in words]
        return outcomes

    def claim(self, rollout_id: str, job_id: str, worker_name: str) -> Claim | ClaimRefused:
        """Start an attempt: count the claim and stamp its time (Redis's), atomically."""
        reply = self.claim_call(rollout_id, job_id, worker_name).run()
        self._replicated()
        return self.read_claim(reply)

    def claim_call(self, rollout_id: str, job_id: str, worker_name: str) -> ScriptCall:
        """:meth:`claim` as a call to queue in a pipeline; :meth:`read_claim` reads its settled reply."""
        k = self.keys
        return ScriptCall(
            self._claim, [k.task(rollout_id), k.inflight, k.resources_latest], [rollout_id, job_id, worker_name]
        )

    @staticmethod
    def read_claim(reply: Any) -> Claim | ClaimRefused:
        if reply[0] != b"claimed":
            return ClaimRefused(reply[0].decode(), reply[1].decode() if len(reply) > 1 else "")  # type: ignore[arg-type]
        _, attempt, task_json, policy_json, latest, used, claimed_at, generation = reply
        return Claim(
            int(attempt), task_json, policy_json, latest.decode() or None, int(used), float(claimed_at), int(generation)
        )

    def reject(
        self, rollout_id: str, job_id: str, rollout_json: str, *, results_maxlen: int, now: float
    ) -> FinishReply:
        """Fail a queued task whose record cannot be run, publishing ``rollout_json``; only ``job_id`` (the job
        that stands for the task) may. :class:`Superseded` when the task no longer waits for that job."""
        k = self.keys
        reply = self._reject(
            keys=[k.task(rollout_id), k.results, k.dead_letter, k.stats, k.resources_refs, k.results_trim],
            args=[rollout_id, job_id, rollout_json, results_maxlen, now, self.results_max_bytes],
        )
        return Published(reply[1].decode()) if reply[0] == b"published" else _SUPERSEDED

    def finish(
        self,
        rollout_id: str,
        attempt: int,
        rollout_json: str,
        status: str,
        *,
        results_maxlen: int,
        dead_letter: bool,
        now: float,
        duration: float | None = None,
        keep_seconds: int = 0,
        stale_before: float | None = None,
        reward: float | None = None,
        resources_id: str | None = None,
    ) -> FinishReply:
        """Publish the final rollout if ``attempt`` is still current, and keep the results stream in its bounds.

        ``results_maxlen`` entries and half of ``results_max_bytes`` are the routine
        bounds, which never trim an entry a consumer group still needs;
        ``results_max_bytes`` (of the lifecycle) is the hard limit (see ``lua/trim_results.lua``).

        :class:`Superseded` when it is not (the rollout is kept on the superseded
        stream instead); :class:`StillAlive` when ``stale_before`` is given and the
        attempt heartbeated after it; :class:`Cancelled` when the task was cancelled
        (the rollout is dropped).
        """
        reply = self.finish_call(
            rollout_id,
            attempt,
            rollout_json,
            status,
            results_maxlen=results_maxlen,
            dead_letter=dead_letter,
            now=now,
            duration=duration,
            keep_seconds=keep_seconds,
            stale_before=stale_before,
            reward=reward,
            resources_id=resources_id,
        ).run()
        self._replicated()
        return self.read_finish(reply)

    def finish_call(
        self,
        rollout_id: str,
        attempt: int,
        rollout_json: str,
        status: str,
        *,
        results_maxlen: int,
        dead_letter: bool,
        now: float,
        duration: float | None = None,
        keep_seconds: int = 0,
        stale_before: float | None = None,
        reward: float | None = None,
        resources_id: str | None = None,
    ) -> ScriptCall:
        """:meth:`finish` as a call to queue in a pipeline; :meth:`read_finish` reads its settled reply."""
        k = self.keys
        return ScriptCall(
            self._finish,
            [
                k.task(rollout_id),
                k.inflight,
                k.results,
                k.superseded,
                k.dead_letter,
                k.resources_refs,
                k.stats,
                k.results_trim,
            ],
            args=[
                rollout_id,
                attempt,
                rollout_json,
                status,
                results_maxlen,
                now,
                int(dead_letter),
                "" if stale_before is None else stale_before,
                "" if duration is None else duration_bucket(duration),
                keep_seconds,
                duration or 0,
                self.results_max_bytes,
                "" if reward is None else reward_bucket(reward),
                reward or 0,
                resources_id or "",
            ],
        )

    @staticmethod
    def read_finish(reply: Any) -> FinishReply:
        if reply[0] == b"published":
            return Published(reply[1].decode())
        return _WORDS[reply[0]]  # type: ignore[return-value]

    def requeue(
        self,
        task: Task,
        attempt: int,
        policy: RolloutPolicy,
        reason: RequeueReason,
        *,
        stale_before: float | None = None,
    ) -> RequeueReply:
        """End ``attempt`` without an outcome and queue the task again as a new RQ job.

        A hand-back (``released``) goes to the front of the queue and gives the
        attempt back. :class:`Superseded` when the attempt is not current,
        :class:`StillAlive` when it heartbeated after ``stale_before``.
        """
        k = self.keys
        jid = job_id(task.rollout_id, after_attempt=attempt)
        reply = self._requeue(
            keys=[k.task(task.rollout_id), k.inflight, k.rq_queue, k.rq_queues(), k.rq_job(jid), k.stats],
            args=[
                task.rollout_id,
                attempt,
                jid,
                reason,
                "" if stale_before is None else stale_before,
                int(reason == "released"),
                *self._template(policy).fields(task.rollout_id, self._description(task)),
            ],
        )
        self._replicated()
        return _WORDS[reply]  # type: ignore[return-value]

    def revive(self, task: Task, policy: RolloutPolicy, claims: int) -> bool:
        """Requeue a dead-lettered task with a fresh attempt budget; False if it was not dead-lettered.

        :class:`JobIdTakenError` when the new job id holds another job's hash (nothing is written)."""
        k = self.keys
        jid = job_id(task.rollout_id, after_attempt=claims)
        reply = self._revive(
            keys=[k.task(task.rollout_id), k.dead_letter, k.rq_queue, k.rq_queues(), k.rq_job(jid), k.resources_refs],
            args=[task.rollout_id, jid, *self._template(policy).fields(task.rollout_id, self._description(task))],
        )
        if reply == -1:
            raise JobIdTakenError(jid, task.rollout_id)
        return bool(reply)

    def restore(self, rollout_id: str, job_id: str, now: float) -> bool:
        """Push ``job_id`` back on the queue if it has been stranded in RQ's intermediate list for
        ``unresponsive_seconds`` while its task waits for it (see ``lua/restore.lua``); True if it was.
        A leftover whose task no longer waits for it is dropped from the list after 30 s."""
        k = self.keys
        reply = self._restore(
            keys=[k.task(rollout_id), k.rq_intermediate, k.rq_queue, k.stranded(job_id), k.stats], args=[job_id, now]
        )
        return reply == 1

    def beat(self, unresponsive: dict[str, float] | None = None, *, within: float = 0) -> Clock:
        """Heartbeat running attempts (``rollout_id|attempt`` -> unresponsive_seconds) and keep the clock.

        Each deadline is Redis's time on arrival plus the attempt's unresponsive_seconds (see ``lua/beat.lua``);
        ``within`` promises the caller's next call within that many seconds (0: no promise). An attempt that
        finished or was taken over meanwhile is never re-added.
        """
        k = self.keys
        args: list[str | float] = [within]
        for member, seconds in (unresponsive or {}).items():
            args += [member, seconds]
        now, grace_until = self._beat(keys=[k.inflight, k.clock], args=args)
        return Clock(float(now), float(grace_until) if grace_until else None)

    def heartbeat(self, unresponsive: dict[str, float], *, within: float = 0) -> Clock:
        """:meth:`beat` for running attempts."""
        return self.beat(unresponsive, within=within)

    def quarantine(self, source: str, job_id: str) -> bool:
        """Move ``job_id`` from RQ list ``source`` of this namespace to the quarantine list; True if it moved."""
        return bool(self._quarantine(keys=[source, self.keys.quarantine], args=[job_id]))

    def reissue(
        self, task: Task, policy: RolloutPolicy, old_job_id: str, claims: int, now: float, *, deep: bool
    ) -> int:
        """Queue ``task`` again as a new RQ job if its job ``old_job_id`` vanished (see ``lua/reissue.lua``);
        ``deep`` also looks for the job on RQ's lists (linear in their length).

        1 queued again, 0 not (or not yet), -1 the new job id is taken by another job.
        """
        k = self.keys
        jid = job_id(task.rollout_id, after_attempt=claims, reissue=True)
        reply = self._reissue(
            keys=[
                k.task(task.rollout_id),
                k.rq_queue,
                k.rq_intermediate,
                k.rq_queues(),
                k.rq_job(old_job_id),
                k.rq_job(jid),
                k.orphaned(old_job_id),
                k.stats,
            ],
            args=[
                task.rollout_id,
                old_job_id,
                jid,
                now,
                int(deep),
                *self._template(policy).fields(task.rollout_id, self._description(task)),
            ],
        )
        return int(reply)
