"""AL 1.0's LLM proxy behaviour, shared by ``serve-agl``'s proxy route and the worker adapter's endpoint.

What AL 1.0.2's gateway does to each call, kept here once: the served model's name replaces the
client's, the mode's temperature is enforced, ``return_token_ids`` is asked for (plus ``logprobs``
in train mode when configured), streaming is refused (400), each rollout sticks to one endpoint
(SHA-256 of its id over the sorted endpoints, for prefix-cache reuse), and an upstream call is
retried up to 6 times on a transport error, a timeout, 408/409/429 or 5xx (backoff 0.5 s doubling
to 8 s, jittered). The call is then recorded as a ``model_request`` event.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

PROXY_MODES = frozenset({"train", "val"})
PROXY_PATHS = frozenset({"chat/completions", "completions"})
MAX_ATTEMPTS = 6
_RETRY_STATUSES = frozenset({408, 409, 429})


class UpstreamError(Exception):
    """The model server could not be reached after every retry: ``status`` is 502 or 504."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class ProxySettings:
    """AL 1.0's ``default_proxy`` configuration."""

    model_name: str = "Qwen/Qwen2.5-7B-Instruct"
    include_log_probs: bool = True
    include_routed_experts: bool = False
    train_temperature: float = 1.0
    val_temperature: float = 0.7

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: Any) -> ProxySettings:
        fields = {k: v for k, v in (value or {}).items() if k in cls.__dataclass_fields__}
        return cls(**fields)

    def prepare(self, body: dict[str, Any], mode: str, *, ask_token_ids: bool = True) -> dict[str, Any]:
        """The body sent upstream for ``mode`` (``ask_token_ids=False`` leaves that to a capture proxy after)."""
        prepared = {
            **body,
            "model": self.model_name,
            "temperature": self.train_temperature if mode == "train" else self.val_temperature,
        }
        if ask_token_ids:
            prepared["return_token_ids"] = True
        if mode == "train":
            if self.include_log_probs:
                prepared["logprobs"] = True
            if self.include_routed_experts:
                prepared["return_routed_experts"] = True
        return prepared


def sticky_index(rollout_id: str, count: int) -> int:
    """Which of ``count`` sorted endpoints serves ``rollout_id`` (AL's rule, so both gateways agree)."""
    digest = hashlib.sha256(rollout_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count


def pick(endpoints: Sequence[str], rollout_id: str) -> str:
    ordered = sorted(endpoints)
    return ordered[sticky_index(rollout_id, len(ordered))]


def _delay(attempt_index: int) -> float:
    return min(0.5 * (2**attempt_index), 8.0) * random.uniform(0.75, 1.25)


async def send(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], *, timeout: float = 300.0
) -> tuple[int, dict[str, Any], int]:
    """POST ``body`` to ``url`` with AL's retries: ``(status, JSON body or {}, retries used)``."""
    for attempt_index in range(MAX_ATTEMPTS):
        last = attempt_index == MAX_ATTEMPTS - 1
        try:
            async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                status = response.status
                retry = status in _RETRY_STATUSES or status >= 500
                if not retry or last:
                    payload: Any = {}
                    if response.content_type == "application/json":
                        payload = await response.json(content_type=None)
                    return status, payload if isinstance(payload, dict) else {"data": payload}, attempt_index
        except TimeoutError as exc:
            if last:
                raise UpstreamError(504, "Upstream model server timed out") from exc
        except aiohttp.ClientError as exc:
            if last:
                raise UpstreamError(502, "Upstream model server request failed") from exc
        await asyncio.sleep(_delay(attempt_index))
    raise UpstreamError(502, "Upstream model server request failed")


def pop_routed_experts(response: dict[str, Any]) -> Any:
    choices = response.get("choices")
    if not isinstance(choices, list):
        return None
    for choice in choices:
        if isinstance(choice, dict) and (routes := choice.pop("routed_experts", None)) is not None:
            return routes
    return None


def model_request_data(
    *,
    model: str,
    endpoint: str,
    version: int,
    request: dict[str, Any],
    response: dict[str, Any],
    started: float,
    http_status: int,
    retry_count: int,
    routed_experts: Any = None,
) -> dict[str, Any]:
    """The data of the ``model_request`` event AL records for one proxied call."""
    choices = response.get("choices")
    finish = None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reason = choices[0].get("finish_reason")
        finish = reason if isinstance(reason, str) and reason else None
    usage = response.get("usage")
    return {
        "model": model,
        "model_version": version,
        "request": request,
        "response": response,
        "server": {"model": model, "endpoint": endpoint, "version": version},
        "latency_ms": (time.perf_counter() - started) * 1000,
        "http_status": http_status,
        "status": "ok" if http_status < 400 else "error",
        "retry_count": retry_count,
        "routed_experts": routed_experts,
        "usage": usage if isinstance(usage, dict) else None,
        "finish_reason": finish,
    }
