"""What every route reads from the application."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from ..store import Agl1Store

STORE = web.AppKey("agl1_store", Agl1Store)
SESSION = web.AppKey("agl1_session", aiohttp.ClientSession)
