"""Consumer groups of the results stream: who reads it, how far behind, how long idle, and their end.

A group holds back trimming of the results stream until it has read and acknowledged what it needs; one whose
reader went away would pin the stream for ever. The policy (``lua/trim_results.lua``): a group none of whose
consumers has talked to Redis for :data:`~rollq.store.keys.GROUP_IDLE_SECONDS` (or the namespace's own bound,
:func:`set_idle_after`), or that has had no consumer for that long (timed from when a trim first saw it without
one: a reader that just created its group has not read yet), is *idle* and holds nothing back; what trimming
then removes before it read it is counted for it (``lost``) and raised to it as ``RolloutsTrimmedError`` if it
comes back.
``rollq groups list`` shows them, ``rollq groups delete`` ends one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, cast

import redis

from .keys import GROUP_IDLE_SECONDS, IDLE_MS_FIELD, Keys


@dataclass(frozen=True)
class ConsumerGroup:
    """One consumer group of a namespace's results stream."""

    name: str
    consumers: int
    pending: int
    lag: int | None
    idle_seconds: float | None
    """Since the most recently active consumer last talked to Redis (without consumers: since a trim first saw
    it so); None when not known yet."""
    idle: bool
    """Past the idle bound: it no longer holds back trimming."""
    lost: int
    """Entries trimmed before it read them (by the hard byte limit, or while it was idle)."""
    lost_from: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def idle_after(connection: redis.Redis, keys: Keys) -> float:
    """Seconds after which a group counts as idle in this namespace."""
    raw = connection.hget(keys.results_trim, IDLE_MS_FIELD)
    try:
        return int(raw) / 1000 if raw is not None else GROUP_IDLE_SECONDS  # type: ignore[arg-type]
    except ValueError:
        return GROUP_IDLE_SECONDS


def set_idle_after(connection: redis.Redis, keys: Keys, seconds: float | None) -> None:
    """Set this namespace's idle bound (None: back to :data:`~rollq.store.keys.GROUP_IDLE_SECONDS`)."""
    if seconds is None:
        connection.hdel(keys.results_trim, IDLE_MS_FIELD)
    else:
        if seconds < 0:
            raise ValueError("the idle bound must be >= 0 seconds")
        connection.hset(keys.results_trim, IDLE_MS_FIELD, int(seconds * 1000))


def list_groups(connection: redis.Redis, keys: Keys) -> list[ConsumerGroup]:
    """The results stream's consumer groups (empty when there is no stream yet)."""
    try:
        groups = connection.xinfo_groups(keys.results)
    except redis.ResponseError:  # no stream yet
        return []
    bound = idle_after(connection, keys)
    trim = {k.decode(): v.decode() for k, v in cast(dict[bytes, bytes], connection.hgetall(keys.results_trim)).items()}
    seconds, micros = cast(tuple[int, int], connection.time())
    now = seconds + micros / 1e6
    out = []
    for g in groups:
        name = g["name"].decode() if isinstance(g["name"], bytes) else str(g["name"])
        consumers = cast(list[dict[str, Any]], connection.xinfo_consumers(keys.results, name)) if g["consumers"] else []
        idle = min((int(c["idle"]) / 1000 for c in consumers), default=None)
        if not consumers and f"seen:{name}" in trim:
            idle = max(0.0, now - int(trim[f"seen:{name}"]) / 1000)
        out.append(
            ConsumerGroup(
                name=name,
                consumers=int(g["consumers"]),
                pending=int(g["pending"]),
                lag=g.get("lag"),
                idle_seconds=idle,
                idle=idle is not None and idle > bound,
                lost=int(trim.get(f"count:{name}", 0)),
                lost_from=trim.get(f"from:{name}"),
            )
        )
    return out


def delete_group(connection: redis.Redis, keys: Keys, name: str) -> bool:
    """Remove consumer group ``name`` and its trim bookkeeping; False when there was none."""
    try:
        removed = bool(connection.xgroup_destroy(keys.results, name))
    except redis.ResponseError:  # no stream
        removed = False
    connection.hdel(keys.results_trim, f"count:{name}", f"from:{name}", f"seen:{name}")
    return removed
