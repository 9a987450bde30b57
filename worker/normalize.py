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

import functools
import json
import logging
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util import ns_to_iso_str
from opentelemetry.trace import SpanContext, format_span_id, format_trace_id

from rollq.models.contract import Rollout, Triplet
from rollq.models.errors import UnsupportedResultError

from .triplets import triplets_from_trace

log = logging.getLogger(__name__)


def _plain(attributes: Any) -> dict[str, Any] | None:
    # What a JSON round trip makes of OTel attributes: tuples become lists.
    if attributes is None:
        return None
    return {k: list(v) if isinstance(v, tuple) else v for k, v in attributes.items()}


def _context(context: SpanContext) -> dict[str, str]:
    return {
        "trace_id": f"0x{format_trace_id(context.trace_id)}",
        "span_id": f"0x{format_span_id(context.span_id)}",
        "trace_state": repr(context.trace_state),
    }


@functools.lru_cache(maxsize=64)
def _resource(resource: Resource) -> dict[str, Any]:
    return json.loads(resource.to_json(indent=None))


def span_json(span: ReadableSpan) -> dict[str, Any]:
    """A span in the contract's trace form: equal to ``json.loads(span.to_json())``.

    Built directly because that JSON round trip (pretty-printed, the resource
    re-encoded for every span) was the largest CPU cost per rollout.
    """
    status: dict[str, Any] = {"status_code": span.status.status_code.name}
    if span.status.description:
        status["description"] = span.status.description
    return {
        "name": span.name,
        "context": _context(span.context) if span.context else None,
        "kind": str(span.kind),
        "parent_id": f"0x{format_span_id(span.parent.span_id)}" if span.parent is not None else None,
        "start_time": ns_to_iso_str(span.start_time) if span.start_time else None,
        "end_time": ns_to_iso_str(span.end_time) if span.end_time else None,
        "status": status,
        "attributes": _plain(span.attributes),
        "events": [
            {"name": e.name, "timestamp": ns_to_iso_str(e.timestamp), "attributes": _plain(e.attributes)}
            for e in span.events
        ],
        "links": [{"context": _context(link.context), "attributes": _plain(link.attributes)} for link in span.links],
        "resource": _resource(span.resource),
    }


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
            log.warning(
                "agent returned a Rollout for %r while running %r; using %r", raw.rollout_id, rollout_id, rollout_id
            )
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
