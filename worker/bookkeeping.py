"""A few threads that run RQ's per-job bookkeeping, fed through one queue.

Every rollout hands two calls to these threads (its start and its end), often
from the event loop thread. ``ThreadPoolExecutor.submit`` builds a Future, a
work item and takes locks per call, which at hundreds of rollouts a second was
a tenth of a worker's CPU; a ``SimpleQueue`` put is one C call.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_STOP = None


class Bookkeeping:
    """``size`` daemon threads running submitted calls in order of arrival."""

    def __init__(self, size: int) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._serve, name=f"rollq-job-{i}", daemon=True) for i in range(size)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on one of the threads; any exception is logged and the thread carries on (callers
        handle their own)."""
        self._calls.put((fn, args))

    def shutdown(self) -> None:
        """Let the threads finish what was submitted, then end."""
        for _ in self._threads:
            self._calls.put(_STOP)

    def _serve(self) -> None:
        while (call := self._calls.get()) is not _STOP:
            fn, args = call
            try:
                fn(*args)
            except BaseException:  # even SystemExit: a thread lost here is a slot lost for good
                log.exception("bookkeeping call %s failed", getattr(fn, "__name__", fn))
