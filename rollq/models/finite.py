"""JSON has no NaN or Infinity: where a value holds one.

pydantic (and orjson) write a non-finite float as ``null``, so a task input or a resources version holding one
would be stored as another value than the one given, silently. The producer refuses such values instead, naming
the first place one sits (:func:`non_finite_at`). Rewards have their own check (``InvalidRewardError``); a
rollout's other values are written as the wire format says (``rollq.models.wire``).
"""

from __future__ import annotations

import math
from typing import Any


def non_finite_at(value: Any, where: str) -> str | None:
    """The path (``where`` followed by ``['key']`` / ``[index]`` steps) of the first NaN or +-Infinity in
    ``value``'s dicts, lists and tuples, or None when it holds none."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, path = stack.pop()
        if type(item) is float:
            if not math.isfinite(item):
                return path
        elif isinstance(item, dict):
            stack.extend((child, f"{path}[{key!r}]") for key, child in reversed(item.items()))
        elif isinstance(item, (list, tuple)):
            stack.extend((child, f"{path}[{i}]") for i, child in reversed(list(enumerate(item))))
        elif isinstance(item, float) and not math.isfinite(item):  # a float subclass (numpy's float64 is one)
            return path
    return None
