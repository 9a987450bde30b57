"""The click parameter types every command shares: a finite number, and a finite number of seconds.

click's ``FloatRange`` lets ``nan`` through (every comparison with NaN is false, so no bound is ever crossed) and,
without a ``max``, ``inf``: :class:`FiniteFloat` refuses both as a usage error (exit 2) naming the option.

They live here, in the lowest layer, because both command layers take such options and neither may import the
other's: ``rollq.ops`` (``rollq enqueue --timeout``, ``rollq status --watch``) and ``rollq.compat`` (``rollq serve-al
--lease``, ``rollq serve-agl --unresponsive-seconds``). click is a dependency of rollq's anyway; nothing of the
contract imports this module, so a worker or a producer does not load click through ``rollq.models``.
"""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloat(click.FloatRange):
    """A finite number in ``[min, max]`` (``min_open``: above ``min``)."""

    name = "float"  # the metavar, upper-cased
    what = "number"  # what a refusal calls the value

    def __init__(self, min: float | None = None, max: float | None = None, *, min_open: bool = False) -> None:
        super().__init__(min=min, max=max, min_open=min_open)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        # Finite first, so that ``inf`` is refused as such rather than as beyond a bound nobody wrote.
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite {self.what}", param, ctx)
        return super().convert(number, param, ctx)


class Seconds(FiniteFloat):
    """A finite number of seconds in ``[min, max]`` (``min_open``: above ``min``), at least 0 unless told."""

    name = "seconds"
    what = "number of seconds"

    def __init__(self, min: float = 0.0, max: float | None = None, *, min_open: bool = False) -> None:
        super().__init__(min=min, max=max, min_open=min_open)
