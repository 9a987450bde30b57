"""The record of one LLM call the proxy forwarded: what was asked, what came back, in token ids too."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from . import codec


class CallKind(enum.Enum):
    """The OpenAI-compatible operation; the value is the GenAI ``gen_ai.operation.name``."""

    CHAT = "chat"
    TEXT_COMPLETION = "text_completion"


@dataclass
class CapturedCall:
    """One call through the proxy. Only the first choice is recorded (``n > 1`` keeps choice 0)."""

    kind: CallKind
    resource: str
    path: str
    start_ns: int
    request_model: str | None = None
    messages: list[Any] | None = None
    """The request's chat messages, as the client sent them (chat calls)."""
    prompt: Any = None
    """The request's prompt (text completions): a string, a list of them, or token ids."""
    sampling: dict[str, Any] = field(default_factory=dict)
    streamed: bool = False
    end_ns: int = 0
    status: int = 0
    response_id: str | None = None
    response_model: str | None = None
    text: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    prompt_token_ids_json: str | None = None
    """The prompt's token ids as compact JSON text (``[1,2,3]``), as the call's span carries them. Text, not a list:
    a prompt's thousands of ids were read into ints only to be written back for the span (``prompt_token_ids``
    reads and sets them as a list)."""
    response_token_ids_json: str | None = None
    """The answer's token ids, as ``prompt_token_ids_json``."""
    logprobs: list[float] | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    token_ids_requested: bool = True
    """False when the backend refused ``return_token_ids`` and the call went through without it."""
    error: str | None = None
    """What went wrong: the backend's error body (HTTP >= 400), or a transport failure."""
    upstream: str | None = None
    """The server the call went to (the last one tried)."""
    upstream_attempts: int = 1
    """Upstream requests made for the call (retries included)."""
    resources_id: str | None = None
    """The resources version the call ran against: the latest one the worker knew when the proxy admitted it."""
    sampling_enforced: dict[str, Any] | None = None
    """The sampling settings of the task's mode, written over the agent's (see ``LLMOptions.modes``)."""
    sampling_overridden: dict[str, Any] | None = None
    """The values the agent had sent for settings the proxy overwrote (only those that differed)."""

    @property
    def prompt_token_ids(self) -> list[int] | None:
        return _ids(self.prompt_token_ids_json)

    @prompt_token_ids.setter
    def prompt_token_ids(self, ids: list[int] | None) -> None:
        self.prompt_token_ids_json = _text(ids)

    @property
    def response_token_ids(self) -> list[int] | None:
        return _ids(self.response_token_ids_json)

    @response_token_ids.setter
    def response_token_ids(self, ids: list[int] | None) -> None:
        self.response_token_ids_json = _text(ids)

    @property
    def token_ids_missing(self) -> bool:
        return self.error is None and (self.prompt_token_ids_json is None or self.response_token_ids_json is None)

    @property
    def latency_seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def _ids(text: str | None) -> list[int] | None:
    return None if text is None else codec.loads(text.encode())  # type: ignore[no-any-return]


def _text(ids: list[int] | None) -> str | None:
    return None if ids is None else codec.dumps_str(ids)
