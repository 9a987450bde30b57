"""A task's life as atomic Redis transitions: enqueue, claim, finish, requeue, revive, restore, reject, reissue, split.

Each transition is one Lua script (``store/lua``, sent by :mod:`rollq.store.scripts`), so producers, workers and
reapers on any number of machines can race and exactly one of them wins. A task moves
``queued -> running -> succeeded | failed``; ``requeue`` sends a running attempt back to ``queued`` as a new RQ
job, ``revive`` does the same for a task in the dead-letter set. Each script's reply comes back as a small type
(:mod:`rollq.store.replies`), never as a bare code.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import redis
from redis.client import Pipeline
from redis.exceptions import NoScriptError

from rollq.models.contract import Task
from rollq.models.errors import JobIdTakenError
from rollq.models.policy import RolloutPolicy, RolloutStatus

from .connection import transient_refusal
from .jobs import MAX_PACK, JobTemplate
from .keys import Keys, pack_job_id
from .payloads import UNPUBLISHED_SECONDS, goes_to_payload, payload_token
from .records import read_records_or_errors
from .replication import ReplicaWait
from .replies import (
    Claim,
    ClaimRefused,
    Clock,
    Enqueued,
    FinishReply,
    RequeueReply,
    read_claim,
    read_clock,
    read_enqueue,
    read_finish,
    read_requeue,
    without_damaged,
)
from .scripts import ScriptCall, load_script, replied, rerun_unloaded, script_replies
from .stats import duration_bucket, reward_bucket
from .summaries import minimal_summary_json

RequeueReason = Literal["retry", "unresponsive", "released"]

# Tasks per enqueue Lua call: big enough to share the per-call cost, small enough
# that one call never holds Redis for long.
_ENQUEUE_BATCH = 100

DEFAULT_RESULTS_MAX_BYTES = 1024**3
"""The results stream's hard byte limit (payload bytes); routine trimming keeps it under half of this."""


@dataclass(frozen=True)
class Reissue:
    """One queued task the lost-job sweep checks (:meth:`Lifecycle.reissue_many`): queue it again if its RQ job
    ``old_job_id`` vanished; ``deep`` also looks for the job on RQ's lists."""

    task: Task
    policy: RolloutPolicy
    old_job_id: str
    claims: int
    now: float
    deep: bool


@dataclass(frozen=True, kw_only=True)
class Finish:
    """An attempt's final rollout and how to publish it: what :meth:`Lifecycle.finish` (and ``finish_call``) send
    to ``lua/finish.lua``.

    ``results_maxlen`` bounds the results stream (see :meth:`Lifecycle.finish`); ``dead_letter`` puts the task in
    the dead-letter set; ``now`` is the end time recorded. ``duration`` and ``reward`` go into the stats hash's
    histograms (None: not counted), ``resources_id`` (the version the rollout ran with) labels the reward's.
    ``keep_seconds`` > 0 lets a succeeded task's record expire that long after. ``stale_before`` is a reaper's:
    the finish loses (:class:`~rollq.store.replies.StillAlive`) if the attempt heartbeated after it.
    ``reward_missing`` counts the rollout in the stats hash's ``reward-missing`` (a success with no reward).
    """

    rollout_id: str
    attempt: int
    rollout_json: bytes | str
    """The rollout as :func:`rollq.models.wire.rollout_json` writes it."""
    status: RolloutStatus
    results_maxlen: int
    dead_letter: bool
    now: float
    duration: float | None = None
    keep_seconds: int = 0
    stale_before: float | None = None
    reward: float | None = None
    resources_id: str | None = None
    reward_missing: bool = False
    summary: str = ""
    """The rollout's summary for the summaries stream (:func:`rollq.store.summaries.summary_json`); empty: a
    minimal one from the fields above."""
    payload_token: str = field(default_factory=payload_token, compare=False)
    """Names the payload key of a rollout too big to pass to the script (:mod:`rollq.store.payloads`): one per
    Finish, so that a finish sent again (a reply lost to a dropped connection) is known for the same one."""


class Lifecycle:
    """The transitions for one namespace, over one connection.

    ``results_max_bytes`` is the results stream's hard byte limit (see :meth:`finish`). ``wait_replicas`` > 0
    makes enqueue, claim, finish and requeue wait (``WAIT``) until that many replicas hold the write, for at
    most ``wait_timeout_ms``; a shortfall is logged and counted in ``replication_shortfalls``, never raised
    (see :mod:`rollq.store.replication`).
    """

    def __init__(
        self,
        connection: redis.Redis,
        keys: Keys,
        *,
        results_max_bytes: int = DEFAULT_RESULTS_MAX_BYTES,
        wait_replicas: int | None = None,
        wait_timeout_ms: int = 1000,
    ) -> None:
        self.replication = ReplicaWait(
            connection, keys.replication_mark, wait_replicas, wait_timeout_ms, degraded_key=keys.replication_degraded
        )
        self.connection = connection
        self.keys = keys
        self.results_max_bytes = results_max_bytes
        self._enqueue = load_script(connection, "enqueue")
        self._claim = load_script(connection, "claim")
        self._finish = load_script(connection, "finish")
        self._requeue = load_script(connection, "requeue")
        self._revive = load_script(connection, "revive")
        self._restore = load_script(connection, "restore")
        self._reject = load_script(connection, "reject")
        self._beat = load_script(connection, "beat")
        self._quarantine = load_script(connection, "quarantine")
        self._reissue = load_script(connection, "reissue")
        self._split = load_script(connection, "split")
        self._unindex = load_script(connection, "unindex")

    @property
    def replication_shortfalls(self) -> int:
        """Transitions that fewer than ``wait_replicas`` replicas acknowledged in time."""
        return self.replication.shortfalls

    @property
    def wait_replicas(self) -> int:
        """Replicas each waited transition waits for (0: none); see :mod:`rollq.store.replication`."""
        return self.replication.replicas

    def queue_wait(self, pipe: Pipeline) -> bool:
        """End a pipeline of transitions with ``PUBLISH`` + ``WAIT`` for all of them, on the connection that
        wrote them; False, and nothing queued, when this process does not wait (``wait_replicas`` 0, or
        degraded). Pass the pipeline's last reply to :meth:`settle_all` as ``acknowledged``."""
        return self.replication.queue(pipe)

    def run_pipelined(self, calls: Sequence[ScriptCall], *, atomic: bool = False) -> list[Any]:
        """Send ``calls`` in one pipeline (ended by ``PUBLISH`` + ``WAIT`` when waiting, see
        :mod:`rollq.store.replication`); each item of the result is a reply or the exception its call got (see
        :meth:`settle_all`).

        ``atomic``: the calls in one ``MULTI``/``EXEC``, all or none. Redis decides "out of memory" once for a
        whole ``EXEC``, so a full Redis refuses every call or none (a plain pipeline ran the calls sent before
        memory ran out); a refusal is raised, never re-sent call by call."""
        return self._run(calls, atomic=atomic)[0]

    def _run(
        self, calls: Sequence[ScriptCall], *, atomic: bool = False, head: list[Any] | None = None
    ) -> tuple[list[Any], bool]:
        """:meth:`run_pipelined`, and whether the pipeline's own ``WAIT`` confirmed every call (False when nothing
        waited, the wait fell short, or a call had to be sent again). ``head``: the results stream's newest entry,
        read in the same pipeline before the calls, is appended to it (see :meth:`enqueue_many_after`)."""
        if not calls:
            return [], True
        replies, acknowledged = self._send(calls, atomic=atomic, head=head)
        if atomic:
            refused = next((r for r in replies if isinstance(r, redis.ResponseError) and transient_refusal(r)), None)
            if refused is not None:
                raise refused
        confirmed = acknowledged is not None and self.replication.count(acknowledged)
        confirmed = confirmed and not any(isinstance(r, Exception) for r in replies)
        return self.settle_all(calls, replies), confirmed

    def _send(
        self, calls: Sequence[ScriptCall], *, atomic: bool = False, head: list[Any] | None = None
    ) -> tuple[list[Any], Any]:
        """``calls`` and the wait behind them in one pipeline: (their replies, the ``WAIT`` reply or None)."""
        pipe = self.connection.pipeline(transaction=False)
        if head is not None:
            pipe.xrevrange(self.keys.results, count=1)
        if atomic:
            pipe.execute_command("MULTI")
        for call in calls:
            call.queue(pipe)
        if atomic:
            pipe.execute_command("EXEC")
        waits = self.queue_wait(pipe)
        replies = pipe.execute(raise_on_error=False)
        if head is not None:
            newest = replies.pop(0)
            head.append(newest[0][0] if isinstance(newest, list) and newest else b"0-0")
        if not atomic:
            return script_replies(calls, replies), replies[-1] if waits else None
        queued = len(calls) + sum(len(call.before) for call in calls)
        executed = replies[queued + 1]  # after MULTI's OK and each command's QUEUED
        if isinstance(executed, Exception):
            # EXECABORT: a call was refused while queued (out of memory, say) and none ran; that refusal says why.
            executed = next((r for r in replies[1 : queued + 1] if isinstance(r, Exception)), executed)
        answered = script_replies(calls, executed) if isinstance(executed, list) else [executed] * len(calls)
        return answered, replies[-1] if waits else None

    def settle_all(self, calls: Sequence[ScriptCall], replies: Sequence[Any], *, acknowledged: Any = None) -> list[Any]:
        """The replies of ``calls`` sent in a pipeline (``execute(raise_on_error=False)``), each a reply or the
        exception its call got. Calls Redis answered ``NOSCRIPT`` (a restarted or promoted server), or refused for
        now (OOM, READONLY, BUSY: they did not run), are sent again, once their scripts are loaded, in a pipeline of
        their own with its own ``WAIT`` (a ``WAIT`` only confirms what its own pipeline wrote); one still refused
        then runs alone, its connection's retry waiting until Redis accepts it. ``acknowledged``: the reply of the
        pipeline's ``WAIT`` (see :meth:`queue_wait`)."""
        if acknowledged is not None:
            self.replication.count(acknowledged)
        unloaded = [
            i
            for i, reply in enumerate(replies)
            if isinstance(reply, NoScriptError)
            or (isinstance(reply, redis.ResponseError) and transient_refusal(reply) is not None)
        ]
        settled = list(replies)
        if not unloaded:
            return settled
        again = [calls[i] for i in unloaded]
        try:
            for source in {call.script.script for call in again}:
                self.connection.script_load(source)
            rerun, acknowledged = self._send(again)
            if acknowledged is not None:
                self.replication.count(acknowledged)
            # Forgotten again (another failover in between): each runs alone, unconfirmed, as without WAIT.
            rerun, _ = rerun_unloaded(again, rerun)
        except Exception as exc:
            rerun = [exc] * len(again)
        for i, reply in zip(unloaded, rerun, strict=True):
            settled[i] = reply
        return settled

    def _template(self, policy: RolloutPolicy) -> JobTemplate:
        return JobTemplate(self.connection, queue_name=self.keys.queue_name, timeout_seconds=policy.timeout_seconds)

    @staticmethod
    def _description(task: Task) -> str:
        return f"rollout {task.rollout_id} ({task.mode or 'no mode'})"

    @staticmethod
    def _pack_description(tasks: Sequence[Task]) -> str:
        if len(tasks) == 1:
            return f"pack of 1: rollout {tasks[0].rollout_id} ({tasks[0].mode or 'no mode'})"
        return (
            f"pack of {len(tasks)}: rollouts {tasks[0].rollout_id} .. {tasks[-1].rollout_id} "
            f"({tasks[0].mode or 'no mode'})"
        )

    def enqueue_many(
        self, tasks: Sequence[tuple[Task, str]], policy: RolloutPolicy, *, tasks_per_job: int = 1
    ) -> list[Enqueued]:
        """Queue each ``(task, task_json)`` unless its rollout id is known, in one transaction (all or none).

        Tasks that share a mode and a resources pin go in Lua calls of up to
        100, the job template sent once per call. Returns what happened to each task.

        ``tasks_per_job=K`` > 1 queues them in packs: each run of up to K consecutive tasks that share a mode and a
        resources pin is one RQ job (:func:`~rollq.store.keys.pack_job_id`) whose payload lists their rollout
        ids, and each task's record names it as its job. A pack never spans two script calls, so its job is
        written and pushed once (docs/rq.md, "Packs").
        """
        return self._enqueue_many(tasks, policy, None, tasks_per_job)[0]

    def enqueue_many_after(
        self, tasks: Sequence[tuple[Task, str]], policy: RolloutPolicy, *, tasks_per_job: int = 1
    ) -> tuple[list[Enqueued], bytes | None]:
        """:meth:`enqueue_many`, and the results stream's newest entry id read in the same pipeline before the
        tasks were queued (``b"0-0"`` for an empty stream; None when it could not be read): every rollout of a
        task queued here is published after it, so a reader that reads the stream from there needs no look at
        the tasks' records (``rollq.producer.results``; issue 24)."""
        return self._enqueue_many(tasks, policy, [], tasks_per_job)

    def _enqueue_many(
        self, tasks: Sequence[tuple[Task, str]], policy: RolloutPolicy, head: list[Any] | None, tasks_per_job: int
    ) -> tuple[list[Enqueued], bytes | None]:
        if not 1 <= tasks_per_job <= MAX_PACK:
            raise ValueError(f"tasks_per_job must be between 1 and {MAX_PACK}, got {tasks_per_job}")
        k = self.keys
        template = self._template(policy)
        shared = [policy.model_dump_json(), policy.unresponsive_seconds]
        calls: list[ScriptCall] = []
        sizes = []
        # Whole packs per script call: a pack split over two calls would be pushed twice.
        per_call = max(tasks_per_job, _ENQUEUE_BATCH - _ENQUEUE_BATCH % tasks_per_job)
        for (mode, pinned), group in itertools.groupby(tasks, key=lambda t: (t[0].mode or "", t[0].resources_id or "")):
            items = list(group)
            for start in range(0, len(items), per_call):
                batch = items[start : start + per_call]
                keys = [k.rq_queue, k.rq_queues(), k.resources_refs, k.resources(pinned) if pinned else k.rq_queue]
                keys.append(k.queued_tasks)
                args = [*shared, pinned, mode, len(template.shared), *template.shared]
                if tasks_per_job == 1:
                    for task, task_json in batch:
                        jid = k.job_id(task.rollout_id)
                        keys += [k.task(task.rollout_id), k.rq_job(jid)]
                        args += [task_json, jid, template.payload(task.rollout_id), self._description(task)]
                else:
                    for at in range(0, len(batch), tasks_per_job):
                        pack = batch[at : at + tasks_per_job]
                        jid = k.job_prefix + pack_job_id()
                        # A rollout id given twice is listed once (its second entry is answered 'known').
                        distinct = list({task.rollout_id: task for task, _ in pack}.values())
                        payload = template.payload([task.rollout_id for task in distinct])
                        description = self._pack_description(distinct)
                        for task, task_json in pack:
                            keys += [k.task(task.rollout_id), k.rq_job(jid)]
                            args += [task_json, jid, payload, description]
                calls.append(ScriptCall(self._enqueue, keys, args))
                sizes.append(len(batch))
        settled, confirmed = self._run(calls, atomic=True, head=head)
        replies = [replied(reply) for reply in settled]
        outcomes = [got for size, reply in zip(sizes, replies, strict=True) for got in read_enqueue(reply, size)]
        # The caller is told these are queued: a replica must hold them first, even one that lags (see
        # rollq.store.replication).
        queued = [k.task(t.rollout_id) for (t, _), got in zip(tasks, outcomes, strict=True) if got is Enqueued.QUEUED]
        self.replication.hold(queued, confirmed=confirmed)
        newest = head[0] if head and isinstance(head[0], bytes) else None
        return outcomes, newest

    def claim(self, rollout_id: str, job_id: str, worker_name: str) -> Claim | ClaimRefused:
        """Start an attempt: count the claim and stamp its time (Redis's), atomically."""
        return self.read_claim(replied(self.run_pipelined([self.claim_call(rollout_id, job_id, worker_name)])[0]))

    def claim_call(self, rollout_id: str, job_id: str, worker_name: str) -> ScriptCall:
        """:meth:`claim` as a call to queue in a pipeline; :meth:`read_claim` reads its settled reply."""
        return self.claim_many_call([(rollout_id, job_id)], worker_name)

    def claim_many_call(self, claims: Sequence[tuple[str, str]], worker_name: str) -> ScriptCall:
        """:meth:`claim` of each ``(rollout_id, job_id)`` of ``claims`` in one script call (one ``EVALSHA``, one
        ``TIME`` and one read of the latest resources version for the batch: issue 24); :meth:`read_claims`
        reads its settled reply."""
        k = self.keys
        keys = [k.inflight, k.resources_latest, k.queued_tasks]
        args = [worker_name]
        for rollout_id, job_id in claims:
            keys.append(k.task(rollout_id))
            args += [rollout_id, job_id]
        return ScriptCall(self._claim, keys, args)

    @staticmethod
    def read_claim(reply: Any) -> Claim | ClaimRefused:
        """The settled reply of a :meth:`claim_call` (of one claim)."""
        (only,) = Lifecycle.read_claims(reply)
        return replied(only)  # type: ignore[no-any-return]

    @staticmethod
    def read_claims(reply: Any) -> list[Claim | ClaimRefused | Exception]:
        """The settled reply of a :meth:`claim_many_call`: each claim's reply, or the error its part got."""
        return [r if isinstance(r, Exception) else read_claim(r) for r in reply]

    def reject(
        self,
        rollout_id: str,
        job_id: str,
        rollout_json: bytes | str,
        *,
        results_maxlen: int,
        now: float,
        summary: str = "",
    ) -> FinishReply:
        """Fail a queued task whose record cannot be run, publishing ``rollout_json``; only ``job_id`` (the job
        that stands for the task) may. :class:`~rollq.store.replies.Superseded` when the task no longer waits for
        that job. ``summary`` is its summary (:func:`rollq.store.summaries.summary_json`); a minimal one if empty."""
        k = self.keys
        reply = self._reject(
            keys=[
                k.task(rollout_id),
                k.results,
                k.dead_letter,
                k.stats,
                k.resources_refs,
                k.results_trim,
                k.summaries,
                k.queued_tasks,
            ],
            args=[
                rollout_id,
                job_id,
                rollout_json,
                results_maxlen,
                now,
                self.results_max_bytes,
                summary
                or minimal_summary_json(
                    status=RolloutStatus.FAILED, attempt=0, reward=None, resources_id=None, duration=None
                ),
            ],
        )
        return read_finish(reply)

    def finish(self, finish: Finish) -> FinishReply:
        """Publish the final rollout if its attempt is still current, and keep the results stream in its bounds.

        ``finish.results_maxlen`` entries and half of ``results_max_bytes`` are the routine bounds, which never
        trim an entry a consumer group still needs; ``results_max_bytes`` (of the lifecycle) is the hard limit
        (see ``lua/trim_results.lua``).

        :class:`~rollq.store.replies.Superseded` when the attempt is not current (the rollout is kept on the
        superseded stream instead); :class:`~rollq.store.replies.StillAlive` when ``finish.stale_before`` is
        given and the attempt heartbeated after it; :class:`~rollq.store.replies.Cancelled` when the task was
        cancelled (the rollout is dropped).
        """
        return self.read_finish(replied(self.run_pipelined([self.finish_call(finish)])[0]))

    def finish_call(self, finish: Finish) -> ScriptCall:
        """:meth:`finish` as a call to queue in a pipeline; :meth:`read_finish` reads its settled reply."""
        return self.finish_many_call([finish])

    def finish_many_call(self, finishes: Sequence[Finish]) -> ScriptCall:
        """:meth:`finish` of each of ``finishes`` in one script call (one ``EVALSHA``, the results stream's
        trim and each stats counter once for the batch: issue 24); :meth:`read_finishes` reads its settled
        reply. The results stream is bounded by the smallest ``results_maxlen`` of the batch."""
        k = self.keys
        keys = [
            k.inflight,
            k.results,
            k.superseded,
            k.dead_letter,
            k.resources_refs,
            k.stats,
            k.results_trim,
            k.summaries,
        ]
        args: list[Any] = [min(f.results_maxlen for f in finishes), self.results_max_bytes]
        before: list[tuple[Any, ...]] = []
        for f in finishes:
            keys.append(k.task(f.rollout_id))
            ref = ""
            if goes_to_payload(f.rollout_json):
                ref = k.payload(f.rollout_id, f.attempt, f.payload_token)
                before.append(("SET", ref, f.rollout_json, "EX", UNPUBLISHED_SECONDS))
            args += [
                f.rollout_id,
                f.attempt,
                "" if ref else f.rollout_json,
                f.status,
                f.now,
                int(f.dead_letter),
                "" if f.stale_before is None else f.stale_before,
                "" if f.duration is None else duration_bucket(f.duration),
                f.keep_seconds,
                f.duration or 0,
                "" if f.reward is None else reward_bucket(f.reward),
                f.reward or 0,
                f.resources_id or "",
                int(f.reward_missing),
                f.summary
                or minimal_summary_json(
                    status=f.status,
                    attempt=f.attempt,
                    reward=f.reward,
                    resources_id=f.resources_id,
                    duration=f.duration,
                ),
                ref,
            ]
        return ScriptCall(self._finish, keys, args, tuple(before))

    @staticmethod
    def read_finish(reply: Any) -> FinishReply:
        """The settled reply of a :meth:`finish_call` (of one finish)."""
        (only,) = Lifecycle.read_finishes(reply)
        return replied(only)  # type: ignore[no-any-return]

    @staticmethod
    def read_finishes(reply: Any) -> list[FinishReply | Exception]:
        """The settled reply of a :meth:`finish_many_call`: each finish's reply, or the error its part got."""
        return [r if isinstance(r, Exception) else read_finish(r) for r in reply]

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
        attempt back. :class:`~rollq.store.replies.Superseded` when the attempt is not current,
        :class:`~rollq.store.replies.StillAlive` when it heartbeated after ``stale_before``,
        :class:`~rollq.store.replies.TaskMissing` when the task record is gone (Redis lost it); nothing written but
        for :class:`~rollq.store.replies.Requeued`.
        """
        k = self.keys
        jid = k.job_id(task.rollout_id, after_attempt=attempt)
        call = ScriptCall(
            self._requeue,
            [k.task(task.rollout_id), k.inflight, k.rq_queue, k.rq_queues(), k.rq_job(jid), k.stats, k.queued_tasks],
            [
                task.rollout_id,
                attempt,
                jid,
                reason,
                "" if stale_before is None else stale_before,
                int(reason == "released"),
                *self._template(policy).fields(task.rollout_id, self._description(task)),
            ],
        )
        return read_requeue(replied(self.run_pipelined([call])[0]))

    def revive(self, task: Task, policy: RolloutPolicy, claims: int) -> bool:
        """Requeue a dead-lettered task with a fresh attempt budget; False if it was not dead-lettered.

        :class:`JobIdTakenError` when the new job id holds another job's hash (nothing is written)."""
        k = self.keys
        jid = k.job_id(task.rollout_id, after_attempt=claims)
        reply = self._revive(
            keys=[
                k.task(task.rollout_id),
                k.dead_letter,
                k.rq_queue,
                k.rq_queues(),
                k.rq_job(jid),
                k.resources_refs,
                k.queued_tasks,
            ],
            args=[task.rollout_id, jid, *self._template(policy).fields(task.rollout_id, self._description(task))],
        )
        reply = without_damaged(reply)
        if reply == -1:
            raise JobIdTakenError(jid, task.rollout_id)
        return bool(reply)

    def restore(self, rollout_id: str | Sequence[str], job_id: str, now: float) -> bool:
        """Push ``job_id`` back on the queue if it has been stranded in RQ's intermediate list for
        ``unresponsive_seconds`` while its task (any task of a pack: ``rollout_id`` lists them) waits for it (see
        ``lua/restore.lua``); True if it was. A leftover whose tasks no longer wait for it is dropped from the list
        after 30 s."""
        k = self.keys
        first, *others = [rollout_id] if isinstance(rollout_id, str) else list(rollout_id)
        reply = self._restore(
            keys=[k.task(first), k.rq_intermediate, k.rq_queue, k.stranded(job_id), k.stats, *map(k.task, others)],
            args=[job_id, now],
        )
        return bool(without_damaged(reply) == 1)

    def split_pack(self, job_id: str, rollout_ids: Sequence[str], *, taken_from: str | None = None) -> int | str:
        """:meth:`split` the pack ``job_id`` of ``rollout_ids``, reading their records first: the number of tasks
        queued again, -2 when the pack was not on ``taken_from``, or why it could not be split (a record that cannot
        be read, no record, a new job id taken by another job) with nothing written."""
        records, errors = read_records_or_errors(self.connection, self.keys, list(rollout_ids))
        if errors:
            return str(next(iter(errors.values())))
        tasks = [(records[rid].task, records[rid].policy) for rid in rollout_ids if rid in records]
        if not tasks:
            return "its tasks have no records"
        split = self.split(job_id, tasks, taken_from=taken_from)
        return "a new job id is taken by another job" if split == -1 else split

    def split(self, job_id: str, tasks: Sequence[tuple[Task, RolloutPolicy]], *, taken_from: str | None = None) -> int:
        """Queue each of ``tasks`` (a pack's, in its order) that still waits for the pack ``job_id`` again as a job of
        its own at the front of the queue, and drop the pack from ``taken_from`` (RQ's intermediate list unless told)
        and its hash (see ``lua/split.lua``): for a consumer of single-task jobs that took a pack off the queue (the AL
        0.1 gateway), or that claims one task of a queued pack by its id (AL 1.0's runners, ``taken_from`` the queue).
        All or nothing.

        Each new job is the one enqueue would have made for the task alone (:func:`~rollq.store.keys.job_id`, after
        attempt 0: a task waiting for a pack was never claimed), from the job template of the first task's policy (a
        pack's tasks are queued under one policy). The number of tasks queued again (0: none waited, the pack was a
        leftover and is dropped); -1 nothing written, a new job id holds another job; -2 nothing written, the pack
        was not on ``taken_from``."""
        if not tasks:
            raise ValueError("a split needs the pack's tasks")
        k = self.keys
        template = self._template(tasks[0][1])
        keys = [taken_from or k.rq_intermediate, k.rq_queue, k.rq_queues(), k.rq_job(job_id), k.stats]
        args: list[Any] = [job_id, len(template.shared), *template.shared]
        for task, _ in tasks:
            jid = k.job_id(task.rollout_id)
            keys += [k.task(task.rollout_id), k.rq_job(jid)]
            args += [jid, template.payload(task.rollout_id), self._description(task)]
        return int(without_damaged(replied(self.run_pipelined([ScriptCall(self._split, keys, args)])[0])))

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
        return read_clock(self._beat(keys=[k.inflight, k.clock], args=args))

    def quarantine(self, source: str, job_id: str) -> bool:
        """Move ``job_id`` from RQ list ``source`` of this namespace to the quarantine list; True if it moved."""
        return bool(self._quarantine(keys=[source, self.keys.quarantine], args=[job_id]))

    def unindex(self, task_keys: Sequence[str]) -> int:
        """Drop those of ``task_keys`` whose task is no longer queued from the queued-task index (see
        ``lua/unindex.lua``); how many were dropped."""
        return int(self._unindex(keys=[self.keys.queued_tasks, *task_keys], args=[]))

    def reissue(
        self, task: Task, policy: RolloutPolicy, old_job_id: str, claims: int, now: float, *, deep: bool
    ) -> int:
        """Queue ``task`` again as a new RQ job if its job ``old_job_id`` vanished (see ``lua/reissue.lua``);
        ``deep`` also looks for the job on RQ's lists (linear in their length).

        1 queued again, 0 not (or not yet), -1 the new job id is taken by another job.
        """
        return int(without_damaged(self._reissue_call(task, policy, old_job_id, claims, now, deep=deep).run()))

    def reissue_many(self, checks: Sequence[Reissue]) -> list[int | Exception]:
        """:meth:`reissue` for many queued tasks in one pipeline: one round trip, not one each (the lost-job sweep
        runs on a worker's heartbeat thread, see :mod:`rollq.store.reaper`). Each check's reply (1, 0, -1) or the
        error its call got."""
        calls = [self._reissue_call(c.task, c.policy, c.old_job_id, c.claims, c.now, deep=c.deep) for c in checks]
        return [r if isinstance(r, Exception) else int(without_damaged(r)) for r in self.run_pipelined(calls)]

    def _reissue_call(
        self, task: Task, policy: RolloutPolicy, old_job_id: str, claims: int, now: float, *, deep: bool
    ) -> ScriptCall:
        k = self.keys
        jid = k.job_id(task.rollout_id, after_attempt=claims, reissue=True)
        return ScriptCall(
            self._reissue,
            [
                k.task(task.rollout_id),
                k.rq_queue,
                k.rq_intermediate,
                k.rq_queues(),
                k.rq_job(old_job_id),
                k.rq_job(jid),
                k.orphaned(old_job_id),
                k.stats,
            ],
            [
                old_job_id,
                jid,
                now,
                int(deep),
                *self._template(policy).fields(task.rollout_id, self._description(task)),
            ],
        )
