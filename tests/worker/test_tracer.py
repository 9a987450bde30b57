"""Per-rollout span capture: rollouts overlapping in one process each get exactly their own spans."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.trace import INVALID_SPAN_CONTEXT, NonRecordingSpan, SpanContext, StatusCode, TraceFlags, TraceState

from rollq.worker.normalize import to_rollout
from rollq.worker.tracer import (
    REWARD_ATTRIBUTE,
    OtelTracer,
    RolloutTrace,
    _default_sampler,
    _ParentBasedAlwaysOn,
    emit_reward,
    llm_call_span,
)

ROLLOUTS = 20
STEPS = 3


def assert_only_own_spans(traces: dict[int, RolloutTrace], spans_per_rollout: int) -> None:
    for marker, rollout_trace in traces.items():
        spans = rollout_trace.finish()
        root, *others = spans
        assert root.name == "rollout"
        assert root.attributes is not None and root.attributes["rollq.rollout_id"] == f"r{marker}"
        assert len(others) == spans_per_rollout, [s.name for s in spans]
        assert {s.attributes["marker"] for s in others if s.attributes is not None} == {marker}
        assert {s.context.trace_id for s in spans if s.context is not None} == {root.context.trace_id}


def test_overlapping_async_rollouts_on_one_loop_capture_only_their_own_spans() -> None:
    provider = TracerProvider()
    rollq_tracer = OtelTracer(provider)
    tracer = provider.get_tracer("tests.tracer")

    async def agent(marker: int, barrier: asyncio.Barrier) -> None:
        for step in range(STEPS):
            with tracer.start_as_current_span(f"step {step}", attributes={"marker": marker}):
                with tracer.start_as_current_span("child", attributes={"marker": marker}):
                    # Every rollout holds open spans here at the same time.
                    await barrier.wait()

    async def main() -> dict[int, RolloutTrace]:
        barrier = asyncio.Barrier(ROLLOUTS)
        traces = {i: rollq_tracer.start_rollout(f"r{i}", attempt=1) for i in range(ROLLOUTS)}
        tasks = [asyncio.create_task(agent(i, barrier), context=t.context) for i, t in traces.items()]
        await asyncio.gather(*tasks)
        return traces

    assert_only_own_spans(asyncio.run(main()), spans_per_rollout=2 * STEPS)


def test_overlapping_sync_rollouts_in_threads_capture_only_their_own_spans() -> None:
    provider = TracerProvider()
    rollq_tracer = OtelTracer(provider)
    tracer = provider.get_tracer("tests.tracer")
    barrier = threading.Barrier(ROLLOUTS, timeout=30)

    def agent(marker: int) -> None:
        for step in range(STEPS):
            with tracer.start_as_current_span(f"step {step}", attributes={"marker": marker}):
                barrier.wait()

    traces = {i: rollq_tracer.start_rollout(f"r{i}", attempt=1) for i in range(ROLLOUTS)}
    with ThreadPoolExecutor(max_workers=ROLLOUTS) as pool:
        for future in [pool.submit(t.context.run, agent, i) for i, t in traces.items()]:
            future.result()
    assert_only_own_spans(traces, spans_per_rollout=STEPS)


def test_spans_outside_any_rollout_are_captured_by_none() -> None:
    provider = TracerProvider()
    rollq_tracer = OtelTracer(provider)
    tracer = provider.get_tracer("tests.tracer")
    rollout_trace = rollq_tracer.start_rollout("r0", attempt=1)
    with tracer.start_as_current_span("stray", attributes={"marker": -1}):
        pass
    # A thread the agent starts without carrying the context over starts a trace of its own.
    stray_thread = threading.Thread(target=lambda: tracer.start_span("stray thread").end())
    rollout_trace.context.run(stray_thread.start)
    stray_thread.join()
    rollout_trace.context.run(lambda: tracer.start_span("own", attributes={"marker": 0}).end())
    assert [s.name for s in rollout_trace.finish()] == ["rollout", "own"]


def test_a_second_attempt_of_a_rollout_gets_a_trace_of_its_own() -> None:
    provider = TracerProvider()
    rollq_tracer = OtelTracer(provider)
    tracer = provider.get_tracer("tests.tracer")
    first = rollq_tracer.start_rollout("r", attempt=1)
    second = rollq_tracer.start_rollout("r", attempt=2)
    first.context.run(lambda: tracer.start_span("first", attributes={"marker": 1}).end())
    second.context.run(lambda: tracer.start_span("second", attributes={"marker": 2}).end())
    assert [s.name for s in first.finish()] == ["rollout", "first"]
    assert [s.name for s in second.finish()] == ["rollout", "second"]


def test_genai_helpers_report_through_the_global_provider_into_the_rollout() -> None:
    rollq_tracer = OtelTracer()
    assert isinstance(trace.get_tracer_provider(), TracerProvider)

    async def agent(marker: int) -> None:
        with llm_call_span("m", f"question {marker}") as span:
            await asyncio.sleep(0)
            span.set_attribute("gen_ai.completion", f"answer {marker}")
        emit_reward(marker / 10)

    async def main() -> dict[int, list[ReadableSpan]]:
        traces = {i: rollq_tracer.start_rollout(f"r{i}", attempt=1) for i in range(ROLLOUTS)}
        await asyncio.gather(*(asyncio.create_task(agent(i), context=t.context) for i, t in traces.items()))
        return {i: t.finish() for i, t in traces.items()}

    for marker, spans in asyncio.run(main()).items():
        assert [s.name for s in spans] == ["rollout", "chat m", "reward"]
        assert spans[2].attributes is not None and spans[2].attributes[REWARD_ATTRIBUTE] == marker / 10
        rollout = to_rollout(f"r{marker}", None, spans)
        assert [(t.prompt, t.response) for t in rollout.triplets or []] == [
            ({"text": f"question {marker}"}, {"text": f"answer {marker}"})
        ]
        assert rollout.final_reward == marker / 10


def test_a_finished_rollouts_trace_is_freed_without_the_cycle_collector() -> None:
    # At 500 rollouts in flight per worker, spans kept alive by a reference cycle reached the oldest GC
    # generation and made full collections ~30% of the worker's CPU (bench/rollout_cpu.py).
    rollq_tracer = OtelTracer(TracerProvider())

    def agent() -> None:
        with llm_call_span("m", "q"):
            pass
        emit_reward(1.0)

    gc.collect()
    gc.disable()
    try:
        rollout_trace = rollq_tracer.start_rollout("r", attempt=1)
        rollout_trace.context.run(agent)
        spans = rollout_trace.finish()
        # An end hook runs in the rollout's context and still reads every span.
        assert rollout_trace.context.run(rollq_tracer.get_last_trace) == spans
        trace_ref, root_ref = weakref.ref(rollout_trace), weakref.ref(spans[0])
        del rollout_trace, spans
        assert trace_ref() is None and root_ref() is None
    finally:
        gc.enable()


def test_llm_call_span_is_current_in_its_block_and_records_a_failure_like_start_as_current_span() -> None:
    rollq_tracer = OtelTracer()  # the helpers report through the global provider
    tracer = rollq_tracer.provider.get_tracer("tests.tracer")

    def agent() -> None:
        with llm_call_span("m", {"q": 1}) as span:
            tracer.start_span("inner").end()
            emit_reward(0.5)
            span.set_attribute("gen_ai.completion", "a")
        emit_reward(1.0)
        with llm_call_span("m", "boom"):
            raise ValueError("backend down")

    rollout_trace = rollq_tracer.start_rollout("r", attempt=1)
    with pytest.raises(ValueError, match="backend down"):
        rollout_trace.context.run(agent)
    root, call, inner, reward, outer_reward, failed = rollout_trace.finish()
    assert [s.name for s in (call, inner, reward, outer_reward, failed)] == [
        "chat m",
        "inner",
        "reward",
        "reward",
        "chat m",
    ]
    assert call.parent is not None and call.parent.span_id == root.context.span_id
    assert inner.parent is not None and inner.parent.span_id == call.context.span_id
    assert reward.parent is not None and reward.parent.span_id == call.context.span_id
    assert outer_reward.parent is not None and outer_reward.parent.span_id == root.context.span_id
    assert dict(call.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.system": "rollq",
        "gen_ai.request.model": "m",
        "gen_ai.prompt": "{'q': 1}",
        "gen_ai.completion": "a",
    }
    assert dict(outer_reward.attributes or {}) == {REWARD_ATTRIBUTE: 1.0}
    assert call.status.status_code is StatusCode.UNSET
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "ValueError: backend down"
    assert [e.name for e in failed.events] == ["exception"]
    assert all(s.end_time is not None for s in (call, reward, outer_reward, failed))


def test_a_cancelled_llm_call_span_ends_without_an_error_and_the_context_is_restored() -> None:
    # As start_as_current_span: a CancelledError (a BaseException) is the rollout being stopped, not a failed call.
    rollq_tracer = OtelTracer()

    async def agent() -> None:
        with llm_call_span("m", "q"):
            await asyncio.sleep(10)

    async def run() -> None:
        task = asyncio.get_running_loop().create_task(agent(), context=rollout_trace.context)
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert rollout_trace.context.run(trace.get_current_span) is rollout_trace.root

    rollout_trace = rollq_tracer.start_rollout("r", attempt=1)
    asyncio.run(run())
    _root, call = rollout_trace.finish()
    assert call.name == "chat m" and call.end_time is not None
    assert call.status.status_code is StatusCode.UNSET and not call.events


def _parent_contexts() -> dict[str, Context | None]:
    state = TraceState([("vendor", "v")])
    contexts: dict[str, Context | None] = {"none": None, "empty": Context()}
    for remote in (False, True):
        for sampled in (False, True):
            parent = SpanContext(7, 9, is_remote=remote, trace_flags=TraceFlags(int(sampled)), trace_state=state)
            contexts[f"remote={remote} sampled={sampled}"] = trace.set_span_in_context(NonRecordingSpan(parent))
    contexts["invalid parent"] = trace.set_span_in_context(NonRecordingSpan(INVALID_SPAN_CONTEXT))
    return contexts


@pytest.mark.parametrize("parent", list(_parent_contexts()))
def test_rollqs_default_sampler_decides_as_the_sdks_default(parent: str) -> None:
    context = _parent_contexts()[parent]
    attributes = {"a": 1}
    ours = _ParentBasedAlwaysOn().should_sample(context, 7, "span", attributes=attributes)
    sdks = ParentBased(ALWAYS_ON).should_sample(context, 7, "span", attributes=attributes)
    assert ours.decision is sdks.decision
    assert dict(ours.attributes) == dict(sdks.attributes)
    assert ours.trace_state == sdks.trace_state


def test_rollqs_provider_leaves_a_configured_sampler_to_the_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(_default_sampler(), _ParentBasedAlwaysOn)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "ParentBased_Always_On")
    assert isinstance(_default_sampler(), _ParentBasedAlwaysOn)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    assert _default_sampler() is None
