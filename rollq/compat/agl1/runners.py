"""The attempts ``serve-agl`` hands to external runners (AL's ``agl-controller``): their ids, tokens and leases.

AL 1.0.2's controller knows nothing of attempts: it lists ``GET /api/rollouts?state_in=queuing``, spawns the
agent with URLs built from the ``rollout_id`` it was shown (and attempt ``"0"``), PATCHes ``running``, and
later PATCHes ``succeeded``/``failed``, all with that id. So the token travels inside the listed id:

- a queued rollout is listed as ``<rollout_id>.<token>``, the token (:mod:`rollq.compat.tokens`, 16 hex
  digits, so AL's Kubernetes job names ``agl-rollout-<id>`` stay within 63 characters) being that of the
  attempt its next claim makes; ``PATCH .../<id>.<token>`` to ``running`` claims exactly that attempt;
- every later write for it (PATCH, ``.../attempt/{a}/events``, the proxy route) needs the token of the
  attempt that is current and was claimed through ``serve-agl``: a bare id, a forged token, the token of an
  earlier attempt, or one for an attempt a rollq worker runs is refused (403, counted as
  ``gateway:refused``) and nothing is stored;
- a running attempt is listed with its token only to the client address that claimed it (others see the
  bare id), so a listing does not give away the token of an attempt someone else runs.

Leases: a claim holds its attempt for ``lease_seconds``; every accepted write and every listing by the
claimant that shows it extends the lease, never beyond the task's ``timeout_seconds`` plus a grace. A lease
that ends is handed back by whichever ``serve-agl`` of the namespace sees it first: queued again at the
front with the attempt given back (``released``), at most ``max_releases`` times per rollout (then the
reaper charges it, as for a dead worker). One client address holds at most ``max_held_per_client``
leases: past that its claims are refused (429). Everything is in Redis, so any number of servers share it.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import redis

from rollq.models.errors import AttemptTokenError
from rollq.store.keys import inflight_member
from rollq.store.records import TaskRecord
from rollq.store.replies import Requeued
from rollq.store.stats import StatsField
from rollq.store.transitions import Lifecycle

from ..tokens import AttemptTokens
from .keys import Agl1Keys

log = logging.getLogger(__name__)

TOKEN_HEX_DIGITS = 16
TOKEN_SEPARATOR = "."
_TOKENED = re.compile(r"^(?P<rollout_id>.+)\.(?P<token>[0-9a-f]{16})$", re.DOTALL)
RUNNER_NAME = "agl-controller"
"""The worker name of attempts claimed by an external runner through ``PATCH ... running``."""
RUNNER_GRACE_SECONDS = 60.0
"""A runner's lease never outlasts the task's ``timeout_seconds`` by more than this."""
_MARGIN_SECONDS = 15.0  # the reaper's deadline trails the lease, so the hand-back comes first


class HeldTooMany(Exception):
    """A client asks for another attempt while holding ``max_held_per_client`` (429)."""


@dataclass(frozen=True)
class Tokened:
    rollout_id: str
    token: str


def split(value: str) -> Tokened | None:
    """The rollout id and token of an id as ``serve-agl`` lists it; None for a bare id."""
    found = _TOKENED.match(value)
    return Tokened(found["rollout_id"], found["token"]) if found else None


def bare(value: str) -> str:
    """The rollout id an id names, with or without a token."""
    found = split(value)
    return found.rollout_id if found else value


@dataclass(frozen=True)
class LeaseSettings:
    lease_seconds: float = 300.0
    max_held_per_client: int = 256
    max_releases: int = 3

    def __post_init__(self) -> None:
        if self.lease_seconds <= 0 or self.max_held_per_client < 1 or self.max_releases < 0:
            raise ValueError("lease_seconds must be > 0, max_held_per_client >= 1 and max_releases >= 0")


class RunnerAttempts:
    """Tokens and leases of the attempts external runners take (blocking Redis calls, thread-safe)."""

    def __init__(
        self, connection: redis.Redis, agl: Agl1Keys, lifecycle: Lifecycle, settings: LeaseSettings | None = None
    ) -> None:
        self.connection, self.agl, self.lifecycle = connection, agl, lifecycle
        self.keys = agl.keys
        self.settings = settings or LeaseSettings()
        self.tokens = AttemptTokens(connection, self.keys, TOKEN_HEX_DIGITS)

    # -- ids -----------------------------------------------------------------------------------

    def listed_id(self, record: TaskRecord, client: str) -> str:
        """The id a client is shown for ``record``: with the token of its next attempt while it is queued, of
        its current attempt when that client claimed it; bare otherwise."""
        rid = record.task.rollout_id
        if record.state == "queued":
            return f"{rid}{TOKEN_SEPARATOR}{self.tokens.token(rid, (record.task.num_claims or 0) + 1)}"
        if record.state == "running" and self._runner_attempt(record) and self.claimant(record) == client:
            self.extend(record)
            return f"{rid}{TOKEN_SEPARATOR}{self.tokens.token(rid, record.attempt)}"
        return rid

    def _runner_attempt(self, record: TaskRecord) -> bool:
        return record.state == "running" and (record.worker or "") == RUNNER_NAME

    def claimant(self, record: TaskRecord) -> str | None:
        raw = self.connection.hget(self.agl.claimants, inflight_member(record.task.rollout_id, record.attempt))
        return cast(bytes, raw).decode() if raw else None

    def refuse(self, message: str) -> AttemptTokenError:
        self.tokens.refused()
        return AttemptTokenError(message)

    def check_next(self, record: TaskRecord, token: str) -> int:
        """The attempt a claim with ``token`` makes (the task is queued); AttemptTokenError (counted) if the token
        is not that attempt's."""
        attempt = (record.task.num_claims or 0) + 1
        if not self.tokens.matches(record.task.rollout_id, attempt, token):
            raise self.refuse(self._mismatch(record, token, attempt))
        return attempt

    def check_current(self, record: TaskRecord, token: str | None, what: str) -> None:
        """AttemptTokenError (counted) unless ``token`` is that of the running attempt a runner claimed here."""
        rid = record.task.rollout_id
        if token is None:
            raise self.refuse(f"{what} for {rid} needs the id serve-agl listed it with (<rollout_id>.<token>)")
        if not self._runner_attempt(record):
            raise self.refuse(
                f"{what} for {rid} is refused: it is {record.state}"
                + (f", run by {record.worker}" if record.state == "running" else "")
                + "; no attempt of it was handed out with this token"
            )
        if not self.tokens.matches(rid, record.attempt, token):
            raise self.refuse(self._mismatch(record, token, record.attempt))

    def _mismatch(self, record: TaskRecord, token: str, expected: int) -> str:
        rid = record.task.rollout_id
        last = max(expected, record.task.num_claims or 0) + 1
        other = next((n for n in range(1, last) if n != expected and self.tokens.matches(rid, n, token)), None)
        if other is not None:
            return f"the token is that of attempt {other} of {rid}, not of attempt {expected}; refused"
        return f"attempt {expected} of {rid} was not handed out with this token; refused"

    # -- leases --------------------------------------------------------------------------------

    def hold(self, record: TaskRecord, client: str) -> None:
        """Refuse (:class:`HeldTooMany`) a client that already holds its share of leases."""
        held = self.agl.held(client)
        pipe = self.connection.pipeline(transaction=False)
        pipe.zremrangebyscore(held, "-inf", time.time())
        pipe.zcard(held)
        _, count = pipe.execute()
        if int(count) >= self.settings.max_held_per_client:
            log.warning("client %s holds %d unfinished attempts; its claim of %s is refused", client, count, record)
            raise HeldTooMany(
                f"this client holds {count} unfinished attempts (--max-held {self.settings.max_held_per_client}); "
                "finish one first"
            )

    def leased(self, rollout_id: str, attempt: int, timeout_seconds: float, client: str) -> None:
        """Start the lease of an attempt just claimed for ``client``."""
        member = inflight_member(rollout_id, attempt)
        now = time.time()
        hard = now + timeout_seconds + RUNNER_GRACE_SECONDS
        until = min(now + self.settings.lease_seconds, hard)
        pipe = self.connection.pipeline(transaction=False)
        pipe.zadd(self.agl.leases, {member: until})
        pipe.hset(self.agl.lease_limits, member, hard)
        pipe.hset(self.agl.claimants, member, client)
        pipe.zadd(self.agl.held(client), {member: until})
        pipe.execute()
        self.lifecycle.beat({member: until - now + _MARGIN_SECONDS})

    def extend(self, record: TaskRecord) -> None:
        """Renew the lease of the running runner attempt of ``record`` (a write or listing showed it alive)."""
        member = inflight_member(record.task.rollout_id, record.attempt)
        pipe = self.connection.pipeline(transaction=False)
        pipe.hget(self.agl.lease_limits, member)
        pipe.hget(self.agl.claimants, member)
        pipe.zscore(self.agl.leases, member)
        hard_raw, client_raw, current = pipe.execute()
        if hard_raw is None or client_raw is None or current is None:
            return  # released or finished meanwhile
        now = time.time()
        until = min(now + self.settings.lease_seconds, float(hard_raw))
        if until <= float(current):
            return
        pipe = self.connection.pipeline(transaction=False)
        pipe.zadd(self.agl.leases, {member: until}, xx=True)
        pipe.zadd(self.agl.held(client_raw.decode()), {member: until}, xx=True)
        pipe.execute()
        self.lifecycle.beat({member: until - now + _MARGIN_SECONDS})

    def ended(self, rollout_id: str, attempt: int) -> None:
        """Forget the lease of an attempt that finished (or was handed back)."""
        member = inflight_member(rollout_id, attempt)
        client = self.connection.hget(self.agl.claimants, member)
        pipe = self.connection.pipeline(transaction=False)
        pipe.zrem(self.agl.leases, member)
        pipe.hdel(self.agl.lease_limits, member)
        pipe.hdel(self.agl.claimants, member)
        if client:
            pipe.zrem(self.agl.held(cast(bytes, client).decode()), member)
        pipe.execute()

    def release_expired(self, read: Callable[[str], TaskRecord | None]) -> int:
        """Hand back the attempts whose lease ended (each by the one server whose ZREM took it); ``read`` gives
        a task's record. Returns how many went back to the queue."""
        due = cast(list[bytes], self.connection.zrangebyscore(self.agl.leases, "-inf", time.time()))
        released = 0
        for raw in due:
            member = raw.decode()
            if not self.connection.zrem(self.agl.leases, member):
                continue  # another server took it
            rollout_id, _, number = member.rpartition("|")
            attempt = int(number)
            record = read(rollout_id)
            client = self.connection.hget(self.agl.claimants, member)
            self.ended(rollout_id, attempt)
            if record is None or record.state != "running" or record.attempt != attempt:
                continue
            count = int(self.connection.hincrby(self.agl.status(rollout_id), "releases", 1))
            if count > self.settings.max_releases:
                log.warning(
                    "lease of %s attempt %d ended; handed back %d times already: left to the reaper",
                    rollout_id,
                    attempt,
                    count - 1,
                )
                continue
            reply = self.lifecycle.requeue(record.task, attempt, record.policy, "released")
            if isinstance(reply, Requeued):
                released += 1
                self.connection.hincrby(self.keys.stats, StatsField.GATEWAY_RELEASED, 1)
                # The attempt's events can no longer be published: the next attempt starts clean.
                self.connection.delete(self.agl.events(rollout_id))
                log.warning(
                    "lease of %s attempt %d ended unfinished (client %s); handed back (%d of %d)",
                    rollout_id,
                    attempt,
                    cast(bytes, client).decode() if client else "?",
                    count,
                    self.settings.max_releases,
                )
        return released
