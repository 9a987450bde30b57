"""The capturing proxy on its own: addresses, refusals, streaming, pass-through, span parents."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from rollq.models.contract import LLM, PromptTemplate
from rollq.models.llm_options import with_options
from rollq.worker.capture import CaptureProxy
from rollq.worker.capture.proxy import AttemptCapture
from rollq.worker.capture.routing import rendezvous_order
from tests.support.capture import MESSAGES, WHERE, Spans, open_attempt, served_proxy
from tests.support.fake_vllm import FakeVLLM


@pytest.fixture(scope="module", params=WHERE)
def proxy(request: pytest.FixtureRequest) -> Iterator[CaptureProxy]:
    """The proxy on a thread and loop of its own, and served on the async agents' loop (ROLLQ_CAPTURE_ON_AGENT_LOOP):
    every test here holds for both."""
    with served_proxy(request.param) as started:
        yield started


def test_each_attempt_gets_an_unguessable_loopback_address_and_other_resources_are_untouched(
    proxy: CaptureProxy, fake: FakeVLLM
) -> None:
    spans = Spans()
    original = {"llm": LLM(endpoint=fake.url, model="m"), "p": PromptTemplate(template="t", engine="f-string")}
    first, _ = proxy.open_attempt(original, trace.set_span_in_context(spans.root), spans.tracer)
    second, _ = proxy.open_attempt(original, trace.set_span_in_context(spans.root), spans.tracer)
    a, b = first["llm"], second["llm"]
    assert isinstance(a, LLM) and isinstance(b, LLM)
    assert a.endpoint.startswith(f"http://127.0.0.1:{proxy.port}/") and a.endpoint.endswith("/v1")
    assert a.endpoint != b.endpoint and len(a.endpoint.split("/")[3]) >= 32
    assert original["llm"].endpoint == fake.url  # the shared resources are not modified
    assert first["p"] is original["p"]


def test_a_revoked_or_unknown_address_is_refused_with_404(proxy: CaptureProxy, fake: FakeVLLM) -> None:
    llm, attempt, spans = open_attempt(proxy, fake.url)
    client = openai.OpenAI(base_url=llm.endpoint, api_key="none", max_retries=0)
    client.chat.completions.create(model="m", messages=MESSAGES)
    attempt.close()
    received = len(fake.received)
    with pytest.raises(openai.NotFoundError, match="unknown or expired"):
        client.chat.completions.create(model="m", messages=MESSAGES)
    guessed = httpx.post(f"http://127.0.0.1:{proxy.port}/not-a-token/v1/chat/completions", json={"messages": []})
    assert guessed.status_code == 404
    assert len(fake.received) == received  # nothing reached the backend
    assert len(spans.captured()) == 1 and len(attempt.calls) == 1


def test_streamed_chunks_reach_the_client_as_sent_and_the_call_is_recorded_before_the_stream_ends(
    proxy: CaptureProxy, fake: FakeVLLM
) -> None:
    llm, attempt, _ = open_attempt(proxy, fake.url)
    fake.chunk_pause = 0.2
    try:
        arrivals = []
        started = time.monotonic()
        body = {"model": "m", "messages": MESSAGES, "stream": True}
        with httpx.stream("POST", f"{llm.endpoint}/chat/completions", json=body, timeout=30) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    arrivals.append(time.monotonic() - started)
    finally:
        fake.chunk_pause = 0.0
    # "reply N" in 3-character deltas: 3 pauses of 0.2 s between the first content chunk and the end.
    assert arrivals[-1] - arrivals[1] >= 0.35, arrivals
    [call] = attempt.calls
    assert call.streamed and call.response_token_ids == fake.sent[call.response_id or ""].token_ids


def test_other_paths_pass_through_uncaptured(proxy: CaptureProxy, fake: FakeVLLM) -> None:
    llm, attempt, spans = open_attempt(proxy, fake.url)
    models = openai.OpenAI(base_url=llm.endpoint, api_key="none").models.list()
    assert [m.id for m in models.data] == ["fake-model"]
    assert attempt.calls == [] and spans.captured() == []


def test_an_endpoint_without_v1_is_forwarded_path_for_path(proxy: CaptureProxy, fake: FakeVLLM) -> None:
    llm, attempt, _ = open_attempt(proxy, f"http://127.0.0.1:{fake.port}")
    assert not llm.endpoint.endswith("/v1")
    answer = httpx.post(f"{llm.endpoint}/v1/completions", json={"model": "m", "prompt": "p"}, timeout=30)
    assert answer.status_code == 200
    [call] = attempt.calls
    assert (
        call.path == "/v1/completions" and call.prompt_token_ids == fake.sent[call.response_id or ""].prompt_token_ids
    )


def test_a_call_sent_with_a_traceparent_of_the_attempt_nests_under_that_span(
    proxy: CaptureProxy, fake: FakeVLLM
) -> None:
    llm, _, spans = open_attempt(proxy, fake.url)
    with spans.tracer.start_as_current_span("agent step", context=trace.set_span_in_context(spans.root)) as step:
        headers: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(headers)
        httpx.post(f"{llm.endpoint}/chat/completions", json={"model": "m", "messages": MESSAGES}, headers=headers)
    httpx.post(f"{llm.endpoint}/chat/completions", json={"model": "m", "messages": MESSAGES})
    nested, plain = spans.captured()
    assert nested.parent is not None and nested.parent.span_id == step.get_span_context().span_id
    assert plain.parent is not None and plain.parent.span_id == spans.root.get_span_context().span_id


def test_a_backend_out_of_reach_answers_502_and_is_recorded(proxy: CaptureProxy) -> None:
    from tests.support.servers import free_port

    llm, attempt, spans = open_attempt(proxy, f"http://127.0.0.1:{free_port()}/v1")
    answer = httpx.post(f"{llm.endpoint}/chat/completions", json={"model": "m", "messages": MESSAGES}, timeout=30)
    assert answer.status_code == 502 and "could not reach" in answer.json()["error"]["message"]
    failed = attempt.failed_last_call()
    assert failed is not None and failed.status == 502
    [span] = spans.captured()
    assert span.attributes is not None and span.attributes["error.type"] == "502"


@pytest.mark.parametrize("raw", [b"{}", b'  {"model": "m", "messages": []}', b'{"model":"m","stream":true}\n'])
def test_fields_are_spliced_into_the_request_body_as_valid_json(raw: bytes) -> None:
    import json

    from rollq.worker.capture.proxy import _with_fields

    body = json.loads(raw)
    sent = json.loads(_with_fields(raw, body, {"return_token_ids": True, "logprobs": True}))
    assert sent == {**body, "return_token_ids": True, "logprobs": True}
    assert _with_fields(raw, body, {}) is raw


def test_agent_lightning_01s_patched_vllm_response_token_ids_at_the_top_level_are_read(proxy: CaptureProxy) -> None:
    old = FakeVLLM(old_vllm=True).start()
    try:
        llm, attempt, _ = open_attempt(proxy, old.url)
        answer = openai.OpenAI(base_url=llm.endpoint, api_key="none").chat.completions.create(
            model="m", messages=MESSAGES
        )
        [call] = attempt.calls
        sent = old.sent[answer.id]
        assert call.prompt_token_ids == sent.prompt_token_ids and call.response_token_ids == sent.token_ids
        assert not call.token_ids_missing
    finally:
        old.stop()


def test_a_proxy_llm_addressed_by_rollout_and_attempt_is_captured_and_forwarded(
    proxy: CaptureProxy, fake: FakeVLLM
) -> None:
    from rollq.models.resource_kinds import ProxyLLM

    spans = Spans()
    resources, attempt = proxy.open_attempt(
        {"llm": ProxyLLM(endpoint=fake.url, model="m", api_key="sk-9")},
        trace.set_span_in_context(spans.root),
        spans.tracer,
    )
    llm = resources["llm"]
    assert isinstance(llm, ProxyLLM) and llm.api_key == "sk-9"  # the key survives the rewrite
    base = llm.get_base_url("r-1", "attempt-1")
    assert "/rollout/r-1/attempt/attempt-1/v1" in base
    answer = openai.OpenAI(base_url=base, api_key=llm.api_key).chat.completions.create(model="m", messages=MESSAGES)
    assert [c.response_id for c in attempt.calls] == [answer.id] and len(spans.captured()) == 1
    assert fake.authorizations[-1] == "Bearer sk-9"


def test_calls_to_the_environments_openai_url_are_attributed_by_the_calling_rollouts_context(
    fake: FakeVLLM,
) -> None:
    import contextvars

    from rollq.worker.capture.ambient import CURRENT_ATTEMPT

    proxy = CaptureProxy().start()
    try:
        environ = {"OPENAI_API_BASE": fake.url, "OPENAI_BASE_URL": fake.url, "HOME": "/"}
        [upstream] = proxy.serve_environment(concurrency=4, environ=environ)
        assert environ["OPENAI_API_BASE"] == environ["OPENAI_BASE_URL"] == f"http://127.0.0.1:{proxy.port}/env-0/v1"
        attempts = []
        for _ in range(2):
            spans = Spans()
            _, attempt = proxy.open_attempt({}, trace.set_span_in_context(spans.root), spans.tracer)
            context = contextvars.copy_context()
            context.run(CURRENT_ATTEMPT.set, attempt.header_token)
            attempts.append((attempt, context))

        def call(content: str) -> str:
            client = openai.OpenAI(base_url=environ["OPENAI_API_BASE"], api_key="none", max_retries=0)
            return client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}]).id

        ids = [context.run(call, f"from {i}") for i, (_, context) in enumerate(attempts)]
        for i, (attempt, _) in enumerate(attempts):
            [captured] = attempt.calls
            assert captured.response_id == ids[i] and captured.messages == [{"role": "user", "content": f"from {i}"}]
            assert captured.resource == "$OPENAI_BASE_URL" or captured.resource == "$OPENAI_API_BASE"
        # Outside any rollout's context, with two open and up to 4 at once: refused, not guessed.
        received = len(fake.received)
        with pytest.raises(openai.BadRequestError, match="cannot tell which rollout"):
            call("from nowhere")
        assert len(fake.received) == received and all(len(a.calls) == 1 for a, _ in attempts)
        assert "X-Rollq-Attempt" not in str(fake.received[-1])
    finally:
        proxy.stop()


def test_a_call_that_does_not_say_its_rollout_is_attributed_when_the_worker_runs_one_at_a_time(
    fake: FakeVLLM,
) -> None:
    proxy = CaptureProxy().start()
    try:
        environ = {"OPENAI_BASE_URL": fake.url}
        proxy.serve_environment(concurrency=1, environ=environ)
        spans = Spans()
        _, attempt = proxy.open_attempt({}, trace.set_span_in_context(spans.root), spans.tracer)
        answer = httpx.post(f"{environ['OPENAI_BASE_URL']}/chat/completions", json={"model": "m", "messages": MESSAGES})
        assert answer.status_code == 200 and [c.response_id for c in attempt.calls] == [answer.json()["id"]]
        attempt.close()
        # With no rollout open the call belongs to none: forwarded, recorded nowhere.
        late = httpx.post(f"{environ['OPENAI_BASE_URL']}/chat/completions", json={"model": "m", "messages": MESSAGES})
        assert late.status_code == 200 and len(attempt.calls) == 1 and late.json()["id"] in fake.sent
    finally:
        proxy.stop()


def _upstream_calls(proxy: CaptureProxy, servers: list[FakeVLLM], **options: Any) -> tuple[LLM, AttemptCapture]:
    spans = Spans()
    urls = [s.url for s in servers]
    llm = with_options(LLM(endpoint=servers[0].url, model="m"), endpoints=urls, **options)
    # A rollout whose first choice is servers[0] (the servers' ports, hence the order, change from run to run).
    rollout_id = next(f"r-{i}" for i in range(1000) if rendezvous_order(f"r-{i}", urls)[0] == urls[0])
    resources, attempt = proxy.open_attempt(
        {"llm": llm}, trace.set_span_in_context(spans.root), spans.tracer, rollout_id=rollout_id, mode="train"
    )
    rewritten = resources["llm"]
    assert isinstance(rewritten, LLM) and "rollq" not in rewritten.sampling_parameters
    return rewritten, attempt


def test_a_429_is_retried_after_its_retry_after_and_without_retries_the_agent_gets_it() -> None:
    proxy = CaptureProxy().start()
    server = FakeVLLM(name="limited", fail_next=1, fail_next_status=429).start()
    try:
        llm, attempt = _upstream_calls(proxy, [server], backoff_seconds=0.01)
        client = openai.OpenAI(base_url=llm.endpoint, api_key="none", max_retries=0)
        client.chat.completions.create(model="m", messages=MESSAGES)
        [call] = attempt.calls
        assert call.upstream_attempts == 2 and call.error is None and server.fail_next == 0
        llm, attempt = _upstream_calls(proxy, [server], retries=0)
        server.fail_next = 1
        with pytest.raises(openai.RateLimitError):
            openai.OpenAI(base_url=llm.endpoint, api_key="none", max_retries=0).chat.completions.create(
                model="m", messages=MESSAGES
            )
        assert proxy.health.out() == []  # a 429 slows down; it does not take the server out
    finally:
        server.stop()
        proxy.stop()


def test_an_upstream_that_answers_503_in_a_row_is_taken_out_and_calls_go_to_the_next() -> None:
    proxy = CaptureProxy().start()
    a, b = FakeVLLM(name="a", fail_status=503).start(), FakeVLLM(name="b").start()
    try:
        llm, attempt = _upstream_calls(proxy, [a, b], backoff_seconds=0.01, eject_after=2, retries=1)
        client = openai.OpenAI(base_url=llm.endpoint, api_key="none", max_retries=0)
        for _ in range(3):
            client.chat.completions.create(model="m", messages=MESSAGES)
        # a, the rollout's first choice, answered 503 twice in a row and was taken out; every call ended on b.
        assert all((c.response_id or "").startswith("chatcmpl-b-") for c in attempt.calls)
        assert len(a.received) == 2 and proxy.health.out() == [a.url]
    finally:
        a.stop()
        b.stop()
        proxy.stop()


def test_a_body_rewritten_for_an_enforced_setting_keeps_an_int_beyond_64_bits_exact(
    proxy: CaptureProxy, fake: FakeVLLM
) -> None:
    # The body is re-encoded (the mode's temperature overwrites the agent's): every other value goes on as sent.
    spans = Spans()
    llm = with_options(LLM(endpoint=fake.url, model="m"), modes={"train": {"temperature": 1.0}})
    resources, attempt = proxy.open_attempt(
        {"llm": llm}, trace.set_span_in_context(spans.root), spans.tracer, mode="train"
    )
    rewritten = resources["llm"]
    assert isinstance(rewritten, LLM)
    seed = 2**70 + 1
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.0, "seed": %d}' % seed
    answer = httpx.post(f"{rewritten.endpoint}/chat/completions", content=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert fake.received[-1]["seed"] == seed and fake.received[-1]["temperature"] == 1.0
    assert attempt.calls[-1].sampling["seed"] == seed
    attempt.close()


def test_the_proxy_runs_on_uvloop_where_it_is_installed(proxy: CaptureProxy) -> None:
    pytest.importorskip("uvloop")
    assert type(proxy._loop).__module__.startswith("uvloop")


def _rollq_traced_attempt(proxy: CaptureProxy, fake: FakeVLLM) -> tuple[LLM, AttemptCapture, Any, Spans]:
    """An attempt traced as a worker traces one: rollq's OtelTracer, its capture tracer, an exporter beside it."""
    from rollq.worker.tracer import OtelTracer

    spans = Spans()
    tracer = OtelTracer(spans.provider)
    rollout = tracer.start_rollout("r1", 1)
    resources, attempt = proxy.open_attempt(
        {"llm": LLM(endpoint=fake.url, model="m")}, trace.set_span_in_context(rollout.root), tracer.capture_tracer()
    )
    llm = resources["llm"]
    assert isinstance(llm, LLM)
    return llm, attempt, rollout, spans


def _captured(spans: list[Any]) -> list[Any]:
    return [s for s in spans if (s.attributes or {}).get("rollq.llm.captured")]


def test_a_body_past_aiohttps_default_limit_and_within_the_proxys_is_forwarded_and_captured(
    proxy: CaptureProxy, fake: FakeVLLM
) -> None:
    # The proxy's server builds its requests with its own limit (32 MiB), not aiohttp's default of 1 MiB.
    llm, attempt, _ = open_attempt(proxy, fake.url)
    content = "x" * (2 * 1024 * 1024)
    client = openai.OpenAI(base_url=llm.endpoint, api_key="none", max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}])
    [call] = attempt.calls
    assert call.status == 200 and call.messages == [{"role": "user", "content": content}]


def test_a_captured_calls_span_is_among_the_rollouts_spans_as_soon_as_the_agent_reads_them(
    proxy: CaptureProxy, fake: FakeVLLM
) -> None:
    llm, attempt, rollout, _ = _rollq_traced_attempt(proxy, fake)
    openai.OpenAI(base_url=llm.endpoint, api_key="none").chat.completions.create(model="m", messages=MESSAGES)
    [call] = attempt.calls
    [span] = _captured(rollout.spans_so_far())  # what get_last_trace gives an agent mid-rollout
    assert span.attributes["rollq.llm.response_token_ids"] == str(fake.sent[call.response_id or ""].token_ids).replace(
        " ", ""
    )
    assert span.start_time == call.start_ns and span.end_time == call.end_ns
    openai.OpenAI(base_url=llm.endpoint, api_key="none").chat.completions.create(model="m", messages=MESSAGES)
    assert len(_captured(rollout.finish())) == 2


def test_a_captured_calls_span_reaches_the_other_span_processors_by_the_end_of_its_rollout(
    proxy: CaptureProxy, fake: FakeVLLM
) -> None:
    llm, _, rollout, spans = _rollq_traced_attempt(proxy, fake)
    httpx.post(f"{llm.endpoint}/chat/completions", json={"model": "m", "messages": MESSAGES}, timeout=30)
    rollout.finish()
    [exported] = spans.captured()
    assert exported.context.trace_id == rollout.root.get_span_context().trace_id


def test_a_call_that_ends_after_its_rollout_finished_is_recorded_at_once_not_kept(
    proxy: CaptureProxy, fake: FakeVLLM
) -> None:
    llm, attempt, rollout, spans = _rollq_traced_attempt(proxy, fake)
    rollout.finish()  # a straggler: the attempt's address still open, its rollout's spans already read
    httpx.post(f"{llm.endpoint}/chat/completions", json={"model": "m", "messages": MESSAGES}, timeout=30)
    assert len(attempt.calls) == 1 and len(spans.captured()) == 1
    assert rollout.spans is not None and _captured(rollout.spans) == []
