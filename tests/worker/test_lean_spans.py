"""rollq's lean span path makes the span the OpenTelemetry SDK would have made, or lets the SDK make it."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from rollq.worker.lean_spans import (
    LeanTracer,
    attributes_of,
    end_span,
    samples_as_parent_based_always_on,
    set_attributes,
)
from rollq.worker.tracer import _ParentBasedAlwaysOn

# Differ between any two spans, whoever made them.
OWN = {"_context", "_start_time", "_end_time", "_lock", "_attributes", "_events", "_links", "_record_end_metrics"}


def both(provider: TracerProvider, attributes: dict[str, Any] | None, context: Context | None = None) -> list[Any]:
    """The span the SDK's tracer starts and the one the lean tracer starts, with the same arguments, ended
    (the SDK's with ``end()``, the lean one with ``end_span``)."""
    tracer = provider.get_tracer("tests.lean")
    sdk = tracer.start_span("s", context=context, attributes=attributes)
    lean = LeanTracer(tracer).start_span("s", attributes, context=context)
    sdk.end()
    end_span(lean)
    return [sdk, lean]


def fields(span: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(span).items() if k not in OWN}


def same_span(sdk: Any, lean: Any) -> None:
    assert type(lean) is type(sdk)
    assert fields(lean) == fields(sdk)
    assert vars(lean).keys() == vars(sdk).keys()
    assert vars(lean._attributes) | {"_lock": None} == vars(sdk._attributes) | {"_lock": None}
    assert lean._attributes._lock is not sdk._attributes._lock
    for name in ("_events", "_links"):
        mine, theirs = getattr(lean, name), getattr(sdk, name)
        assert type(mine) is type(theirs) and list(mine) == list(theirs)
        assert mine._dq.maxlen == theirs._dq.maxlen and mine._dq is not theirs._dq
    ours, its = lean.get_span_context(), sdk.get_span_context()
    assert (ours.trace_flags, ours.trace_state, ours.is_remote) == (its.trace_flags, its.trace_state, its.is_remote)
    assert lean.start_time is not None and lean.end_time is not None


@pytest.mark.parametrize("sampler", [None, _ParentBasedAlwaysOn()], ids=["sdk-default", "rollq-default"])
def test_a_lean_root_span_is_the_sdks_field_for_field(sampler: Any) -> None:
    provider = TracerProvider(sampler=sampler)
    sdk, lean = both(provider, {"rollq.rollout_id": "r1", "rollq.attempt": 2, "x": 0.5, "ok": True}, Context())
    same_span(sdk, lean)
    assert lean.parent is None and lean.context.trace_id != sdk.context.trace_id


def test_a_lean_child_span_keeps_its_parents_trace_flags_and_state() -> None:
    state = TraceState([("vendor", "v")])
    parent = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=state)
    sdk, lean = both(TracerProvider(), {"a": "b"}, trace.set_span_in_context(NonRecordingSpan(parent)))
    same_span(sdk, lean)
    assert lean.context.trace_id == 0xABC and lean.parent == parent and lean.context.trace_state == state


def test_a_child_of_an_unsampled_parent_is_not_recorded_on_either_path() -> None:
    parent = SpanContext(0xABC, 0xDEF, is_remote=False, trace_flags=TraceFlags(TraceFlags.DEFAULT))
    sdk, lean = both(TracerProvider(), None, trace.set_span_in_context(NonRecordingSpan(parent)))
    assert type(lean) is type(sdk) is NonRecordingSpan
    assert not lean.is_recording()


def test_a_lean_client_span_with_its_own_times_and_a_tuple_of_strings_is_the_sdks_field_for_field() -> None:
    # The capture proxy's span of an LLM call: CLIENT, the call's own start and end, finish reasons as a tuple.
    provider = TracerProvider()
    tracer = provider.get_tracer("tests.lean")
    parent = trace.set_span_in_context(tracer.start_span("rollout"))
    attributes = {"gen_ai.response.finish_reasons": ("stop",), "gen_ai.usage.input_tokens": 3, "s": "x"}
    sdk = tracer.start_span("chat m", parent, trace.SpanKind.CLIENT, attributes, start_time=10)
    lean = LeanTracer(tracer).start_span("chat m", attributes, parent, kind=trace.SpanKind.CLIENT, start_time=10)
    assert type(lean._attributes._dict) is dict and lean._attributes._dict == attributes  # taken as they are
    sdk.end(end_time=20)
    end_span(lean, 20)
    same_span(sdk, lean)
    assert (lean.kind, lean.start_time, lean.end_time) == (sdk.kind, sdk.start_time, sdk.end_time)
    assert (lean.kind, lean.start_time, lean.end_time) == (trace.SpanKind.CLIENT, 10, 20)
    assert dict(lean.attributes) == dict(sdk.attributes)


@pytest.mark.parametrize(
    "attributes",
    [
        {"tokens": [1, 2, 3]},
        {"long": "x" * 50},
        {"": "empty key"},
        {"n": None},
        {f"k{i}": i for i in range(5)},
        {"mixed": ("a", 1)},
        {"ints": (1, 2)},
    ],
    ids=["a-list", "a-long-string", "an-empty-key", "none", "too-many", "a-mixed-tuple", "a-tuple-of-ints"],
)
def test_attributes_that_need_cleaning_are_cleaned_as_the_sdk_cleans_them(attributes: dict[str, Any]) -> None:
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=3, max_span_attribute_length=10))
    sdk, lean = both(provider, attributes)
    same_span(sdk, lean)
    assert dict(lean.attributes) == dict(sdk.attributes)


@pytest.mark.parametrize("sampler", [ALWAYS_OFF, ParentBased(ALWAYS_OFF), TraceIdRatioBased(0.5)])
@pytest.mark.parametrize("trace_id", [1, 2**127])
def test_another_sampler_is_left_to_decide(sampler: Any, trace_id: int) -> None:
    assert not samples_as_parent_based_always_on(sampler)
    parent = SpanContext(trace_id, 0xDEF, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    sdk, lean = both(TracerProvider(sampler=sampler), {"a": 1}, trace.set_span_in_context(NonRecordingSpan(parent)))
    assert type(lean) is type(sdk) and lean.is_recording() == sdk.is_recording()
    if isinstance(sdk, ReadableSpan):
        same_span(sdk, lean)


def test_span_processors_and_exporters_see_lean_spans_as_sdk_spans() -> None:
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    lean = LeanTracer(provider.get_tracer("tests.lean"))
    root = lean.start_span("root", {"a": 1}, context=Context())
    child = lean.start_span("child", {"b": "c"}, context=trace.set_span_in_context(root))
    child.set_attribute("d", 2)
    child.end()
    root.end()
    exported = exporter.get_finished_spans()
    assert [s.name for s in exported] == ["child", "root"]
    assert all(type(s) is ReadableSpan for s in exported)
    assert exported[0].parent == root.get_span_context() and dict(exported[0].attributes or {}) == {"b": "c", "d": 2}
    assert exported[0].to_json()  # what an exporter serialises


def test_a_disabled_sdk_hands_its_no_op_spans_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    span = LeanTracer(TracerProvider().get_tracer("tests.lean")).start_span("s", {"a": 1}, context=Context())
    assert not span.is_recording() and not isinstance(span, ReadableSpan)


def test_span_processors_get_the_same_read_only_copy_from_end_span_as_from_end() -> None:
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sdk, lean = both(provider, {"a": "b"}, Context())
    theirs, ours = exporter.get_finished_spans()
    assert type(ours) is type(theirs) is ReadableSpan
    assert {k: v for k, v in vars(ours).items() if k not in OWN} == {
        k: v for k, v in vars(theirs).items() if k not in OWN
    }
    assert vars(ours).keys() == vars(theirs).keys()
    assert ours._attributes is lean._attributes and ours.end_time == lean.end_time
    with pytest.raises(TypeError):  # ended: its attributes are frozen, as end() freezes them
        lean._attributes["c"] = 1


def test_end_span_leaves_a_second_end_and_other_spans_to_their_own_end(caplog: pytest.LogCaptureFixture) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = LeanTracer(provider.get_tracer("tests.lean")).start_span("s", {"a": 1})
    end_span(span)
    end_span(span)
    assert "Calling end() on an ended span" in caplog.text and len(exporter.get_finished_spans()) == 1
    end_span(trace.INVALID_SPAN)  # a non-recording span's end() is a no-op


def test_attributes_of_reads_what_the_attributes_property_shows() -> None:
    provider = TracerProvider()
    span = LeanTracer(provider.get_tracer("tests.lean")).start_span("s", {"a": 1, "b": "c"})
    assert attributes_of(span) == dict(span.attributes or {})
    assert attributes_of(ReadableSpan("bare")) == {} == dict(ReadableSpan("bare").attributes or {})

    class Custom(ReadableSpan):
        @property
        def attributes(self) -> Any:
            return {"own": True}

    assert attributes_of(Custom("custom", attributes={"hidden": 1})) == {"own": True}


def test_an_sdk_unlike_the_one_the_lean_path_copies_makes_every_span_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rollq.worker.lean_spans._SDK_AS_BUILT_FOR", False)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    lean = LeanTracer(provider.get_tracer("tests.lean"))
    assert not lean._lean
    end_span(lean.start_span("s", {"a": 1}))
    assert [s.name for s in exporter.get_finished_spans()] == ["s"]


def test_a_parent_based_subclass_of_its_own_is_left_to_decide() -> None:
    class Mine(ParentBased):
        def should_sample(self, *args: Any, **kwargs: Any) -> Any:
            return ALWAYS_OFF.should_sample(*args, **kwargs)

    assert samples_as_parent_based_always_on(_ParentBasedAlwaysOn()) and samples_as_parent_based_always_on(
        ParentBased(ALWAYS_ON)
    )
    assert not samples_as_parent_based_always_on(Mine(ALWAYS_ON))
    sdk, lean = both(TracerProvider(sampler=Mine(ALWAYS_ON)), {"a": 1}, Context())
    assert type(lean) is type(sdk) is NonRecordingSpan


@pytest.mark.parametrize(
    "limits", [SpanLimits(), SpanLimits(max_span_attributes=3), SpanLimits(max_span_attribute_length=4)]
)
@pytest.mark.parametrize("added", [{"a": "again", "c": 3}, {"d": [1, 2]}, {"e": "a long value"}])
def test_set_attributes_keeps_what_the_sdks_set_attributes_keeps(limits: SpanLimits, added: dict[str, Any]) -> None:
    provider = TracerProvider(span_limits=limits)
    sdk, lean = (LeanTracer(provider.get_tracer("tests.lean")).start_span("s", {"a": 1, "b": "x"}) for _ in "ab")
    sdk.set_attributes(added)
    set_attributes(lean, added)
    assert list(attributes_of(lean).items()) == list(attributes_of(sdk).items())  # order included
    assert lean._attributes.dropped == sdk._attributes.dropped


def test_set_attributes_on_an_ended_span_changes_nothing_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    span = LeanTracer(TracerProvider().get_tracer("tests.lean")).start_span("s", {"a": 1})
    end_span(span)
    set_attributes(span, {"b": 2})
    assert dict(attributes_of(span)) == {"a": 1} and "Setting attribute on ended span" in caplog.text


def test_a_span_processor_added_after_the_lean_tracer_was_made_sees_its_spans() -> None:
    provider = TracerProvider()
    lean = LeanTracer(provider.get_tracer("tests.lean"))
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    end_span(lean.start_span("late", {"a": 1}))
    assert [s.name for s in exporter.get_finished_spans()] == ["late"]
