"""The one polling helper of the suite: wait for a condition, fail naming what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import redis

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], what: str, timeout: float = 15.0, interval: float = 0.05) -> T:
    """Poll ``predicate`` until it returns something truthy and return that; a Redis connection error counts as
    "not yet" (servers restart under several tests). After ``timeout`` seconds: AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
            if value:
                return value
        except redis.ConnectionError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
