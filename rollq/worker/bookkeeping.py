"""One thread that hands whatever work has queued up to a handler as one batch.

A worker's rollouts start and end in batches: each batch is one Redis pipeline
(the claims or publications and RQ's job bookkeeping for all its jobs), so the
round trips per rollout fall as the load rises instead of the threads waiting
on them multiplying. Items are queued with a ``SimpleQueue`` put (one C call;
``ThreadPoolExecutor.submit`` built a Future and took locks per call, a tenth of
a worker's CPU at hundreds of rollouts a second).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

Item = TypeVar("Item")

_STOP = object()


class Batcher(Generic[Item]):
    """A daemon thread calling ``handle(items)`` with up to ``limit`` items queued since its last call.

    ``handle`` owns its items: it must settle each of them even when it fails
    (an exception escaping it is logged and the thread carries on).
    """

    def __init__(self, name: str, handle: Callable[[list[Item]], None], *, limit: int = 64) -> None:
        self._items: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._handle = handle
        self._limit = limit
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def put(self, item: Item) -> None:
        self._items.put(item)

    def shutdown(self) -> None:
        """Let the thread handle what was queued, then end."""
        self._items.put(_STOP)

    def _serve(self) -> None:
        stopping = False
        while not stopping:
            first = self._items.get()
            if first is _STOP:
                return
            batch = [first]
            while len(batch) < self._limit:
                try:
                    more = self._items.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    stopping = True
                    break
                batch.append(more)
            try:
                self._handle(batch)  # type: ignore[arg-type]
            except BaseException:  # even SystemExit: a thread lost here is every later job's slot lost
                log.exception("%s: handling a batch of %d failed", self._thread.name, len(batch))
