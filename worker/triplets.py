"""Deriving triplets from a rollout's trace (spans in OpenTelemetry JSON form).

An LLM-call span is one that carries OpenTelemetry GenAI attributes
(``gen_ai.operation.name``, ``gen_ai.system`` or ``gen_ai.request.model``); its
prompt and response come from ``gen_ai.input.messages``/``gen_ai.output.messages``,
or the older ``gen_ai.prompt``/``gen_ai.completion`` (plain or indexed as
``gen_ai.prompt.0.content``). A reward span is named ``reward`` or carries
``rollq.reward``; its value goes to the LLM call before it.
"""

from __future__ import annotations

import re
from typing import Any

from rollq.models.contract import Triplet

from .tracer import REWARD_ATTRIBUTE, REWARD_SPAN

_LLM_MARKERS = ("gen_ai.operation.name", "gen_ai.system", "gen_ai.request.model")


def _indexed(attributes: dict[str, Any], prefix: str) -> list[Any] | None:
    pattern = re.compile(re.escape(prefix) + r"\.(\d+)\.content$")
    found = sorted((int(m.group(1)), v) for k, v in attributes.items() if (m := pattern.match(k)))
    return [v for _, v in found] or None


def _first(attributes: dict[str, Any], *names: str) -> Any:
    for name in names:
        if name in attributes:
            return attributes[name]
    return None


def _reward(span: dict[str, Any]) -> float | None:
    attributes = span.get("attributes") or {}
    if REWARD_ATTRIBUTE in attributes:
        return float(attributes[REWARD_ATTRIBUTE])
    if span.get("name") == REWARD_SPAN and "reward" in attributes:
        return float(attributes["reward"])
    return None


def triplets_from_trace(trace: list[dict[str, Any]]) -> list[Triplet]:
    """One triplet per LLM-call span, in start order, each with the reward that followed it."""
    triplets: list[Triplet] = []
    for span in sorted(trace, key=lambda s: str(s.get("start_time") or "")):
        attributes = span.get("attributes") or {}
        reward = _reward(span)
        if reward is not None:
            if triplets:
                triplets[-1].reward = reward
            continue
        if not any(marker in attributes for marker in _LLM_MARKERS):
            continue
        prompt = _first(attributes, "gen_ai.input.messages", "gen_ai.prompt")
        response = _first(attributes, "gen_ai.output.messages", "gen_ai.completion")
        triplets.append(
            Triplet(
                prompt=prompt if prompt is not None else _indexed(attributes, "gen_ai.prompt"),
                response=response if response is not None else _indexed(attributes, "gen_ai.completion"),
                metadata={"span_id": (span.get("context") or {}).get("span_id"), "name": span.get("name")},
            )
        )
    return triplets
