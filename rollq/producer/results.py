"""Reading finished rollouts from the results stream.

Two ways: :func:`wait` for a known set of ids (non-destructive, any number of
callers), and :class:`ResultReader`, a consumer-group reader that several
trainer processes share so that each rollout is handled once, and handled again
by another reader if the first dies before acknowledging it.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from rollq.models.contract import Rollout
from rollq.models.errors import InvalidTaskError, RolloutsTrimmedError, RolloutTimeoutError, RolloutTrimmedError
from rollq.models.outcomes import failed_rollout
from rollq.models.wire import parse_rollout
from rollq.store.connection import Outage, refusals_not_waited, transient_refusal, unrecoverable
from rollq.store.keys import TRIMMED_TO, Keys, StreamField, TaskField, foreign_key
from rollq.store.payloads import load_payloads, loaded_one_by_one, missing_payload
from rollq.store.reaper import reap
from rollq.store.records import wrong_type
from rollq.store.replies import report_damaged
from rollq.store.transitions import Lifecycle

log = logging.getLogger(__name__)

# Producers reap too, so that a run with every worker gone still ends: stale
# attempts fail or requeue instead of being waited on forever.
REAP_EVERY_SECONDS = 5.0


class HelpingReaper:
    """The reap a producer's wait does every :data:`REAP_EVERY_SECONDS`, so that a run with every worker gone still
    ends. It is a helping hand (workers reap too): while Redis refuses its writes (full, a demoted primary) it is
    skipped at once, said once per spell, and the wait reads on. It was retried until the producer's retries ran out
    and then raised OutOfMemoryError out of the wait, past its timeout (the operator audit's oom_wait.py)."""

    def __init__(self, lifecycle: Lifecycle, results_maxlen: int, what: str, *, within: float) -> None:
        self.lifecycle, self.results_maxlen, self.what, self.within = lifecycle, results_maxlen, what, within
        self.refused = False

    def reap(self) -> None:
        """Reap once, unless Redis refuses the writes; other errors (an outage) are the caller's."""
        try:
            with refusals_not_waited():
                reap(self.lifecycle, results_maxlen=self.results_maxlen, within=self.within)
        except redis.ResponseError as exc:
            if transient_refusal(exc) is None:
                raise
            if not self.refused:
                self.refused = True
                log.warning(
                    "%s: Redis refuses the reap that helps workers end stale attempts (%s); reading rollouts on "
                    "without it until Redis accepts writes",
                    self.what,
                    " ".join(str(exc).split()),
                )
            return
        if self.refused:
            self.refused = False
            log.info("%s: Redis accepts writes again; reaping again", self.what)


def parse_entry(fields: dict[bytes, bytes]) -> Rollout:
    # One entry that is not a Rollout (corrupt, or written by something else) becomes a failed rollout naming
    # the problem, rather than an error that stops the caller reading every other rollout.
    # A big rollout's entry names its payload key: the reader loaded it first (rollq.store.payloads).
    rid = fields.get(StreamField.ROLLOUT_ID.encode(), b"").decode(errors="replace")
    if missing_payload(fields) is not None:
        return failed_rollout(rid, attempt=0, worker="", error=RolloutTrimmedError([rid]))
    try:
        return parse_rollout(fields[StreamField.ROLLOUT.encode()])
    except (KeyError, ValueError) as exc:
        error = InvalidTaskError(f"the results entry of {rid} is not a valid Rollout: {exc}")
        return failed_rollout(rid, attempt=0, worker="", error=error)


def foreign_rollout(rollout_id: str, key: str, kind: str) -> Rollout:
    """The failed rollout of a task whose key holds Redis type ``kind``, not a hash, for a reader of records (wait,
    get_rollouts): no record says where its rollout is, or ever will, and the task can never run (a worker that
    meets it fails it in the same words). A WRONGTYPE reply once made every wait for such an id raise it."""
    error = InvalidTaskError(f"task {rollout_id} cannot be run: {foreign_key('task record', key, kind, 'hash')}")
    return failed_rollout(rollout_id, attempt=0, worker="", error=error)


def result_ids_or_foreign(rollout_ids: Sequence[str], replies: Sequence[Any]) -> tuple[dict[str, bytes], list[str]]:
    """From the replies of an ``HGET <task> result`` pipeline (``raise_on_error=False``): the results entry id of each
    ended task, and the ids whose task key holds no hash (WRONGTYPE); any other error is raised."""
    ended: dict[str, bytes] = {}
    foreign: list[str] = []
    for rid, reply in zip(rollout_ids, replies, strict=True):
        if isinstance(reply, Exception):
            if not wrong_type(reply):
                raise reply
            foreign.append(rid)
        elif reply:
            ended[rid] = reply
    return ended, foreign


def foreign_rollouts(keys: Keys, rollout_ids: Sequence[str], kinds: Sequence[Any]) -> dict[str, Rollout]:
    """:func:`foreign_rollout` of each of ``rollout_ids`` given the ``TYPE`` of its task key; a key that became a hash
    or went away since its WRONGTYPE is left for the next look."""
    found = {}
    for rid, kind in zip(rollout_ids, kinds, strict=True):
        name = kind.decode() if isinstance(kind, bytes) else str(kind)
        if name not in ("hash", "none"):
            found[rid] = foreign_rollout(rid, keys.task(rid), name)
    return found


_ROLLOUT_ID = StreamField.ROLLOUT_ID.encode()
_foreign_seen = False


def entry_rollout_id(entry_id: bytes, fields: dict[bytes, bytes]) -> str | None:
    """The rollout id of a results entry; None for an entry rollq did not write (no rollout id, or one that is not
    UTF-8), which a reader that looks for ids skips: the first such entry of a process is logged. One garbage entry
    once made every wait over it raise (found by an outside audit)."""
    global _foreign_seen
    try:
        return fields[_ROLLOUT_ID].decode()
    except (KeyError, UnicodeDecodeError):
        if not _foreign_seen:
            _foreign_seen = True
            log.warning("skipped results entry %s: rollq did not write it (no UTF-8 rollout id)", entry_id.decode())
        return None


DELIVERED_LIMIT = 100_000
"""How many recent (rollout id, generation) pairs a reader remembers to skip second copies of."""


class Delivered:
    """The (rollout id, generation) pairs a reader has handed over, the most recent :data:`DELIVERED_LIMIT` of them.

    The results stream can hold one task's run twice, and a consumer group can hand an entry out twice: a
    failover can undo a finish a trainer had already read (the worker publishes again on the new primary: a
    second entry, measured in 7 of 17 failovers in issue 25), and it can roll back a group's read position.
    A reader passes each rollout through :meth:`first` and hands it over only when it is the first of its pair;
    a re-run after a dead-letter requeue has the next generation and is handed over. Sans-IO, shared by the
    sync and async readers.
    """

    def __init__(self, limit: int = DELIVERED_LIMIT) -> None:
        self.limit = limit
        self.duplicates = 0
        self._seen: dict[tuple[str, object], None] = {}  # insertion-ordered: the oldest go first

    def first(self, rollout: Rollout) -> bool:
        """Whether ``rollout`` is the first of its (rollout id, generation) this reader sees; counts the others."""
        key = (rollout.rollout_id, rollout.metadata.get("generation", 1))
        try:
            seen = key in self._seen
        except TypeError:
            # A generation rollq did not write (a list, a dict: found by an outside audit to crash every reader of
            # the group): handed over, as there is nothing to compare it with; never remembered.
            return True
        if seen:
            self.duplicates += 1
            log.info("skipped a second copy of rollout %s (generation %s)", key[0], key[1])
            return False
        self._seen[key] = None
        if len(self._seen) > self.limit:
            del self._seen[next(iter(self._seen))]
        return True


QUEUED_AFTER_LIMIT = 100_000
"""How many of the rollout ids it queued most recently a producer remembers the results stream's position for."""
RECENT_SECONDS = 10.0
"""A wait reads the stream from where its tasks were queued only if they were all queued at most this long ago:
older, it reads their records instead (the stream since then may hold much that is not the wait's)."""


SCAN_SLACK = 100
"""How many more results entries than it waits for a wait right after an enqueue reads from the stream before it
reads the tasks' records instead (:func:`_published_since`)."""


class QueuedAfter:
    """Where the results stream stood when a producer queued each of its most recent :data:`QUEUED_AFTER_LIMIT`
    rollout ids (``Lifecycle.enqueue_many_after``): every rollout of those tasks is published after it, so a wait
    for them soon after reads the records of only those tasks with an entry since then (one HGET a rollout less
    when a trainer waits right after it queues; issue 24)."""

    def __init__(self, limit: int = QUEUED_AFTER_LIMIT) -> None:
        self.limit = limit
        self._after: dict[str, tuple[bytes, float]] = {}  # insertion-ordered: the oldest go first

    def record(self, rollout_ids: Iterable[str], position: bytes) -> None:
        at = time.monotonic()
        for rid in rollout_ids:
            self._after.pop(rid, None)
            self._after[rid] = (position, at)
        while len(self._after) > self.limit:
            del self._after[next(iter(self._after))]

    def start_for(self, rollout_ids: Iterable[str]) -> bytes | None:
        """The earliest position any of ``rollout_ids`` was queued after; None unless all were queued here within
        the last :data:`RECENT_SECONDS`."""
        earliest: bytes | None = None
        oldest = time.monotonic() - RECENT_SECONDS
        for rid in rollout_ids:
            position, at = self._after.get(rid, (None, 0.0))
            if position is None or at < oldest:
                return None
            if earliest is None or _stream_id(position) < _stream_id(earliest):
                earliest = position
        return earliest


def _stream_id(entry_id: bytes) -> tuple[int, int]:
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq or 0)


def _published_since(
    connection: redis.Redis, keys: Keys, position: bytes, newest: bytes, got: _Collected
) -> set[str] | None:
    """The ids of ``got.missing`` with a results entry after ``position`` up to ``newest`` (the stream's newest
    entry); None when that cannot be told from the stream: it has not reached ``position`` (a failover can leave one
    that lacks it and publishes entries before it), or a trim has taken entries after ``position``; None too when
    more entries than :data:`SCAN_SLACK` beyond the missing ids' count came since (other producers' rollouts, which
    can be large: reading their records is cheaper than reading them)."""
    if _stream_id(newest) < _stream_id(position):
        return None
    found: set[str] = set()
    if newest == position:
        return found  # nothing published since: nothing ended, nothing trimmed past it
    start, budget = b"(" + position, len(got.missing) + SCAN_SLACK
    while True:
        count = min(1000, budget + 1)  # one more than the budget: reaching it means the records are read instead
        entries: Any = connection.xrange(keys.results, min=start, max=newest, count=count)
        budget -= len(entries)
        if budget < 0:
            return None
        for entry_id, fields in entries:
            rid = entry_rollout_id(entry_id, fields)
            if rid in got.missing:
                found.add(rid)
        if len(entries) < count:
            break
        start = b"(" + entries[-1][0]
    trimmed_to, damaged = _trimmed_to(connection, keys)
    if damaged or (trimmed_to and _stream_id(trimmed_to) > _stream_id(position)):
        return None
    return found


def _trim_hash_damaged(connection: redis.Redis, keys: Keys) -> None:
    """Log (once a minute) that the results trim hash holds another type: what trimming did cannot be read."""
    kind = cast(bytes, connection.type(keys.results_trim)).decode()
    report_damaged(
        foreign_key("results trim hash", keys.results_trim, kind, "hash"),
        "rollouts read all the same; the task records say which were trimmed",
    )


def _trimmed_to(connection: redis.Redis, keys: Keys) -> tuple[bytes | None, bool]:
    """The first results entry the last trim kept (None before any trim), and whether the trim hash holds another
    type than a hash (then a reader cannot tell what was trimmed: it reads the records, as after a trim). The
    publishing scripts skip such a hash and trim all the same; a reader's WRONGTYPE failed every wait."""
    try:
        return cast(bytes | None, connection.hget(keys.results_trim, TRIMMED_TO)), False
    except redis.ResponseError as exc:
        if not wrong_type(exc):
            raise
        _trim_hash_damaged(connection, keys)
        return None, True


class _Collected:
    """What ``wait`` has so far: rollouts found, ids trimmed, ids still missing."""

    def __init__(self, wanted: list[str]) -> None:
        self.wanted = wanted
        self.found: dict[str, Rollout] = {}
        self.entry_ids: dict[str, bytes] = {}
        """The results entry id each found rollout was read from."""
        self.trimmed: list[str] = []
        self.missing = set(wanted)

    def check_records(self, connection: redis.Redis, keys: Keys, only: set[str] | None = None) -> int:
        """Look up the missing ids' task records (``only``: of those ids alone): an ended task's rollout is read by
        its entry id, or found trimmed. Returns how many were settled."""
        ids = [rid for rid in self.wanted if rid in self.missing and (only is None or rid in only)]
        if not ids:
            return 0
        pipe = connection.pipeline(transaction=False)
        for rid in ids:
            pipe.hget(keys.task(rid), TaskField.RESULT)
        ended, foreign = result_ids_or_foreign(ids, pipe.execute(raise_on_error=False))
        settled = self._settle_foreign(connection, keys, foreign) if foreign else 0
        pipe = connection.pipeline(transaction=False)
        for entry_id in ended.values():
            pipe.xrange(keys.results, min=entry_id, max=entry_id)
        replies = pipe.execute()
        load_payloads(connection, [entries[0][1] for entries in replies if entries])
        for rid, entries in zip(ended, replies, strict=True):
            if entries and missing_payload(entries[0][1]) is None:
                self.found[rid] = parse_entry(entries[0][1])
                self.entry_ids[rid] = entries[0][0]
            else:
                self.trimmed.append(rid)
            self.missing.discard(rid)
        return len(ended) + settled

    def _settle_foreign(self, connection: redis.Redis, keys: Keys, rollout_ids: list[str]) -> int:
        """Settle each of ``rollout_ids``, whose task key holds no hash, with its :func:`foreign_rollout`."""
        pipe = connection.pipeline(transaction=False)
        for rid in rollout_ids:
            pipe.type(keys.task(rid))
        found = foreign_rollouts(keys, rollout_ids, pipe.execute())
        self.found.update(found)
        self.missing.difference_update(found)
        return len(found)


@dataclass(frozen=True)
class WaitResult:
    """What ``wait(..., partial=True)`` found: the finished rollouts in the order asked, the ids still missing,
    and the ids that ended but whose rollouts were trimmed from the stream before they were read."""

    finished: list[Rollout]
    missing: list[str]
    trimmed: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.missing and not self.trimmed


def wait(
    lifecycle: Lifecycle,
    rollout_ids: Sequence[str],
    timeout: float,
    *,
    results_maxlen: int,
    on_progress: Callable[[int], None] | None = None,
    after: bytes | None = None,
) -> list[Rollout]:
    """The rollouts of ``rollout_ids`` in that order, blocking on the stream until all are in.

    Raises :class:`RolloutTimeoutError` listing the missing ids after ``timeout``
    seconds, and :class:`RolloutTrimmedError` (with the rollouts received) when
    every task ended but some rollouts were trimmed from the stream before they
    were read. Redis outages are ridden out up to ``timeout``. ``on_progress(n)``
    is called as ``n`` more ids are settled. ``after``: a results stream position every one of ``rollout_ids``
    was queued after (:class:`QueuedAfter`); the stream is then read from there instead of the tasks' records.
    """
    got = _wait(
        lifecycle,
        rollout_ids,
        timeout,
        results_maxlen=results_maxlen,
        on_progress=on_progress,
        partial=False,
        after=after,
    )
    if got.trimmed:
        raise RolloutTrimmedError(got.trimmed, got.found)
    return [got.found[rid] for rid in got.wanted]


def collect(
    lifecycle: Lifecycle,
    rollout_ids: Sequence[str],
    timeout: float,
    *,
    results_maxlen: int,
    on_progress: Callable[[int], None] | None = None,
    after: bytes | None = None,
) -> WaitResult:
    """Like :func:`wait`, but at the timeout (or an outage that outlasts it) returns what finished and what is
    missing instead of raising; trimmed rollouts are listed, not raised."""
    got = _wait(
        lifecycle,
        rollout_ids,
        timeout,
        results_maxlen=results_maxlen,
        on_progress=on_progress,
        partial=True,
        after=after,
    )
    return WaitResult(
        [got.found[rid] for rid in got.wanted if rid in got.found],
        [rid for rid in got.wanted if rid in got.missing],
        list(got.trimmed),
    )


def _wait(
    lifecycle: Lifecycle,
    rollout_ids: Sequence[str],
    timeout: float,
    *,
    results_maxlen: int,
    on_progress: Callable[[int], None] | None,
    partial: bool,
    after: bytes | None = None,
) -> _Collected:
    connection, keys = lifecycle.connection, lifecycle.keys
    deadline = time.monotonic() + timeout
    got = _Collected(list(dict.fromkeys(rollout_ids)))
    cursor: bytes | None = None
    trim_seen: bytes | None = None
    outage = Outage("wait")
    helper = HelpingReaper(lifecycle, results_maxlen, "wait", within=REAP_EVERY_SECONDS)
    next_reap = time.monotonic() + REAP_EVERY_SECONDS
    while True:
        settled = 0
        try:
            if cursor is None:
                # The cursor is read before the records: whatever is published after this
                # point is read from the stream, whatever before it is found via its record.
                last: Any = connection.xrevrange(keys.results, count=1)
                cursor = last[0][0] if last else b"0-0"
                ended = _published_since(connection, keys, after, cursor, got) if after is not None else None
                # Every task waited for was queued after `after`: one with no entry since then has not ended (its
                # record holds no result), so only those with one need their records read, as any wait reads them.
                settled += got.check_records(connection, keys, only=ended)
                after = None  # after an outage, the records and the stream's newest entry as above
            remaining = deadline - time.monotonic()
            if got.missing and remaining <= 0:
                settled += got.check_records(connection, keys)
                if got.missing and partial:
                    break
                if got.missing:
                    raise RolloutTimeoutError([r for r in got.wanted if r in got.missing], timeout, got.trimmed)
            if not got.missing:
                break
            block_ms = max(1, int(min(remaining, REAP_EVERY_SECONDS) * 1000))
            reply: Any = connection.xread({keys.results: cursor}, count=1000, block=block_ms)
            for _, entries in reply or []:
                ids = [entry_rollout_id(entry_id, fields) for entry_id, fields in entries]
                load_payloads(connection, [f for rid, (_, f) in zip(ids, entries, strict=True) if rid in got.missing])
                for rid, (entry_id, fields) in zip(ids, entries, strict=True):
                    cursor = entry_id
                    if rid in got.missing and missing_payload(fields) is None:  # else trimmed: see below
                        got.found[rid] = parse_entry(fields)
                        got.missing.discard(rid)
                        settled += 1
            # Entries past the cursor trimmed before this reader got to them: their records say how they ended.
            trimmed_to, damaged = _trimmed_to(connection, keys)
            if damaged or (trimmed_to and trimmed_to != trim_seen and _stream_id(trimmed_to) > _stream_id(cursor)):
                trim_seen = trimmed_to
                settled += got.check_records(connection, keys)
            if time.monotonic() >= next_reap:
                helper.reap()
                next_reap = time.monotonic() + REAP_EVERY_SECONDS
            outage.over()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # After a failover the cursor may name an entry the new primary never had, and what it publishes
            # can sort before it: start again from its newest entry and the task records.
            cursor = None
            try:
                outage.failed(exc, deadline)
            except (redis.ConnectionError, redis.TimeoutError):
                if unrecoverable(exc) is not None:
                    raise
                if partial:
                    break
                error = RolloutTimeoutError([r for r in got.wanted if r in got.missing], timeout, got.trimmed)
                error.add_note(f"Redis has been unreachable for {time.monotonic() - (outage.since or 0):.0f}s: {exc}")
                raise error from exc
        if on_progress and settled:
            on_progress(settled)
    return got


def fetch_rollouts(connection: redis.Redis, keys: Keys, rollout_ids: Sequence[str]) -> dict[str, Rollout]:
    """The rollouts of those of ``rollout_ids`` that have finished, without blocking (two round trips).

    :class:`RolloutTrimmedError` (with the others) when an ended task's rollout was trimmed from the stream.
    """
    got = _Collected(list(dict.fromkeys(rollout_ids)))
    got.check_records(connection, keys)
    if got.trimmed:
        raise RolloutTrimmedError(got.trimmed, got.found)
    return got.found


def default_consumer_name() -> str:
    """``host-pid``: distinct per process, recognisable in XINFO output."""
    return f"{socket.gethostname()}-{os.getpid()}"


class ResultReader:
    """Iterate over finished rollouts as one member of a consumer group.

    Entries are fetched in batches and acknowledged when the reader fetches its
    next batch or the loop ends; if the process dies before that, another reader
    of the group claims them after ``claim_idle_seconds`` (at-least-once).
    Iteration stops after ``idle_timeout`` seconds with nothing new (None: never), or once ``limit`` rollouts
    were handed over: a reader with a limit never takes more entries off the group than it has left to hand over,
    so what it did not read stays with the group for its next reader rather than pending under this one.

    Trimming never removes an entry the group still needs, unless the stream hits
    its hard byte limit; then the reader raises :class:`RolloutsTrimmedError` (once
    per loss) saying how many it lost and from which entry on; iterating again
    goes on with what is left.
    """

    def __init__(
        self,
        connection: redis.Redis,
        keys: Keys,
        group: str,
        consumer: str | None = None,
        *,
        claim_idle_seconds: float = 60.0,
        idle_timeout: float | None = None,
        batch: int = 100,
        start: str = "0",
        limit: int | None = None,
    ) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1 (None: no limit), not {limit}")
        self.connection = connection
        self.keys = keys
        self.group = group
        self.consumer = consumer or default_consumer_name()
        self.claim_idle_ms = int(claim_idle_seconds * 1000)
        self.idle_timeout = idle_timeout
        self.batch = batch
        self.limit = limit
        self._handed = 0
        self._start = start
        self._unacked: list[bytes] = []
        self._next_claim_check = 0.0
        self._reported_lost = 0
        self._group_ready = False
        self.delivered = Delivered()

    def _ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            self.connection.xgroup_create(self.keys.results, self.group, id=self._start, mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    def _ack(self) -> None:
        if self._unacked:
            self.connection.xack(self.keys.results, self.group, *self._unacked)
            self._unacked = []

    def _claim_abandoned(self, force: bool = False) -> list[tuple[bytes, dict[bytes, bytes]]]:
        # Checked a few times per claim_idle period, so entries a dead reader left
        # are taken over even while new entries keep arriving.
        if not force and time.monotonic() < self._next_claim_check:
            return []
        self._next_claim_check = time.monotonic() + self.claim_idle_ms / 4000
        claimed: Any = self.connection.xautoclaim(
            self.keys.results, self.group, self.consumer, self.claim_idle_ms, count=self._wanted()
        )
        entries = [e for e in claimed[1] if e[1]]
        if entries:
            log.info("took over %d rollout(s) a dead reader of group %r left unacknowledged", len(entries), self.group)
        return entries

    def _check_lost(self) -> None:
        try:
            count, from_id = cast(
                list[bytes | None],
                self.connection.hmget(self.keys.results_trim, [f"count:{self.group}", f"from:{self.group}"]),
            )
        except redis.ResponseError as exc:  # a trim hash of another type: no loss can be counted there
            if not wrong_type(exc):
                raise
            _trim_hash_damaged(self.connection, self.keys)
            return
        lost = int(count or 0)
        if lost > self._reported_lost:
            new = lost - self._reported_lost
            self._reported_lost = lost
            raise RolloutsTrimmedError(self.group, new, (from_id or b"?").decode())

    def _wanted(self) -> int:
        """How many entries the next read may take: a batch, or what is left of the limit."""
        return self.batch if self.limit is None else max(1, min(self.batch, self.limit - self._handed))

    def _next_batch(self, block_ms: int) -> list[tuple[bytes, dict[bytes, bytes]]]:
        k = self.keys
        self._check_lost()
        # Our own unacknowledged entries first (a restart under the same name), then those of dead readers.
        mine: Any = self.connection.xreadgroup(self.group, self.consumer, {k.results: "0"}, count=self._wanted())
        entries = [e for _, es in mine or [] for e in es if e[1]] or self._claim_abandoned()
        if entries:
            return entries
        new: Any = self.connection.xreadgroup(
            self.group, self.consumer, {k.results: ">"}, count=self._wanted(), block=block_ms
        )
        return [e for _, es in new or [] for e in es]

    def __iter__(self) -> Iterator[Rollout]:
        outage = Outage(f"reader {self.consumer} of group {self.group!r}")
        idle_since = time.monotonic()
        try:
            while self.limit is None or self._handed < self.limit:
                try:
                    self._ensure_group()
                    self._ack()
                    block_s = 1.0 if self.idle_timeout is None else max(0.001, min(1.0, self.idle_timeout))
                    entries = self._next_batch(int(block_s * 1000))
                    outage.over()
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    # An outage counts as idle time: the reader gives up only where it would with Redis up.
                    outage.failed(exc, None if self.idle_timeout is None else idle_since + self.idle_timeout)
                    continue
                if not entries:
                    if self.idle_timeout is not None and time.monotonic() - idle_since >= self.idle_timeout:
                        entries = self._claim_abandoned(force=True)
                        if not entries:
                            return
                    else:
                        continue
                idle_since = time.monotonic()
                # Big rollouts' payloads are read as the batch is handed over, a few at a time (rollq.store.payloads).
                loading = loaded_one_by_one(self.connection, [fields for _, fields in entries])
                try:
                    for entry_id, _ in entries:
                        try:
                            fields = next(loading)
                        except (redis.ConnectionError, redis.TimeoutError) as exc:
                            # The rest of the batch is not acknowledged: read again from this reader's pending entries.
                            outage.failed(exc, None if self.idle_timeout is None else idle_since + self.idle_timeout)
                            break
                        self._unacked.append(entry_id)
                        if missing_payload(fields) is not None:
                            continue  # trimmed since it was delivered: counted for the group, raised by _check_lost
                        rollout = parse_entry(fields)
                        if self.delivered.first(rollout):  # a second copy is acknowledged, not handed over
                            self._handed += 1
                            yield rollout
                finally:
                    loading.close()  # gives its connection back to the pool
        finally:
            try:
                self._ack()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                # Not acknowledged: another reader takes them over after claim_idle_seconds.
                log.warning("could not acknowledge %d rollout(s): %s", len(self._unacked), exc)
