"""A client of the Redis Cluster primary that owns one namespace's hash slot: ``redis+cluster://`` URLs.

A cluster namespace is written in braces, ``{name}`` (see :mod:`rollq.store.keys`): every key it touches, RQ's
included, carries the hash tag ``name`` and so lives in one slot, on one primary. rollq therefore talks to that
primary alone, over a plain ``redis.Redis`` (pipelines, ``MULTI``, Lua and ``WAIT`` as on a single server, and
RQ's worker accepts it, which it does not accept redis-py's ``RedisCluster``), and finds it the way a
Sentinel-managed client finds its primary:

- ``redis+cluster://[:password@]host:port[,host:port...]/name`` names seed nodes (any nodes of the cluster) and
  the namespace's tag ``name`` (``{name}`` is accepted too);
- each new connection asks the seeds (and every node they reported before) ``CLUSTER SLOTS`` for the primary of
  the tag's slot, and connects there;
- a ``MOVED`` reply for that slot (a failover promoted a replica, or the slot was moved) drops the connection and
  raises :class:`SlotMovedError`, a ``ConnectionError``: the command did not run, and the client's retry policy
  sends it again over a new connection, to the new owner. A ``MOVED`` for another slot is a key outside the
  namespace, a bug, and stays the ``ResponseError`` it is.

The asyncio client (:mod:`rollq.store.cluster_aio`, for ``AsyncProducer``) is the same client with asyncio I/O: it
runs the same search (:meth:`SlotOwner.search`) and the same ``MOVED`` check (:meth:`SlotOwner.moved_away`).

One URL serves one namespace (or several whose tags hash to the same primary); :func:`spread_namespaces` picks
names whose slots live on different primaries, one per shard.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Generator, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

log = logging.getLogger(__name__)

SCHEME = "redis+cluster"

# Seeds answer at once or not at all: a short timeout moves on to the next one quickly (as for Sentinels).
_SEED_TIMEOUT_SECONDS = 1.0


class SlotMovedError(redis.ConnectionError):
    """Redis answered ``MOVED`` for the namespace's own slot: the command did not run; reconnect to the new owner."""


class NoSlotOwnerError(redis.ConnectionError):
    """No seed node answered with a primary for the namespace's slot (all down, or the slot is not served)."""


def tag_slot(tag: str) -> int:
    """The hash slot of every key tagged ``{tag}``."""
    return int(key_slot(tag.encode()))


def cluster_parts(url: str) -> tuple[list[tuple[str, int]], str, str | None]:
    """A ``redis+cluster://`` URL's seed nodes, namespace tag (without braces) and password; ValueError if
    malformed."""
    parts = urlsplit(url)
    credentials, _, hosts = parts.netloc.rpartition("@")
    password = unquote(credentials.partition(":")[2]) if credentials else None
    entries = [entry.rpartition(":") for entry in hosts.split(",")]
    path = [unquote(p) for p in parts.path.split("/") if p]
    tag = path[0].strip("{}") if len(path) == 1 else ""
    if not tag or not entries or not all(host and port.isdigit() for host, _, port in entries):
        raise ValueError(
            f"expected {SCHEME}://[:password@]host:port[,host:port...]/namespace (the namespace's tag, "
            f"the name inside its braces), got {url.replace(':' + password + '@', ':***@') if password else url!r}"
        )
    return [(host, int(port)) for host, _, port in entries], tag, password


class SlotOwner:
    """Finds (and re-finds) the primary that owns ``tag``'s slot, asking the seeds and every node seen since."""

    def __init__(self, seeds: Sequence[tuple[str, int]], tag: str, password: str | None) -> None:
        self.seeds = list(seeds)
        self.tag = tag
        self.slot = tag_slot(tag)
        self.password = password
        self._known: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def primary(self) -> tuple[str, int]:
        """(host, port) of the slot's primary as the first answering node reports it."""
        search = self.search()
        try:
            node = next(search)
            while True:
                try:
                    ranges = _cluster_slots(*node, self.password)
                except redis.RedisError as exc:
                    node = search.throw(exc)
                else:
                    node = search.send(ranges)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def search(self) -> Generator[tuple[str, int], Any, tuple[str, int]]:
        """The search :meth:`primary` runs, without its I/O, for a blocking and an asyncio client alike: yields
        each node to ask; send it the node's ``CLUSTER SLOTS`` reply, or throw the ``RedisError`` asking raised.
        Returns the primary (``StopIteration.value``); raises :class:`NoSlotOwnerError` when no node names one,
        and a refused password at once."""
        with self._lock:
            nodes = list(dict.fromkeys([*self.seeds, *self._known]))
        random.shuffle(nodes)  # a dead seed first for every connection would cost a timeout each time
        errors: list[str] = []
        for host, port in nodes:
            try:
                ranges = yield host, port
            except redis.AuthenticationError:
                raise
            except redis.RedisError as exc:
                errors.append(f"{host}:{port}: {exc}")
                continue
            owner, seen = _owner_in(ranges, self.slot, host)
            with self._lock:
                self._known = list(dict.fromkeys([*self._known, *seen]))
            if owner is not None:
                return owner
            errors.append(f"{host}:{port}: no primary serves slot {self.slot}")
        raise NoSlotOwnerError(f"no primary found for slot {self.slot} of {{{self.tag}}}: {'; '.join(errors)}")

    def moved_away(self, error: BaseException) -> SlotMovedError | None:
        """The :class:`SlotMovedError` to raise when ``error`` is a ``MOVED`` for this slot, else None (a ``MOVED``
        for another slot is a key outside the namespace: a bug, left the ``ResponseError`` it is)."""
        # redis-py parses "MOVED <slot> <host:port>" into a MovedError whose text is "<slot> <host:port>".
        words = str(error).split()
        if isinstance(error, redis.exceptions.MovedError) and words and words[0] == str(self.slot):
            return SlotMovedError(f"slot {words[0]} of {{{self.tag}}} moved to {' '.join(words[1:])}")
        return None


# Seeds answer at once or not at all: one try each (the next seed is the retry), a short timeout.
SEED_OPTIONS: dict[str, Any] = {
    "socket_timeout": _SEED_TIMEOUT_SECONDS,
    "socket_connect_timeout": _SEED_TIMEOUT_SECONDS,
}


def _cluster_slots(host: str, port: int, password: str | None) -> Any:
    client = redis.Redis(host=host, port=port, password=password, retry=Retry(NoBackoff(), 0), **SEED_OPTIONS)
    try:
        return client.execute_command("CLUSTER SLOTS")
    finally:
        client.close()


def _owner_in(ranges: Any, slot: int, asked: str) -> tuple[tuple[str, int] | None, list[tuple[str, int]]]:
    """The primary of ``slot`` in a ``CLUSTER SLOTS`` reply, and every node the reply names."""
    owner: tuple[str, int] | None = None
    seen: list[tuple[str, int]] = []
    for entry in ranges:
        start, end, *nodes = entry
        for node in nodes:
            host = node[0].decode() if isinstance(node[0], bytes) else str(node[0])
            seen.append((host or asked, int(node[1])))  # an empty host means "the node you asked"
        if int(start) <= slot <= int(end) and nodes:
            owner = seen[-len(nodes)]
    return owner, seen


class SlotConnection(redis.Connection):
    """A connection to whichever primary owns the pool's slot now (see the module)."""

    def __init__(self, **kwargs: Any) -> None:
        self.slot_owner: SlotOwner = kwargs.pop("slot_owner")
        super().__init__(**kwargs)

    def _connect(self) -> Any:
        self.host, self.port = self.slot_owner.primary()
        return super()._connect()

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("disconnect_on_error", True)
        try:
            response = super().read_response(*args, **kwargs)
        except redis.ResponseError as exc:
            self._raise_if_moved(exc)
            raise
        if isinstance(response, redis.ResponseError):  # a pipeline's reply to one of its commands
            self._raise_if_moved(response)
        return response

    def _raise_if_moved(self, error: redis.ResponseError) -> None:
        moved = self.slot_owner.moved_away(error)
        if moved is not None:
            self.disconnect()
            raise moved


class SlotConnectionPool(redis.ConnectionPool):
    """A pool of :class:`SlotConnection` s for one namespace tag."""

    def __init__(self, slot_owner: SlotOwner, **kwargs: Any) -> None:
        self.slot_owner = slot_owner
        kwargs["connection_class"] = SlotConnection
        super().__init__(**kwargs)
        self.connection_kwargs["slot_owner"] = slot_owner

    def __repr__(self) -> str:
        seeds = ",".join(f"{h}:{p}" for h, p in self.slot_owner.seeds)
        return f"<{type(self).__name__} {SCHEME}://{seeds}/{self.slot_owner.tag}>"


def connect_cluster(url: str, options: dict[str, Any]) -> redis.Redis:
    """A client of the primary that owns the slot of the URL's namespace tag; ``options`` as for ``redis.Redis``."""
    seeds, tag, password = cluster_parts(url)
    pool = SlotConnectionPool(SlotOwner(seeds, tag, password), password=password, **options)
    return redis.Redis(connection_pool=pool)


def cluster_url(seeds: Sequence[tuple[str, int]] | str, tag: str, password: str | None = None) -> str:
    """The ``redis+cluster://`` URL of namespace tag ``tag`` (``{tag}`` accepted) over ``seeds``."""
    hosts = seeds if isinstance(seeds, str) else ",".join(f"{h}:{p}" for h, p in seeds)
    auth = f":{password}@" if password else ""
    return f"{SCHEME}://{auth}{hosts}/{tag.strip('{}')}"


def primaries(seeds: Sequence[tuple[str, int]], password: str | None = None) -> dict[tuple[str, int], list[int]]:
    """Each primary of the cluster the seeds belong to, with the first slot of each range it serves."""
    owner = SlotOwner(seeds, "_", password)
    for host, port in owner.seeds:
        client = redis.Redis(host=host, port=port, password=password, socket_timeout=_SEED_TIMEOUT_SECONDS)
        try:
            ranges = client.execute_command("CLUSTER SLOTS")
        except redis.RedisError:
            continue
        finally:
            client.close()
        found: dict[tuple[str, int], list[int]] = {}
        for start, end, *nodes in ranges:
            node = nodes[0]
            key = (node[0].decode() or host, int(node[1]))
            found.setdefault(key, []).extend([int(start), int(end)])
        return found
    raise NoSlotOwnerError(f"no seed of {seeds} answered CLUSTER SLOTS")


def spread_namespaces(
    seeds: Sequence[tuple[str, int]], prefix: str, count: int | None = None, password: str | None = None
) -> list[str]:
    """Cluster namespaces ``{prefix-N}``, one per primary (``count`` of them; None: as many as primaries), each
    tag's slot on a different primary: the namespaces of a run spread over the shards."""
    ranges = primaries(seeds, password)
    wanted = len(ranges) if count is None else count
    if wanted > len(ranges):
        raise ValueError(f"asked for {wanted} namespaces on different primaries; the cluster has {len(ranges)}")
    taken: set[tuple[str, int]] = set()
    names: list[str] = []
    for n in range(100_000):
        tag = f"{prefix}-{n}"
        slot = tag_slot(tag)
        for node, bounds in ranges.items():
            if node not in taken and any(a <= slot <= b for a, b in zip(bounds[::2], bounds[1::2], strict=True)):
                taken.add(node)
                names.append("{" + tag + "}")
                break
        if len(names) == wanted:
            return names
    raise ValueError(f"found no {wanted} tags {prefix}-N on different primaries")
