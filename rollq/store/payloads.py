"""Big rollouts kept beside the results stream: the one rule for writing and reading them.

A rollout whose JSON is longer than :data:`PAYLOAD_THRESHOLD` is not handed to ``lua/finish.lua`` as an argument:
the same pipeline first SETs it at a key of its own (:meth:`~rollq.store.keys.Keys.payload`, with an expiry of
:data:`UNPUBLISHED_SECONDS`), and the script is passed that key's name. On acceptance the results entry is
``rollout_id, <id>, ref, <payload key>`` (``StreamField.REF`` where a small rollout's entry has ``StreamField.ROLLOUT``)
and the key loses its expiry: it lives exactly as long as its entry, and the trim that removes the entry deletes it
(``lua/trim_results.lua``). A refused finish (superseded, cancelled, a live attempt) deletes it; a superseded rollout
is copied onto the superseded stream as before.

Why: a script gets its arguments copied into Lua's heap. Measured on 1 MB (bench/big.py): handing it to a script
that only takes its length cost Redis 1,307 us, the whole finish 2,238 us, where a SET of the same bytes costs 4 us
(Redis keeps the argument it read). Small rollouts keep the one-entry format: for them the extra key and the
reader's extra MGET cost about what the copy does.

Readers call :func:`load_payloads` (or :func:`aload_payloads`) on each batch of entries they read: one ``MGET`` for
the batch puts every referenced rollout where an inline one is, so :func:`rollq.producer.results.parse_entry` and
everything after it read both formats alike. A payload gone by then (its entry trimmed between the two reads) leaves
the entry without a rollout; :func:`missing_payload` says so.

The consumer-group readers, which hand rollouts over one at a time, read a batch's payloads as they go instead
(:func:`loaded_one_by_one`, :func:`aloaded_one_by_one`): about :data:`READ_AHEAD_BYTES` of them per ``MGET``, each
dropped from its entry once the reader moves past it. One MGET for a batch of 100 rollouts of 1 MB had Redis build a
100 MB reply and the trainer hold 100 MB of JSON before parsing the first: fresh pages on both sides (190-330 page
faults per rollout in the trainer, measured with bench/big.py's rollout), where a reader taking them as it goes
reuses the same few megabytes (4-5 faults per rollout).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncGenerator, Generator, Iterable, MutableMapping, Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio

from .keys import StreamField

__all__ = [
    "PAYLOAD_THRESHOLD",
    "UNPUBLISHED_SECONDS",
    "READ_AHEAD_BYTES",
    "ReadAhead",
    "aload_payloads",
    "aloaded_one_by_one",
    "load_payloads",
    "loaded_one_by_one",
    "goes_to_payload",
    "missing_payload",
    "payload_token",
]

PAYLOAD_THRESHOLD = 32 * 1024
"""Rollout JSON longer than this (bytes) goes to a payload key. Measured by bench/payload_threshold.py (Redis's own
time for the finish, the SET, the trainer's XREADGROUP, MGET and XACK, per rollout, 500 rollouts one at a time),
inline / by reference: 4.7 KB 141 / 147 us; 10 KB 172 / 139; 22 KB 217 / 135; 45 KB 270 / 159; 0.2 MB 888 / 253;
0.9 MB 2,931 / 1,144. Below ~10 KB the copy into Lua costs less than the key; from a few tens of KB the reference saves
Redis more than a reader's one MGET per batch costs it, and a key's ~100 bytes of memory are nothing beside the
rollout."""

UNPUBLISHED_SECONDS = 24 * 3600
"""The expiry of a payload key until its finish accepts it (which removes the expiry) or refuses it (which deletes
the key): only a key whose script never ran (a pipeline cut between the SET and the script, a script error) lives
this long. A published payload has no expiry: the results stream has no retention in time, only its bounds."""

READ_AHEAD_BYTES = 1024 * 1024
"""About how many payload bytes a consumer-group reader fetches per ``MGET`` (:class:`ReadAhead`): one 1 MB rollout at
a time, a few dozen of 32 KB. A round trip costs ~0.05 ms; parsing a megabyte of JSON ~6 ms."""

_ROLLOUT = StreamField.ROLLOUT.encode()
_REF = StreamField.REF.encode()

Fields = MutableMapping[bytes, bytes]
F = TypeVar("F", bound=Fields)


def goes_to_payload(rollout_json: bytes | str) -> bool:
    """Whether a finish puts ``rollout_json`` at a payload key rather than in its results entry."""
    return len(rollout_json) > PAYLOAD_THRESHOLD


def payload_token() -> str:
    """A new publication's part of its payload key's name (:meth:`~rollq.store.keys.Keys.payload`)."""
    return secrets.token_hex(8)


def _refs(batch: Iterable[Fields]) -> list[tuple[Fields, bytes]]:
    return [(fields, fields[_REF]) for fields in batch if _REF in fields and _ROLLOUT not in fields]


def _fill(refs: list[tuple[Fields, bytes]], values: list[Any]) -> None:
    for (fields, _), value in zip(refs, values, strict=True):
        if value is not None:
            fields[_ROLLOUT] = value


def load_payloads(connection: redis.Redis, batch: Iterable[Fields]) -> None:
    """Put the rollout of each referenced entry of ``batch`` (entry fields, as read) in its ``rollout`` field: one
    ``MGET`` for the batch, none when no entry refers to a payload."""
    refs = _refs(batch)
    if refs:
        _fill(refs, list(connection.mget([ref for _, ref in refs])))


async def aload_payloads(connection: redis.asyncio.Redis, batch: Iterable[Fields]) -> None:
    """:func:`load_payloads` on an asyncio connection."""
    refs = _refs(batch)
    if refs:
        _fill(refs, list(await connection.mget([ref for _, ref in refs])))


class ReadAhead:
    """Sans-IO: how a batch's payloads are read, in batch order, in chunks of about :data:`READ_AHEAD_BYTES` sized by
    the payloads read so far (the first chunk is one payload)."""

    def __init__(self, batch: Sequence[Fields], budget: int | None = None) -> None:
        self.budget = READ_AHEAD_BYTES if budget is None else budget
        self._pending = [fields for fields in batch if _REF in fields and _ROLLOUT not in fields]
        self._next = 0
        self._read_bytes = 0
        self._read = 0

    def next_chunk(self) -> list[tuple[Fields, bytes]]:
        """The entries (and their payload keys) the next ``MGET`` reads; empty when every one was read."""
        count = 1
        if self._read:
            count = max(1, self.budget * self._read // max(1, self._read_bytes))
        chunk = self._pending[self._next : self._next + count]
        self._next += len(chunk)
        return [(fields, fields[_REF]) for fields in chunk]

    def took(self, refs: list[tuple[Fields, bytes]], values: list[Any]) -> None:
        """Put ``values`` (the MGET's reply for ``refs``) in their entries, and count their size."""
        _fill(refs, values)
        for value in values:
            if value is not None:
                self._read += 1
                self._read_bytes += len(value)


class _SentAhead:
    """One ``MGET`` sent before its reply is wanted, on a connection of its own taken from the client's pool, so that
    Redis prepares and sends the next payloads while the reader parses the ones it has. A client without one pool (a
    cluster client) sends the MGET when its reply is wanted."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.pool = client.connection_pool if isinstance(client, redis.Redis) else None
        self._connection: Any = None
        self._keys: list[bytes] = []
        self._outstanding = False

    def send(self, keys: list[bytes]) -> None:
        self._keys = keys
        if self.pool is None:
            return
        if self._connection is None:
            self._connection = self.pool.get_connection()
        try:
            self._connection.send_command("MGET", *keys)
        except BaseException:
            self.close()
            raise
        self._outstanding = True

    def receive(self) -> list[Any]:
        if self.pool is None:
            return list(self.client.mget(self._keys))
        try:
            reply = self._connection.read_response()
        except BaseException:
            self.close()
            raise
        self._outstanding = False
        return list(reply)

    def close(self) -> None:
        if self._connection is not None:
            if self._outstanding:  # a reply nobody will read: the connection must not be reused with it
                self._connection.disconnect()
            self.pool.release(self._connection)  # type: ignore[union-attr]
            self._connection, self._outstanding = None, False


def _dropped(fields: Fields) -> None:
    # A referenced entry's rollout is the loaded payload (an inline entry has no reference): back to the entry as read.
    if _REF in fields:
        fields.pop(_ROLLOUT, None)


def loaded_one_by_one(connection: redis.Redis, batch: Sequence[F]) -> Generator[F, None, None]:
    """Each entry of ``batch`` in order, its payload loaded (as :func:`load_payloads` does) by the time it is handed
    over: read in chunks (:class:`ReadAhead`), the next chunk requested as soon as the current one arrived; once the
    caller moves on, a loaded payload is dropped from its entry again, so a batch's big rollouts are not all held at
    once. A connection error is raised where the caller asks for the entry whose payload could not be read."""
    plan = ReadAhead(batch)
    ahead = _SentAhead(connection)
    try:
        chunk = plan.next_chunk()
        if chunk:
            ahead.send([ref for _, ref in chunk])
        for fields in batch:
            if chunk and chunk[0][0] is fields:
                plan.took(chunk, ahead.receive())
                chunk = plan.next_chunk()
                if chunk:
                    ahead.send([ref for _, ref in chunk])
            yield fields
            _dropped(fields)
    finally:
        ahead.close()


async def aloaded_one_by_one(connection: redis.asyncio.Redis, batch: Sequence[F]) -> AsyncGenerator[F, None]:
    """:func:`loaded_one_by_one` on an asyncio connection: the next chunk's MGET runs as a task of its own (on another
    connection of the pool) while the caller handles the current one."""
    plan = ReadAhead(batch)

    def fetch(keys: list[bytes]) -> asyncio.Task[Any]:
        return asyncio.ensure_future(connection.mget(keys))

    chunk = plan.next_chunk()
    pending = fetch([ref for _, ref in chunk]) if chunk else None
    try:
        for fields in batch:
            if chunk and chunk[0][0] is fields and pending is not None:
                plan.took(chunk, list(await pending))
                pending = None
                chunk = plan.next_chunk()
                if chunk:
                    pending = fetch([ref for _, ref in chunk])
            yield fields
            _dropped(fields)
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
        elif pending is not None and not pending.cancelled():
            pending.exception()  # retrieved: an error nobody waits for any more is not logged as unhandled


def missing_payload(fields: Fields) -> bytes | None:
    """The payload key an entry names but whose rollout could not be read (gone: the entry was trimmed meanwhile)."""
    if _ROLLOUT in fields:
        return None
    return fields.get(_REF)
