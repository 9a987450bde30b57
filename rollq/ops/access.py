"""Who may reach ``rollq dashboard`` and ``rollq metrics``: a token, or loopback only.

The dashboard shows task inputs and rollouts and its rq-dashboard half can requeue jobs; ``/metrics`` tells
anyone how a run goes. Both bind 127.0.0.1 by default. With a token (``--token`` or ``ROLLQ_DASHBOARD_TOKEN``)
every request needs it, as HTTP basic auth (any user name, the token as password: what a browser prompts for)
or as ``Authorization: Bearer <token>`` (what Prometheus' ``authorization`` setting sends). Binding anywhere but
loopback without a token is refused at start-up, with one line saying how to pass one.

(``serve-al`` and ``serve-agl`` have the same rule in :mod:`rollq.compat`; the layers keep ops and compat apart.)
"""

from __future__ import annotations

import base64
import binascii
import errno
import hmac
from collections.abc import Callable, Iterable
from typing import Any

from rollq.compat.binding import is_loopback  # one definition, shared with serve-al/serve-agl
from rollq.models.errors import RollqError

TOKEN_ENV = "ROLLQ_DASHBOARD_TOKEN"
DASHBOARD_EXPOSES = "read (and requeue) your tasks"

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def check_bind(host: str, token: str, what: str, exposes: str) -> None:
    """Raise :class:`RollqError` when serving ``what`` on ``host`` without a token is not allowed; ``exposes`` says
    what anyone who reaches it could do."""
    if not token and not is_loopback(host):
        raise RollqError(
            f"refusing to serve {what} on {host} without a token: anyone who reaches it could {exposes}; set "
            f"{TOKEN_ENV} (or --token), or bind 127.0.0.1 and use an SSH tunnel"
        )


def authorized(header: str, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token`` (bearer, or basic with it as the password)."""
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        return hmac.compare_digest(value.strip().encode(), token.encode())
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return False
        return hmac.compare_digest(decoded.partition(":")[2].encode(), token.encode())
    return False


def require_token(app: WSGIApp, token: str) -> WSGIApp:
    """``app`` behind ``token`` (unchanged when the token is empty); a request without it gets 401."""
    if not token:
        return app

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if authorized(environ.get("HTTP_AUTHORIZATION", ""), token):
            return app(environ, start_response)
        start_response(
            "401 Unauthorized",
            [("Content-Type", "text/plain"), ("WWW-Authenticate", 'Basic realm="rollq", charset="UTF-8"')],
        )
        return [b"rollq: this server needs its token (basic auth password, or Authorization: Bearer <token>)\n"]

    return guarded


def port_in_use(exc: OSError, host: str, port: int) -> RollqError | None:
    """The one-line error for a bind that failed because the port is taken (None for other errors)."""
    if exc.errno == errno.EADDRINUSE:
        return RollqError(f"port {port} on {host} is already in use: stop what listens there or pass --port")
    if exc.errno == errno.EADDRNOTAVAIL:
        return RollqError(f"cannot listen on {host}: no such address on this machine (see --bind)")
    return None
