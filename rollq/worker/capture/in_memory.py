"""An agent's async httpx call to this process's capturing proxy, handed to the proxy in memory.

An agent in a worker calls its LLM at the proxy's address (the endpoint of the LLM resource it was given). Over
a socket, that call is HTTP written and parsed four times within one process: by the agent's client (the
``openai`` SDK's async client is an ``httpx2`` one; httpcore's h11 under it), by the proxy's server, and again on
the way back. Handed over in memory, the request goes to the proxy's handler as a :class:`~.httpserver.Request`
and its answer comes back as the client's response object: the same route, gate, weight-sync pause, record and
answer, without the sockets. ``bench/agent_calls.py`` measures what it saves, in workers.

Only calls that would reach the proxy's own handler anyway are handed over: an async transport's request to a
running proxy's ``http://host:port``, with a body within the proxy's ``max_body_bytes``. Sync clients, other HTTP
libraries, other addresses and anything larger go over the socket as before (``ROLLQ_CAPTURE_IN_MEMORY=0``: all
of them). A call made on the agents' loop is served there, as a task of that loop, whether the proxy serves its
socket on that loop too (``ROLLQ_CAPTURE_ON_AGENT_LOOP=1``) or on a thread of its own (the proxy's ``agents_loop``,
while that loop is not busy; ``ROLLQ_CAPTURE_IN_MEMORY_ON_AGENT_LOOP=0`` sends those to the proxy's thread too). A
call from another loop is served on the proxy's thread, and what the handler writes is passed back to the caller's
loop.

What the socket gave the agent's client, the hand-over gives too: a streamed answer arrives as it is written;
the proxy's cut of a stream (the backend's cut) is ``RemoteProtocolError``, as a dropped connection is; the
client's ``read`` timeout holds for the answer's head and each piece of it (``ReadTimeout``); a call its agent
gives up on (cancelled, or a stream closed early) cancels the handler, as a closed connection does.

httpx's internals this relies on, for each of ``httpx2`` and ``httpx`` that is installed: the async transport
class ``AsyncHTTPTransport`` and its ``handle_async_request(request) -> Response``, which this module wraps
(:func:`install`), ``Request.aread``, ``Request.extensions["timeout"]``, ``Response(status, headers=, content=
| stream=)``, ``AsyncByteStream`` and the exception classes. ``tests/worker/test_capture_in_memory.py`` pins them,
and that the ``openai`` SDK's default async client goes through that class.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote

from .httpserver import Headers, Request, Response, StreamResponse, failure_answer

if TYPE_CHECKING:
    from .proxy import CaptureProxy


LIBRARIES = ("httpx2", "httpx")
"""The HTTP client libraries whose async transport hands calls to the proxy over, where installed."""

_proxies: dict[tuple[str, int], CaptureProxy] = {}
"""The proxies calls are handed to, by the host and port they listen on."""
_originals: dict[type, Callable[..., Any]] = {}
"""Each wrapped transport class's own ``handle_async_request``."""
_lock = threading.Lock()

HIGH_WATER = 64 * 1024
"""Bytes of a streamed answer written ahead of the agent past which the proxy's handler waits (asyncio's own
transports' default); it goes on once the agent has taken all but ``LOW_WATER`` of them."""
LOW_WATER = 16 * 1024

# What a piece of the answer is, on its way to the agent's loop.
_HEAD, _WHOLE, _DATA, _END, _CUT = range(5)


def install(proxy: CaptureProxy) -> list[str]:
    """Hand calls to ``proxy``'s address over in memory from now on; returns the libraries that do it."""
    wrapped = []
    with _lock:
        _proxies[(proxy.host, proxy.port)] = proxy
        for name in LIBRARIES:
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            transport = module.AsyncHTTPTransport
            if transport not in _originals:
                _originals[transport] = transport.handle_async_request
                transport.handle_async_request = _wrapper(module, transport.handle_async_request)
            wrapped.append(name)
    return wrapped


def uninstall(proxy: CaptureProxy) -> None:
    """Calls to ``proxy``'s address go over its socket again (the transports stay wrapped: a dict lookup)."""
    with _lock:
        if _proxies.get((proxy.host, proxy.port)) is proxy:
            del _proxies[(proxy.host, proxy.port)]


def _wrapper(module: ModuleType, original: Callable[..., Any]) -> Callable[..., Any]:
    async def handle_async_request(self: Any, request: Any) -> Any:
        url = request.url
        proxy = _proxies.get((url.host, url.port)) if url.scheme == "http" else None
        if proxy is not None:
            response = await _hand_over(module, proxy, request)
            if response is not None:
                return response
        return await original(self, request)

    handle_async_request.__wrapped__ = original  # type: ignore[attr-defined]
    return handle_async_request


async def _hand_over(module: ModuleType, proxy: CaptureProxy, request: Any) -> Any:
    """``request`` answered by ``proxy``'s handler, as ``module``'s response; None to send it over the socket."""
    loop = asyncio.get_running_loop()
    serving = proxy.serving(loop)
    if serving is None:
        return None
    proxy_loop, handler = serving
    body = await request.aread()
    if len(body) > proxy.max_body_bytes:
        return None  # the server's 413, over the socket
    pieces: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
    deliver: Callable[[tuple[Any, ...]], None]
    if loop is proxy_loop:
        deliver = pieces.put_nowait
    else:

        def deliver(piece: tuple[Any, ...]) -> None:
            try:
                loop.call_soon_threadsafe(pieces.put_nowait, piece)
            except RuntimeError:  # the agent's loop is closed: nobody is waiting for the answer
                pass

    path, _, query = request.url.raw_path.decode("utf-8", "surrogateescape").partition("?")
    connection = _Connection(proxy_loop, proxy.max_body_bytes, deliver, loop is proxy_loop)
    handed = Request.whole(
        cast(Any, connection),
        request.method,
        unquote(path) if "%" in path else path,
        query,
        {
            name.decode("latin-1").lower(): value.decode("utf-8", "surrogateescape")
            for name, value in request.headers.raw
        },
        body,
        "1.0",  # an answer streamed without chunks, as over a connection that closes after it
        False,
    )
    cancel: Callable[[], Any]
    if loop is proxy_loop:
        cancel = loop.create_task(_serve(handler, handed)).cancel
    else:
        cancel = asyncio.run_coroutine_threadsafe(_serve(handler, handed), proxy_loop).cancel
    timeout = (request.extensions.get("timeout") or {}).get("read")
    try:
        piece = await _next(pieces, timeout, module, request)
    except BaseException:
        cancel()
        raise
    kind = piece[0]
    if kind == _WHOLE:
        return module.Response(piece[1], headers=_header_list(piece[2]), content=piece[3])
    if kind == _CUT:
        raise module.RemoteProtocolError("the capture proxy dropped the call", request=request)
    return module.Response(
        piece[1],
        headers=_header_list(piece[2]),
        stream=_stream_class(module)(pieces, timeout, cancel, connection.took, request),
    )


async def _next(pieces: asyncio.Queue[tuple[Any, ...]], timeout: float | None, module: ModuleType, request: Any) -> Any:
    if timeout is None:
        return await pieces.get()
    try:
        return await asyncio.wait_for(pieces.get(), timeout)
    except TimeoutError:
        raise module.ReadTimeout(f"no answer from the capture proxy in {timeout:g}s", request=request) from None


def _header_list(headers: Headers | None) -> list[tuple[str, str]]:
    if not headers:
        return []
    return list(headers.items()) if isinstance(headers, Mapping) else list(cast(Iterable[tuple[str, str]], headers))


_streams: dict[ModuleType, type] = {}


def _stream_class(module: ModuleType) -> type:
    """``module``'s ``AsyncByteStream`` of a streamed answer's pieces as the proxy writes them."""
    known = _streams.get(module)
    if known is not None:
        return known

    class _Pieces(module.AsyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(
            self,
            pieces: asyncio.Queue[Any],
            timeout: float | None,
            cancel: Callable[[], Any],
            took: Callable[[int], None],
            request: Any,
        ) -> None:
            self._pieces, self._timeout, self._cancel, self._took, self._request = (
                pieces,
                timeout,
                cancel,
                took,
                request,
            )
            self._done = False

        async def __aiter__(self) -> AsyncIterator[bytes]:
            while not self._done:
                piece = await _next(self._pieces, self._timeout, module, self._request)
                if piece[0] == _DATA:
                    self._took(len(piece[1]))
                    yield piece[1]
                    continue
                self._done = True
                if piece[0] == _CUT:
                    raise module.RemoteProtocolError("the capture proxy cut the answer", request=self._request)

        async def aclose(self) -> None:
            if not self._done:  # given up on part way: the handler (and its backend request) ends with it
                self._done = True
                self._cancel()

    _streams[module] = _Pieces
    return _Pieces


class _Connection:
    """What :class:`~.httpserver.StreamResponse` and :class:`~.httpserver.Request` use of a connection, each
    write passed to the agent's side by ``deliver``; lives on the proxy's loop.

    Flow control, as a socket's send buffer gives it: ``written`` counts the bytes sent (on the proxy's loop),
    ``taken`` those the agent's stream took (on the agent's loop; :meth:`took`). Each has one writer, and each side
    reads the other's after its own write, so that one of the two always sees the other's: the handler that
    finds more than ``HIGH_WATER`` unread waits in :meth:`drain`, and the agent that brings it down to
    ``LOW_WATER`` while the handler is paused wakes it."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        max_body_bytes: int,
        deliver: Callable[[tuple[Any, ...]], None],
        same_loop: bool,
    ) -> None:
        self.loop = loop
        self.max_body_bytes = max_body_bytes
        self.transport = self
        self.closed = False
        self.write_paused = False
        self.written = 0
        self.taken = 0
        self._deliver = deliver
        self._same_loop = same_loop
        self._drained: asyncio.Future[None] | None = None

    def write_head(
        self, request: Request, status: int, headers: Headers | None, length: int | None, body: bytes = b""
    ) -> None:
        request._started = True
        self._deliver((_HEAD, status, headers))
        if body:
            self.write(body)

    def write(self, data: bytes) -> None:
        if not self.closed and data:
            self._deliver((_DATA, bytes(data)))
            self.written += len(data)
            if self.written - self.taken > HIGH_WATER:
                self.write_paused = True

    async def drain(self) -> None:
        if not self.write_paused or self.closed:
            return
        self._drained = self.loop.create_future()
        self._resume()  # the agent took enough since the write that paused, before it could see the pause
        await self._drained

    def took(self, count: int) -> None:
        """The agent's stream took ``count`` bytes (on the agent's loop)."""
        self.taken += count
        if self.write_paused and self.written - self.taken <= LOW_WATER:
            if self._same_loop:
                self._resume()
            else:
                with contextlib.suppress(RuntimeError):  # the proxy's loop is closed: nothing waits to write
                    self.loop.call_soon_threadsafe(self._resume)

    def _resume(self) -> None:
        if self.write_paused and self.written - self.taken <= LOW_WATER:
            self.write_paused = False
            if self._drained is not None and not self._drained.done():
                self._drained.set_result(None)

    def answered(self, request: Request) -> None:
        request._answered = True
        if not self.closed:
            self.closed = True
            self._deliver((_END,))

    def whole(self, response: Response) -> None:
        if not self.closed:
            self.closed = True
            self._deliver((_WHOLE, response.status, response.headers, response.body))

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self._deliver((_CUT,))


async def _serve(handler: Callable[[Request], Any], request: Request) -> None:
    """``handler`` on ``request``, its answer written as the proxy's server writes it (httpserver's
    ``_Connection._run``): a failure before the answer began is a 500, after it a cut."""
    connection = cast(_Connection, request._connection)
    try:
        try:
            response = await handler(request)
        except Exception:
            failed = failure_answer(request)
            if failed is None:
                connection.abort()
                return
            response = failed
        if connection.closed or request._answered:
            return
        if isinstance(response, StreamResponse):
            if not request._started:
                await response.prepare(request)
            await response.write_eof()
        else:
            connection.whole(response)
    finally:
        connection.abort()  # nothing, once the answer is complete
