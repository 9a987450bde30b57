"""Trainer-side reads of task records: one task's state and times, its attempt history, and paged queries.

The parsing here is shared by the blocking producer and the asyncio one; only the
Redis round trips differ. Attempt history lives in the task hash itself, written by
the transitions (a claim field ``worker|claim time`` at claim, an end field
``outcome|time`` when the attempt ends; see :mod:`rollq.store.keys`), the newest 32 kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import cast

import redis

from rollq.models.policy import TaskState

from .keys import HISTORY_MATCH, Keys, TaskField, parse_history, rollout_id_of_task_key
from .records import TaskRecord, read_records_or_errors

SCAN_COUNT = 500
"""Keys SCAN looks at per round trip in :func:`query_tasks`."""


class AttemptOutcome(StrEnum):
    """How one attempt ended: its published status, a requeue reason, or cancellation."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RETRY = "retry"
    UNRESPONSIVE = "unresponsive"
    RELEASED = "released"


@dataclass(frozen=True)
class AttemptInfo:
    """One claim of a task by a worker; ``outcome`` and ``ended_at`` are None while it runs."""

    attempt: int
    worker: str
    claimed_at: float
    ended_at: float | None
    outcome: AttemptOutcome | None


@dataclass(frozen=True)
class TaskInfo:
    """Where a task is: its state, attempts, worker and times (epoch seconds).

    ``worker`` is the worker that holds the task now or whose attempt ended it; None while the task is queued,
    also when a reaper, a retry or a hand-back put it back in the queue. ``last_worker`` is always the worker of the
    last claim, the one ``last_claim_at`` dates (None if it was never claimed)."""

    rollout_id: str
    state: TaskState
    mode: str | None
    attempt: int
    """The current (or last) attempt number; 0 if it was never claimed."""
    attempts_used: int
    """Attempts that count against ``max_attempts`` (a graceful hand-back does not)."""
    worker: str | None
    """The worker running the task, or the one whose attempt ended it; None while it is queued."""
    resources_id: str | None
    created_at: float | None
    last_claim_at: float | None
    ended_at: float | None
    result_id: str | None
    """The results-stream entry of its rollout, once it has one."""
    last_worker: str | None = None
    """The worker of the last claim (the one ``last_claim_at`` dates), kept when the task goes back to the queue."""

    @classmethod
    def from_record(cls, record: TaskRecord) -> TaskInfo:
        task = record.task
        return cls(
            rollout_id=task.rollout_id,
            state=record.state,
            mode=task.mode,
            attempt=record.attempt,
            attempts_used=record.attempts_used,
            worker=record.current_worker,
            resources_id=task.resources_id,
            created_at=task.create_time,
            last_claim_at=task.last_claim_time,
            ended_at=record.ended,
            result_id=record.result_id,
            last_worker=record.worker,
        )


@dataclass(frozen=True)
class TaskPage:
    """One page of :func:`query_tasks`; pass ``cursor`` back for the next, None when the scan is complete."""

    tasks: list[TaskInfo]
    cursor: str | None
    invalid: dict[str, str] = field(default_factory=dict)
    """The page's records that are not what rollq wrote, by rollout id: why each cannot be read."""


ATTEMPT_FIELDS = HISTORY_MATCH


def parse_attempts(fields: Mapping[bytes, bytes]) -> list[AttemptInfo]:
    """The attempt history from a task hash's history fields (see :func:`rollq.store.keys.claim_field`), oldest
    first."""
    claims: dict[int, tuple[str, float]] = {}
    ends: dict[int, tuple[AttemptOutcome, float]] = {}
    for name, value in fields.items():
        kind, attempt, head, when = parse_history(name, value)
        if kind == "a":
            claims[attempt] = (head, when)
        else:
            ends[attempt] = (AttemptOutcome(head), when)
    return [
        AttemptInfo(
            attempt=n,
            worker=worker,
            claimed_at=claimed,
            ended_at=ends[n][1] if n in ends else None,
            outcome=ends[n][0] if n in ends else None,
        )
        for n, (worker, claimed) in sorted(claims.items())
    ]


def read_attempts(connection: redis.Redis, keys: Keys, rollout_id: str) -> list[AttemptInfo]:
    """The attempt history of ``rollout_id`` (HSCAN: the task JSON in the same hash is filtered out server-side)."""
    fields = dict(connection.hscan_iter(keys.task(rollout_id), match=ATTEMPT_FIELDS, count=100))
    return parse_attempts(cast(dict[bytes, bytes], fields))


def decode_cursor(cursor: str | None) -> tuple[int, int]:
    """``(scan cursor, matches of that SCAN batch already returned)`` from a page cursor."""
    if not cursor:
        return 0, 0
    scan, _, skip = cursor.partition(":")
    try:
        return int(scan), int(skip or 0)
    except ValueError:
        raise ValueError(f"not a query_tasks cursor: {cursor!r}") from None


def encode_cursor(scan: int, skip: int) -> str:
    return f"{scan}:{skip}"


def matching(
    rollout_ids: Iterable[str],
    states_modes: Iterable[list[bytes | None] | Exception],
    state: TaskState | None,
    mode: str | None,
) -> list[str]:
    """The ids whose (state, mode) from HMGET pass the filters; ids whose record vanished meanwhile are left out.
    A key HMGET could not read (it holds no hash: its error as the reply) passes no filter, but is listed without
    them, for the page to name it."""
    out = []
    for rid, reply in zip(rollout_ids, states_modes, strict=True):
        if isinstance(reply, Exception):
            if state is None and mode is None:
                out.append(rid)
            continue
        raw_state, raw_mode = reply
        if raw_state is None:
            continue
        if state is not None and raw_state.decode() != state.value:
            continue
        if mode is not None and (raw_mode or b"").decode() != mode:
            continue
        out.append(rid)
    return out


FILTER_FIELDS = [TaskField.STATE, TaskField.MODE]
"""What a page walk reads of each task hash it finds (``HMGET``), to filter it."""


class TaskPager:
    """The paging of ``query_tasks`` without the Redis calls, so that the blocking and the asyncio producer
    share it. Drive it: while not :attr:`done`, ``SCAN`` from :attr:`scan` (match ``keys.task_pattern``, count
    ``SCAN_COUNT``), ``HMGET`` :data:`FILTER_FIELDS` of each id :meth:`ids` gives, and hand both to :meth:`add`;
    then read the records of :attr:`found`."""

    def __init__(self, keys: Keys, state: TaskState | str | None, mode: str | None, limit: int, cursor: str | None):
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.keys = keys
        self.state = TaskState(state) if state is not None else None
        self.mode = mode
        self.limit = limit
        self.scan, self._skip = decode_cursor(cursor)
        self.found: list[str] = []
        self.next_cursor: str | None = None
        self.done = False

    def ids(self, raw_keys: Iterable[bytes]) -> list[str]:
        """The rollout ids of the task keys one SCAN returned, in a stable order (the cursor counts into it)."""
        return sorted(rollout_id_of_task_key(self.keys, k) for k in raw_keys)

    def add(
        self, after: int | bytes, rollout_ids: list[str], states_modes: Iterable[list[bytes | None] | Exception]
    ) -> None:
        """Take one SCAN batch (``after`` is SCAN's next cursor) with its HMGET replies (``raise_on_error=False``)."""
        matches = matching(rollout_ids, states_modes, self.state, self.mode)[self._skip :]
        room = self.limit - len(self.found)
        if len(matches) > room:
            self.found += matches[:room]
            self.next_cursor = encode_cursor(self.scan, self._skip + room)  # the rest of this batch comes first
            self.done = True
            return
        self.found += matches
        self.scan, self._skip = int(after), 0
        if self.scan == 0:
            self.done = True
        elif len(self.found) == self.limit:
            self.next_cursor = encode_cursor(self.scan, 0)
            self.done = True

    def page(self, records: Mapping[str, TaskRecord], invalid: Mapping[str, Exception] | None = None) -> TaskPage:
        """The page, from the records of :attr:`found` (a task deleted meanwhile is left out) and the errors of
        those that cannot be read (named on the page, not raised: one bad record must not hide the others)."""
        tasks = [TaskInfo.from_record(records[rid]) for rid in self.found if rid in records]
        bad = {rid: str(invalid[rid]) for rid in self.found if invalid and rid in invalid}
        return TaskPage(tasks, self.next_cursor, bad)


def query_tasks(
    connection: redis.Redis,
    keys: Keys,
    *,
    state: TaskState | str | None = None,
    mode: str | None = None,
    limit: int = 100,
    cursor: str | None = None,
) -> TaskPage:
    """Up to ``limit`` tasks with ``state``/``mode``, walking the namespace's task hashes with SCAN.

    Cost: a full walk is O(keys in the database) round trips of ``SCAN_COUNT`` keys each,
    plus one HMGET per task seen; it is meant for inspection and occasional sweeps, not
    for every training step. As with SCAN, a task created or deleted during the walk may
    or may not be seen, and one may (rarely) be seen twice.
    """
    pager = TaskPager(keys, state, mode, limit, cursor)
    while not pager.done:
        after, raw_keys = connection.scan(pager.scan, match=keys.task_pattern, count=SCAN_COUNT)
        rids = pager.ids(cast(list[bytes], raw_keys))
        pipe = connection.pipeline(transaction=False)
        for rid in rids:
            pipe.hmget(keys.task(rid), FILTER_FIELDS)
        pager.add(after, rids, pipe.execute(raise_on_error=False))
    return pager.page(*read_records_or_errors(connection, keys, pager.found))


# XRANGE inside Redis, answering only the id: the oldest results entry can be megabytes, and XINFO STREAM sends
# the first and last entries whole.
_FIRST_ID = "local e = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1) if e[1] then return e[1][1] end return false"


def first_entry_id(connection: redis.Redis, stream: str) -> str | None:
    """The id of the oldest entry of ``stream`` (None when empty or missing), without reading the entry."""
    found = connection.eval(_FIRST_ID, 1, stream)
    return found.decode() if isinstance(found, bytes) else (found or None)  # type: ignore[return-value]
