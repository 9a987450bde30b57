"""Deriving triplets from a rollout's trace (spans in OpenTelemetry JSON form): one per LLM call.

An LLM call is a span the capturing proxy recorded (``rollq.llm.captured``), or a
GenAI span whose ``gen_ai.operation.name`` is an inference operation (``chat``,
``text_completion``, ``generate_content``). Agent and tool spans carry GenAI
attributes too (autogen's ``create_agent``, ``invoke_agent``, ``execute_tool``)
and make no triplets. Older instrumentations that set no operation name count
when they carry ``gen_ai.system`` or ``gen_ai.request.model``. A call seen twice
(by the proxy and by the agent's own instrumentation) has one response id and
makes one triplet, from the proxy's record, which has the token ids.

Each triplet is ``prompt = {"token_ids", "messages" | "text"}``, ``response =
{"token_ids", "text", "logprobs", "tool_calls"}`` (the keys that are known; logprobs
only when there is one per token id), and ``metadata`` with the response id, model,
finish reason, resource and, when the call ran under an agent span, the agent's
name; for calls the proxy captured also the resources version the call ran against
(``resources_id``), the ``upstream`` it went to and the sampling settings the proxy
enforced (``sampling_enforced``, ``sampling_overridden``). A call whose response
token ids do not number the usage's ``completion_tokens`` is flagged
``token_count_mismatch`` (with ``response_tokens`` and ``usage_completion_tokens``). A reward span's value goes to
the latest call that started before it (see :mod:`rollq.worker.rewards`).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from rollq.models.contract import Triplet

from .capture import spans as names
from .rewards import RewardReading, check_finite, reward_of

log = logging.getLogger(__name__)

INFERENCE_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
AGENT_OPERATIONS = frozenset({"invoke_agent"})
_LEGACY_MARKERS = ("gen_ai.system", "gen_ai.request.model")


@dataclass
class Derivation:
    """What a trace yields: triplets, the last reward seen, and what could not be placed."""

    triplets: list[Triplet] = field(default_factory=list)
    last_reward: float | None = None
    warnings: list[str] = field(default_factory=list)


def _attributes(span: dict[str, Any]) -> dict[str, Any]:
    return span.get("attributes") or {}


def _span_id(span: dict[str, Any]) -> str | None:
    return (span.get("context") or {}).get("span_id")


def is_llm_call(span: dict[str, Any]) -> bool:
    return _is_llm_call(_attributes(span))


def _is_llm_call(attributes: dict[str, Any]) -> bool:
    if attributes.get(names.CAPTURED):
        return "error.type" not in attributes  # a refused call produced nothing to train on
    operation = attributes.get("gen_ai.operation.name")
    if operation is not None:
        return operation in INFERENCE_OPERATIONS
    return any(marker in attributes for marker in _LEGACY_MARKERS)


def _agent_name(span: dict[str, Any]) -> str | None:
    attributes = _attributes(span)
    if attributes.get("gen_ai.operation.name") in AGENT_OPERATIONS:
        return str(attributes.get("gen_ai.agent.name") or span.get("name"))
    if "gen_ai.operation.name" not in attributes and "gen_ai.agent.name" in attributes:
        return str(attributes["gen_ai.agent.name"])
    return None


class _Agents:
    """Finds the agent span a call ran under: by its parent chain, else by time (proxy spans hang off the root)."""

    def __init__(self, trace: list[dict[str, Any]]) -> None:
        self.agents = [(s, name) for s in trace if (name := _agent_name(s))]
        # Only an agent span can name a call's agent: without one, no call needs its parent chain.
        self.by_id = {sid: s for s in trace if (sid := _span_id(s))} if self.agents else {}

    def of(self, span: dict[str, Any]) -> str | None:
        if not self.agents:  # no span of the trace names an agent: neither an ancestor nor one around it can
            return None
        parent = span.get("parent_id")
        seen = 0
        while parent and parent in self.by_id and seen < 1000:
            ancestor = self.by_id[parent]
            if (name := _agent_name(ancestor)) is not None:
                return name
            parent, seen = ancestor.get("parent_id"), seen + 1
        start, end = span.get("start_time") or "", span.get("end_time") or ""
        inside = [
            (a.get("start_time") or "", name)
            for a, name in self.agents
            if (a.get("start_time") or "") <= start and end <= (a.get("end_time") or "~")
        ]
        return max(inside)[1] if inside else None


def _json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _indexed(attributes: dict[str, Any], prefix: str) -> list[Any] | None:
    pattern = re.compile(re.escape(prefix) + r"\.(\d+)\.content$")
    found = sorted((int(m.group(1)), v) for k, v in attributes.items() if (m := pattern.match(k)))
    return [v for _, v in found] or None


def _first(attributes: dict[str, Any], key: str, other: str) -> Any:
    return attributes[key] if key in attributes else attributes.get(other)


def _content(attributes: dict[str, Any], messages_key: str, legacy_key: str) -> Any:
    # The current convention's messages are JSON; the older plain or indexed text is taken as it is.
    if messages_key in attributes:
        return _json(attributes[messages_key])
    if legacy_key in attributes:
        return attributes[legacy_key]
    return _indexed(attributes, legacy_key)


def _as_prompt_or_response(content: Any, *, text_key: str = "text") -> dict[str, Any]:
    if isinstance(content, list):
        return {"messages": content}
    return {text_key: content} if content is not None else {}


def _ids(value: Any) -> list[int] | None:
    if value is None:
        return None
    value = _json(value)  # the proxy's spans carry them as JSON; other instrumentation as arrays
    return list(value) if isinstance(value, (list, tuple)) else None


def _triplet(span: dict[str, Any], attributes: dict[str, Any], agent: str | None) -> Triplet:
    prompt: dict[str, Any] = {}
    response: dict[str, Any] = {}
    if attributes.get(names.CAPTURED):
        if names.REQUEST_MESSAGES in attributes:
            prompt["messages"] = _json(attributes[names.REQUEST_MESSAGES])
        else:
            prompt["text"] = _json(attributes.get(names.REQUEST_PROMPT))
        response["text"] = attributes.get(names.RESPONSE_TEXT)
        if names.RESPONSE_TOOL_CALLS in attributes:
            response["tool_calls"] = _json(attributes[names.RESPONSE_TOOL_CALLS])
    else:
        prompt.update(_as_prompt_or_response(_content(attributes, "gen_ai.input.messages", "gen_ai.prompt")))
        response.update(_as_prompt_or_response(_content(attributes, "gen_ai.output.messages", "gen_ai.completion")))
    # Agent Lightning 0.1's patched instrumentation spells them without a prefix.
    prompt_ids = _ids(_first(attributes, names.PROMPT_TOKEN_IDS, "prompt_token_ids"))
    response_ids = _ids(_first(attributes, names.RESPONSE_TOKEN_IDS, "response_token_ids"))
    if prompt_ids is not None:
        prompt["token_ids"] = prompt_ids
    if response_ids is not None:
        response["token_ids"] = response_ids
    get = attributes.get
    finish = get("gen_ai.response.finish_reasons")
    metadata = {
        "response_id": get("gen_ai.response.id"),
        "model": get("gen_ai.response.model") or get("gen_ai.request.model"),
        "finish_reason": finish[0] if isinstance(finish, (list, tuple)) and finish else None,
        "resource": get(names.RESOURCE),
        "agent": agent,
        "span_id": _span_id(span),
        "name": span.get("name"),
        "resources_id": get(names.RESOURCES_ID),
        "upstream": get(names.UPSTREAM),
        "sampling_enforced": _json(get(names.SAMPLING_ENFORCED)),
        "sampling_overridden": _json(get(names.SAMPLING_OVERRIDDEN)),
    }
    if names.RESPONSE_LOGPROBS in attributes:
        logprobs = _ids(attributes[names.RESPONSE_LOGPROBS])
        if response_ids is not None and logprobs is not None and len(logprobs) != len(response_ids):
            # Not one per token id: a trainer would pair them wrongly, so they are left out and the call flagged.
            metadata.update(logprobs_misaligned=True, response_logprobs=len(logprobs))
        else:
            response["logprobs"] = logprobs
    completion_tokens = attributes.get("gen_ai.usage.output_tokens")
    if response_ids is not None and isinstance(completion_tokens, int) and completion_tokens != len(response_ids):
        # The ids do not match what the server says it generated (Agent Lightning #326: streaming + tool parser).
        metadata.update(
            token_count_mismatch=True, response_tokens=len(response_ids), usage_completion_tokens=completion_tokens
        )
    if prompt_ids is None or response_ids is None:
        metadata["token_ids_missing"] = True
    return Triplet(prompt=prompt, response=response, metadata={k: v for k, v in metadata.items() if v is not None})


def _reading(
    span: dict[str, Any], attributes: dict[str, Any], strict: bool, warnings: list[str]
) -> RewardReading | None:
    reading = reward_of(span, attributes)
    if reading is None:
        return None
    where = f"reward span {span.get('name')!r} ({_span_id(span)})"
    try:
        check_finite(reading.value, where)
        for value in reading.dimensions.values():
            check_finite(value, where)
    except ValueError as exc:
        if strict:
            raise
        warnings.append(f"{exc}; ignored")
        return None
    return reading


def derive(trace: list[dict[str, Any]], *, only_agent: str | None = None, strict: bool = True) -> Derivation:
    """Triplets, last reward and warnings from ``trace``; non-finite rewards raise unless ``strict`` is False."""
    result = Derivation()
    agents = _Agents(trace)
    ordered = sorted(trace, key=lambda s: str(s.get("start_time") or ""))
    by_response: dict[str, Triplet] = {}
    seen_captured: dict[int, bool] = {}  # id(triplet) -> made from a span the proxy recorded
    missing = 0
    for span in ordered:
        attributes = span.get("attributes") or {}
        reading = _reading(span, attributes, strict, result.warnings)
        if reading is not None:
            result.last_reward = reading.value
            if not result.triplets:
                result.warnings.append(
                    f"reward {reading.value} from span {span.get('name')!r} ({_span_id(span)}) came before any "
                    "LLM call; it is in the trace but on no triplet"
                )
                continue
            target = result.triplets[-1]
            target.reward = reading.value
            if reading.dimensions:
                target.metadata["rewards"] = dict(reading.dimensions)
            continue
        if not _is_llm_call(attributes):
            continue
        agent = agents.of(span)
        if only_agent is not None and agent != only_agent:
            continue
        triplet = _triplet(span, attributes, agent)
        response_id = triplet.metadata.get("response_id")
        captured = bool(attributes.get(names.CAPTURED))
        seen = by_response.get(response_id) if response_id else None
        if seen is not None and captured and seen_captured.get(id(seen)):
            # Two calls the proxy recorded with one response id (a backend that reuses ids): two calls, kept apart.
            seen = None
        if seen is not None:
            # The same call seen twice: keep the record with token ids, and the agent either one knew.
            if "token_ids" in triplet.prompt and "token_ids" not in seen.prompt:
                seen.prompt, seen.response = triplet.prompt, triplet.response
                seen.metadata = {**seen.metadata, **triplet.metadata, "agent": agent or seen.metadata.get("agent")}
            continue
        if response_id:
            by_response[response_id] = triplet
        seen_captured[id(triplet)] = captured
        result.triplets.append(triplet)
    mismatched = 0
    for triplet in result.triplets:
        if triplet.metadata.get("agent") is None:
            triplet.metadata.pop("agent", None)
        if triplet.metadata.get("token_ids_missing"):
            missing += 1
        if triplet.metadata.get("token_count_mismatch"):
            mismatched += 1
    for warning in result.warnings:
        log.warning("%s", warning)
    if missing:  # in the rollout for the trainer to see; not logged, it would repeat for every rollout
        result.warnings.append(f"token ids missing for {missing} of {len(result.triplets)} LLM call(s)")
    if mismatched:
        result.warnings.append(
            f"response token ids differ from the usage's completion_tokens for {mismatched} of "
            f"{len(result.triplets)} LLM call(s)"
        )
    return result


def triplets_from_trace(trace: list[dict[str, Any]]) -> list[Triplet]:
    """One triplet per LLM call in ``trace``, in start order, each with the reward that followed it."""
    return derive(trace).triplets
