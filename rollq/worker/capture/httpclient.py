"""The capturing proxy's HTTP/1.1 client to its backends: httptools' response parser under an asyncio protocol of
rollq's own (why not aiohttp's client: :mod:`.httpserver`'s docstring; pinned by ``tests/worker/test_capture_http.py``).

The client (:class:`Client`), as the proxy used aiohttp's: pooled keep-alive connections per scheme, host and
port (idle ones taken for up to 15 s, aiohttp's default), ``http`` and ``https`` (the default TLS context),
``connect_timeout`` and ``read_timeout`` (no byte for that long) as :class:`ReadTimeout` (a ``TimeoutError``),
no connection as :class:`ConnectError`, a cut or non-HTTP answer as :class:`Disconnected` (all
:class:`ClientError`); answers sized, chunked or up to the close, read whole (:meth:`ClientResponse.read`) or as
they arrive (:meth:`ClientResponse.iter_any`); a request whose pooled connection turns out closed before any byte
of its answer is sent again on a new connection. No redirects, cookies, proxies from the environment or
decompression (the proxy asks for none: it drops the agent's ``Accept-Encoding``).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

import httptools

log = logging.getLogger(__name__)


class ClientError(Exception):
    """An upstream request that failed: no connection, a broken or unreadable answer, or silence."""


class ConnectError(ClientError):
    """No connection to the upstream."""


class Disconnected(ClientError):
    """The upstream closed the connection before its answer was whole (or answered what is not HTTP)."""


class ReadTimeout(ClientError, TimeoutError):
    """No byte from the upstream for the client's ``read_timeout`` (or no connection in ``connect_timeout``)."""


class ClientResponse:
    """An upstream's answer as it arrives: ``status``, ``headers`` (names lower-cased, a repeated name's last
    value), ``header_list`` (as sent), the body through :meth:`read` or :meth:`iter_any`; :meth:`release` hands the
    connection back to the pool when the answer was read whole, :meth:`close` drops it."""

    __slots__ = (
        "status",
        "headers",
        "header_list",
        "_connection",
        "_chunks",
        "_head_done",
        "_complete",
        "_keep_alive",
        "_error",
        "_waiter",
        "_got_bytes",
        "_head_only",
        "_released",
        "_interim",
    )

    def __init__(self, connection: _Upstream, head_only: bool) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.header_list: list[tuple[str, str]] = []
        self._connection = connection
        self._chunks: list[bytes] = []
        self._head_done = False
        self._complete = False
        self._keep_alive = False
        self._error: ClientError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._got_bytes = False
        self._head_only = head_only
        self._released = False
        self._interim = False

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "application/octet-stream").split(";", 1)[0].strip().lower()

    @property
    def content(self) -> ClientResponse:
        return self

    # httptools' callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        text = name.decode("latin-1")
        decoded = value.decode("utf-8", "surrogateescape")
        self.header_list.append((text, decoded))
        self.headers[text.lower()] = decoded

    def on_headers_complete(self) -> None:
        parser = self._connection.parser
        status = parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # an interim answer (100 Continue, 103): the real one follows
            self.headers.clear()
            self.header_list.clear()
            self._interim = True
            return
        self.status = status
        self._keep_alive = parser.should_keep_alive()  # here: once the message is complete it says False
        self._head_done = True
        if self._head_only or status in (101, 204, 304):
            self._complete = True
            self._keep_alive = False  # the parser would wait for a body a HEAD answer does not have: not reused
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._wake()

    def on_message_complete(self) -> None:
        if self._interim:  # the end of an interim answer, not of the real one
            self._interim = False
            return
        self._complete = True
        self._wake()

    def _lost(self) -> None:
        """The connection closed: the end of a body delimited by the close, else a cut."""
        if self._complete:
            return
        headers = self.headers
        delimited = "content-length" in headers or "chunked" in headers.get("transfer-encoding", "")
        if self._head_done and not delimited:
            self._complete = True  # read up to the close, as HTTP/1.0 answers are
        else:
            self._error = Disconnected("the server closed the connection before its answer was whole")
        self._wake()

    def _fail(self, error: ClientError) -> None:
        if not self._complete:
            self._error = error
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        connection = self._connection
        loop = connection.loop
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(connection.read_timeout, self._timed_out, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _timed_out(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            waiter.set_exception(ReadTimeout(f"no byte from the server in {self._connection.read_timeout:g}s"))

    async def _head(self) -> None:
        while not self._head_done:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def read(self) -> bytes:
        while not self._complete:
            if self._error is not None:
                raise self._error
            await self._wait()
        chunks = self._chunks
        self._chunks = []
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def iter_any(self) -> Any:
        """The body in pieces as they arrive (those that arrived together, joined)."""
        while True:
            if self._chunks:
                chunks = self._chunks
                self._chunks = []
                yield chunks[0] if len(chunks) == 1 else b"".join(chunks)
            elif self._complete:
                return
            elif self._error is not None:
                raise self._error
            else:
                await self._wait()

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        connection = self._connection
        if self._complete and self._keep_alive and not self._chunks and not connection.closed:
            connection.idle()
        else:
            connection.close()

    def close(self) -> None:
        self._released = True
        self._connection.close()


class _Upstream(asyncio.Protocol):
    """One connection to an upstream: one request at a time, back to its pool's idle list between them."""

    def __init__(self, pool: list[_Upstream], client: Client) -> None:
        self.pool = pool
        self.loop = client.loop
        self.read_timeout = client.read_timeout
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.parser: Any = None
        self.response: ClientResponse | None = None
        self.closed = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass

    def start(self, response: ClientResponse) -> None:
        self.response = response
        self.parser = httptools.HttpResponseParser(response)

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:  # nothing asked: not HTTP we can pair with a request
            self.close()
            return
        response._got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            response._fail(Disconnected(f"the server's answer is not HTTP: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.response is not None:
            self.response._lost()
        elif self in self.pool:
            self.pool.remove(self)

    def idle(self) -> None:
        self.response = None
        self.parser = None
        self.idle_since = self.loop.time()
        self.pool.append(self)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()
        if self.response is None and self in self.pool:
            self.pool.remove(self)


class _RequestContext:
    def __init__(self, client: Client, args: tuple[Any, ...]) -> None:
        self._client = client
        self._args = args
        self._response: ClientResponse | None = None

    async def __aenter__(self) -> ClientResponse:
        self._response = await self._client._send(*self._args)
        return self._response

    async def __aexit__(self, *exc: object) -> None:
        if self._response is not None:
            self._response.release()


_IDLE_SECONDS = 15.0
"""How long a pooled upstream connection may sit unused and still be taken (aiohttp's connector's default)."""


class Client:
    """HTTP/1.1 requests to the proxy's upstreams over pooled keep-alive connections (httptools' response parser);
    ``http`` and ``https`` URLs. A request whose pooled connection turns out closed before any byte of the answer
    is sent again on a new one (the upstream closed it while it was idle)."""

    def __init__(self, *, connect_timeout: float, read_timeout: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._pools: dict[tuple[str, str, int], list[_Upstream]] = {}
        self._tls: Any = None

    def request(
        self, method: str, url: str, data: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> _RequestContext:
        return _RequestContext(self, (method, url, data, headers))

    async def post(self, url: str, data: bytes, headers: Mapping[str, str] | None = None) -> ClientResponse:
        return await self._send("POST", url, data, headers)

    async def _send(
        self, method: str, url: str, data: bytes | None, headers: Mapping[str, str] | None
    ) -> ClientResponse:
        key, netloc, target, credentials = _target(url)
        head = [f"{method} {target} HTTP/1.1\r\nHost: {netloc}\r\n"]
        for name, value in (headers or {}).items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"a header with a line break: {name!r}")
            if credentials and name.lower() == "authorization":
                credentials = None  # the request's own header wins over the URL's user and password
            head.append(f"{name}: {value}\r\n")
        if credentials:
            head.append(f"Authorization: {credentials}\r\n")
        if data is not None or method in ("POST", "PUT", "PATCH"):
            head.append(f"Content-Length: {len(data or b'')}\r\n")
        head.append("\r\n")
        message = "".join(head).encode("utf-8", "surrogateescape") + (data or b"")
        pool = self._pools.setdefault(key, [])
        while True:
            connection = self._idle(pool)
            reused = connection is not None
            if connection is None:
                connection = await self._connect(key, pool)
            response = ClientResponse(connection, method == "HEAD")
            connection.start(response)
            connection.transport.write(message)
            try:
                await response._head()
            except Disconnected:
                if reused and not response._got_bytes:
                    continue  # closed by the upstream while idle: a new connection
                connection.close()
                raise
            except BaseException:
                connection.close()
                raise
            return response

    def _idle(self, pool: list[_Upstream]) -> _Upstream | None:
        oldest = self.loop.time() - _IDLE_SECONDS
        while pool:
            connection = pool.pop()
            if not connection.closed and connection.idle_since >= oldest:
                return connection
            connection.close()
        return None

    async def _connect(self, key: tuple[str, str, int], pool: list[_Upstream]) -> _Upstream:
        scheme, host, port = key
        tls: Any = None
        if scheme == "https":
            if self._tls is None:
                import ssl

                self._tls = ssl.create_default_context()
            tls = self._tls
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, connection = await self.loop.create_connection(
                    lambda: _Upstream(pool, self), host, port, ssl=tls, server_hostname=host if tls else None
                )
        except TimeoutError:
            raise ReadTimeout(f"no connection to {host}:{port} in {self.connect_timeout:g}s") from None
        except OSError as exc:
            raise ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        return connection

    async def close(self) -> None:
        for pool in self._pools.values():
            for connection in list(pool):
                connection.close()
            pool.clear()


@functools.lru_cache(maxsize=1024)
def _target(url: str) -> tuple[tuple[str, str, int], str, str, str | None]:
    """``url``'s pool key (scheme, host, port), its ``Host`` header, its request target (path and query) and, for a
    URL with a user (``https://user:password@host/...``), the value of a Basic ``Authorization`` header, as
    aiohttp's client sent for such a URL."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise ConnectError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if scheme == "https" else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    credentials = None
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        credentials = "Basic " + base64.b64encode(pair).decode("ascii")
    return (scheme, parts.hostname, port), parts.netloc.rsplit("@", 1)[-1], target, credentials
