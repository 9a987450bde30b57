"""An embedded Redis: a fakeredis ``FakeServer`` served over TCP on loopback, so that other processes (a stock
``rq worker``, redis-cli) can use it where no real Redis is installed. fakeredis ships a TCP server for this, but as
shipped it stalls every pipeline on Nagle's algorithm (~44 ms each), hangs up on a client after some errors, and keeps
the process alive while clients are connected; the small subclasses below fix that and nothing else.
"""

from __future__ import annotations

import inspect
import select
import socket
import threading
from typing import Any

import fakeredis
import redis
from fakeredis._clients._tcp_server import TCPFakeRequestHandler, TcpFakeServer, encode_reply
from fakeredis._helpers import SimpleError
from fakeredis._typing import RaiseErrorTypes

# The Redis version the fake server emulates (command set, argument checks, error texts): production runs Redis 7.
#
# fakeredis does not implement INFO, which is how clients read the version. RQ catches that error and assumes 5.0.9
# (rq.utils.get_version), so its workers dequeue with BLPOP, which fakeredis blocks on properly. That is deliberate:
# with a version >= 6.2 RQ would switch to BLMOVE, and fakeredis's BLMOVE never blocks (on a missing source key its
# signature short-circuits to nil at once), so an idle worker would spin through heartbeat + BLMOVE at 100% CPU in
# both processes. The cost of the fallback is one failing INFO per dequeue and no intermediate-queue (BLMOVE) path.
REDIS_VERSION = (7, 0)

# How often a connection waiting for input also checks for replies pushed to it without a request (pub/sub messages)
# and for server shutdown. Inbound commands wake it at once; only pushed replies can wait this long.
_POLL_INTERVAL_S = 0.01


class _RequestHandler(TCPFakeRequestHandler):
    server: _TCPServer

    # StreamRequestHandler leaves Nagle's algorithm on. A client writes a pipeline, then waits for replies that the
    # kernel holds back until the peer's delayed ACK (~40 ms): ~44 ms per pipeline or MULTI/EXEC, i.e. per RQ job.
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        super().finish()

    def handle(self) -> None:
        # Replaces the inherited loop, which answers some errors (fakeredis protocol errors, a Python exception raised
        # inside a command) and then hangs up. Redis keeps a connection after any error reply; this loop ends only on
        # EOF, a socket error, CLIENT KILL, or server shutdown.
        client = self.current_client
        while not self.server.shutdown_requested():
            try:
                while client.can_read():
                    try:
                        reply = client.read_response()
                    except RaiseErrorTypes as error:
                        reply = error
                    self.wfile.write(encode_reply(reply, self.protocol_version))
                # Fed line by line, so that when a command fails the parser holds no other command to lose.
                data = self.rfile.readline()
                if not data:
                    # The socket is non-blocking: empty means "nothing buffered" or EOF. Readable-yet-empty is EOF.
                    if not select.select([self.connection], [], [], _POLL_INTERVAL_S)[0]:
                        continue
                    data = self.rfile.readline()
                    if not data:
                        return
                client.get_socket().sendall(data)
            except (OSError, redis.ConnectionError):
                # The peer is gone (OSError), or the fake connection was killed (CLIENT KILL) or the server stopped.
                return
            except Exception as error:
                try:
                    self._reply_internal_error(error)
                except OSError:
                    return

    def _reply_internal_error(self, error: Exception) -> None:
        """Answer an exception that escaped fakeredis's command parser, and leave the connection usable."""
        text = error.value if isinstance(error, SimpleError) else f"ERR {type(error).__name__}: {error}"
        # A RESP error is a single line.
        self.wfile.write(b"-" + " ".join(text.split()).encode() + b"\r\n")
        fake_socket = self.current_client.get_socket()
        # The exception ran through fakeredis's parser generator and finished it, and the fake socket would answer
        # every later command with StopIteration. A fresh parser starts on a command boundary: input is fed one line
        # at a time and the failing command's last line was the one just fed.
        if inspect.getgeneratorstate(fake_socket._parser) == inspect.GEN_CLOSED:
            fake_socket._parser = fake_socket._parse_commands()
            fake_socket._parser.send(None)


class _TCPServer(TcpFakeServer):
    def __init__(self, address: tuple[str, int], fake_server: fakeredis.FakeServer) -> None:
        super().__init__(address)
        # The base class hard-codes its own handler and a FakeServer of its own; serve the caller's instead.
        self.RequestHandlerClass = _RequestHandler
        self.fake_server = fake_server
        # One thread per connection. Daemon threads let the process exit while clients (e.g. an idle rq worker parked
        # in BLPOP) are still connected, and keep server_close() from joining them.
        self.daemon_threads = True
        # Open client sockets, so stop() can close them as a real server would; otherwise a client blocked in BLPOP
        # would not notice the server went away until its timeout expires.
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()

    def shutdown_requested(self) -> bool:
        return self._shutdown_event.is_set()

    def close_connections(self) -> None:
        with self.connections_lock:
            for connection in self.connections:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # Already closed by the peer.


class EmbeddedRedis:
    """An in-process fake Redis served over TCP on 127.0.0.1."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, server: fakeredis.FakeServer | None = None) -> None:
        self._host = host
        self._port = port
        self._fake_server = server if server is not None else fakeredis.FakeServer(version=REDIS_VERSION)
        self._tcp_server: _TCPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._port == 0:
            raise RuntimeError("EmbeddedRedis picks its port when started; call start() first")
        return f"redis://{self._host}:{self._port}/0"

    @property
    def fake_server(self) -> fakeredis.FakeServer:
        return self._fake_server

    def start(self) -> EmbeddedRedis:
        if self._tcp_server is not None:
            raise RuntimeError("EmbeddedRedis is already started")
        tcp_server = _TCPServer((self._host, self._port), self._fake_server)
        self._port = tcp_server.server_address[1]
        # A short poll interval so that stop() returns promptly; serve_forever otherwise notices shutdown every 0.5 s.
        self._thread = threading.Thread(
            target=tcp_server.serve_forever, kwargs={"poll_interval": 0.05}, name="embedded-redis", daemon=True
        )
        self._tcp_server = tcp_server
        self._thread.start()
        return self

    def stop(self) -> None:
        tcp_server, self._tcp_server = self._tcp_server, None
        if tcp_server is None:
            return
        tcp_server.shutdown()
        tcp_server.close_connections()
        tcp_server.server_close()
        assert self._thread is not None
        self._thread.join()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
