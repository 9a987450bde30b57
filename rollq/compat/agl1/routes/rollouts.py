"""``/api/rollouts``: create (idempotent by id), list by state, the terminal cursor, get, patch, delete."""

from __future__ import annotations

import asyncio

from aiohttp import web
from pydantic import TypeAdapter, ValidationError

from rollq.models.errors import UnknownTaskError

from ..replies import BadRequest, body, error, query_int, reply
from ..schemas import RolloutCreate, RolloutDetail, RolloutPatch, RolloutState
from ..store import InvalidTransition
from .common import STORE, client_of

_STATES = TypeAdapter(list[RolloutState])


def _not_found(rollout_id: str) -> web.Response:
    return error(404, f"Rollout not found: {rollout_id}")


async def create(request: web.Request) -> web.Response:
    requests = await body(request, list[RolloutCreate])
    return reply(await asyncio.to_thread(request.app[STORE].create, requests), status=201)


async def list_by_state(request: web.Request) -> web.Response:
    raw = request.query.getall("state_in", [])
    if not raw:
        raise BadRequest(422, [{"type": "missing", "loc": ["query", "state_in"], "msg": "Field required"}])
    try:
        states = _STATES.validate_python(raw)
    except ValidationError as exc:
        raise BadRequest(422, exc.errors(include_url=False)) from None
    limit = query_int(request, "limit", 500)
    return reply(await asyncio.to_thread(request.app[STORE].in_states, states, limit, client_of(request)))


async def terminal(request: web.Request) -> web.Response:
    after, limit = query_int(request, "after", 0), query_int(request, "limit", 1000)
    return reply(await asyncio.to_thread(request.app[STORE].terminal, after, limit))


async def get(request: web.Request) -> web.Response:
    rollout_id = request.match_info["rollout_id"]
    try:
        rollout, attempts = await asyncio.to_thread(request.app[STORE].get, rollout_id)
    except UnknownTaskError:
        return _not_found(rollout_id)
    return reply(RolloutDetail(rollout=rollout, attempts=attempts))


async def patch(request: web.Request) -> web.Response:
    rollout_id = request.match_info["rollout_id"]
    change = await body(request, RolloutPatch)
    try:
        return reply(await asyncio.to_thread(request.app[STORE].patch, rollout_id, change, client_of(request)))
    except UnknownTaskError:
        return _not_found(rollout_id)
    except InvalidTransition as exc:
        return error(409, str(exc))


async def delete(request: web.Request) -> web.Response:
    await asyncio.to_thread(request.app[STORE].delete, request.match_info["rollout_id"])
    return web.Response(status=204)


def add(router: web.UrlDispatcher) -> None:
    router.add_post("/api/rollouts", create)
    router.add_get("/api/rollouts", list_by_state)
    router.add_get("/api/rollouts/terminal", terminal)  # before /{rollout_id}
    router.add_get("/api/rollouts/{rollout_id}", get)
    router.add_patch("/api/rollouts/{rollout_id}", patch)
    router.add_delete("/api/rollouts/{rollout_id}", delete)
