"""A captured call as an OpenTelemetry span: GenAI semantic-convention names, plus rollq's token ids.

The GenAI names are the current (2025) ones: ``gen_ai.operation.name``,
``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.response.id``,
``gen_ai.response.model``, ``gen_ai.response.finish_reasons``,
``gen_ai.usage.input_tokens``/``output_tokens``, ``gen_ai.input.messages`` and
``gen_ai.output.messages`` (JSON, in the convention's role/parts form). Token
ids, logprobs and the request exactly as the client sent it have no GenAI name
yet; they go under ``rollq.llm.*``, which is what triplets are built from. Token
ids and logprobs are JSON strings rather than attribute arrays: the SDK checks
an array element by element in Python, which for a prompt of a few thousand ids
cost more than the rest of the call's path through the proxy.
"""

from __future__ import annotations

import functools
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

from ..lean_spans import LeanTracer, end_span
from . import codec
from .calls import CallKind, CapturedCall

CAPTURED = "rollq.llm.captured"
RESOURCE = "rollq.llm.resource"
REQUEST_MESSAGES = "rollq.llm.request.messages"
REQUEST_PROMPT = "rollq.llm.request.prompt"
RESPONSE_TEXT = "rollq.llm.response.text"
RESPONSE_TOOL_CALLS = "rollq.llm.response.tool_calls"
PROMPT_TOKEN_IDS = "rollq.llm.prompt_token_ids"
RESPONSE_TOKEN_IDS = "rollq.llm.response_token_ids"
RESPONSE_LOGPROBS = "rollq.llm.response_logprobs"
TOKEN_IDS_MISSING = "rollq.llm.token_ids_missing"
STREAMED = "rollq.llm.streamed"
RESOURCES_ID = "rollq.llm.resources_id"
UPSTREAM = "rollq.llm.upstream"
UPSTREAM_ATTEMPTS = "rollq.llm.upstream_attempts"
SAMPLING_ENFORCED = "rollq.llm.sampling.enforced"
SAMPLING_OVERRIDDEN = "rollq.llm.sampling.overridden"


def _compact_floats(values: list[float] | None) -> str | None:
    return None if values is None else codec.dumps_floats(values)


def _parts(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    if isinstance(content, list):  # OpenAI content parts: [{"type": "text", "text": ...}, ...]
        return [
            {"type": "text", "content": p.get("text", "")} if p.get("type") == "text" else {"type": p.get("type")}
            for p in content
            if isinstance(p, dict)
        ]
    return [{"type": "text", "content": str(content)}]


def _tool_parts(tool_calls: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [
        {
            "type": "tool_call",
            "id": t.get("id"),
            "name": (t.get("function") or {}).get("name"),
            "arguments": (t.get("function") or {}).get("arguments"),
        }
        for t in tool_calls or []
    ]


def input_messages(call: CapturedCall) -> list[dict[str, Any]]:
    """The request in the GenAI convention's ``gen_ai.input.messages`` form."""
    if call.kind is CallKind.TEXT_COMPLETION:
        return [{"role": "user", "parts": _parts(call.prompt if isinstance(call.prompt, str) else str(call.prompt))}]
    return [
        {"role": m.get("role"), "parts": _parts(m.get("content")) + _tool_parts(m.get("tool_calls"))}
        for m in call.messages or []
        if isinstance(m, dict)
    ]


def output_messages(call: CapturedCall) -> list[dict[str, Any]]:
    """The answer in the GenAI convention's ``gen_ai.output.messages`` form."""
    return [
        {
            "role": "assistant",
            "parts": _parts(call.text) + _tool_parts(call.tool_calls),
            "finish_reason": call.finish_reason,
        }
    ]


def attributes(call: CapturedCall, server: tuple[str, int] | None = None) -> dict[str, Any]:
    """The span attributes of ``call``; values are OTel-legal (primitives, lists of them, JSON strings)."""
    found: dict[str, Any] = {
        "gen_ai.operation.name": call.kind.value,
        "gen_ai.provider.name": "openai",
        "http.response.status_code": call.status,
        CAPTURED: True,
        RESOURCE: call.resource,
        STREAMED: call.streamed,
        "gen_ai.input.messages": codec.dumps_str(input_messages(call)),
    }
    if server is not None:
        found["server.address"], found["server.port"] = server
    training = {
        RESOURCES_ID: call.resources_id,
        UPSTREAM: call.upstream,
        SAMPLING_ENFORCED: codec.dumps_str(call.sampling_enforced) if call.sampling_enforced else None,
        SAMPLING_OVERRIDDEN: codec.dumps_str(call.sampling_overridden) if call.sampling_overridden else None,
    }
    found.update({k: v for k, v in training.items() if v is not None})
    if call.upstream_attempts > 1:
        found[UPSTREAM_ATTEMPTS] = call.upstream_attempts
    if call.request_model:
        found["gen_ai.request.model"] = call.request_model
    for name in ("temperature", "top_p", "max_tokens", "seed"):
        value = call.sampling.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            found[f"gen_ai.request.{name}"] = value
    if call.kind is CallKind.CHAT:
        found[REQUEST_MESSAGES] = codec.dumps_str(call.messages)
    else:
        found[REQUEST_PROMPT] = codec.dumps_str(call.prompt)
    if call.error is not None:
        found["error.type"] = str(call.status) if call.status else "transport"
        return found
    found["gen_ai.output.messages"] = codec.dumps_str(output_messages(call))
    optional = {
        "gen_ai.response.id": call.response_id,
        "gen_ai.response.model": call.response_model,
        RESPONSE_TEXT: call.text,
        PROMPT_TOKEN_IDS: call.prompt_token_ids_json,
        RESPONSE_TOKEN_IDS: call.response_token_ids_json,
        RESPONSE_LOGPROBS: _compact_floats(call.logprobs),
    }
    found.update({k: v for k, v in optional.items() if v is not None})
    if call.finish_reason:
        found["gen_ai.response.finish_reasons"] = (call.finish_reason,)  # as the SDK keeps a list: a tuple
    if call.tool_calls:
        found[RESPONSE_TOOL_CALLS] = codec.dumps_str(call.tool_calls)
    usage = call.usage or {}
    if isinstance(usage.get("prompt_tokens"), int):
        found["gen_ai.usage.input_tokens"] = usage["prompt_tokens"]
    if isinstance(usage.get("completion_tokens"), int):
        found["gen_ai.usage.output_tokens"] = usage["completion_tokens"]
    found[TOKEN_IDS_MISSING] = call.token_ids_missing
    return found


def record_span(
    tracer: trace.Tracer, call: CapturedCall, parent: Context, server: tuple[str, int] | None = None
) -> None:
    """Emit ``call`` as a finished CLIENT span under ``parent``, with the call's own start and end times."""
    model = call.request_model or call.response_model or "unknown"
    span = _lean(tracer).start_span(
        f"{call.kind.value} {model}",
        attributes(call, server),
        parent,
        kind=SpanKind.CLIENT,
        start_time=call.start_ns,
    )
    if call.error is not None:
        span.set_status(Status(StatusCode.ERROR, call.error[:500]))
    end_span(span, call.end_ns)


@functools.lru_cache(maxsize=64)
def _lean(tracer: trace.Tracer) -> LeanTracer:
    """The same spans as ``tracer``'s without the SDK's per-span overhead (:mod:`rollq.worker.lean_spans`: about
    half a captured call's span), for the few tracers a worker process records calls with."""
    return LeanTracer(tracer)
