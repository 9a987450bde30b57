"""An embedded Redis: a fakeredis ``FakeServer`` served over TCP on loopback, so that other processes (a stock
``rq worker``, redis-cli) can use it where no real Redis is installed. fakeredis ships a TCP server, but as shipped it
stalls every pipeline ~44 ms on Nagle's algorithm, hangs up when a command crashes inside fakeredis, keeps the process
alive while clients are connected, and feeds its parser a line at a time; small subclasses fix just that.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from typing import Any

import fakeredis
import redis
from fakeredis._clients._tcp_server import TCPFakeRequestHandler, TcpFakeServer, encode_reply
from fakeredis._typing import RaiseErrorTypes

# The Redis version the fake server emulates (command set, argument checks, error texts); the same as memory:// URLs.
#
# fakeredis does not implement INFO, which is how clients read the version, so RQ never sees it: rq.utils.get_version
# catches the error and assumes 5.0.9, and its workers dequeue with BLPOP, on which fakeredis blocks properly. That is
# what we want. With a version >= 6.2 RQ would dequeue with BLMOVE, which fakeredis never blocks on (on a missing
# source key the command short-circuits to nil), so an idle worker would spin on heartbeat + BLMOVE at 100% CPU in
# both processes. The price: one failing INFO per dequeue, and RQ's intermediate-queue (BLMOVE) path goes unused.
_REDIS_VERSION = (7, 0)

# How often a connection waiting for input also checks for replies pushed to it without a request (pub/sub messages)
# and for server shutdown. Inbound commands wake it at once; only pushed replies can wait this long.
_POLL_INTERVAL_S = 0.01
_READ_SIZE = 64 * 1024


class _RequestHandler(TCPFakeRequestHandler):
    server: _TCPServer

    # StreamRequestHandler leaves Nagle's algorithm on. A client writes a pipeline, then waits for replies that the
    # kernel holds back until the peer's delayed ACK (~40 ms): ~44 ms per pipeline or MULTI/EXEC, i.e. per RQ job.
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)
        # An exception raised by a command inside fakeredis (a fakeredis bug: Redis errors are replies already) would
        # propagate out of the fake socket's parser generator and finish it, losing the commands pipelined behind it;
        # the inherited loop then answers and hangs up. Redis keeps a connection after any error reply, so the failure
        # becomes the command's error reply and the parser carries on.
        fake_socket = self.current_client.get_socket()
        process_command = fake_socket._process_command

        def process_command_or_reply_error(fields: list[bytes]) -> None:
            try:
                process_command(fields)
            except Exception as error:
                # An error reply is a single line.
                fake_socket.put_response(redis.ResponseError(" ".join(f"{type(error).__name__}: {error}".split())))

        fake_socket._process_command = process_command_or_reply_error  # type: ignore[method-assign]

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        super().finish()

    def handle(self) -> None:
        # Replaces the inherited loop, which feeds the parser one line per iteration, checking for replies after each:
        # 20-30% of the server's CPU per RQ job. This one feeds it whatever has arrived in one go, and ends only
        # on EOF, a socket error, CLIENT KILL, server shutdown, or input fakeredis cannot parse.
        client = self.current_client
        fake_socket = client.get_socket()
        while not self.server.shutdown_requested():
            try:
                while client.can_read():
                    try:
                        reply = client.read_response()
                    except RaiseErrorTypes as error:
                        reply = error
                    self.wfile.write(encode_reply(reply, self.protocol_version))
                if not select.select([self.connection], [], [], _POLL_INTERVAL_S)[0]:
                    continue
                data = self.connection.recv(_READ_SIZE)
                if not data:
                    return
                fake_socket.sendall(data)
            except (OSError, redis.ConnectionError):
                # The peer is gone (OSError), or the fake connection was killed (CLIENT KILL) or the server stopped.
                return
            except Exception:
                # Only input the parser cannot frame as RESP (e.g. an inline command) gets here, as command failures
                # are replies (see setup), and it has finished the parser. Redis answers a protocol error and closes
                # the connection; so does this.
                with contextlib.suppress(OSError):
                    self.wfile.write(b"-ERR Protocol error: expected an array of bulk strings\r\n")
                return


class _TCPServer(TcpFakeServer):
    def __init__(self, address: tuple[str, int], fake_server: fakeredis.FakeServer) -> None:
        super().__init__(address)
        # The base class hard-codes its own handler and a FakeServer of its own; serve the caller's instead.
        self.RequestHandlerClass = _RequestHandler
        self.fake_server = fake_server
        # One thread per connection. Daemon threads let the process exit while clients (e.g. an idle rq worker parked
        # in BLPOP) are still connected, and keep server_close() from joining them.
        self.daemon_threads = True
        # Open client sockets, so that stop() can close them as a real server would; otherwise a client blocked in
        # BLPOP would not notice the server had gone until its timeout expired.
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()

    def shutdown_requested(self) -> bool:
        return self._shutdown_event.is_set()

    def close_connections(self) -> None:
        with self.connections_lock:
            for connection in self.connections:
                with contextlib.suppress(OSError):  # already closed by the peer
                    connection.shutdown(socket.SHUT_RDWR)


class EmbeddedRedis:
    """An in-process fake Redis served over TCP on 127.0.0.1."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, server: fakeredis.FakeServer | None = None) -> None:
        self._host = host
        self._port = port
        self._fake_server = server if server is not None else fakeredis.FakeServer(version=_REDIS_VERSION)
        self._tcp_server: _TCPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``redis://host:port/0``; with port 0, known once started."""
        if self._port == 0:
            raise RuntimeError("EmbeddedRedis picks its port when started: call start() first")
        return f"redis://{self._host}:{self._port}/0"

    @property
    def fake_server(self) -> fakeredis.FakeServer:
        """The data behind the TCP server: ``fakeredis.FakeRedis(server=...)`` clients in this process share it."""
        return self._fake_server

    def start(self) -> EmbeddedRedis:
        """Listen (port 0: a free port) and serve from a daemon thread. The data outlives stop() and a restart."""
        if self._tcp_server is not None:
            raise RuntimeError("EmbeddedRedis is already started")
        self._tcp_server = _TCPServer((self._host, self._port), self._fake_server)
        # A port picked by the OS is kept, so that a restart serves the same URL.
        self._port = self._tcp_server.server_address[1]
        # A short poll interval so that stop() returns promptly; serve_forever otherwise notices shutdown every 0.5 s.
        self._thread = threading.Thread(
            target=self._tcp_server.serve_forever, kwargs={"poll_interval": 0.05}, name="embedded-redis", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and disconnect every client, as a Redis shutting down would. A no-op if not started."""
        if self._tcp_server is None or self._thread is None:
            return
        self._tcp_server.shutdown()
        self._tcp_server.close_connections()
        self._tcp_server.server_close()
        self._thread.join()
        self._tcp_server = self._thread = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
