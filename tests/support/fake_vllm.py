"""A fake vLLM OpenAI-compatible server: the response shapes of vLLM >= 0.10.2, token ids included.

Runs on a thread of the test process (aiohttp), on 127.0.0.1 and a free port. It
"tokenises" by character (token id = code point + 1000), answers ``reply <n>``
for the n-th call, and keeps what it sent per response id in :attr:`sent`, so a
test can compare the ids in a rollout with the ids the server really produced.

Knobs, settable while it runs: ``reject_unknown_fields`` answers 400 to any
request carrying ``return_token_ids`` (as OpenAI's own API does), ``fail_status``
answers every call with that status, ``delay`` sleeps before answering,
``chunk_chars`` sets the size of streamed deltas and ``chunk_pause`` the time between them,
``token_count_skew`` adds that many tokens to the usage's ``completion_tokens`` (ids
that do not match what the server says it generated, as in Agent Lightning #326).

Logprobs come back as vLLM sends them: chat with ``logprobs: true``, one entry per
generated token (``choices[0].logprobs.content``, per chunk when streamed); text
completions with ``logprobs: <n>`` (0 included: the sampled token's own), in
``choices[0].logprobs.token_logprobs``. The usage comes with every whole response,
and as a last chunk of a stream asked with ``stream_options.include_usage``.
``calls`` counts requests by path; ``in_flight`` is the number being answered now.
``answer`` (a function of the request body) replaces ``reply <n>`` with its text when it returns one.
``old_vllm`` answers chat calls as Agent Lightning 0.1's patched vLLM (before vLLM 0.10.2) did: top-level
``prompt_token_ids`` and ``response_token_ids`` (one list per choice) in every whole response, asked or not,
and no ``token_ids`` on the choice. ``authorizations`` keeps each call's ``Authorization`` header.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


def tokenize(text: str) -> list[int]:
    return [ord(c) + 1000 for c in text]


def _prompt_text(body: dict[str, Any], chat: bool) -> str:
    if chat:
        return "".join(f"<{m.get('role')}>{m.get('content') or ''}" for m in body.get("messages", []))
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


@dataclass
class Sent:
    """What the server answered one call with."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    logprobs: list[float] | None
    streamed: bool


@dataclass
class FakeVLLM:
    reject_unknown_fields: bool = False
    fail_status: int | None = None
    delay: float = 0.0
    chunk_chars: int = 3
    chunk_pause: float = 0.0
    answer: Callable[[dict[str, Any]], str | None] | None = None
    old_vllm: bool = False
    authorizations: list[str | None] = field(default_factory=list)
    max_in_flight: int = 0  # the most calls it held at once (during ``delay``)
    token_count_skew: int = 0
    fail_next: int = 0
    """Answer the next this many calls with ``fail_next_status`` (then answer normally)."""
    fail_next_status: int = 503
    name: str = "fake"
    """In every response id (``chatcmpl-<name>-<n>``): several fakes behind one resource keep their ids apart."""
    in_flight: int = 0
    received: list[dict[str, Any]] = field(default_factory=list)
    sent: dict[str, Sent] = field(default_factory=dict)
    port: int = 0
    _counter: itertools.count = field(default_factory=lambda: itertools.count(1))  # type: ignore[type-arg]
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeVLLM:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        ready = threading.Event()

        def serve() -> None:
            self._loop = asyncio.new_event_loop()
            app = web.Application(client_max_size=64 * 1024 * 1024)  # long conversations, as a model server takes
            app.router.add_post("/v1/chat/completions", self._chat)
            app.router.add_post("/v1/completions", self._completions)
            app.router.add_get("/v1/models", self._models)
            self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
            self._loop.run_until_complete(self._runner.setup())
            self._loop.run_until_complete(web.SockSite(self._runner, sock).start())
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())

        self._thread = threading.Thread(target=serve, daemon=True, name="fake-vllm")
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)

    # -- handlers ------------------------------------------------------------------------------------------
    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def _refusal(self, body: dict[str, Any]) -> web.Response | None:
        self.received.append(body)
        if self.delay:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                await asyncio.sleep(self.delay)
            finally:
                self.in_flight -= 1
        if self.fail_next > 0:
            self.fail_next -= 1
            return web.json_response(
                {"error": {"message": "the fake backend is failing on purpose", "type": "server_error"}},
                status=self.fail_next_status,
                headers={"Retry-After": "0"},
            )
        if self.fail_status is not None:
            return web.json_response(
                {"error": {"message": "the fake backend is failing on purpose", "type": "server_error"}},
                status=self.fail_status,
            )
        if self.reject_unknown_fields and "return_token_ids" in body:
            return web.json_response(
                {
                    "error": {
                        "message": "Unrecognized request argument supplied: return_token_ids",
                        "type": "invalid_request_error",
                    }
                },
                status=400,
            )
        return None

    def _answer(self, body: dict[str, Any], chat: bool) -> tuple[str, str, Sent]:
        n = next(self._counter)
        response_id = f"{'chatcmpl' if chat else 'cmpl'}-{self.name}-{n}"
        text = (self.answer(body) if self.answer is not None else None) or f"reply {n}"
        asked = body.get("logprobs")
        wanted = bool(asked) if chat else asked is not None and asked is not False
        logprobs = [-0.01 * (i + 1) for i in range(len(text))] if wanted else None
        sent = Sent(tokenize(_prompt_text(body, chat)), tokenize(text), text, logprobs, bool(body.get("stream")))
        self.sent[response_id] = sent
        return response_id, text, sent

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.authorizations.append(request.headers.get("Authorization"))
        refusal = await self._refusal(body)
        if refusal is not None:
            return refusal
        response_id, text, sent = self._answer(body, chat=True)
        ids = bool(body.get("return_token_ids"))
        model = body.get("model", "fake-model")
        if body.get("stream"):
            return await self._stream_chat(request, body, response_id, model, sent, ids)
        tool_calls = None
        if body.get("tools"):
            name = body["tools"][0]["function"]["name"]
            tool_calls = [{"id": "call_1", "type": "function", "function": {"name": name, "arguments": '{"x": 1}'}}]
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": None if tool_calls else text, "tool_calls": tool_calls or []},
            "logprobs": _chat_logprobs(text, sent.logprobs),
            "finish_reason": "tool_calls" if tool_calls else "stop",
        }
        response: dict[str, Any] = {
            "id": response_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": _usage(sent, self.token_count_skew),
        }
        if self.old_vllm:
            response["prompt_token_ids"] = sent.prompt_token_ids
            response["response_token_ids"] = [sent.token_ids]
        elif ids:
            response["prompt_token_ids"] = sent.prompt_token_ids
            choice["token_ids"] = sent.token_ids
        return web.json_response(response)

    async def _stream_chat(
        self, request: web.Request, body: dict[str, Any], response_id: str, model: str, sent: Sent, ids: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        base = {"id": response_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
        first: dict[str, Any] = {
            **base,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
        }
        if ids:
            first["prompt_token_ids"] = sent.prompt_token_ids
            first["choices"][0]["token_ids"] = []
        await response.write(_event(first))
        step = self.chunk_chars
        for start in range(0, len(sent.text), step):
            piece = sent.text[start : start + step]
            last = start + step >= len(sent.text)
            choice: dict[str, Any] = {
                "index": 0,
                "delta": {"content": piece},
                "logprobs": _chat_logprobs(piece, sent.logprobs[start : start + step] if sent.logprobs else None),
                "finish_reason": "stop" if last else None,
            }
            if ids:
                choice["token_ids"] = sent.token_ids[start : start + step]
            await response.write(_event({**base, "choices": [choice]}))
            await asyncio.sleep(self.chunk_pause)
        if (body.get("stream_options") or {}).get("include_usage"):
            await response.write(_event({**base, "choices": [], "usage": _usage(sent, self.token_count_skew)}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        refusal = await self._refusal(body)
        if refusal is not None:
            return refusal
        response_id, text, sent = self._answer(body, chat=False)
        ids = bool(body.get("return_token_ids"))
        model = body.get("model", "fake-model")
        if body.get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for start in range(0, len(text), self.chunk_chars):
                piece = text[start : start + self.chunk_chars]
                piece_logprobs = sent.logprobs[start : start + self.chunk_chars] if sent.logprobs else None
                choice: dict[str, Any] = {
                    "index": 0,
                    "text": piece,
                    "logprobs": {"tokens": list(piece), "token_logprobs": piece_logprobs} if piece_logprobs else None,
                    "finish_reason": "length" if start + self.chunk_chars >= len(text) else None,
                }
                if ids:
                    choice["token_ids"] = sent.token_ids[start : start + self.chunk_chars]
                    if start == 0:
                        choice["prompt_token_ids"] = sent.prompt_token_ids
                chunk = {"id": response_id, "object": "text_completion", "model": model, "choices": [choice]}
                await response.write(_event(chunk))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        choice = {
            "index": 0,
            "text": text,
            "logprobs": {"tokens": list(text), "token_logprobs": sent.logprobs} if sent.logprobs else None,
            "finish_reason": "length",
        }
        if ids:
            choice["prompt_token_ids"] = sent.prompt_token_ids
            choice["token_ids"] = sent.token_ids
        return web.json_response(
            {
                "id": response_id,
                "object": "text_completion",
                "created": int(time.time()),
                "model": model,
                "choices": [choice],
                "usage": _usage(sent, self.token_count_skew),
            }
        )


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _usage(sent: Sent, skew: int = 0) -> dict[str, int]:
    completion = len(sent.token_ids) + skew
    return {
        "prompt_tokens": len(sent.prompt_token_ids),
        "completion_tokens": completion,
        "total_tokens": len(sent.prompt_token_ids) + completion,
    }


def _chat_logprobs(text: str, logprobs: list[float] | None) -> dict[str, Any] | None:
    if logprobs is None:
        return None
    return {"content": [{"token": c, "logprob": lp, "top_logprobs": []} for c, lp in zip(text, logprobs, strict=True)]}
