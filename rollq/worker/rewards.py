"""Reading rewards out of spans: rollq's own, Agent Lightning 0.1's AgentOps ``@reward``, and 0.3's.

- rollq: a span carrying ``rollq.reward``, or named ``reward`` with a ``reward`` attribute;
- Agent Lightning 0.2 (``emit_reward``, and ``@reward`` without AgentOps): a span named
  ``agentlightning.reward`` with a ``reward`` attribute;
- Agent Lightning 0.1 (AgentOps): an operation whose output,
  ``agentops.task.output`` or ``agentops.entity.output`` (a dict or its JSON), is
  ``{"type": "reward", "value": x}``;
- Agent Lightning 0.3: ``agentlightning.reward.<i>.name`` / ``.value`` attributes,
  the one at index 0 the primary, the others further dimensions.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rollq.models.contract import Rollout, Triplet
from rollq.models.errors import InvalidRewardError

from .tracer import REWARD_ATTRIBUTE, REWARD_SPAN

log = logging.getLogger(__name__)

_AGENTOPS_OUTPUTS = ("agentops.task.output", "agentops.entity.output")
AL_REWARD_SPAN = "agentlightning.reward"
_NAMED_REWARD_SPANS = frozenset({REWARD_SPAN, AL_REWARD_SPAN})
_AGL_PREFIX = "agentlightning.reward."
_AGL_DIMENSION = re.compile(r"^agentlightning\.reward\.(\d+)\.(name|value)$")


@dataclass(frozen=True)
class RewardReading:
    """The reward one span carries: the primary value and, for multi-dimensional ones, every named dimension."""

    value: float
    dimensions: dict[str, float] = field(default_factory=dict)


def check_finite(value: float, where: str) -> float:
    """``value``, or :class:`InvalidRewardError` saying it is NaN or infinite and where it came from."""
    if not math.isfinite(value):
        raise InvalidRewardError(f"{where} is {value}; rewards must be finite numbers")
    return value


def check_rewards(final_reward: float | None, triplets: Sequence[Triplet] | None) -> None:
    """:class:`InvalidRewardError` for the first of a rollout's rewards (its final one, then each triplet's) that is
    NaN or infinite: JSON cannot carry it."""
    if final_reward is not None:
        check_finite(final_reward, "the final reward")
    for i, triplet in enumerate(triplets or []):
        if triplet.reward is not None:
            check_finite(triplet.reward, f"the reward of triplet {i}")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _agentops(attributes: dict[str, Any]) -> float | None:
    for key in _AGENTOPS_OUTPUTS:
        output = attributes.get(key)
        if isinstance(output, str):
            try:
                output = json.loads(output)
            except ValueError:
                continue
        if isinstance(output, dict) and output.get("type") == "reward":
            return _number(output.get("value"))
    return None


def _agentlightning(attributes: dict[str, Any]) -> RewardReading | None:
    names: dict[int, str] = {}
    values: dict[int, float] = {}
    for key, raw in attributes.items():
        # Every span of a trace is asked; a prefix test turns most keys away ~3x faster than the pattern.
        if not key.startswith(_AGL_PREFIX):
            continue
        match = _AGL_DIMENSION.match(key)
        if match is None:
            continue
        index = int(match.group(1))
        if match.group(2) == "name":
            names[index] = str(raw)
        elif (number := _number(raw)) is not None:
            values[index] = number
    if not values:
        return None
    ordered = sorted(values)
    dimensions = {names.get(i, f"reward_{i}"): values[i] for i in ordered}
    return RewardReading(values[ordered[0]], dimensions if len(dimensions) > 1 else {})


def read_reward(span: dict[str, Any]) -> RewardReading | None:
    """The reward ``span`` (OTel JSON form) carries, or None when it is not a reward span."""
    return reward_of(span, span.get("attributes") or {})


def reward_of(span: dict[str, Any], attributes: dict[str, Any]) -> RewardReading | None:
    """:func:`read_reward` of ``span`` whose ``attributes`` the caller has read already."""
    value: float | None = None
    if REWARD_ATTRIBUTE in attributes:
        value = _number(attributes[REWARD_ATTRIBUTE])
    elif span.get("name") in _NAMED_REWARD_SPANS and "reward" in attributes:
        value = _number(attributes["reward"])
    elif (reading := _agentlightning(attributes)) is not None:
        return reading
    elif not attributes.keys().isdisjoint(_AGENTOPS_OUTPUTS):  # a set operation in C: most spans hold neither
        value = _agentops(attributes)
    return RewardReading(value) if value is not None else None


REWARD_MISSING = "reward_missing"
"""The metadata key that flags a succeeded rollout published with no reward at all."""

_missing_logged = False


def flag_missing_reward(rollout: Rollout) -> Rollout:
    """``rollout`` with ``metadata["reward_missing"] = True`` when it has no final reward; logged once per process.

    A trainer reads a rewardless rollout as reward 0 or drops it: either way a reward API that wrote where
    rollq does not read (a tracer not connected, a span of another name) turns into all-zero advantages with
    no error anywhere. The flag, the ``reward-missing`` counter (``rollq status``, ``/metrics``) and this log
    line make it visible on the first rollout.
    """
    global _missing_logged
    if rollout.final_reward is not None:
        return rollout
    if not _missing_logged:
        _missing_logged = True
        log.warning(
            "rollout %s succeeded with no reward: the agent returned none and no reward span reached rollq's "
            "tracer (rollq.worker.emit_reward, Agent Lightning's @reward / emit_reward, a span carrying %r). "
            "Such rollouts are flagged metadata[%r] and counted in `rollq status` and "
            "rollq_rollouts_without_reward_total; this is logged once per worker process",
            rollout.rollout_id,
            REWARD_ATTRIBUTE,
            REWARD_MISSING,
        )
    return rollout.model_copy(update={"metadata": {**rollout.metadata, REWARD_MISSING: True}})
