"""Views of an attempt's AL 1.0 events, as ``GET /api/rollouts/{id}/events`` gives them.

``format=triplet`` trims each ``model_request`` to the token ids (prompt, response), the chosen
tokens' log-probabilities and the serving model, each ``reward`` to its value, and keeps, of the
requests that share a prompt (a client retry), the last. This is what AL 1.0.2's
``AglRolloutManager`` turns into training triplets; the rules follow its server exactly.
"""

from __future__ import annotations

import math
from typing import Any

from .schemas import Event


def _choice_logprobs(choice: dict[str, Any]) -> list[float] | None:
    """Per-token log-probabilities of a choice (chat or completions schema); None when missing or unusable."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return None
    raw: list[Any]
    if isinstance(lp.get("content"), list):
        raw = []
        for item in lp["content"]:
            if not isinstance(item, dict) or "logprob" not in item:
                return None
            raw.append(item["logprob"])
    elif isinstance(lp.get("token_logprobs"), list):
        raw = list(lp["token_logprobs"])
    else:
        return None
    out: list[float] = []
    for value in raw:
        try:
            number = float(value)
        except (TypeError, ValueError):
            return None
        if not math.isfinite(number):
            return None
        out.append(number)
    return out


def trim_model_request(data: dict[str, Any]) -> dict[str, Any]:
    """A ``model_request`` event's data cut down to what training needs."""
    response = data.get("response")
    prompt_ids: Any = []
    response_ids: Any = []
    logprobs: list[float] | None = None
    if isinstance(response, dict):
        prompt_ids = response.get("prompt_token_ids", [])
        choices = response.get("choices", [])
        if choices and isinstance(choices[0], dict):
            if not prompt_ids:
                prompt_ids = choices[0].get("prompt_token_ids", [])
            response_ids = choices[0].get("token_ids", [])
            logprobs = _choice_logprobs(choices[0])
    elif isinstance(response, list):  # raw stream chunks, as older gateways stored them
        for chunk in response:
            if not isinstance(chunk, dict):
                continue
            if not prompt_ids and chunk.get("prompt_token_ids"):
                prompt_ids = chunk["prompt_token_ids"]
            choices = chunk.get("choices", [])
            if choices and isinstance(choices[0], dict) and choices[0].get("token_ids"):
                response_ids = [*response_ids, *choices[0]["token_ids"]]
    server = data.get("server", {}) if isinstance(data.get("server"), dict) else {}
    trimmed: dict[str, Any] = {
        "prompt_token_ids": prompt_ids,
        "response_token_ids": response_ids,
        "response_log_probs": logprobs,
        "server": {"model": server.get("model"), "version": server.get("version")},
    }
    if data.get("routed_experts") is not None:
        trimmed["routed_experts"] = data["routed_experts"]
    for key in ("http_status", "status"):
        if key in data:
            trimmed[key] = data[key]
    if isinstance(response, dict) and "error" in response:
        trimmed["error"] = response["error"]
    return trimmed


def trim_reward(data: dict[str, Any]) -> dict[str, Any]:
    trimmed = {"value": data.get("value")}
    for key in ("source", "reason"):
        if key in data:
            trimmed[key] = data[key]
    return trimmed


def _as_triplet(event: Event) -> Event:
    if event.event_type == "model_request":
        return event.model_copy(update={"data": trim_model_request(event.data)})
    if event.event_type == "reward":
        return event.model_copy(update={"data": trim_reward(event.data)})
    return event


def _dedupe_by_prompt(events: list[Event]) -> list[Event]:
    """Of ``model_request`` events with the same (valid, non-empty) prompt ids, the last; all others kept."""
    last: dict[tuple[int, ...], int] = {}
    kept: set[int] = set()
    for index, event in enumerate(events):
        if event.event_type != "model_request":
            continue
        ids = event.data.get("prompt_token_ids", [])
        if not isinstance(ids, list) or not ids or any(type(i) is not int for i in ids):
            kept.add(index)
            continue
        last[tuple(ids)] = index
    kept.update(last.values())
    return [e for i, e in enumerate(events) if e.event_type != "model_request" or i in kept]


def without_routed_experts(event: Event) -> Event:
    if event.event_type != "model_request" or "routed_experts" not in event.data:
        return event
    data = dict(event.data)
    data.pop("routed_experts")
    return event.model_copy(update={"data": data})


def query(events: list[Event], *, event_type: str | None, triplet: bool, include_routed_experts: bool) -> list[Event]:
    """The events a query asks for, in order."""
    if event_type is not None:
        events = [e for e in events if e.event_type == event_type]
    if triplet:
        events = _dedupe_by_prompt([_as_triplet(e) for e in events])
    if not include_routed_experts:
        events = [without_routed_experts(e) for e in events]
    return events


def drop_superseded_routes(events: list[Event], event_type: str, data: dict[str, Any]) -> list[int]:
    """Indexes of earlier ``model_request`` events whose ``routed_experts`` a new request makes redundant.

    AL keeps only the last route tensor of a trajectory that a new request extends (same prompt, or a
    prompt that starts with the earlier prompt and response): it is large and the last covers the rest.
    """
    if event_type != "model_request" or data.get("routed_experts") is None:
        return []
    prompt_ids = trim_model_request(data)["prompt_token_ids"]
    for index in range(len(events) - 1, -1, -1):
        previous = events[index]
        if previous.event_type != "model_request":
            continue
        earlier = trim_model_request(previous.data)
        context = list(earlier["prompt_token_ids"]) + list(earlier["response_token_ids"])
        same = prompt_ids == earlier["prompt_token_ids"]
        extends = prompt_ids[: len(context)] == context
        return [index] if (same or extends) and "routed_experts" in previous.data else []
    return []
