"""Finding attempts whose worker went quiet, and deciding their fate.

An attempt whose heartbeat deadline has passed is requeued when its policy
retries ``unresponsive`` failures and attempts remain, else it ends as a failed
rollout in the dead-letter set. Every decision is a Lua transition guarded by
the attempt number and the deadline, so any number of reapers (every worker and
every producer run one) can race safely: one wins, the rest see "not current",
and a worker that heartbeats at the last moment keeps its attempt.

Deadlines are judged on Redis's clock, and after Redis was stalled or out of
reach of every client the reapers hold off for a full heartbeat interval (see
``lua/beat.lua``), so that no live attempt looks dead because Redis was away.

A reaper also:

- puts back jobs stranded in RQ's intermediate list (taken off the queue by a
  worker that never started them, see ``lua/restore.lua``), and moves anything
  there that is not a well-formed rollq job into the quarantine list;
- sweeps the task records for queued tasks whose RQ job vanished (deleted from
  rq-dashboard, ``rq empty``, a flushed list) and queues them again
  (``lua/reissue.lua``), at a bounded cost: see :func:`_audit`. A whole sweep
  takes (queued tasks) / ``AUDIT_SCAN`` seconds.

One record that cannot be parsed ends as a failed rollout naming
:class:`InvalidTaskError`; it never stops a pass.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import redis

from rollq.models.errors import InvalidTaskError, RetryNotQueuedError, WorkerUnresponsiveError
from rollq.models.outcomes import failed_rollout
from rollq.models.policy import RolloutStatus, TaskState
from rollq.models.wire import rollout_json

from . import connection as _connection
from .jobs import read_rollq_jobs, rollout_ids_of
from .keys import REAPED_WORKER_SECONDS, Keys, TaskField, parse_inflight_member
from .records import TaskRecord, foreign_keys, not_a_record, read_records_or_errors, wrong_type
from .replies import Clock, JobTaken, Published, Requeued, TaskMissing, report_damaged
from .summaries import summary_json
from .transitions import Finish, Lifecycle, Reissue

log = logging.getLogger(__name__)
_T = TypeVar("_T")

AUDIT_SCAN = 1000
"""Queued tasks one sweep pass reads (``SSCAN COUNT`` of the queued-task index) looking for vanished RQ jobs."""
AUDIT_DEEP = 20
"""Queued tasks per sweep pass whose job is looked for on RQ's lists (two ``LPOS`` each)."""


@dataclass
class ReapReport:
    """What one pass did."""

    requeued: int = 0
    failed: int = 0
    restored: int = 0
    quarantined: int = 0
    reissued: int = 0
    waited: bool = False  # the pass judged no deadline: Redis was just stalled or out of reach
    workers_reaped: list[str] = field(default_factory=list)
    """The workers whose attempts this pass requeued or failed for want of heartbeats (each marked in
    :meth:`~rollq.store.keys.Keys.reaped_worker`)."""


def _log_holding_off(wait: float) -> None:
    """Say why this pass judges no deadline: a refusal this process met (OOM, READONLY...) by its name, Redis having
    answered all along; otherwise a stall or an outage, which is all the namespace's clock can tell."""
    refusal = _connection.REFUSALS.recent()
    if refusal is not None:
        log.warning(
            "Redis refused writes (%s), so heartbeats were not recorded: judging no deadline for another %.1fs",
            refusal,
            wait,
        )
    else:
        log.warning("Redis was stalled or out of reach: judging no deadline for another %.1fs", wait)


def take_turn(lifecycle: Lifecycle, seconds: float) -> bool:
    """True when the caller now holds the namespace's reaping turn for ``seconds`` (``SET NX PX``, one command).

    Workers reap in turns: with every worker making every periodic pass, an idle fleet sent N x 5 commands per
    heartbeat interval for one namespace's worth of work (bench/idle.py: 3.35 commands/s per idle worker,
    docs/scaling.md). A turn held by a worker that died lapses after ``seconds``; the next worker to try takes it.
    """
    return bool(lifecycle.connection.set(lifecycle.keys.reap_turn, 1, nx=True, px=max(1, round(seconds * 1000))))


def queue_take_turn(lifecycle: Lifecycle, seconds: float, pipe: Any) -> None:
    """:func:`take_turn`'s command queued on ``pipe`` (its reply: truthy when the turn was taken), for a caller
    that sends something else in the same round trip."""
    pipe.set(lifecycle.keys.reap_turn, 1, nx=True, px=max(1, round(seconds * 1000)))


def reap(
    lifecycle: Lifecycle, *, results_maxlen: int, limit: int = 200, within: float = 0, clock: Clock | None = None
) -> ReapReport:
    """Handle up to ``limit`` attempts whose heartbeat deadline has passed on Redis's clock, put back stranded
    jobs, move malformed ones aside, and sweep a few records for vanished jobs.

    ``within`` promises the caller's next pass within that many seconds (see :meth:`Lifecycle.beat`); a caller that
    has just called :meth:`Lifecycle.beat` (a heartbeat) passes the ``clock`` it got instead, saving a second call.
    """
    if clock is None:
        clock = lifecycle.beat(within=within)
    report = ReapReport(waited=clock.in_grace)
    if clock.in_grace:
        wait = (clock.grace_until or clock.now) - clock.now
        _log_holding_off(wait)
        return report
    keys = lifecycle.keys
    # Each part reads lists of its own: one of them holding another type skips that part, named, not the pass (a
    # WRONGTYPE from the intermediate list or the queued-task index failed every pass before any deadline was judged).
    report.restored, report.quarantined = _unless_damaged(
        lifecycle,
        "putting back stranded jobs",
        {keys.rq_intermediate: ("list", "RQ intermediate list")},
        lambda: _restore_stranded(lifecycle, now=clock.now, limit=limit),
        (0, 0),
    )
    report.reissued = _unless_damaged(
        lifecycle,
        "the lost-job sweep",
        {
            keys.queued_tasks: ("set", "queued-task index"),
            keys.rq_queue: ("list", "RQ queue"),
            keys.rq_intermediate: ("list", "RQ intermediate list"),
            keys.audit_cursor: ("string", "sweep cursor"),
        },
        lambda: _audit(lifecycle, clock),
        0,
    )
    _reap_stale(lifecycle, clock, results_maxlen=results_maxlen, limit=limit, report=report)
    return report


def _unless_damaged(
    lifecycle: Lifecycle, part: str, read: dict[str, tuple[str, str]], run: Callable[[], _T], skipped: _T
) -> _T:
    """``run()``, or ``skipped`` when it met Redis's WRONGTYPE on one of the keys it ``read`` (key -> the type rollq or
    RQ writes there, what it is): the keys of another type are logged (once a minute, as the scripts' damaged keys
    are), the types read only then."""
    try:
        return run()
    except redis.ResponseError as exc:
        if not wrong_type(exc):
            raise
        damaged = foreign_keys(lifecycle.connection, read)
        report_damaged("; ".join(damaged) or str(exc), f"{part} skipped this pass; deadlines judged all the same")
        return skipped


def _reap_stale(lifecycle: Lifecycle, clock: Clock, *, results_maxlen: int, limit: int, report: ReapReport) -> None:
    connection: redis.Redis = lifecycle.connection
    keys: Keys = lifecycle.keys
    now = clock.now
    try:
        stale = cast(list[bytes], connection.zrangebyscore(keys.inflight, "-inf", now, start=0, num=limit))
    except redis.ResponseError as exc:
        if not wrong_type(exc):
            raise
        # An in-flight set of another type holds no attempt to judge: beat.lua names it (the caller logs it once a
        # minute) and claims are refused until it is repaired; the rest of the pass has run.
        return
    if not stale:
        return
    members = []
    for member in stale:
        try:
            members.append((member, *parse_inflight_member(member)))
        except ValueError:  # not written by rollq: no attempt to judge, and it must not stop the pass
            _drop_member(lifecycle, member, "it names no attempt")
    records, invalid = read_records_or_errors(connection, keys, list(dict.fromkeys(rid for _, rid, _ in members)))
    for member, rid, attempt in members:
        try:
            reaped = _judge(
                lifecycle, member, rid, attempt, records, invalid, now=now, maxlen=results_maxlen, report=report
            )
            if reaped and reaped not in report.workers_reaped:
                report.workers_reaped.append(reaped)
                # The worker is dead as far as rollq is concerned: status, /metrics and the dashboard list it so
                # from now on, not "busy" and alive until its last heartbeat is 30 s old (unless it beats again).
                connection.set(keys.reaped_worker(reaped), repr(now), ex=REAPED_WORKER_SECONDS)
        except redis.ResponseError as exc:  # one record a script refuses must not stop the pass for the others
            if wrong_type(exc):  # its task key holds no hash: no script can end the attempt, every pass would fail
                _drop_member(lifecycle, member, f"its task key {keys.task(rid)} holds no hash")
            else:
                log.error("could not reap %s attempt %d: %s", rid, attempt, exc)


def _drop_member(lifecycle: Lifecycle, member: bytes, why: str) -> None:
    """Take a member no reaper can judge out of the in-flight set, saying so once."""
    if lifecycle.connection.zrem(lifecycle.keys.inflight, member):
        log.error(
            "dropped %r from the in-flight set %s: %s", member.decode(errors="replace"), lifecycle.keys.inflight, why
        )


def _judge(
    lifecycle: Lifecycle,
    member: bytes,
    rid: str,
    attempt: int,
    records: dict[str, TaskRecord],
    invalid: dict[str, InvalidTaskError],
    *,
    now: float,
    maxlen: int,
    report: ReapReport,
) -> str | None:
    """Requeue or fail one stale attempt, as its policy says; the worker it took the attempt from, if it did."""
    connection: redis.Redis = lifecycle.connection
    keys = lifecycle.keys
    if rid in invalid:
        _fail(lifecycle, rid, attempt, "", invalid[rid], results_maxlen=maxlen, now=now, report=report)
        return None
    record = records.get(rid)
    if record is None or record.state != TaskState.RUNNING or record.attempt != attempt:
        connection.zrem(keys.inflight, member)  # a leftover of an attempt that already ended
        return None
    silent_for = record.policy.unresponsive_seconds
    if record.policy.retries("unresponsive", record.attempts_used):
        reply = lifecycle.requeue(record.task, attempt, record.policy, "unresponsive", stale_before=now)
        if isinstance(reply, Requeued):
            report.requeued += 1
            log.warning(
                "requeued %s: attempt %d on %s sent no heartbeat for %.0fs", rid, attempt, record.worker, silent_for
            )
            return record.worker
        if isinstance(reply, TaskMissing):
            log.warning(
                "could not requeue %s (attempt %d on %s sent no heartbeat): its task record %s is gone since it was "
                "read (Redis lost it: a restart without persistence, a flush, an eviction)",
                rid,
                attempt,
                record.worker,
                keys.task(rid),
            )
        if not isinstance(reply, JobTaken):
            return None
    error: Exception = WorkerUnresponsiveError(
        f"worker {record.worker} sent no heartbeat for {silent_for:.0f}s "
        f"on attempt {attempt} of {record.policy.max_attempts}"
    )
    if record.policy.retries("unresponsive", record.attempts_used):
        # Its retry could not be queued: that is why the task ends here (left stale, it was tried again every
        # pass and never ended).
        error = RetryNotQueuedError(lifecycle.keys.job_id(rid, after_attempt=attempt), rid, str(error))
        log.error("%s; failing it", error)
    failed = _fail(
        lifecycle,
        rid,
        attempt,
        record.worker or "",
        error,
        results_maxlen=maxlen,
        now=now,
        report=report,
        generation=record.generation,
    )
    return record.worker if failed else None


def _fail(
    lifecycle: Lifecycle,
    rid: str,
    attempt: int,
    worker: str,
    error: Exception,
    *,
    results_maxlen: int,
    now: float,
    report: ReapReport,
    generation: int = 1,
) -> bool:
    """Publish ``rid``'s failed rollout naming ``error``, dead-lettered; whether this call published it."""
    rollout = failed_rollout(rid, attempt=attempt, worker=worker, error=error, generation=generation)
    outcome = lifecycle.finish(
        Finish(
            rollout_id=rid,
            attempt=attempt,
            rollout_json=rollout_json(rollout),
            status=RolloutStatus.FAILED,
            results_maxlen=results_maxlen,
            dead_letter=True,
            now=now,
            stale_before=now,
            summary=summary_json(rollout, status=RolloutStatus.FAILED),
        )
    )
    if isinstance(outcome, Published):
        report.failed += 1
        log.error("failed %s for good: %s: %s", rid, type(error).__name__, error)
        return True
    return False


def _restore_stranded(lifecycle: Lifecycle, *, now: float, limit: int) -> tuple[int, int]:
    connection: redis.Redis = lifecycle.connection
    keys = lifecycle.keys
    job_ids = [j.decode() for j in cast(list[bytes], connection.lrange(keys.rq_intermediate, 0, limit - 1))]
    if not job_ids:
        return 0, 0
    restored = quarantined = 0
    for job_id, job in read_rollq_jobs(connection, list(dict.fromkeys(job_ids))).items():
        if isinstance(job, InvalidTaskError):
            try:
                moved = lifecycle.quarantine(keys.rq_intermediate, job_id)
            except redis.ResponseError as exc:  # a quarantine list of another type: the job stays where it is
                log.error("could not move job %s of RQ's intermediate list aside: %s", job_id, exc)
                continue
            if moved:
                quarantined += 1
                log.error(
                    "moved job %s from RQ's intermediate list to the quarantine list %s: %s",
                    job_id,
                    keys.quarantine,
                    job,
                )
            continue
        ids = rollout_ids_of(job) if job is not None else [""]
        rid = ids[0] if len(ids) == 1 else f"pack {ids[0]} .. {ids[-1]}"
        try:
            put_back = lifecycle.restore(ids, job_id, now)
        except redis.ResponseError as exc:
            log.error("could not check job %s of %s in RQ's intermediate list: %s", job_id, rid, exc)
            continue
        if put_back:
            restored += 1
            log.warning("put job %s of %s back on the queue: a worker took it off but never started it", job_id, rid)
    return restored, quarantined


def _audit(lifecycle: Lifecycle, clock: Clock) -> int:
    """Sweep on over the queued tasks for those whose RQ job vanished, and queue those again.

    At most one pass a second per namespace, whichever reaper gets there first. A pass reads ``AUDIT_SCAN``
    members of the namespace's queued-task index (``SSCAN`` of ``queued-tasks``, which the transitions keep: not
    the whole keyspace, where one pass used to read keys of every namespace and a full sweep took hours with
    millions of keys), drops members that are no longer queued, and checks each queued task's job hash (O(1)).
    Only when RQ's queue and intermediate list together hold fewer jobs than there are queued tasks (a flushed or
    trimmed list) does it look for jobs on the lists: at most ``AUDIT_DEEP`` (two ``LPOS`` each, linear in the
    lists' length), first those seen off the lists before, then a random few. With every job where it belongs
    (the steady state) a pass costs no ``LPOS`` at all: at 1M queued each cost 13.7 ms (issue 25), and only the
    tasks whose job hash is missing (or that are looked for on the lists) go on to ``lua/reissue.lua``.
    """
    connection: redis.Redis = lifecycle.connection
    keys = lifecycle.keys
    if not connection.set(keys.audit_lock, 1, nx=True, px=1000):
        return 0
    cursor = int(cast(Any, connection.get(keys.audit_cursor)) or 0)
    cursor, names = cast(tuple[int, list[bytes]], connection.sscan(keys.queued_tasks, cursor, count=AUDIT_SCAN))
    connection.set(keys.audit_cursor, cursor)
    prefix = len(keys.task(""))
    rids = [name.decode()[prefix:] for name in names]
    if not rids:
        return 0
    pipe = connection.pipeline(transaction=False)
    for rid in rids:
        pipe.hmget(keys.task(rid), TaskField.STATE, TaskField.JOB)
    pipe.llen(keys.rq_queue)
    pipe.llen(keys.rq_intermediate)
    pipe.scard(keys.queued_tasks)
    *replies, queue_length, intermediate_length, queued = pipe.execute(raise_on_error=False)
    for length in (queue_length, intermediate_length, queued):
        if isinstance(length, Exception):
            raise length
    states: list[tuple[bytes | None, bytes | None]] = []
    for rid, reply in zip(rids, replies, strict=True):
        if isinstance(reply, Exception):  # a key overwritten with another type: one bad key must not stop the sweep
            log.error("%s; dropped from the queued-task index", not_a_record(rid, keys.task(rid), reply))
            reply = [None, None]  # not queued: unindex.lua drops it
        states.append((reply[0], reply[1]))
    jobs = {rid: job.decode() for rid, (state, job) in zip(rids, states, strict=True) if state == b"queued" and job}
    gone = [keys.task(rid) for rid, (state, _) in zip(rids, states, strict=True) if state != b"queued"]
    if gone:
        lifecycle.unindex(gone)
    if not jobs:
        return 0
    deep: set[str] = set()
    if int(queue_length) + int(intermediate_length) < int(queued) - len(gone):
        pipe = connection.pipeline(transaction=False)
        for job in jobs.values():
            pipe.exists(keys.orphaned(job))
        marked = [rid for rid, seen in zip(jobs, pipe.execute(), strict=True) if seen]
        rest = [rid for rid in jobs if rid not in set(marked)]
        deep = set((marked + random.sample(rest, min(len(rest), AUDIT_DEEP)))[:AUDIT_DEEP])
    # A task whose job hash is there and that is not looked for on the lists would only have reissue.lua answer 0
    # without a write: read records and call the script for the others only. Steady state: one EXISTS per queued
    # task a pass, where the record read and the script's own HMGET and EXISTS cost four commands (issue 24).
    pipe = connection.pipeline(transaction=False)
    shallow = [rid for rid in jobs if rid not in deep]
    for rid in shallow:
        pipe.exists(keys.rq_job(jobs[rid]))
    present = {rid for rid, there in zip(shallow, pipe.execute() if shallow else [], strict=True) if there}
    suspects = [rid for rid in jobs if rid not in present]
    if not suspects:
        return 0
    records, _ = read_records_or_errors(connection, keys, suspects)
    checks = [
        Reissue(record.task, record.policy, jobs[rid], record.task.num_claims or 0, clock.now, rid in deep)
        for rid, record in records.items()
    ]
    # One pipeline for the pass: it runs on a worker's heartbeat thread, and one round trip per task (up to
    # AUDIT_SCAN) held that thread for seconds (4.2-4.7 s with 3,000 queued at a 4 ms round trip), delaying the
    # worker's own heartbeats and the namespace's reaping (bench/cluster's dead host, issue 25).
    reissued = 0
    for rid, outcome in zip(records, lifecycle.reissue_many(checks), strict=True):
        if isinstance(outcome, redis.ResponseError):
            log.error("could not check the RQ job of queued task %s: %s", rid, outcome)
            continue
        if isinstance(outcome, Exception):
            raise outcome
        if outcome == 1:
            reissued += 1
            log.warning("queued %s again: its RQ job %s vanished (deleted, or flushed from RQ's lists)", rid, jobs[rid])
        elif outcome == -1:
            log.error("could not queue %s again: the RQ job id for it is taken by another job", rid)
    return reissued
