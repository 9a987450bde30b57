"""Waiting for replicas to hold a transition (``WAIT``), and counting and logging the times they did not in time.

A shortfall is logged and counted, never raised: the transition is already applied on the primary, so raising
would only report a success as a failure.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis
from redis.client import Pipeline

log = logging.getLogger(__name__)

# At most one shortfall warning per this many seconds: with no replica (right after a failover) every transition
# falls short, and a line per transition would drown the log.
_SHORTFALL_LOG_SECONDS = 10.0


class ReplicaWait:
    """Waits until ``replicas`` replicas hold this process's writes, for at most ``timeout_ms`` each time (a no-op
    when ``replicas`` is 0); ``shortfalls`` counts the waits that ended short."""

    def __init__(self, connection: redis.Redis, mark_channel: str, replicas: int = 0, timeout_ms: int = 1000) -> None:
        if replicas < 0 or timeout_ms < 1:
            # WAIT's timeout 0 means "block forever": a dead replica would stop every transition.
            raise ValueError(f"wait_replicas must be >= 0 and wait_timeout_ms >= 1, got {replicas}, {timeout_ms}")
        self.connection = connection
        self.mark_channel = mark_channel
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self.shortfalls = 0
        self._lock = threading.Lock()
        self._logged: float | None = None

    def after_write(self) -> None:
        """Wait until the replicas hold every write this process made so far.

        ``WAIT`` only covers writes made on the connection it is sent on, and the pool may hand out another
        one: measured with the replica frozen, a bare ``WAIT 1`` on a second connection answered 1 at once
        for a write it never saw. So the WAIT follows a PUBLISH on ``mark_channel`` on the same connection, in
        one round trip; the replication stream is ordered, so a replica that acknowledged the PUBLISH holds every
        earlier write, the transition's included.
        """
        if not self.replicas:
            return
        pipe = self.connection.pipeline(transaction=False)
        pipe.publish(self.mark_channel, b"")
        pipe.execute_command("WAIT", self.replicas, self.timeout_ms)
        self.count(pipe.execute()[-1])

    def queue(self, pipe: Pipeline) -> bool:
        """End a pipeline of writes with one ``WAIT`` for all of them (on the connection that wrote them, so no
        PUBLISH is needed); False, and nothing queued, when ``replicas`` is 0. Pass the pipeline's last reply
        to :meth:`count`."""
        if not self.replicas:
            return False
        pipe.execute_command("WAIT", self.replicas, self.timeout_ms)
        return True

    def count(self, acknowledged: Any) -> None:
        """Count (and log, at most once per 10 s) a ``WAIT`` that answered fewer replicas than asked for."""
        if isinstance(acknowledged, Exception) or int(acknowledged) >= self.replicas:
            if isinstance(acknowledged, Exception):
                log.warning("WAIT for replicas failed: %s", acknowledged)
            return
        with self._lock:
            self.shortfalls += 1
            now = time.monotonic()
            if self._logged is not None and now - self._logged < _SHORTFALL_LOG_SECONDS:
                return
            self._logged = now
            count = self.shortfalls
        log.warning(
            "only %d of %d replica(s) acknowledged a transition within %d ms (%d such transitions so far): "
            "it is applied on the primary but a failover now could undo it",
            int(acknowledged),
            self.replicas,
            self.timeout_ms,
            count,
        )
