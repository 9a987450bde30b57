"""Training batches: complete groups read from the results stream, within a staleness bound.

``for batch in producer.batches(batch_size=16, max_staleness=1): ...`` hands the trainer batches of complete
groups in the order they complete (see :mod:`rollq.producer.groups` for advantages and failed members).

Reading is a Redis consumer group, so a trainer that restarts under the same ``consumer`` name gets back what
it had read but not yet trained on: a group's stream entries are acknowledged only when the trainer asks for the
batch after the one that held the group (or closes the reader); entries of dropped groups at once. Several
trainer processes share the stream by ``rank``/``world_size``: each reads every entry (one consumer group per
rank) and keeps the groups whose id hashes to its rank, so a group is never split across trainers. A consumer
group that does not exist yet starts where the results stream stood when the producer first queued a task (its
beginning, logged, for a producer that queued nothing), so a new group name or ``world_size`` is not handed
earlier runs' rollouts.

Counts of delivered, stale and failed groups go to the namespace's stats hash, where ``rollq status``,
``/metrics`` and the dashboard read them.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from rollq.models.contract import Rollout
from rollq.models.errors import InvalidTaskError, RollqError, UnknownTaskError
from rollq.models.groups import GROUP_FIELDS, membership
from rollq.models.outcomes import failed_rollout
from rollq.models.policy import TaskState
from rollq.store.connection import Outage
from rollq.store.payloads import load_payloads, missing_payload
from rollq.store.records import read_records
from rollq.store.stats import StatsField

from .groups import Group, GroupAssembler, GroupPolicy, version_number
from .results import _Collected, parse_entry

if TYPE_CHECKING:
    from .producer import Producer

log = logging.getLogger(__name__)

TRAINING_MODES: frozenset[str | None] = frozenset({"train", None})
"""The task modes whose rollouts :class:`BatchReader` hands over by default: ``"train"``, and tasks queued without
a mode (``"val"`` and ``"test"`` rollouts in the same namespace are acknowledged and left out)."""


class BatchTimeoutError(RollqError, TimeoutError):
    """No group to hand over within the batch timeout: none completed, or every one that did was dropped (stale,
    or with failed members under ``on_failure="drop"``); the counts say which."""

    def __init__(
        self, timeout: float, waiting: int, *, stale_dropped: int = 0, failed_dropped: int = 0, stale_requeued: int = 0
    ) -> None:
        dropped = stale_dropped + failed_dropped + stale_requeued
        why = (
            f": {dropped} complete group(s) dropped ({stale_dropped + stale_requeued} stale, {failed_dropped} with "
            f"failed members), {waiting} still incomplete"
            if dropped
            else f" ({waiting} group(s) still incomplete)"
        )
        super().__init__(f"no complete group within {timeout:g}s{why}")
        self.timeout = timeout
        self.waiting = waiting
        self.stale_dropped, self.failed_dropped, self.stale_requeued = stale_dropped, failed_dropped, stale_requeued


class ReaderBusyError(RollqError):
    """Another live reader reads batches under this consumer name: a second would be handed the same groups."""


class GroupLostError(RollqError):
    """A member of a group can no longer arrive: its task is gone, or its rollout was trimmed unread."""


@dataclass
class Batch:
    """Complete groups for one training step, and what was left out while it was assembled."""

    groups: list[Group]
    latest_version: int | None
    """The latest resources version (number) when the batch was handed over."""
    stale_dropped: int = 0
    stale_requeued: int = 0
    failed_dropped: int = 0
    partial: bool = False
    """True when the timeout passed with fewer than ``batch_size`` groups."""
    seconds: float = 0.0
    """How long the trainer waited for this batch."""

    @property
    def rollouts(self) -> list[Rollout]:
        return [r for g in self.groups for r in g.rollouts]

    @property
    def mean_reward(self) -> float | None:
        rewards = [r for g in self.groups for r in g.rewards if r is not None]
        return sum(rewards) / len(rewards) if rewards else None

    @property
    def max_staleness(self) -> int | None:
        known = [s for g in self.groups if (s := g.staleness(self.latest_version)) is not None]
        return max(known) if known else None


@dataclass
class _Counts:
    delivered: int = 0
    stale_dropped: int = 0
    stale_requeued: int = 0
    failed_dropped: int = 0
    entries: list[bytes] = field(default_factory=list)


class BatchReader:
    """Iterates over :class:`Batch` es; see :meth:`rollq.producer.Producer.batches`."""

    def __init__(
        self,
        producer: Producer,
        *,
        batch_size: int,
        max_staleness: int | None = None,
        timeout: float | None = None,
        policy: GroupPolicy | None = None,
        group: str = "batches",
        consumer: str | None = None,
        rank: int = 0,
        world_size: int = 1,
        read_count: int = 200,
        start: str | None = None,
        modes: Collection[str | None] | None = TRAINING_MODES,
        claim_timeout: float = 30.0,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if max_staleness is not None and max_staleness < 0:
            raise ValueError("max_staleness must be 0 or more (None: no bound)")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size})")
        self.producer = producer
        self.connection: redis.Redis = producer.connection
        self.keys = producer.keys
        self.batch_size = batch_size
        self.max_staleness = max_staleness
        self.timeout = timeout
        self.assembler = GroupAssembler(policy)
        self.policy = self.assembler.policy
        self.rank, self.world_size = rank, world_size
        self.group = group if world_size == 1 else f"{group}.rank{rank}"
        self.consumer = consumer or f"{self.group}-consumer"
        self.read_count = read_count
        self.start = start
        self.modes = None if modes is None else frozenset(modes)
        self.claim_timeout = claim_timeout
        self._skipped_modes: set[str | None] = set()
        self._entries: dict[str, list[bytes]] = {}
        self._to_ack: list[bytes] = []
        self._handed: list[bytes] = []  # entries of the batch last handed over
        self._ready: list[Group] = []
        self._pending_cursor: str | None = "0"  # our own unacknowledged entries first (a restart)
        self._group_ready = False
        self._outage = Outage(f"batches reader {self.consumer}")
        self._claim: _Claim | None = None

    # -- reading -------------------------------------------------------------------------------------------------
    def _ensure_group(self) -> None:
        if self._claim is None:
            self._claim = _Claim.take(self, self.claim_timeout)
        if self._group_ready:
            return
        first = self.producer.first_queued_after
        start = self.start or (first.decode() if first is not None else "0")
        try:
            self.connection.xgroup_create(self.keys.results, self.group, id=start, mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        else:
            try:
                self.connection.set(self.keys.batch_start(self.group), self._last_delivered())
            except redis.ResponseError as exc:  # a full Redis: duplicates of older entries count as new
                log.warning("could not record where consumer group %r starts: %s", self.group, exc)
            if self.start is None and first is None and (held := int(self.connection.xlen(self.keys.results))):
                log.warning(
                    "consumer group %r is new and this producer has queued nothing: it reads the %d rollout(s) "
                    "already in the results stream, earlier runs' included (batches(start='$') reads only what is "
                    "published from now on)",
                    self.group,
                    held,
                )
        self._group_ready = True

    def _read(self, block_ms: int) -> list[tuple[bytes, dict[bytes, bytes]]]:
        stream = self.keys.results
        if self._pending_cursor is not None:
            mine: Any = self.connection.xreadgroup(
                self.group, self.consumer, {stream: self._pending_cursor}, count=self.read_count
            )
            entries = [e for _, es in mine or [] for e in es]
            if entries:
                self._pending_cursor = entries[-1][0].decode()
                return entries
            self._pending_cursor = None
        new: Any = self.connection.xreadgroup(
            self.group, self.consumer, {stream: ">"}, count=self.read_count, block=max(1, block_ms)
        )
        return [e for _, es in new or [] for e in es]

    def _mine(self, group_id: str) -> bool:
        return self.world_size == 1 or zlib.crc32(group_id.encode()) % self.world_size == self.rank

    def _take(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        load_payloads(self.connection, [fields for _, fields in entries])  # one MGET for the big ones
        for entry_id, fields in entries:
            if not fields or missing_payload(fields) is not None:  # trimmed while pending
                self._to_ack.append(entry_id)
                continue
            rollout = parse_entry(fields)
            mode = rollout.metadata.get("mode")
            if self.modes is not None and mode not in self.modes:  # a validation rollout: not trained on
                self._to_ack.append(entry_id)
                if mode not in self._skipped_modes:
                    self._skipped_modes.add(mode)
                    log.info("reader %s: rollouts of mode %r are not trained on (batches(modes=...))", self.group, mode)
                continue
            found = membership(rollout.rollout_id, rollout.metadata)
            group_id = found.group_id if found is not None else rollout.rollout_id
            if not self._mine(group_id):
                self._to_ack.append(entry_id)
                continue
            complete = self.assembler.add(rollout)
            if complete is None and group_id not in self.assembler._pending:
                # A duplicate of a member of a group already complete: this entry alone is done with. The
                # group's own entries are acknowledged with its batch (or when it is dropped), not before.
                self._to_ack.append(entry_id)
                continue
            self._entries.setdefault(group_id, []).append(entry_id)
            if complete is not None:
                self._ready.append(complete)

    def _look_up_overdue(self) -> None:
        for group_id, missing in self.assembler.overdue():
            got = _Collected(missing)
            got.check_records(self.connection, self.keys)
            if self._consumed(list(got.entry_ids.values())):
                # A member this consumer group read and acknowledged before (the trainer restarted since): the
                # group was handed over or dropped then, and what arrived now is a duplicate.
                log.warning("group %s: settled before this reader started; its late duplicate is left out", group_id)
                self._to_ack += self._entries.pop(group_id, [])
                self.assembler.settled(group_id)
                continue
            for rollout in got.found.values():
                complete = self.assembler.add(rollout)
                if complete is not None:
                    self._ready.append(complete)
            still = [rid for rid in missing if rid not in got.found]
            records = read_records(self.connection, self.keys, still) if still else {}
            running = [rid for rid in still if rid in records and records[rid].state in _UNFINISHED]
            gone = [rid for rid in still if rid not in running]
            if gone:
                why = {rid: "trimmed unread" if rid in got.trimmed else "its task no longer exists" for rid in gone}
                log.warning("group %s: %d member(s) lost (%s)", group_id, len(gone), "; ".join(why.values()))
                lost = [
                    failed_rollout(rid, attempt=0, worker="", error=GroupLostError(f"member {rid}: {why[rid]}"))
                    for rid in gone
                ]
                complete = self.assembler.lost(group_id, lost)
                if complete is not None:
                    self._ready.append(complete)

    def _last_delivered(self) -> str:
        for info in self.connection.xinfo_groups(self.keys.results):
            if _text(info["name"]) == self.group:
                return _text(info["last-delivered-id"])
        return "0-0"

    def _consumed(self, entry_ids: list[bytes]) -> bool:
        """Whether this consumer group has read and acknowledged any of ``entry_ids``."""
        if not entry_ids:
            return False
        delivered = _stream_id(self._last_delivered())
        began = self.connection.get(self.keys.batch_start(self.group))
        start = _stream_id(began) if isinstance(began, bytes) else (0, 0)
        for entry_id in entry_ids:
            if start < _stream_id(entry_id) <= delivered and not self.connection.xpending_range(
                self.keys.results, self.group, min=entry_id, max=entry_id, count=1
            ):
                return True
        return False

    # -- deciding ------------------------------------------------------------------------------------------------
    def _latest(self) -> int | None:
        raw = self.connection.get(self.keys.resources_latest)
        return version_number(raw.decode()) if isinstance(raw, bytes) else None

    def _judge(self, group: Group, latest: int | None, counts: _Counts) -> bool:
        """Whether ``group`` goes into the batch; dropped and requeued groups are counted and acknowledged."""
        entries = self._entries.pop(group.group_id, [])
        staleness = group.staleness(latest)
        if self.max_staleness is not None and staleness is not None and staleness > self.max_staleness:
            self._to_ack += entries
            if self.policy.on_stale == "requeue" and self._requeue(group):
                counts.stale_requeued += 1
            else:
                counts.stale_dropped += 1
            return False
        if group.any_failed and self.policy.on_failure == "drop":
            self._to_ack += entries
            counts.failed_dropped += 1
            return False
        counts.entries += entries
        counts.delivered += 1
        return True

    def _requeue(self, group: Group) -> bool:
        first = group.rollouts[0].rollout_id
        try:
            record = read_records(self.connection, self.keys, [first])[first]
        except (KeyError, UnknownTaskError, InvalidTaskError):
            log.warning("stale group %s cannot be requeued: its task record is gone; dropped", group.group_id)
            return False
        task = record.task
        metadata = {k: v for k, v in task.metadata.items() if k not in GROUP_FIELDS}
        self.producer.enqueue_many(
            [task.input],
            mode=task.mode,
            metadata=metadata,
            group_size=len(group.rollouts),
            resources_id=None,
            policy=record.policy,  # the task's own timeout and attempts, not the producer's defaults
        )
        return True

    def _flush(self, counts: _Counts | None = None) -> None:
        """Acknowledge what is done with, and add ``counts`` to the namespace's stats, in one round trip."""
        pipe = self.connection.pipeline(transaction=False)
        for name, value in (
            (StatsField.GROUPS_DELIVERED, counts.delivered if counts else 0),
            (StatsField.GROUPS_STALE_DROPPED, counts.stale_dropped if counts else 0),
            (StatsField.GROUPS_STALE_REQUEUED, counts.stale_requeued if counts else 0),
            (StatsField.GROUPS_FAILED_DROPPED, counts.failed_dropped if counts else 0),
        ):
            if value:
                pipe.hincrby(self.keys.stats, name.value, value)
        if self._to_ack:
            pipe.xack(self.keys.results, self.group, *self._to_ack)
        pipe.execute()
        self._to_ack = []

    # -- the iterator --------------------------------------------------------------------------------------------
    def next_batch(self) -> Batch:
        """The next batch; :class:`BatchTimeoutError` if not one group completed within the timeout.

        Asking for it acknowledges the groups of the batch before: the trainer is done with them.
        """
        start = time.monotonic()
        deadline = None if self.timeout is None else start + self.timeout
        self._to_ack += self._handed
        self._handed = []
        counts = _Counts()
        chosen: list[Group] = []
        latest: int | None = None
        next_word = start + _QUIET_WAIT
        while True:
            try:
                self._ensure_group()
                if self._to_ack:
                    self._flush()
                remaining_ms = 1000 if deadline is None else int(max(0.0, deadline - time.monotonic()) * 1000)
                if not self._ready:
                    self._take(self._read(min(1000, remaining_ms)))
                    self._look_up_overdue()
                if self._ready:
                    latest = self._latest()
                    while self._ready and len(chosen) < self.batch_size:
                        group = self._ready.pop(0)
                        if self._judge(group, latest, counts):
                            chosen.append(group)
                self._outage.over()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._outage.failed(exc, deadline)
                continue
            if len(chosen) >= self.batch_size or (deadline is not None and time.monotonic() >= deadline):
                break
            if not chosen and time.monotonic() >= next_word:
                next_word = time.monotonic() + _QUIET_WAIT
                log.warning(
                    "reader %s: no group to hand over for %.0fs: %d still incomplete; dropped meanwhile: %d stale, "
                    "%d with failed members (requeued: %d)",
                    self.group,
                    time.monotonic() - start,
                    self.assembler.waiting,
                    counts.stale_dropped,
                    counts.failed_dropped,
                    counts.stale_requeued,
                )
        self._handed = counts.entries
        try:
            self._flush(counts)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("could not record batch counts: %s", exc)
        if not chosen:
            raise BatchTimeoutError(
                self.timeout or 0.0,
                self.assembler.waiting,
                stale_dropped=counts.stale_dropped,
                failed_dropped=counts.failed_dropped,
                stale_requeued=counts.stale_requeued,
            )
        return Batch(
            groups=chosen,
            latest_version=latest,
            stale_dropped=counts.stale_dropped,
            stale_requeued=counts.stale_requeued,
            failed_dropped=counts.failed_dropped,
            partial=len(chosen) < self.batch_size,
            seconds=time.monotonic() - start,
        )

    def __iter__(self) -> Iterator[Batch]:
        try:
            while True:
                yield self.next_batch()
        finally:
            self.close()

    def close(self) -> None:
        """Acknowledge what was handed over; groups still incomplete stay pending for a restart under this name."""
        self._to_ack += self._handed
        self._handed = []
        try:
            if self._to_ack:
                self._flush()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("could not acknowledge %d entries: %s", len(self._to_ack), exc)
        self._release()

    def _release(self) -> None:
        claim, self._claim = getattr(self, "_claim", None), None  # None: __init__ refused its arguments
        if claim is not None:
            claim.release()

    def __del__(self) -> None:
        self._release()


_CLAIM_SECONDS = 10.0
"""How long a reader's claim on its consumer name outlives its last renewal (renewed every quarter of it): a
trainer that died frees its name that long after, for its restart."""

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0
"""
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
_TAKE_OVER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) and 1 or 0 end
return 0
"""
_HOLDER = re.compile(r"^(?P<host>\S+) pid (?P<pid>\d+) ns (?P<ns>\d+) \S+$")


def _pid_namespace() -> str:
    """This process's PID namespace (its inode), so that a PID is compared only with PIDs of the same namespace: two
    containers may share a host name, never a namespace; "?" where there is no /proc."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "?"


def _gone_from_here(holder: str) -> bool:
    """Whether a claim's ``holder`` names a process of this host and PID namespace that no longer runs (a trainer
    that died and is restarted here). Any doubt (another host, a PID in use, no /proc) is False: the lease lapses."""
    found = _HOLDER.match(holder)
    if found is None or found["host"] != socket.gethostname() or found["ns"] != _pid_namespace():
        return False
    try:
        os.kill(int(found["pid"]), 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # PermissionError: a process of another user runs under that PID
        return False
    return False


class _Claim:
    """A reader's hold on its ``(group, consumer)`` name: a key with a lease a daemon thread renews. Two readers
    under one name would share its pending entries, so each would be handed the groups the other is training on."""

    def __init__(self, connection: redis.Redis, key: str, token: str) -> None:
        self.connection, self.key, self.token = connection, key, token
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"rollq-claim-{key}", daemon=True)
        self._thread.start()

    @classmethod
    def take(cls, reader: BatchReader, timeout: float) -> _Claim:
        key = reader.keys.batch_reader(reader.group, reader.consumer)
        token = f"{socket.gethostname()} pid {os.getpid()} ns {_pid_namespace()} {uuid.uuid4().hex[:8]}"
        px = round(_CLAIM_SECONDS * 1000)
        deadline = time.monotonic() + timeout
        said = False
        while not reader.connection.set(key, token, nx=True, px=px):
            raw = reader.connection.get(key)
            holder = raw.decode(errors="replace") if isinstance(raw, bytes) else "its holder just ended"
            if (
                isinstance(raw, bytes)
                and _gone_from_here(holder)
                and reader.connection.eval(_TAKE_OVER, 1, key, raw, token, px)
            ):
                # A trainer restarted on the machine where it died: its name is free now, not when the lease lapses.
                log.info("reader %s: consumer %r was held by %s, which has ended; taken over", reader.group,
                         reader.consumer, holder)  # fmt: skip
                break
            if time.monotonic() >= deadline:
                raise ReaderBusyError(
                    f"another trainer reads batches as consumer {reader.consumer!r} of group {reader.group!r} "
                    f"({holder}): a second "
                    "reader under that name would be handed the groups it is training on. Give each trainer process "
                    "its rank: batches(..., rank=r, world_size=n); or a group name of its own to read every group "
                    "again"
                )
            if not said:
                said = True
                log.warning(
                    "reader %s: consumer %r is held by %s; waiting up to %gs for it to end (a trainer that died frees "
                    "it within %gs)",
                    reader.group,
                    reader.consumer,
                    holder,
                    timeout,
                    _CLAIM_SECONDS,
                )
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        return cls(reader.connection, key, token)

    def _renew(self) -> None:
        px = round(_CLAIM_SECONDS * 1000)
        while not self._stop.wait(_CLAIM_SECONDS / 4):
            try:
                if not self.connection.eval(_RENEW, 1, self.key, self.token, px):
                    log.error("batches reader lost its claim on %s to another reader; it goes on reading", self.key)
            except redis.RedisError as exc:
                log.warning("could not renew the claim on %s: %s", self.key, exc)

    def release(self) -> None:
        self._stop.set()
        try:
            self.connection.eval(_RELEASE, 1, self.key, self.token)
        except redis.RedisError as exc:
            log.warning("could not release the claim on %s (it lapses in %gs): %s", self.key, _CLAIM_SECONDS, exc)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _stream_id(value: bytes | str) -> tuple[int, int]:
    ms, _, seq = _text(value).partition("-")
    return int(ms), int(seq or 0)


_UNFINISHED = (TaskState.QUEUED, TaskState.RUNNING)
_QUIET_WAIT = 60.0
"""Seconds a reader waits with no group to hand over before it logs what it is waiting on (then as often)."""
