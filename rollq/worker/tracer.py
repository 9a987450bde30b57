"""Capturing the OpenTelemetry spans of each rollout, and only that rollout's.

Each rollout gets a root span in a fresh trace and its own ``contextvars``
context with that span current. Spans the agent or its libraries create inside
that context share the root's trace id, so one span processor can route every
finished span to the rollout it belongs to, even with hundreds of rollouts
overlapping in one process. Contexts follow asyncio tasks and the threads rollq
starts; a thread the agent starts itself must carry the context over
(``contextvars.copy_context().run``) for its spans to be captured.
"""

from __future__ import annotations

import contextvars
import logging
import math
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.environment_variables import OTEL_TRACES_SAMPLER
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision, ParentBased, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, TraceState
from opentelemetry.util.types import Attributes

from rollq.models.errors import InvalidRewardError
from rollq.models.outcomes import describe, message_of

from .lean_spans import LeanTracer, attributes_of, decides_as_parent_based, end_span, set_attributes

log = logging.getLogger(__name__)

_OK = Status(StatusCode.OK)

REWARD_SPAN = "reward"
REWARD_ATTRIBUTE = "rollq.reward"

# A proxy that follows whichever provider is global when a span starts; looking
# a tracer up on every call cost more than the span itself.
_agent_tracer = trace.get_tracer("rollq.agent")
# The lean tracer of the global provider when it is the SDK's, by the provider it was made for.
_agent_lean: tuple[object, LeanTracer | None] = (None, None)


def _start_agent_span(name: str, attributes: dict[str, Any]) -> trace.Span:
    """Start one of the agent helpers' spans (llm_call_span, emit_reward) through the global provider, as
    ``_agent_tracer.start_span`` does, on the lean path when that provider is the SDK's."""
    global _agent_lean
    provider = trace.get_tracer_provider()
    owner, lean = _agent_lean
    if owner is not provider:
        lean = LeanTracer(provider.get_tracer("rollq.agent")) if isinstance(provider, TracerProvider) else None
        _agent_lean = (provider, lean)
    if lean is None:
        return _agent_tracer.start_span(name, attributes=attributes)
    return lean.start_span(name, attributes)


class _RoutingProcessor(SpanProcessor):
    """Hands each finished span to the rollout whose trace it belongs to."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[int, list[ReadableSpan]] = {}

    def open(self, trace_id: int) -> None:
        with self._lock:
            self._buckets[trace_id] = []

    def close(self, trace_id: int) -> list[ReadableSpan]:
        with self._lock:
            return self._buckets.pop(trace_id, [])

    def last_reward(self, trace_id: int) -> float | None:
        """The reward of the latest-starting reward span captured so far for ``trace_id``, if any (the first
        captured of those that started at the same time)."""
        latest: Any = None
        latest_start = -1
        # One pass over the bucket, no copies: this runs for every rollout.
        with self._lock:
            for span in self._buckets.get(trace_id, ()):
                attributes = attributes_of(span)
                if REWARD_ATTRIBUTE in attributes and (span.start_time or 0) > latest_start:
                    latest, latest_start = attributes[REWARD_ATTRIBUTE], span.start_time or 0
        return None if latest is None else float(latest)

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is None:
            return
        with self._lock:
            bucket = self._buckets.get(span.context.trace_id)
            if bucket is not None:
                bucket.append(span)

    def peek(self, trace_id: int) -> list[ReadableSpan]:
        with self._lock:
            return list(self._buckets.get(trace_id, []))


class _Capture:
    """What a rollout's context knows of its trace: where its spans are, not the context itself.

    The context holds this object rather than the :class:`RolloutTrace`, which holds
    the context: that reference cycle kept each finished rollout's spans alive until
    a full garbage collection, and with 500 rollouts in flight per worker the full
    collections it brought took ~30% of the worker's CPU (bench/rollout_cpu.py).
    """

    __slots__ = ("processor", "spans", "trace_id")

    def __init__(self, processor: _RoutingProcessor, trace_id: int) -> None:
        self.processor = processor
        self.trace_id = trace_id
        self.spans: list[ReadableSpan] | None = None

    def spans_so_far(self) -> list[ReadableSpan]:
        if self.spans is not None:
            return list(self.spans)
        return sorted(self.processor.peek(self.trace_id), key=_start_time)


def _start_time(span: ReadableSpan) -> int:
    return span.start_time or 0


class RolloutTrace:
    """The tracing state of one rollout: run code in :attr:`context`, then :meth:`finish`."""

    def __init__(self, root: trace.Span, context: contextvars.Context, processor: _RoutingProcessor) -> None:
        self.root = root
        self.context = context
        self._processor = processor
        self._capture = _Capture(processor, root.get_span_context().trace_id)
        context.run(_enter, trace.set_span_in_context(root), self._capture)

    @property
    def spans(self) -> list[ReadableSpan] | None:
        """Every span captured for this rollout, root included, once :meth:`finish` ran; None before."""
        return self._capture.spans

    def finish(self, *, error: BaseException | None = None, reward: float | None = None) -> list[ReadableSpan]:
        """End the root span and return every span captured for this rollout, root included.

        A failed attempt's root gets status ERROR and the exception as an event, so
        trace backends show it as failed; a succeeded one gets status OK. Its
        ``rollq.final_reward`` is ``reward`` (from the agent's result) or else the
        last reward span's (``emit_reward``).
        """
        trace_id = self._capture.trace_id
        if reward is None:
            reward = self._processor.last_reward(trace_id)
        if reward is not None:
            set_attributes(self.root, {"rollq.final_reward": reward})
        if error is not None:
            record_error(self.root, error)
        else:
            self.root.set_status(_OK)
        end_span(self.root)
        spans = self._capture.spans = sorted(self._processor.close(trace_id), key=_start_time)
        return spans

    def spans_so_far(self) -> list[ReadableSpan]:
        """The spans finished so far (all of them, root included, once :meth:`finish` ran)."""
        return self._capture.spans_so_far()


def record_error(span: trace.Span, error: BaseException) -> None:
    """Mark ``span`` failed with ``error`` (an ``exception`` event, status ERROR), even when ``str(error)`` raises:
    the SDK's ``record_exception`` reads it, so an exception whose message cannot be read gets the event's type and
    a note instead (:func:`~rollq.models.outcomes.message_of`)."""
    try:
        span.record_exception(error)
    except BaseException:  # whatever __str__ raises
        span.add_event(
            "exception", {"exception.type": type(error).__qualname__, "exception.message": message_of(error)}
        )
    span.set_status(Status(StatusCode.ERROR, describe(error)))


_CURRENT: contextvars.ContextVar[_Capture | None] = contextvars.ContextVar("rollq_rollout_trace", default=None)
"""The spans of the rollout whose context the code runs in (set in each rollout's own context)."""


def _enter(otel: Context, capture: _Capture) -> None:
    # Run once in a rollout's new context: its root span current, its capture found by get_last_trace.
    otel_context.attach(otel)
    _CURRENT.set(capture)


class BaseTracer:
    """What a runner and its hooks see of tracing: one :class:`RolloutTrace` per rollout.

    It also offers Agent Lightning's tracer read methods: :meth:`get_last_trace` and
    :meth:`trace_context`.
    """

    _last: RolloutTrace | None = None

    def start_rollout(self, rollout_id: str, attempt: int, *, span_name: str = "rollout") -> RolloutTrace:
        raise NotImplementedError

    def capture_tracer(self) -> trace.Tracer:
        """The tracer that records captured LLM calls; they must reach the same span processors."""
        return trace.get_tracer("rollq.capture")

    def get_last_trace(self) -> list[ReadableSpan]:
        """The spans of the rollout the caller runs in: inside an agent, those finished so far; in an
        end hook, all of them. Outside any rollout, the spans of the last :meth:`trace_context` block."""
        current = _CURRENT.get() or (self._last._capture if self._last is not None else None)
        return current.spans_so_far() if current is not None else []

    @contextmanager
    def trace_context(self, name: str | None = None) -> Iterator[RolloutTrace]:
        """Capture the spans of the ``with`` block as one trace (for running an agent by hand);
        read them afterwards with :meth:`get_last_trace`."""
        rollout = self.start_rollout(name or "trace", 0, span_name=name or "trace")
        otel_token = otel_context.attach(trace.set_span_in_context(rollout.root))
        token = _CURRENT.set(rollout._capture)
        try:
            yield rollout
        finally:
            _CURRENT.reset(token)
            otel_context.detach(otel_token)
            rollout.finish()
            self._last = rollout


class OtelTracer(BaseTracer):
    """Captures spans through the process's OpenTelemetry SDK tracer provider.

    If no SDK provider is installed yet, one is created and made global, so
    libraries that call ``trace.get_tracer(...)`` report into it. With
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) set, spans are also
    exported over OTLP with the standard ``OTEL_*`` settings.
    """

    def __init__(self, provider: TracerProvider | None = None) -> None:
        if provider is None:
            current = trace.get_tracer_provider()
            if isinstance(current, TracerProvider):
                provider = current
            else:
                provider = TracerProvider(sampler=_default_sampler())
                trace.set_tracer_provider(provider)
                _export_otlp_if_configured(provider)
        self.provider = provider
        self._processor = _RoutingProcessor()
        provider.add_span_processor(self._processor)
        self._tracer = LeanTracer(provider.get_tracer("rollq"))

    def capture_tracer(self) -> trace.Tracer:
        return self.provider.get_tracer("rollq.capture")

    def start_rollout(self, rollout_id: str, attempt: int, *, span_name: str = "rollout") -> RolloutTrace:
        # An empty parent context forces a new trace id: the key spans are routed by.
        root = self._tracer.start_span(
            span_name, {"rollq.rollout_id": rollout_id, "rollq.attempt": attempt}, context=Context()
        )
        self._processor.open(root.get_span_context().trace_id)
        return RolloutTrace(root, contextvars.Context(), self._processor)


@decides_as_parent_based
class _ParentBasedAlwaysOn(ParentBased):
    """The SDK's default sampler, ``ParentBased(ALWAYS_ON)``, with the same decisions: a root span and a child
    of a sampled parent are sampled, a child of an unsampled one dropped, the parent's trace state kept.

    It looks the parent span up once where the SDK's looks it up twice more (the delegate sampler, the trace
    state): ~1.5 of the ~16 us that starting and ending a span costs, on the 7 spans of a mock rollout.
    """

    def __init__(self) -> None:
        super().__init__(ALWAYS_ON)

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        parent = trace.get_current_span(parent_context).get_span_context()
        if parent is None or not parent.is_valid:
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, None)
        if parent.trace_flags.sampled:
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, parent.trace_state)
        return SamplingResult(Decision.DROP, None, parent.trace_state)


def _default_sampler() -> Sampler | None:
    """The sampler of a provider rollq makes: the SDK's own choice (None) when ``OTEL_TRACES_SAMPLER`` names
    another than the default."""
    if os.environ.get(OTEL_TRACES_SAMPLER, "parentbased_always_on").lower() != "parentbased_always_on":
        return None
    return _ParentBasedAlwaysOn()


def _export_otlp_if_configured(provider: TracerProvider) -> None:
    if not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but rollq[otlp] is not installed; spans are not exported")
        return
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    log.info("exporting rollout spans over OTLP")


def llm_call_span(
    model: str, prompt: Any, *, system: str = "rollq", operation: str = "chat"
) -> AbstractContextManager[trace.Span]:
    """A span for one LLM call, named and attributed per the OpenTelemetry GenAI conventions.

    Use it as ``with llm_call_span(model, prompt) as span:``; the span is current inside
    the block and ended after it, and an exception leaving the block is recorded on it
    with status ERROR (as ``start_as_current_span`` does). Set the answer with
    ``span.set_attribute("gen_ai.completion", text)``; rollq turns such spans into
    triplets when the agent returns none.
    """
    return _CallSpan(model, prompt, system, operation)


class _CallSpan:
    """What ``trace.use_span(span, end_on_exit=True)`` does, as one object instead of two nested generator
    context managers (the SDK's and a ``@contextmanager`` around it): 24 -> ~16 -> ~13 us per call span."""

    __slots__ = ("_attributes", "_name", "_span", "_token")

    def __init__(self, model: str, prompt: Any, system: str, operation: str) -> None:
        self._name = f"{operation} {model}"
        self._attributes = {
            "gen_ai.operation.name": operation,
            "gen_ai.system": system,
            "gen_ai.request.model": model,
            "gen_ai.prompt": prompt if isinstance(prompt, str) else str(prompt),
        }
        self._span: trace.Span | None = None
        self._token: object = None

    def __enter__(self) -> trace.Span:
        span = self._span = _start_agent_span(self._name, self._attributes)
        self._token = otel_context.attach(trace.set_span_in_context(span))
        return span

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        span = self._span
        assert span is not None, "llm_call_span exited without being entered"
        try:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            # Exceptions only, as use_span: a CancelledError or GeneratorExit is not the call's failure.
            if isinstance(exc, Exception) and span.is_recording():
                record_error(span, exc)
        finally:
            end_span(span)


def emit_reward(value: float) -> None:
    """Record a reward for the LLM call just made, as a span rollq reads back into triplets.

    A NaN or infinite ``value`` raises :class:`InvalidRewardError` here, where the bug is.
    """
    reward = float(value)
    if not math.isfinite(reward):
        raise InvalidRewardError(f"emit_reward({reward}): rewards must be finite numbers")
    # Nothing runs inside it, so it need not be made current: 17 -> ~12 us.
    end_span(_start_agent_span(REWARD_SPAN, {REWARD_ATTRIBUTE: reward}))
