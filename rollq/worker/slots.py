"""A worker's capacity: ``concurrency`` slots, and the tasks that hold them.

The invariant (pinned by ``tests/worker/test_slots.py``): every task a worker dequeues holds exactly one slot from
the moment its RQ job is taken off RQ's queue until its end is recorded, and frees it exactly once, whatever path
it ends on (published, failed, retried, timed out, cancelled, taken over, handed back, refused as not a rollq job
or as an invalid task). A slot freed twice would let the worker run more rollouts than it was asked to; one never
freed would shrink it for good. Both are counted here (:attr:`Slots.over_freed`, :attr:`Slots.held`) so that a
test can see them, and an extra free is refused with :class:`SlotAccountingError` instead of being absorbed.

An RQ job carries one task, or a pack of several (``tasks_per_job``, see :mod:`.packs`): a pack holds one slot
per task, except a pack larger than the whole concurrency, which holds every slot and so runs alone.

A job is *taken* when it holds its slots (dequeued, or taken ahead of time) and its tasks *running* from
:meth:`Slots.started` (RQ handed the job to ``execute_job``) until :meth:`Slots.ended` (each task's end recorded);
RQ's view of the worker (busy or idle, its current job) follows the running ones. A job that never starts
(refused, or taken ahead and given back) frees its slots with :meth:`Slots.free`.
"""

from __future__ import annotations

import threading


class SlotAccountingError(RuntimeError):
    """More slots were freed than were taken: a job ended on a path that freed its slot twice."""


class Slots:
    """``capacity`` slots; thread-safe (the main thread takes them, batch threads free them)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a worker needs at least one slot, got {capacity}")
        self.capacity = capacity
        self._free = threading.Semaphore(capacity)
        self._lock = threading.Lock()
        self._held = 0
        self._busy = 0  # tasks started and not ended
        self._running: dict[str, None] = {}  # job ids in start order, for the "current job" RQ shows
        self.most_held = 0
        """The most slots held at once so far (never more than ``capacity``)."""
        self.over_freed = 0
        """How many frees were refused because no slot was held (0 unless a path frees twice)."""

    @property
    def held(self) -> int:
        """Slots held now: tasks taken and not yet ended."""
        return self._held

    @property
    def busy(self) -> int:
        """Tasks started and not yet ended."""
        return self._busy

    def take(self, *, timeout: float | None = None, blocking: bool = True) -> bool:
        """Take a slot; False when none came free within ``timeout`` (or at once, with ``blocking=False``)."""
        if not self._free.acquire(blocking, timeout):
            return False
        with self._lock:
            self._held += 1
            self.most_held = max(self.most_held, self._held)
        return True

    def free(self, count: int = 1) -> None:
        """Free ``count`` slots; :class:`SlotAccountingError` (freeing none of them) if fewer are held."""
        with self._lock:
            if count > self._held:
                self.over_freed += count - self._held
                raise SlotAccountingError(f"freeing {count} slot(s) with {self._held} held")
            self._held -= count
        self._free.release(count)

    def started(self, job_id: str, tasks: int = 1) -> None:
        """The job holding its slots has started (RQ handed it to the worker), with ``tasks`` tasks."""
        with self._lock:
            self._busy += tasks
            self._running[job_id] = None

    def leaving(self, job_ids: list[str]) -> str | None:
        """Stop showing ``job_ids`` as running (their end is being recorded); the oldest job still running."""
        with self._lock:
            for job_id in job_ids:
                self._running.pop(job_id, None)
            return next(iter(self._running), None)

    def ended(self, count: int, freed: int | None = None) -> bool:
        """``count`` started tasks have ended (their end is recorded): free ``freed`` slots (default one each: a
        pack larger than the concurrency holds fewer slots than it has tasks); whether none runs now.

        The busy count falls even if freeing fails, so that RQ's view of the worker stays right.
        """
        with self._lock:
            self._busy -= count
            idle = self._busy <= 0
        if freed is None or freed:
            self.free(count if freed is None else freed)
        return idle

    def oldest_running(self) -> str | None:
        """The job that has been running longest, or None."""
        with self._lock:
            return next(iter(self._running), None)
