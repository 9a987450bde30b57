"""Capturing agents that build their own OpenAI client from ``OPENAI_BASE_URL`` / ``OPENAI_API_BASE``.

Such an agent (Agent Lightning's APO example client is one) never looks at the ``LLM`` resource the
capturing proxy rewrites, so its calls went straight to the model: no triplet. When the worker starts with
either variable set to an http(s) URL, rollq points the variable at the worker's proxy
(``http://127.0.0.1:<port>/env-<n>[/v1]``) and forwards what arrives there to the URL it held.

One address then serves every rollout in flight in the process, so each call must say which rollout made it:

- rollq sets, in each rollout's own context, a per-attempt token (:data:`CURRENT_ATTEMPT`), and adds it as the
  :data:`ATTEMPT_HEADER` header to every request an ``httpx`` client (the ``openai`` SDK's transport) sends to
  the proxy from that context. Contexts follow asyncio tasks and the threads rollq runs sync agents on, so
  calls are attributed right with any number of rollouts in flight;
- a request without the header (another HTTP library, or a thread the agent started without copying the
  context) is attributed only when it cannot be wrong: the worker runs one rollout at a time
  (``ROLLQ_CONCURRENCY=1``) and one is open. With none open it belongs to no rollout and is forwarded
  uncaptured. Otherwise the proxy refuses it (HTTP 400, saying why and what to do) rather than guess: a call
  put on the wrong rollout would train on the wrong reward.

A client built before the worker started (at import time of the agent's module) keeps the old URL and is not
captured: build it in the rollout, or use the ``LLM`` resource's endpoint.
"""

from __future__ import annotations

import contextvars
import logging
import os
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

ENV_VARS = ("OPENAI_BASE_URL", "OPENAI_API_BASE")
ATTEMPT_HEADER = "X-Rollq-Attempt"

CURRENT_ATTEMPT: contextvars.ContextVar[str | None] = contextvars.ContextVar("rollq_capture_attempt", default=None)
"""The header token of the attempt whose context the code runs in (set in each rollout's context)."""


@dataclass(frozen=True)
class Upstream:
    """One environment variable's URL, served at ``/<key><suffix>`` of the proxy."""

    variable: str
    key: str
    url: str
    suffix: str


def plan(environ: MutableMapping[str, str]) -> list[Upstream]:
    """The upstreams to serve for the http(s) URLs in ``environ``'s variables; one per distinct URL."""
    found: dict[str, Upstream] = {}
    for variable in ENV_VARS:
        url = (environ.get(variable) or "").strip()
        if urlsplit(url).scheme not in ("http", "https"):
            continue
        if url.rstrip("/") not in found:
            suffix = "/v1" if urlsplit(url).path.rstrip("/").endswith("/v1") else ""
            found[url.rstrip("/")] = Upstream(variable, f"env-{len(found)}", url.rstrip("/"), suffix)
    return list(found.values())


def redirect(environ: MutableMapping[str, str], upstreams: list[Upstream], host: str, port: int) -> None:
    """Point each variable of ``upstreams`` (and any other holding the same URL) at the proxy."""
    by_url = {u.url: u for u in upstreams}
    for variable in ENV_VARS:
        upstream = by_url.get((environ.get(variable) or "").strip().rstrip("/"))
        if upstream is not None:
            environ[variable] = f"http://{host}:{port}/{upstream.key}{upstream.suffix}"
            log.info("capturing LLM calls to $%s (%s) through %s", variable, upstream.url, environ[variable])


_targets: dict[tuple[str, int], None] = {}
_patched_modules: set[str] = set()
HTTPX_MODULES = ("httpx", "httpx2")  # openai >= 3 sends through httpx2, a fork with the same client API


def _tag(request: Any) -> None:
    token = CURRENT_ATTEMPT.get()
    if token is None or ATTEMPT_HEADER in request.headers:
        return
    url = request.url
    if (url.host, url.port) in _targets:
        request.headers[ATTEMPT_HEADER] = token


def _wrap(module: Any) -> None:
    sync_send = module.Client.send
    async_send = module.AsyncClient.send

    def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        _tag(request)
        return sync_send(self, request, *args, **kwargs)

    async def send_async(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        _tag(request)
        return await async_send(self, request, *args, **kwargs)

    module.Client.send = send
    module.AsyncClient.send = send_async


def tag_httpx_requests(host: str, port: int) -> list[str]:
    """Make httpx clients add the calling rollout's :data:`ATTEMPT_HEADER` to requests for ``host:port``.

    ``Client.send`` / ``AsyncClient.send`` of ``httpx`` and ``httpx2`` (whichever are installed) are wrapped
    once per process: every request of any client passes there, whatever its transport. Requests to other
    hosts are left untouched. Returns the modules wrapped.
    """
    import importlib

    _targets[(host, port)] = None
    for name in HTTPX_MODULES:
        if name in _patched_modules:
            continue
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        _wrap(module)
        _patched_modules.add(name)
    return sorted(_patched_modules)


def unattributable(upstream: Upstream, in_flight: int, concurrency: int) -> str:
    """Why a request without :data:`ATTEMPT_HEADER` was refused, and what to do about it."""
    return (
        f"rollq cannot tell which rollout made this call to ${upstream.variable} ({upstream.url}): it carries no "
        f"{ATTEMPT_HEADER} header and this worker runs up to {concurrency} rollouts at once ({in_flight} open now). "
        "rollq adds the header to httpx-based clients (the openai SDK) called from the rollout's own context; "
        "from a thread of your own, run the call with contextvars.copy_context().run(...) taken in the rollout; "
        "with another HTTP client, run this agent with ROLLQ_CONCURRENCY=1 or use the LLM resource's endpoint. "
        "Refused rather than risk recording it on another rollout."
    )


def environment() -> MutableMapping[str, str]:
    """The process environment (a seam for tests)."""
    return os.environ
