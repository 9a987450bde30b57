"""Finding attempts whose worker went quiet, and deciding their fate.

An attempt whose heartbeat deadline has passed is requeued when its policy
retries ``unresponsive`` failures and attempts remain, else it ends as a failed
rollout in the dead-letter set. Every decision is a Lua transition guarded by
the attempt number and the deadline, so any number of reapers (every worker and
every producer run one) can race safely: one wins, the rest see "not current",
and a worker that heartbeats at the last moment keeps its attempt.

A reaper also puts back jobs stranded in RQ's intermediate list: taken off the
queue by a worker that never started them (see ``lua/restore.lua``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import cast

import redis

from rollq.models.errors import InvalidTaskError, WorkerUnresponsiveError
from rollq.models.outcomes import failed_rollout
from rollq.models.policy import TaskState

from .jobs import fetch_jobs, rollout_id_of
from .keys import Keys, parse_inflight_member
from .records import read_records
from .transitions import Lifecycle, Published, Requeued

log = logging.getLogger(__name__)


@dataclass
class ReapReport:
    """What one pass did."""

    requeued: int = 0
    failed: int = 0
    restored: int = 0


def reap(lifecycle: Lifecycle, *, now: float, results_maxlen: int, limit: int = 200) -> ReapReport:
    """Handle up to ``limit`` attempts whose heartbeat deadline is before ``now``, and put back stranded jobs."""
    connection: redis.Redis = lifecycle.connection
    keys: Keys = lifecycle.keys
    report = ReapReport(restored=_restore_stranded(lifecycle, now=now, limit=limit))
    stale = cast(list[bytes], connection.zrangebyscore(keys.inflight, "-inf", now, start=0, num=limit))
    if not stale:
        return report
    members = [(member, *parse_inflight_member(member)) for member in stale]
    records = read_records(connection, keys, list(dict.fromkeys(rid for _, rid, _ in members)))
    for member, rid, attempt in members:
        record = records.get(rid)
        if record is None or record.state != TaskState.RUNNING or record.attempt != attempt:
            connection.zrem(keys.inflight, member)  # a leftover of an attempt that already ended
            continue
        silent_for = record.policy.unresponsive_seconds
        if record.policy.retries("unresponsive", record.attempts_used):
            reply = lifecycle.requeue(record.task, attempt, record.policy, "unresponsive", stale_before=now)
            if isinstance(reply, Requeued):
                report.requeued += 1
                log.warning(
                    "requeued %s: attempt %d on %s sent no heartbeat for %.0fs", rid, attempt, record.worker, silent_for
                )
            continue
        error = WorkerUnresponsiveError(
            f"worker {record.worker} sent no heartbeat for {silent_for:.0f}s "
            f"on attempt {attempt} of {record.policy.max_attempts}"
        )
        rollout = failed_rollout(
            rid, attempt=attempt, worker=record.worker or "", error=error, generation=record.generation
        )
        outcome = lifecycle.finish(
            rid,
            attempt,
            rollout.model_dump_json(),
            "failed",
            results_maxlen=results_maxlen,
            dead_letter=True,
            now=now,
            stale_before=now,
        )
        if isinstance(outcome, Published):
            report.failed += 1
            log.error("failed %s for good: %s", rid, error)
    return report


def _restore_stranded(lifecycle: Lifecycle, *, now: float, limit: int) -> int:
    connection: redis.Redis = lifecycle.connection
    job_ids = [j.decode() for j in cast(list[bytes], connection.lrange(lifecycle.keys.rq_intermediate, 0, limit - 1))]
    if not job_ids:
        return 0
    restored = 0
    for job in fetch_jobs(connection, job_ids):
        if job is None:
            continue
        try:
            rid = rollout_id_of(job)
        except InvalidTaskError:
            continue  # not a rollq job; RQ's own maintenance deals with it
        if lifecycle.restore(rid, job.id, now):
            restored += 1
            log.warning("put job %s of %s back on the queue: a worker took it off but never started it", job.id, rid)
    return restored
