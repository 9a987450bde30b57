"""One RQ job's tasks on a worker: a pack (``tasks_per_job`` > 1) or a single task, and how its end reads in RQ.

A pack's tasks run side by side, each on its own attempt, exactly as single tasks do (claims, heartbeats, retries,
hand-backs and reapers are per task; a task that goes back to the queue goes as an RQ job of its own). RQ sees the
pack as one job: its start bookkeeping is written when the pack starts, its end once the last of its tasks ended.

What RQ records for a pack that ended:

- every task ended with a rollout that did not fail (succeeded, or no outcome here: retried, handed back,
  cancelled, taken over): the job is *finished*, its result the list of its tasks' results;
- any task failed (a failed rollout, or a rollq fault around it): the job is *failed*, its exception info
  lists each failed task's error. As for a single task, RQ's failed count (``rq info``, rq-dashboard) then says
  that something in it needs a look; the tasks' own outcomes are in rollq's records and results stream, as ever.

A job of one task reads exactly as before packs. Slots: the pack holds ``min(tasks, concurrency)`` slots and frees
one as each task ends, the last ones when it holds more than it has tasks left (see :mod:`.slots`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from rq.executions import Execution
from rq.job import Job
from rq.queue import Queue

from .runner import AttemptResult, AttemptStatus


@dataclass(frozen=True)
class TaskEnd:
    """How one task of a pack ended: its attempt's ``result``, or ``error`` (a rollq fault)."""

    rollout_id: str
    result: AttemptResult | None = None
    error: str | None = None


@dataclass(eq=False)
class Pack:
    """An RQ job being run: its tasks' rollout ids, the slots it holds, and the ends of its tasks so far.

    Thread-safe: its tasks end on the start-batch and finish-batch threads.
    """

    job: Job
    queue: Queue
    rollout_ids: list[str]
    slots: int
    """Slots the pack holds now: ``min(len(rollout_ids), concurrency)`` at its start, none once it ended."""
    execution: Execution | None = None
    """RQ's Execution of the job, once its start is queued."""
    ends: list[TaskEnd] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def single(self) -> bool:
        """A job of one task (``tasks_per_job`` 1, or the last pack of a batch): RQ's record is that task's."""
        return len(self.rollout_ids) == 1

    def task_ended(self, end: TaskEnd) -> tuple[int, bool]:
        """Record ``end``; the slots to free now, and whether that was the pack's last task."""
        with self._lock:
            self.ends.append(end)
            left = len(self.rollout_ids) - len(self.ends)
            freed = max(0, self.slots - left)
            self.slots -= freed
            return freed, left <= 0


def pack_outcome(job: Job, ends: list[TaskEnd]) -> tuple[list[dict[str, Any]], str | None, bytes | str | None]:
    """What RQ records for a pack of several tasks that all ended (see the module): its result (each task's
    result, or its error), the exception info when any task failed (else None), and the meta to write with a
    failed status (each failed task's outcome), or None. Sets the job's description to a count of outcomes."""
    value: list[dict[str, Any]] = []
    failures: list[str] = []
    failed: dict[str, Any] = {}
    counts: dict[str, int] = {}
    for end in ends:
        if end.result is not None:
            value.append(end.result.to_json())
            status = end.result.status.value
            if end.result.status == AttemptStatus.FAILED:
                failures.append(failure_text(end.result))
                failed[end.rollout_id] = {k: v for k, v in end.result.to_json().items() if k != "rollout_id"}
        else:
            status = "error"
            text = (end.error or "").strip()
            value.append(
                {"rollout_id": end.rollout_id, "status": status, "error": text.splitlines()[-1] if text else ""}
            )
            failures.append(f"{text}\n(rollout {end.rollout_id}: rollq fault)")
            failed[end.rollout_id] = {"status": status, "error": value[-1]["error"]}
        counts[status] = counts.get(status, 0) + 1
    job.description = f"{job.description or 'pack'}: " + ", ".join(
        f"{n} {status}" for status, n in sorted(counts.items())
    )
    if not failures:
        return value, None, None
    job.meta["rollouts"] = failed
    error = f"{len(failures)} of {len(ends)} tasks of the pack failed\n\n" + "\n\n".join(failures)
    return value, error, job.serializer.dumps(job.meta)


def failure_text(result: AttemptResult) -> str:
    """The exception info RQ keeps for a failed rollout (what rq-dashboard shows): the agent's traceback when it
    raised (else the error's type and message), then the attempt."""
    error = result.error or {}
    trace = error.get("traceback")
    return (
        (trace.rstrip() + "\n" if trace else f"{error.get('type', 'RolloutFailed')}: {error.get('message', '')}\n")
        + f"(rollout {result.rollout_id} attempt {result.attempt} failed; "
        "the published Rollout's metadata has the same error)"
    )


def failure_line(result: AttemptResult) -> str:
    """A failed rollout in one line: its rollout id, attempt and error (type and message, no traceback)."""
    error = result.error or {}
    message = " ".join(str(error.get("message", "")).split())
    return (
        f"rollout {result.rollout_id} attempt {result.attempt} failed: {error.get('type', 'RolloutFailed')}: {message}"
    )


def logged_failure(ends: list[TaskEnd]) -> str:
    """What the worker log says of a job that failed: each failed rollout in one line (the runner logged its
    traceback when its attempt failed; the job's exception info, :func:`failure_text`, keeps it for RQ), each rollq
    fault whole (its traceback is logged nowhere else)."""
    lines = []
    for end in ends:
        if end.result is None:
            text = (end.error or "").strip()
            lines.append(text if len(ends) == 1 else f"{text}\n(rollout {end.rollout_id}: rollq fault)")
        elif end.result.status == AttemptStatus.FAILED:
            lines.append(failure_line(end.result))
    if len(ends) == 1:
        return lines[0] if lines else ""
    return "\n".join([f"{len(lines)} of {len(ends)} tasks of the pack failed", *lines])
