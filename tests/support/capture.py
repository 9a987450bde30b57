"""An attempt opened on a CaptureProxy with its own in-memory tracer, as a worker opens one for a rollout; a proxy
served on its own thread or on the agents' loop; a worker's own proxy, started as a rollout starts it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import fakeredis
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rollq.models.contract import LLM, PromptTemplate
from rollq.worker import LitAgent, RolloutWorker, WorkerSettings
from rollq.worker.capture import CaptureProxy
from rollq.worker.capture.proxy import AttemptCapture
from rollq.worker.executor import AgentExecutor

MESSAGES: Any = [{"role": "user", "content": "hi"}]


class Spans:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = provider.get_tracer("tests.capture_proxy")
        self.root = self.tracer.start_span("rollout")

    def captured(self) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if (s.attributes or {}).get("rollq.llm.captured")]


def open_attempt(proxy: CaptureProxy, endpoint: str, **sampling: Any) -> tuple[LLM, AttemptCapture, Spans]:
    spans = Spans()
    resources, attempt = proxy.open_attempt(
        {
            "llm": LLM(endpoint=endpoint, model="m", sampling_parameters=sampling),
            "prompt": PromptTemplate(template="{x}", engine="f-string"),
        },
        trace.set_span_in_context(spans.root),
        spans.tracer,
    )
    llm = resources["llm"]
    assert isinstance(llm, LLM)
    return llm, attempt, spans


WHERE = ["own thread", "agents' loop"]
"""Where a proxy can be served: the ``params`` of a fixture that runs its tests both ways."""
IN_MEMORY_WHERE = [*WHERE, "own thread, agents' calls on their loop"]
"""Where calls handed over in memory can be served: on the proxy's thread, on the agents' loop that serves the
proxy, or on the agents' loop while the proxy's socket has a thread of its own (``agents_loop``, a worker's
default)."""


@contextmanager
def served_proxy(where: str, **options: Any) -> Iterator[CaptureProxy]:
    """A started :class:`CaptureProxy` (with ``options``), on a thread of its own or, for ``"agents' loop"``, on a
    running :class:`AgentExecutor`'s loop (``ROLLQ_CAPTURE_ON_AGENT_LOOP``); for ``"own thread, agents' calls on
    their loop"``, on a thread of its own with that executor's loop as its ``agents_loop``. Stopped, and that
    executor with it."""
    executor = AgentExecutor() if where != "own thread" else None
    if executor is not None:
        executor.start()
    proxy = CaptureProxy(
        loop=executor.loop if executor is not None and where == "agents' loop" else None,
        agents_loop=executor.loop if executor is not None and where != "agents' loop" else None,
        **options,
    ).start()
    try:
        yield proxy
    finally:
        proxy.stop()
        if executor is not None:
            executor.stop()


class _NoopAgent(LitAgent):
    def training_rollout(self, task: Any, rollout_id: str, resources: Any) -> float:
        return 0.0


@contextmanager
def worker_proxy(env: dict[str, str]) -> Iterator[tuple[RolloutWorker, CaptureProxy]]:
    """A RolloutWorker bootstrapped with the settings ``env`` gives (on fakeredis, an agent that does nothing) and
    its capturing proxy, started as a rollout starts it (an attempt opened, then closed); torn down on leaving."""
    worker = RolloutWorker(
        ["capture"], connection=fakeredis.FakeRedis(), agent=_NoopAgent(), settings=WorkerSettings.from_env(env)
    )
    worker.bootstrap(logging_level="WARNING")
    try:
        capture = worker._capture
        assert capture is not None
        _, attempt = capture.open_attempt(
            {"llm": LLM(endpoint="http://127.0.0.1:9/v1", model="m")}, Context(), trace.get_tracer(__name__)
        )
        assert attempt is not None and capture.proxy is not None
        attempt.close()
        yield worker, capture.proxy
    finally:
        worker.teardown()
