"""The ``redis.asyncio`` client of a ``redis+cluster://`` URL: :mod:`rollq.store.cluster` with asyncio I/O.

The same client as the blocking one, for ``AsyncProducer`` and any asyncio trainer: a plain ``redis.asyncio.Redis``
over a bounded pool whose connections go to the primary that owns the namespace tag's slot. Each new connection
runs :meth:`SlotOwner.search` (the one implementation of the ``CLUSTER SLOTS`` search) asking the nodes over
asyncio; a ``MOVED`` for that slot drops the connection and raises :class:`SlotMovedError` (a ``ConnectionError``:
the command did not run and is sent again, to the new owner); ``CLUSTERDOWN`` and the other refusals Redis lifts by
itself are waited out with backoff, as :func:`rollq.store.connection.connect` does (:class:`RefusalRetry`).

Imported by :func:`rollq.store.connection.connect_async` when a cluster URL asks for it: ``redis.asyncio`` costs a
worker start-up time it has no use for.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff

from .cluster import SCHEME, SEED_OPTIONS, SlotOwner, cluster_parts
from .connection import RetryVerdict


async def find_primary(owner: SlotOwner) -> tuple[str, int]:
    """:meth:`SlotOwner.primary` over asyncio: (host, port) of the primary of ``owner``'s slot."""
    search = owner.search()
    try:
        node = next(search)
        while True:
            try:
                ranges = await _cluster_slots(*node, owner.password)
            except redis.RedisError as exc:
                node = search.throw(exc)
            else:
                node = search.send(ranges)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def _cluster_slots(host: str, port: int, password: str | None) -> Any:
    client = redis.asyncio.Redis(
        host=host, port=port, password=password, retry=AsyncRetry(NoBackoff(), 0), **SEED_OPTIONS
    )
    try:
        return await client.execute_command("CLUSTER SLOTS")
    finally:
        await client.aclose()


class RefusalRetry(AsyncRetry):
    """``redis.asyncio``'s retry with the blocking client's choice of what to retry
    (:class:`rollq.store.connection.RetryVerdict`): outages, and refusals such as ``CLUSTERDOWN`` that Redis lifts by
    itself, not a wrong password or a reply retrying cannot change."""

    def __init__(self, backoff: Any, retries: int) -> None:
        super().__init__(backoff, retries)
        self.update_supported_errors([redis.ResponseError])

    async def call_with_retry(
        self, do: Any, fail: Any, is_retryable: Any = None, with_failure_count: bool = False
    ) -> Any:
        verdict = RetryVerdict(is_retryable)
        result = await super().call_with_retry(do, fail, verdict, with_failure_count)
        verdict.ran()
        return result


class AsyncSlotConnection(redis.asyncio.Connection):
    """A connection to whichever primary owns the pool's slot now (see :class:`rollq.store.cluster.SlotConnection`)."""

    def __init__(self, **kwargs: Any) -> None:
        self.slot_owner: SlotOwner = kwargs.pop("slot_owner")
        super().__init__(**kwargs)

    async def _connect(self) -> None:
        self.host, self.port = await find_primary(self.slot_owner)
        await super()._connect()

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            response = await super().read_response(*args, **kwargs)
        except redis.ResponseError as exc:
            await self._raise_if_moved(exc)
            raise
        if isinstance(response, redis.ResponseError):  # a pipeline's reply to one of its commands
            await self._raise_if_moved(response)
        return response

    async def _raise_if_moved(self, error: redis.ResponseError) -> None:
        moved = self.slot_owner.moved_away(error)
        if moved is not None:
            await self.disconnect()
            raise moved


class AsyncSlotConnectionPool(redis.asyncio.BlockingConnectionPool):
    """A bounded pool of :class:`AsyncSlotConnection` s for one namespace tag: callers past ``max_connections``
    wait for a connection, as :func:`rollq.store.connection.connect_async`'s other pools make them."""

    def __init__(self, slot_owner: SlotOwner, **kwargs: Any) -> None:
        self.slot_owner = slot_owner
        super().__init__(connection_class=AsyncSlotConnection, slot_owner=slot_owner, **kwargs)

    def __repr__(self) -> str:
        seeds = ",".join(f"{h}:{p}" for h, p in self.slot_owner.seeds)
        return f"<{type(self).__name__} {SCHEME}://{seeds}/{self.slot_owner.tag}>"


def connect_cluster_async(url: str, options: dict[str, Any]) -> redis.asyncio.Redis:
    """An asyncio client of the primary that owns the slot of the URL's namespace tag; ``options`` as for
    ``redis.asyncio.BlockingConnectionPool`` (``retry`` a :class:`RefusalRetry` for the blocking client's
    behaviour)."""
    seeds, tag, password = cluster_parts(url)
    pool = AsyncSlotConnectionPool(SlotOwner(seeds, tag, password), password=password, **options)
    return redis.asyncio.Redis(connection_pool=pool)
