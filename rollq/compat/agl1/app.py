"""The ``serve-agl`` application: AL 1.0's routes on rollq's store, its bearer key, and the server around it.

Every route but ``GET /healthz`` needs the key when one is set, as AL 1.0 does: ``Authorization:
Bearer <key>`` or ``x-api-key: <key>``, else 401. The server holds no state of its own, so several
may serve one namespace and a restart loses nothing.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from .replies import BadRequest, error
from .routes import events, models, proxy, rollouts
from .routes.common import SESSION, STORE
from .store import Agl1Store

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
UPSTREAM_TIMEOUT_SECONDS = 300.0


def _authorized(request: web.Request, key: str) -> bool:
    header = request.headers.get("authorization", "")
    if header.startswith("Bearer ") and hmac.compare_digest(header[7:].encode(), key.encode()):
        return True
    return hmac.compare_digest(request.headers.get("x-api-key", "").encode(), key.encode())


def _middleware(key: str) -> Any:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if key and request.path != "/healthz" and not _authorized(request, key):
            return error(401, "Invalid or missing API key")
        try:
            return await handler(request)
        except BadRequest as exc:
            return error(exc.status, exc.detail)

    return guard


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def make_app(store: Agl1Store, key: str = "") -> web.Application:
    """The aiohttp application serving AL 1.0's API from ``store``; ``key`` empty: no authentication."""
    app = web.Application(middlewares=[_middleware(key)], client_max_size=256 * 1024 * 1024)
    app[STORE] = store

    async def session(app: web.Application):  # type: ignore[no-untyped-def]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=UPSTREAM_TIMEOUT_SECONDS)) as client:
            app[SESSION] = client
            yield

    app.cleanup_ctx.append(session)
    app.router.add_get("/healthz", _healthz)
    for resource in (rollouts, events, models, proxy):
        resource.add(app.router)
    return app


class Server:
    """The API on ``host:port`` inside a running event loop: ``await start()``, ``await stop()``."""

    def __init__(self, store: Agl1Store, host: str = "127.0.0.1", port: int = 8080, key: str = "") -> None:
        self.store, self.host, self.port, self.key = store, host, port, key
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self._runner = web.AppRunner(make_app(self.store, self.key), access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        log.info(
            "serving Agent Lightning 1.0's API on http://%s:%d/ (namespace %r)",
            self.host,
            self.port,
            self.store.keys.namespace,
        )

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
