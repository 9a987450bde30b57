"""``/api/models``: register inference endpoints (upsert by model and endpoint) and remove them all."""

from __future__ import annotations

import asyncio

from aiohttp import web

from ..replies import body, reply
from ..schemas import Model
from .common import STORE


async def register(request: web.Request) -> web.Response:
    models = await body(request, list[Model])
    return reply(await asyncio.to_thread(request.app[STORE].register, models), status=201)


async def delete_all(request: web.Request) -> web.Response:
    await asyncio.to_thread(request.app[STORE].delete_models)
    return reply({"status": "ok"})


def add(router: web.UrlDispatcher) -> None:
    router.add_post("/api/models", register)
    router.add_delete("/api/models", delete_all)
