"""Turning whatever the agent returned (a RolloutRawResult) into a Rollout.

- ``None``: the rollout is built from the captured spans;
- a ``float`` or ``int``: the final reward. ``bool`` is refused: ``True`` is far
  more often a bug than a reward of 1.0, so say ``float(ok)`` if you mean it;
- a list of ``Triplet``: the triplets; a list of ``dict``: the trace (OTel JSON
  spans); a list of ``ReadableSpan``: the trace, via ``span.to_json()``; an empty
  list: nothing beyond the captured spans;
- a ``Rollout``: taken as is, with the task's rollout id;
- anything else: :class:`UnsupportedResultError` naming what came back.

Then, without a trace the captured spans become it; without triplets they are
derived from the trace; without a final reward, the last triplet's reward is it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from models.contract import Rollout, Triplet
from models.errors import UnsupportedResultError

from .triplets import triplets_from_trace

log = logging.getLogger(__name__)


def span_json(span: ReadableSpan) -> dict[str, Any]:
    """A span in the contract's trace form."""
    return json.loads(span.to_json())


def _describe(value: Any) -> str:
    if isinstance(value, list):
        kinds = sorted({type(v).__name__ for v in value})
        return f"a list of {', '.join(kinds)}"
    return f"a value of type {type(value).__name__}"


def _from_list(rollout_id: str, raw: list[Any]) -> Rollout:
    if not raw:
        return Rollout(rollout_id=rollout_id)
    if all(isinstance(v, Triplet) for v in raw):
        return Rollout(rollout_id=rollout_id, triplets=raw)
    if all(isinstance(v, ReadableSpan) for v in raw):
        return Rollout(rollout_id=rollout_id, trace=[span_json(s) for s in raw])
    if all(isinstance(v, dict) for v in raw):
        return Rollout(rollout_id=rollout_id, trace=raw)
    raise UnsupportedResultError(
        f"agent returned {_describe(raw)}; a list must hold only Triplets, only span dicts or only ReadableSpans"
    )


def to_rollout(rollout_id: str, raw: Any, captured: list[ReadableSpan]) -> Rollout:
    """The Rollout for ``raw``; see the module docstring for the rules."""
    if raw is None:
        rollout = Rollout(rollout_id=rollout_id)
    elif isinstance(raw, bool):
        raise UnsupportedResultError("agent returned a bool; return float(value) if it is meant as the reward")
    elif isinstance(raw, (int, float)):
        rollout = Rollout(rollout_id=rollout_id, final_reward=float(raw))
    elif isinstance(raw, Rollout):
        if raw.rollout_id != rollout_id:
            log.warning("agent returned a Rollout for %r while running %r; using %r", raw.rollout_id, rollout_id, rollout_id)
        rollout = raw.model_copy(update={"rollout_id": rollout_id})
    elif isinstance(raw, list):
        rollout = _from_list(rollout_id, raw)
    else:
        raise UnsupportedResultError(f"agent returned {_describe(raw)}, which is not a RolloutRawResult")

    update: dict[str, Any] = {}
    trace = rollout.trace
    if trace is None and captured:
        trace = update["trace"] = [span_json(s) for s in captured]
    triplets = rollout.triplets
    if not triplets and trace:
        derived = triplets_from_trace(trace)
        if derived:
            triplets = update["triplets"] = derived
    if rollout.final_reward is None and triplets and triplets[-1].reward is not None:
        update["final_reward"] = triplets[-1].reward
    return rollout.model_copy(update=update) if update else rollout
