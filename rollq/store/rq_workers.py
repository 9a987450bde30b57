"""RQ's worker records, read for listing (``rollq status``, ``/metrics``, the dashboard), never run.

RQ's ``Worker.__init__`` raises its connection pool's socket timeout to the worker's dequeue timeout plus 10 s
(415 s by default) whenever it is lower (``BaseWorker._set_connection``), since a worker blocks that long in its
pop. Each ``Worker.all`` builds a Worker per registered worker, so one listing raised the timeout of the client it
was given: a server that reads Redis with a 3 s timeout (:func:`rollq.ops.metrics.scrape_connection`) kept it only
until the first worker registered, and hung for minutes on a stalled Redis from then on. A listed worker never
blocks; it leaves the connection as it is.
"""

from __future__ import annotations

from typing import Any

from rq.worker import Worker


class ListedWorker(Worker):
    """A worker read from Redis to be shown: its connection's socket timeout is left as the caller set it."""

    def _set_connection(self, connection: Any) -> Any:
        return connection
