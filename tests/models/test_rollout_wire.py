"""The results stream's wire format (rollq/models/wire.py): orjson writes what pydantic wrote, byte for byte;
and how it is sent (rollq/store/packing.py): the same bytes as hiredis packs, the big value uncopied.

The fast writer must change nothing a trainer reads: for every case the bytes equal ``model_dump_json``'s, and a
value orjson would write differently (or refuse) goes through pydantic. Ints beyond 64 bits and NaN each have a
test of their own, written and read back through a real results stream.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import math
import uuid
from typing import Any

import orjson
import pytest
import redis
from pydantic import ValidationError
from pydantic_core import PydanticSerializationError
from redis.connection import HiredisRespSerializer

from rollq.models.contract import Rollout, Triplet
from rollq.models.policy import RolloutStatus
from rollq.models.wire import ORJSON_WRITTEN, parse_rollout, rollout_json
from rollq.producer import Producer
from rollq.store.connection import connect
from rollq.store.packing import BIG_ARGUMENT_BYTES, PACKER, pack_big_values_uncopied
from rollq.store.replies import Claim
from rollq.store.transitions import Finish, Lifecycle


class Colour(enum.Enum):
    RED = "red"


class Tag(str):
    pass


@dataclasses.dataclass
class Point:
    x: int = 1


class MyRollout(Rollout):
    pass


PLAIN: dict[str, Any] = {
    "control and non-ASCII": "".join(map(chr, range(0x80))) + "é\u2028\u2029\U0001f600/<>&'\"\\",
    "floats": [0.1, -0.0, 1e16, 1e-7, 5e-324, 1.7976931348623157e308, 1e22, 1e21, 1e-5, float(2**53), 1 / 3],
    "ints at the 64-bit edges": [0, -1, 2**63 - 1, -(2**63), 2**64 - 1, True, False, None],
    "nested": {"a": [{"b": []}, {}], "": ""},
    "tuple": (1, 2),
    "enum": Colour.RED,
    "uuid": uuid.UUID(int=5),
}
# Values orjson writes differently from pydantic, or not at all: they must go through pydantic.
NOT_PLAIN: dict[str, Any] = {
    "int 2**64": 2**64,
    "int -2**63 - 1": -(2**63) - 1,
    "int 10**400": 10**400,
    "aware datetime": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),
    "date": datetime.date(2024, 1, 1),
    "bytes": b"ab",
    "set": {1},
    "int key": {1: 2},
    "str subclass": Tag("x"),
    "dataclass": Point(),
}


def _rollout(value: Any) -> Rollout:
    return Rollout(
        rollout_id="r",
        final_reward=1.0,
        triplets=[Triplet(prompt={"token_ids": [1, 2, 150_000]}, response={"token_ids": [3]}, reward=0.5)],
        trace=[{"name": "span"}],
        logs=["log line"],
        metadata={"value": value},
    )


@pytest.mark.parametrize("value", PLAIN.values(), ids=PLAIN.keys())
def test_plain_values_are_written_byte_for_byte_as_pydantic_writes_them(value: Any) -> None:
    rollout = _rollout(value)
    assert rollout_json(rollout) == rollout.model_dump_json().encode() + ORJSON_WRITTEN


@pytest.mark.parametrize("value", PLAIN.values(), ids=PLAIN.keys())
def test_what_orjson_wrote_is_read_back_as_pydantics_parser_reads_it(value: Any) -> None:
    data = rollout_json(_rollout(value))
    fast, reference = parse_rollout(data), Rollout.model_validate_json(data)
    assert repr(fast.model_dump()) == repr(reference.model_dump())  # repr: 1 is not 1.0, -0.0 is not 0.0


@pytest.mark.parametrize("value", NOT_PLAIN.values(), ids=NOT_PLAIN.keys())
def test_values_orjson_would_change_or_refuse_are_written_by_pydantic(value: Any) -> None:
    rollout = _rollout(value)
    assert rollout_json(rollout) == rollout.model_dump_json().encode()  # no marker: read back by pydantic


def test_an_older_reader_reads_the_marked_bytes_and_they_stay_one_line() -> None:
    rollout = _rollout([1, 2**63 - 1, "a\nb"])
    assert b"\n" not in rollout_json(rollout)
    assert Rollout.model_validate_json(rollout_json(rollout)) == rollout
    assert json.loads(rollout_json(rollout)) == rollout.model_dump()


def test_a_rollout_subclass_is_written_by_pydantic() -> None:
    rollout = MyRollout(rollout_id="r", metadata={"a": 1})
    assert rollout_json(rollout) == rollout.model_dump_json().encode()


@pytest.mark.parametrize(
    "value", [2**64, -(2**63) - 1, 10**400, -(10**30)], ids=["2**64", "-2**63-1", "10**400", "-1e30"]
)
def test_an_int_beyond_64_bits_comes_back_exactly(value: int) -> None:
    # orjson refuses to write it and its parser would read it back as a float: pydantic does both, exactly.
    got = parse_rollout(rollout_json(_rollout({"id": value, "ids": [value, 1]})))
    assert got.metadata["value"] == {"id": value, "ids": [value, 1]}
    assert type(got.metadata["value"]["id"]) is int


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_nan_and_infinity_are_written_as_null_as_pydantic_writes_them(value: float) -> None:
    rollout = Rollout(
        rollout_id="r", triplets=[Triplet(prompt=None, response=None, reward=value)], metadata={"v": value}
    )
    data = rollout_json(rollout)
    assert data == rollout.model_dump_json().encode() + ORJSON_WRITTEN
    got = parse_rollout(data)
    assert got.metadata["v"] is None and got.triplets is not None and got.triplets[0].reward is None


@pytest.mark.parametrize("ending", [b"", b"\n", ORJSON_WRITTEN], ids=["bare", "newline", "orjson's marker"])
def test_nan_and_infinity_a_foreign_writer_put_on_the_stream_are_read_as_floats_as_before(ending: bytes) -> None:
    data = b'{"rollout_id":"r","final_reward":NaN,"metadata":{"a":Infinity,"b":-Infinity,"c":1e400}}' + ending
    got = parse_rollout(data)  # orjson refuses them: pydantic reads them, marker or not
    assert got.final_reward is not None and math.isnan(got.final_reward)
    assert got.metadata == {"a": math.inf, "b": -math.inf, "c": math.inf}


@pytest.mark.parametrize(
    "ending", [b"", b"\n", b"\t", b" \t", b"\t\n"], ids=["bare", "JSON Lines", "one tab", "space tab", "tab newline"]
)
def test_an_entry_without_orjsons_marker_is_read_by_pydantic_big_ints_exactly(ending: bytes) -> None:
    data = json.dumps({"rollout_id": "r", "metadata": {"id": 2**64, "neg": -(2**63) - 1}}).encode() + ending
    assert parse_rollout(data).metadata == {"id": 2**64, "neg": -(2**63) - 1}


def test_a_value_no_json_can_carry_raises_pydantics_serialisation_error_as_before() -> None:
    with pytest.raises(PydanticSerializationError):
        rollout_json(_rollout(object()))
    with pytest.raises(PydanticSerializationError):
        rollout_json(Rollout(rollout_id="\ud800"))  # a lone surrogate: not UTF-8


@pytest.mark.parametrize(
    "data", [b'{"rollout_id": 1}', b'{"rollout_id":"r"', b"\xef\xbb\xbf{}", b'{"rollout_id":"\xff"}'], ids=str
)
def test_a_bad_entry_is_a_validation_error(data: bytes) -> None:
    with pytest.raises(ValidationError):
        parse_rollout(data)


def test_big_ints_and_token_ids_cross_a_real_results_stream_exactly(redis_server: Any, namespace: str) -> None:
    producer = Producer.from_url(redis_server.url, namespace)
    lifecycle = Lifecycle(producer.connection, producer.keys)
    task = producer.enqueue({})
    job = producer.connection.hget(producer.keys.task(task.rollout_id), "job")
    assert isinstance(job, bytes)
    claim = lifecycle.claim(task.rollout_id, job.decode(), "w")
    assert isinstance(claim, Claim), claim
    ids = list(range(149_990, 150_000)) * 100
    sent = Rollout(
        rollout_id=task.rollout_id,
        final_reward=1.0,
        triplets=[Triplet(prompt={"token_ids": ids}, response={"token_ids": ids[:7], "logprobs": [-0.5] * 7})],
        metadata={"status": "succeeded", "attempt": claim.attempt, "big": 2**100},
    )
    lifecycle.finish(
        Finish(
            rollout_id=task.rollout_id,
            attempt=claim.attempt,
            rollout_json=rollout_json(sent),
            status=RolloutStatus.SUCCEEDED,
            results_maxlen=100,
            dead_letter=False,
            now=0.0,
        )
    )
    (got,) = producer.wait([task.rollout_id], timeout=10)
    assert got == sent


# -- sending: a rollout's JSON is not copied into one buffer (rollq/store/packing.py) ---------------------------


def _finish_like(value: bytes) -> tuple[Any, ...]:
    return ("EVALSHA", "a" * 40, 2, "rollq:task:r", "rollq:results", "r", 1, value, 1.5, "", 0)


@pytest.mark.parametrize("size", [10, BIG_ARGUMENT_BYTES, BIG_ARGUMENT_BYTES + 1, 231_000])
def test_the_packer_sends_the_bytes_hiredis_sends(size: int) -> None:
    command = _finish_like(b"1" * size)
    assert b"".join(PACKER.pack(*command)) == b"".join(HiredisRespSerializer().pack(*command))


def test_a_big_value_is_sent_as_the_object_it_is() -> None:
    value = b"1" * 231_000
    assert any(chunk is value for chunk in PACKER.pack(*_finish_like(value)))


def test_rollq_clients_and_rqs_client_of_a_worker_pack_with_it(redis_server: Any) -> None:
    assert connect(redis_server.url).get_connection_kwargs()["command_packer"] is PACKER
    client = redis.Redis.from_url(redis_server.url)  # as RQ's CLI builds it from --url
    client.ping()  # one connection open before
    pack_big_values_uncopied(client)
    held = client.connection_pool.get_connection()
    try:
        with client.pipeline(transaction=False) as pipe:  # a second connection, opened after
            value = orjson.dumps(list(range(50_000)))
            pipe.set("rollq-packing-test", value).get("rollq-packing-test").delete("rollq-packing-test")
            assert pipe.execute()[1] == value
        connections = [held, *client.connection_pool._available_connections]  # type: ignore[attr-defined]
        assert len(connections) >= 2
        assert all(c._command_packer is PACKER for c in connections)
    finally:
        client.connection_pool.release(held)
