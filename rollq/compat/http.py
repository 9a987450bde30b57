"""Agent Lightning 0.1's worker-facing HTTP endpoints over a :class:`~rollq.compat.gateway.Gateway` (aiohttp).

``GET /task`` -> ``TaskIfAny``; ``GET /resources/latest`` and ``GET /resources/{id}`` ->
``ResourcesUpdate`` (404 when there is none); ``POST /rollout`` (a ``Rollout``) ->
``GenericResponse`` whose ``status`` is ``delivered``, ``superseded``, ``cancelled`` or ``task-missing``
(400 naming the field for a malformed body, 403 for a post without its attempt's token, 413 for a
body over ``max_body_bytes``). A claim Redis refused is a 503 naming the refusal (:mod:`rollq.compat.refusals`).
With a ``key``, every route needs it (401 otherwise; see :mod:`rollq.compat.binding`). Redis calls run on threads,
off the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import redis
from aiohttp import web

from rollq.models.contract import GenericResponse, TaskIfAny
from rollq.models.errors import AttemptTokenError, ContractShapeError

from .binding import authorized
from .gateway import Gateway
from .refusals import redis_refused

log = logging.getLogger(__name__)

_GATEWAY = web.AppKey("gateway", Gateway)


def _json(model: Any, status: int = 200) -> web.Response:
    return web.Response(text=model.model_dump_json(), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    # FastAPI's shape, which AL 0.1 clients already log.
    return web.json_response({"detail": message}, status=status)


def _client(request: web.Request) -> str:
    return f"al-client@{request.remote}"


async def _next_task(request: web.Request) -> web.Response:
    try:
        task = await asyncio.to_thread(request.app[_GATEWAY].next_task, _client(request))
    except redis.ResponseError as exc:  # the claim refused (a damaged key, OOM...): the server's trouble
        return redis_refused(exc, "the claim")
    return _json(TaskIfAny(is_available=task is not None, task=task))


async def _latest_resources(request: web.Request) -> web.Response:
    update = await asyncio.to_thread(request.app[_GATEWAY].get_resources, None)
    return _json(update) if update else _error(404, "No resources have been set on the server.")


async def _resources(request: web.Request) -> web.Response:
    resources_id = request.match_info["resources_id"]
    update = await asyncio.to_thread(request.app[_GATEWAY].get_resources, resources_id)
    return _json(update) if update else _error(404, f"Resource ID '{resources_id}' not found.")


async def _post_rollout(request: web.Request) -> web.Response:
    try:
        payload = await request.json()  # over client_max_size: aiohttp answers 413
    except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, and UnicodeDecodeError (not UTF-8)
        return _error(400, f"the body is not JSON (or not UTF-8, or nested too deep): {str(exc)[:200]}")
    try:
        outcome, message = await asyncio.to_thread(request.app[_GATEWAY].post_rollout, payload, _client(request))
    except AttemptTokenError as exc:
        return _error(403, str(exc))
    except ContractShapeError as exc:
        return _error(400, str(exc))
    return _json(GenericResponse(status=outcome.value, message=message))


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _guard(key: str) -> Any:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if key and not authorized(request, key):
            return _error(401, "Invalid or missing API key")
        return await handler(request)

    return guard


def make_app(gateway: Gateway, *, key: str = "", max_body_bytes: int | None = None) -> web.Application:
    """The aiohttp application serving ``gateway`` (start and stop the gateway around it). ``key``: required
    on every route when set; ``max_body_bytes``: the largest body accepted, by default the largest rollout
    the gateway publishes plus 64 KiB."""
    limit = max_body_bytes if max_body_bytes is not None else gateway.attempts.limits.max_result_bytes + 65536
    app = web.Application(middlewares=[_guard(key)], client_max_size=limit)
    app[_GATEWAY] = gateway
    app.router.add_get("/task", _next_task)
    app.router.add_get("/resources/latest", _latest_resources)
    app.router.add_get("/resources/{resources_id}", _resources)
    app.router.add_post("/rollout", _post_rollout)
    return app


class Server:
    """The endpoints on ``host:port`` inside a running event loop: ``await start()``, ``await stop()``."""

    def __init__(
        self,
        gateway: Gateway,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        key: str = "",
        max_body_bytes: int | None = None,
    ) -> None:
        self.gateway = gateway
        self.host, self.port = host, port
        self.key, self.max_body_bytes = key, max_body_bytes
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self.gateway.start()
        self._runner = web.AppRunner(
            make_app(self.gateway, key=self.key, max_body_bytes=self.max_body_bytes), access_log=None
        )
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        log.info(
            "serving Agent Lightning 0.1 endpoints on http://%s:%d/ (namespace %r)",
            self.host,
            self.port,
            self.gateway.keys.namespace,
        )

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await asyncio.to_thread(self.gateway.stop)
