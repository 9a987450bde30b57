"""JSON on the capturing proxy's path: msgspec reads and orjson writes where they do what the standard library would,
else json.

Every captured call reads its request body and its answer (or each streamed chunk) and writes its record's JSON
span attributes; with the standard library that was a third of the proxy's CPU per call (bench/proxy_training.py
--profile). Each of the two fast libraries differs from ``json`` somewhere, and each difference is kept exact here:

- reading (msgspec): ints of any size are read exactly, as ``json`` reads them, and a number beyond a float's range
  (``1e400``, which ``json`` reads as infinity), ``NaN``/``Infinity``, a lone surrogate and text that is not UTF-8
  (``json`` detects UTF-16 and UTF-32, and a byte-order mark) are refused: ``json`` then reads them as before.
  Everything msgspec reads, it reads as ``json`` does (``tests/worker/test_capture_codec.py``). It was orjson until
  msgspec took over the whole answers (:mod:`rollq.worker.capture.answers`): orjson reads an int beyond 64 bits as
  a float with no error, so every body was first searched for a run of 19 digits, which answers with logprobs
  carry in their floats (``-0.0012345678901234567``): those went to ``json`` whole, several times slower;
- writing (orjson), a NaN or an infinity becomes ``null`` (``json`` writes ``NaN``/``Infinity``, and reads them too):
  :func:`dumps` looks for them only when orjson wrote a ``null``, :func:`dumps_floats` checks a list of floats
  in one C-level sum; orjson refuses what it cannot write (an int beyond 64 bits, a lone surrogate, a
  non-string key) and ``json`` writes those;
- written text is compact (no spaces after ``,`` and ``:``) and non-ASCII is UTF-8 rather than ``\\u`` escapes:
  the same JSON values for every reader.
"""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec
import orjson

_decode = msgspec.json.Decoder().decode


def loads(data: bytes) -> Any:
    """The JSON value in ``data``, as ``json.loads`` reads it (``ValueError`` or ``RecursionError`` when it is not
    JSON)."""
    try:
        return _decode(data)
    except (msgspec.MsgspecError, RecursionError):  # NaN, 1e400, a lone surrogate, not UTF-8, too deep, not JSON
        return json.loads(data)


def _non_finite(value: Any) -> bool:
    if type(value) is float:
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_non_finite(v) for v in value)
    return False


def dumps(value: Any) -> bytes:
    """``value`` as compact JSON bytes, as ``json.dumps`` writes its values (``TypeError``/``ValueError`` for what
    ``json`` cannot write either)."""
    try:
        written = orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError: a big int, a lone surrogate, a non-string key, a custom type
        return json.dumps(value, separators=(",", ":")).encode()
    if b"null" in written and _non_finite(value):  # orjson wrote a NaN or an infinity as null
        return json.dumps(value, separators=(",", ":")).encode()
    return written


def dumps_str(value: Any) -> str:
    """:func:`dumps` as a str (an OpenTelemetry attribute)."""
    return dumps(value).decode()


_WHITESPACE = b" \t\r\n"
_INT_ARRAY_CHARS = b"0123456789,-"


def int_array_text(raw: bytes) -> str | None:
    """The compact text of ``raw``, a valid JSON value, when it is a flat array of ints (``[1, 2]`` -> ``"[1,2]"``),
    else None. Every int stays exact, however long: nothing is read into a number."""
    text = raw.translate(None, _WHITESPACE)  # JSON has no whitespace inside a number
    if text[:1] == b"[" and text.translate(None, _INT_ARRAY_CHARS) == b"[]":  # valid JSON: only ints between
        return text.decode()
    return None


def dumps_floats(values: list[float]) -> str:
    """A list of floats as a compact JSON str, NaN and infinities written as ``json`` writes them."""
    if math.isfinite(sum(values)):  # a NaN or an infinity makes the sum one (so can an overflow: json then, too)
        return orjson.dumps(values).decode()
    return json.dumps(values, separators=(",", ":"))
