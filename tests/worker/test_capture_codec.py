"""The capturing proxy's JSON (orjson where exact, json otherwise): what it reads and writes is what json would."""

from __future__ import annotations

import json
import math
import random
import struct

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
        b'{"big": 1e400, "small": -1e400, "tiny": 1e-400}',  # beyond a float's range: json reads +-inf
        b'\xef\xbb\xbf{"bom": 1}',  # a UTF-8 byte-order mark: json skips it
        '{"utf16": "\u00e9"}'.encode("utf-16"),  # json detects UTF-16 and UTF-32
        b'{"logprob": -0.0012345678901234567, "ids": [1, 2]}',  # 19 digits in a float: no int beyond 64 bits
        b'{"deep": ' + b"[" * 900 + b"]" * 900 + b"}",  # deep, but within what json reads
    ],
)
def test_a_body_is_read_as_json_reads_it(raw: bytes) -> None:
    read, expected = codec.loads(raw), json.loads(raw)
    assert json.dumps(read) == json.dumps(expected)  # NaN != NaN: compared as json writes them
    assert [type(v) for v in read.values()] == [type(v) for v in expected.values()]


def test_numbers_are_read_to_the_same_value_and_type_as_json_reads_them() -> None:
    rng = random.Random(7)
    for _ in range(20_000):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randrange(1, 30))).lstrip("0") or "0"
        sign = rng.choice(["", "-"])
        text = rng.choice(
            [
                f"{sign}{digits}",
                f"{sign}{digits}.{rng.randrange(10 ** rng.randrange(1, 25))}",
                f"{sign}{digits}e{rng.randrange(-340, 310)}",
                repr(struct.unpack("d", rng.randbytes(8))[0]),
            ]
        )
        if text in ("nan", "inf", "-inf"):
            continue
        read, expected = codec.loads(text.encode()), json.loads(text)
        assert type(read) is type(expected) and (read == expected or read != read), text


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


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b"[1, 2,\n 3]", "[1,2,3]"),
        (b"[]", "[]"),
        (b"[-5, 18446744073709551616]", "[-5,18446744073709551616]"),  # beyond 64 bits: the digits as they came
        (b"[[1], [2]]", None),
        (b"[1.5]", None),
        (b'["1"]', None),
        (b"null", None),
        (b"1", None),
        (b"{}", None),
    ],
)
def test_only_a_flat_array_of_ints_is_kept_as_its_compact_text(raw: bytes, text: str | None) -> None:
    assert codec.int_array_text(raw) == text
