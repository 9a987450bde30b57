"""The ``serve-agl`` application: AL 1.0's routes on rollq's store, its bearer key, and the server around it.

Every route but ``GET /healthz`` needs the key when one is set, as AL 1.0 does: ``Authorization:
Bearer <key>`` or ``x-api-key: <key>``, else 401 (:mod:`rollq.compat.binding`, shared with ``serve-al``).
A body over ``max_body_bytes`` is 413, one nested deeper than :data:`~.replies.MAX_JSON_DEPTH` is 400; a write
without its attempt's token is 403 and a claim past a client's share of leases 429 (:mod:`.runners`); a request
Redis refused (a claim refused for a damaged key, say) is 503 naming the refusal (:mod:`rollq.compat.refusals`). The
server holds no state of its own, so several may serve one namespace and a restart loses nothing; each hands
back the runners' attempts whose lease ended, every ``release_interval`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import redis
from aiohttp import web

from rollq.models.errors import AttemptTokenError, ContractShapeError, InvalidTaskError
from rollq.worker.config import WorkerSettings

from ..binding import authorized
from ..refusals import redis_refused
from .replies import BadRequest, error
from .routes import events, models, proxy, rollouts
from .routes.common import SESSION, STORE
from .runners import HeldTooMany
from .store import Agl1Store

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
UPSTREAM_TIMEOUT_SECONDS = 300.0


def default_max_body_bytes() -> int:
    """The largest rollout a worker publishes (``ROLLQ_MAX_RESULT_BYTES``) plus 64 KiB, as serve-al."""
    return WorkerSettings.from_env().max_result_bytes + 65536


def _middleware(key: str) -> Any:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if key and request.path != "/healthz" and not authorized(request, key):
            return error(401, "Invalid or missing API key")
        try:
            return await handler(request)
        except BadRequest as exc:
            return error(exc.status, exc.detail)
        except (InvalidTaskError, ContractShapeError) as exc:  # what the producer refuses of a client's values
            return error(422, str(exc))
        except AttemptTokenError as exc:
            return error(403, str(exc))
        except HeldTooMany as exc:
            return error(429, str(exc))
        except redis.ResponseError as exc:  # a claim refused (a damaged key, OOM...): the server's trouble
            return redis_refused(exc, "the request")

    return guard


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def make_app(store: Agl1Store, key: str = "", max_body_bytes: int | None = None) -> web.Application:
    """The aiohttp application serving AL 1.0's API from ``store``; ``key`` empty: no authentication;
    ``max_body_bytes``: the largest request body (413 past it), :func:`default_max_body_bytes` by default."""
    limit = max_body_bytes if max_body_bytes is not None else default_max_body_bytes()
    app = web.Application(middlewares=[_middleware(key)], client_max_size=limit)
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

    def __init__(
        self,
        store: Agl1Store,
        host: str = "127.0.0.1",
        port: int = 8080,
        key: str = "",
        *,
        max_body_bytes: int | None = None,
        release_interval: float = 2.0,
    ) -> None:
        self.store, self.host, self.port, self.key = store, host, port, key
        self.max_body_bytes, self.release_interval = max_body_bytes, release_interval
        self._runner: web.AppRunner | None = None
        self._releasing: asyncio.Task[None] | None = None

    async def _release_loop(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.store.release_expired)
            except Exception:  # Redis away for a moment: the next round retries
                log.exception("could not hand back expired runner leases")
            await asyncio.sleep(self.release_interval)

    async def start(self) -> None:
        self._runner = web.AppRunner(make_app(self.store, self.key, self.max_body_bytes), access_log=None)
        self._releasing = asyncio.create_task(self._release_loop())
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        log.info(
            "serving Agent Lightning 1.0's API on http://%s:%d/ (namespace %r)",
            self.host,
            self.port,
            self.store.keys.namespace,
        )

    async def stop(self) -> None:
        if self._releasing is not None:
            self._releasing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._releasing
            self._releasing = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
