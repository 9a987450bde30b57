"""The capturing proxy's JSON (orjson where exact, json otherwise): what it reads and writes is what json would."""

from __future__ import annotations

import json
import math

import pytest

from rollq.worker.capture import codec

BIG = 2**70


@pytest.mark.parametrize(
    "raw",
    [
        b'{"seed": 1180591620717411303424, "n": 1}',  # beyond 64 bits: orjson would read a float
        b'{"seed": -9223372036854775809}',  # below -2**63, 19 digits
        b'{"ids": [1, 18446744073709551616], "t": "x"}',  # 2**64: the run of digits after other numbers
        b'{"ids": [9223372036854775807, 18446744073709551615]}',  # the largest orjson reads exactly, 19/20 digits
        b'{"logprob": NaN, "x": [Infinity, -Infinity]}',  # not JSON, but json reads it
        b'{"content": "\\ud800"}',  # a lone surrogate
        b'{"a": [1, 2.5, "\\u00e9", null, true], "a": {"b": []}}',  # a key twice: the last one wins in both
    ],
)
def test_a_body_is_read_as_json_reads_it(raw: bytes) -> None:
    read, expected = codec.loads(raw), json.loads(raw)
    assert json.dumps(read) == json.dumps(expected)  # NaN != NaN: compared as json writes them
    assert [type(v) for v in read.values()] == [type(v) for v in expected.values()]


def test_what_is_not_json_is_refused_as_json_refuses_it() -> None:
    with pytest.raises(ValueError):
        codec.loads(b'{"model": ')


@pytest.mark.parametrize(
    "value",
    [
        [{"role": "assistant", "content": None, "score": float("nan")}],  # a null beside a NaN
        {"ids": [BIG, 1]},
        {1: "a key that is not a string"},
        ["\ud800"],
        {"text": "é", "ok": [None, True, 0.1]},
    ],
)
def test_a_value_is_written_as_json_writes_it(value: object) -> None:
    # Read back by json, the same values (NaN included: compared as json writes them again).
    assert json.dumps(json.loads(codec.dumps(value))) == json.dumps(json.loads(json.dumps(value)))


@pytest.mark.parametrize("values", [[-0.5, -1.25], [-0.5, float("-inf")], [float("nan")], [1e308, 1e308]])
def test_logprobs_keep_infinities_and_nan_as_json_writes_them(values: list[float]) -> None:
    written = codec.dumps_floats(values)
    assert written == json.dumps(values, separators=(",", ":"))
    back = json.loads(written)
    assert [math.isnan(a) if math.isnan(b) else a == b for a, b in zip(back, values, strict=True)] == [True] * len(
        values
    )
