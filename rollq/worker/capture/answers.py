"""A whole (non-streamed) answer read in one typed pass, its token ids kept as the JSON text they came in.

:func:`tokens.read_response <rollq.worker.capture.tokens.read_response>` reads an answer the proxy parsed whole:
every field of it becomes a Python object first, the prompt's thousands of token ids and every logprob entry's
token, bytes and alternatives included, and the ids are then written back to JSON for the call's span. Here
msgspec decodes the answer against the few fields a record takes (:class:`_ChatAnswer`, :class:`_TextAnswer`):
the rest is only checked to be JSON and skipped, the token ids are kept as the text they came in
(``msgspec.Raw``, checked to be a flat array of ints by :func:`codec.int_array_text
<rollq.worker.capture.codec.int_array_text>`), and each logprob entry yields one float.

An answer this pass does not take whole (a field of another type than vLLM and OpenAI give it, ids that are not a
flat array of ints, Agent Lightning 0.1's per-choice id lists, a NaN, text that is not UTF-8) is left to
``read_response``, which reads it as before: :func:`read_whole` fills the call only when every field it sets
would come out of ``read_response`` the same (``tests/worker/test_capture_answers.py`` holds the two readers to
that, answer by answer).
"""

from __future__ import annotations

from typing import Any

import msgspec

from . import codec
from .calls import CallKind, CapturedCall

_NONE = msgspec.Raw()


class _ChatLogprob(msgspec.Struct):
    logprob: float = 0.0


class _ChatLogprobs(msgspec.Struct):
    content: list[_ChatLogprob] | None = None


class _Message(msgspec.Struct):
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class _ChatChoice(msgspec.Struct):
    message: _Message | None = None
    finish_reason: str | None = None
    token_ids: msgspec.Raw = _NONE
    logprobs: _ChatLogprobs | None = None


class _ChatAnswer(msgspec.Struct):
    id: str | None = None
    model: str | None = None
    choices: list[_ChatChoice] = []
    prompt_token_ids: msgspec.Raw = _NONE
    response_token_ids: msgspec.Raw = _NONE
    usage: dict[str, Any] | None = None


class _TextLogprobs(msgspec.Struct):
    token_logprobs: list[float | None] | None = None


class _TextChoice(msgspec.Struct):
    text: str | None = None
    finish_reason: str | None = None
    prompt_token_ids: msgspec.Raw = _NONE
    token_ids: msgspec.Raw = _NONE
    logprobs: _TextLogprobs | None = None


class _TextAnswer(msgspec.Struct):
    id: str | None = None
    model: str | None = None
    choices: list[_TextChoice] = []
    usage: dict[str, Any] | None = None


_CHAT = msgspec.json.Decoder(_ChatAnswer)
_TEXT = msgspec.json.Decoder(_TextAnswer)


class _NotTaken(Exception):
    """The answer is one for ``read_response``."""


def _ids(raw: msgspec.Raw) -> str | None:
    data = bytes(raw)
    if not data or data == b"null":  # absent, or null
        return None
    text = codec.int_array_text(data)
    if text is None:
        raise _NotTaken
    return text


def read_whole(call: CapturedCall, data: bytes) -> bool:
    """Fill ``call`` from the whole answer ``data`` as ``read_response`` would from its parsed JSON, and say so;
    False (``call`` untouched) for an answer this pass does not take."""
    try:
        if call.kind is CallKind.CHAT:
            _read_chat(call, _CHAT.decode(data))
        else:
            _read_text(call, _TEXT.decode(data))
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, _NotTaken):
        return False
    return True


def _read_chat(call: CapturedCall, answer: _ChatAnswer) -> None:
    choice = answer.choices[0] if answer.choices else _ChatChoice()
    response_ids = _ids(choice.token_ids)
    if response_ids is None and _ids(answer.response_token_ids) is not None:
        raise _NotTaken  # Agent Lightning 0.1's patched vLLM: one list per choice
    prompt_ids = _ids(answer.prompt_token_ids)
    content = choice.logprobs.content if choice.logprobs is not None else None
    message = choice.message or _Message()
    _fill(call, answer, choice.finish_reason, prompt_ids, response_ids)
    call.logprobs = None if content is None else [entry.logprob for entry in content]
    call.text = message.content
    call.tool_calls = message.tool_calls or None


def _read_text(call: CapturedCall, answer: _TextAnswer) -> None:
    choice = answer.choices[0] if answer.choices else _TextChoice()
    response_ids, prompt_ids = _ids(choice.token_ids), _ids(choice.prompt_token_ids)
    values = choice.logprobs.token_logprobs if choice.logprobs is not None else None
    _fill(call, answer, choice.finish_reason, prompt_ids, response_ids)
    call.logprobs = None if values is None else [0.0 if v is None else v for v in values]
    call.text = choice.text


def _fill(
    call: CapturedCall,
    answer: _ChatAnswer | _TextAnswer,
    finish_reason: str | None,
    prompt_ids: str | None,
    response_ids: str | None,
) -> None:
    # Only once nothing more can refuse the answer: a call is filled by one reader or the other, never by both.
    call.response_id = answer.id
    call.response_model = answer.model
    call.usage = answer.usage
    call.finish_reason = finish_reason
    call.prompt_token_ids_json = prompt_ids
    call.response_token_ids_json = response_ids
