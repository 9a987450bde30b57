"""The capturing proxy's HTTP/1.1 server: httptools' parser (C, llhttp) under an asyncio protocol of rollq's own.

The proxy needs little of a web framework or an HTTP client library: one handler, the path and headers of a
request, its body (``Content-Length`` or chunked), an answer whole or streamed as it arrives; upstream, one request
at a time per pooled connection and its answer whole or as it arrives. aiohttp did both at about twice the CPU per
call (``bench/proxy_floor.py``: its server ~0.1 ms more than the :class:`Server` here, its client ~0.35 ms more than
bare protocols); uvicorn's httptools protocol serving an ASGI callable saved only a third of the server's part
(its ASGI messages, cycle objects and per-header checks cost the rest). So the parsing is httptools' and the rest
is this module and :mod:`.httpclient`: everything rollq uses of httptools is in the two (``HttpRequestParser``
and ``HttpResponseParser``'s callbacks, ``parse_url``, ``should_keep_alive`` (read with the head: at the message's
end it says False), ``get_method``, ``get_http_version``, ``get_status_code``,
``HttpParserError``/``HttpParserUpgrade``), pinned by ``tests/worker/test_capture_http.py``.

The server (:class:`Server`), as aiohttp's low-level server did for the proxy:

- keep-alive (HTTP/1.1's default; HTTP/1.0 and ``Connection: close`` close after the answer), an idle
  connection closed after :data:`KEEP_ALIVE_SECONDS`; pipelined requests answered in order;
- request bodies read whole by :meth:`Request.read`, chunked or not, refused with 413 past ``max_body_bytes``;
- the handler runs as a task per request and is cancelled when its client disconnects (aiohttp's
  ``handler_cancellation``), so that a call given up on closes its backend request;
- answers with a ``Content-Length`` (:class:`Response`) or streamed in chunks (:class:`StreamResponse`:
  :meth:`~StreamResponse.prepare`, :meth:`~StreamResponse.write` waits while the client's socket buffer is
  full, :meth:`~StreamResponse.write_eof`); :meth:`Request.abort` drops the connection mid-answer;
- a handler that fails answers 500 (or drops the connection, when its answer had begun), logged.

No TLS, no upgrades, no ``Expect: 100-continue`` (as the proxy had with aiohttp's low-level server).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from http import HTTPStatus
from typing import Any, TypeAlias

import httptools

from . import codec

log = logging.getLogger(__name__)

KEEP_ALIVE_SECONDS = 75.0
"""How long an idle keep-alive connection stays open (aiohttp's default)."""

Headers: TypeAlias = Mapping[str, str] | Iterable[tuple[str, str]]


def _status_line(status: int) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    return f"HTTP/1.1 {status} {reason}\r\n".encode("latin-1")


_STATUS_LINES = {status.value: _status_line(status.value) for status in HTTPStatus}


class RequestTooLarge(Exception):
    """:meth:`Request.read` of a body past the server's ``max_body_bytes``."""


class _Disconnected(Exception):
    pass


class Request:
    """One request: ``method``, ``path`` (percent-decoded), ``query_string``, ``headers`` (names lower-cased,
    a repeated name's last value), its body through :meth:`read`."""

    __slots__ = (
        "method",
        "path",
        "query_string",
        "headers",
        "http_version",
        "keep_alive",
        "_connection",
        "_body",
        "_size",
        "_complete",
        "_too_large",
        "_waiter",
        "_answered",
        "_started",
    )

    def __init__(
        self,
        connection: _Connection,
        method: str,
        path: str,
        query_string: str,
        headers: dict[str, str],
        http_version: str,
        keep_alive: bool,
    ) -> None:
        self.method = method
        self.path = path
        self.query_string = query_string
        self.headers = headers
        self.http_version = http_version
        self.keep_alive = keep_alive
        self._connection = connection
        self._body: list[bytes] = []
        self._size = 0
        self._complete = False
        self._too_large = False
        self._waiter: asyncio.Future[None] | None = None
        self._answered = False  # the whole answer is written
        self._started = False  # the answer's head is written

    @classmethod
    def whole(
        cls,
        connection: _Connection,
        method: str,
        path: str,
        query_string: str,
        headers: dict[str, str],
        body: bytes,
        http_version: str = "1.1",
        keep_alive: bool = True,
    ) -> Request:
        """A request whose body is all here, on ``connection`` (or what stands for one: see :mod:`.in_memory`)."""
        request = cls(connection, method, path, query_string, headers, http_version, keep_alive)
        request._feed(body)
        request._complete = True
        return request

    # -- the body ----------------------------------------------------------------------------------------------
    def _feed(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self._connection.max_body_bytes:
            self._too_large = True
            self._body.clear()  # the rest is read and dropped: the answer is 413
        elif not self._too_large:
            self._body.append(data)

    def _end(self) -> None:
        self._complete = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def read(self) -> bytes:
        """The whole body (b"" for none); :class:`RequestTooLarge` past the server's limit."""
        while not self._complete:
            if self._connection.closed:
                raise _Disconnected
            self._waiter = self._connection.loop.create_future()
            await self._waiter
            self._waiter = None
        if self._too_large:
            raise RequestTooLarge
        body = self._body
        return body[0] if len(body) == 1 else b"".join(body)

    def abort(self) -> None:
        """Drop the client's connection now (a cut the client sees as one)."""
        self._connection.abort()


class Response:
    """A whole answer, sent with its ``Content-Length``."""

    __slots__ = ("status", "body", "headers")

    def __init__(self, body: bytes = b"", status: int = 200, headers: Headers | None = None) -> None:
        self.body = body
        self.status = status
        self.headers = headers


def json_response(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(codec.dumps(data), status, {"Content-Type": "application/json; charset=utf-8", **(headers or {})})


def failure_answer(request: Request) -> Response | None:
    """What a request whose handler raised gets, called in the ``except``: the failure logged, then a 500, or None
    when the answer had begun (the connection is cut instead)."""
    log.exception("the capture proxy failed on %s %s", request.method, request.path)
    if request._started:
        return None
    return Response(b"Internal Server Error", 500, {"Content-Type": "text/plain; charset=utf-8"})


class StreamResponse:
    """An answer sent as it is written: chunked (HTTP/1.1), or up to the connection's close (HTTP/1.0)."""

    __slots__ = ("status", "headers", "_request", "_chunked")

    def __init__(self, status: int = 200, headers: Headers | None = None) -> None:
        self.status = status
        self.headers = headers
        self._request: Request | None = None
        self._chunked = True

    async def prepare(self, request: Request) -> None:
        self._request = request
        self._chunked = request.http_version == "1.1" and request.method != "HEAD"
        if not self._chunked:
            request.keep_alive = False
        request._connection.write_head(request, self.status, self.headers, None if self._chunked else -1)

    async def write(self, data: bytes) -> None:
        request = self._request
        assert request is not None, "write before prepare"
        if not data or request.method == "HEAD":
            return
        connection = request._connection
        if connection.closed:
            raise ConnectionResetError("the client has gone")
        connection.transport.write(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data)
        if connection.write_paused:
            await connection.drain()

    async def write_eof(self) -> None:
        request = self._request
        assert request is not None, "write_eof before prepare"
        connection = request._connection
        if self._chunked and not connection.closed:
            connection.transport.write(b"0\r\n\r\n")
        connection.answered(request)


Answer: TypeAlias = Response | StreamResponse
Handler: TypeAlias = Callable[[Request], Awaitable[Answer]]


class _Connection(asyncio.Protocol):
    """One client connection: parses its requests, runs the handler for each in turn, writes the answers."""

    def __init__(self, server: Server) -> None:
        self.handler = server.handler
        self.max_body_bytes = server.max_body_bytes
        self.server = server
        self.loop = server.loop
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.closed = False
        self.write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._url = b""
        self._headers: dict[str, str] = {}
        self._parsing: Request | None = None  # the request whose body is being read
        self._current: Request | None = None  # the request being answered
        self._task: asyncio.Task[None] | None = None
        self._queue: deque[Request] = deque()  # pipelined, waiting for the one being answered
        self._idle: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass
        self.server.connections.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # pragma: no cover - not TCP
                pass
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, b"upgrades are not served here")
        except httptools.HttpParserError as exc:
            self._refuse(400, f"bad request: {exc}".encode(errors="replace"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        if self._idle is not None:
            self._idle.cancel()
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(ConnectionResetError("the client has gone"))
            self._drained.exception()  # retrieved: a writer that is not waiting must not log it
        for request in (self._parsing, self._current):
            if request is not None:
                request._wake()
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the client gave up on this call: its backend request ends with it
        self._queue.clear()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def drain(self) -> None:
        if self.write_paused and not self.closed:
            self._drained = self.loop.create_future()
            await self._drained

    # -- httptools' parser callbacks ---------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("utf-8", "surrogateescape")

    def on_headers_complete(self) -> None:
        parser = self.parser
        url = httptools.parse_url(self._url)
        raw_path = url.path.decode("utf-8", "surrogateescape")
        path = _unquote(raw_path) if "%" in raw_path else raw_path
        version = parser.get_http_version()
        request = Request(
            self,
            parser.get_method().decode("ascii"),
            path,
            url.query.decode("utf-8", "surrogateescape") if url.query else "",
            self._headers,
            version,
            version == "1.1" and parser.should_keep_alive(),
        )
        self._parsing = request
        if self._current is None:
            self._start(request)
        else:
            self._queue.append(request)

    def on_body(self, body: bytes) -> None:
        if self._parsing is not None:
            self._parsing._feed(body)

    def on_message_complete(self) -> None:
        request = self._parsing
        self._parsing = None
        if request is not None:
            request._end()
            if request._answered and request is self._current:
                self._next()

    # -- answering -----------------------------------------------------------------------------------------------
    def _start(self, request: Request) -> None:
        self._current = request
        self._task = self.loop.create_task(self._run(request))

    async def _run(self, request: Request) -> None:
        try:
            response = await self.handler(request)
        except asyncio.CancelledError:
            if not self.closed:  # cancelled for another reason than its client's going: the connection goes
                self.abort()
            raise
        except RequestTooLarge:
            request.keep_alive = False
            response = Response(b"Request Entity Too Large", 413, {"Content-Type": "text/plain; charset=utf-8"})
        except _Disconnected:
            return
        except Exception:
            failed = failure_answer(request)
            if failed is None:
                self.abort()
                return
            request.keep_alive = False
            response = failed
        if self.closed or request._answered:
            return
        try:
            if isinstance(response, StreamResponse):
                if not request._started:
                    await response.prepare(request)
                await response.write_eof()
                return
            body = b"" if request.method == "HEAD" else response.body
            self.write_head(request, response.status, response.headers, len(response.body), body)
        except Exception:  # a header that cannot be sent (a line break in it): the connection goes
            log.exception("the capture proxy could not answer %s %s", request.method, request.path)
            self.abort()
            return
        self.answered(request)

    def write_head(
        self, request: Request, status: int, headers: Headers | None, length: int | None, body: bytes = b""
    ) -> None:
        """The status line and headers (``length``: a Content-Length; None: chunked; -1: up to the close)."""
        request._started = True
        head = [_STATUS_LINES.get(status) or _status_line(status)]
        if headers:
            items = headers.items() if isinstance(headers, Mapping) else headers
            for name, value in items:
                if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                    raise ValueError(f"a header with a line break: {name!r}")
                head.append(f"{name}: {value}\r\n".encode("utf-8", "surrogateescape"))
        if length is None:
            head.append(b"Transfer-Encoding: chunked\r\n")
        elif length >= 0:
            head.append(b"Content-Length: %d\r\n" % length)
        if not request.keep_alive:
            head.append(b"Connection: close\r\n")
        head.append(b"\r\n")
        if body:
            head.append(body)
        if not self.closed:
            self.transport.write(b"".join(head))

    def answered(self, request: Request) -> None:
        """``request``'s answer is written: close, or go on with the next request once its body is read."""
        request._answered = True
        if self.closed:
            return
        if not request.keep_alive:
            self.transport.close()
            self.closed = True
            return
        if request._complete:
            self._next()
        # else: the rest of the body is read (and dropped) first; on_message_complete goes on

    def _next(self) -> None:
        self._current = None
        self._task = None
        if self._queue:
            self._start(self._queue.popleft())
        else:
            self._arm_idle()

    def _arm_idle(self) -> None:
        self._idle = self.loop.call_later(KEEP_ALIVE_SECONDS, self._close_idle)

    def _close_idle(self) -> None:
        self._idle = None
        if self._current is None and not self.closed:
            self.transport.close()

    def _refuse(self, status: int, message: bytes) -> None:
        if not self.closed:
            if self._current is None or not self._current._started:
                head = b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(message)
                self.transport.write(_STATUS_LINES[status] + head + message)
            self.transport.close()
            self.closed = True

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.abort()


def _unquote(path: str) -> str:
    from urllib.parse import unquote

    return unquote(path)


class Server:
    """Serves ``handler`` on a bound socket, in the running loop."""

    def __init__(self, handler: Handler, *, max_body_bytes: int) -> None:
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.loop = asyncio.get_running_loop()
        self.connections: set[_Connection] = set()
        self._server: asyncio.AbstractServer | None = None

    async def start(self, sock: socket.socket) -> None:
        self._server = await self.loop.create_server(lambda: _Connection(self), sock=sock)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.abort()
        if self._server is not None:
            await self._server.wait_closed()
