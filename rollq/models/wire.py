"""The one wire format of a :class:`~rollq.models.contract.Rollout`: JSON bytes on the results stream.

Every writer of a results entry (the worker's finish, the reaper, cancel, reject, the Agent Lightning gateways)
calls :func:`rollout_json`, and every reader (the trainer's readers, ``rollq rollout``, the dashboard) calls
:func:`parse_rollout`; nothing else in rollq turns a Rollout into bytes or back.

Writing: orjson when the rollout holds plain JSON values only, pydantic otherwise. A big token-id rollout is
lists of ints inside ``Any`` fields, which pydantic's serialiser walks value by value (0.23 MB: about 4x
orjson's time). orjson is asked to refuse, rather than convert, anything that is not a plain JSON value or one
of the contract's own two models (a ``datetime``, a dataclass, ``bytes``, a numpy array, a subclass of
``str``/``int``/``dict``/``list``, a key that is not a string, an int beyond 64 bits, a string with a lone
surrogate): then the whole rollout goes through ``Rollout.model_dump_json`` as before, so every value is
written as pydantic writes it (an int of any size exactly). Both write NaN and +-Infinity as ``null``; a reward
is checked finite before it gets here (:class:`~rollq.models.errors.InvalidRewardError`).

What orjson wrote ends with :data:`ORJSON_WRITTEN`, two tabs (JSON whitespace: every JSON reader skips them,
Redis's cjson included): such an entry holds no int beyond 64 bits and no NaN, so orjson reads it back exactly
(1.2-1.7x faster than pydantic's parser with the ``Rollout`` built, more on bigger rollouts: bench/big.py). Every
other entry (written by pydantic's fallback, by an older rollq, or by anything else) is read by pydantic's
``model_validate_json`` as before: ints of any size exactly, ``NaN``/``Infinity`` as floats. orjson's parser on
its own would read an int beyond 64 bits as a float without an error; the marker is what keeps it away from
such entries. An entry that carries the marker but that orjson refuses goes to pydantic too.
"""

from __future__ import annotations

from typing import Any

import orjson

from .contract import Rollout, Triplet

__all__ = ["ORJSON_WRITTEN", "rollout_json", "parse_rollout"]

ORJSON_WRITTEN = b"\t\t"
"""The last two bytes of what orjson wrote: JSON whitespace that no common writer ends a document with, and no
newline, so that an entry stays one line (``rollq rollouts tail`` prints entries as JSON lines)."""

# orjson would otherwise write these its own way (a datetime as orjson formats it, a dataclass as a dict, a
# str subclass as a str): passed through, they reach _model_fields, which refuses them.
_STRICT = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS


def _model_fields(value: Any) -> dict[str, Any]:
    # Exactly the contract's own classes: their fields are plain attributes with no custom serialiser, so their
    # __dict__ is what model_dump_json writes. A subclass or any other model may serialise itself differently.
    if type(value) is Rollout or type(value) is Triplet:
        return value.__dict__
    raise TypeError(f"not plain JSON: {type(value).__name__}")


def rollout_json(rollout: Rollout) -> bytes:
    """``rollout`` as the JSON written to the results stream: UTF-8 bytes, those pydantic would write (followed by
    :data:`ORJSON_WRITTEN` when orjson wrote them).

    Raises pydantic's ``PydanticSerializationError`` for a value nothing can write as JSON, as before.
    """
    try:
        return orjson.dumps(rollout, default=_model_fields, option=_STRICT) + ORJSON_WRITTEN
    except TypeError:  # orjson.JSONEncodeError: a value orjson does not write exactly as pydantic does
        return rollout.model_dump_json().encode()


def parse_rollout(data: bytes | str) -> Rollout:
    """The Rollout in a results entry's JSON; pydantic's ``ValidationError`` (a ``ValueError``) naming what is
    wrong otherwise."""
    marked = data.endswith(ORJSON_WRITTEN) if isinstance(data, bytes) else data.endswith(ORJSON_WRITTEN.decode())
    if marked:
        try:
            parsed = orjson.loads(data)
        except (orjson.JSONDecodeError, RecursionError):
            pass  # not what rollq's orjson path writes: read as any other entry
        else:
            return Rollout.model_validate(parsed)
    return Rollout.model_validate_json(data)
