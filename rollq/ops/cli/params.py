"""Parameter types the commands share: a finite number of seconds.

click's ``FloatRange`` lets ``nan`` through (every comparison with NaN is false, so no bound is ever crossed) and,
without a ``max``, ``inf``: :class:`Seconds` refuses both as a usage error (exit 2) naming the option.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import click


class Seconds(click.FloatRange):
    """A finite number of seconds in ``[min, max]`` (``min_open``: above ``min``)."""

    name = "seconds"

    def __init__(self, min: float = 0.0, max: float = sys.float_info.max, *, min_open: bool = False) -> None:
        super().__init__(min=min, max=max, min_open=min_open)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return seconds
