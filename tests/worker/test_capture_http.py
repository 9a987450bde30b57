"""The capture proxy's HTTP server and client (rollq.worker.capture.httpserver, .httpclient): what they use of
httptools, and what they do on the wire (keep-alive, pipelining, chunked bodies, limits, failures, disconnects, the
pool, TLS, a URL's credentials), as aiohttp's server and client did."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httptools
import httpx
import pytest

from rollq.worker.capture import CaptureProxy
from rollq.worker.capture.httpserver import Request, Response, Server, StreamResponse, json_response
from tests.support.capture import MESSAGES, open_attempt
from tests.support.fake_vllm import FakeVLLM


class _Recorder:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def on_message_begin(self) -> None:
        self.events.append("begin")

    def on_url(self, url: bytes) -> None:
        self.events.append(("url", url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.events.append(("header", name, value))

    def on_headers_complete(self) -> None:
        self.events.append("headers")

    def on_body(self, body: bytes) -> None:
        self.events.append(("body", body))

    def on_message_complete(self) -> None:
        self.events.append("complete")


def test_httptools_parses_requests_as_the_proxys_server_reads_them() -> None:
    # What httpserver relies on: one on_header call per whole header even when it arrives split across reads,
    # chunked bodies decoded, the method, version and keep-alive, parse_url's path and query, and its errors.
    recorder = _Recorder()
    parser = httptools.HttpRequestParser(recorder)
    wire = (
        b"POST /tok/v1/chat/completions?a=1 HTTP/1.1\r\nHost: x\r\nX-Rollq-Attempt: abc\r\n"
        b'Transfer-Encoding: chunked\r\n\r\n3\r\n{"a\r\n5\r\n": 1}\r\n0\r\n\r\n'
    )
    for i in range(0, len(wire), 7):
        parser.feed_data(wire[i : i + 7])
    headers = [e for e in recorder.events if isinstance(e, tuple) and e[0] == "header"]
    assert headers == [
        ("header", b"Host", b"x"),
        ("header", b"X-Rollq-Attempt", b"abc"),
        ("header", b"Transfer-Encoding", b"chunked"),
    ]
    url = b"".join(e[1] for e in recorder.events if isinstance(e, tuple) and e[0] == "url")
    assert b"".join(e[1] for e in recorder.events if isinstance(e, tuple) and e[0] == "body") == b'{"a": 1}'
    assert recorder.events[0] == "begin" and recorder.events[-1] == "complete"
    assert parser.get_method() == b"POST" and parser.get_http_version() == "1.1" and parser.should_keep_alive()
    parsed = httptools.parse_url(url)
    assert (parsed.path, parsed.query) == (b"/tok/v1/chat/completions", b"a=1")
    assert httptools.parse_url(b"/p").query is None
    parser = httptools.HttpRequestParser(_Recorder())
    parser.feed_data(b"GET / HTTP/1.0\r\n\r\n")
    assert parser.get_http_version() == "1.0" and not parser.should_keep_alive()
    with pytest.raises(httptools.HttpParserError):
        httptools.HttpRequestParser(_Recorder()).feed_data(b"NOT HTTP\x00\r\n\r\n")
    with pytest.raises(httptools.HttpParserUpgrade):
        httptools.HttpRequestParser(_Recorder()).feed_data(
            b"GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
        )
    assert issubclass(httptools.HttpParserUpgrade, Exception)


class _Served:
    """An httpserver.Server on a loop of its own, answering by the path: /echo (the body and headers back),
    /stream (three pieces), /fail (raises), /hang (until cancelled; counted in ``cancelled``)."""

    def __init__(self) -> None:
        self.cancelled = 0
        self.loop = asyncio.new_event_loop()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)

            async def start() -> None:
                self.server = Server(self.handle, max_body_bytes=1000)
                await self.server.start(sock)

            self.loop.run_until_complete(start())
            ready.set()
            self.loop.run_forever()

        threading.Thread(target=serve, daemon=True).start()
        ready.wait(10)

    async def handle(self, request: Request) -> Response | StreamResponse:
        if request.path == "/echo":
            body = await request.read()
            return json_response({"body": body.decode(), "headers": request.headers, "query": request.query_string})
        if request.path == "/stream":
            response = StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for piece in (b"a", b"bb", b"ccc"):
                await response.write(piece)
                await asyncio.sleep(0.01)
            await response.write_eof()
            return response
        if request.path == "/hang":
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        raise RuntimeError("the handler failed")

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture(scope="module")
def served() -> Iterator[_Served]:
    server = _Served()
    yield server
    server.stop()


def _read_answers(sock: socket.socket, count: int) -> list[bytes]:
    """``count`` whole answers with a Content-Length, read off ``sock``."""
    buffer = b""
    answers: list[bytes] = []
    while len(answers) < count:
        data = sock.recv(65536)
        assert data, f"closed after {len(answers)} answers"
        buffer += data
        while b"\r\n\r\n" in buffer:
            head, rest = buffer.split(b"\r\n\r\n", 1)
            length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:"))[15:])
            if len(rest) < length:
                break
            answers.append(head + b"\r\n\r\n" + rest[:length])
            buffer = rest[length:]
    return answers


def test_pipelined_requests_on_one_kept_alive_connection_are_answered_in_order_and_close_closes(
    served: _Served,
) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
        request = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b"
        sock.sendall(request % (5, b"first") + request % (6, b"second"))
        first, second = _read_answers(sock, 2)
        assert b'"body":"first"' in first.replace(b" ", b"") and b'"body":"second"' in second.replace(b" ", b"")
        assert b"Connection: close" not in first + second
        sock.sendall(b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        [last] = _read_answers(sock, 1)
        assert b"Connection: close" in last
        assert sock.recv(100) == b""  # closed by the server after the answer


def test_a_chunked_request_body_is_read_whole_and_headers_come_lower_cased(served: _Served) -> None:
    answer = httpx.post(
        f"http://127.0.0.1:{served.port}/echo?q=1", content=iter([b"ab", b"cd"]), headers={"X-Thing": "V"}
    )
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("application/json")
    data = answer.json()
    assert data["body"] == "abcd" and data["headers"]["x-thing"] == "V" and data["query"] == "q=1"
    assert data["headers"]["transfer-encoding"] == "chunked"


def test_a_streamed_answer_arrives_chunked_and_whole(served: _Served) -> None:
    with httpx.stream("GET", f"http://127.0.0.1:{served.port}/stream") as answer:
        assert answer.headers["transfer-encoding"] == "chunked"
        assert b"".join(answer.iter_raw()) == b"abbccc"


def test_a_body_past_the_limit_is_refused_with_413_and_a_failing_handler_answers_500(served: _Served) -> None:
    assert httpx.post(f"http://127.0.0.1:{served.port}/echo", content=b"x" * 1001).status_code == 413
    assert httpx.post(f"http://127.0.0.1:{served.port}/echo", content=iter([b"x" * 600] * 2)).status_code == 413
    assert httpx.post(f"http://127.0.0.1:{served.port}/echo", content=b"x" * 1000).status_code == 200
    assert httpx.get(f"http://127.0.0.1:{served.port}/fail").status_code == 500
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
        sock.sendall(b"NOT HTTP\x00\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 400")


def test_a_client_that_disconnects_cancels_its_handler(served: _Served) -> None:
    before = served.cancelled
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
        sock.sendall(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
        asyncio.run(asyncio.sleep(0.2))
    for _ in range(50):
        if served.cancelled > before:
            break
        asyncio.run(asyncio.sleep(0.05))
    assert served.cancelled == before + 1


@pytest.fixture
def proxy() -> Iterator[CaptureProxy]:
    started = CaptureProxy().start()
    yield started
    started.stop()


def test_a_chunked_chat_request_through_the_proxy_is_forwarded_and_captured(
    proxy: CaptureProxy, fake: FakeVLLM
) -> None:
    llm, attempt, spans = open_attempt(proxy, fake.url)
    body = json.dumps({"model": "m", "messages": MESSAGES}).encode()
    answer = httpx.post(f"{llm.endpoint}/chat/completions", content=iter([body[:10], body[10:]]))
    assert answer.status_code == 200
    [call] = attempt.calls
    assert call.messages == MESSAGES and call.response_token_ids == fake.sent[call.response_id or ""].token_ids
    assert fake.received[-1]["messages"] == MESSAGES and len(spans.captured()) == 1


# -- the client side ----------------------------------------------------------------------------------------------


def test_httptools_parses_answers_as_the_proxys_client_reads_them() -> None:
    recorder = _Recorder()
    parser = httptools.HttpResponseParser(recorder)
    head = b"HTTP/1.1 429 Too Many\r\nRetry-After: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
    for i in range(0, len(head), 5):
        parser.feed_data(head[i : i + 5])
    # Read once the head is in: at the message's end should_keep_alive says False whatever the answer said.
    assert parser.get_status_code() == 429 and parser.should_keep_alive()
    parser.feed_data(b"2\r\nok\r\n0\r\n\r\n")
    assert not parser.should_keep_alive()
    assert [e for e in recorder.events if isinstance(e, tuple) and e[0] == "header"] == [
        ("header", b"Retry-After", b"2"),
        ("header", b"Transfer-Encoding", b"chunked"),
    ]
    assert b"".join(e[1] for e in recorder.events if isinstance(e, tuple) and e[0] == "body") == b"ok"
    assert recorder.events[-1] == "complete"
    parser = httptools.HttpResponseParser(_Recorder())
    parser.feed_data(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\n")
    assert not parser.should_keep_alive()
    with pytest.raises(httptools.HttpParserError):
        httptools.HttpResponseParser(_Recorder()).feed_data(b"SMTP ready\r\n\r\n")


async def _backend(answers: list[bytes], seen: list[int]) -> tuple[asyncio.AbstractServer, str]:
    """A backend that answers each request read with the next of ``answers`` (b"" closes the connection at once
    instead); ``seen`` gets each request's connection number."""
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        number = connections
        try:
            while answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(h[15:]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                seen.append(number)
                answer = answers.pop(0)
                if not answer:
                    break
                interim, _, rest = (
                    answer.partition(b"\r\n\r\n") if answer.startswith(b"HTTP/1.1 1") else (b"", b"", b"")
                )
                if interim:  # an interim answer on its own, the real one a moment later
                    writer.write(interim + b"\r\n\r\n")
                    await writer.drain()
                    await asyncio.sleep(0.05)
                    answer = rest
                writer.write(answer)
                await writer.drain()
                if b"Connection: close" in answer:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def test_the_client_reuses_connections_reads_close_delimited_answers_and_replaces_closed_ones() -> None:
    from rollq.worker.capture.httpclient import Client, ConnectError, Disconnected, ReadTimeout

    async def main() -> None:
        # The first answer comes after an interim 100 Continue, which is skipped (as aiohttp's client skips it).
        ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: 1\r\nX-A: 2\r\n\r\nok"
        first = b"HTTP/1.1 100 Continue\r\n\r\n" + ok
        until_close = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nall of it"
        seen: list[int] = []
        server, url = await _backend([first, ok, until_close, ok, b""], seen)
        client = Client(connect_timeout=5, read_timeout=5)
        for _ in range(2):
            answer = await client.post(url + "/v1/x?q=1", b"{}", {"content-type": "application/json"})
            assert (answer.status, await answer.read()) == (200, b"ok")
            assert answer.header_list[-2:] == [("X-A", "1"), ("X-A", "2")] and answer.headers["x-a"] == "2"
            answer.release()
        assert seen == [1, 1]  # one kept-alive connection
        async with client.request("GET", url + "/") as answer:
            assert answer.content_type == "text/plain"
            assert b"".join([piece async for piece in answer.content.iter_any()]) == b"all of it"
        await asyncio.sleep(0.05)  # the backend closed that connection: the next request goes on a new one
        answer = await client.post(url + "/", b"")
        assert await answer.read() == b"ok" and seen == [1, 1, 1, 2]
        answer.release()
        with pytest.raises(Disconnected):  # closed with no answer on a new connection's request
            await (await client.post(url + "/", b"x")).read()
        server.close()
        await server.wait_closed()
        with pytest.raises(ConnectError):
            await client.post(url + "/", b"")

        # Half an answer, then silence (the backend waits for a next request).
        hung, hung_url = await _backend([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\npart", b"never"], [])
        slow = Client(connect_timeout=5, read_timeout=0.2)
        answer = await slow.post(hung_url + "/", b"")
        with pytest.raises(ReadTimeout):
            await answer.read()
        assert isinstance(ReadTimeout("x"), TimeoutError)
        answer.close()
        await slow.close()
        await client.close()
        hung.close()

    asyncio.run(main())


def test_the_client_sends_a_urls_user_and_password_as_basic_auth_unless_the_request_has_its_own() -> None:
    # aiohttp's client sent an endpoint's `https://user:password@host/v1` credentials as Basic auth: an LLM
    # endpoint configured that way keeps working through the proxy.
    from rollq.worker.capture.httpclient import Client

    async def main() -> None:
        heads: list[bytes] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                heads.append(head.lower())
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = Client(connect_timeout=5, read_timeout=5)
        answer = await client.post(f"http://us%40er:p%3Ass@127.0.0.1:{port}/v1", b"{}")
        assert await answer.read() == b"ok"
        answer.release()
        answer = await client.post(f"http://user:pw@127.0.0.1:{port}/v1", b"{}", {"Authorization": "Bearer k"})
        assert await answer.read() == b"ok"
        answer.release()
        await client.close()
        server.close()
        await server.wait_closed()
        # base64("us@er:p:ss"); the Host header carries no credentials
        assert b"authorization: basic dxnazxi6cdpzcw==\r\n" in heads[0], heads[0]
        assert f"host: 127.0.0.1:{port}\r\n".encode() in heads[0]
        assert heads[1].count(b"authorization:") == 1 and b"authorization: bearer k" in heads[1]

    asyncio.run(main())


def test_the_client_talks_https_to_a_backend_whose_certificate_the_default_context_trusts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real TLS backend (a self-signed certificate for 127.0.0.1, trusted through SSL_CERT_FILE, which the default
    # TLS context the client uses reads): kept-alive connections, and one it does not trust refused as no connection.
    from rollq.worker.capture.httpclient import Client, ConnectError

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    served.load_cert_chain(cert, key)

    async def main(trusted: bool) -> None:
        connections = 0

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = next(
                        (int(h[15:]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")), 0
                    )
                    body = await reader.readexactly(length)
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
                pass
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=served)
        url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"
        client = Client(connect_timeout=5, read_timeout=5)
        try:
            if not trusted:
                with pytest.raises(ConnectError):
                    await client.post(url, b"{}")
                return
            for body in (b'{"a": 1}', b'{"b": 2}'):
                answer = await client.post(url, body, {"content-type": "application/json"})
                assert (answer.status, await answer.read()) == (200, body)
                answer.release()
            assert connections == 1
        finally:
            await client.close()
            server.close()

    asyncio.run(main(trusted=False))
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    asyncio.run(main(trusted=True))
