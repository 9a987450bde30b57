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
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import redis

from rollq.models.contract import Rollout
from rollq.models.errors import RolloutsTrimmedError, RolloutTimeoutError, RolloutTrimmedError
from rollq.store.keys import Keys, StreamField, TaskField
from rollq.store.reaper import reap
from rollq.store.transitions import Lifecycle

log = logging.getLogger(__name__)

# Producers reap too, so that a run with every worker gone still ends: stale
# attempts fail or requeue instead of being waited on forever.
REAP_EVERY_SECONDS = 5.0


def _parse(fields: dict[bytes, bytes]) -> Rollout:
    return Rollout.model_validate_json(fields[StreamField.ROLLOUT.encode()])


def wait(
    lifecycle: Lifecycle,
    rollout_ids: Sequence[str],
    timeout: float,
    *,
    results_maxlen: int,
    on_progress: Callable[[int], None] | None = None,
) -> list[Rollout]:
    """The rollouts of ``rollout_ids`` in that order, blocking on the stream until all are in.

    Raises :class:`RolloutTimeoutError` listing the missing ids after ``timeout`` seconds.
    ``on_progress(n)`` is called as ``n`` more rollouts arrive.
    """
    connection, keys = lifecycle.connection, lifecycle.keys
    deadline = time.monotonic() + timeout
    wanted = list(dict.fromkeys(rollout_ids))
    # The cursor is read before the records: whatever is published after this
    # point is read from the stream, whatever before it is found via its record.
    pipe = connection.pipeline(transaction=False)
    pipe.xrevrange(keys.results, count=1)
    for rid in wanted:
        pipe.hget(keys.task(rid), TaskField.RESULT)
    last, *entry_ids = pipe.execute()
    cursor = last[0][0] if last else b"0-0"
    found = _fetch_known(connection, keys, {rid: eid for rid, eid in zip(wanted, entry_ids, strict=True) if eid})
    if on_progress and found:
        on_progress(len(found))
    missing = {rid for rid in wanted if rid not in found}
    next_reap = time.monotonic() + REAP_EVERY_SECONDS
    while missing:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RolloutTimeoutError([rid for rid in wanted if rid in missing], timeout)
        block_ms = max(1, int(min(remaining, REAP_EVERY_SECONDS) * 1000))
        reply: Any = connection.xread({keys.results: cursor}, count=1000, block=block_ms)
        arrived = 0
        for _, entries in reply or []:
            for entry_id, fields in entries:
                cursor = entry_id
                rid = fields[StreamField.ROLLOUT_ID.encode()].decode()
                if rid in missing:
                    found[rid] = _parse(fields)
                    missing.discard(rid)
                    arrived += 1
        if on_progress and arrived:
            on_progress(arrived)
        if time.monotonic() >= next_reap:
            reap(lifecycle, now=time.time(), results_maxlen=results_maxlen)
            next_reap = time.monotonic() + REAP_EVERY_SECONDS
    return [found[rid] for rid in wanted]


def _fetch_known(connection: redis.Redis, keys: Keys, entry_ids: dict[str, bytes]) -> dict[str, Rollout]:
    pipe = connection.pipeline(transaction=False)
    for entry_id in entry_ids.values():
        pipe.xrange(keys.results, min=entry_id, max=entry_id)
    found: dict[str, Rollout] = {}
    for rid, entries in zip(entry_ids, pipe.execute(), strict=True):
        if not entries:
            raise RolloutTrimmedError(rid)
        found[rid] = _parse(entries[0][1])
    return found


def default_consumer_name() -> str:
    """``host-pid``: distinct per process, recognisable in XINFO output."""
    return f"{socket.gethostname()}-{os.getpid()}"


class ResultReader:
    """Iterate over finished rollouts as one member of a consumer group.

    Entries are fetched in batches and acknowledged when the reader fetches its
    next batch or the loop ends; if the process dies before that, another reader
    of the group claims them after ``claim_idle_seconds`` (at-least-once).
    Iteration stops after ``idle_timeout`` seconds with nothing new (None: never).

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
    ) -> None:
        self.connection = connection
        self.keys = keys
        self.group = group
        self.consumer = consumer or default_consumer_name()
        self.claim_idle_ms = int(claim_idle_seconds * 1000)
        self.idle_timeout = idle_timeout
        self.batch = batch
        self._start = start
        self._unacked: list[bytes] = []
        self._next_claim_check = 0.0
        self._reported_lost = 0

    def _ensure_group(self) -> None:
        try:
            self.connection.xgroup_create(self.keys.results, self.group, id=self._start, mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

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
            self.keys.results, self.group, self.consumer, self.claim_idle_ms, count=self.batch
        )
        entries = [e for e in claimed[1] if e[1]]
        if entries:
            log.info("took over %d rollout(s) a dead reader of group %r left unacknowledged", len(entries), self.group)
        return entries

    def _check_lost(self) -> None:
        count, from_id = cast(
            list[bytes | None],
            self.connection.hmget(self.keys.results_trim, [f"count:{self.group}", f"from:{self.group}"]),
        )
        lost = int(count or 0)
        if lost > self._reported_lost:
            new = lost - self._reported_lost
            self._reported_lost = lost
            raise RolloutsTrimmedError(self.group, new, (from_id or b"?").decode())

    def _next_batch(self, block_ms: int) -> list[tuple[bytes, dict[bytes, bytes]]]:
        k = self.keys
        self._check_lost()
        # Our own unacknowledged entries first (a restart under the same name), then those of dead readers.
        mine: Any = self.connection.xreadgroup(self.group, self.consumer, {k.results: "0"}, count=self.batch)
        entries = [e for _, es in mine or [] for e in es if e[1]] or self._claim_abandoned()
        if entries:
            return entries
        new: Any = self.connection.xreadgroup(
            self.group, self.consumer, {k.results: ">"}, count=self.batch, block=block_ms
        )
        return [e for _, es in new or [] for e in es]

    def __iter__(self) -> Iterator[Rollout]:
        self._ensure_group()
        idle_since = time.monotonic()
        try:
            while True:
                self._ack()
                block_s = 1.0 if self.idle_timeout is None else max(0.001, min(1.0, self.idle_timeout))
                entries = self._next_batch(int(block_s * 1000))
                if not entries:
                    if self.idle_timeout is not None and time.monotonic() - idle_since >= self.idle_timeout:
                        entries = self._claim_abandoned(force=True)
                        if not entries:
                            return
                    else:
                        continue
                idle_since = time.monotonic()
                for entry_id, fields in entries:
                    self._unacked.append(entry_id)
                    yield _parse(fields)
        finally:
            self._ack()
