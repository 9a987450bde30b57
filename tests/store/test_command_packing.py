"""rollq's command packer (rollq/store/packing.py) sends exactly the bytes redis-py's hiredis packer sends, and
refuses what it refuses, whatever the arguments' types."""

from __future__ import annotations

import enum
from typing import Any

import pytest
from redis.connection import HiredisRespSerializer
from redis.exceptions import DataError

from rollq.store.packing import BIG_ARGUMENT_BYTES, PACKER

pytest.importorskip("hiredis")


class _State(enum.StrEnum):
    BUSY = "busy"


COMMANDS: list[tuple[Any, ...]] = [
    ("HSET", "rq:job:abc", "status", "finished", "ended_at", "2026-01-01T00:00:00.000000Z"),
    ("EXPIRE", b"rq:job:abc", 500),
    ("HINCRBYFLOAT", "rq:worker:w", "total_working_time", 1.25),
    ("HSET", "rq:worker:w", "state", _State.BUSY),
    ("SET", "k", "h\u00e9llo \u2603"),
    ("SET", "k", bytearray(b"ab\x00c")),
    ("SET", "k", memoryview(b"xyz")),
    ("CLIENT SETNAME", "rollq-worker"),
    (b"CLIENT SETNAME", b"rollq-worker"),
    ("EVALSHA", "0" * 40, 2, "a", "b", -3, 2**70),
    ("SET", "k", "x" * BIG_ARGUMENT_BYTES),
    ("SET", "k", ""),
]


@pytest.mark.parametrize("command", COMMANDS, ids=range(len(COMMANDS)))
def test_an_ordinary_command_is_packed_byte_for_byte_as_redis_pys_hiredis_packer_packs_it(
    command: tuple[Any, ...],
) -> None:
    assert b"".join(PACKER.pack(*command)) == b"".join(HiredisRespSerializer().pack(*command))


@pytest.mark.parametrize("value", [None, object(), [1, 2]])
def test_an_argument_redis_cannot_send_is_a_data_error_as_with_redis_pys_packer(value: Any) -> None:
    with pytest.raises(DataError):
        HiredisRespSerializer().pack("SET", "k", value)
    with pytest.raises(DataError):
        PACKER.pack("SET", "k", value)
