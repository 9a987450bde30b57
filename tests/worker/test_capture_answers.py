"""The proxy's typed read of a whole answer (rollq.worker.capture.answers): a call it fills is the call
read_response fills from the parsed answer, field for field; an answer it does not take leaves the call untouched
(the proxy then reads it as before); vLLM's and OpenAI's answers are taken."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rollq.worker.capture import answers, codec
from rollq.worker.capture.calls import CallKind, CapturedCall
from rollq.worker.capture.tokens import read_response

BIG = 2**70
CHAT, TEXT = CallKind.CHAT, CallKind.TEXT_COMPLETION


def _chat(**choice: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop", **choice}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def _logprobs(*values: Any) -> dict[str, Any]:
    return {"content": [{"token": "t", "logprob": v, "bytes": [116], "top_logprobs": []} for v in values]}


VLLM_CHAT = {**_chat(token_ids=[7, 8], logprobs=_logprobs(-0.25, -1.0000000000000002)), "prompt_token_ids": [1, 2, 3]}
TAKEN: dict[str, tuple[CallKind, Any]] = {
    "vllm chat, ids and logprobs": (CHAT, VLLM_CHAT),
    "openai chat, no ids": (CHAT, _chat()),
    "chat with tool calls and no content": (
        CHAT,
        _chat(
            message={
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            finish_reason="tool_calls",
            token_ids=[5],
        ),
    ),
    "chat with an empty tool call list": (CHAT, _chat(message={"role": "assistant", "content": "x", "tool_calls": []})),
    "ids beyond 64 bits, exact": (CHAT, {**_chat(token_ids=[BIG, -BIG]), "prompt_token_ids": [2**64, 0]}),
    "empty id lists": (CHAT, {**_chat(token_ids=[]), "prompt_token_ids": []}),
    "ids null": (CHAT, {**_chat(token_ids=None), "prompt_token_ids": None}),
    "int logprobs and a missing one": (CHAT, _chat(logprobs={"content": [{"logprob": 0}, {"token": "x"}]})),
    "logprobs without content": (CHAT, _chat(logprobs={"content": None})),
    "two choices: the first is kept": (CHAT, {**VLLM_CHAT, "choices": [*VLLM_CHAT["choices"], _chat()["choices"][0]]}),
    "no choices": (CHAT, {"id": "x", "choices": []}),
    "an empty object": (CHAT, {}),
    "message null": (CHAT, _chat(message=None)),
    "non-ASCII text and extra fields": (
        CHAT,
        {**_chat(message={"role": "assistant", "content": "é😀"}), "extra": {"deep": [[{"a": [1.5e300]}]]}},
    ),
    "usage with a big int and a float": (CHAT, {**_chat(), "usage": {"prompt_tokens": BIG, "cost": 0.1}}),
    "text completion, vLLM": (
        TEXT,
        {
            "id": "cmpl-1",
            "model": "m",
            "choices": [
                {
                    "text": "ok",
                    "finish_reason": "length",
                    "prompt_token_ids": [4, 5],
                    "token_ids": [9],
                    "logprobs": {"token_logprobs": [None, -0.5, 2], "tokens": ["a", "b", "c"]},
                }
            ],
        },
    ),
    "text completion without logprobs": (TEXT, {"choices": [{"text": "ok", "logprobs": None}]}),
}
REFUSED: dict[str, tuple[CallKind, bytes]] = {
    "Agent Lightning 0.1's per-choice ids": (
        CHAT,
        json.dumps({**_chat(), "prompt_token_ids": [1], "response_token_ids": [[7, 8], [9]]}).encode(),
    ),
    "an int id": (CHAT, json.dumps({**_chat(), "id": 5}).encode()),
    "content as parts": (CHAT, json.dumps(_chat(message={"content": [{"type": "text", "text": "x"}]})).encode()),
    "ids of mixed types": (CHAT, json.dumps(_chat(token_ids=[1, "a", 2])).encode()),
    "ids as floats": (CHAT, json.dumps(_chat(token_ids=[1.0, 2.0])).encode()),
    "nested ids": (CHAT, json.dumps({**_chat(), "prompt_token_ids": [[1], [2]]}).encode()),
    "ids as a string": (CHAT, json.dumps({**_chat(), "prompt_token_ids": "[1]"}).encode()),
    "a NaN logprob": (CHAT, json.dumps(_chat(logprobs=_logprobs(float("nan"))), allow_nan=True).encode()),
    "a null logprob": (CHAT, json.dumps(_chat(logprobs=_logprobs(None))).encode()),
    "a logprob entry that is no object": (CHAT, json.dumps(_chat(logprobs={"content": [1]})).encode()),
    "a lone surrogate": (CHAT, b'{"choices": [{"message": {"content": "\\ud800"}}]}'),
    "a choice that is no object": (CHAT, b'{"choices": [1]}'),
    "usage that is no object": (CHAT, b'{"usage": [1]}'),
    "an array": (CHAT, b"[1, 2]"),
    "not JSON": (CHAT, b'{"id": '),
    "not UTF-8": (CHAT, b'{"id": "\xff"}'),
    "a text logprob as a string": (TEXT, b'{"choices": [{"logprobs": {"token_logprobs": ["1.5"]}}]}'),
}


def _call(kind: CallKind) -> CapturedCall:
    return CapturedCall(kind=kind, resource="main", path="/chat/completions", start_ns=1)


def _as_parsed(kind: CallKind, data: bytes) -> CapturedCall:
    call = _call(kind)
    read_response(call, codec.loads(data))
    return call


@pytest.mark.parametrize("name", TAKEN)
@pytest.mark.parametrize("spacing", ["compact", "spaced"])
def test_an_answer_of_vllm_or_openai_shape_is_read_typed_as_read_response_reads_it(name: str, spacing: str) -> None:
    kind, answer = TAKEN[name]
    data = json.dumps(answer, separators=(",", ":")) if spacing == "compact" else json.dumps(answer, indent=2)
    call = _call(kind)
    assert answers.read_whole(call, data.encode())
    assert call == _as_parsed(kind, data.encode())
    assert [type(v) for v in call.logprobs or []] == [float] * len(call.logprobs or [])


@pytest.mark.parametrize("name", REFUSED)
def test_an_answer_of_another_shape_is_left_to_read_response_with_the_call_untouched(name: str) -> None:
    kind, data = REFUSED[name]
    call = _call(kind)
    assert not answers.read_whole(call, data)
    assert call == _call(kind)


def test_token_ids_are_kept_as_the_compact_text_they_came_in() -> None:
    call = _call(CHAT)
    data = b'{"choices": [{"token_ids": [ 7,\n 8 ]}], "prompt_token_ids": [1, 18446744073709551616]}'
    assert answers.read_whole(call, data)
    assert (call.prompt_token_ids_json, call.response_token_ids_json) == ("[1,18446744073709551616]", "[7,8]")
    assert call.prompt_token_ids == [1, 2**64] and call.response_token_ids == [7, 8]
