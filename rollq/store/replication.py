"""Waiting for replicas to hold a transition (``WAIT``), and what happens when none can.

Redis replicates asynchronously: a failover undoes every write the promoted replica had not received. A
transition followed by ``WAIT n`` in the same pipeline returns only once ``n`` replicas hold it, so a failover
cannot undo what a caller was told had happened. Rules kept here:

- **On by default for Sentinel and Redis Cluster.** A client that reaches its primary through Sentinels
  (``redis+sentinel://``) or a cluster's slot map (``redis+cluster://``) waits for one replica unless told
  otherwise (``wait_replicas=0``); a plain ``redis://`` client, whose server does not fail over by itself, waits
  for none.
- **The WAIT runs on the connection that wrote, in the same pipeline.** ``WAIT`` covers the writes of the
  connection it is sent on, up to that connection's last write. A separate round trip could take another pooled
  connection (one that wrote nothing answers "held" at once), or, after a failover in between, reach the new
  primary, where it covers nothing the old one wrote. So every waited transition is queued with ``PUBLISH`` on a
  channel nobody reads and the ``WAIT`` behind it, in one pipeline: the ``PUBLISH`` makes the connection's last
  write the newest on that server, and the replication stream is ordered, so a replica that acknowledged it
  holds everything the server applied before, the pipeline's transitions included. If redis-py resends the
  pipeline after a dropped connection (possibly to a new primary), it resends the transitions too, which are
  idempotent, and the ``WAIT`` covers them there.
- **A shortfall is counted and logged, never raised.** The transition is already applied on the primary, so
  raising would report a success as a failure.
- **An enqueue waits for a replica that lags.** An enqueue is the one transition nothing repeats (a lost claim
  or finish is redone by the reapers; a lost enqueue is gone, though its caller was told it was queued). So when
  its ``WAIT`` falls short, or the process is degraded (below), it asks the primary whether a replica is alive
  (``INFO replication``: online, and its last acknowledgement at most :data:`ALIVE_ACK_SECONDS` old) and, while
  one is, polls the primary until a replica acknowledged the replication offset at which the primary held the
  tasks (read with ``EXISTS`` in one pipeline, so from the same server; a new replication id means another server:
  it must show the tasks again), at most :data:`HOLD_SECONDS`: a lagging replica slows enqueues down
  instead of losing them (issue 26: 150 acknowledged tasks lost behind a replica 1.5 s away). Tasks missing from
  the server that answers were undone by a failover: :class:`~rollq.models.errors.EnqueueUndoneError`. With no
  replica alive the enqueue returns unconfirmed, degraded as below.
- **No replica, no waiting per transition: a visible degraded state.** After a failover the new primary has no
  replica until the old one rejoins (for ever if it never does); waiting the full timeout on every transition
  cut a worker from ~140 to ~8 rollouts/s (issue 25). So the first shortfall puts this process in a degraded
  state: one warning line, its entry in the namespace's ``replication-degraded`` sorted set (read by ``rollq
  status`` and the ``rollq_replication_degraded_processes`` metric), and transitions no longer wait. At most once
  per :data:`PROBE_SECONDS` it asks the primary (``INFO replication``) whether enough replicas are online; when
  they are, waiting resumes (one more line) and the entry goes. While degraded a failover can undo transitions,
  as with ``wait_replicas=0``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.client import Pipeline
from redis.sentinel import SentinelConnectionPool

from rollq.models.errors import EnqueueUndoneError

from .cluster import SlotConnectionPool

log = logging.getLogger(__name__)

PROBE_SECONDS = 1.0
"""While degraded, how often (at most) one transition asks the primary whether replicas are back."""

ALIVE_ACK_SECONDS = 5
"""A replica whose last acknowledgement (``lag`` in the primary's ``INFO replication``) is older than this is not
alive: frozen, or cut off. Replicas acknowledge once a second however far behind they are."""

HOLD_SECONDS = 60.0
"""How long an enqueue waits at most for a replica that is alive but behind (see the module)."""

DEGRADED_FRESH_SECONDS = 60.0
"""A ``replication-degraded`` entry older than this is a process that stopped reporting (it exited): not counted."""

# While degraded, the entry is refreshed at most this often (it must stay younger than DEGRADED_FRESH_SECONDS).
_REFRESH_SECONDS = 10.0


def sentinel_managed(connection: Any) -> bool:
    """Whether ``connection`` (sync or asyncio redis-py) finds its primary through Sentinels."""
    pool = getattr(connection, "connection_pool", None)
    if isinstance(pool, SentinelConnectionPool):
        return True
    from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool

    return isinstance(pool, AsyncSentinelPool)


def default_replicas(connection: Any) -> int:
    """How many replicas a transition waits for when the caller did not say: 1 behind Sentinel or a Redis Cluster
    (``redis+cluster://``: a cluster fails over by itself too), else 0."""
    return (
        1
        if sentinel_managed(connection) or isinstance(getattr(connection, "connection_pool", None), SlotConnectionPool)
        else 0
    )


def _online(info: dict[str, Any]) -> list[dict[str, Any]]:
    """The replicas in ``state=online`` in a primary's ``INFO replication`` (redis-py's parsed dict)."""
    return [
        value
        for key, value in info.items()
        if key.startswith("slave") and isinstance(value, dict) and value.get("state") == "online"
    ]


def online_replicas(info: dict[str, Any], caught_up_to: int = 0) -> int:
    """Online replicas whose acknowledged offset is at least ``caught_up_to``. A stalled replica (a frozen
    process, a cut link) stays ``online`` until ``repl-timeout`` (60 s) but its offset stops: only the offset says
    it would answer a WAIT."""
    return sum(int(replica.get("offset", 0)) >= caught_up_to for replica in _online(info))


def alive_replicas(info: dict[str, Any]) -> int:
    """Online replicas whose last acknowledgement is at most :data:`ALIVE_ACK_SECONDS` old."""
    return sum(int(replica.get("lag", 0)) <= ALIVE_ACK_SECONDS for replica in _online(info))


def process_label() -> str:
    """This process as it appears in the ``replication-degraded`` set: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


class ReplicaWait:
    """Makes pipelines of transitions wait until ``replicas`` replicas hold them, for at most ``timeout_ms`` each
    time (none when ``replicas`` is 0; None: :func:`default_replicas`). ``shortfalls`` counts the waits that ended
    short or failed; ``degraded_since`` (monotonic) is set while this process does not wait (see the module)."""

    def __init__(
        self,
        connection: redis.Redis,
        mark_channel: str,
        replicas: int | None = None,
        timeout_ms: int = 1000,
        *,
        degraded_key: str | None = None,
    ) -> None:
        replicas = default_replicas(connection) if replicas is None else replicas
        if replicas < 0 or timeout_ms < 1:
            # WAIT's timeout 0 means "block forever": a dead replica would stop every transition.
            raise ValueError(f"wait_replicas must be >= 0 and wait_timeout_ms >= 1, got {replicas}, {timeout_ms}")
        self.connection = connection
        self.mark_channel = mark_channel
        self.degraded_key = degraded_key
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self.shortfalls = 0
        self.degraded_since: float | None = None
        self.label = process_label()
        self._lock = threading.Lock()
        self._next_probe = 0.0
        self._refreshed = 0.0
        # The primary's offset when this process degraded (or at its first probe): past every write that went
        # unacknowledged, so a replica is back only once it has acknowledged that far.
        self._probe_offset: int | None = None

    @property
    def degraded(self) -> bool:
        """Whether transitions currently go without waiting because no replica acknowledged in time."""
        return self.degraded_since is not None

    def queue(self, pipe: Pipeline) -> bool:
        """End a pipeline of writes with ``PUBLISH`` + ``WAIT`` (see the module); False, and nothing queued, when
        this process does not wait (``replicas`` 0, or degraded). Pass the pipeline's last reply to
        :meth:`count`."""
        if not self.replicas or not self._waiting():
            return False
        pipe.publish(self.mark_channel, b"")
        pipe.execute_command("WAIT", self.replicas, self.timeout_ms)
        return True

    def _waiting(self) -> bool:
        """Not degraded; or degraded and a probe (at most once per PROBE_SECONDS) finds enough replicas online."""
        if self.degraded_since is None:
            return True
        now = time.monotonic()
        with self._lock:
            if now < self._next_probe:
                return False
            self._next_probe = now + PROBE_SECONDS
        try:
            info = self.connection.info("replication")
        except redis.RedisError:
            return False
        if self._probe_offset is None:
            self._probe_offset = int(info.get("master_repl_offset", 0))
        online = online_replicas(info, self._probe_offset)
        if online < self.replicas:
            self._mark_degraded(refresh_only=True)
            return False
        self._recovered(online)
        return True

    def _recovered(self, online: int) -> None:
        """Leave the degraded state, if in it: one log line, and the process's entry goes."""
        with self._lock:
            since, self.degraded_since = self.degraded_since, None
            self._probe_offset = None
        if since is not None:
            log.warning(
                "%d replica(s) online again after %.1fs: transitions wait for %d replica(s) again",
                online,
                time.monotonic() - since,
                self.replicas,
            )
            self._unmark_degraded()

    def hold(self, task_keys: Sequence[str], *, confirmed: bool) -> None:
        """After an enqueue that wrote ``task_keys`` (``confirmed``: its own ``WAIT`` said a replica holds them):
        while it is not confirmed and a replica is alive, wait until one holds them (see the module). Raises
        :class:`~rollq.models.errors.EnqueueUndoneError` when the server that answers lacks some of them."""
        if not self.replicas or confirmed or not task_keys:
            return
        unique = list(dict.fromkeys(task_keys))
        deadline = time.monotonic() + HOLD_SECONDS
        target: tuple[str, int] | None = None  # (the server's replication id, its offset once it held the tasks)
        delay = 0.02
        while time.monotonic() < deadline:
            if target is None:
                # The tasks and the offset they are held at, from one server: a pipeline is one connection, and
                # one re-sent after a dropped connection re-sends both.
                pipe = self.connection.pipeline(transaction=False)
                pipe.exists(*unique)
                pipe.info("replication")
                present, info = pipe.execute()
                if int(present) < len(unique):
                    raise EnqueueUndoneError(len(unique) - int(present), len(unique))
                target = (str(info.get("master_replid")), int(info.get("master_repl_offset", 0)))
            else:
                try:
                    info = self.connection.info("replication")
                except redis.ConnectionError:
                    target = None  # another server may answer next: it must show the tasks again
                    continue
                if str(info.get("master_replid")) != target[0]:
                    target = None  # a failover or a restart in between
                    continue
            holding = sum(
                1
                for key, value in info.items()
                if key.startswith("slave") and isinstance(value, dict) and int(value.get("offset", -1)) >= target[1]
            )
            if holding >= self.replicas:
                self._recovered(holding)
                return
            if alive_replicas(info) < self.replicas:
                return  # nothing alive to wait for: unconfirmed, degraded (counted and logged by count())
            time.sleep(delay)
            delay = min(delay * 2, 0.25)
        log.warning(
            "a replica stayed alive but %gs behind an enqueue of %d task(s): it returns unconfirmed",
            HOLD_SECONDS,
            len(unique),
        )

    def count(self, acknowledged: Any) -> bool:
        """Whether the ``WAIT`` reply ``acknowledged`` confirms the pipeline's writes; a shortfall or an error is
        counted and puts this process in the degraded state (one log line)."""
        if not isinstance(acknowledged, Exception) and int(acknowledged) >= self.replicas:
            return True
        with self._lock:
            self.shortfalls += 1
            entering = self.degraded_since is None
            if entering:
                self.degraded_since = time.monotonic()
                self._next_probe = self.degraded_since + PROBE_SECONDS
            count = self.shortfalls
        if entering:
            got = f"failed ({acknowledged})" if isinstance(acknowledged, Exception) else f"got {int(acknowledged)}"
            log.warning(
                "waiting for %d replica(s) to acknowledge a transition %s within %d ms (%d such transitions so "
                "far): it is applied on the primary but a failover now could undo it. Degraded: transitions no "
                "longer wait for replicas until %d is online again (checked every %gs)",
                self.replicas,
                got,
                self.timeout_ms,
                count,
                self.replicas,
                PROBE_SECONDS,
            )
            self._mark_degraded(refresh_only=False)
            try:
                self._probe_offset = int(self.connection.info("replication").get("master_repl_offset", 0))
            except redis.RedisError:
                self._probe_offset = None
        return False

    def _mark_degraded(self, *, refresh_only: bool) -> None:
        """Record (or refresh) this process in the namespace's ``replication-degraded`` set; best effort."""
        if self.degraded_key is None:
            return
        now = time.monotonic()
        if refresh_only and now - self._refreshed < _REFRESH_SECONDS:
            return
        self._refreshed = now
        try:
            self.connection.zadd(self.degraded_key, {self.label: time.time()})
        except redis.RedisError:
            pass

    def _unmark_degraded(self) -> None:
        if self.degraded_key is None:
            return
        try:
            self.connection.zrem(self.degraded_key, self.label)
        except redis.RedisError:
            pass


def degraded_processes(connection: redis.Redis, degraded_key: str, now: float | None = None) -> int:
    """How many processes reported, within :data:`DEGRADED_FRESH_SECONDS`, that their transitions do not wait."""
    now = time.time() if now is None else now
    return int(connection.zcount(degraded_key, now - DEGRADED_FRESH_SECONDS, "+inf"))
