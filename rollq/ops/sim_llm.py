"""The demo's simulated LLM, served as a tiny OpenAI-compatible endpoint that returns token ids like vLLM.

``POST /v1/chat/completions`` answers "Compute a + b" questions after a short
sleep: right with probability ``1 - temperature``, else off by one. Its
"tokeniser" is bytes (a token id per UTF-8 byte of the chat-rendered prompt and
of the answer), and, as vLLM >= 0.10.2 does, it returns ``prompt_token_ids``
and the choice's ``token_ids`` only when the request asks with
``return_token_ids: true``, and the sampled tokens' logprobs when it asks with
``logprobs: true``. It runs on a thread of the demo process.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
import socket
import threading
import time
from typing import Any

from aiohttp import web

_QUESTION = re.compile(r"(-?\d+)\s*\+\s*(-?\d+)")


def render(messages: list[dict[str, Any]]) -> str:
    """The prompt as the model would see it: a minimal chat template."""
    return "".join(f"<|{m.get('role')}|>{m.get('content') or ''}\n" for m in messages) + "<|assistant|>"


def token_ids(text: str) -> list[int]:
    return list(text.encode())


class SimulatedLLM:
    """``with SimulatedLLM() as llm: ... llm.url``: an OpenAI-compatible endpoint on 127.0.0.1."""

    def __init__(self, latency: tuple[float, float] = (0.02, 0.1)) -> None:
        self.latency = latency
        self.port = 0
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> SimulatedLLM:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        ready = threading.Event()

        def serve() -> None:
            loop = self._loop = asyncio.new_event_loop()
            app = web.Application()
            app.router.add_post("/v1/chat/completions", self._chat)
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.SockSite(runner, sock).start())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())

        self._thread = threading.Thread(target=serve, name="rollq-sim-llm", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        messages = body.get("messages") or []
        question = _QUESTION.search(str(messages[-1].get("content") if messages else ""))
        if question is None:
            return web.json_response(
                {"error": {"message": "ask me 'Compute a + b'", "type": "invalid_request"}}, status=400
            )
        thinking = random.uniform(*self.latency)
        await asyncio.sleep(thinking)
        truth = int(question.group(1)) + int(question.group(2))
        temperature = float(body.get("temperature", 0.5))
        answer = str(truth if random.random() > temperature else truth + random.choice((-1, 1)))
        prompt = render(messages)
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": answer},
            "finish_reason": "stop",
        }
        response: dict[str, Any] = {
            "id": f"chatcmpl-sim-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "sim-arith-1"),
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(token_ids(prompt)),
                "completion_tokens": len(token_ids(answer)),
                "total_tokens": len(token_ids(prompt)) + len(token_ids(answer)),
            },
        }
        if body.get("return_token_ids"):
            response["prompt_token_ids"] = token_ids(prompt)
            choice["token_ids"] = token_ids(answer)
        if body.get("logprobs"):  # vLLM's chat spelling: one entry per generated token (here, per byte)
            choice["logprobs"] = {
                "content": [
                    {"token": chr(b), "logprob": -0.05, "bytes": [b], "top_logprobs": []} for b in answer.encode()
                ]
            }
        # How long "generation" took, so a benchmark can tell the model's time from the path's.
        return web.json_response(response, headers={"X-Sim-Seconds": f"{thinking:.6f}"})
