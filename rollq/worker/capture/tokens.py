"""Reading what an OpenAI-compatible backend answered into a :class:`CapturedCall`, token ids included.

The field spellings are vLLM's (0.10.2 and later, asked with ``return_token_ids: true``):

- chat, whole response: top-level ``prompt_token_ids``, ``choices[0].token_ids``;
- chat, streamed: the first chunk carries ``prompt_token_ids``, every chunk's
  ``choices[0].token_ids`` the ids of its delta;
- text completions: both on the choice, ``choices[0].prompt_token_ids`` and
  ``choices[0].token_ids``, streamed or not.

Agent Lightning 0.1's patched vLLM (before 0.10.2, chat only, whole responses) answered every request with
top-level ``prompt_token_ids`` and ``response_token_ids``, the latter one list per choice; those are read when
the choice has no ``token_ids``.

Logprobs are the chosen tokens' log-probabilities: ``choices[0].logprobs.content[*].logprob``
for chat, ``choices[0].logprobs.token_logprobs`` for text completions.
"""

from __future__ import annotations

from typing import Any

from .calls import CallKind, CapturedCall


def _ids(value: Any) -> list[int] | None:
    # Ends checked, not every element: prompts run to thousands of ids, and this is on every call's path.
    if type(value) is list and (not value or (type(value[0]) is int and type(value[-1]) is int)):
        return value
    return None


def _logprobs(kind: CallKind, logprobs: Any) -> list[float] | None:
    if not isinstance(logprobs, dict):
        return None
    if kind is CallKind.CHAT:
        content = logprobs.get("content")
        if isinstance(content, list):
            return [float(entry.get("logprob", 0.0)) for entry in content if isinstance(entry, dict)]
        return None
    values = logprobs.get("token_logprobs")
    if isinstance(values, list):
        return [float(v) if v is not None else 0.0 for v in values]
    return None


def _old_vllm_response_ids(value: Any) -> list[int] | None:
    # [[ids of choice 0], [ids of choice 1], ...]; a flat list is taken as choice 0's.
    if type(value) is list and value and type(value[0]) is list:
        return _ids(value[0])
    return _ids(value)


def _first_choice(body: dict[str, Any]) -> dict[str, Any]:
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return {}


def read_response(call: CapturedCall, body: dict[str, Any]) -> None:
    """Fill ``call`` from a whole (non-streamed) response body."""
    call.response_id = body.get("id")
    call.response_model = body.get("model")
    call.usage = body.get("usage") if isinstance(body.get("usage"), dict) else None
    choice = _first_choice(body)
    call.finish_reason = choice.get("finish_reason")
    call.response_token_ids = _ids(choice.get("token_ids"))
    call.logprobs = _logprobs(call.kind, choice.get("logprobs"))
    if call.kind is CallKind.CHAT:
        call.prompt_token_ids = _ids(body.get("prompt_token_ids"))
        if call.response_token_ids_json is None:
            call.response_token_ids = _old_vllm_response_ids(body.get("response_token_ids"))
        message = choice.get("message") or {}
        call.text = message.get("content")
        call.tool_calls = message.get("tool_calls") or None
    else:
        call.prompt_token_ids = _ids(choice.get("prompt_token_ids"))
        call.text = choice.get("text")


class StreamAssembler:
    """Builds up a :class:`CapturedCall` from the JSON chunks of a streamed response, in order."""

    def __init__(self, call: CapturedCall) -> None:
        self.call = call
        self._text: list[str] = []
        self._ids: list[int] = []
        self._logprobs: list[float] = []
        self._saw_ids = False
        self._saw_logprobs = False
        self._tools: dict[int, dict[str, Any]] = {}

    def feed(self, chunk: dict[str, Any]) -> None:
        call = self.call
        call.response_id = call.response_id or chunk.get("id")
        call.response_model = call.response_model or chunk.get("model")
        if isinstance(chunk.get("usage"), dict):
            call.usage = chunk["usage"]
        if call.prompt_token_ids_json is None:
            call.prompt_token_ids = _ids(chunk.get("prompt_token_ids"))
        choice = _first_choice(chunk)
        if not choice or choice.get("index", 0) != 0:
            return
        if call.prompt_token_ids_json is None:
            call.prompt_token_ids = _ids(choice.get("prompt_token_ids"))
        ids = _ids(choice.get("token_ids"))
        if ids is not None:
            self._saw_ids = True
            self._ids.extend(ids)
        logprobs = _logprobs(call.kind, choice.get("logprobs"))
        if logprobs is not None:
            self._saw_logprobs = True
            self._logprobs.extend(logprobs)
        if choice.get("finish_reason"):
            call.finish_reason = choice["finish_reason"]
        if call.kind is CallKind.TEXT_COMPLETION:
            self._text.append(choice.get("text") or "")
            return
        delta = choice.get("delta") or {}
        self._text.append(delta.get("content") or "")
        for tool in delta.get("tool_calls") or []:
            self._merge_tool(tool)

    def _merge_tool(self, delta: dict[str, Any]) -> None:
        # Tool calls stream as fragments keyed by index: the id and name once, the arguments in pieces.
        entry = self._tools.setdefault(
            int(delta.get("index", 0)), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if delta.get("id"):
            entry["id"] = delta["id"]
        function = delta.get("function") or {}
        entry["function"]["name"] += function.get("name") or ""
        entry["function"]["arguments"] += function.get("arguments") or ""

    def finish(self) -> CapturedCall:
        call = self.call
        call.text = "".join(self._text)
        call.response_token_ids = self._ids if self._saw_ids else None
        call.logprobs = self._logprobs if self._saw_logprobs else None
        call.tool_calls = [self._tools[i] for i in sorted(self._tools)] or None
        return call


def iter_sse_data(buffer: bytearray, data: bytes) -> list[bytes]:
    """Append ``data`` to ``buffer`` and take out the payload of each complete ``data:`` line."""
    buffer.extend(data)
    payloads: list[bytes] = []
    while True:
        end = buffer.find(b"\n")
        if end < 0:
            return payloads
        line = bytes(buffer[:end]).rstrip(b"\r")
        del buffer[: end + 1]
        if line.startswith(b"data:"):
            payloads.append(line[5:].strip())
