"""rollq's own spans (a rollout's root, ``llm_call_span``, ``emit_reward``) started and ended without the SDK's
per-span overhead, as the very same SDK spans.

``opentelemetry.sdk.trace.Tracer.start_span`` builds each span through three constructors, cleans every
attribute value under a lock, asks the sampler, and ``Span.end`` copies the span into a ``ReadableSpan``
through its constructor: starting and ending one of rollq's spans cost ~14 us that way, ~6 us here (seven
times a mock rollout). :class:`LeanTracer` makes the same object (an SDK ``Span``: exporters, span
processors and ``isinstance`` checks see nothing new) with the same sampling decision, ids, flags, limits,
resource and processor calls, but copies the fields all spans of a tracer share from one prototype instead of
passing them through ``__init__``, and takes the attributes as they are when they need no cleaning (plain
``str``/``bool``/``int``/``float`` values under non-empty string keys, within the attribute count limit, no
value length limit, or tuples of ``str``); :func:`end_span` and :func:`set_attributes` do what ``Span.end`` and
``Span.set_attributes`` do on the same terms.

Reading goes the same way: :func:`attributes_of` and :func:`fields_of` read an SDK span's fields without the
read-only view, tuple copies and property calls its properties make on every read.

Anything else goes to the SDK itself: another sampler than ``ParentBased(ALWAYS_ON)`` (rollq's or the SDK's
default), a disabled tracer, a child of an unsampled parent, attributes that need cleaning, an SDK that makes
spans differently from the one copied here. ``tests/worker/test_lean_spans.py`` holds the two paths to the
same span, field for field.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from time import time_ns
from types import MappingProxyType
from typing import Any

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, Tracer, _Span
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Decision, ParentBased
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import INVALID_SPAN_CONTEXT, SpanContext, SpanKind, TraceFlags

# fmt: off
_PER_SPAN = frozenset({
    "_name", "_context", "_parent", "_start_time", "_attributes", "_events", "_links", "_lock", "_resource",
    "_record_end_metrics",
})
# fmt: on
"""The fields of an SDK span :meth:`LeanTracer.start_span` sets itself; the others are copied from a prototype."""

_SDK_AS_BUILT_FOR = (
    "record_end_metrics" in _Span.__init__.__code__.co_varnames
    and hasattr(SpanProcessor, "_on_ending")
    and "_on_ending" in Span.end.__code__.co_names
)
"""Whether the installed SDK makes and ends spans as this module copies it (spans that record end metrics, and
processors told ``_on_ending``; 1.45 is what the tests hold it to): with an older SDK every span is its own."""

_PLAIN = frozenset({str, bool, int, float})
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SAMPLED_RANDOM = TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)
_get_current_span = trace.get_current_span


_DECIDING_AS_PARENT_BASED: set[type] = {ParentBased}
"""``ParentBased`` and the subclasses known to decide as it does (:func:`decides_as_parent_based`)."""


def decides_as_parent_based(sampler_class: type[ParentBased]) -> type[ParentBased]:
    """Mark a ``ParentBased`` subclass whose ``should_sample`` decides exactly as ``ParentBased``'s (rollq's
    default sampler): the lean path then takes it as it takes the SDK's own."""
    _DECIDING_AS_PARENT_BASED.add(sampler_class)
    return sampler_class


def samples_as_parent_based_always_on(sampler: Any) -> bool:
    """Whether ``sampler`` decides as ``ParentBased(ALWAYS_ON)`` with its default delegates (the SDK's default
    sampler, or rollq's): a root is sampled, a child as its parent was."""
    return (
        type(sampler) in _DECIDING_AS_PARENT_BASED
        and sampler._root is ALWAYS_ON
        and sampler._remote_parent_sampled is ALWAYS_ON
        and sampler._local_parent_sampled is ALWAYS_ON
        and sampler._remote_parent_not_sampled is ALWAYS_OFF
        and sampler._local_parent_not_sampled is ALWAYS_OFF
    )


class LeanTracer:
    """Starts spans as ``tracer`` would, cheaper when it is the SDK's (see the module docstring)."""

    __slots__ = ("_attributes_proto", "_lean", "_limits", "_span_proto", "_tracer")

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer
        self._lean = False
        self._span_proto: dict[str, Any] = {}
        self._attributes_proto: dict[str, Any] = {}
        if not isinstance(tracer, Tracer):  # a provider with OTEL_SDK_DISABLED set hands out no-op tracers
            return
        if not _SDK_AS_BUILT_FOR or not all(hasattr(tracer, name) for name in ("_tracer_config", "_tracer_metrics")):
            return  # an SDK older than the one this path copies (rollq accepts >= 1.25): its own start_span
        limits = tracer._span_limits
        self._limits = limits
        prototype = _Span(
            name="",
            context=INVALID_SPAN_CONTEXT,
            sampler=tracer.sampler,
            resource=tracer.resource,
            span_processor=tracer.span_processor,  # type: ignore[arg-type]
            kind=SpanKind.INTERNAL,
            instrumentation_info=tracer.instrumentation_info,
            limits=limits,
            instrumentation_scope=tracer._instrumentation_scope,
        )
        self._span_proto = {k: v for k, v in vars(prototype).items() if k not in _PER_SPAN}
        attributes = prototype._attributes
        assert isinstance(attributes, BoundedAttributes)
        self._attributes_proto = {k: v for k, v in vars(attributes).items() if k not in ("_dict", "_lock")}
        self._lean = samples_as_parent_based_always_on(tracer.sampler) and limits.max_span_attribute_length is None

    def start_span(
        self,
        name: str,
        attributes: Mapping[str, Any] | None = None,
        context: Context | None = None,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        start_time: int | None = None,
    ) -> trace.Span:
        tracer = self._tracer
        if not (self._lean and _plain(attributes, self._limits)):
            return tracer.start_span(name, context=context, kind=kind, attributes=attributes, start_time=start_time)
        assert isinstance(tracer, Tracer)
        if not tracer._tracer_config.is_enabled:
            return tracer.start_span(name, context=context, kind=kind, attributes=attributes, start_time=start_time)
        parent: SpanContext | None = _get_current_span(context).get_span_context()
        if parent is None or not parent.is_valid:
            parent = None
            ids = tracer.id_generator
            trace_id = ids.generate_trace_id()
            flags = _SAMPLED_RANDOM if ids.is_trace_id_random() else _SAMPLED
            state = None
        elif parent.trace_flags.sampled:
            trace_id = parent.trace_id
            flags = _SAMPLED_RANDOM if parent.trace_flags.random_trace_id else _SAMPLED
            state = parent.trace_state
        else:  # dropped by the sampler: the SDK's NonRecordingSpan
            return tracer.start_span(name, context=context, kind=kind, attributes=attributes, start_time=start_time)
        span_context = SpanContext(
            trace_id, tracer.id_generator.generate_span_id(), is_remote=False, trace_flags=flags, trace_state=state
        )
        record_end_metrics = tracer._tracer_metrics.start_span(parent, Decision.RECORD_AND_SAMPLE)

        bounded = BoundedAttributes.__new__(BoundedAttributes)
        fields = bounded.__dict__
        fields.update(self._attributes_proto)
        fields["_dict"] = dict(attributes) if attributes else {}
        fields["_lock"] = threading.Lock()

        span = _Span.__new__(_Span)
        fields = span.__dict__
        fields.update(self._span_proto)
        limits = self._limits
        fields["_name"] = name
        fields["_context"] = span_context
        fields["_parent"] = parent
        fields["_resource"] = tracer.resource
        fields["_attributes"] = bounded
        fields["_events"] = BoundedList(limits.max_events)
        fields["_links"] = BoundedList(limits.max_links)
        fields["_lock"] = threading.Lock()
        fields["_record_end_metrics"] = record_end_metrics
        fields["_kind"] = kind
        fields["_start_time"] = time_ns() if start_time is None else start_time
        tracer.span_processor.on_start(span, parent_context=context)
        return span


def end_span(span: trace.Span, end_time: int | None = None) -> None:
    """``span.end(end_time)``; for an SDK span started and not yet ended, what ``Span.end`` does with the read-only
    copy handed to the span processors made without ``ReadableSpan.__init__`` (the same fields)."""
    if type(span) is not _Span or not _SDK_AS_BUILT_FOR:
        span.end(end_time)
        return
    with span._lock:
        ended = span._start_time is None or span._end_time is not None
        if not ended:
            span._end_time = time_ns() if end_time is None else end_time
            span._attributes._immutable = True  # type: ignore[union-attr]
    if ended:  # the SDK's error or warning
        span.end(end_time)
        return
    if span._record_end_metrics:
        span._record_end_metrics()
    processor = span._span_processor
    processor._on_ending(span)
    readable = ReadableSpan.__new__(ReadableSpan)
    readable.__dict__.update(
        _name=span._name,
        _context=span._context,
        _kind=span._kind,
        _instrumentation_info=span._instrumentation_info,
        _instrumentation_scope=span._instrumentation_scope,
        _parent=span._parent,
        _start_time=span._start_time,
        _end_time=span._end_time,
        _attributes=span._attributes,
        _events=span._events,
        _links=span._links,
        _resource=span._resource,
        _status=span._status,
    )
    processor.on_end(readable)


def set_attributes(span: trace.Span, attributes: Mapping[str, Any]) -> None:
    """``span.set_attributes(attributes)``; on an SDK span not yet ended, plain attributes within its limits are
    added as the SDK would keep them (a key set again moves to the end) without cleaning each value."""
    if type(span) is _Span and _SDK_AS_BUILT_FOR:
        limits, bounded = span._limits, span._attributes
        cleaned = limits.max_span_attribute_length is not None or not _plain(attributes, limits)
        if not cleaned and type(bounded) is BoundedAttributes:
            with span._lock:
                kept, maxlen = bounded._dict, bounded.maxlen
                if span._end_time is None and (maxlen is None or len(kept.keys() | attributes.keys()) <= maxlen):
                    for key, value in attributes.items():
                        kept.pop(key, None)
                        kept[key] = value
                    return
    span.set_attributes(attributes)  # ended (the SDK warns), or attributes to clean or drop


def _plain(attributes: Mapping[str, Any] | None, limits: Any) -> bool:
    """Whether the SDK would keep ``attributes`` as they are: plain values under non-empty string keys, within
    the attribute count limit."""
    if not attributes:
        return True
    if limits.max_span_attributes is not None and len(attributes) > limits.max_span_attributes:
        return False
    for key, value in attributes.items():
        if type(key) is not str or not key:
            return False
        if type(value) not in _PLAIN and not (type(value) is tuple and all(type(v) is str for v in value)):
            return False  # a tuple of strings the SDK keeps as it is too; any other value it cleans
    return True


_ATTRIBUTES_PROPERTY = ReadableSpan.__dict__["attributes"]
_OWN_ATTRIBUTES: dict[type, bool] = {}
"""By span class: whether its ``attributes`` is the SDK's property over ``_attributes`` (not a subclass's own)."""
_NO_ATTRIBUTES: Mapping[str, Any] = MappingProxyType({})


_SDK_SPANS = (ReadableSpan, _Span)
"""The SDK's span classes, whose properties read their ``_`` fields as they are (``events`` and ``links`` as tuple
copies, ``attributes`` through a read-only view)."""


def fields_of(span: ReadableSpan) -> dict[str, Any] | None:
    """The ``_name``, ``_context``, ... fields behind an SDK span's properties, to read them without a property call
    each; None for any other class (a subclass may answer its properties its own way)."""
    return span.__dict__ if type(span) in _SDK_SPANS else None


def attributes_of(span: ReadableSpan) -> Mapping[str, Any]:
    """What ``span.attributes`` holds, for reading only: the SDK span's own mapping rather than a new read-only
    view of it (~0.8 us a read). A span class with an ``attributes`` of its own is asked for it."""
    kind = type(span)
    own = _OWN_ATTRIBUTES.get(kind)
    if own is None:
        own = _OWN_ATTRIBUTES[kind] = getattr(kind, "attributes", None) is _ATTRIBUTES_PROPERTY
    if own:
        attributes = span._attributes
        if type(attributes) is BoundedAttributes:
            return attributes._dict
        if type(attributes) is dict:
            return attributes
        if not attributes:
            return _NO_ATTRIBUTES
    found = span.attributes
    return found if found is not None else _NO_ATTRIBUTES
