"""Turning whatever the agent returned (a RolloutRawResult) into a Rollout.

- ``None``: the rollout is built from the captured spans;
- a ``float`` or ``int``: the final reward. ``bool`` is refused: ``True`` is far
  more often a bug than a reward of 1.0, so say ``float(ok)`` if you mean it;
- a list of ``Triplet``: the triplets; a list of ``dict``: the trace (OTel JSON
  spans); a list of ``ReadableSpan``: the trace, via ``span.to_json()``; an empty
  list: nothing beyond the captured spans;
- a ``Rollout``: taken as is, with the task's rollout id;
- Agent Lightning's ``Triplet``/``Rollout`` (or any pydantic model of that shape) count as
  rollq's: they are validated from their ``model_dump()`` (see :mod:`rollq.models.coerce`),
  and a wrong shape fails the rollout with an error naming the field;
- anything else: :class:`UnsupportedResultError` naming what came back.

Then, without a trace the captured spans become it; without triplets they are
derived from the trace (:mod:`rollq.worker.triplets`); without a final reward,
the last reward in the trace is it (or, for returned triplets, the last one's).
Rewards that cannot be placed, and calls without token ids, are listed in
``metadata["warnings"]``. A NaN or infinite reward is an :class:`InvalidRewardError`.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import DEFAULT_TRACE_STATE, SpanContext, SpanKind, Status, StatusCode

from rollq.models.coerce import coerce, is_model_like
from rollq.models.contract import Rollout, Triplet
from rollq.models.errors import InvalidRewardError, UnsupportedResultError

from .lean_spans import attributes_of, fields_of
from .rewards import check_rewards
from .triplets import derive

log = logging.getLogger(__name__)


def _plain(attributes: Any) -> dict[str, Any] | None:
    # What a JSON round trip makes of OTel attributes: tuples become lists.
    if attributes is None:
        return None
    # A span's attributes are a read-only view of the SDK's BoundedAttributes, whose copy() is a dict's copy:
    # ~0.3 us, where walking the view's items() through the Mapping ABC took ~1.6 us a span.
    copy = getattr(attributes, "copy", None)
    plain = copy() if copy is not None else None
    if type(plain) is not dict:
        plain = dict(attributes.items())
    for key, value in plain.items():
        if isinstance(value, tuple):
            plain[key] = list(value)
    return plain


def _sdk_plain(kept: dict[str, Any]) -> dict[str, Any]:
    """``_plain`` of the dict inside an SDK span's ``BoundedAttributes``, whose sequences the SDK stored as tuples
    (``tuple(value)``, never a subclass): one C-level look for a tuple, where most spans hold none."""
    plain = kept.copy()
    if tuple in set(map(type, plain.values())):
        for key, value in plain.items():
            if type(value) is tuple:
                plain[key] = list(value)
    return plain


def _context(context: SpanContext, trace_ids: dict[int, str]) -> dict[str, str]:
    state = context.trace_state
    trace_id = trace_ids.get(context.trace_id)
    if trace_id is None:
        trace_id = trace_ids[context.trace_id] = f"0x{context.trace_id:032x}"
    return {
        "trace_id": trace_id,
        "span_id": f"0x{context.span_id:016x}",
        "trace_state": "[]" if state is DEFAULT_TRACE_STATE else repr(state),
    }


# The resource's JSON, by the resource's identity: every span of a provider shares one Resource, and hashing
# it (what functools.lru_cache did) JSON-encodes it, ~5 us for each span. Entries keep their Resource alive,
# so an id is never reused while it is in here.
_RESOURCES: dict[int, tuple[Resource, dict[str, Any]]] = {}


def _resource(resource: Resource) -> dict[str, Any]:
    cached = _RESOURCES.get(id(resource))
    if cached is not None and cached[0] is resource:
        return cached[1]
    if len(_RESOURCES) >= 64:
        _RESOURCES.clear()
    found: dict[str, Any] = json.loads(resource.to_json(indent=None))
    _RESOURCES[id(resource)] = (resource, found)
    return found


# "%Y-%m-%dT%H:%M:%S." of whole UTC seconds: strftime for each timestamp was ~2 us, 14 times a rollout.
_SECONDS: dict[int, str] = {}


def iso_time(nanoseconds: int) -> str:
    """``opentelemetry.sdk.util.ns_to_iso_str(nanoseconds)``, character for character, with the date cached.

    The microseconds are rounded from the same float and in the same way (half to
    even, a carry into the next second) as ``datetime.fromtimestamp`` does there.
    """
    fraction, whole = math.modf(nanoseconds / 1e9)
    micros = round(fraction * 1e6)
    second = int(whole)
    if micros >= 1_000_000:
        micros -= 1_000_000
        second += 1
    elif micros < 0:
        micros += 1_000_000
        second -= 1
    prefix = _SECONDS.get(second)
    if prefix is None:
        if len(_SECONDS) >= 4096:
            _SECONDS.clear()
        prefix = _SECONDS[second] = datetime.fromtimestamp(second, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.")
    return f"{prefix}{micros:06d}Z"


_KINDS = {kind: str(kind) for kind in SpanKind}


def span_json(span: ReadableSpan) -> dict[str, Any]:
    """A span in the contract's trace form: equal to ``json.loads(span.to_json())``.

    Built directly because that JSON round trip (pretty-printed, the resource
    re-encoded for every span) was the largest CPU cost per rollout.
    """
    return _span_json(span, {})


def trace_json(spans: Iterable[ReadableSpan]) -> list[dict[str, Any]]:
    """``[span_json(s) for s in spans]``, the hex trace id written once for the spans of one trace."""
    trace_ids: dict[int, str] = {}
    return [_span_json(span, trace_ids) for span in spans]


_STATUS_NAMES = {code: code.name for code in StatusCode}


def _span_json(span: ReadableSpan, trace_ids: dict[int, str]) -> dict[str, Any]:
    fields = fields_of(span)
    if fields is not None:
        found = _sdk_span_json(fields, trace_ids)
        if found is not None:
            return found
        name, context, kind, parent = fields["_name"], fields["_context"], fields["_kind"], fields["_parent"]
        start, end, state, resource = fields["_start_time"], fields["_end_time"], fields["_status"], fields["_resource"]
        events, links = fields["_events"], fields["_links"]
    else:
        name, context, kind, parent = span.name, span.context, span.kind, span.parent
        start, end, state, resource = span.start_time, span.end_time, span.status, span.resource
        events, links = span.events, span.links
    status: dict[str, Any] = {"status_code": _STATUS_NAMES[state.status_code]}
    if state.description:
        status["description"] = state.description
    return {
        "name": name,
        "context": _context(context, trace_ids) if context else None,
        "kind": _KINDS[kind],
        "parent_id": f"0x{parent.span_id:016x}" if parent is not None else None,
        "start_time": iso_time(start) if start else None,
        "end_time": iso_time(end) if end else None,
        "status": status,
        "attributes": _plain(attributes_of(span)),
        "events": [
            {"name": e.name, "timestamp": iso_time(e.timestamp), "attributes": _plain(e.attributes)} for e in events
        ]
        if events
        else [],
        "links": [
            {"context": _context(link.context, trace_ids), "attributes": _plain(link.attributes)} for link in links
        ]
        if links
        else [],
        "resource": _resource(resource),
    }


def _sdk_span_json(fields: dict[str, Any], trace_ids: dict[int, str]) -> dict[str, Any] | None:
    """``_span_json`` of an SDK span whose parts are the API's own classes, read without a property call: its
    SpanContexts as the tuples they are, its Status's fields, its BoundedAttributes' dict, an empty BoundedList
    by its deque (a span's properties were ~40% of its JSON's cost). None for any other span."""
    context, parent, state = fields["_context"], fields["_parent"], fields["_status"]
    bounded, events, links = fields["_attributes"], fields["_events"], fields["_links"]
    if not (
        type(context) is SpanContext
        and (parent is None or type(parent) is SpanContext)
        and type(state) is Status
        and type(bounded) is BoundedAttributes
        and type(bounded._dict) is dict
        and type(events) is BoundedList
        and type(links) is BoundedList
    ):
        return None
    trace_id, span_id, _, _, trace_state, _ = context
    hex_trace = trace_ids.get(trace_id)
    if hex_trace is None:
        hex_trace = trace_ids[trace_id] = f"0x{trace_id:032x}"
    code, description = state._status_code, state._description
    start, end = fields["_start_time"], fields["_end_time"]
    return {
        "name": fields["_name"],
        "context": {
            "trace_id": hex_trace,
            "span_id": f"0x{span_id:016x}",
            "trace_state": "[]" if trace_state is DEFAULT_TRACE_STATE else repr(trace_state),
        },
        "kind": _KINDS[fields["_kind"]],
        "parent_id": f"0x{parent[1]:016x}" if parent is not None else None,
        "start_time": iso_time(start) if start else None,
        "end_time": iso_time(end) if end else None,
        "status": {"status_code": _STATUS_NAMES[code], "description": description}
        if description
        else {"status_code": _STATUS_NAMES[code]},
        "attributes": _sdk_plain(bounded._dict),
        "events": [
            {"name": e.name, "timestamp": iso_time(e.timestamp), "attributes": _plain(e.attributes)} for e in events
        ]
        if events._dq  # type: ignore[attr-defined]
        else [],
        "links": [
            {"context": _context(link.context, trace_ids), "attributes": _plain(link.attributes)} for link in links
        ]
        if links._dq  # type: ignore[attr-defined]
        else [],
        "resource": _resource(fields["_resource"]),
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
    if all(is_model_like(v) for v in raw):
        return Rollout(
            rollout_id=rollout_id, triplets=[coerce(Triplet, v, f"item {i} of the list") for i, v in enumerate(raw)]
        )
    if all(isinstance(v, ReadableSpan) for v in raw):
        return Rollout(rollout_id=rollout_id, trace=trace_json(raw))
    if all(isinstance(v, dict) for v in raw):
        return Rollout(rollout_id=rollout_id, trace=raw)
    raise UnsupportedResultError(
        f"agent returned {_describe(raw)}; a list must hold only Triplets, only span dicts or only ReadableSpans"
    )


def to_rollout(
    rollout_id: str, raw: Any, captured: list[ReadableSpan], *, only_agent: str | None = None, strict: bool = True
) -> Rollout:
    """The Rollout for ``raw``; see the module docstring for the rules.

    ``only_agent`` keeps the triplets of calls made under that agent; ``strict=False``
    (for a rollout that failed anyway) drops non-finite rewards instead of raising.
    """
    if raw is None:
        rollout = Rollout(rollout_id=rollout_id)
    elif isinstance(raw, bool):
        raise UnsupportedResultError("agent returned a bool; return float(value) if it is meant as the reward")
    elif isinstance(raw, (int, float)):
        try:
            reward = float(raw)
        except OverflowError:
            raise InvalidRewardError(
                f"the agent returned an integer of {int(raw).bit_length()} bits as its reward, too large for a float "
                "(rewards must be finite numbers JSON can carry)"
            ) from None
        rollout = Rollout(rollout_id=rollout_id, final_reward=reward)
    elif isinstance(raw, Rollout) or is_model_like(raw):
        raw = coerce(Rollout, raw, "the returned rollout")
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
        trace = update["trace"] = trace_json(captured)
    triplets = rollout.triplets
    final_reward = rollout.final_reward
    if not triplets and trace:
        derived = derive(trace, only_agent=only_agent, strict=strict)
        if derived.triplets:
            triplets = update["triplets"] = derived.triplets
        if final_reward is None and derived.last_reward is not None:
            final_reward = update["final_reward"] = derived.last_reward
        if derived.warnings:
            update["metadata"] = {**rollout.metadata, "warnings": derived.warnings}
    if final_reward is None and triplets and triplets[-1].reward is not None:
        final_reward = update["final_reward"] = triplets[-1].reward
    if strict:
        check_rewards(final_reward, triplets)
    elif final_reward is not None and not math.isfinite(final_reward):
        update["final_reward"] = None
    return rollout.model_copy(update=update) if update else rollout
