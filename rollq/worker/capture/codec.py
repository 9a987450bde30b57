"""JSON on the capturing proxy's path: orjson where it reads and writes what the standard library would, else json.

Every captured call reads its request body and its answer (or each streamed chunk) and writes its record's JSON
span attributes; with the standard library that was a third of the proxy's CPU per call (bench/proxy_training.py
--profile). orjson (already rollq's results-stream writer, :mod:`rollq.models.wire`) does it in a fraction, but
differs from ``json`` in three places, each kept exact here:

- reading, an int beyond 64 bits becomes a float with no error (``json`` keeps it exact). Such an int has 19
  digits or more, so a document with a run of 19 digits anywhere (a digit string in a message too) is read by
  ``json``; orjson refuses ``NaN``/``Infinity`` and lone surrogates, which ``json`` then reads as before;
- writing, a NaN or an infinity becomes ``null`` (``json`` writes ``NaN``/``Infinity``, and reads them too):
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

import orjson

_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 19
"""A run of digits long enough to be an int orjson would read as a float (beyond -2**63 .. 2**64-1), once every
digit is a ``0``: looked for with ``bytes.translate`` and ``in`` (both in C), as ``re``'s ``\\d{19}`` took three
times orjson's own parse on an answer of token ids."""


def loads(data: bytes) -> Any:
    """The JSON value in ``data``, as ``json.loads`` reads it (``ValueError`` or ``RecursionError`` when it is not
    JSON)."""
    if _LONG_NUMBER not in data.translate(_DIGITS_AS_ZERO):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # NaN, a lone surrogate, nested too deep, or not JSON at all: json decides
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


def dumps_floats(values: list[float]) -> str:
    """A list of floats as a compact JSON str, NaN and infinities written as ``json`` writes them."""
    if math.isfinite(sum(values)):  # a NaN or an infinity makes the sum one (so can an overflow: json then, too)
        return orjson.dumps(values).decode()
    return json.dumps(values, separators=(",", ":"))
