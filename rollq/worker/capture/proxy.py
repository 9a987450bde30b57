"""The capturing proxy: one HTTP server per worker process, on 127.0.0.1, on a thread of its own or the agents' loop.

It serves with :mod:`.httpserver` and forwards with :mod:`.httpclient` (httptools' parser; streaming in both
directions without buffering, a connection pool to the backend). By default it has a
thread and loop of its own rather than the async agents' loop: an async agent
that calls a sync client on that loop would otherwise wait on a proxy that
cannot run until it returns. ``ROLLQ_CAPTURE_ON_AGENT_LOOP=1`` (``loop=``) serves it on the agents' loop instead,
for agents whose LLM clients are all async: no thread wakes and no GIL changes hands per call (docs/workers.md,
"The proxy on the agents' loop"). With a thread of its own, the calls that async clients on the agents' loop hand
over in memory (:mod:`.in_memory`) are still served on that loop (``agents_loop=``): such a call is awaited there
anyway, so no sync client can block it, and it gets what the shared loop gives without what it risks. While that
loop is busy (its callbacks waiting ``agents_busy_lag`` or more for their turn, ``agents_lag()``), they go to the
proxy's thread instead: each step of a call served on a busy loop waits that long again. Each attempt
opens a :class:`AttemptCapture`: every ``LLM`` resource with an http(s)
endpoint gets an unguessable token, and the agent sees
``http://127.0.0.1:<port>/<token>/v1`` instead of the real endpoint. A request
to ``/<token>/<rest>`` is forwarded to the real endpoint plus ``<rest>``;
``POST .../chat/completions`` and ``POST .../completions`` are captured, any
other path passes through untouched. An unknown or revoked token gets 404, so a
straggler from a finished or superseded attempt never lands in another one.

A ``ProxyLLM`` (Agent Lightning 0.3) gets the same kind of address; the agent adds
``/rollout/<id>/attempt/<id>`` to it (``get_base_url``), which the proxy drops: the token already says
which attempt it is. URLs in ``OPENAI_BASE_URL`` / ``OPENAI_API_BASE`` are served at ``/env-<n>``,
attributed by a header (see :mod:`.ambient`).

For training (see ``docs/training-proxy.md``) every captured call also goes through:

- the :class:`~.gate.CallGate` (a weight-sync pause: no new upstream request while closed; each request is
  stamped with the latest resources version the worker knew when it was admitted);
- the LLM resource's options (:mod:`rollq.models.llm_options`): per-mode sampling settings that overwrite the
  agent's, logprobs of the sampled tokens in ``train`` mode, several upstreams with sticky routing
  (:mod:`.routing`), retries of 429/502/503/504 and unreachable upstreams with backoff, failing upstreams left
  out for a while.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from rollq.models.contract import LLM, NamedResources
from rollq.models.llm_options import RETRY_STATUSES, LLMOptions, for_agent, options_of

from ..event_loop import new_event_loop
from ..executor import BUSY_LAG_SECONDS
from . import ambient, codec, gil, in_memory
from .answers import read_whole
from .calls import CallKind, CapturedCall
from .gate import CallGate, GateTimeout
from .httpclient import Client, ClientError, ClientResponse
from .httpserver import Answer, Handler, Request, Response, Server, StreamResponse, json_response
from .routing import UpstreamHealth, backoff, rendezvous_order
from .spans import record_span
from .tokens import StreamAssembler, iter_sse_data, read_response

log = logging.getLogger(__name__)

TOKEN_IDS_FIELD = "return_token_ids"
DEFAULT_READ_TIMEOUT_SECONDS = 600.0
"""Longest silence from a backend within one call (a long generation streams or answers well within it)."""
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
"""Largest request body an agent may send through the proxy (was 256 MiB: a worker peaked at 3 GB)."""
# Hop-by-hop headers, and the ones that no longer hold once the body is re-encoded or decompressed.
_DROP_REQUEST = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "accept-encoding",
        "te",
        "upgrade",
        ambient.ATTEMPT_HEADER.lower(),
    }
)
_DROP_RESPONSE = frozenset({"content-length", "content-encoding", "transfer-encoding", "connection", "keep-alive"})
_ATTEMPT_HEADER = ambient.ATTEMPT_HEADER.lower()
_SAMPLING = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "seed", "n", "logprobs", "top_logprobs")


_EJECTING = frozenset({502, 503, 504})
"""Upstream answers that count towards taking the upstream out of the routing (429 only slows down)."""
_RETRY_AFTER_CAP = 30.0


@dataclass
class _Route:
    """Where one token leads: a resource of one attempt."""

    resource: str
    upstreams: tuple[str, ...]
    """The resource's upstreams in the order this rollout prefers them (see :mod:`.routing`)."""
    prefix: str
    parent: Context
    tracer: trace.Tracer
    logprobs: Any
    calls: list[CapturedCall]
    options: LLMOptions = field(default_factory=LLMOptions)
    enforced: dict[str, Any] = field(default_factory=dict)
    """Sampling settings of the task's mode, written over the agent's."""
    train: bool = False
    fallback_version: str | None = None
    """The attempt's resources version, for a call admitted before the worker knew any latest version."""

    attempt_path: bool = False  # a ProxyLLM's: the agent puts /rollout/<id>/attempt/<id> after the token

    @property
    def upstream(self) -> str:
        return self.upstreams[0]


@dataclass
class AttemptCapture:
    """The tokens of one attempt and the calls made through them; :meth:`close` revokes the tokens.

    ``header_token`` is what the attempt's calls to the environment's URLs carry in
    :data:`.ambient.ATTEMPT_HEADER` (set in the rollout's context as :data:`.ambient.CURRENT_ATTEMPT`).
    """

    proxy: CaptureProxy
    tokens: list[str] = field(default_factory=list)
    calls: list[CapturedCall] = field(default_factory=list)
    header_token: str | None = None

    def close(self) -> None:
        self.proxy.revoke(self.tokens, self.header_token)

    def failed_last_call(self) -> CapturedCall | None:
        """The latest call, when the backend answered it with an HTTP error (or it never reached the backend)."""
        last = self.calls[-1] if self.calls else None
        return last if last is not None and last.error is not None else None


def _proxy_suffix(endpoint: str) -> str:
    # Keep a trailing /v1 visible, so clients that take the endpoint as their base URL work unchanged.
    return "/v1" if urlsplit(endpoint).path.rstrip("/").endswith("/v1") else ""


class CaptureProxy:
    """Forwards and records LLM calls for every attempt of this worker process."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        gate: CallGate | None = None,
        *,
        read_timeout: float = DEFAULT_READ_TIMEOUT_SECONDS,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        switch_interval: float | None = gil.SWITCH_INTERVAL_SECONDS,
        loop: asyncio.AbstractEventLoop | None = None,
        in_memory: bool = False,
        agents_loop: asyncio.AbstractEventLoop | None = None,
        agents_lag: Callable[[], float] | None = None,
        agents_busy_lag: float = BUSY_LAG_SECONDS,
    ) -> None:
        """``read_timeout``: longest wait for the next byte from a backend before the call fails (504);
        ``max_body_bytes``: the largest request body an agent may send (413 past it); ``switch_interval``: the GIL
        switch interval the process gets while the proxy's thread serves a call over its socket, if it is longer (see
        :mod:`.gil`; None leaves it); ``loop``: serve on this running loop (the async agents', run by another thread)
        instead of a thread and loop of the proxy's own. An agent that makes a blocking call on that loop then blocks
        the proxy too: a sync client's LLM call from an async agent waits until its own timeout; ``in_memory``: this
        process's async httpx clients hand their calls to the proxy in memory instead of over its socket (see
        :mod:`.in_memory`); ``agents_loop``: with ``in_memory`` and a thread of the proxy's own, the calls handed over
        from this loop (the async agents') are served on it, with upstream connections of its own, instead of on the
        proxy's thread; ``agents_lag``: how long a callback ready on that loop waits now (seconds), ``agents_busy_lag``:
        from how long on the calls made there are served on the proxy's thread after all."""
        self.host = host
        self.read_timeout = read_timeout
        self.max_body_bytes = max_body_bytes
        self.switch_interval = switch_interval
        self._replaced_interval: float | None = None
        self._over_socket = 0  # calls over the socket being served on the proxy's own thread (counted there)
        self.port = 0
        self.gate = gate or CallGate()
        self.health = UpstreamHealth()
        self._routes: dict[str, _Route] = {}
        self._environment: dict[str, ambient.Upstream] = {}  # by key: the URLs of OPENAI_BASE_URL & co.
        self._environment_open: set[str] = set()  # header tokens of the attempts open now
        self._concurrency = 1
        self._rejecting: set[str] = set()  # upstreams that refused return_token_ids once
        self._loop: asyncio.AbstractEventLoop | None = loop
        self._shares_loop = loop is not None
        self.in_memory = in_memory
        self._agents_loop = agents_loop if loop is None else None
        self._agents_lag = agents_lag
        self.agents_busy_lag = agents_busy_lag
        self._clients: dict[asyncio.AbstractEventLoop, Client] = {}
        """The upstream connections of each loop that serves calls: the proxy's, and the agents' (see above)."""
        self._server: Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> CaptureProxy:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = int(sock.getsockname()[1])
        if self._loop is not None:
            self._start_on(self._loop, sock)
            self._hand_over()
            return self
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            loop = self._loop = new_event_loop()  # uvloop's where installed; agents' choice does not apply
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._open(sock))
            except BaseException as exc:  # reported to start()'s caller below
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._close())
            loop.close()

        self._thread = threading.Thread(target=serve, name="rollq-llm-capture", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        log.info("capturing LLM calls through http://%s:%d", self.host, self.port)
        self._hand_over()
        return self

    def _hand_over(self) -> None:
        if self.in_memory:
            libraries = in_memory.install(self)
            log.info("async LLM calls to the proxy from %s are handed over in memory", ", ".join(libraries) or "no")

    def _start_on(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        """Serve on ``loop``, which another thread runs: no thread of the proxy's own, no GIL hand-off between it
        and the agents (so the switch interval is left alone)."""
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            sock.close()
            raise RuntimeError("CaptureProxy(loop=...) must be started from a thread other than its loop's own")
        asyncio.run_coroutine_threadsafe(self._open(sock), loop).result(timeout=30)
        log.info("capturing LLM calls through http://%s:%d, on the agents' event loop", self.host, self.port)

    async def _open(self, sock: socket.socket) -> None:
        self.gate.bind(asyncio.get_running_loop())
        # httptools under a protocol of rollq's own (see .httpserver): the token is the path's first segment, so
        # no router runs per request. An agent that gives up on a call (its client timed out, its attempt was
        # stopped) cancels the handler, which closes the backend request instead of leaving it and its socket open.
        handler = self._handle if self._shares_loop else self._handle_over_socket
        self._server = Server(handler, max_body_bytes=self.max_body_bytes)
        await self._server.start(sock)

    async def _close(self) -> None:
        if self._server is not None:
            await self._server.close()
        await self._close_upstream()

    async def _close_upstream(self) -> None:
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    def _upstream(self) -> Client:
        """The upstream connections of the loop running now (made there the first time it serves a call)."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            # A hung backend must not hold a call (and its socket) forever: no byte for read_timeout fails it. No
            # cookies are kept between calls.
            client = self._clients[loop] = Client(connect_timeout=30, read_timeout=self.read_timeout)
        return client

    def stop(self) -> None:
        in_memory.uninstall(self)
        agents_loop = self._agents_loop
        if agents_loop is not None and agents_loop in self._clients and agents_loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self._close_upstream(), agents_loop).result(timeout=5)
            except TimeoutError:  # the loop is blocked or stopping: its process is going away
                log.warning("the capturing proxy's connections on the agents' loop did not close within 5 s")
        if self._shares_loop:
            if self._loop is not None and self._loop.is_running():
                try:
                    asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=5)
                except TimeoutError:  # the loop is blocked or stopping: its process is going away
                    log.warning("the capturing proxy did not close within 5 s on the agents' loop")
            return
        if self._loop is not None and self._thread is not None and not self._loop.is_closed():  # not stopped yet
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        if self.switch_interval is not None:
            gil.restore_switch_interval(self._replaced_interval, self.switch_interval)
            self._replaced_interval = None

    def serving(self, caller: asyncio.AbstractEventLoop) -> tuple[asyncio.AbstractEventLoop, Handler] | None:
        """The loop that serves a call handed over in memory from ``caller`` (``caller`` itself when it is the
        agents' loop and not busy, else the proxy's), and the proxy's handler, while the proxy runs; else None."""
        loop = self._loop
        if loop is None or loop.is_closed() or not loop.is_running() or self._server is None:
            return None
        keeps_up = self._agents_lag is None or self._agents_lag() < self.agents_busy_lag
        return (caller if caller is self._agents_loop and keeps_up else loop), self._handle

    def serve_environment(self, concurrency: int, environ: Any = None) -> list[ambient.Upstream]:
        """Capture calls to the URLs in ``OPENAI_BASE_URL`` / ``OPENAI_API_BASE`` too (see :mod:`.ambient`).

        The variables are pointed at this proxy; ``concurrency`` (rollouts at once in this process) decides
        whether a call that does not say its rollout can be attributed (only at 1).
        """
        environ = ambient.environment() if environ is None else environ
        upstreams = ambient.plan(environ)
        if not upstreams:
            return []
        self._concurrency = concurrency
        self._environment = {u.key: u for u in upstreams}
        ambient.redirect(environ, upstreams, self.host, self.port)
        ambient.tag_httpx_requests(self.host, self.port)
        return upstreams

    @property
    def serves_environment(self) -> bool:
        return bool(self._environment)

    # -- attempts --------------------------------------------------------------------------------------------
    def open_attempt(
        self,
        resources: NamedResources,
        parent: Context,
        tracer: trace.Tracer,
        *,
        rollout_id: str = "",
        mode: str | None = None,
        resources_id: str | None = None,
    ) -> tuple[NamedResources, AttemptCapture]:
        """``resources`` with each http(s) LLM endpoint pointed at this proxy, and the attempt's capture.

        ``rollout_id`` picks the upstream its calls stick to, ``mode`` the sampling settings enforced and whether
        logprobs are asked for, ``resources_id`` (the attempt's version) stamps calls until the worker knows the
        latest. :class:`InvalidLLMOptionsError` for an LLM whose options are not valid.
        """
        attempt = AttemptCapture(self)
        rewritten: dict[str, Any] = dict(resources)
        captured = {
            name: (resource, options_of(resource))  # every resource's options checked before any token is handed out
            for name, resource in resources.items()
            if isinstance(resource, LLM) and urlsplit(resource.endpoint).scheme in ("http", "https")
        }
        if self._environment:
            attempt.header_token = secrets.token_urlsafe(24)
            for upstream in self._environment.values():
                key = f"{attempt.header_token}@{upstream.key}"
                self._routes[key] = _Route(
                    resource=f"${upstream.variable}",
                    upstreams=(upstream.url,),
                    prefix=f"/{upstream.key}{upstream.suffix}",
                    parent=parent,
                    tracer=tracer,
                    logprobs=None,
                    calls=attempt.calls,
                    train=mode == "train",
                    fallback_version=resources_id,
                )
                attempt.tokens.append(key)
            self._environment_open.add(attempt.header_token)
        for name, (resource, options) in captured.items():
            token = secrets.token_urlsafe(24)
            suffix = _proxy_suffix(resource.endpoint)
            self._routes[token] = _Route(
                resource=name,
                upstreams=rendezvous_order(rollout_id, options.upstreams(resource)),
                prefix=f"/{token}{suffix}",
                parent=parent,
                tracer=tracer,
                logprobs=resource.sampling_parameters.get("logprobs"),
                calls=attempt.calls,
                options=options,
                enforced=options.sampling_for(mode),
                train=mode == "train",
                fallback_version=resources_id,
                attempt_path=resource.resource_type != "llm",  # AL 0.3's ProxyLLM
            )
            attempt.tokens.append(token)
            # A copy: the cached resources are shared by every attempt of this process.
            rewritten[name] = for_agent(resource, endpoint=f"http://{self.host}:{self.port}/{token}{suffix}")
        return rewritten, attempt

    def revoke(self, tokens: list[str], header_token: str | None = None) -> None:
        for token in tokens:
            self._routes.pop(token, None)
        if header_token is not None:
            self._environment_open.discard(header_token)

    # -- serving ---------------------------------------------------------------------------------------------
    async def _environment_route(self, request: Request, key: str) -> _Route | Answer:
        """The route of the attempt a call to an environment URL came from; else the refusal saying why not, or,
        with no rollout open at all, the call forwarded uncaptured (it belongs to none: a hook's, a straggler's)."""
        header = request.headers.get(_ATTEMPT_HEADER)  # names come lower-cased
        open_now = tuple(self._environment_open)  # one copy: runner threads open and close attempts meanwhile
        if header is None and self._concurrency == 1 and len(open_now) == 1:
            header = open_now[0]  # one rollout at a time, and one open: it is that one
        if header is None and not open_now:
            upstream = self._environment[key]
            rest = request.path[len(f"/{key}{upstream.suffix}") :]
            url = upstream.url + rest + (f"?{request.query_string}" if request.query_string else "")
            return await self._pass_through(request, url, await request.read())
        if header is None:
            message = ambient.unattributable(self._environment[key], len(open_now), self._concurrency)
            log.error("%s", message)
            return json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=400)
        route = self._routes.get(f"{header}@{key}")
        if route is None:
            message = f"rollq capture: the rollout attempt of {ambient.ATTEMPT_HEADER} has ended or is unknown"
            return json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=404)
        return route

    async def _handle_over_socket(self, request: Request) -> Answer:
        """:meth:`_handle` for a call over the socket to the proxy's own thread, the GIL switch interval lowered
        while any such call is served (see :mod:`.gil`). Calls handed over in memory leave it alone, wherever they
        are served: on the agents' loop no thread waits for them, and on the proxy's thread (from a busy agents'
        loop, or another loop) their answers go back to a loop that needs the GIL as much."""
        if self._over_socket == 0 and self.switch_interval is not None:
            self._replaced_interval = gil.lower_switch_interval(self.switch_interval)
        self._over_socket += 1
        try:
            return await self._handle(request)
        finally:
            self._over_socket -= 1
            if self._over_socket == 0 and self.switch_interval is not None:
                gil.restore_switch_interval(self._replaced_interval, self.switch_interval)
                self._replaced_interval = None

    async def _handle(self, request: Request) -> Answer:
        path = request.path
        key = path[1:].split("/", 1)[0]
        found: _Route | Answer | None
        if key in self._environment:
            found = await self._environment_route(request, key)
            if not isinstance(found, _Route):
                return found
        else:
            found = self._routes.get(key)
        route = found
        if route is not None and route.attempt_path:
            head = f"/{key}"
            path = head + _ATTEMPT_PATH.sub("", path[len(head) :], count=1)
        if route is None or not (path == route.prefix or path.startswith(route.prefix + "/")):
            return json_response(
                {"error": {"message": "unknown or expired rollq capture address", "type": "invalid_request_error"}},
                status=404,
            )
        rest = path[len(route.prefix) :]
        query = f"?{request.query_string}" if request.query_string else ""
        kind = (
            CallKind.CHAT
            if rest.endswith("/chat/completions")
            else CallKind.TEXT_COMPLETION
            if rest.endswith("/completions")
            else None
        )
        raw = await request.read()
        body: Any = None
        if kind is not None and request.method == "POST":
            try:
                body = codec.loads(raw)
            except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
                body = None
        if not isinstance(body, dict) or kind is None:
            return await self._pass_through(request, self.health.pick(route.upstreams) + rest + query, raw)
        return await self._capture(request, route, kind, rest, query, raw, body)

    def _headers(self, request: Request) -> dict[str, str]:
        return {k: v for k, v in request.headers.items() if k not in _DROP_REQUEST}  # names come lower-cased

    async def _pass_through(self, request: Request, url: str, raw: bytes) -> Answer:
        client = self._upstream()
        try:
            async with client.request(
                request.method, url, data=raw or None, headers=self._headers(request)
            ) as upstream:
                response = StreamResponse(status=upstream.status, headers=_response_headers(upstream.header_list))
                await response.prepare(request)
                try:
                    async for data in upstream.content.iter_any():
                        await response.write(data)
                except (TimeoutError, ClientError, ConnectionResetError):
                    upstream.close()
                    _cut(request)  # the client sees a broken response, not a complete one
                    return response
                await response.write_eof()
                return response
        except (TimeoutError, ClientError) as exc:
            return _bad_gateway(exc)

    async def _capture(
        self,
        request: Request,
        route: _Route,
        kind: CallKind,
        rest: str,
        query: str,
        raw: bytes,
        body: dict[str, Any],
    ) -> Answer:
        call = CapturedCall(
            kind=kind,
            resource=route.resource,
            path=rest,
            start_ns=time.time_ns(),
            request_model=body.get("model") if isinstance(body.get("model"), str) else None,
            messages=body.get("messages") if kind is CallKind.CHAT else None,
            prompt=body.get("prompt") if kind is CallKind.TEXT_COMPLETION else None,
            streamed=bool(body.get("stream")),
        )
        fields = dict(route.enforced)
        if route.enforced:
            call.sampling_enforced = dict(route.enforced)
            differing = {k: body[k] for k in route.enforced if k in body and body[k] != route.enforced[k]}
            call.sampling_overridden = differing or None
        wants_logprobs = (route.train and route.options.train_logprobs) or bool(route.logprobs)
        asked = body.get("logprobs")
        if (
            wants_logprobs
            and "logprobs" not in fields
            and not asked
            and not (kind is CallKind.TEXT_COMPLETION and type(asked) is int)
        ):
            # The sampled tokens' own logprobs: chat takes a flag; text completions a count of alternatives (0).
            legacy = route.logprobs if not isinstance(route.logprobs, bool) and route.logprobs is not None else 0
            fields["logprobs"] = True if kind is CallKind.CHAT else int(legacy)
            if "logprobs" in body:  # the agent said no (false, or null)
                call.sampling_overridden = {**(call.sampling_overridden or {}), "logprobs": asked}
        sent = {**body, **fields}
        call.sampling = {k: sent[k] for k in _SAMPLING if k in sent}
        headers = self._headers(request)
        headers["content-type"] = "application/json"  # the names are lower-cased (see _headers)
        parent = _parent(request, route.parent)
        avoid: str | None = None
        tries = route.options.retries + 1
        for attempt in range(1, tries + 1):
            upstream_url = self.health.pick(route.upstreams, avoid)
            call.upstream, call.upstream_attempts = upstream_url, attempt
            try:
                version = await self.gate.admit()
            except GateTimeout as exc:
                return self._paused(call, route, parent, exc)
            call.resources_id = version or route.fallback_version
            retry_in: float | None = None
            try:
                answer = await self._forward(
                    request, call, route, parent, upstream_url, query, headers, raw, body, fields, last=attempt == tries
                )
                if not isinstance(answer, tuple):
                    if answer.status in _EJECTING:
                        self._failed(upstream_url, route.options)
                    else:
                        self.health.restore(upstream_url)
                    return answer
                status, retry_after = answer
                if status in _EJECTING:
                    self._failed(upstream_url, route.options)
                avoid, retry_in = upstream_url, retry_after  # the retry goes to another server, if there is one
            except ClientError as exc:
                log.warning("LLM upstream %s failed (%s: %s); try %d of %d", upstream_url, type(exc).__name__, exc,
                            attempt, tries)  # fmt: skip
                self.health.eject(upstream_url, route.options.eject_seconds)
                avoid = upstream_url
                if attempt == tries:
                    timed_out = isinstance(exc, asyncio.TimeoutError)  # no byte for read_timeout
                    call.error = f"no answer in {self.read_timeout:g}s" if timed_out else f"{type(exc).__name__}: {exc}"
                    self._record(call, route, parent, status=504 if timed_out else 502)
                    return _bad_gateway(exc, 504 if timed_out else 502)
            finally:
                self.gate.release()
            # The request is out of the gate while it waits: a pause can drain meanwhile, and the retry is admitted
            # (and stamped with its version) again.
            wait = backoff(attempt, route.options.backoff_seconds, route.options.backoff_max_seconds)
            await asyncio.sleep(min(max(wait, retry_in or 0.0), _RETRY_AFTER_CAP))
        raise AssertionError("unreachable: the last try returns")  # pragma: no cover

    async def _forward(
        self,
        request: Request,
        call: CapturedCall,
        route: _Route,
        parent: Context,
        base: str,
        query: str,
        headers: dict[str, str],
        raw: bytes,
        body: dict[str, Any],
        fields: dict[str, Any],
        *,
        last: bool,
    ) -> Answer | tuple[int, float | None]:
        """One upstream request of a call to upstream ``base``: the answer given to the client, or
        ``(status, retry_after)`` of an answer to retry (never when ``last``)."""
        client = self._upstream()
        url = base + call.path + query
        extra = dict(fields)
        call.token_ids_requested = base not in self._rejecting and TOKEN_IDS_FIELD not in body
        if call.token_ids_requested:
            extra[TOKEN_IDS_FIELD] = True
        upstream = await client.post(url, data=_with_fields(raw, body, extra), headers=headers)
        if call.token_ids_requested and upstream.status in (400, 422):
            refusal = await upstream.read()
            upstream.release()
            if TOKEN_IDS_FIELD.encode() not in refusal:
                return self._finish_plain(call, route, parent, upstream, refusal)
            # An OpenAI-compatible server without vLLM's extension: the call goes through without it.
            log.warning("%s refused %s; capturing %s calls without token ids", url, TOKEN_IDS_FIELD, base)
            self._rejecting.add(base)
            call.token_ids_requested = False
            extra.pop(TOKEN_IDS_FIELD)
            upstream = await client.post(url, data=_with_fields(raw, body, extra), headers=headers)
        try:
            if upstream.status in RETRY_STATUSES and not last:
                await upstream.read()
                return upstream.status, _retry_after(upstream.headers)
            streamed = upstream.status == 200 and upstream.content_type == "text/event-stream"
            if streamed:
                return await self._stream(request, call, route, parent, upstream)
            return self._finish_plain(call, route, parent, upstream, await upstream.read())
        except BaseException:
            upstream.close()  # cancelled or failed part way: the backend request ends with the call
            raise
        finally:
            upstream.release()

    def _failed(self, upstream: str, options: LLMOptions) -> None:
        if self.health.failed(upstream, seconds=options.eject_seconds, after=options.eject_after):
            log.warning("LLM upstream %s failed %d times in a row: left out for %gs", upstream, options.eject_after,
                        options.eject_seconds)  # fmt: skip

    def _paused(self, call: CapturedCall, route: _Route, parent: Context, exc: GateTimeout) -> Response:
        message = (
            f"rollq: LLM calls are paused for a weight sync; this call waited {exc.waited:.1f}s "
            f"(the worker's llm_pause_wait_seconds); try again"
        )
        call.error = message
        self._record(call, route, parent, status=503)
        return json_response(
            {"error": {"message": message, "type": "service_unavailable", "code": "rollq_llm_paused"}},
            status=503,
            headers={"Retry-After": str(exc.retry_after)},
        )

    def _finish_plain(
        self, call: CapturedCall, route: _Route, parent: Context, upstream: ClientResponse, data: bytes
    ) -> Response:
        if upstream.status >= 400:
            call.error = data[:2000].decode(errors="replace")
        elif not read_whole(call, data):  # an answer of another shape than vLLM's and OpenAI's: read as parsed
            try:
                parsed = codec.loads(data)
            except (ValueError, RecursionError):
                call.error = f"the backend answered HTTP {upstream.status} with a body that is not JSON"
            else:
                if isinstance(parsed, dict):
                    try:
                        read_response(call, parsed)
                    except Exception as exc:  # an odd but valid answer: passed on as it came, recorded as far as read
                        log.warning(
                            "could not read all of an LLM answer from %s (%s: %s)",
                            route.upstream,
                            type(exc).__name__,
                            exc,
                        )
        self._record(call, route, parent, status=upstream.status)
        return Response(body=data, status=upstream.status, headers=_response_headers(upstream.header_list))

    async def _stream(
        self,
        request: Request,
        call: CapturedCall,
        route: _Route,
        parent: Context,
        upstream: ClientResponse,
    ) -> StreamResponse:
        response = StreamResponse(status=upstream.status, headers=_response_headers(upstream.header_list))
        await response.prepare(request)
        assembler = StreamAssembler(call)
        buffer = bytearray()
        recorded = False
        try:
            async for data in upstream.content.iter_any():
                # Each piece goes to the client as it arrives and is parsed for the record after, except the
                # last: a client stops at [DONE] and its agent may finish at once, so the call is recorded first.
                last = b"data: [DONE]" in data
                if not last:
                    await response.write(data)
                for payload in iter_sse_data(buffer, data):
                    if payload and payload != b"[DONE]":
                        try:
                            assembler.feed(codec.loads(payload))
                        except (ValueError, RecursionError):
                            pass  # a keep-alive or non-JSON event: forwarded, not recorded
                        except Exception as exc:  # an odd but valid chunk: forwarded as it came, not read
                            log.warning("could not read a streamed LLM chunk (%s: %s)", type(exc).__name__, exc)
                if last:
                    self._record(assembler.finish(), route, parent, status=upstream.status)
                    recorded = True
                    await response.write(data)
            await response.write_eof()
        except (TimeoutError, ConnectionResetError, ClientError) as exc:
            call.error = f"stream cut: {type(exc).__name__}: {exc}"
            upstream.close()
            if not recorded:
                self._record(assembler.finish(), route, parent, status=upstream.status)
            _cut(request)  # the agent sees a broken stream, not one that looks complete
            return response
        if not recorded:  # a stream without [DONE]
            self._record(assembler.finish(), route, parent, status=upstream.status)
        return response

    def _record(self, call: CapturedCall, route: _Route, parent: Context, *, status: int) -> None:
        call.status = status
        call.end_ns = time.time_ns()
        route.calls.append(call)
        record_span(route.tracer, call, parent, server=_server(call.upstream or route.upstream))


# What AL 0.3's ProxyLLM.get_base_url puts after the proxy address's token: /rollout/<id>/attempt/<id>.
_ATTEMPT_PATH = re.compile(r"^/rollout/.+/attempt/[^/]+(?=/|$)")


@functools.lru_cache(maxsize=256)
def _server(url: str) -> tuple[str, int]:
    """The ``server.address`` and ``server.port`` of an upstream URL (a handful per process: parsed once each)."""
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("retry-after")  # names come lower-cased
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the backoff decides


def _parent(request: Request, default: Context) -> Context:
    # An agent whose HTTP client is instrumented sends a traceparent: put the call under that span when it
    # belongs to this attempt's trace, so it nests under the agent span that made it.
    if "traceparent" not in request.headers:
        return default
    extracted = TraceContextTextMapPropagator().extract(carrier=request.headers)
    sent = trace.get_current_span(extracted).get_span_context()
    own = trace.get_current_span(default).get_span_context()
    return extracted if sent.is_valid and sent.trace_id == own.trace_id else default


def _with_fields(raw: bytes, body: dict[str, Any], extra: dict[str, Any]) -> bytes:
    """The request body with ``extra`` fields set: spliced in rather than re-encoding a long conversation, unless
    one of them overwrites a field the body has (a JSON object with a key twice is read differently by different
    parsers)."""
    if not extra:
        return raw
    if not body or any(k in body for k in extra):
        return codec.dumps({**body, **extra})
    start = raw.index(b"{") + 1
    return raw[:start] + codec.dumps(extra)[1:-1] + b"," + raw[start:]


def _response_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() not in _DROP_RESPONSE]


def _bad_gateway(exc: BaseException, status: int = 502) -> Response:
    what = "got no answer in time from" if status == 504 else "could not reach"
    return json_response(
        {"error": {"message": f"rollq capture proxy {what} the LLM backend: {exc!r}", "type": "bad_gateway"}},
        status=status,
    )


def _cut(request: Request) -> None:
    """Drop the client's connection mid-response, so that a backend's cut is a cut the client sees too (a
    response ended cleanly would look complete)."""
    request.abort()
