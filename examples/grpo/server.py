"""An OpenAI-compatible inference server for :class:`policy.ReversePolicy`, in vLLM's spelling.

- ``POST /v1/chat/completions`` answers like vLLM >= 0.10.2: with ``return_token_ids: true`` the response has a
  top-level ``prompt_token_ids`` and ``choices[0].token_ids``; with ``logprobs: true`` the choice has
  ``logprobs.content[*].logprob`` for each sampled token; ``usage`` counts tokens. ``stream: true`` sends SSE
  chunks, the first with ``prompt_token_ids``, each choice delta with its ``token_ids``.
- ``GET /v1/models`` lists the model; ``POST /weights`` loads new weights (``{"version", "state"}``): the
  trainer's weight sync. ``GET /health`` answers ``{"version": ...}``.

Run: ``python examples/grpo/server.py --port 8011``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import threading
import time
from typing import Any

import torch
from aiohttp import web
from policy import ReversePolicy, decode, render_chat

MODEL = "reverse-policy"


class PolicyServer:
    def __init__(self, seed: int = 0) -> None:
        self.policy = ReversePolicy(seed=seed)
        self.version = "init"
        self.lock = threading.Lock()
        self.generator = torch.Generator().manual_seed(seed + 1)
        self.ids = itertools.count(1)
        self.calls = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/weights", self.weights)
        app.router.add_get("/health", self.health)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "rollq"}]})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.version, "calls": self.calls})

    async def weights(self, request: web.Request) -> web.Response:
        body = await request.json()
        with self.lock:
            self.policy.load_state_json(body["state"])
            self.version = str(body.get("version", self.version))
        return web.json_response({"version": self.version})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        messages = body.get("messages")
        if not isinstance(messages, list):
            return web.json_response({"error": {"message": "messages must be a list", "type": "invalid"}}, status=400)
        prompt_ids = render_chat(messages)
        temperature = float(body.get("temperature", 1.0))
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        with self.lock:
            ids, logprobs = self.policy.sample(prompt_ids, max_tokens, temperature, self.generator)
            self.calls += 1
        text = decode(ids)
        rid = f"chatcmpl-{next(self.ids)}"
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt_ids) + len(ids),
        }
        want_ids, want_logprobs = bool(body.get("return_token_ids")), bool(body.get("logprobs"))
        lp = {
            "content": [
                {"token": decode([i]), "logprob": p, "bytes": None, "top_logprobs": []}
                for i, p in zip(ids, logprobs, strict=True)
            ]
        }
        if body.get("stream"):
            return await self._stream(request, rid, prompt_ids, ids, lp, usage, want_ids, want_logprobs)
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "length" if len(ids) >= max_tokens else "stop",
            "logprobs": lp if want_logprobs else None,
        }
        answer: dict[str, Any] = {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": MODEL}
        if want_ids:
            choice["token_ids"] = ids
            answer["prompt_token_ids"] = prompt_ids
        answer |= {"choices": [choice], "usage": usage}
        return web.json_response(answer)

    async def _stream(
        self,
        request: web.Request,
        rid: str,
        prompt_ids: list[int],
        ids: list[int],
        lp: dict[str, Any],
        usage: dict[str, int],
        want_ids: bool,
        want_logprobs: bool,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        base = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": MODEL}
        for n, (token, entry) in enumerate(zip(ids, lp["content"], strict=True)):
            choice: dict[str, Any] = {"index": 0, "delta": {"content": decode([token])}, "finish_reason": None}
            if n == 0:
                choice["delta"]["role"] = "assistant"
            if want_ids:
                choice["token_ids"] = [token]
            if want_logprobs:
                choice["logprobs"] = {"content": [entry]}
            chunk = base | {"choices": [choice]}
            if want_ids and n == 0:
                chunk["prompt_token_ids"] = prompt_ids
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        final = base | {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "usage": usage}
        await response.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve the reversal policy over an OpenAI-compatible API.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    server = PolicyServer(seed=args.seed)
    web.run_app(server.app(), host=args.host, port=args.port, access_log=None, print=lambda *_: None)


if __name__ == "__main__":
    asyncio.set_event_loop(asyncio.new_event_loop())
    main()
