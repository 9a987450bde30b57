"""Attempt events: ``POST /api/rollouts/{id}/attempt/{a}/events`` and ``GET /api/rollouts/{id}/events``."""

from __future__ import annotations

import asyncio

from aiohttp import web

from rollq.models.errors import UnknownTaskError

from .. import events as views
from ..replies import body, error, query_bool, reply
from ..schemas import EventCreate
from .common import STORE


async def post(request: web.Request) -> web.Response:
    rollout_id, attempt_id = request.match_info["rollout_id"], request.match_info["attempt_id"]
    event = await body(request, EventCreate)
    try:
        return reply(await asyncio.to_thread(request.app[STORE].post_event, rollout_id, attempt_id, event))
    except UnknownTaskError:
        return error(404, f"Rollout not found: {rollout_id}")


async def query(request: web.Request) -> web.Response:
    """The last attempt's events; ``format=triplet`` trims them for training (see :mod:`..events`)."""
    rollout_id = request.match_info["rollout_id"]
    include_routes = query_bool(request, "include_routed_experts", True)
    try:
        found = await asyncio.to_thread(request.app[STORE].events, rollout_id)
    except UnknownTaskError:
        return error(404, f"Rollout not found: {rollout_id}")
    return reply(
        views.query(
            found,
            event_type=request.query.get("event_type"),
            triplet=request.query.get("format") == "triplet",
            include_routed_experts=include_routes,
        )
    )


def add(router: web.UrlDispatcher) -> None:
    router.add_post("/api/rollouts/{rollout_id}/attempt/{attempt_id}/events", post)
    router.add_get("/api/rollouts/{rollout_id}/events", query)
