"""What Redis does when it is full, read from ``INFO``: for the start-up warning, ``rollq status`` and ``/metrics``.

rollq's keys must never be evicted: a task record, a queued job or a result that Redis drops to make room is
lost without a word (measured: 6,625-7,767 of 8,000 tasks lost under ``allkeys-lru``). Under ``noeviction``
a full Redis refuses writes instead; rollq's workers then back off and resume when memory frees
(:class:`rollq.store.connection.Refusals`). So every policy but ``noeviction`` gets a warning when a worker
or producer starts, and ``rollq status`` shows both the policy and whether Redis refuses writes now.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import redis

log = logging.getLogger(__name__)

SAFE_POLICY = "noeviction"
_warned: set[str] = set()


@dataclass(frozen=True)
class MemoryState:
    """Redis's memory limit, use and eviction policy (``maxmemory`` 0: no limit)."""

    policy: str
    used_bytes: int
    max_bytes: int

    @property
    def evicts(self) -> bool:
        """Whether Redis may drop rollq's keys when full (any policy but ``noeviction``, with a limit set)."""
        return self.policy != SAFE_POLICY and self.max_bytes > 0

    @property
    def full(self) -> bool:
        """Whether Redis refuses writes for lack of memory now (at its limit under ``noeviction``)."""
        return self.policy == SAFE_POLICY and self.max_bytes > 0 and self.used_bytes >= self.max_bytes


def memory_state(connection: redis.Redis) -> MemoryState | None:
    """The server's memory state; None where ``INFO memory`` is not available (the embedded fake server)."""
    try:
        info: dict[str, Any] = connection.info("memory")  # type: ignore[assignment]
    except (redis.ResponseError, NotImplementedError, AttributeError):
        return None
    if "maxmemory_policy" not in info:
        return None
    return MemoryState(str(info["maxmemory_policy"]), int(info.get("used_memory", 0)), int(info.get("maxmemory", 0)))


def warn_if_evicting(connection: redis.Redis, what: str) -> MemoryState | None:
    """Log a warning (once per server and process) when Redis's ``maxmemory-policy`` can evict rollq's keys."""
    try:
        state = memory_state(connection)
    except redis.RedisError as exc:
        log.debug("could not read Redis's memory policy: %s", exc)
        return None
    if state is None:
        return None
    if state.policy != SAFE_POLICY:
        where = repr(connection.connection_pool.connection_kwargs.get("host", "?"))
        key = f"{where}:{state.policy}"
        if key not in _warned:
            _warned.add(key)
            log.warning(
                "%s: Redis's maxmemory-policy is %s: when full (maxmemory %s) it may evict rollq's tasks, jobs and "
                "results without a word; set maxmemory-policy noeviction (rollq waits out a full Redis)",
                what,
                state.policy,
                state.max_bytes or "not set yet",
            )
    return state
