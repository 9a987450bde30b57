"""The rollout-addressed LLM proxy and its pause switch.

``POST /proxy/rollout/{id}/attempt/{a}/mode/{train|val}/openai/v1/{chat/completions|completions}``
forwards to the served model (AL's rules, :mod:`..upstream`) and records a ``model_request`` event
on that attempt; the id must carry the token of a runner's current attempt (:mod:`..runners`), else 403.
``POST /proxy/pause`` makes new calls answer 429 with ``Retry-After`` (here and in every worker adapter of
the namespace: the switch is in Redis) while calls in flight finish; ``GET /proxy/state`` counts them,
so a trainer can wait for the drain before syncing weights.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web

from rollq.models.errors import UnknownTaskError

from .. import upstream
from ..replies import body, error, json_body, reply
from ..schemas import PauseRequest, PauseStateResponse
from .common import SESSION, STORE


def paused_reply(state: PauseStateResponse) -> web.Response:
    """AL's answer to a call while paused: 429, ``Retry-After`` and ``X-Agl-Paused``."""
    return web.Response(
        status=429,
        headers={"Retry-After": str(state.retry_after_seconds), "X-Agl-Paused": "true"},
        text=json.dumps({"error": "gateway paused", "reason": state.reason}),
        content_type="application/json",
    )


async def forward(request: web.Request) -> web.Response:
    info = request.match_info
    rollout_id, attempt_id, mode, path = info["rollout_id"], info["attempt_id"], info["mode"], info["path"]
    if mode not in upstream.PROXY_MODES:
        return error(404, f"Unsupported proxy mode: {mode}")
    if path not in upstream.PROXY_PATHS:
        return error(404, f"Unsupported upstream path: {path}")
    store = request.app[STORE]
    try:
        record = await asyncio.to_thread(store.runner_attempt, rollout_id, "an LLM call")
    except UnknownTaskError:
        return error(404, f"Rollout not found: {rollout_id}")
    rollout_id = record.task.rollout_id
    payload: Any = await json_body(request, {})
    if not isinstance(payload, dict):
        return error(400, "Request body must be a JSON object")
    served = await asyncio.to_thread(store.served)
    if not served:
        return error(503, f"No servers available for model '{store.proxy.model_name}'")
    server = served[upstream.sticky_index(rollout_id, len(served))]
    prepared = store.proxy.prepare(payload, mode)
    state = await asyncio.to_thread(store.pause_state)
    if state.paused:
        return paused_reply(state)
    token = await asyncio.to_thread(store.begin_call)
    try:
        if prepared.get("stream", False):
            return error(400, "Streaming responses are not supported")
        started = time.perf_counter()
        url = f"{server.endpoint.rstrip('/')}/{path}"
        try:
            status, answer, retries = await upstream.send(request.app[SESSION], url, prepared)
        except upstream.UpstreamError as exc:
            return error(exc.status, exc.detail)
        routes = upstream.pop_routed_experts(answer)
        data = upstream.model_request_data(
            model=server.model,
            endpoint=server.endpoint,
            version=server.version,
            request=prepared,
            response=answer,
            started=started,
            http_status=status,
            retry_count=retries,
            routed_experts=routes,
        )
        await asyncio.to_thread(store.record_event, rollout_id, attempt_id, "model_request", data)
        return web.json_response(answer, status=status)
    finally:
        await asyncio.to_thread(store.end_call, token)


async def pause(request: web.Request) -> web.Response:
    change = await body(request, PauseRequest)
    return reply(await asyncio.to_thread(request.app[STORE].pause, change))


async def resume(request: web.Request) -> web.Response:
    return reply(await asyncio.to_thread(request.app[STORE].resume))


async def state(request: web.Request) -> web.Response:
    return reply(await asyncio.to_thread(request.app[STORE].pause_state))


def add(router: web.UrlDispatcher) -> None:
    router.add_post("/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1/{path:.*}", forward)
    router.add_post("/proxy/pause", pause)
    router.add_post("/proxy/resume", resume)
    router.add_get("/proxy/state", state)
