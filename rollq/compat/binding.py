"""Where a rollq HTTP server may listen, and who may talk to it: shared by ``serve-al`` and ``serve-agl``.

Both servers hand out work and accept results, so anyone who can reach them can poison a training run. They
bind loopback by default; elsewhere they need a key (``Authorization: Bearer <key>`` or ``x-api-key``) and
refuse to start without one.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket

from aiohttp import web


def is_loopback(host: str) -> bool:
    """Whether ``host`` only ever means this machine (a name counts when every address it has is loopback)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def refusal(host: str, key: str, how: str) -> str | None:
    """Why serving on ``host`` with ``key`` is refused (None when it is not): a non-loopback bind needs a key;
    ``how`` says how to pass one."""
    if key or is_loopback(host):
        return None
    return f"refusing to serve on {host} without a key: {how}"


def authorized(request: web.Request, key: str) -> bool:
    """Whether ``request`` carries ``key`` (as a bearer token or ``x-api-key``), compared in constant time."""
    header = request.headers.get("authorization", "")
    if header.startswith("Bearer ") and hmac.compare_digest(header[7:].encode(), key.encode()):
        return True
    return hmac.compare_digest(request.headers.get("x-api-key", "").encode(), key.encode())
