"""Consumer groups of the results stream: who reads it, how far behind, how long idle, and their end.

A group holds back trimming of the results stream until it has read and acknowledged what it needs; one whose
reader went away would pin the stream for ever. The policy (``lua/trim_results.lua``): a group none of whose
consumers has talked to Redis for :data:`~rollq.store.keys.GROUP_IDLE_SECONDS` (or the namespace's own bound,
:func:`set_idle_after`), or that has had no consumer for that long (timed from when a trim first saw it without
one: a reader that just created its group has not read yet), is *idle* and holds nothing back; what trimming
then removes before it read it is counted for it (``lost``) and raised to it as ``RolloutsTrimmedError`` if it
comes back.
``rollq groups list`` shows them, ``rollq groups delete`` ends one.

The results stream or trim hash holding another type than rollq writes there fails each of these with a
``redis.ResponseError`` naming the key and its type (:func:`~rollq.store.keys.foreign_key`), not Redis's bare
WRONGTYPE; the key is left as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, cast

import redis

from .keys import GROUP_IDLE_SECONDS, IDLE_MS_FIELD, Keys
from .records import foreign_keys, wrong_type


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


@contextmanager
def _named(connection: redis.Redis, keys: Keys) -> Iterator[None]:
    """Redis's WRONGTYPE inside as a ``redis.ResponseError`` naming the results stream or trim hash of another type."""
    try:
        yield
    except redis.ResponseError as exc:
        if not wrong_type(exc):
            raise
        raise _damaged(connection, keys, exc) from exc


class DamagedGroupKeyError(redis.ResponseError):
    """The results stream or its trim hash holds another Redis type than rollq writes there (the message names it):
    the consumer groups cannot be read or changed until it is repaired."""


def _damaged(connection: redis.Redis, keys: Keys, exc: redis.ResponseError) -> DamagedGroupKeyError:
    read = {keys.results: ("stream", "results stream"), keys.results_trim: ("hash", "results trim hash")}
    named = foreign_keys(connection, read)
    return DamagedGroupKeyError("; ".join(named) or str(exc))


def _no_stream(connection: redis.Redis, keys: Keys, call: Callable[[], Any], otherwise: Any) -> Any:
    """``call()`` on the results stream, ``otherwise`` when Redis says there is no stream (or no such group)."""
    with _named(connection, keys):
        try:
            return call()
        except redis.ResponseError as exc:
            if wrong_type(exc):
                raise
            return otherwise


def idle_after(connection: redis.Redis, keys: Keys) -> float:
    """Seconds after which a group counts as idle in this namespace."""
    with _named(connection, keys):
        raw = connection.hget(keys.results_trim, IDLE_MS_FIELD)
    try:
        return int(raw) / 1000 if raw is not None else GROUP_IDLE_SECONDS  # type: ignore[arg-type]
    except ValueError:
        return GROUP_IDLE_SECONDS


def set_idle_after(connection: redis.Redis, keys: Keys, seconds: float | None) -> None:
    """Set this namespace's idle bound (None: back to :data:`~rollq.store.keys.GROUP_IDLE_SECONDS`)."""
    if seconds is not None and seconds < 0:
        raise ValueError("the idle bound must be >= 0 seconds")
    with _named(connection, keys):
        if seconds is None:
            connection.hdel(keys.results_trim, IDLE_MS_FIELD)
        else:
            connection.hset(keys.results_trim, IDLE_MS_FIELD, int(seconds * 1000))


def list_groups(connection: redis.Redis, keys: Keys) -> list[ConsumerGroup]:
    """The results stream's consumer groups (empty when there is no stream yet)."""
    groups = _no_stream(connection, keys, lambda: connection.xinfo_groups(keys.results), [])
    if not groups:
        return []
    bound = idle_after(connection, keys)
    with _named(connection, keys):
        raw = cast(dict[bytes, bytes], connection.hgetall(keys.results_trim))
    trim = {k.decode(): v.decode() for k, v in raw.items()}
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
    with _named(connection, keys):  # first: a trim hash of another type fails the delete before it removes anything
        connection.hdel(keys.results_trim, f"count:{name}", f"from:{name}", f"seen:{name}")
    return bool(_no_stream(connection, keys, lambda: connection.xgroup_destroy(keys.results, name), False))
