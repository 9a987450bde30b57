"""Which rollq namespaces a Redis holds, to answer a namespace that holds nothing with a hint (a typo in
``-n`` or in an ``rq worker`` queue name otherwise reads as an empty, healthy namespace)."""

from __future__ import annotations

import difflib
from typing import cast

import redis

from .jobs import RQ_QUEUES_KEY, rq_queue_key
from .keys import Keys


def known_namespaces(connection: redis.Redis) -> list[str]:
    """Namespaces that ever queued a task here: RQ lists every queue it enqueued to (one key, no SCAN)."""
    prefix = rq_queue_key("")
    members = cast(set[bytes], connection.smembers(RQ_QUEUES_KEY))
    return sorted(m.decode()[len(prefix) :] for m in members if m.decode().startswith(prefix))


def is_empty(connection: redis.Redis, keys: Keys) -> bool:
    """Whether nothing of ``keys``' namespace exists: no queue, tasks in flight, results, stats or resources."""
    pipe = connection.pipeline(transaction=False)
    for key in (keys.rq_queue, keys.inflight, keys.results, keys.stats, keys.resources_latest):
        pipe.exists(key)
    return not any(pipe.execute())


def namespace_hint(connection: redis.Redis, keys: Keys) -> str | None:
    """A one-line hint when ``keys``' namespace holds nothing while others do (None otherwise)."""
    if keys.clustered or not is_empty(connection, keys):  # a cluster namespace's client reaches its own slot only
        return None
    others = [n for n in known_namespaces(connection) if n != keys.namespace]
    if not others:
        return None
    close = difflib.get_close_matches(keys.namespace, others, n=1, cutoff=0.6)
    guess = f"; did you mean {close[0]!r}?" if close else ""
    return f"namespace {keys.namespace!r} holds nothing here; namespaces in this Redis: {', '.join(others)}{guess}"
