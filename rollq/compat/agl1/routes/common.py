"""What every route reads from the application."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from ..store import Agl1Store

STORE = web.AppKey("agl1_store", Agl1Store)
SESSION = web.AppKey("agl1_session", aiohttp.ClientSession)


def client_of(request: web.Request) -> str:
    """Who a request comes from, as leases count it: its address (as serve-al counts its clients)."""
    return f"agl-client@{request.remote}"
