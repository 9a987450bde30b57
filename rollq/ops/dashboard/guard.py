"""What the dashboard lets a browser see and do: escaped values, state changes only by POST with a CSRF token.

rq-dashboard 0.9.0 renders its pages in the browser from JSON endpoints, inserting every value with
``innerHTML`` unescaped: a task input quoted in an agent's error ran as script on the job page. Its
``/requeue/<queue>`` changes state on a plain GET, and nothing checks where a POST comes from. So, around the
bundled app:

- every string in a JSON answer of rq-dashboard's (``/<n>/data/...``) is HTML-escaped on the way out: inserted
  with ``innerHTML`` it shows as the text it is and runs nothing;
- a request that can change state (any method but GET, HEAD and OPTIONS) needs the dashboard's CSRF token in an
  ``X-CSRFToken`` header (rq-dashboard's scripts send the ``_csrf_token`` cookie's value there; the cookie is
  ``SameSite=Strict``), else 403; the GET form of rq-dashboard's requeue-all is refused (405).

rollq's own pages are rendered by Jinja with autoescaping and change nothing.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any

from flask import Flask, Response, request

CSRF_COOKIE = "_csrf_token"
CSRF_HEADER = "X-CSRFToken"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# rq-dashboard's view functions that change state but also answer GET.
_STATE_CHANGING_GETS = frozenset({"rq_dashboard.requeue_all"})


def escape_strings(value: Any) -> Any:
    """``value`` with ``&``, ``<`` and ``>`` in every string (keys included) HTML-escaped, recursively.

    Enough for what rq-dashboard inserts as element content: no tag can open. Quotes are kept, so a string that
    holds JSON (a job's ``metadata``) still parses; the values rq-dashboard puts in attributes are job ids,
    which RQ restricts to letters, digits, ``_`` and ``-``."""
    if isinstance(value, str):
        return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    if isinstance(value, list):
        return [escape_strings(v) for v in value]
    if isinstance(value, dict):
        return {escape_strings(k): escape_strings(v) for k, v in value.items()}
    return value


def install_guard(app: Flask) -> str:
    """Guard ``app`` (rq-dashboard's, with rollq's pages); returns the CSRF token it requires."""
    token = secrets.token_urlsafe(32)

    @app.before_request
    def _refuse_forged() -> Response | None:
        if request.method == "GET" and request.endpoint in _STATE_CHANGING_GETS:
            return Response("this changes state: POST it", status=405, headers={"Allow": "POST"})
        if request.method in _SAFE_METHODS:
            return None
        sent = request.headers.get(CSRF_HEADER, "") or request.form.get("csrf_token", "")
        if not hmac.compare_digest(sent.encode(), token.encode()):
            return Response("missing or wrong CSRF token", status=403)
        return None

    @app.after_request
    def _escape_and_mark(response: Response) -> Response:
        if request.blueprint == "rq_dashboard" and response.is_json and "/data/" in request.path:
            payload = response.get_json(silent=True)
            if payload is not None:
                response.set_data(app.json.dumps(escape_strings(payload)))
        if response.mimetype == "text/html":
            response.set_cookie(CSRF_COOKIE, token, samesite="Strict", httponly=False, secure=False)
        return response

    return token
