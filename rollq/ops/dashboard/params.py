"""The query parameters of rollq's dashboard pages, checked before anything reads Redis.

A value passed on unchecked either reached Redis (``?before=garbage`` went into the summaries script's XREVRANGE:
a 500 with a traceback) or was quietly replaced (``?bucket=abc`` drew minute buckets). Each bad value is a
:class:`BadParameter` instead, which the views answer with a 400 naming the parameter.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import get_args

from rollq.models.contract import Task
from rollq.models.policy import RolloutStatus

MODES: tuple[str, ...] = tuple(
    value for arg in get_args(Task.model_fields["mode"].annotation) for value in get_args(arg) if isinstance(value, str)
)
"""The modes a task may have (``Task.mode``'s literal values): what ``?mode=`` filters on."""

STATUSES: tuple[str, ...] = tuple(status.value for status in RolloutStatus)
"""The statuses a published rollout may have: what ``?status=`` filters on."""

_STREAM_ID = re.compile(r"(\d{1,20})-(\d{1,20})")
_MAX_ID_PART = 2**64 - 1  # Redis stores both parts of a stream id as unsigned 64-bit integers


class BadParameter(ValueError):
    """Query parameter ``name`` has a value the page cannot use; ``str()`` says what it takes."""

    def __init__(self, name: str, value: str, expected: str) -> None:
        super().__init__(f"?{name}={value!r} is not {expected}")
        self.name = name


def stream_cursor(name: str, value: str | None) -> str | None:
    """``value`` as a stream entry id (``<ms>-<seq>``, the form the dashboard's own ``before`` cursors take), or
    None when empty; anything else is refused here rather than by Redis in the middle of a script."""
    if not value:
        return None
    match = _STREAM_ID.fullmatch(value)
    if match is None or any(int(part) > _MAX_ID_PART for part in match.groups()):
        raise BadParameter(name, value, "a stream entry id <milliseconds>-<sequence> (the page's own 'older' link)")
    return value


def one_of(name: str, value: str | None, allowed: Collection[str]) -> str:
    """``value``, which must be empty (no filter) or one of ``allowed``: a typo filters nothing away silently."""
    if not value:
        return ""
    if value not in allowed:
        raise BadParameter(name, value, "one of " + ", ".join(allowed))
    return value


def int_in(name: str, value: str | None, low: int, high: int, default: int) -> int:
    """``value`` as an integer from ``low`` to ``high``, ``default`` when absent or empty."""
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        number = low - 1
    if not low <= number <= high:
        raise BadParameter(name, value, f"a whole number from {low} to {high}")
    return number
