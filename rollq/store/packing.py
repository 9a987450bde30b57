"""How rollq's Redis clients turn a command into bytes: big values are sent as they are, not copied.

With hiredis installed, redis-py packs every command with ``hiredis.pack_command``, which copies every argument into
a buffer it allocates anew. For the finish call of a 0.23 MB rollout that is 0.05 ms of CPU where malloc reuses a
block, 0.5 ms where it maps fresh pages (139 page faults a call, measured); in workers returning such rollouts,
packing fell from 11.4% to 8.7% of the samples (py-spy) with this module. redis-py's own Python packer sends an
argument longer than 6,000 bytes as a buffer of its own, uncopied (0.03 ms), but packs small commands 3-4x slower
than hiredis. :class:`CommandPacker` uses the Python packer for a command holding such an argument and hiredis for
every other; the bytes sent are the same (``tests/models/test_rollout_wire.py``). Replies are still parsed by hiredis.

An ordinary command goes straight to ``hiredis.pack_command``: redis-py's ``HiredisRespSerializer.pack`` around it
builds a second tuple of the arguments through a generator (to turn a ``bytearray``/``memoryview`` into ``bytes``)
and took ~4x the time hiredis itself does, for each of the ~25 commands a rollout sends (issue 24). A command with
such an argument, or a command name with a space in it (``CLIENT SETNAME``), still goes through redis-py's.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.connection import Encoder, PythonRespSerializer
from redis.exceptions import DataError
from redis.utils import HIREDIS_AVAILABLE

__all__ = ["BIG_ARGUMENT_BYTES", "CommandPacker", "PACKER", "pack_big_values_uncopied"]

BIG_ARGUMENT_BYTES = 6000
"""redis-py's own cut-off: a longer argument is sent as a buffer of its own."""


class CommandPacker:
    """A redis-py ``command_packer``: hiredis for ordinary commands, redis-py's Python packer for one carrying an
    argument longer than :data:`BIG_ARGUMENT_BYTES`."""

    def __init__(self) -> None:
        # Replies are bytes (decode_responses=False), as RQ requires; the encoder only encodes arguments.
        self._python = PythonRespSerializer(BIG_ARGUMENT_BYTES, Encoder("utf-8", "strict", False).encode)
        self._pack_command: Any = None
        if HIREDIS_AVAILABLE:
            import hiredis
            from redis.connection import HiredisRespSerializer

            self._hiredis: Any = HiredisRespSerializer()
            self._pack_command = hiredis.pack_command
        else:
            self._hiredis = self._python

    def pack(self, *args: Any) -> list[bytes]:
        # One pass: a big argument sends the command through the Python packer; a bytearray or memoryview, or a
        # command name redis-py splits (``"CLIENT SETNAME"``), through redis-py's hiredis packer, which converts it.
        plain = self._pack_command is not None
        for arg in args:
            kind = type(arg)  # the common types by identity: isinstance against a union is ~3x slower
            if kind is str or kind is bytes:
                if len(arg) > BIG_ARGUMENT_BYTES:
                    return self._python.pack(*args)  # type: ignore[no-any-return]
            elif kind is int or kind is float:
                continue
            elif isinstance(arg, (bytes, str)):  # a subclass (a StrEnum...)
                if len(arg) > BIG_ARGUMENT_BYTES:
                    return self._python.pack(*args)  # type: ignore[no-any-return]
            elif isinstance(arg, (bytearray, memoryview)):
                plain = False
        if not plain or (b" " if isinstance(args[0], bytes) else " ") in args[0]:
            return self._hiredis.pack(*args)  # type: ignore[no-any-return]
        try:
            return [self._pack_command(args)]
        except TypeError as exc:  # as redis-py's packer raises it
            raise DataError(exc).with_traceback(exc.__traceback__) from exc


PACKER = CommandPacker()
"""Stateless, shared by every connection of every client."""


def pack_big_values_uncopied(client: redis.Redis) -> None:
    """Make ``client`` (one rollq did not build, e.g. RQ's from ``--url``) pack its commands with :data:`PACKER`:
    the connections it opens from now on, and those it already has."""
    pool: Any = client.connection_pool
    client.get_connection_kwargs()["command_packer"] = PACKER
    for conn in [*getattr(pool, "_available_connections", []), *getattr(pool, "_in_use_connections", [])]:
        if hasattr(conn, "_command_packer"):
            conn._command_packer = PACKER
