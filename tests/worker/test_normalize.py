"""Every RolloutRawResult case becomes the right Rollout; triplets and the final reward come from spans when absent."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util import ns_to_iso_str
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, TraceState

from rollq.models.contract import Rollout, Triplet
from rollq.models.errors import UnsupportedResultError
from rollq.worker.normalize import iso_time, span_json, to_rollout, trace_json
from rollq.worker.tracer import REWARD_ATTRIBUTE, OtelTracer, emit_reward, llm_call_span

RID = "rollout-under-test"


@pytest.fixture
def make_span() -> Any:
    """Finished SDK spans from a provider of the test's own, started one after another."""
    tracer = TracerProvider().get_tracer("tests.normalize")

    def make(name: str, **attributes: Any) -> ReadableSpan:
        with tracer.start_as_current_span(name, attributes=attributes) as span:
            pass
        assert isinstance(span, ReadableSpan)
        return span

    return make


def as_json(spans: list[ReadableSpan]) -> list[dict[str, Any]]:
    return [json.loads(s.to_json()) for s in spans]


def test_none_makes_the_captured_spans_the_trace(make_span: Any) -> None:
    captured = [make_span("rollout"), make_span("tool call", tool="search")]
    rollout = to_rollout(RID, None, captured)
    assert rollout.rollout_id == RID
    assert rollout.trace == as_json(captured)
    assert rollout.final_reward is None and rollout.triplets is None


def test_none_without_captured_spans_is_an_empty_rollout() -> None:
    assert to_rollout(RID, None, []) == Rollout(rollout_id=RID)


def test_float_is_the_final_reward_and_captured_spans_still_become_the_trace(make_span: Any) -> None:
    captured = [make_span("rollout")]
    rollout = to_rollout(RID, 0.25, captured)
    assert rollout.final_reward == 0.25
    assert rollout.trace == as_json(captured)


def test_int_is_a_float_final_reward() -> None:
    rollout = to_rollout(RID, 3, [])
    assert rollout.final_reward == 3.0 and isinstance(rollout.final_reward, float)


@pytest.mark.parametrize("value", [True, False])
def test_bool_is_refused(value: bool) -> None:
    with pytest.raises(UnsupportedResultError, match="bool"):
        to_rollout(RID, value, [])


def test_list_of_triplets_are_the_triplets_and_the_last_reward_is_final() -> None:
    triplets = [Triplet(prompt="p1", response="r1", reward=0.0), Triplet(prompt="p2", response="r2", reward=0.5)]
    rollout = to_rollout(RID, triplets, [])
    assert rollout.triplets == triplets
    assert rollout.final_reward == 0.5


def test_triplets_without_a_last_reward_leave_the_final_reward_unset() -> None:
    rollout = to_rollout(RID, [Triplet(prompt="p", response="r", reward=1.0), Triplet(prompt="p", response="r")], [])
    assert rollout.final_reward is None


def test_list_of_dicts_is_the_trace_as_given(make_span: Any) -> None:
    spans = [{"name": "a", "attributes": {"x": 1}}, {"name": "b"}]
    rollout = to_rollout(RID, spans, [make_span("captured, not used")])
    assert rollout.trace == spans
    assert rollout.triplets is None


def test_list_of_readable_spans_is_the_trace_in_otel_json(make_span: Any) -> None:
    returned = [make_span("first", step=1), make_span("second", step=2)]
    rollout = to_rollout(RID, returned, [make_span("captured, not used")])
    assert rollout.trace == as_json(returned)
    assert [s["name"] for s in rollout.trace] == ["first", "second"]


def test_rollout_is_taken_as_is_with_the_task_rollout_id(make_span: Any) -> None:
    returned = Rollout(
        rollout_id="someone-else",
        final_reward=0.75,
        logs=["l"],
        metadata={"k": "v"},
        triplets=[Triplet(prompt="p", response="r", reward=0.1)],
        trace=[{"name": "own"}],
    )
    rollout = to_rollout(RID, returned, [make_span("captured, not used")])
    assert rollout.rollout_id == RID
    assert rollout.model_dump(exclude={"rollout_id"}) == returned.model_dump(exclude={"rollout_id"})


def test_empty_list_keeps_only_the_captured_spans(make_span: Any) -> None:
    captured = [make_span("rollout")]
    rollout = to_rollout(RID, [], captured)
    assert rollout.trace == as_json(captured)
    assert rollout.triplets is None and rollout.final_reward is None


@pytest.mark.parametrize(
    ("value", "named"),
    [("a string", "str"), ({0.5}, "set"), ({"reward": 1.0}, "dict"), ((0.5,), "tuple"), (object(), "object")],
)
def test_other_types_are_refused_naming_the_type(value: Any, named: str) -> None:
    with pytest.raises(UnsupportedResultError, match=rf"\b{named}\b"):
        to_rollout(RID, value, [])


def test_a_list_mixing_kinds_is_refused_naming_them() -> None:
    with pytest.raises(UnsupportedResultError) as exc:
        to_rollout(RID, [Triplet(prompt="p", response="r"), {"name": "span"}], [])
    assert "Triplet" in str(exc.value) and "dict" in str(exc.value)


def test_legacy_genai_prompt_and_completion_spans_become_triplets_with_rewards(make_span: Any) -> None:
    captured = [
        make_span("rollout"),
        make_span("chat m", **{"gen_ai.system": "openai", "gen_ai.prompt": "2+2?", "gen_ai.completion": "5"}),
        make_span("reward", **{REWARD_ATTRIBUTE: 0.0}),
        make_span("chat m", **{"gen_ai.system": "openai", "gen_ai.prompt": "again: 2+2?", "gen_ai.completion": "4"}),
        make_span("reward", **{REWARD_ATTRIBUTE: 1.0}),
    ]
    rollout = to_rollout(RID, None, captured)
    assert [(t.prompt, t.response, t.reward) for t in rollout.triplets or []] == [
        ({"text": "2+2?"}, {"text": "5"}, 0.0),
        ({"text": "again: 2+2?"}, {"text": "4"}, 1.0),
    ]
    assert rollout.final_reward == 1.0
    assert rollout.trace == as_json(captured)


def test_genai_input_and_output_messages_become_the_prompt_and_response(make_span: Any) -> None:
    messages_in = json.dumps([{"role": "user", "content": "hi"}])
    messages_out = json.dumps([{"role": "assistant", "content": "hello"}])
    captured = [
        make_span(
            "chat m",
            **{
                "gen_ai.operation.name": "chat",
                "gen_ai.input.messages": messages_in,
                "gen_ai.output.messages": messages_out,
            },
        ),
        make_span("reward", reward=0.5),
    ]
    [triplet] = to_rollout(RID, None, captured).triplets or []
    assert (triplet.prompt, triplet.response, triplet.reward) == (
        {"messages": json.loads(messages_in)},
        {"messages": json.loads(messages_out)},
        0.5,
    )


def test_indexed_genai_prompt_contents_are_collected_in_index_order(make_span: Any) -> None:
    attributes = {f"gen_ai.prompt.{i}.content": f"message {i}" for i in (10, 2, 0, 1)}
    attributes |= {"gen_ai.request.model": "m", "gen_ai.completion.0.content": "answer"}
    [triplet] = to_rollout(RID, None, [make_span("chat m", **attributes)]).triplets or []
    assert triplet.prompt == {"messages": ["message 0", "message 1", "message 2", "message 10"]}
    assert triplet.response == {"messages": ["answer"]}
    assert triplet.reward is None


def test_spans_without_llm_calls_give_no_triplets_and_the_reward_is_kept_with_a_warning(make_span: Any) -> None:
    rollout = to_rollout(RID, None, [make_span("rollout"), make_span("reward", **{REWARD_ATTRIBUTE: 1.0})])
    assert rollout.triplets is None and rollout.final_reward == 1.0
    [warning] = rollout.metadata["warnings"]
    assert "came before any LLM call" in warning


def test_a_returned_reward_is_not_overridden_by_span_rewards(make_span: Any) -> None:
    captured = [
        make_span("chat", **{"gen_ai.system": "s", "gen_ai.prompt": "p"}),
        make_span("reward", **{REWARD_ATTRIBUTE: 1.0}),
    ]
    rollout = to_rollout(RID, 0.25, captured)
    assert rollout.final_reward == 0.25
    assert [t.reward for t in rollout.triplets or []] == [1.0]


def test_returned_triplets_are_not_replaced_by_derived_ones(make_span: Any) -> None:
    own = [Triplet(prompt="own", response="own", reward=0.3)]
    captured = [
        make_span("chat", **{"gen_ai.system": "s", "gen_ai.prompt": "p"}),
        make_span("reward", **{REWARD_ATTRIBUTE: 1.0}),
    ]
    rollout = to_rollout(RID, own, captured)
    assert rollout.triplets == own and rollout.final_reward == 0.3


def test_iso_time_writes_every_timestamp_as_the_sdk_does() -> None:
    # span_json writes times with a per-second cache instead of the SDK's ns_to_iso_str; the trace format
    # is the data contract, so they must agree to the character, rounding and carries included.
    rng = random.Random(15)
    now = time.time_ns()
    edges = [1, 999, 1_000, 499, 500, 501, 1_500, 2_500, 999_999_499, 999_999_500, 999_999_501, 999_999_999]
    samples = [now, 1_000_000_000, 86_400 * 10**9 - 1, 951_782_400 * 10**9 + 500]
    samples += [s * 10**9 + e for s in (0, 1, 1_700_000_000, 1_796_100_000, 4_102_444_799) for e in edges]
    samples += [now + rng.randrange(-(10**17), 10**17) for _ in range(20_000)]
    samples += [rng.randrange(1, 4 * 10**18) for _ in range(20_000)]
    for ns in samples:
        assert iso_time(ns) == ns_to_iso_str(ns), ns


def test_span_json_equals_the_sdk_json_of_spans_from_two_providers_and_with_a_trace_state() -> None:
    spans: list[ReadableSpan] = []
    for service in ("a", "b", "a"):
        exporter = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("tests.normalize")
        parent = SpanContext(1, 2, is_remote=True, trace_flags=TraceFlags(1), trace_state=TraceState([("k", "v")]))
        with tracer.start_as_current_span("child", context=trace.set_span_in_context(NonRecordingSpan(parent))):
            tracer.start_span("plain", kind=SpanKind.CLIENT).end()
        spans += exporter.get_finished_spans()
    assert len(spans) == 6
    for span in spans:
        assert span_json(span) == json.loads(span.to_json())


def test_span_json_equals_the_sdk_json_of_spans_with_events_links_and_an_error_whatever_their_class() -> None:
    class Renamed(ReadableSpan):  # a subclass answers through its properties, which may differ from its fields
        @property
        def name(self) -> str:
            return "renamed"

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests.normalize")
    linked = SpanContext(3, 4, is_remote=False, trace_flags=TraceFlags(1))
    live = tracer.start_span("failing", links=[trace.Link(linked, {"why": "retry"})], attributes={"ids": (1, 2)})
    live.add_event("step", {"n": 1})
    live.record_exception(ValueError("no"))
    live.set_status(trace.Status(trace.StatusCode.ERROR, "ValueError: no"))
    live.end()
    (ended,) = exporter.get_finished_spans()
    renamed = Renamed(
        "x", ended.context, ended.parent, ended.resource, ended.attributes, ended.events, ended.links,
        status=ended.status, start_time=ended.start_time, end_time=ended.end_time,
    )  # fmt: skip
    for span in (live, ended):
        assert span_json(span) == json.loads(span.to_json())  # type: ignore[arg-type]
    assert span_json(ended)["links"][0]["attributes"] == {"why": "retry"} and span_json(ended)["events"][1]["name"]
    # The SDK's to_json reads the subclass's field; span_json asks its property, as it always has.
    assert span_json(renamed) == {**json.loads(renamed.to_json()), "name": "renamed"}


def test_trace_json_of_a_rollouts_lean_spans_equals_the_sdk_json_of_each_span() -> None:
    # rollq's own spans (root, llm_call_span, emit_reward) are read field by field, not through their properties;
    # what a rollout's trace holds must still be the SDK's JSON of each, tuples as lists, events and links kept.
    provider = TracerProvider()
    tracer = OtelTracer(provider)
    previous = trace._TRACER_PROVIDER
    trace._TRACER_PROVIDER = provider  # the agent helpers' spans go through the global provider
    try:
        rollout = tracer.start_rollout("r", 1)

        def agent() -> None:
            with llm_call_span("m", "prompt") as span:
                span.set_attribute("gen_ai.completion", "answer")
                span.set_attribute("gen_ai.response.finish_reasons", ("stop", "length"))
                span.add_event("token", {"n": 1})
            emit_reward(0.5)
            with provider.get_tracer("t").start_as_current_span(
                "linked", links=[trace.Link(rollout.root.get_span_context(), {"k": (1, 2)})]
            ):
                pass

        rollout.context.run(agent)
        spans = rollout.finish(error=ValueError("no"))
    finally:
        trace._TRACER_PROVIDER = previous
    assert len(spans) == 4
    assert trace_json(spans) == [json.loads(span.to_json()) for span in spans]
